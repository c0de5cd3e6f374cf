"""The tensor-core attention's geometry (device/attention_tiles.cu), host-checkable: query tiles,
the split of the context, the scratch layout, which cards run it, and its tolerance against libref
(device_batch_rows.py builds the launches; docs/LIBR4D.md "Attention for batches").

A block is one query tile (rows // group consecutive tokens of one sequence, times the group of
query heads that share a kv head; 16 rows a warp), one kv head and one split of the keys. A step
whose sequences average a whole tile of 8 warps (a prefill) takes 8 warps, 128 rows; else (decode
tokens, short chunks) 4 warps, 64 rows, so that fewer rows are padding. Tiles are counted sequence by
sequence, so their number is at most min(M, ceil(M / tokens) + seqs - 1): the grid's x. The splits
come from M and the warps alone (the fewest tiles M can make), so a replay with other sequences of
the same count keeps its grid, and the scratch hook knows the most any M of the band asks."""

import os
from dataclasses import dataclass

from radiance.abi import RAD_MAX_SHARED_BYTES

KEYS = 32            # keys a tile of shared memory (AT_KT) of the default cut
PAD = 8              # bf16 of padding a shared row (AT_BPAD: 16 bytes)
MAX_SPLITS = 16      # AT_MAX_SPLITS
STORE_THREADS = 256
TARGET_BLOCKS = 264  # split the context until about two blocks a multiprocessor of an H200
HEAD_DIMS = (64, 128)
MAX_GROUP = 8
GEMV_MAX_M = 8       # the rows here take M above the decode band of the fused rope_attention row
# R4D_AT_PREFILL_WARPS=4 keeps prefill tiles at 4 warps (64 rows; two blocks a multiprocessor where 8
# warps fit one): for measuring the two against each other on a card
PREFILL_WARPS = 4 if os.environ.get("R4D_AT_PREFILL_WARPS") == "4" else 8
KERNEL = os.environ.get("R4D_TC_KERNEL") or None  # "simt" keeps attention.cu's kernel (as for the GEMM)


@dataclass(frozen=True)
class Cut:
    """Compile-time choices of attention_tiles.cu, to be compared on a card in one process: `keys` a
    shared tile (AT_KT: 32, or 48, which halves again the barriers, the row maxima's shuffles and O's
    rescales a key; 64 would take 68 KiB at head_dim 128, past RAD_MAX_SHARED_BYTES), `lazy` (1: O's
    rescale skipped by a warp whose rows all kept their max: the same bits). Written 'keys,lazy'."""
    keys: int = KEYS
    lazy: int = 0

    @classmethod
    def parse(cls, text: str, name: str = "R4D_AT_CUT") -> "Cut":
        try:
            keys, lazy = (int(part) for part in text.split(","))
        except ValueError:
            raise ValueError(f"{name}={text!r}: 'keys,lazy', e.g. '48,1'") from None
        if keys not in KEY_CHOICES or lazy not in (0, 1):
            raise ValueError(f"{name}={text!r}: keys one of {KEY_CHOICES}, lazy 0 or 1")
        return cls(keys, lazy)

    def __str__(self) -> str:
        return f"{self.keys},{self.lazy}"


KEY_CHOICES = (32, 48)
CUTS = (Cut(32, 0), Cut(32, 1), Cut(48, 0), Cut(48, 1))  # CUTS[0] the kernel as it was
# read per plan (options, shared_bytes): set it between launches to compare cuts in one process
CUT = Cut.parse(os.environ["R4D_AT_CUT"]) if os.environ.get("R4D_AT_CUT") else CUTS[0]

# max|out - ref| / max|ref| against libref's attention: q * scale * log2(e), k, the weights and v
# rounded to bf16 (8 bits of mantissa), f32 sums. Measured with the kernel's numpy form
# (tests/fixtures/r4d_fake_kernels.py) against exact softmax attention: see docs/OPS.md.
TOLERANCE = 3e-2


def serves(vendor: str, target: str, head_dim: int, group: int) -> bool:
    """Whether attention_tiles.cu runs here: NVIDIA from sm_80 (bf16 mma.sync), head_dim 64 or 128,
    at most 8 query heads a kv head; elsewhere the row issues attention.cu's kernel."""
    if KERNEL == "simt" or vendor != "cuda" or not target.startswith("sm_"):
        return False
    digits = target[3:].rstrip("af")
    return digits.isdigit() and int(digits) >= 80 and head_dim in HEAD_DIMS and 1 <= group <= MAX_GROUP


