"""libr4d's device rows (RAD_DOMAIN_DEVICE): every compute op of docs/OPS.md on f32 activations, and
the fused ops (`replaces`) that make a decode step a few launches a layer, kernels in device/*.cu
compiled at run time through RadStream.kernel (nvrtc, hiprtc).

A launch reads device addresses off RadArgs (RadTensor.data ints, a weight's planes likewise),
issues its kernels on `a.stream` and never allocates or synchronises. What it issues (kernel handles,
grids, packed arguments) is planned once per (row, parameters, M, operand addresses, scratch,
stream) and replayed from a dict after that, so an uncaptured decode step pays a lookup and the
driver calls. Extents come from the tensors' shapes (seqs from cu_seqlens, max_blocks from
block_tables, table rows from the weight), never from their contents."""

import logging
from dataclasses import dataclass

from radiance.abi import (
    RAD_CDIV, RAD_CEQ, RAD_CGE, RAD_CIN, RAD_CLE, RAD_DOMAIN_DEVICE, RAD_DT_ENCODED, RAD_E_INVALID, RAD_E_NOMEM,
    RAD_OK, KernelArgs, RadKernelInfo, RadTensor,
)

from . import device_attention_decode as ad
from . import device_kernels as dk
from .device_formats import CODES, FP8_FORMATS, device_format, layout_as_stored as _layout_as_stored
from .rows import REPLACES, QK, layout_vector, relayout_vector

log = logging.getLogger("radiance.libr4d")
MAX_PLANS = 4096
_PLANS: dict = {}


class ScratchTooSmall(ValueError):
    """The launch's scratch is smaller than its plan needs: the row answers RAD_E_NOMEM."""


def _address(tensor) -> int:
    data = tensor.data if isinstance(tensor, RadTensor) else tensor
    if data is None:
        return 0
    if hasattr(data, "encoding"):  # a weight: its identity (its planes' addresses are its own)
        return id(data)
    return int(getattr(data, "ptr", data))


def _rows(tensor) -> int:
    return int(tensor.shape[0])


class DeviceWeight:
    """A weight on the card: r4d's format code and its plane addresses."""

    def __init__(self, operand):
        weight = operand.data if isinstance(operand, RadTensor) else operand
        if isinstance(operand, RadTensor) and operand.dtype != RAD_DT_ENCODED and not hasattr(weight, "encoding"):
            raise TypeError("a weight operand that is not RadWeightPlanes")
        fmt = device_format(weight.encoding)
        if fmt is None:
            raise ValueError("libr4d: a weight in an encoding the device rows do not read")
        planes = {spec.name: _address(tensor) for spec, tensor in zip(weight.encoding.planes, weight.planes)}
        self.fmt, self.rows, self.cols = CODES[fmt], int(weight.rows), int(weight.cols)
        self.label = fmt
        self.codes, self.scale, self.min = planes["codes"], planes.get("scale", 0), planes.get("min", 0)


@dataclass
class Step:
    """One kernel of a launch: what RadStream.kernel compiles and what RadStream.launch issues."""
    kernel: str
    source: str
    grid: tuple
    block: tuple
    args: KernelArgs
    shared: int = 0
    options: tuple = ()


def _planned(name, build):
    """A launch: `build(a) -> [Step]` (or an error code), planned once per key and replayed."""
    def launch(a):
        stream = a.stream
        if stream is None:
            log.error("libr4d: %s: a device row launched without a stream", name)
            return RAD_E_INVALID
        key = (name, id(a.params), a.params["M"], tuple(_address(t) for t in a.t), a.scratch, id(stream))
        plan = _PLANS.get(key)
        if plan is None or plan[0] is not a.params or plan[1] is not stream:
            try:
                steps = build(a)
            except ScratchTooSmall as error:
                log.error("libr4d: %s: %s", name, error)
                return RAD_E_NOMEM
            except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError) as error:
                log.error("libr4d: %s: %s: %s", name, type(error).__name__, error)
                return RAD_E_INVALID
            if isinstance(steps, int):
                return steps
            if len(_PLANS) >= MAX_PLANS:
                _PLANS.clear()
            plan = _PLANS[key] = (a.params, stream, [
                (stream.kernel(dk.source(step.source), step.kernel, step.options), step.grid, step.block,
                 step.args.pack(), step.shared) for step in steps])
        for kernel, grid, block, packed, shared in plan[2]:
            stream.launch(kernel, grid, block, packed, shared)
        return RAD_OK
    launch.__name__ = name
    return launch


def _vendor(a) -> str:
    return getattr(a.stream, "vendor", "")


# ------------------------------------------------------------------------------------------------
# the GEMV and the fused rows built on it (gemv.cu)

