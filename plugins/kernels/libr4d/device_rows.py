"""libr4d's device rows (RAD_DOMAIN_DEVICE): every compute op of docs/OPS.md on f32 activations,
kernels in device/*.cu compiled at run time through RadStream.kernel (nvrtc, hiprtc).

A launch reads device addresses off RadArgs (RadTensor.data ints, a weight's planes likewise),
issues its kernels on `a.stream` and never allocates or synchronises. What it issues (kernel handles,
grids, packed arguments) is planned once per (row, parameters, M, operand addresses, scratch,
stream) and replayed from a dict after that, so an uncaptured decode step pays a lookup and the
driver calls. Extents come from the tensors' shapes (seqs from cu_seqlens, max_blocks from
block_tables, table rows from the weight), never from their contents."""

import logging

from radiance.abi import (
    RAD_CDIV, RAD_CEQ, RAD_CGE, RAD_CIN, RAD_CLE, RAD_DOMAIN_DEVICE, RAD_DT_ENCODED, RAD_E_INVALID, RAD_E_NOMEM,
    RAD_OK, KernelArgs, RadKernelInfo, RadTensor,
)

from . import device_kernels as dk
from .rows import FORMAT_CODES, QK, _layout_as_stored, encoding_format, layout_vector, relayout_vector

log = logging.getLogger("radiance.libr4d")
MAX_PLANS = 4096
_PLANS: dict = {}


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
        fmt = encoding_format(weight.encoding)
        if fmt is None:
            raise ValueError("libr4d: a weight in an encoding the device rows do not read")
        planes = {spec.name: _address(tensor) for spec, tensor in zip(weight.encoding.planes, weight.planes)}
        self.fmt, self.rows, self.cols = FORMAT_CODES[fmt], int(weight.rows), int(weight.cols)
        self.label = fmt
        self.codes, self.scale, self.min = planes["codes"], planes.get("scale", 0), planes.get("min", 0)


def _planned(name, build):
    """A launch: `build(a) -> [(kernel name, source file, grid, block, KernelArgs, shared)]`, planned
    once per key and replayed."""
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
            except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError) as error:
                log.error("libr4d: %s: %s: %s", name, type(error).__name__, error)
                return RAD_E_INVALID
            if isinstance(steps, int):
                return steps
            if len(_PLANS) >= MAX_PLANS:
                _PLANS.clear()
            plan = _PLANS[key] = (a.params, stream, [
                (stream.kernel(dk.source(src), kernel), grid, block, args.pack(), shared)
                for kernel, src, grid, block, args, shared in steps])
        for kernel, grid, block, packed, shared in plan[2]:
            stream.launch(kernel, grid, block, packed, shared)
        return RAD_OK
    launch.__name__ = name
    return launch


# ------------------------------------------------------------------------------------------------
# the plans of each op

def _embedding(a):
    ids, table, y = a.t
    w, m = DeviceWeight(table), int(a.params["M"])
    grid, block = dk.rows_grid(m, w.cols)
    args = (KernelArgs("r4d_embedding_dev").pointer(_address(ids)).pointer(w.codes).pointer(w.scale)
            .pointer(w.min).i32(w.fmt).i32(w.rows).i32(w.cols).pointer(_address(y)))
    return [("r4d_embedding_dev", "elementwise", grid, block, args, 0)]


def _rmsnorm(a):
    x, w, y = a.t
    m, n = int(a.params["M"]), int(a.params["n"])
    args = (KernelArgs("r4d_rmsnorm_dev").pointer(_address(x)).pointer(_address(w)).pointer(_address(y))
            .i32(n).f32(a.params["eps"]))
    return [("r4d_rmsnorm_dev", "elementwise", (m, 1, 1), (dk.reduce_threads(n), 1, 1), args, 0)]


