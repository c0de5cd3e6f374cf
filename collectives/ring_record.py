"""A broadcast-ring record of named arrays: a kind, a small JSON meta and named numpy arrays, laid
out so the reader takes the arrays as views of the record, no copy (the tail of rank 0's result:
its seconds by op, returned buffers; the plans and the results themselves are fixed binary records,
generation/plan_record.py and result_record.py):

    [ header length: u32 ][ header: JSON {"kind", "meta", "arrays": [[name, dtype, shape], ...]} ]
    [ pad to 8 ][ array 0's bytes ][ pad to 8 ][ array 1's bytes ] ...

A result's tail has the same names, dtypes and often the same shapes step after step, so both ends
keep the last few headers they made or read (a step then costs no JSON at all).
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