@dataclass
class GemvExtras:
    """What a fused GEMV adds to the plain one: a folded norm (1: rmsnorm of x, 2: of x's rows
    index[m]) and its outputs, the residual of mode 1, the argmax arrays of mode 3."""
    norm: int = 0
    norm_weight: object = None
    normed: int = 0
    index: int = 0
    gathered: int = 0
    x_rows: int = 0
    residual: int = 0
    best: int = 0
    best_index: int = 0


def gemv_scratch_need(m: int, n: int, k: int, fmt: str, warp: int = 32) -> int:
    return dk.gemv_scratch_layout(m, n, k, fmt, warp)[1]


LIBRARY = "library"  # gemv_step's stream_shape: whatever device_kernels.STREAM says


def gemv_step(a, x: int, pairs: list, mode: int = 0, extras: GemvExtras | None = None, scratch: int = 0,
              scratch_bytes: int = 0, shape: dk.GemvShape = dk.GEMV, stream_shape=LIBRARY) -> Step:
    """The one kernel of a GEMV over `pairs` [(weight operand, output address)]: concatenated (q, k,
    v) or, in mode 2, paired row by row (gate, up). gemv_stream.cu where `stream_shape` (a
    StreamShape; LIBRARY: device_kernels.STREAM, None unless asked for) serves the shape, else
    gemv.cu, whose split-K part uses `scratch` / `scratch_bytes`. The shapes say how each kernel
    cuts the work (bench/device_ops.py tries others)."""
    if stream_shape is LIBRARY:
        stream_shape = dk.STREAM
    extras = extras or GemvExtras()
    weights = [DeviceWeight(weight) for weight, _ in pairs]
    fmt, k = weights[0].label, weights[0].cols
    if fmt in FP8_FORMATS:
        stream_shape = None  # gemv_stream.cu loads no f32 row scales: fp8 takes gemv.cu
    if any(w.label != fmt or w.cols != k for w in weights):
        raise ValueError("the weights of one GEMV differ in format or columns: "
                         + ", ".join(f"{w.label} {w.rows}x{w.cols}" for w in weights))
    if mode == 2 and weights[0].rows != weights[1].rows:
        raise ValueError(f"gate and up weights of {weights[0].rows} and {weights[1].rows} rows")
    m, vendor = int(a.params["M"]), _vendor(a)
    n = 2 * weights[0].rows if mode == 2 else sum(w.rows for w in weights)
    multiprocessors = getattr(a.stream, "multiprocessors", 1)
    stream = stream_shape is not None and dk.streams(vendor, getattr(a.stream, "target", ""), m,
                                                     [w.rows for w in weights], multiprocessors, stream_shape)
    if stream:
        name, splits = dk.stream_name(m), 1
        grid, block = dk.stream_grid(n, multiprocessors, stream_shape)
        args = KernelArgs(name).pointer(x).i32(m).i32(k)
    else:
        warp = dk.warp_size(vendor)
        splits, k_chunk = dk.gemv_split(n, k, fmt, warp, shape)
        partial, need = dk.gemv_scratch_layout(m, n, k, fmt, warp, shape)
        if need > scratch_bytes:
            raise ScratchTooSmall(f"{scratch_bytes} bytes of scratch, the split GEMV needs {need}")
        grid, block = dk.gemv_grid(n, warp, splits, shape)
        name = dk.gemv_name(m)
        args = (KernelArgs(name).pointer(x).i32(m).i32(k).i32(k_chunk)
                .pointer(scratch + partial if splits > 1 else 0).pointer(scratch if splits > 1 else 0))
    for i in range(3):
        if i < len(pairs):
            w = weights[i]
            args.pointer(w.codes).pointer(w.scale).pointer(w.min).pointer(pairs[i][1]).i32(w.rows)
        else:
            args.pointer(0).pointer(0).pointer(0).pointer(0).i32(0)
    norm = DeviceWeight(extras.norm_weight) if extras.norm else None
    args.pointer(norm.codes if norm else 0).i32(norm.fmt if norm else 0).f32(a.params.get("eps", 0.0))
    args.pointer(extras.normed).pointer(extras.index).pointer(extras.gathered).i32(extras.x_rows)
    args.pointer(extras.residual).pointer(extras.best).pointer(extras.best_index)
    options = dk.gemv_options(fmt, mode, extras.norm, shape)
    if stream:
        return Step(name, "gemv_stream", grid, block, args, 0, options[:3] + stream_shape.defines())
    return Step(name, "gemv", grid, block, args, 0, options)