def _rope(a):
    q, k, positions, inv_freq = a.t
    p = a.params
    m, heads, kv, d = int(p["M"]), int(p["q_heads"]), int(p["kv_heads"]), int(p["head_dim"])
    args = (KernelArgs("r4d_rope_dev").pointer(_address(q)).pointer(_address(k)).pointer(_address(positions))
            .pointer(_address(inv_freq)).i32(heads).i32(kv).i32(d).i32(p["interleaved"]))
    return [("r4d_rope_dev", "elementwise", (m, heads + kv, 1), (max(32, min(256, d // 2 + 31) // 32 * 32), 1, 1), args, 0)]


def _elementwise(kernel):
    def build(a):
        first, second, y = a.t
        count = int(a.params["M"]) * int(a.params["n"])
        grid, block = dk.flat_grid(count, getattr(a.stream, "multiprocessors", 1))
        args = KernelArgs(kernel).pointer(_address(first)).pointer(_address(second)).pointer(_address(y)).i64(count)
        return [(kernel, "elementwise", grid, block, args, 0)]
    return build


def _take_rows(a):
    x, index, y = a.t
    m, n = int(a.params["M"]), int(a.params["n"])
    grid, block = dk.rows_grid(m, n)
    args = (KernelArgs("r4d_take_rows_dev").pointer(_address(x)).pointer(_address(index)).pointer(_address(y))
            .i32(n).i32(_rows(x)))
    return [("r4d_take_rows_dev", "elementwise", grid, block, args, 0)]


def _gemv(a):
    x, weight, y = a.t
    w, m = DeviceWeight(weight), int(a.params["M"])
    name, warp = dk.gemv_name(w.label, m), dk.warp_size(getattr(a.stream, "vendor", ""))
    splits, k_chunk = dk.gemv_split(w.rows, w.cols, w.label, warp)
    partial, need = dk.gemv_scratch_layout(m, w.rows, w.cols, w.label, warp)
    if need > int(a.scratch_bytes or 0):
        return RAD_E_NOMEM
    scratch = int(a.scratch or 0)
    grid, block = dk.gemv_grid(w.rows, warp, splits)
    args = (KernelArgs(name).pointer(_address(x)).pointer(w.codes).pointer(w.scale).pointer(w.min)
            .pointer(_address(y)).i32(m).i32(w.rows).i32(w.cols).i32(k_chunk)
            .pointer(scratch + partial if splits > 1 else 0).pointer(scratch if splits > 1 else 0))
    return [(name, "gemv", grid, block, args, 0)]


def gemv_scratch(geometry) -> int:
    """Split-K partial sums and counters (device_kernels.gemv_scratch_layout) at the band's largest M."""
    fmt = geometry["wdtype"] if geometry["wdtype"] in dk.GEMV_CHUNK_ELEMENTS else "f32"
    return dk.gemv_scratch_layout(int(geometry["M"]), int(geometry["N"]), int(geometry["K"]), fmt)[1]


def _gemm(a):
    x, weight, y = a.t
    w, m = DeviceWeight(weight), int(a.params["M"])
    grid, block = dk.gemm_grid(m, w.rows)
    args = (KernelArgs("r4d_gemm_dev").pointer(_address(x)).pointer(w.codes).pointer(w.scale).pointer(w.min)
            .i32(w.fmt).pointer(_address(y)).i32(m).i32(w.rows).i32(w.cols))
    return [("r4d_gemm_dev", "gemm", grid, block, args, 0)]


def _attention(a):
    q, k, v, k_cache, v_cache, slots, positions, cu_seqlens, context_lens, block_tables, out = a.t
    p = a.params
    m, heads, kv, d = int(p["M"]), int(p["q_heads"]), int(p["kv_heads"]), int(p["head_dim"])
    if d > dk.ATT_MAX_HEAD_DIM or heads % kv:
        raise ValueError(f"head_dim {d} (at most {dk.ATT_MAX_HEAD_DIM}), {heads} heads over {kv} kv heads")
    width = kv * d
    grid, block = dk.rows_grid(m, width)
    store = (KernelArgs("r4d_kv_store_dev").pointer(_address(k)).pointer(_address(v)).pointer(_address(k_cache))
             .pointer(_address(v_cache)).pointer(_address(slots)).i32(width))
    seqs, max_blocks = _rows(cu_seqlens) - 1, int(block_tables.shape[1]) if block_tables.ndim > 1 else 1
    attend = (KernelArgs("r4d_attention_dev").pointer(_address(q)).pointer(_address(k_cache))
              .pointer(_address(v_cache)).pointer(_address(positions)).pointer(_address(cu_seqlens))
              .pointer(_address(context_lens)).pointer(_address(block_tables)).pointer(_address(out))
              .i32(seqs).i32(max_blocks).i32(heads).i32(kv).i32(d).i32(p["block_size"]).f32(p["scale"]))
    return [("r4d_kv_store_dev", "attention", grid, block, store, 0),
            ("r4d_attention_dev", "attention", (m, heads, 1),
             (dk.ATT_WARPS * dk.warp_size(getattr(a.stream, "vendor", "")), 1, 1), attend, 0)]


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
    return [("r4d_sample_dev", "sample", (m, 1, 1), (dk.SAMPLE_THREADS, 1, 1), args, 0)]


def sample_scratch(geometry) -> int:
    return dk.sample_scratch_bytes(int(geometry["M"]), int(geometry["vocab"]))


# ------------------------------------------------------------------------------------------------
# the table

F32_ACTIVATIONS = RAD_CEQ("dtype", "f32")


def chained(name: str) -> str:
    """Every device row is a chained row (rad_kernel_chain): each of its kernels starts with
    R4D_CHAIN_PROLOGUE (device/common.cu), so it may be a programmatic dependent launch. The
    specification recognises chained forms by `r4dchain` in the name."""
    return name.replace("r4d_", "r4dchain_", 1)
FORMATS = "q8_0 q4_1 f32 f16 bf16"


def build_device_rows() -> list[RadKernelInfo]:
    def row(name, op, build, constraints, computes, shape, dtypes, **hooks):
        return RadKernelInfo(name=chained(name), op=op, family="r4d", computes=f"{computes} (device/*.cu)", shape=shape,
                             dtypes=dtypes, domain=RAD_DOMAIN_DEVICE, priority=10,
                             constraints=[F32_ACTIVATIONS, *constraints], launch=_planned(name, build), **hooks)

    gemm_rows = []
    for fmt, label, div in (("q4_1", "q4_1", QK), ("q8_0", "q8_0", QK), ("f32 f16 bf16", "plain", 8)):
        common = [RAD_CIN("wdtype", fmt), RAD_CEQ("split_k", 1), RAD_CDIV("K", div)]
        layout = _layout_as_stored(fmt.split())
        gemm_rows.append(row(f"r4d_gemv_{label}_dev", "gemm", _gemv, [RAD_CLE("M", dk.GEMV_MAX_M), *common],
                             "decode GEMV: a warp per output row, the planes streamed once for all M rows",
                             f"M<={dk.GEMV_MAX_M}, K%{div}==0", f"f32 x {fmt}", layout=layout,
                             scratch=gemv_scratch))
        gemm_rows.append(row(f"r4d_gemm_{label}_dev", "gemm", _gemm, [RAD_CGE("M", dk.GEMV_MAX_M + 1), *common],
                             "prefill GEMM: 64x64 f32 tiles through shared memory, weights decoded per tile",
                             f"M>={dk.GEMV_MAX_M + 1}, K%{div}==0", f"f32 x {fmt}", layout=layout))
    return [
        row("r4d_embedding_dev", "embedding", _embedding, [RAD_CIN("wdtype", FORMATS)], "table rows decoded to f32",
            "any", f"{FORMATS} table", layout=_layout_as_stored(FORMATS.split())),
        row("r4d_rmsnorm_dev", "rmsnorm", _rmsnorm, [], "a block per row, tree sum of squares", "any", "f32",
            layout=layout_vector, relayout=relayout_vector),
        *gemm_rows,
        row("r4d_rope_dev", "rope", _rope, [RAD_CDIV("head_dim", 2)], "cos/sin in f64 rounded to f32",
            "head_dim even", "f32"),
        row("r4d_attention_dev", "attention", _attention, [RAD_CLE("head_dim", dk.ATT_MAX_HEAD_DIM)],
            "paged KV stored, then a block per (token, head): online softmax per warp, warps merged",
            f"head_dim<={dk.ATT_MAX_HEAD_DIM}", "f32"),
        row("r4d_add_dev", "add", _elementwise("r4d_add_dev"), [], "elementwise", "any", "f32"),
        row("r4d_silu_mul_dev", "silu_mul", _elementwise("r4d_silu_mul_dev"), [], "sigmoid in f64 rounded to f32",
            "any", "f32"),
        row("r4d_take_rows_dev", "take_rows", _take_rows, [], "row gather", "any", "f32"),
        RadKernelInfo(name=chained("r4d_sample_dev"), op="sample", family="r4d",
                      computes="greedy first maximum; temperature > 0: libref's top-k, top-p and Philox draw "
                               "(device/sample.cu)", shape="any", dtypes="f32 logits", domain=RAD_DOMAIN_DEVICE,
                      priority=10, constraints=[], launch=_planned("r4d_sample_dev", _sample), scratch=sample_scratch),
    ]
