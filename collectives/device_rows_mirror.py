"""numpy mirrors of the row family's arithmetic (allreduce_fused.cu) and of the device rmsnorm it
reproduces (libr4d's r4d_rmsnorm_dev: common.cu's r4d_row_squares), bit for bit: what the fake card
runs in place of the kernels (tests/fixtures/fakecard.py), and what the card tests and the benchmark
compare the card's results with. f32 throughout, one rounding an operation, no fused multiply-add."""

from __future__ import annotations

import numpy as np

F32 = np.float32
WARP = 32          # R4D_WARP on NVIDIA: the lanes r4d_row_squares spreads a row over
CHUNK = 4          # a lane's 4 consecutive elements at a time


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """allreduce.cu's rad_from_f32: f32 -> bf16 bits, nearest even; a NaN stays a (quiet) NaN."""
    u = np.ascontiguousarray(values, F32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits).astype(np.uint32) << 16).view(F32)


def wire_round(values: np.ndarray, wire: str) -> np.ndarray:
    """What a value is after the wire: itself on f32, rounded to bf16 and back on bf16."""
    values = np.asarray(values, F32)
    return values.copy() if wire == "f32" else from_bf16_bits(bf16_bits(values))


def rank_order_sum(contributions, wire: str) -> np.ndarray:
    """The row family's all-reduce: wire(((v_0 + v_1) + v_2) + ...) with v_r = wire(x_r)."""
    acc = wire_round(contributions[0], wire)
    for x in contributions[1:]:
        acc = acc + wire_round(x, wire)
    return wire_round(acc, wire)


def row_squares(row: np.ndarray) -> np.float32:
    """common.cu's r4d_row_squares: lane l adds, in order, the squares of elements [4c, 4c + 4) for
    c = l, l + 32, ...; then the warp's butterfly (v += shfl_xor(v, o), o = 16, 8, 4, 2, 1). Zeros
    padding the row to whole rounds add nothing (a sum of squares is never -0)."""
    row = np.asarray(row, F32).reshape(-1)
    rounds = -(-row.size // (WARP * CHUNK))
    squares = np.zeros(rounds * WARP * CHUNK, F32)
    squares[:row.size] = row * row
    per_lane = squares.reshape(rounds, WARP, CHUNK).transpose(1, 0, 2).reshape(WARP, rounds * CHUNK)
    lanes = np.cumsum(per_lane, axis=1, dtype=F32)[:, -1]   # a sequential chain per lane
    for offset in (16, 8, 4, 2, 1):
        lanes = lanes + lanes[np.arange(WARP) ^ offset]
    return lanes[0]


def rmsnorm(rows: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """r4d_rmsnorm_dev: y = (x * (1 / sqrt(squares / n + eps))) * w per row."""
    rows = np.asarray(rows, F32)
    n = rows.shape[-1]
    out = np.empty_like(rows)
    for i, row in enumerate(rows.reshape(-1, n)):
        scale = F32(1.0) / np.sqrt(row_squares(row) / F32(n) + F32(eps))
        out.reshape(-1, n)[i] = (row * scale) * np.asarray(w, F32).reshape(-1)[:n]
    return out


def fused(contributions, residual: np.ndarray, w: np.ndarray, eps: float, wire: str):
    """all_reduce_add_rmsnorm as the chain leaves it: (x, residual, y) after all_reduce -> add -> rmsnorm."""
    x = rank_order_sum(contributions, wire)
    residual = np.asarray(residual, F32) + x
    return x, residual, rmsnorm(residual, w, eps)
