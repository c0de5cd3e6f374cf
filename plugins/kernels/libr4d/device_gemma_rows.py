"""libr4d's device rows for the ops Gemma 3 adds (docs/OPS.md): scale, rmsnorm_heads, gelu_tanh_mul
(device/gemma.cu) and sliding_attention (device/attention_window.cu: attention.cu's kernel over a
window of the context). Launch plans as device_rows.py's: planned once, replayed.

Against libref: scale bit for bit; rmsnorm_heads 5e-6 (the canonical sum of squares, as rmsnorm);
gelu_tanh_mul 1e-6 (f64 tanh rounded once); sliding_attention as attention, caches bit for bit and
out 2e-5 (TOLERANCE below)."""

from radiance.abi import RAD_DOMAIN_DEVICE, KernelArgs, RadKernelInfo

from . import device_kernels as dk
from .device_rows import (
    ATTENTION_HEADS, F32_ACTIVATIONS, HEADS_SHAPE, Step, _address, _planned, _rows, _vendor,
    attention_places, attention_scratch, chained,
)
from .rows import layout_vector, relayout_vector

TOLERANCE = {"scale": 0.0, "rmsnorm_heads": 5e-6, "gelu_tanh_mul": 1e-6, "sliding_attention": 2e-5}


def _scale(a):
    x, y = a.t
    count = int(a.params["M"]) * int(a.params["n"])
    grid, block = dk.flat_grid(count, getattr(a.stream, "multiprocessors", 1))
    args = KernelArgs("r4d_scale_dev").pointer(_address(x)).pointer(_address(y)).i64(count).f32(a.params["scale"])
    return [Step("r4d_scale_dev", "gemma", grid, block, args)]


def _gelu_tanh_mul(a):
    gate, up, y = a.t
    count = int(a.params["M"]) * int(a.params["n"])
    grid, block = dk.flat_grid(count, getattr(a.stream, "multiprocessors", 1))
    args = (KernelArgs("r4d_gelu_tanh_mul_dev").pointer(_address(gate)).pointer(_address(up)).pointer(_address(y))
            .i64(count))
    return [Step("r4d_gelu_tanh_mul_dev", "gemma", grid, block, args)]


def _rmsnorm_heads(a):
    x, w, y = a.t
    m, heads, d = int(a.params["M"]), int(a.params["heads"]), int(a.params["head_dim"])
    pitch = int(x.shape[1]) if x.ndim > 1 else heads * d  # a row of x may hold more than these heads
    if pitch < heads * d:
        raise ValueError(f"rows of {pitch} values hold no {heads} heads of {d}")
    warp = dk.warp_size(_vendor(a))
    grid, block = (-(-m * heads // 4), 1, 1), (4 * warp, 1, 1)
    args = (KernelArgs("r4d_rmsnorm_heads_dev").pointer(_address(x)).pointer(_address(w)).pointer(_address(y))
            .i32(m).i32(heads).i32(d).i64(pitch).f32(a.params["eps"]))
    return [Step("r4d_rmsnorm_heads_dev", "gemma", grid, block, args)]


def _sliding_attention(a):
    """attention.cu's store kernel, then r4d_attend_window: device_rows' attention plan with the window."""
    q, k, v, k_cache, v_cache, slots, positions, cu_seqlens, context_lens, block_tables, out = a.t
    p = a.params
    m, heads, kv, d, window = int(p["M"]), int(p["q_heads"]), int(p["kv_heads"]), int(p["head_dim"]), int(p["window"])
    if d > dk.ATT_MAX_HEAD_DIM or d % dk.ATT_HEAD_DIM_STEP or heads % kv or heads // kv > dk.ATT_MAX_GROUP or window < 1:
        raise ValueError(f"head_dim {d} (at most {dk.ATT_MAX_HEAD_DIM}, a multiple of {dk.ATT_HEAD_DIM_STEP}), "
                         f"{heads} heads over {kv} kv heads (at most {dk.ATT_MAX_GROUP} a kv head), window {window} "
                         "(at least 1)")
    group = heads // kv
    partial, counters = attention_places(a, m, kv, group, d)
    splits = dk.attention_splits(m, kv, getattr(a.stream, "multiprocessors", 1))
    seqs, max_blocks = _rows(cu_seqlens) - 1, int(block_tables.shape[1]) if block_tables.ndim > 1 else 1
    width = kv * d
    options = dk.attention_options(d, group)
    grid, block = dk.rows_grid(m, width)
    store = (KernelArgs("r4d_kv_store_dev").pointer(_address(k)).pointer(_address(v)).pointer(_address(k_cache))
             .pointer(_address(v_cache)).pointer(_address(slots)).i32(width))
    args = KernelArgs("r4d_attend_window")
    for tensor in (q, k, v, k_cache, v_cache, slots, positions, cu_seqlens, context_lens, block_tables, out):
        args.pointer(_address(tensor))
    args.pointer(0).pointer(partial).pointer(counters).i32(seqs).i32(max_blocks).i32(heads).i32(kv).i32(d)
    args.i32(p["block_size"]).i32(0).f32(p["scale"]).i32(window)
    return [Step("r4d_kv_store_dev", "attention_window", grid, block, store, 0, options),
            Step("r4d_attend_window", "attention_window", (m, kv, splits), (dk.ATT_THREADS, 1, 1),
                 args, 0, options)]


def build_rows() -> list[RadKernelInfo]:
    def row(name, op, build, constraints, computes, shape, **hooks):
        return RadKernelInfo(name=chained(name), op=op, family="r4d", computes=f"{computes} (device/*.cu)", shape=shape,
                             dtypes="f32", domain=RAD_DOMAIN_DEVICE, priority=10,
                             constraints=[F32_ACTIVATIONS, *constraints], launch=_planned(name, build), **hooks)

    return [
        row("r4d_scale_dev", "scale", _scale, [], "x * scale, the scale rounded to f32", "any"),
        row("r4d_rmsnorm_heads_dev", "rmsnorm_heads", _rmsnorm_heads, [], "a warp per (row, head), the canonical sum "
            "of squares", "any", layout=layout_vector, relayout=relayout_vector),
        row("r4d_gelu_tanh_mul_dev", "gelu_tanh_mul", _gelu_tanh_mul, [], "gelu_tanh in f64 rounded to f32, times up",
            "any"),
        row("r4d_sliding_attention_dev", "sliding_attention", _sliding_attention,
            [*ATTENTION_HEADS], "paged KV stored, then attention.cu's split online softmax over the window's keys",
            HEADS_SHAPE, scratch=attention_scratch),
    ]
