"""The reference contract: f32 accumulation, IEEE round-to-nearest-even, no FMA, no reassociation.
Sums run in index order, one rounded f32 add at a time, vectorised only across independent sums
(never numpy's pairwise reduction or a BLAS call). Transcendentals are computed in f64 and
rounded once to f32."""

import numpy as np

F32 = np.float32


def ordered_sum(values: np.ndarray) -> np.ndarray:
    """Sum over the last axis, in index order: ((v0 + v1) + v2) + ..."""
    values = np.asarray(values, dtype=F32)
    total = values[..., 0].copy()
    for k in range(1, values.shape[-1]):
        total += values[..., k]
    return total


# Rows of w taken at a time by ordered_dot where w is stored row-major: a block's transpose, total and
# product stay in cache.
DOT_BLOCK = 2048


def ordered_dot(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """[M, K] . [N, K]^T -> [M, N]: each product rounded to f32, then added in k order. The loop over
    k wants column k of w contiguous: w stored column-major (what libref's relayout keeps for the
    rows that multiply, dense.relayout_columns) already has it; a row-major w is transposed here, in
    blocks of DOT_BLOCK rows (w[:, k] itself is strided by K: a cache line an element). The
    arithmetic of every output is the same whatever the layout or the block."""
    x = np.asarray(x, dtype=F32)
    w = np.asarray(w, dtype=F32)
    total = np.zeros((x.shape[0], w.shape[0]), dtype=F32)
    if w.T.flags.c_contiguous:  # column-major: w.T is [K, N], each column of w a contiguous row
        _add_products(x, w.T, total)
        return total
    for start in range(0, w.shape[0], DOT_BLOCK):
        columns = np.ascontiguousarray(w[start:start + DOT_BLOCK].T)  # [K, block]
        _add_products(x, columns, total[:, start:start + DOT_BLOCK])
    return total


# Products made at a time by _add_products (floats): the chunk and the total stay in cache.
PRODUCT_CHUNK = 1 << 16


def _add_products(x: np.ndarray, columns: np.ndarray, total: np.ndarray) -> None:
    """total[M, N] += f32(x[:, k] * columns[k, :]) for k = 0, 1, ... in order (columns [K, N], each
    row contiguous). The products of a chunk of k are made in one multiply, then added one k at a
    time: half the numpy calls of a multiply and an add per k, the same roundings in the same order."""
    m, n = total.shape
    if x.shape[1] == 0:
        return
    chunk = min(x.shape[1], max(1, PRODUCT_CHUNK // max(1, m * n)))
    products = np.empty((m, chunk, n), dtype=F32)
    for start in range(0, x.shape[1], chunk):
        part = products[:, :min(chunk, x.shape[1] - start)]
        np.multiply(x[:, start:start + part.shape[1], None], columns[None, start:start + part.shape[1], :], out=part)
        for j in range(part.shape[1]):
            total += part[:, j]


def exp32(values: np.ndarray) -> np.ndarray:
    return np.exp(np.asarray(values, dtype=np.float64)).astype(F32)


def sigmoid32(values: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-np.asarray(values, dtype=np.float64)))).astype(F32)


def gelu_tanh32(values: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation (PyTorch's approximate='tanh', ggml's gelu), in f64 rounded once."""
    x = np.asarray(values, dtype=np.float64)
    return (0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x * x * x)))).astype(F32)
