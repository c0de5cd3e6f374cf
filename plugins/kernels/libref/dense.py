"""Reference rows of the dense, elementwise and weight ops. Operand arrays are [M, n] f32."""

import numpy as np

from radiance.abi import RAD_OK, rad_args_getf, rad_args_geti, rad_weight_f32, rad_weight_from_f32

from .ordered import F32, gelu_tanh32, ordered_dot, ordered_sum, sigmoid32


def relayout_f32(weight, geometry):
    """The oracle keeps every weight decoded to f32 [rows, cols]."""
    return rad_weight_f32(weight)


# Rows of a weight copied at a time by relayout_columns: the block's source and destination stay
# in cache (numpy's one-call transposed copy walks one side a cache line an element: 4x slower).
TRANSPOSE_ROWS = 256


def relayout_columns(weight, geometry):
    """relayout_f32's array stored column-major, for the rows that multiply by it: ordered_dot walks
    the columns of w in k order, each contiguous this way, where a row-major weight would be
    transposed again at every call (the same values and shape; a vector's two layouts are one)."""
    values = np.asarray(rad_weight_f32(weight), dtype=F32)
    stored = np.empty(values.shape[::-1], dtype=F32).T  # [rows, cols], column-major
    for start in range(0, values.shape[0], TRANSPOSE_ROWS):
        stored[start:start + TRANSPOSE_ROWS] = values[start:start + TRANSPOSE_ROWS]
    return stored


def unrelayout_f32(stored, geometry):
    """The inverse: the dense f32 as the plain f32 encoding's planes (rad-kbench compares them)."""
    return rad_weight_from_f32(stored)


def embedding(a):
    ids, table, y = (t.data for t in a.t)
    m = rad_args_geti(a, "M")
    y[:m] = table[ids[:m]]
    return RAD_OK


def rmsnorm(a):
    """y = (x * (1 / sqrt(sum(x*x) / n + eps))) * w, the sum in column order."""
    x, w, y = (t.data for t in a.t)
    m, n = rad_args_geti(a, "M"), rad_args_geti(a, "n")
    x = x[:m]
    mean = ordered_sum(x * x) / F32(n)
    scale = F32(1.0) / np.sqrt(mean + F32(rad_args_getf(a, "eps")))
    y[:m] = (x * scale[:, None]) * w.reshape(-1)[None, :n]
    return RAD_OK


def rmsnorm_heads(a):
    """rmsnorm over each head_dim slice of a row: y = (x * (1 / sqrt(sum(x*x) / d + eps))) * w, the sum
    in column order (y may be x)."""
    x, w, y = (t.data for t in a.t)
    m, heads, head_dim = rad_args_geti(a, "M"), rad_args_geti(a, "heads"), rad_args_geti(a, "head_dim")
    x = x[:m, :heads * head_dim].reshape(m, heads, head_dim)
    mean = ordered_sum(x * x) / F32(head_dim)
    scale = F32(1.0) / np.sqrt(mean + F32(rad_args_getf(a, "eps")))
    y[:m, :heads * head_dim] = ((x * scale[:, :, None]) * w.reshape(-1)[None, None, :head_dim]).reshape(m, -1)
    return RAD_OK


def scale(a):
    """y = x * scale, the scale rounded to f32 (y may be x)."""
    x, y = (t.data for t in a.t)
    m = rad_args_geti(a, "M")
    np.multiply(x[:m], F32(rad_args_getf(a, "scale")), out=y[:m])
    return RAD_OK


def gelu_tanh_mul(a):
    """y = gelu_tanh(gate) * up, gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in f64
    rounded once to f32."""
    gate, up, y = (t.data for t in a.t)
    m = rad_args_geti(a, "M")
    y[:m] = gelu_tanh32(gate[:m]) * up[:m]
    return RAD_OK


def gemm(a):
    x, w, y = (t.data for t in a.t)
    m = rad_args_geti(a, "M")
    y[:m] = ordered_dot(x[:m], w)
    return RAD_OK


def add(a):
    x, b, y = (t.data for t in a.t)
    m = rad_args_geti(a, "M")
    np.add(x[:m], b[:m], out=y[:m])
    return RAD_OK


def silu_mul(a):
    """y = (gate * sigmoid(gate)) * up."""
    gate, up, y = (t.data for t in a.t)
    m = rad_args_geti(a, "M")
    y[:m] = (gate[:m] * sigmoid32(gate[:m])) * up[:m]
    return RAD_OK


def take_rows(a):
    x, index, y = (t.data for t in a.t)
    m = rad_args_geti(a, "M")
    y[:m] = x[index[:m]]
    return RAD_OK