def band_steps(a, x: int, pairs: list, mode: int = 0, extras: GemvExtras | None = None) -> list:
    """A band row's GEMV: on Hopper at M = 2 .. 8 of bf16 weights the skinny GEMM's launches
    (device_skinny_band.py, its part of the scratch after the GEMV's), else gemv.cu's one kernel."""
    from . import device_skinny_band as band  # it builds on this module
    scratch, scratch_bytes = int(a.scratch or 0), int(a.scratch_bytes or 0)
    if band.serves(a, pairs, mode):
        k = DeviceWeight(pairs[0][0]).cols
        n = sum(DeviceWeight(weight).rows for weight, _ in pairs)
        return band.steps(a, x, pairs, mode, extras, gemv_scratch_need(dk.GEMV_MAX_M, n, k, "bf16"))[0]
    return [gemv_step(a, x, pairs, mode, extras, scratch, scratch_bytes)]


def band_scratch(m: int, rows: tuple, k: int, fmt: str, mode: int = 0) -> int:
    """A band row's scratch for its GEMV of weights of `rows` rows: gemv.cu's split part, then for bf16
    weights the skinny band's after all of it at any M of the band (so the band's counters lie in one
    place for every step; the hook does not know the card)."""
    from . import device_skinny_band as band
    if fmt != "bf16":
        return gemv_scratch_need(m, sum(rows), k, fmt)
    base = gemv_scratch_need(dk.GEMV_MAX_M, sum(rows), k, fmt)
    return band.scratch_need(m, rows[:1] if mode == 2 else rows, k, mode, base)


def _gemv(a):
    x, weight, y = a.t
    return band_steps(a, _address(x), [(weight, _address(y))])


def _format_of(geometry) -> str:
    return geometry["wdtype"] if geometry["wdtype"] in dk.GEMV_CHUNK_ELEMENTS else "f32"


def gemv_scratch(geometry) -> int:
    """Split-K partial sums and counters (device_kernels.gemv_scratch_layout) at the band's largest M,
    and the skinny band's part (band_scratch)."""
    return band_scratch(int(geometry["M"]), (int(geometry["N"]),), int(geometry["K"]), _format_of(geometry))


def _rmsnorm_gemm3(a):
    x, norm, normed, wq, q, wk, k, wv, v = a.t
    extras = GemvExtras(norm=1, norm_weight=norm, normed=_address(normed))
    return band_steps(a, _address(x), [(wq, _address(q)), (wk, _address(k)), (wv, _address(v))], 0, extras)


def rmsnorm_gemm3_scratch(geometry) -> int:
    rows = (int(geometry["N.1"]), int(geometry["N.2"]), int(geometry["N.3"]))
    return band_scratch(int(geometry["M"]), rows, int(geometry["K"]), _format_of(geometry))


def _rmsnorm_gemm2_silu_mul(a):
    x, norm, normed, wg, gate, wu, up = a.t
    extras = GemvExtras(norm=1, norm_weight=norm, normed=_address(normed))
    return band_steps(a, _address(x), [(wg, _address(gate)), (wu, _address(up))], 2, extras)


def rmsnorm_gemm2_silu_mul_scratch(geometry) -> int:
    rows = (int(geometry["N.1"]), int(geometry["N.2"]))
    return band_scratch(int(geometry["M"]), rows, int(geometry["K"]), _format_of(geometry), mode=2)


def _gemm_add(a):
    x, weight, y, residual = a.t
    extras = GemvExtras(residual=_address(residual))
    return band_steps(a, _address(x), [(weight, _address(y))], 1, extras)


