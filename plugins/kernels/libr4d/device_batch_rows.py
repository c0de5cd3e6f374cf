"""libr4d's device rows for batches (docs/LIBR4D.md "Tensor cores", "Attention for batches"): above
the decode band (prefill chunks, batched decode), the gemm on bf16 and fp8 weights and the attention
over the paged cache, on tensor cores. They build on device_rows.py (its Step, plans and weights)
and are listed by its build_device_rows, ahead of the f32 SIMT rows they outrank (priority 20
against 10) over the same band.

A card without the tensor cores a launch needs (AMD, NVIDIA before sm_80, e4m3 before sm_89) gets
the SIMT kernels from the same row (gemm.cu, attention.cu): a row's contract is its tolerance, which
those (exact, or within 2e-5) meet too. Host-checkable geometry: device_tensor_cores.py,
device_attention_tiles.py."""

from radiance.abi import RAD_CDIV, RAD_CEQ, RAD_CGE, RAD_CIN, RAD_CLE, RAD_DOMAIN_DEVICE, KernelArgs, RadKernelInfo

from . import device_attention_decode as ad
from . import device_attention_tiles as at
from . import device_kernels as dk
from . import device_streamed_gemm as sg
from . import device_tensor_cores as tc
from .device_formats import FP8_FORMATS, layout_as_stored
from .device_rows import (
    F32_ACTIVATIONS, DeviceWeight, ScratchTooSmall, Step, _address, _attention, _planned, _rows, _vendor,
    attention_scratch, chained, decode_attention_step, decoding,
)

PRIORITY = 20  # above the SIMT rows of the same band


def _kind(weight: DeviceWeight) -> str:
    if weight.label == "bf16":
        return "bf16"
    if weight.label in FP8_FORMATS:
        return "e4m3"
    raise ValueError(f"the tensor-core gemm reads bf16 and fp8 weights, not {weight.label}")


def _aligned16(name: str, address: int) -> None:
    if address % 16:
        raise ValueError(f"operand {name} at {address:#x} is not 16-byte aligned (the tensor-core gemm copies 16 bytes at a time)")


