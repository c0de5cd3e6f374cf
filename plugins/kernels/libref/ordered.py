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


# Rows of w taken at a time by ordered_dot: a block's transpose, total and product stay in cache.
DOT_BLOCK = 2048


def ordered_dot(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """[M, K] . [N, K]^T -> [M, N]: each product rounded to f32, then added in k order. Over blocks
    of w's rows, each transposed once so that column k is contiguous (w[:, k] itself is strided by K:
    a cache line an element); the arithmetic of every output is the same whatever the block."""
    x = np.asarray(x, dtype=F32)
    w = np.asarray(w, dtype=F32)
    total = np.zeros((x.shape[0], w.shape[0]), dtype=F32)
    for start in range(0, w.shape[0], DOT_BLOCK):
        columns = np.ascontiguousarray(w[start:start + DOT_BLOCK].T)  # [K, block]
        block = total[:, start:start + DOT_BLOCK]
        product = np.empty_like(block)
        for k in range(x.shape[1]):
            np.multiply(x[:, k, None], columns[None, k, :], out=product)
            block += product
    return total


def exp32(values: np.ndarray) -> np.ndarray:
    return np.exp(np.asarray(values, dtype=np.float64)).astype(F32)


def sigmoid32(values: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-np.asarray(values, dtype=np.float64)))).astype(F32)


def gelu_tanh32(values: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation (PyTorch's approximate='tanh', ggml's gelu), in f64 rounded once."""
    x = np.asarray(values, dtype=np.float64)
    return (0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x * x * x)))).astype(F32)
