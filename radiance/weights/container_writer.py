"""The streaming `.rad` writer: declare every weight, then stream each plane's bytes in chunks.

The declarations fix every offset, so the header (with placeholder checksums) is written before the
first byte of data and rewritten in place, at the same length, once the checksums are known. Planes
may be written interleaved (a quantiser emits codes, scale and min per row block); within a plane the
chunks arrive in order. write() may be called from several threads at once for different planes
(each plane's chunks from one thread, in order): a plane's state is its own, the first write fixes
the layout under a lock, and pwrite at distinct offsets needs none; close() comes after the last
write has returned. Memory is bounded by the caller's chunk. The file is `path + ".partial"`
until close() renames it, so a crash never leaves a half file under the final name; the writer holds
a lock on it until then, so a later conversion can tell a dead writer's partial file (partials.py).
Metadata known only at the end (a converter's error report) is added by update_metadata() into
`header_reserve` bytes of header set aside at the first write.
"""

import json
import operator
import os
import threading
import zlib

import numpy as np

from radiance.abi import RadEncoding

from .container_format import (
    ALIGN, FORMAT_VERSION, LENGTH_BYTES, ContainerError, encode_header, encoding_from_json, encoding_to_json,
    plan_layout, tensor_name, weight_json,
)
from .partials import open_partial


