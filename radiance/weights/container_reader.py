"""The `.rad` reader: validates the header, then maps the file; a plane is a zero-copy numpy view.

Opening reads only the 8-byte length and the header; the data is reached through a read-only mmap,
so a tensor-parallel rank that touches only its byte ranges of each plane pages in only those.
"""

import json
import mmap
import os
import struct
import zlib

import numpy as np

from .container_format import (
    FORMAT_VERSION, LENGTH_BYTES, MAX_HEADER_BYTES, METADATA_KEY, PAD_PREFIX, ContainerError,
    encoding_from_json, parse_checksum, tensor_name,
)

VERIFY_CHUNK = 8 << 20  # verify() reads this many bytes at a time


class Container:
    def __init__(self, path):
        self.path = os.fspath(path)
        self._fd = os.open(self.path, os.O_RDONLY)
        self._map = None
        try:
            self._open()
        except BaseException:
            os.close(self._fd)
            raise

    def _open(self):
        size = os.fstat(self._fd).st_size
        if size < LENGTH_BYTES:
            self._fail(f"truncated: {size} bytes, less than the 8-byte header length")
        (length,) = struct.unpack("<Q", os.pread(self._fd, LENGTH_BYTES, 0))
        if length > MAX_HEADER_BYTES:
            self._fail(f"header length {length} exceeds the limit of {MAX_HEADER_BYTES} bytes")
        if LENGTH_BYTES + length > size:
            self._fail(f"truncated: the header claims {length} bytes, the file holds {size - LENGTH_BYTES}")
        header = self._json(os.pread(self._fd, length, LENGTH_BYTES), "header")
        metadata = header.pop("__metadata__", None)
        if not isinstance(metadata, dict) or not isinstance(metadata.get(METADATA_KEY), str):
            self._fail(f"not a radiance container: no __metadata__.{METADATA_KEY} string")
        radiance = self._json(metadata[METADATA_KEY], f"__metadata__.{METADATA_KEY}")
        version = radiance.get("format_version")
        if type(version) is not int or version != FORMAT_VERSION:
            found = "missing" if version is None else f"{version!r} is not supported"
            self._fail(f"format_version {found} (this reader reads version {FORMAT_VERSION})")
        for field, kind in (("architecture", str), ("hyper", dict), ("weights", dict),
                            ("tokenizer", (str, type(None))), ("chat_template", (str, type(None))),
                            ("metadata", dict)):
            if not isinstance(radiance.get(field), kind):
                self._fail(f"__metadata__.{METADATA_KEY}.{field} is missing or of the wrong type")
        self.architecture, self.hyper = radiance["architecture"], radiance["hyper"]
        self.tokenizer, self.chat_template = radiance["tokenizer"], radiance["chat_template"]
        self.metadata = radiance["metadata"]
        data_start = LENGTH_BYTES + length
        tensors = self._tensors(header, size - data_start)
        claimed = set()  # tensors that are some weight's plane
        self._weights = {name: self._weight(name, entry, tensors, data_start, claimed)
                         for name, entry in radiance["weights"].items()}
        stray = [name for name in tensors if name not in claimed and not name.startswith(PAD_PREFIX)]
        if stray:
            self._fail(f"tensor {stray[0]!r} belongs to no declared weight plane")
        self.weights = tuple(self._weights)
        # Read-only mapping: nothing is paged in until a view over it is touched.
        self._map = mmap.mmap(self._fd, size, access=mmap.ACCESS_READ)

    def _tensors(self, header, data_size):
        """Every tensor's [start, stop) in the data area, checked: U8, in bounds, no overlap."""
        tensors = {}
        for name, entry in header.items():
            where = f"tensor {name!r}"
            if not isinstance(entry, dict) or entry.get("dtype") != "U8":
                self._fail(f"{where}: dtype is not U8")
            offsets, shape = entry.get("data_offsets"), entry.get("shape")
            if (not isinstance(offsets, list) or len(offsets) != 2
                    or not all(type(n) is int for n in offsets) or not 0 <= offsets[0] <= offsets[1]):
                self._fail(f"{where}: data_offsets {offsets!r} is not [start, stop] with 0 <= start <= stop")
            if offsets[1] > data_size:
                self._fail(f"{where}: data_offsets {offsets} run past the end of the data "
                           f"({data_size} bytes): truncated or corrupt")
            if shape != [offsets[1] - offsets[0]]:
                self._fail(f"{where}: shape {shape!r} does not match data_offsets {offsets}")
            tensors[name] = tuple(offsets)
        ordered = sorted(tensors.items(), key=lambda item: item[1])
        for (before, (_, stop)), (after, (start, _)) in zip(ordered, ordered[1:]):
            if start < stop:
                self._fail(f"tensors {before!r} and {after!r} overlap (bytes {start}..{stop})")
        return tensors

    def _weight(self, name, entry, tensors, data_start, claimed):
        """(shape, encoding, {plane: (file offset, nbytes, crc32)}) of one declared weight."""
        where = f"weight {name!r}"
        if not isinstance(entry, dict) or not isinstance(entry.get("planes"), dict):
            self._fail(f"{where}: no planes object")
        shape = entry.get("shape")
        if (not isinstance(shape, list) or len(shape) not in (1, 2)
                or not all(type(n) is int and n >= 0 for n in shape)):
            self._fail(f"{where}: shape {shape!r} is not [rows, cols] or [n]")
        try:
            encoding = encoding_from_json(entry.get("encoding"))
        except ContainerError as error:
            self._fail(f"{where}: {error}")
        names = [plane.name for plane in encoding.planes]
        if sorted(names) != sorted(entry["planes"]):
            self._fail(f"{where}: planes {sorted(entry['planes'])} differ from the encoding's {sorted(names)}")
        planes = {}
        for plane in names:
            info, tensor = entry["planes"][plane], tensor_name(name, plane)
            if tensor not in tensors:
                self._fail(f"{where}: plane {plane!r} has no tensor {tensor!r}")
            if tensor in claimed:
                self._fail(f"{where}: plane {plane!r}: tensor {tensor!r} is another weight's plane too")
            claimed.add(tensor)
            start, stop = tensors[tensor]
            nbytes = info.get("nbytes") if isinstance(info, dict) else None
            if nbytes != stop - start:
                self._fail(f"{where}: plane {plane!r} declares {nbytes!r} bytes, its tensor holds {stop - start}")
            try:
                crc = parse_checksum(info.get("checksum"))
            except ContainerError as error:
                self._fail(f"{where}: plane {plane!r}: {error}")
            planes[plane] = (data_start + start, nbytes, crc)
        return tuple(shape), encoding, planes

    def shape(self, weight):
        return self._entry(weight)[0]

    def encoding(self, weight):
        return self._entry(weight)[1]

    def planes(self, weight):
        """The weight's plane names, in the order of its encoding."""
        return tuple(self._entry(weight)[2])

    def plane_nbytes(self, weight, plane):
        return self._plane(weight, plane)[1]

    def plane(self, weight, plane):
        """The whole plane as a read-only uint8 view over the mapping (no copy, nothing read)."""
        return self.plane_range(weight, plane, 0, self.plane_nbytes(weight, plane))

    def plane_range(self, weight, plane, start, stop):
        """Bytes [start, stop) of the plane as a read-only uint8 view; only those pages are touched."""
        offset, nbytes, _ = self._plane(weight, plane)
        if not 0 <= start <= stop <= nbytes:
            raise ContainerError(f"{self.path}: {tensor_name(weight, plane)} bytes [{start}, {stop}) "
                                 f"fall outside its {nbytes} bytes")
        self._check_open()
        return np.frombuffer(self._map, np.uint8, count=stop - start, offset=offset + start)

    def verify(self):
        """(weight, plane) of every plane whose checksum fails; reads through a bounded buffer."""
        self._check_open()
        failed = []
        for weight, (_, _, planes) in self._weights.items():
            for plane, (offset, nbytes, expected) in planes.items():
                crc, done = 0, 0
                while done < nbytes:
                    chunk = os.pread(self._fd, min(VERIFY_CHUNK, nbytes - done), offset + done)
                    if not chunk:
                        break
                    crc, done = zlib.crc32(chunk, crc), done + len(chunk)
                if crc != expected or done != nbytes:
                    failed.append((weight, plane))
        return failed

    def close(self):
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # views still hold the mapping; it is unmapped when the last of them goes
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _entry(self, weight):
        if weight not in self._weights:
            raise KeyError(f"{self.path}: no weight {weight!r}")
        return self._weights[weight]

    def _plane(self, weight, plane):
        planes = self._entry(weight)[2]
        if plane not in planes:
            raise KeyError(f"{self.path}: weight {weight!r} has no plane {plane!r}")
        return planes[plane]

    def _check_open(self):
        if self._map is None:
            raise ContainerError(f"{self.path}: the container is closed")

    def _json(self, text, where):
        try:
            value = json.loads(text)
        except (UnicodeDecodeError, ValueError) as error:
            self._fail(f"{where} is not valid JSON: {error}")
        if not isinstance(value, dict):
            self._fail(f"{where} is not a JSON object")
        return value

    def _fail(self, message):
        raise ContainerError(f"{self.path}: {message}")


def open_container(path) -> Container:
    """The model file at `path`, opened; where it is no container or cannot be read, ContainerError
    in one line that names the file (the one wording every command shows)."""
    try:
        return Container(path)
    except ContainerError as error:
        raise ContainerError(f"not a .rad model: {error}") from None
    except OSError as error:
        raise ContainerError(f"{path}: {error.strerror or error}") from None
