"""The row family of the device collectives (plugins/kernels/libr4d/device/allreduce_fused.cu): host
mirrors of its arithmetic, no card needed. DeviceP2P launches it; tests/fixtures/fakecard.py's Python
form and the tests read the same numbers from here.

A launch moves f32 activations as `wire` says: f32 (one value an LL word) or bf16 (two, each rounded
to nearest even, the lower element in the low half). Its work is cut in units: rows of n with a
residual (the fused op), else one piece a block. Its words (32-bit payloads) are laid out unit after
unit; a unit's words start at `first_word` (a row at a whole word, so rows never share one).

Two exchanges (`FORMS`): "ll", each word stored with its 32-bit flag into every peer's inbox (sender s
at s * words * 8 of the receiver's slot), and "rows", the payloads in the sender's own slot (word i at
4 * i) behind allreduce.cu's READY flags.
"""

from __future__ import annotations

import re
from pathlib import Path

WIRES = ("f32", "bf16")
PER_WORD = {"f32": 1, "bf16": 2}
KERNEL = {"f32": "rad_all_reduce_rows_f32", "bf16": "rad_all_reduce_rows_bf16"}
KERNELS = tuple(KERNEL.values())
FORMS = ("ll", "rows")

SOURCE_PATH = Path(__file__).resolve().parent.parent / "plugins" / "kernels" / "libr4d" / "device" / "allreduce_fused.cu"
# Mirrors of the source's RAD_ROWS_* defines (tests/test_device_fused_host.py checks they agree).
PIECE = 4096            # a plain all_reduce: elements of a block's piece
STAGE_FLOATS = 8192     # a row up to this long is staged in shared memory for its norm
BATCH = 4               # words a thread has in flight from one peer

# f32 messages up to this many bytes take the LL exchange. Not measured yet: 128 KiB covers a decode
# step of 8 tokens at hidden 4096; bench/allreduce_fused.py times both exchanges at every size.
LL_MAX_BYTES = 128 << 10
PAGE = 4096


def source_constants(text: str | None = None) -> dict[str, int]:
    """The source's `#define RAD_ROWS_<NAME> <int>` values, by NAME."""
    text = text if text is not None else SOURCE_PATH.read_text()
    return {m[1]: int(m[2]) for m in re.finditer(r"^#define RAD_ROWS_(\w+)\s+(\d+)\b", text, re.M)}


def words(wire: str, m: int, n: int, rows: bool) -> int:
    """One sender's words: m rows of ceil(n / per word) with a residual, else ceil(m * n / per word)."""
    per = PER_WORD[wire]
    return m * -(-n // per) if rows else -(-(m * n) // per)


def piece(total: int, parts: int, index: int, elems: int = 8) -> tuple[int, int]:
    """allreduce.cu's rad_piece: part `index` of `parts` of [0, total) in whole packs of `elems`."""
    packs = -(-total // elems)
    per = -(-packs // parts) * elems
    lo = min(index * per, total)
    return lo, min(lo + per, total)


def units(wire: str, m: int, n: int, rows: bool, blocks: int) -> list[tuple[int, int, int]]:
    """(lo, hi, first word) of every unit, in order (rad_unit): rows of n, or `blocks` pieces."""
    per = PER_WORD[wire]
    if rows:
        return [(u * n, u * n + n, u * -(-n // per)) for u in range(m)]
    return [(lo, hi, lo // per) for lo, hi in (piece(m * n, blocks, b) for b in range(blocks))]


def slot_need(form: str, world: int, count_words: int) -> int:
    """Slot bytes a launch needs: every sender's inbox of 8-byte words (ll), or its own 4-byte ones."""
    return world * count_words * 8 if form == "ll" else count_words * 4


def ll_slot_bytes(buffer_bytes: int, world: int, ll_max_bytes: int) -> int:
    """A slot large enough for the LL exchange of any f32 message up to min(buffer, LL limit): at most
    one word an element (bf16 rows of one element), 8 bytes a word, an inbox for every rank."""
    largest = min(int(buffer_bytes), int(ll_max_bytes))
    return -(-(world * 2 * largest) // PAGE) * PAGE


def grid(m: int, n: int, rows: bool, max_blocks: int) -> int:
    """A block a row (at most max_blocks, each then taking several), or a block a PIECE elements."""
    wanted = m if rows else -(-(m * n) // PIECE)
    return max(1, min(int(max_blocks), wanted))


def stage_floats(m: int, n: int, residual: int) -> int:
    """Floats of shared memory for the norm: the row, when it is short enough and the staged copy sums
    its squares by r4d_row_squares' same path as the row in memory would (n % 4, or a 16-byte row)."""
    if n > STAGE_FLOATS or (n % 4 == 0 and residual % 16):
        return 0
    return n


def flag(epoch: int) -> int:
    """rad_ll_flag: never 0, and different for e and e - 2."""
    return epoch % 0xFFFFFFFF + 1