def _lm_head_layout(geometry) -> tuple[int, int, int, int]:
    """take_rows_rmsnorm_gemm_sample's scratch: (the GEMV's split part, then the argmax arrays, then
    the sampler's): offsets of the argmax values, their indices, the sampler's part, and the total."""
    m, n, k = int(geometry["M"]), int(geometry["N"]), int(geometry["K"])
    split = -(-gemv_scratch_need(m, n, k, _format_of(geometry)) // 256) * 256
    _, index_at, argmax = dk.argmax_layout(m, n)
    return split, split + index_at, split + argmax, split + argmax + dk.sample_scratch_bytes(m, int(geometry["vocab"]))


def _lm_head_band_base(geometry) -> int:
    """Where the skinny band's part of the lm head's scratch starts: after the GEMV's whole layout at
    any M of the band."""
    return _lm_head_layout({**geometry, "M": dk.GEMV_MAX_M})[3]


def take_rows_rmsnorm_gemm_sample_scratch(geometry) -> int:
    need = _lm_head_layout(geometry)[3]
    if _format_of(geometry) != "bf16":
        return need
    from . import device_skinny_band as band
    return band.scratch_need(int(geometry["M"]), (int(geometry["N"]),), int(geometry["K"]), 3, _lm_head_band_base(geometry))


def _take_rows_rmsnorm_gemm_sample(a):
    h, index, rows, norm, normed, weight, logits, temperature, top_k, top_p, rng, tokens = a.t
    m, vocab, scratch = int(a.params["M"]), int(a.params["vocab"]), int(a.scratch or 0)
    best, best_index, sampler, need = _lm_head_layout({**a.params, "M": m})
    if need > int(a.scratch_bytes or 0):
        raise ScratchTooSmall(f"{a.scratch_bytes} bytes of scratch, the fused lm head needs {need}")
    from . import device_skinny_band as band
    extras = GemvExtras(norm=2, norm_weight=norm, normed=_address(normed), index=_address(index),
                        gathered=_address(rows), x_rows=_rows(h), best=scratch + best, best_index=scratch + best_index)
    if band.serves(a, [(weight, _address(logits))]):  # the skinny band's maxima a block, after the GEMV's layout
        steps = band.steps(a, _address(h), [(weight, _address(logits))], 3, extras, _lm_head_band_base(a.params))[0]
    else:
        steps = [gemv_step(a, _address(h), [(weight, _address(logits))], 3, extras, scratch, best)]
    groups = steps[-1].grid[0]  # one maximum a row group (gemv.cu), a block (gemv_stream.cu, the skinny band)
    args = (KernelArgs("r4d_sample_groups_dev").pointer(_address(logits)).pointer(_address(temperature))
            .pointer(_address(top_k)).pointer(_address(top_p)).pointer(_address(rng)).pointer(_address(tokens))
            .i32(vocab).pointer(scratch + sampler).i32(dk.padded(vocab)).pointer(scratch + best)
            .pointer(scratch + best_index).i32(groups))
    return [*steps, Step("r4d_sample_groups_dev", "sample", (m, 1, 1), (dk.SAMPLE_THREADS, 1, 1), args)]


# ------------------------------------------------------------------------------------------------
# attention (attention.cu): the plain row stores k, v then attends over the cache; the fused
# rope_attention row rotates and reads this step's keys itself. A decode step (one token a sequence)
# on NVIDIA takes attention_decode.cu instead (device_attention_decode.serves): from these rows (the
# fused one rotating q and k itself) from device_attention_decode.BAND_FROM sequences, and from
# device_batch_rows.py's attention row above the band.

def decoding(a, cu_seqlens, least: int = 1) -> bool:
    """Whether attention_decode.cu serves this step of the row: a decode step of at least `least`
    sequences that it serves."""
    p = a.params
    m, seqs, heads, kv = int(p["M"]), _rows(cu_seqlens) - 1, int(p["q_heads"]), int(p["kv_heads"])
    group = heads // kv if kv and heads % kv == 0 else 0
    return m >= least and ad.serves(_vendor(a), getattr(a.stream, "target", ""), m, seqs, int(p["head_dim"]), group)


def decode_attention_step(a, q, k, v, k_cache, v_cache, slots, positions, context_lens, block_tables, out,
                          inv_freq=None, band: bool = False) -> Step:
    """attention_decode.cu's one launch for a decode step: r4d_attend_decode, or with inv_freq (the
    fused row) r4d_attend_decode_rope; it stores the step's k, v at their slots itself. `band`: a row
    of the decode band, whose scratch's tail holds device_attention_decode.band_partials."""
    p = a.params
    seqs, heads, kv, d, block_size = int(p["M"]), int(p["q_heads"]), int(p["kv_heads"]), int(p["head_dim"]), int(p["block_size"])
    max_blocks = int(block_tables.shape[1]) if block_tables.ndim > 1 else 1
    group, capacity = heads // kv, max_blocks * block_size
    partials = ad.band_partials(kv) if band else ad.PARTIALS
    if int(a.scratch_bytes or 0) < ad.tail_bytes(group, d, partials):
        raise ScratchTooSmall(f"{a.scratch_bytes} bytes of scratch, the decode attention's tail needs "
                              f"{ad.tail_bytes(group, d, partials)}")
    layout, scratch = ad.scratch_layout(int(a.scratch_bytes), group, d, partials), int(a.scratch)
    name = "r4d_attend_decode" if inv_freq is None else "r4d_attend_decode_rope"
    args = KernelArgs(name)
    for tensor in (q, k, v, k_cache, v_cache, slots, positions, context_lens, block_tables, out):
        args.pointer(_address(tensor))
    args.pointer(scratch + layout["partial"]).pointer(scratch + layout["counters"])
    args.i32(max_blocks).i32(heads).i32(kv).i32(d).i32(block_size).i32(ad.chunk(seqs, kv)).f32(p["scale"])
    if inv_freq is not None:
        args.pointer(_address(inv_freq)).i32(p.get("interleaved", 0))
    grid, block = ad.grid(seqs, kv, capacity, partials)
    return Step(name, "attention_decode", grid, block, args, 0, ad.options(d, group))


def attention_places(a, m: int, kv: int, group: int, d: int) -> tuple[int, int]:
    """(partials, counters) of attention.cu's kernels in the row's scratch: the partials from its start,
    the M * kv + 1 counters in the tail (device_attention_decode.counters_offset): a step of larger M
    never lays its partials over a smaller step's counters, nor the decode kernel its partials over
    these."""
    offset, need = dk.attention_scratch_layout(m, kv, group, d)
    size = int(a.scratch_bytes or 0)
    if need + 4 * ad.COUNTERS > size:
        raise ScratchTooSmall(f"{a.scratch_bytes} bytes of scratch, attention needs {need} and {4 * ad.COUNTERS} of counters")
    if m * kv + 1 > ad.COUNTERS:
        raise ValueError(f"attention over {m} tokens of {kv} kv heads counts {m * kv + 1} splits, the scratch's tail "
                         f"holds {ad.COUNTERS}")
    return int(a.scratch) + offset, int(a.scratch) + ad.counters_offset(size)


def _attend_step(a, q, k, v, k_cache, v_cache, slots, positions, cu_seqlens, context_lens, block_tables, out,
                 inv_freq, fresh: bool) -> Step:
    p = a.params
    m, heads, kv, d = int(p["M"]), int(p["q_heads"]), int(p["kv_heads"]), int(p["head_dim"])
    if d > dk.ATT_MAX_HEAD_DIM or d % dk.ATT_HEAD_DIM_STEP or heads % kv or heads // kv > dk.ATT_MAX_GROUP:
        raise ValueError(f"head_dim {d} (at most {dk.ATT_MAX_HEAD_DIM}, a multiple of {dk.ATT_HEAD_DIM_STEP}), "
                         f"{heads} heads over {kv} kv heads (at most {dk.ATT_MAX_GROUP} a kv head)")
    if fresh and m > dk.ATT_MAX_FRESH:  # the row's DECODE constraint keeps M there
        raise ValueError(f"the fused rope_attention kernel takes at most {dk.ATT_MAX_FRESH} tokens a step, not {m}")
    group = heads // kv
    partial, counters = attention_places(a, m, kv, group, d)
    splits = dk.attention_splits(m, kv, getattr(a.stream, "multiprocessors", 1))
    seqs, max_blocks = _rows(cu_seqlens) - 1, int(block_tables.shape[1]) if block_tables.ndim > 1 else 1
    name = "r4d_attend_fresh" if fresh else "r4d_attend_cache"
    args = KernelArgs(name)
    for tensor in (q, k, v, k_cache, v_cache, slots, positions, cu_seqlens, context_lens, block_tables, out, inv_freq):
        args.pointer(_address(tensor) if tensor is not None else 0)
    args.pointer(partial).pointer(counters).i32(seqs).i32(max_blocks).i32(heads).i32(kv).i32(d)
    args.i32(p["block_size"]).i32(p.get("interleaved", 0)).f32(p["scale"])
    return Step(name, "attention", (m, kv, splits), (dk.ATT_THREADS, 1, 1), args, 0,
                dk.attention_options(d, group))


def attention_scratch(geometry, others: int = 0, band: bool = True) -> int:
    """attention.cu's (or `others`, where more), then attention_decode.cu's tail (device_attention_decode:
    its counters must outlive the other kernels' launches in the same scratch); `band`: a row of the
    decode band (a smaller tail)."""
    heads, kv = int(geometry["q_heads"]), int(geometry["kv_heads"])
    group, m, d = max(1, heads // max(kv, 1)), int(geometry["M"]), int(geometry["head_dim"])
    tail = ad.tail_bytes(group, d, ad.band_partials(kv) if band else ad.PARTIALS)
    return max(dk.attention_scratch_layout(m, kv, group, d)[1], others) + tail


def _attention(a):
    q, k, v, k_cache, v_cache, slots, positions, cu_seqlens, context_lens, block_tables, out = a.t
    if decoding(a, cu_seqlens, ad.BAND_FROM):
        return [decode_attention_step(a, q, k, v, k_cache, v_cache, slots, positions, context_lens, block_tables, out,
                                      band=True)]
    m, width = int(a.params["M"]), int(a.params["kv_heads"]) * int(a.params["head_dim"])
    grid, block = dk.rows_grid(m, width)
    store = (KernelArgs("r4d_kv_store_dev").pointer(_address(k)).pointer(_address(v)).pointer(_address(k_cache))
             .pointer(_address(v_cache)).pointer(_address(slots)).i32(width))
    attend = _attend_step(a, q, k, v, k_cache, v_cache, slots, positions, cu_seqlens, context_lens, block_tables,
                          out, None, fresh=False)
    return [Step("r4d_kv_store_dev", "attention", grid, block, store, 0, attend.options), attend]


def _rope_attention(a):
    q, k, positions, inv_freq, v, k_cache, v_cache, slots, cu_seqlens, context_lens, block_tables, out = a.t
    if decoding(a, cu_seqlens, ad.BAND_FROM):
        return [decode_attention_step(a, q, k, v, k_cache, v_cache, slots, positions, context_lens, block_tables, out,
                                      inv_freq, band=True)]
    return [_attend_step(a, q, k, v, k_cache, v_cache, slots, positions, cu_seqlens, context_lens, block_tables,
                         out, inv_freq, fresh=True)]


# ------------------------------------------------------------------------------------------------
# the other ops

def _embedding(a):
    ids, table, y = a.t
    w, m = DeviceWeight(table), int(a.params["M"])
    grid, block = dk.rows_grid(m, w.cols)
    args = (KernelArgs("r4d_embedding_dev").pointer(_address(ids)).pointer(w.codes).pointer(w.scale)
            .pointer(w.min).i32(w.fmt).i32(w.rows).i32(w.cols).pointer(_address(y)))
    return [Step("r4d_embedding_dev", "elementwise", grid, block, args)]


def _rmsnorm(a):
    x, w, y = a.t
    m, n = int(a.params["M"]), int(a.params["n"])
    grid, block = dk.norm_grid(m, dk.warp_size(_vendor(a)))
    args = (KernelArgs("r4d_rmsnorm_dev").pointer(_address(x)).pointer(_address(w)).pointer(_address(y))
            .i32(m).i32(n).f32(a.params["eps"]))
    return [Step("r4d_rmsnorm_dev", "elementwise", grid, block, args)]


def _add_rmsnorm(a):
    residual, x, w, y = a.t
    m, n = int(a.params["M"]), int(a.params["n"])
    grid, block = dk.norm_grid(m, dk.warp_size(_vendor(a)))
    args = (KernelArgs("r4d_add_rmsnorm_dev").pointer(_address(residual)).pointer(_address(x)).pointer(_address(w))
            .pointer(_address(y)).i32(m).i32(n).f32(a.params["eps"]))
    return [Step("r4d_add_rmsnorm_dev", "elementwise", grid, block, args)]


def _rope(a):
    q, k, positions, inv_freq = a.t
    p = a.params
    m, heads, kv, d = int(p["M"]), int(p["q_heads"]), int(p["kv_heads"]), int(p["head_dim"])
    args = (KernelArgs("r4d_rope_dev").pointer(_address(q)).pointer(_address(k)).pointer(_address(positions))
            .pointer(_address(inv_freq)).i32(heads).i32(kv).i32(d).i32(p["interleaved"]))
    return [Step("r4d_rope_dev", "elementwise", (m, 1, 1), (dk.ELEMENTWISE_THREADS, 1, 1), args)]  # a block a token


def elementwise_step(kernel: str, first: int, second: int, y: int, count: int, multiprocessors: int) -> Step:
    """elementwise.cu's two-input kernels (r4d_add_dev, r4d_silu_mul_dev) over `count` f32 values."""
    grid, block = dk.flat_grid(count, multiprocessors)
    args = KernelArgs(kernel).pointer(first).pointer(second).pointer(y).i64(count)
    return Step(kernel, "elementwise", grid, block, args)


def _elementwise(kernel):
    def build(a):
        first, second, y = a.t
        return [elementwise_step(kernel, _address(first), _address(second), _address(y),
                                 int(a.params["M"]) * int(a.params["n"]), getattr(a.stream, "multiprocessors", 1))]
    return build


def _take_rows(a):
    x, index, y = a.t
    m, n = int(a.params["M"]), int(a.params["n"])
    grid, block = dk.rows_grid(m, n)
    args = (KernelArgs("r4d_take_rows_dev").pointer(_address(x)).pointer(_address(index)).pointer(_address(y))
            .i32(n).i32(_rows(x)))
    return [Step("r4d_take_rows_dev", "elementwise", grid, block, args)]


def _gemm(a):
    x, weight, y = a.t
    w, m = DeviceWeight(weight), int(a.params["M"])
    grid, block = dk.gemm_grid(m, w.rows)
    args = (KernelArgs("r4d_gemm_dev").pointer(_address(x)).pointer(w.codes).pointer(w.scale).pointer(w.min)
            .i32(w.fmt).pointer(_address(y)).i32(m).i32(w.rows).i32(w.cols))
    return [Step("r4d_gemm_dev", "gemm", grid, block, args)]


def _sample(a):
    logits, temperature, top_k, top_p, rng, tokens = a.t
    m, vocab = int(a.params["M"]), int(a.params["vocab"])
    if a.scratch is None or int(a.scratch_bytes or 0) < dk.sample_scratch_bytes(m, vocab):
        log.error("libr4d: r4d_sample_dev: %s bytes of scratch, %d needed", a.scratch_bytes,
                  dk.sample_scratch_bytes(m, vocab))
        return RAD_E_NOMEM
    args = (KernelArgs("r4d_sample_dev").pointer(_address(logits)).pointer(_address(temperature))
            .pointer(_address(top_k)).pointer(_address(top_p)).pointer(_address(rng)).pointer(_address(tokens))
            .i32(vocab).pointer(int(a.scratch)).i32(dk.padded(vocab)))
    return [Step("r4d_sample_dev", "sample", (m, 1, 1), (dk.SAMPLE_THREADS, 1, 1), args)]


def sample_scratch(geometry) -> int:
    return dk.sample_scratch_bytes(int(geometry["M"]), int(geometry["vocab"]))


# ------------------------------------------------------------------------------------------------
# the table

F32_ACTIVATIONS = RAD_CEQ("dtype", "f32")
# attention.cu's heads: at most 256 values, read as 16-byte chunks (so even, as rope needs)
ATTENTION_HEADS = (RAD_CLE("head_dim", dk.ATT_MAX_HEAD_DIM), RAD_CDIV("head_dim", dk.ATT_HEAD_DIM_STEP))
HEADS_SHAPE = f"head_dim<={dk.ATT_MAX_HEAD_DIM}, head_dim%{dk.ATT_HEAD_DIM_STEP}==0"
DECODE = RAD_CLE("M", dk.GEMV_MAX_M)


def chained(name: str) -> str:
    """Every device row is a chained row (rad_kernel_chain): each of its kernels starts with
    R4D_CHAIN_PROLOGUE (device/common.cu), so it may be a programmatic dependent launch. The
    specification recognises chained forms by `r4dchain` in the name."""
    return name.replace("r4d_", "r4dchain_", 1)


FORMATS = "q8_0 q4_1 f32 f16 bf16 fp8_channel fp8"
WEIGHT_FORMATS = (("q4_1", "q4_1", QK), ("q8_0", "q8_0", QK), ("f32 f16 bf16", "plain", 8),
                  (" ".join(FP8_FORMATS), "fp8", 16))


def build_device_rows() -> list[RadKernelInfo]:
    def row(name, op, build, constraints, computes, shape, dtypes, **hooks):
        return RadKernelInfo(name=chained(name), op=op, family="r4d", computes=f"{computes} (device/*.cu)", shape=shape,
                             dtypes=dtypes, domain=RAD_DOMAIN_DEVICE, priority=10,
                             constraints=[F32_ACTIVATIONS, *constraints], launch=_planned(name, build), **hooks)

    gemm_rows, fused_rows = [], []
    for fmt, label, div in WEIGHT_FORMATS:
        # what a launch issues where the weights may be bf16: the card's and M's (device_skinny_band.py)
        band = "; bf16 at M = 2..8 on sm_90: x split into hi and lo bf16 rows, the skinny GEMM's band" if "bf16" in fmt else ""
        common = [RAD_CIN("wdtype", fmt), RAD_CDIV("K", div)]
        layout = _layout_as_stored(fmt.split())
        gemm_rows.append(row(f"r4d_gemv_{label}_dev", "gemm", _gemv, [DECODE, RAD_CEQ("split_k", 1), *common],
                             "decode GEMV: a warp per 4 output rows, the planes streamed once for all M rows" + band,
                             f"M<={dk.GEMV_MAX_M}, K%{div}==0", f"f32 x {fmt}", layout=layout,
                             scratch=gemv_scratch))
        gemm_rows.append(row(f"r4d_gemm_{label}_dev", "gemm", _gemm,
                             [RAD_CGE("M", dk.GEMV_MAX_M + 1), RAD_CEQ("split_k", 1), *common],
                             "prefill GEMM: 64x64 f32 tiles through shared memory, weights decoded per tile",
                             f"M>={dk.GEMV_MAX_M + 1}, K%{div}==0", f"f32 x {fmt}", layout=layout))
        stored = _layout_as_stored(f"{fmt} f32 f16 bf16".split())  # the norm's weight too, as stored
        fused_rows += [
            row(f"r4d_rmsnorm_gemm3_{label}_dev", "rmsnorm_gemm3", _rmsnorm_gemm3, [DECODE, *common],
                "q, k and v in one GEMV, the rmsnorm recomputed in front of it by every block" + band, f"M<={dk.GEMV_MAX_M}",
                f"f32 x {fmt}", layout=stored, scratch=rmsnorm_gemm3_scratch, replaces=REPLACES["rmsnorm_gemm3"]),
            row(f"r4d_rmsnorm_gemm2_silu_mul_{label}_dev", "rmsnorm_gemm2_silu_mul", _rmsnorm_gemm2_silu_mul,
                [DECODE, *common], "gate and up in one GEMV, a gate row beside its up row, silu * mul in its epilogue" + band,
                f"M<={dk.GEMV_MAX_M}", f"f32 x {fmt}", layout=stored, scratch=rmsnorm_gemm2_silu_mul_scratch,
                replaces=REPLACES["rmsnorm_gemm2_silu_mul"]),
            row(f"r4d_gemm_add_{label}_dev", "gemm_add", _gemm_add, [DECODE, *common],
                "the GEMV with the residual add in its epilogue" + band, f"M<={dk.GEMV_MAX_M}", f"f32 x {fmt}",
                layout=layout, scratch=gemv_scratch, replaces=REPLACES["gemm_add"]),
            row(f"r4d_take_rows_rmsnorm_gemm_sample_{label}_dev", "take_rows_rmsnorm_gemm_sample",
                _take_rows_rmsnorm_gemm_sample, [DECODE, *common],
                "the lm head: rows taken and normed in front of the GEMV, each row group's first maximum in its "
                "epilogue, then the sampler (greedy rows reduce those maxima)" + band + (", its maxima a block" if band else ""),
                f"M<={dk.GEMV_MAX_M}",
                f"f32 x {fmt}", layout=stored, scratch=take_rows_rmsnorm_gemm_sample_scratch,
                replaces=REPLACES["take_rows_rmsnorm_gemm_sample"]),
        ]
    from .device_batch_rows import build_batch_rows  # imported here: they build on this module
    from .device_prefill_rows import build_prefill_rows
    return [
        *build_batch_rows(),
        *build_prefill_rows(),
        row("r4d_embedding_dev", "embedding", _embedding, [RAD_CIN("wdtype", FORMATS)], "table rows decoded to f32",
            "any", f"{FORMATS} table", layout=_layout_as_stored(FORMATS.split())),
        row("r4d_rmsnorm_dev", "rmsnorm", _rmsnorm, [], "a warp per row, the canonical sum of squares", "any", "f32",
            layout=layout_vector, relayout=relayout_vector),
        *gemm_rows,
        row("r4d_rope_dev", "rope", _rope, [RAD_CDIV("head_dim", 2)], "cos/sin in f64 rounded to f32",
            "head_dim even", "f32"),
        row("r4d_attention_dev", "attention", _attention, [*ATTENTION_HEADS],
            "paged KV stored, then a block per (token, kv head, split of the context): tiles of 32 keys, 8 lanes a "
            "key's dot products, a warp a head's online softmax, 16-byte chunks of values; splits merged in order",
            HEADS_SHAPE, "f32", scratch=attention_scratch),
        row("r4d_rope_attention_dev", "rope_attention", _rope_attention, [DECODE, *ATTENTION_HEADS],
            "rope, the KV store and attention split over the context in one kernel; this step's keys rotated and "
            "read from the k, v rows", f"M<={dk.GEMV_MAX_M}, {HEADS_SHAPE}", "f32",
            scratch=attention_scratch, replaces=REPLACES["rope_attention"]),
        *fused_rows,
        row("r4d_add_dev", "add", _elementwise("r4d_add_dev"), [], "elementwise", "any", "f32"),
        # above the decode band, where the GEMM's epilogue takes no add: the residual add and the next
        # norm in one launch (below it gemm_add and the norm-folded GEMVs take them apart)
        row("r4d_add_rmsnorm_dev", "add_rmsnorm", _add_rmsnorm, [RAD_CGE("M", dk.GEMV_MAX_M + 1)],
            "add's elementwise sum, then rmsnorm's ordered sum of squares, a warp a row", f"M>={dk.GEMV_MAX_M + 1}",
            "f32", layout=layout_vector, relayout=relayout_vector, replaces=REPLACES["add_rmsnorm"]),
        row("r4d_silu_mul_dev", "silu_mul", _elementwise("r4d_silu_mul_dev"), [], "sigmoid in f64 rounded to f32",
            "any", "f32"),
        row("r4d_take_rows_dev", "take_rows", _take_rows, [], "row gather", "any", "f32"),
        RadKernelInfo(name=chained("r4d_sample_dev"), op="sample", family="r4d",
                      computes="greedy first maximum; temperature > 0: libref's top-k, top-p and Philox draw "
                               "(device/sample.cu)", shape="any", dtypes="f32 logits", domain=RAD_DOMAIN_DEVICE,
                      priority=10, constraints=[], launch=_planned("r4d_sample_dev", _sample), scratch=sample_scratch),
    ]