def warps(m: int, seqs: int, group: int) -> int:
    """PREFILL_WARPS (8) where the step's sequences average a whole tile of 8 warps (128 rows), else 4."""
    return PREFILL_WARPS if m >= max(1, seqs) * (8 * 16 // group) else 4


def tokens_per_tile(group: int, warp_count: int = 4) -> int:
    return warp_count * 16 // group


def tiles_bound(m: int, seqs: int, group: int) -> int:
    """The most tiles M tokens of `seqs` sequences make (each sequence's last tile may be short)."""
    return max(1, min(m, -(-m // tokens_per_tile(group, warps(m, seqs, group))) + seqs - 1))


def splits(m: int, kv_heads: int, group: int, warp_count: int = 4) -> int:
    fewest = -(-m // tokens_per_tile(group, warp_count)) * kv_heads
    return max(1, min(MAX_SPLITS, -(-TARGET_BLOCKS // fewest)))


def grid(m: int, seqs: int, kv_heads: int, group: int) -> tuple:
    count = warps(m, seqs, group)
    return (tiles_bound(m, seqs, group), kv_heads, splits(m, kv_heads, group, count)), (32 * count, 1, 1)


def shared_bytes(head_dim: int, cut: Cut = None) -> int:
    """Two buffers of a bf16 key tile and a bf16 value tile, rows padded (the cut's keys a tile; CUT's
    unless given). With the static slots a key tile (8 bytes a key, two tiles) and the merge's flag
    within RAD_MAX_SHARED_BYTES: asserted."""
    keys = (cut or CUT).keys
    dynamic = 2 * 2 * keys * (head_dim + PAD) * 2
    assert dynamic + 2 * 8 * keys + 4 <= RAD_MAX_SHARED_BYTES, (head_dim, keys)
    return dynamic


def store_grid(m: int, width: int) -> tuple:
    """r4d_kv_store_bf16_dev: 4 values a thread, 256 threads a block, a row of blocks a token."""
    return (-(-width // (4 * STORE_THREADS)), m, 1), (STORE_THREADS, 1, 1)


def options(head_dim: int, group: int, warp_count: int = 4, cut: Cut = None) -> tuple:
    """The build's defines; the cut's (CUT's unless given) only where it is not the kernel as it was.
    The cut's keys in 8-warp tiles alone: 4-warp tiles of 48 keys spill (ptxas, sm_90), so they keep
    32 (shared_bytes, not told the warps, may then give more than the launch uses: harmless)."""
    cut = cut or CUT
    keys = cut.keys if warp_count == 8 else KEYS
    extra = () if cut == CUTS[0] else (f"-DR4D_AT_KT={keys}", f"-DR4D_AT_LAZY={cut.lazy}")
    return (f"-DR4D_AT_D={head_dim}", f"-DR4D_AT_G={group}", f"-DR4D_AT_WARPS={warp_count}", *extra)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


def counters(m: int, seqs: int, kv_heads: int, group: int) -> int:
    """The u32 counters a split step takes (one a tile and kv head), 0 unsplit. They live in the
    scratch's tail with attention_decode.cu's (device_attention_decode.COUNTERS, zero between
    launches), not beside the bf16 rows: a later step of other M lays its rows out over a region an
    earlier one kept its counters in, and the counters must be zero when a launch starts."""
    if splits(m, kv_heads, group, warps(m, seqs, group)) == 1:
        return 0
    return tiles_bound(m, seqs, group) * kv_heads


def scratch_layout(m: int, seqs: int, kv_heads: int, group: int, head_dim: int) -> dict:
    """Offsets: the step's k and v rows narrowed to bf16 ([M, kv_heads * head_dim] each: the tiles
    read this step's keys there), then where the context is split per (token, kv head, split, head)
    its max, sum and head_dim weighted values; and the total (the counters: `counters`)."""
    rows = _aligned(2 * m * kv_heads * head_dim)
    layout = {"fresh_k": 0, "fresh_v": rows}
    count = splits(m, kv_heads, group, warps(m, seqs, group))
    if count == 1:
        return {**layout, "total": 2 * rows}
    return {**layout, "partial": 2 * rows,
            "total": 2 * rows + _aligned(4 * m * kv_heads * count * group * (head_dim + 2))}


def scratch_bytes(max_m: int, kv_heads: int, group: int, head_dim: int) -> int:
    """The most any M of the band [GEMV_MAX_M + 1, max_m] needs, with as many sequences as tokens
    (the most tiles), or the most that still take 8 warps (their splits)."""
    return max((scratch_layout(m, seqs, kv_heads, group, head_dim)["total"]
                for m in range(GEMV_MAX_M + 1, max(max_m, GEMV_MAX_M + 1) + 1)
                for seqs in (m, max(1, m // tokens_per_tile(group, 8)))), default=0)
