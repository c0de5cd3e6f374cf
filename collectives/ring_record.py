"""What a broadcast-ring record holds (rank 0's results; the plans are fixed binary records of their
own, generation/plan_record.py): a kind ("result"), a small JSON meta and named numpy arrays, laid
out so the reader takes the arrays as views of the record, no copy:

    [ header length: u32 ][ header: JSON {"kind", "meta", "arrays": [[name, dtype, shape], ...]} ]
    [ pad to 8 ][ array 0's bytes ][ pad to 8 ][ array 1's bytes ] ...

A result has the same names, dtypes and often the same shapes step after step, so both ends keep
the last few headers they made or read (a step then costs no JSON at all).
"""

from __future__ import annotations

import json
import struct

import numpy as np

ALIGN = 8
_LENGTH = struct.Struct("<I")
_PAD = bytes(ALIGN)
_CACHE = 64  # headers kept at each end


def _pad(size: int) -> int:
    return -size % ALIGN


class RecordCodec:
    """encode() -> the payload a RingWriter.publish takes; decode(payload) -> (kind, meta, arrays)."""

    def __init__(self):
        self._headers: dict[tuple, bytes] = {}
        self._layouts: dict[bytes, tuple] = {}

    def encode(self, kind: str, meta: dict | None = None, arrays: dict | None = None) -> bytes:
        """The record's bytes (arrays in C order whatever their strides)."""
        arrays = arrays or {}
        key = (kind, *((name, array.dtype, array.shape) for name, array in arrays.items())) if not meta else None
        header = self._headers.get(key) if key else None
        if header is None:
            text = json.dumps({"kind": kind, "meta": meta or {},
                               "arrays": [[name, a.dtype.str, list(a.shape)] for name, a in arrays.items()]})
            header = _LENGTH.pack(len(text)) + text.encode()
            header += _PAD[:_pad(len(header))]
            if key is not None and len(self._headers) < _CACHE:
                self._headers[key] = header
        parts = [header]
        for array in arrays.values():
            parts.append(array.tobytes())
            if array.nbytes % ALIGN:
                parts.append(_PAD[:_pad(array.nbytes)])
        return b"".join(parts)

    def decode(self, payload) -> tuple[str, dict, dict]:
        payload = memoryview(payload)
        (size,) = _LENGTH.unpack_from(payload, 0)
        text = bytes(payload[_LENGTH.size:_LENGTH.size + size])
        layout = self._layouts.get(text)
        if layout is None:
            header = json.loads(text)
            offset = _LENGTH.size + size
            offset += _pad(offset)
            entries = []
            for name, dtype, shape in header["arrays"]:
                dtype = np.dtype(dtype)
                count = int(np.prod(shape, dtype=np.int64))
                entries.append((name, dtype, count, offset, tuple(shape) if len(shape) != 1 else None))
                offset += count * dtype.itemsize + _pad(count * dtype.itemsize)
            if offset > len(payload):
                raise ValueError(f"a ring record of {len(payload)} bytes describes {offset}")
            layout = (header["kind"], header["meta"], tuple(entries))
            if not header["meta"] and len(self._layouts) < _CACHE:
                self._layouts[text] = layout
        kind, meta, entries = layout
        arrays = {}
        for name, dtype, count, offset, shape in entries:
            array = np.frombuffer(payload, dtype, count, offset)
            arrays[name] = array if shape is None else array.reshape(shape)
        return kind, dict(meta), arrays


# A result's figures travel as one f64 array (no JSON a step): rank 0's seconds in the step and in
# collectives, its link-gate holds so far (count, seconds), when it had the plan and when it
# answered, how long it waited for the plan after its last answer, the micro-batches the step
# was cut into (generation/micro_batches.py), and the plan's delivery (ranks/session.py).
FIGURES = ("compute", "collectives", "gate_holds", "gate_hold_s", "received_at", "answered_at", "waited", "parts",
           "delivery")


_FIGURES = struct.Struct(f"<{len(FIGURES)}d")


def figures_array(figures: dict, into: np.ndarray | None = None) -> np.ndarray:
    """The figures as FIGURES' f64 array; `into`: one made before (a rank's, reused every step:
    packed with struct, no numpy call)."""
    if into is None:
        into = np.zeros(len(FIGURES), np.float64)
    _FIGURES.pack_into(into, 0, *[figures[name] for name in FIGURES])
    return into


def figures_dict(array: np.ndarray) -> dict:
    figures = dict(zip(FIGURES, array.tolist()))
    figures["gate_holds"], figures["parts"] = int(figures["gate_holds"]), int(figures["parts"])
    return figures


# A profiled rank's seconds by op travel as one f64 array whose name carries the ops' names (they
# are the same step after step, so the header stays cached and a step still costs no JSON).
OPS_PREFIX = "ops:"


def ops_arrays(ops: dict) -> dict:
    """{"ops:<op>|<op>|...": the seconds in that order} (nothing for no ops)."""
    if not ops:
        return {}
    return {OPS_PREFIX + "|".join(ops): np.fromiter(ops.values(), np.float64, len(ops))}


def pop_ops(arrays: dict) -> dict | None:
    """The seconds by op that ops_arrays put into `arrays` (taken out of them), or None."""
    for name in arrays:
        if name.startswith(OPS_PREFIX):
            return dict(zip(name[len(OPS_PREFIX):].split("|"), arrays.pop(name).tolist()))
    return None