class ContainerWriter:
    def __init__(self, path, architecture, hyper, tokenizer=None, chat_template=None, metadata=None,
                 header_reserve=0):
        self.path = os.fspath(path)
        self._header_reserve = header_reserve
        self.partial = self.path + ".partial"
        self._radiance = {"format_version": FORMAT_VERSION, "architecture": architecture,
                          "hyper": dict(hyper), "tokenizer": tokenizer,
                          "chat_template": chat_template, "metadata": dict(metadata or {})}
        for field, kind in (("architecture", str), ("tokenizer", (str, type(None))),
                            ("chat_template", (str, type(None)))):
            if not isinstance(self._radiance[field], kind):
                raise ContainerError(f"{self.path}: {field} is a {type(self._radiance[field]).__name__}, not a string")
        for field in ("hyper", "metadata"):
            try:
                json.dumps(self._radiance[field])
            except (TypeError, ValueError) as error:
                raise ContainerError(f"{self.path}: {field} is not JSON-serialisable: {error}") from None
        self._weights = {}  # weight -> (shape, encoding, {plane: nbytes})
        self._tensors = set()
        self._planes = {}  # (weight, plane) -> [file offset, bytes still due, running crc32]; after start
        self._layout = None  # tensor -> [start, stop) in the data area; fixed by the first write
        self._header_length = None
        self._starting = threading.Lock()  # the first write fixes the layout once, whichever thread makes it
        self._fd = open_partial(self.partial)  # locked while this writer lives (partials.py)

    def declare(self, weight, shape, encoding, plane_nbytes):
        """Declare a weight: its shape ([rows, cols] or [n]), encoding and every plane's byte size."""
        where = f"{self.path}: weight {weight!r}"
        if self._header_length is not None:
            raise ContainerError(f"{where}: declared after the first write; declare every weight first")
        if not isinstance(weight, str) or not weight or weight.startswith("__"):
            raise ContainerError(f"{where}: a weight name is a non-empty string not starting with '__'")
        if weight in self._weights:
            raise ContainerError(f"{where}: declared twice")
        counts = _counts(shape)
        if counts is None or len(counts) not in (1, 2):
            raise ContainerError(f"{where}: shape {shape!r} is not [rows, cols] or [n] of non-negative integers")
        if not isinstance(encoding, RadEncoding):
            raise ContainerError(f"{where}: encoding is a {type(encoding).__name__}, not a RadEncoding")
        try:
            encoding_from_json(encoding_to_json(encoding))  # every field checked as a reader will
        except ContainerError as error:
            raise ContainerError(f"{where}: {error}") from None
        names = [plane.name for plane in encoding.planes]
        if sorted(names) != sorted(plane_nbytes):
            raise ContainerError(f"{where}: plane sizes given for {sorted(plane_nbytes)}, "
                                 f"the encoding has planes {sorted(names)}")
        # The encoding's plane order is the order of the data.
        sizes = {plane: _counts([plane_nbytes[plane]]) for plane in names}
        for plane in names:
            if sizes[plane] is None:
                raise ContainerError(f"{where}: plane {plane!r} size {plane_nbytes[plane]!r} is not a byte count")
            if tensor_name(weight, plane) in self._tensors:
                raise ContainerError(f"{where}: tensor name {tensor_name(weight, plane)!r} is already taken")
        self._tensors.update(tensor_name(weight, plane) for plane in names)
        self._weights[weight] = (counts, encoding, {plane: size[0] for plane, size in sizes.items()})

    def write(self, weight, plane, data):
        """Append `data` (bytes-like or a numpy array, written as its raw bytes) to that plane."""
        self._start()
        state = self._planes.get((weight, plane))
        if state is None:
            raise ContainerError(f"{self.path}: no declared plane {plane!r} of weight {weight!r}")
        view = _as_bytes(data)
        if len(view) > state[1]:
            raise ContainerError(f"{self.path}: weight {weight!r} plane {plane!r}: {len(view)} more bytes "
                                 f"overrun its declared size by {len(view) - state[1]}")
        _write_at(self._fd, view, state[0])
        state[0] += len(view)
        state[1] -= len(view)
        state[2] = zlib.crc32(view, state[2])

    def update_metadata(self, values):
        """Merge `values` into the metadata before close(); the header must still fit the length
        fixed at the first write (header_reserve bytes more than it needed then)."""
        try:
            json.dumps(values)
        except (TypeError, ValueError) as error:
            raise ContainerError(f"{self.path}: metadata is not JSON-serialisable: {error}") from None
        self._radiance["metadata"].update(values)

    def close(self):
        """Check every plane is complete, patch the checksums into the header, rename into place."""
        if self._fd is None:
            return
        try:
            self._finish()
            os.replace(self.partial, self.path)  # still locked: no sweep takes it on the way (partials.py)
        except BaseException:
            self.abort()
            raise
        os.close(self._fd)
        self._fd = None

    def _finish(self):
        self._start()
        short = [f"{tensor_name(weight, plane)} lacks {state[1]} bytes"
                 for (weight, plane), state in self._planes.items() if state[1]]
        if short:
            more = f" (and {len(short) - 1} more planes)" if len(short) > 1 else ""
            raise ContainerError(f"{self.path}: incomplete, not written: {short[0]}{more}")
        checksums = {key: state[2] for key, state in self._planes.items()}
        _write_at(self._fd, self._header(checksums, self._header_length), 0)
        os.fsync(self._fd)

    def abort(self):
        """Drop the partial file; the final path is left untouched."""
        if self._fd is not None:
            try:
                os.unlink(self.partial)  # before the lock goes with the descriptor
            except FileNotFoundError:
                pass
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if kind is None:
            self.close()
        else:
            self.abort()

    def _start(self):
        """On the first write (or close): fix the layout, write the header, size the file."""
        with self._starting:
            if self._fd is None:
                raise ContainerError(f"{self.path}: the writer is closed")
            if self._header_length is None:
                self._lay_out()

    def _lay_out(self):
        """Fix every plane's offset, write the placeholder header, size the file; once."""
        self._layout, data_size = plan_layout(
            (weight, planes) for weight, (_, _, planes) in self._weights.items())
        header = self._header({}, None)
        if self._header_reserve:
            reserved = -(-(len(header) + self._header_reserve) // ALIGN) * ALIGN
            header = self._header({}, reserved - LENGTH_BYTES)
        self._header_length = len(header) - LENGTH_BYTES
        _write_at(self._fd, header, 0)
        # Sizing the file up front makes the pads (and any byte not yet written) read as zeros.
        os.ftruncate(self._fd, len(header) + data_size)
        for weight, (_, _, planes) in self._weights.items():
            for plane, nbytes in planes.items():
                start = len(header) + self._layout[tensor_name(weight, plane)][0]
                self._planes[(weight, plane)] = [start, nbytes, 0]

    def _header(self, checksums, length):
        """The header for the current layout; crc32 0 stands in for a checksum not yet known."""
        weights = {weight: weight_json(shape, encoding, planes,
                                       {plane: checksums.get((weight, plane), 0) for plane in planes})
                   for weight, (shape, encoding, planes) in self._weights.items()}
        return encode_header(self._layout, {**self._radiance, "weights": weights}, length)


def _counts(values):
    """The values as a tuple of non-negative Python ints (numpy integers accepted), else None."""
    try:
        values = list(values)
        counts = tuple(operator.index(value) for value in values if not isinstance(value, bool))
    except TypeError:
        return None
    return counts if len(counts) == len(values) and all(count >= 0 for count in counts) else None


def _write_at(fd, view, offset):
    view = memoryview(view)
    while view:  # pwrite may write less than asked
        written = os.pwrite(fd, view, offset)
        offset += written
        view = view[written:]


def _as_bytes(data):
    """A flat byte view of `data` without copying when it is contiguous already."""
    if isinstance(data, np.ndarray):
        return memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    return memoryview(data).cast("B")
