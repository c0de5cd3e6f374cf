"""The operands of docs/OPS.md's ops, sized from a geometry: the `opd_shape` hook any row of the
vocabulary can declare (`opd_shape=vocabulary_opd_shape("gemm")`), so a tool can call it cold.

A fixed operand whose extent no parameter names is sized from a cold-call key the tool adds to the
geometry: `seqs` (sequences, default 1), `context` (positions a sequence's cache holds, default M)
and `rows` (take_rows' source rows, default M). Activations take the `dtype` parameter's type
(f32 where there is none); a weight is RAD_DT_ENCODED [rows, cols] (a vector is one row)."""

from .constants import RAD_DT_ENCODED, RAD_DT_F32, RAD_DT_I32, RAD_DT_U64
from .dtypes import BY_NAME
from .types import RadTensor


def _cold(geometry: dict) -> dict:
    g = dict(geometry)
    m = int(g["M"])
    g.setdefault("seqs", 1)
    g.setdefault("context", m)
    g.setdefault("rows", m)
    if "block_size" in g:  # the paged cache: every sequence's blocks, side by side
        blocks = -(-int(g["context"]) // int(g["block_size"]))
        g["max_blocks"] = blocks
        g["slots"] = int(g["seqs"]) * blocks * int(g["block_size"])
    return g


# op -> operand -> (kind, extents): kind "x" activations, "w" a weight, "f" f32, "i" int32, "u" uint64;
# an extent is a parameter or cold key, an int, or "a*b" (a product)
SHAPES = {
    "embedding": {"ids": ("i", "M"), "table": ("w", "vocab", "n"), "y": ("x", "M", "n")},
    "rmsnorm": {"x": ("x", "M", "n"), "w": ("w", 1, "n"), "y": ("x", "M", "n")},
    "rmsnorm_heads": {"x": ("x", "M", "heads*head_dim"), "w": ("w", 1, "head_dim"),
                      "y": ("x", "M", "heads*head_dim")},
    "gemm": {"x": ("x", "M", "K"), "w": ("w", "N", "K"), "y": ("x", "M", "N")},
    "rope": {"q": ("x", "M", "q_heads*head_dim"), "k": ("x", "M", "kv_heads*head_dim"), "positions": ("i", "M"),
             "inv_freq": ("f", "head_dim/2")},
    "scale": {"x": ("x", "M", "n"), "y": ("x", "M", "n")},
    "add": {"a": ("x", "M", "n"), "b": ("x", "M", "n"), "y": ("x", "M", "n")},
    "silu_mul": {"gate": ("x", "M", "n"), "up": ("x", "M", "n"), "y": ("x", "M", "n")},
    "gelu_tanh_mul": {"gate": ("x", "M", "n"), "up": ("x", "M", "n"), "y": ("x", "M", "n")},
    "take_rows": {"x": ("x", "rows", "n"), "index": ("i", "M"), "y": ("x", "M", "n")},
    "sample": {"logits": ("f", "M", "vocab"), "temperature": ("f", "M"), "top_k": ("i", "M"), "top_p": ("f", "M"),
               "rng": ("u", "M", 2), "tokens": ("i", "M")},
}
_ATTENTION = {"q": ("x", "M", "q_heads*head_dim"), "k": ("x", "M", "kv_heads*head_dim"),
              "v": ("x", "M", "kv_heads*head_dim"), "k_cache": ("x", "slots", "kv_heads*head_dim"),
              "v_cache": ("x", "slots", "kv_heads*head_dim"), "slots": ("i", "M"), "positions": ("i", "M"),
              "cu_seqlens": ("i", "seqs+1"), "context_lens": ("i", "seqs"), "block_tables": ("i", "seqs", "max_blocks"),
              "out": ("x", "M", "q_heads*head_dim")}
SHAPES["attention"] = SHAPES["sliding_attention"] = _ATTENTION
SHAPES["add_rmsnorm"] = {"residual": ("x", "M", "n"), "x": ("x", "M", "n"), "w": ("w", 1, "n"), "y": ("x", "M", "n")}
SHAPES["gemm_add"] = {"x": ("x", "M", "K"), "w": ("w", "N", "K"), "y": ("x", "M", "N"), "residual": ("x", "M", "N")}
SHAPES["rmsnorm_gemm3"] = {"x": ("x", "M", "n"), "norm": ("w", 1, "n"), "normed": ("x", "M", "n"),
                           "wq": ("w", "N.1", "K"), "q": ("x", "M", "N.1"), "wk": ("w", "N.2", "K"),
                           "k": ("x", "M", "N.2"), "wv": ("w", "N.3", "K"), "v": ("x", "M", "N.3")}
SHAPES["rmsnorm_gemm2"] = {name: SHAPES["rmsnorm_gemm3"][name] for name in ("x", "norm", "normed", "wq", "q", "wk", "k")}
SHAPES["rmsnorm_gemm2_silu_mul"] = {"x": ("x", "M", "n.0"), "norm": ("w", 1, "n.0"), "normed": ("x", "M", "n.0"),
                                    "wg": ("w", "N.1", "K"), "gate": ("x", "M", "N.1"), "wu": ("w", "N.2", "K"),
                                    "up": ("x", "M", "N.2")}
SHAPES["rope_attention"] = {**{name: _ATTENTION[name] for name in ("q", "k")}, "positions": ("i", "M"),
                            "inv_freq": ("f", "head_dim/2"),
                            **{name: _ATTENTION[name] for name in ("v", "k_cache", "v_cache", "slots", "cu_seqlens",
                                                                   "context_lens", "block_tables", "out")}}
SHAPES["take_rows_rmsnorm_gemm_sample"] = {
    "h": ("x", "rows", "n"), "index": ("i", "M"), "rows": ("x", "M", "n"), "norm": ("w", 1, "n"),
    "normed": ("x", "M", "n"), "w": ("w", "N", "K"), "logits": ("x", "M", "N"), "temperature": ("f", "M"),
    "top_k": ("i", "M"), "top_p": ("f", "M"), "rng": ("u", "M", 2), "tokens": ("i", "M")}
SIZED_OPS = frozenset(SHAPES)  # the ops vocabulary_opd_shape sizes: all but the collectives and send / recv
KINDS = {"f": RAD_DT_F32, "i": RAD_DT_I32, "u": RAD_DT_U64, "w": RAD_DT_ENCODED}


def _extent(text, g: dict) -> int:
    if isinstance(text, int):
        return text
    if "*" in text:
        left, right = text.split("*")
        return _extent(left, g) * _extent(right, g)
    if text.endswith("/2"):
        return _extent(text[:-2], g) // 2
    if text.endswith("+1"):
        return _extent(text[:-2], g) + 1
    return int(g[text])


def operand_shapes(op: str, geometry: dict) -> tuple[RadTensor, ...]:
    """The operands of `op` at `geometry`, in the schema's order, data None. KeyError for an op this
    module does not size or a parameter the geometry lacks."""
    g = _cold(geometry)
    activations = BY_NAME[g.get("dtype", "f32")]
    tensors = []
    for kind, *extents in SHAPES[op].values():
        dims = [_extent(e, g) for e in extents]
        dtype = activations if kind == "x" else KINDS[kind]
        tensors.append(RadTensor(data=None, dtype=dtype, ndim=len(dims), shape=tuple(dims) + (0,) * (4 - len(dims))))
    return tuple(tensors)


def vocabulary_opd_shape(op: str):
    """An `opd_shape(geometry, n_operands)` hook for a row of `op`."""
    def opd_shape(geometry, n_operands):
        shapes = operand_shapes(op, geometry)
        if n_operands != len(shapes):
            raise ValueError(f"op '{op}' has {len(shapes)} operands, not {n_operands}")
        return shapes
    opd_shape.__name__ = f"opd_shape_{op}"
    return opd_shape
