"""Rank 0's result as the results ring carries it (ranks/session.py writes it, launch/step_rings.py
reads it; over the wire from another node the same bytes): a fixed binary record, so a step's
answer costs one struct pack at rank 0 and one unpack at the coordinator, no JSON and no numpy
call but the tokens' bytes:

    [ kind: 4 B, b"rslt" ][ seqs: u32 ][ extra: u32, the bytes of the tail ][ 4 B pad ]
    [ figures: FIGURES, f64 each ]
    [ tokens: int32 x seqs, padded to 8 ]
    [ tail: `extra` bytes, a ring_record.py record of the rest (its header cached: no JSON a step):
      the seconds by op when profiling, the buffers config.return_buffer names; none without ]

FIGURES: rank 0's seconds in the step and in collectives, its link-gate holds so far (count,
seconds), when it had the plan and when it answered (perf_counter: CLOCK_MONOTONIC, the
coordinator's clock too), how long it waited for the plan after its last answer, the micro-batches
the step was cut into (generation/micro_batches.py), and the plan's delivery (ranks/session.py)."""

from __future__ import annotations

import struct

import numpy as np

from .ring_record import RecordCodec

FIGURES = ("compute", "collectives", "gate_holds", "gate_hold_s", "received_at", "answered_at", "waited", "parts",
           "delivery")
COUNTS = ("gate_holds", "parts")  # figures that are whole numbers
RESULT = b"rslt"
_HEAD = struct.Struct(f"<4sII4x{len(FIGURES)}d")
_PAD = bytes(8)


class ResultRecordError(ValueError):
    """A results ring record that is not a result, or shorter than it says; one line."""


def size(seqs: int, extra: int = 0) -> int:
    """A record's bytes: `seqs` tokens and an `extra`-byte tail."""
    return _HEAD.size + -(-4 * seqs // 8) * 8 + extra


class ResultWriter:
    """Rank 0's end: encode(tokens, figures, extra) -> the payload a RingWriter.publish takes."""

    def __init__(self):
        self._tail = RecordCodec()

    def encode(self, tokens: np.ndarray, figures: dict, extra: dict | None = None) -> bytes:
        """`tokens`: int32 [seqs]; `figures`: FIGURES by name; `extra`: named arrays (ring_record's)."""
        if tokens.dtype != np.int32:
            raise ResultRecordError(f"result record: tokens are {tokens.dtype}, not int32")
        tail = self._tail.encode("extra", None, extra) if extra else b""
        data = tokens.tobytes()
        return b"".join((_HEAD.pack(RESULT, len(tokens), len(tail), *[figures[name] for name in FIGURES]), data,
                         _PAD[:-len(data) % 8], tail))


class ResultReader:
    """The coordinator's end: decode(payload) -> (figures, tokens, extra), `tokens` an int32 view of
    the payload, `extra` the tail's arrays by name ({} without one)."""

    def __init__(self):
        self._tail = RecordCodec()

    def decode(self, payload) -> tuple[dict, np.ndarray, dict]:
        if len(payload) < _HEAD.size:
            raise ResultRecordError(f"result record: {len(payload)} bytes, short of its {_HEAD.size}-byte head")
        kind, seqs, extra, *values = _HEAD.unpack_from(payload)
        if kind != RESULT:
            raise ResultRecordError(f"result record: kind {kind!r}, not {RESULT!r}")
        if len(payload) < size(seqs, extra):
            raise ResultRecordError(f"result record: {len(payload)} bytes where its head ({seqs} tokens, a "
                                    f"{extra}-byte tail) describes {size(seqs, extra)}")
        figures = dict(zip(FIGURES, values))
        for name in COUNTS:
            figures[name] = int(figures[name])
        tokens = np.frombuffer(payload, np.int32, seqs, _HEAD.size)
        tail = self._tail.decode(memoryview(payload)[size(seqs):size(seqs, extra)])[2] if extra else {}
        return figures, tokens, tail
