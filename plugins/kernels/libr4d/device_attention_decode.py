"""The decode attention of batches (device/attention_decode.cu), host-checkable: which steps and
cards it serves, its grid, the chunk of the context a block takes, its scratch (device_batch_rows.py
builds the launch; docs/LIBR4D.md "Attention for batches").

The kernel's scratch is a tail of the row's own, after what the row's other kernels use (the tiles'
bf16 rows and partials, attention.cu's counters and partials), which never reach it: its counters stay
zero between launches whatever ran in between, and its partials overwrite no other kernel's counters.
The tail has a fixed size (PARTIALS partials, then COUNTERS counters), so a launch finds it from the
scratch's end alone, at the same place for every step.

A block is one sequence's query heads of one kv head over one chunk of its context; the grid is
(seqs, kv heads, splits). Sequence s, seeing n keys, takes min(splits, ceil(n / chunk)) splits of
equal length, so the grid's z bounds what the longest context takes and short contexts leave their
blocks past it idle (they return at once). The splits and the chunk come from the step's shapes
alone (sequences, kv heads, the block table's width), so a captured step replays with other
contexts."""

import os

THREADS = 128       # AD_THREADS: 8 streams of 16 lanes
MAX_SPLITS = 32     # AD_MAX_SPLITS: the merge weighs one split a lane of a warp
KEYS = int(os.environ.get("R4D_AD_KEYS") or 4)  # R4D_AD_KEYS: keys a stream loads at once (2 or 4: registers)
# R4D_AD_AHEAD=1: a stream asks its next keys' rows into the L2 while it loads these (off until a card
# shows it pays; bench/card_decode_attention.py --sweep measures it)
AHEAD = int(os.environ.get("R4D_AD_AHEAD") or 0)
# the chunk a block takes, in keys: the largest power of two up to twice the step's (sequence, kv
# head) pairs, from MIN_CHUNK to MAX_CHUNK, so that a context of 1k makes about 4 blocks a
# multiprocessor of an H200 at any batch (batch 8: 64 pairs, chunks of 128 keys, 512 blocks).
# R4D_AD_CHUNK=n sets it for a process (bench/card_decode_attention.py sweeps it).
CHUNK = int(os.environ["R4D_AD_CHUNK"]) if os.environ.get("R4D_AD_CHUNK") else None
MIN_CHUNK, MAX_CHUNK = 32, 256
# the scratch's tail holds this many partials (each G * (D + 2) floats, 2 KB at G 4, D 128: 8.5 MB a
# layer) above the decode band (the decode band's rows: as many as 8 sequences take, band_partials)
# and a u32 counter for each of up to COUNTERS (sequence, kv head) pairs; a step of more pairs is not
# split
PARTIALS = 4096
COUNTERS = 65536  # also attention.cu's (M * kv_heads + 1 at most) and the tiles' split counters
BAND = 8  # the decode band's most sequences (device_kernels.GEMV_MAX_M)
# the decode band's rows (M <= 8: device_rows.py's attention and fused rope_attention) take this
# kernel for decode steps of at least this many sequences, attention.cu's kernel below
# (R4D_AD_BAND_FROM=n; bench/card_decode_attention.py measures both at batch 1 and 8)
BAND_FROM = int(os.environ.get("R4D_AD_BAND_FROM") or 2)


# R4D_AD=off leaves a decode step to the tiles (or attention.cu), as before this kernel: for measuring
# them against each other on a card (bench/card_decode_attention.py sets ENABLED itself)
ENABLED = os.environ.get("R4D_AD") != "off"


def serves(vendor: str, target: str, m: int, seqs: int, head_dim: int, group: int) -> bool:
    """Whether attention_decode.cu runs this step: a decode step (one token a sequence: M == seqs) on
    NVIDIA, head_dim a multiple of 64 with group * head_dim <= 1024 (the streams' merge fits 32 KB of
    shared memory)."""
    return (ENABLED and vendor == "cuda" and target.startswith("sm_") and m == seqs and m > 0
            and head_dim % 64 == 0 and 1 <= group and group * head_dim <= 1024)


def chunk(seqs: int, kv_heads: int) -> int:
    if CHUNK is not None:
        return CHUNK
    twice = 2 * max(1, seqs * kv_heads)
    return max(MIN_CHUNK, min(MAX_CHUNK, 1 << (twice.bit_length() - 1)))


def band_partials(kv_heads: int) -> int:
    """The partials the decode band's rows' tails hold: all that BAND sequences take."""
    return BAND * kv_heads * MAX_SPLITS


def splits(seqs: int, kv_heads: int, capacity: int, partials: int = PARTIALS) -> int:
    """The grid's z: enough that the longest context the block table holds (`capacity` keys) is in
    chunks, at most MAX_SPLITS and at most partials // (seqs * kv_heads); 1 past COUNTERS pairs."""
    pairs = max(1, seqs * kv_heads)
    want = -(-max(1, capacity) // chunk(seqs, kv_heads))
    return 1 if pairs > COUNTERS else max(1, min(MAX_SPLITS, partials // pairs, want))


def token_splits(keys: int, grid_splits: int, chunk_keys: int) -> tuple[int, int]:
    """(splits, keys a split) of a sequence that sees `keys` keys, as the kernel works them out."""
    count = min(grid_splits, max(1, -(-keys // chunk_keys)))
    per = -(-keys // count)
    return -(-keys // per), per


def grid(seqs: int, kv_heads: int, capacity: int, partials: int = PARTIALS) -> tuple:
    return (seqs, kv_heads, splits(seqs, kv_heads, capacity, partials)), (THREADS, 1, 1)


def options(head_dim: int, group: int) -> tuple:
    return (f"-DR4D_AD_D={head_dim}", f"-DR4D_AD_G={group}", f"-DR4D_AD_KEYS={KEYS}", f"-DR4D_AD_AHEAD={AHEAD}")


def partial_floats(group: int, head_dim: int) -> int:
    """Floats of one (sequence, kv head, split)'s partial: G rows of head_dim values, then G (max,
    sum), rounded up to whole 16-byte chunks (attention_decode.cu's STRIDE)."""
    return -(-group * (head_dim + 2) // 4) * 4


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


def tail_bytes(group: int, head_dim: int, partials: int = PARTIALS) -> int:
    """The scratch's tail this kernel keeps to itself: `partials` partials, then COUNTERS counters."""
    return _aligned(4 * partials * partial_floats(group, head_dim)) + 4 * COUNTERS


def counters_offset(scratch_bytes: int) -> int:
    """Where the tail's counters start in a row's scratch of `scratch_bytes`: COUNTERS u32 words at its
    end, zero between launches, for every kernel of the attention rows that counts its splits
    (attention_decode.cu, attention_tiles.cu, attention.cu and attention_window.cu)."""
    if scratch_bytes < 4 * COUNTERS:
        raise ValueError(f"{scratch_bytes} bytes of scratch, the attention rows' counters need {4 * COUNTERS}")
    return scratch_bytes - 4 * COUNTERS


def scratch_layout(scratch_bytes: int, group: int, head_dim: int, partials: int = PARTIALS) -> dict:
    """Offsets in a row's scratch of `scratch_bytes`: the partials ([seqs, kv_heads, splits] entries)
    and the counters ([seqs * kv_heads], zero between launches), the tail's two parts."""
    tail = tail_bytes(group, head_dim, partials)
    if scratch_bytes < tail:
        raise ValueError(f"{scratch_bytes} bytes of scratch, the decode attention's tail needs {tail}")
    return {"partial": scratch_bytes - tail, "counters": counters_offset(scratch_bytes)}
