"""The tensor-core attention's geometry (device/attention_tiles.cu), host-checkable: query tiles,
the split of the context, the scratch layout, which cards run it, and its tolerance against libref
(device_batch_rows.py builds the launches; docs/LIBR4D.md "Attention for batches").

A block is one query tile (ROWS // group consecutive tokens of one sequence, times the group of
query heads that share a kv head), one kv head and one split of the keys. Tiles are counted
sequence by sequence, so their number is at most min(M, ceil(M / tokens) + seqs - 1): the grid's
x. The splits come from M alone (the fewest tiles M can make), so a replay with other sequences
keeps its grid, and the scratch hook knows the most any M of the band asks."""

import os

ROWS = 64            # query rows a block: 4 warps of 16
THREADS = 128
KEYS = 32            # keys a tile of shared memory (AT_KT)
PAD = 4              # floats of padding a shared row
MAX_SPLITS = 16      # AT_MAX_SPLITS
TARGET_BLOCKS = 264  # split the context until about two blocks a multiprocessor of an H200
HEAD_DIMS = (64, 128)
MAX_GROUP = 8
GEMV_MAX_M = 8       # the rows here take M above the decode band of the fused rope_attention row
KERNEL = os.environ.get("R4D_TC_KERNEL") or None  # "simt" keeps attention.cu's kernel (as for the GEMM)

# max|out - ref| / max|ref| against libref's attention: q, k, p and v rounded to tf32 (10 bits of
# mantissa, f32's range), f32 sums. Measured with the kernel's numpy form
# (tests/fixtures/r4d_fake_kernels.py) against exact softmax attention, head_dim 64 and 128,
# contexts 1 to 8192, 1 to 16 splits, q scaled up to 6x (peaked weights): worst 4.4e-3.
TOLERANCE = 1e-2


def serves(vendor: str, target: str, head_dim: int, group: int) -> bool:
    """Whether attention_tiles.cu runs here: NVIDIA from sm_80 (tf32 mma.sync), head_dim 64 or 128,
    at most 8 query heads a kv head; elsewhere the row issues attention.cu's kernel."""
    if KERNEL == "simt" or vendor != "cuda" or not target.startswith("sm_"):
        return False
    digits = target[3:].rstrip("af")
    return digits.isdigit() and int(digits) >= 80 and head_dim in HEAD_DIMS and 1 <= group <= MAX_GROUP


def tokens_per_tile(group: int) -> int:
    return ROWS // group


def tiles_bound(m: int, seqs: int, group: int) -> int:
    """The most tiles M tokens of `seqs` sequences make (each sequence's last tile may be short)."""
    return max(1, min(m, -(-m // tokens_per_tile(group)) + seqs - 1))


def splits(m: int, kv_heads: int, group: int) -> int:
    fewest = -(-m // tokens_per_tile(group)) * kv_heads
    return max(1, min(MAX_SPLITS, -(-TARGET_BLOCKS // fewest)))


def grid(m: int, seqs: int, kv_heads: int, group: int) -> tuple:
    return (tiles_bound(m, seqs, group), kv_heads, splits(m, kv_heads, group)), (THREADS, 1, 1)


def shared_bytes(head_dim: int) -> int:
    """A key tile and a value tile of f32 rows, padded."""
    return 2 * KEYS * (head_dim + PAD) * 4


def options(head_dim: int, group: int) -> tuple:
    return (f"-DR4D_AT_D={head_dim}", f"-DR4D_AT_G={group}")


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


def scratch_layout(m: int, seqs: int, kv_heads: int, group: int, head_dim: int) -> dict:
    """Offsets where the context is split: a u32 counter a (tile, kv head), then per (token, kv head,
    split, head) its max, sum and head_dim weighted values; and the total."""
    count = splits(m, kv_heads, group)
    if count == 1:
        return {"total": 0}
    counters = _aligned(4 * tiles_bound(m, seqs, group) * kv_heads)
    return {"counters": 0, "partial": counters,
            "total": counters + _aligned(4 * m * kv_heads * count * group * (head_dim + 2))}


def scratch_bytes(max_m: int, kv_heads: int, group: int, head_dim: int) -> int:
    """The most any M of the band [GEMV_MAX_M + 1, max_m] needs, with as many sequences as tokens."""
    return max((scratch_layout(m, m, kv_heads, group, head_dim)["total"]
                for m in range(GEMV_MAX_M + 1, max(max_m, GEMV_MAX_M + 1) + 1)), default=0)