def _simt(a, x: int, w: DeviceWeight, y: int) -> Step:
    """gemm.cu's f32 tiles: exact, for a card without the kind's tensor cores."""
    m = int(a.params["M"])
    grid = (-(-w.rows // 64), -(-m // 64), 1)
    args = (KernelArgs("r4d_gemm_dev").pointer(x).pointer(w.codes).pointer(w.scale).pointer(w.min).i32(w.fmt)
            .pointer(y).i32(m).i32(w.rows).i32(w.cols))
    return Step("r4d_gemm_dev", "gemm", grid, (256, 1, 1), args)


def _streamed(a, x: int, w: DeviceWeight, y: int, kind: str) -> list:
    """gemm_streamed.cu's launch (device_streamed_gemm.py), x read as it is; where K is split, its
    partial sums in the scratch, then r4d_streamed_reduce adding them (same module, same options)."""
    m, n, k, cut = int(a.params["M"]), w.rows, w.cols, sg.SERVING.cut
    splits, k_chunk = sg.split(m, n, k, kind, cut)
    layout = sg.scratch_layout(m, n, k, kind, cut)
    # after the tile kernels' counters (tc.COUNTER_BYTES): this row's other steps keep them there
    if tc.COUNTER_BYTES + layout["total"] > int(a.scratch_bytes or 0):
        raise ScratchTooSmall(f"{a.scratch_bytes} bytes of scratch, the streamed gemm needs {layout['total']} after "
                              f"{tc.COUNTER_BYTES} of counters")
    partial = int(a.scratch or 0) + tc.COUNTER_BYTES + layout["partial"] if splits > 1 else 0
    scale = w.scale if kind == "e4m3" else 0
    stride = 1 if w.label == "fp8_channel" else 0
    name, options = sg.entry(kind, m), sg.options(sg.entry(kind, m), cut)
    grid, block = sg.grid(n, splits, cut)
    args = (KernelArgs(name).pointer(x).pointer(w.codes).pointer(scale).i32(stride).pointer(y).pointer(partial)
            .i32(m).i32(n).i32(k).i32(k_chunk))
    steps = [Step(name, "gemm_streamed", grid, block, args, 0, options)]
    if splits > 1:
        add = KernelArgs(sg.REDUCE).pointer(partial).pointer(scale).i32(stride).pointer(y).i32(m).i32(n).i32(splits)
        steps.append(Step(sg.REDUCE, "gemm_streamed", *sg.reduce_grid(m, n), add, 0, options))
    return steps


def tc_gemm_steps(a, x: int, weight, y: int) -> list:
    """The launches of y = x . w^T for M above the GEMV band: up to 64 rows, where it serves
    (device_streamed_gemm.serves), the streamed GEMM; else for e4m3, x's rows quantised into the
    scratch first (for wgmma's, TMA's and the skinny kernel's bf16, narrowed to bf16 there); for TMA, r4d_tma_maps
    writing the tensor maps of those rows and of w into the scratch; then the tile kernel the card
    runs (device_tensor_cores.kernel_for)."""
    w = DeviceWeight(weight)
    kind, m, n, k = _kind(w), int(a.params["M"]), w.rows, w.cols
    kernel = tc.kernel_for(_vendor(a), getattr(a.stream, "target", ""), kind, m)
    if kernel == "simt":
        return [_simt(a, x, w, y)]
    for name, address in (("x", x), ("w", w.codes)):
        _aligned16(name, address)
    if sg.serves(kernel, kind, m):
        return _streamed(a, x, w, y, kind)
    splits, per = tc.split(m, n, k, kind, kernel)
    layout = tc.scratch_layout(m, n, k, kind, kernel)
    if layout["total"] > int(a.scratch_bytes or 0):
        raise ScratchTooSmall(f"{a.scratch_bytes} bytes of scratch, the tensor-core gemm needs {layout['total']}")
    scratch = int(a.scratch or 0)
    at = lambda part: scratch + layout[part] if part in layout else 0  # noqa: E731
    name = tc.entry(kind, m, kernel)
    steps = []
    if kind == "e4m3":
        quantize = KernelArgs("r4d_quantize_e4m3_dev").pointer(x).i32(m).i32(k).pointer(at("codes")).pointer(at("scales"))
        steps.append(Step("r4d_quantize_e4m3_dev", "gemm_inputs", (m, 1, 1), (256, 1, 1), quantize))
    elif tc.narrows(kind, kernel):
        narrow = KernelArgs("r4d_narrow_bf16_dev").pointer(x).i64(m * k).pointer(at("codes"))
        steps.append(Step("r4d_narrow_bf16_dev", "gemm_inputs", *tc.narrow_grid(m, k), narrow))
    grid, block = tc.grid(m, n, splits, kernel, kind)
    rows = at("codes") if "codes" in layout else x  # the x the GEMM reads: bf16 rows or e4m3 codes, else f32
    if kernel == "tma":  # its tensor maps of x's rows and w's, built on the card into the scratch
        row_bytes = k * (2 if kind == "bf16" else 1)
        maps = KernelArgs("r4d_tma_maps").pointer(rows).pointer(w.codes).i32(m).i32(n).i32(row_bytes).pointer(at("maps"))
        steps.append(Step("r4d_tma_maps", "gemm_tma", (1, 1, 1), (32, 1, 1), maps, 0, tc.options("r4d_tma_maps")))
        args = KernelArgs(name).pointer(at("maps")).pointer(at("scales"))
    else:
        args = KernelArgs(name).pointer(rows).pointer(at("scales")).pointer(w.codes)
    args = (args.pointer(w.scale if kind == "e4m3" else 0).i32(1 if w.label == "fp8_channel" else 0).pointer(y)
            .pointer(at("partial")).pointer(at("counters")).i32(m).i32(n).i32(k).i32(per))
    steps.append(Step(name, tc.source(kernel), grid, block, args, tc.shared_bytes(m, kernel, kind), tc.options(name, m)))
    return steps


def _tc_gemm(a):
    x, weight, y = a.t
    return tc_gemm_steps(a, _address(x), weight, _address(y))


def tc_gemm_scratch(kind):
    """The tile GEMMs' most, or the streamed GEMM's where that is more (whether it serves is the
    process's choice, made after the scratch is sized)."""
    def scratch(geometry) -> int:
        m, n, k = int(geometry["M"]), int(geometry["N"]), int(geometry["K"])
        return max(tc.scratch_bytes(m, n, k, kind), tc.COUNTER_BYTES + sg.scratch_bytes(m, n, k, kind))
    return scratch


# ------------------------------------------------------------------------------------------------
# attention (attention_tiles.cu)

def _tc_attention(a):
    """A decode step (one token a sequence) where attention_decode.cu serves it: that kernel alone.
    Else the step's k, v stored at their slots and narrowed to bf16 into the scratch
    (r4d_kv_store_bf16_dev), then the tiles; attention.cu's SIMT kernel where the tiles do not serve
    (device_attention_tiles.serves)."""
    q, k, v, k_cache, v_cache, slots, positions, cu_seqlens, context_lens, block_tables, out = a.t
    p = a.params
    m, heads, kv, d = int(p["M"]), int(p["q_heads"]), int(p["kv_heads"]), int(p["head_dim"])
    group = heads // kv if kv and heads % kv == 0 else 0
    seqs, max_blocks = _rows(cu_seqlens) - 1, int(block_tables.shape[1]) if block_tables.ndim > 1 else 1
    if decoding(a, cu_seqlens):
        return [decode_attention_step(a, q, k, v, k_cache, v_cache, slots, positions, context_lens, block_tables, out)]
    if not at.serves(_vendor(a), getattr(a.stream, "target", ""), d, group):
        return _attention(a)
    layout = at.scratch_layout(m, seqs, kv, group, d)
    tail = ad.tail_bytes(group, d)
    if layout["total"] + tail > int(a.scratch_bytes or 0):
        raise ScratchTooSmall(f"{a.scratch_bytes} bytes of scratch, the attention tiles need {layout['total']} and the "
                              f"tail {tail}")
    if at.counters(m, seqs, kv, group) > ad.COUNTERS:
        raise ValueError(f"{at.counters(m, seqs, kv, group)} split counters, the scratch's tail holds {ad.COUNTERS}")
    scratch = int(a.scratch or 0)
    counters = scratch + ad.scratch_layout(int(a.scratch_bytes), group, d)["counters"]  # the tail's, shared
    width = kv * d
    fresh_k, fresh_v = scratch + layout["fresh_k"], scratch + layout["fresh_v"]
    store = (KernelArgs("r4d_kv_store_bf16_dev").pointer(_address(k)).pointer(_address(v)).pointer(_address(k_cache))
             .pointer(_address(v_cache)).pointer(_address(slots)).i32(width).pointer(fresh_k).pointer(fresh_v))
    args = KernelArgs("r4d_attend_tiles")
    for tensor in (q, k_cache, v_cache, positions, cu_seqlens, context_lens, block_tables, out):
        args.pointer(_address(tensor))
    args.pointer(scratch + layout["partial"] if "partial" in layout else 0)
    args.pointer(counters if "partial" in layout else 0)
    args.i32(seqs).i32(max_blocks).i32(heads).i32(kv).i32(p["block_size"]).f32(p["scale"]).pointer(fresh_k).pointer(fresh_v)
    tiles, threads = at.grid(m, seqs, kv, group)
    options = at.options(d, group, at.warps(m, seqs, group))
    grid, block = at.store_grid(m, width)
    return [Step("r4d_kv_store_bf16_dev", "attention_tiles", grid, block, store, 0, options),
            Step("r4d_attend_tiles", "attention_tiles", tiles, threads, args, at.shared_bytes(d), options)]


def _tc_attention_scratch(geometry) -> int:
    """The tiles' bf16 rows of the step and partials, or attention.cu's where more, then
    attention_decode.cu's tail (device_rows.attention_scratch)."""
    heads, kv = int(geometry["q_heads"]), int(geometry["kv_heads"])
    group = heads // kv if kv and heads % kv == 0 else 1
    return attention_scratch(geometry, at.scratch_bytes(int(geometry["M"]), kv, group, int(geometry["head_dim"])),
                             band=False)


def stated_tolerances() -> dict:
    """{row name: its tolerance against libref} of the rows here that trade accuracy by design, outside
    their op's tolerance (rad_kernel_tolerance; docs/OPS.md "Agreement with libref")."""
    return {chained("r4d_gemm_tc_bf16_dev"): tc.TOLERANCE["bf16"], chained("r4d_gemm_tc_fp8_dev"): tc.TOLERANCE["e4m3"],
            chained("r4d_attention_tc_dev"): at.TOLERANCE}


def build_batch_rows() -> list[RadKernelInfo]:
    above_gemv = RAD_CGE("M", tc.GEMV_MAX_M + 1)

    def row(name, op, build, constraints, computes, shape, dtypes, **hooks):
        return RadKernelInfo(name=chained(name), op=op, family="r4d", computes=f"{computes} (device/*.cu)",
                             shape=shape, dtypes=dtypes, domain=RAD_DOMAIN_DEVICE, priority=PRIORITY,
                             constraints=[F32_ACTIVATIONS, *constraints], launch=_planned(name, build), **hooks)

    fp8 = " ".join(FP8_FORMATS)
    return [
        row("r4d_gemm_tc_bf16_dev", "gemm", _tc_gemm,
            [above_gemv, RAD_CEQ("split_k", 1), RAD_CIN("wdtype", "bf16"), RAD_CDIV("K", 8)],
            "tensor-core GEMM: x rounded to bf16, f32 accumulation; wgmma on sm_90, mma.sync from sm_80",
            f"M>={tc.GEMV_MAX_M + 1}, K%8==0", "f32 x bf16", layout=layout_as_stored(("bf16",)),
            scratch=tc_gemm_scratch("bf16")),
        row("r4d_gemm_tc_fp8_dev", "gemm", _tc_gemm,
            [above_gemv, RAD_CEQ("split_k", 1), RAD_CIN("wdtype", fp8), RAD_CDIV("K", 16)],
            "fp8 tensor-core GEMM: x quantised per row to e4m3 (amax / 448), e4m3 products, f32 accumulation, "
            "scaled by the row's and the weight row's scales; wgmma on sm_90, mma.sync from sm_89",
            f"M>={tc.GEMV_MAX_M + 1}, K%16==0", f"f32 x {fp8}", layout=layout_as_stored(FP8_FORMATS),
            scratch=tc_gemm_scratch("e4m3")),
        row("r4d_attention_tc_dev", "attention", _tc_attention,
            [above_gemv, RAD_CLE("head_dim", dk.ATT_MAX_HEAD_DIM)],
            "paged KV stored, then flash attention on bf16 tensor cores: a block per (query tile of one sequence, "
            "kv head, split of the context), splits merged in order; a decode step (one token a sequence) on "
            "NVIDIA: attention_decode.cu, f32, a block per (sequence, kv head, chunk of the context) "
            "(attention.cu's SIMT kernel where neither serves: head_dim other than 64 and 128, no sm_80)", f"M>={tc.GEMV_MAX_M + 1}, "
            f"head_dim<={dk.ATT_MAX_HEAD_DIM}", "f32", scratch=_tc_attention_scratch),
    ]
