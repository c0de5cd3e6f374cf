"""libr4d's rows of the ops Gemma 3 adds to the vocabulary: scale, rmsnorm_heads, gelu_tanh_mul and
sliding_attention (libref declares them; plugins/architectures/gemma3 uses them).

- scale, gelu_tanh_mul: r4d_gemma.c (gelu in double through r4d.c's exp: docs/LIBR4D.md's tolerance).
- rmsnorm_heads: r4d.c's rmsnorm over the rows of head_dim that the [tokens, heads * head_dim]
  buffer holds (a view of the same memory, planned once): libref's bits.
- sliding_attention: r4d.c's attention, each token's keys starting at its window.

Without the native library they run fallback.py's numpy bodies, as every libr4d row does.
"""

import numpy as np

from radiance.abi import RAD_DOMAIN_HOST, RadKernelInfo

from . import fallback
from .rows import (
    F32_ACTIVATIONS, _bits, _guarded, _pack_attention, _planned, layout_vector, relayout_vector, unrelayout_vector,
)


def _pack_scale(op, a):
    p = a.params
    return [op(a.t[0].data), op(a.t[1].data), p["M"], p["n"], _bits(p["scale"])]


def _pack_gelu(op, a):
    p = a.params
    return [op(a.t[0].data), op(a.t[1].data), op(a.t[2].data), p["M"], p["n"]]


def _heads_view(array, heads, head_dim):
    """[rows, heads * head_dim] as [rows * heads, head_dim], the same memory (AttributeError where
    that would need a copy)."""
    if array.shape[-1] != heads * head_dim:
        raise ValueError(f"rmsnorm_heads: an operand {array.shape[-1]} wide, not heads * head_dim = {heads * head_dim}")
    if not array.flags.c_contiguous:  # rows padded apart: no view of head_dim rows exists
        raise AttributeError(f"rmsnorm_heads: an operand whose rows are not contiguous (strides {array.strides})")
    return array.reshape(-1, head_dim)


def _pack_rmsnorm_heads(op, a):
    """r4d.c's rmsnorm (r4d_rmsnorm_p's arguments) over M * heads rows of head_dim."""
    p = a.params
    heads, head_dim = int(p["heads"]), int(p["head_dim"])
    x, w, y = a.t[0].data, a.t[1].data, a.t[2].data
    return [op(_heads_view(x, heads, head_dim)), op(np.asarray(w).reshape(-1)), op(_heads_view(y, heads, head_dim)),
            int(p["M"]) * heads, head_dim, _bits(p["eps"])]


def _pack_sliding_attention(op, a):
    return [*_pack_attention(op, a), int(a.params["window"])]


NATIVE = {"scale": ("r4d_scale_p", _pack_scale), "gelu_tanh_mul": ("r4d_gelu_tanh_mul_p", _pack_gelu),
          "rmsnorm_heads": ("r4d_rmsnorm_p", _pack_rmsnorm_heads),
          "sliding_attention": ("r4d_sliding_attention_p", _pack_sliding_attention)}


def build_rows(native) -> list[RadKernelInfo]:
    """The four rows, bound to the native library, or to numpy when `native` is None."""
    if native is not None:
        table = {op: _planned(native, name, pack) for op, (name, pack) in NATIVE.items()}
        body = "r4d_gemma.c, r4d.c"
    else:
        table = {op: _guarded(f"{op} (numpy)", getattr(fallback, op)) for op in NATIVE}
        body = "numpy fallback"

    def row(name, op, computes, **hooks):
        return RadKernelInfo(name=name, op=op, family="r4d", computes=f"{computes} ({body})", shape="any", dtypes="f32",
                             domain=RAD_DOMAIN_HOST, priority=10, constraints=[F32_ACTIVATIONS], launch=table[op],
                             **hooks)

    return [
        row("r4d_scale", "scale", "elementwise, the scale rounded to f32"),
        row("r4d_rmsnorm_heads", "rmsnorm_heads", "r4d.c's rmsnorm over rows of head_dim: libref's ordered sums",
            layout=layout_vector, relayout=relayout_vector, unrelayout=unrelayout_vector),
        row("r4d_gelu_tanh_mul", "gelu_tanh_mul", "x / (1 + exp(-2z)) in f64 rounded to f32, times up"),
        row("r4d_sliding_attention", "sliding_attention", "r4d.c's attention from each token's window start"),
    ]
