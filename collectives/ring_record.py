"""What a broadcast-ring record holds: a kind ("step", "stop", "result"), a small JSON meta and
named numpy arrays, laid out so the reader takes the arrays as views of the record, no copy:

    [ header length: u32 ][ header: JSON {"kind", "meta", "arrays": [[name, dtype, shape], ...]} ]
    [ pad to 8 ][ array 0's bytes ][ pad to 8 ][ array 1's bytes ] ...

A step plan has the same names, dtypes and often the same shapes step after step, so both ends keep
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
        described = tuple((name, array.dtype.str, array.shape) for name, array in arrays.items())
        key = (kind, described) if not meta else None
        header = self._headers.get(key) if key else None
        if header is None:
            text = json.dumps({"kind": kind, "meta": meta or {},
                               "arrays": [[name, dtype, list(shape)] for name, dtype, shape in described]})
            header = _LENGTH.pack(len(text)) + text.encode()
            header += _PAD[:_pad(len(header))]
            if key is not None and len(self._headers) < _CACHE:
                self._headers[key] = header
        parts = [header]
        for array in arrays.values():
            parts.append(array.tobytes())
            if _pad(array.nbytes):
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
                nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                entries.append((name, dtype, tuple(shape), offset, nbytes))
                offset += nbytes + _pad(nbytes)
            if offset > len(payload):
                raise ValueError(f"a ring record of {len(payload)} bytes describes {offset}")
            layout = (header["kind"], header["meta"], tuple(entries))
            if not header["meta"] and len(self._layouts) < _CACHE:
                self._layouts[text] = layout
        kind, meta, entries = layout
        arrays = {name: np.frombuffer(payload, dtype, nbytes // dtype.itemsize, offset).reshape(shape)
                  for name, dtype, shape, offset, nbytes in entries}
        return kind, dict(meta), arrays
