"""The decode attention of batches (device/attention_decode.cu), host-checkable: which steps and
cards it serves, its grid, the chunk of the context a block takes, its scratch (device_batch_rows.py
builds the launch; docs/LIBR4D.md "Attention for batches").

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
# the scratch holds at most this many partials (each G * (D + 2) floats, 2 KB at G 4, D 128): 34 MB,
# about what attention.cu's scratch takes at 2048 tokens a step
PARTIALS = 16384
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


def splits(seqs: int, kv_heads: int, capacity: int) -> int:
    """The grid's z: enough that the longest context the block table holds (`capacity` keys) is in
    chunks, at most MAX_SPLITS and at most PARTIALS // (seqs * kv_heads)."""
    pairs = max(1, seqs * kv_heads)
    want = -(-max(1, capacity) // chunk(seqs, kv_heads))
    return max(1, min(MAX_SPLITS, PARTIALS // pairs, want))


def token_splits(keys: int, grid_splits: int, chunk_keys: int) -> tuple[int, int]:
    """(splits, keys a split) of a sequence that sees `keys` keys, as the kernel works them out."""
    count = min(grid_splits, max(1, -(-keys // chunk_keys)))
    per = -(-keys // count)
    return -(-keys // per), per


def grid(seqs: int, kv_heads: int, capacity: int) -> tuple:
    return (seqs, kv_heads, splits(seqs, kv_heads, capacity)), (THREADS, 1, 1)


def options(head_dim: int, group: int) -> tuple:
    return (f"-DR4D_AD_D={head_dim}", f"-DR4D_AD_G={group}", f"-DR4D_AD_KEYS={KEYS}", f"-DR4D_AD_AHEAD={AHEAD}")


def partial_floats(group: int, head_dim: int) -> int:
    """Floats of one (sequence, kv head, split)'s partial: G rows of head_dim values, then G (max,
    sum), rounded up to whole 16-byte chunks (attention_decode.cu's STRIDE)."""
    return -(-group * (head_dim + 2) // 4) * 4


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


def scratch_layout(seqs: int, kv_heads: int, group: int, head_dim: int, capacity: int) -> dict:
    """Offsets: a u32 counter a (sequence, kv head), then the partials ([seqs, kv_heads, splits]);
    and the total. One split needs neither."""
    count = splits(seqs, kv_heads, capacity)
    if count == 1:
        return {"total": 0}
    counters = _aligned(4 * seqs * kv_heads)
    return {"counters": 0, "partial": counters,
            "total": counters + 4 * seqs * kv_heads * count * partial_floats(group, head_dim)}


def scratch_bytes(max_m: int, kv_heads: int, group: int, head_dim: int) -> int:
    """The most any decode step of up to max_m sequences needs, whatever its block table's width."""
    counters = _aligned(4 * max(1, max_m) * kv_heads)
    return counters + 4 * min(PARTIALS, max(1, max_m) * kv_heads * MAX_SPLITS) * partial_floats(group, head_dim)
