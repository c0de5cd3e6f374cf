"""The `.rad` container's layout and header: a safetensors file whose `__metadata__` carries radiance.

    [8 bytes: N, little-endian]  [N bytes: JSON header, space-padded]  [data area]

Layout invariants (docs/CONTAINER.md has the whole schema):
- Every plane of every weight is one U8 tensor `<weight>.<plane>` of shape [nbytes].
- The data area starts at 8 + N, a multiple of ALIGN, and every plane's offset inside it is a
  multiple of ALIGN, so a numpy view of any plane over the mmap is ALIGN-aligned.
- safetensors refuses a gap between tensors, so the bytes that align the next plane are themselves a
  U8 tensor `__pad__.<k>` (zeros); the last tensor ends where the file ends.
- Checksums are fixed-width text ("crc32:" and 8 hex digits): the header written before the data,
  with placeholder checksums, has the very length of the final one patched in at close.
"""

import json
import re
import struct

from radiance.abi import RAD_MAX_PLANES, RAD_PLANE_TABLE, RAD_PLANE_TILED, RadEncoding, RadPlane
from radiance.abi.dtypes import BY_NAME, NAMES

FORMAT_VERSION = 1
METADATA_KEY = "radiance"
ALIGN = 64
PAD_PREFIX = "__pad__."
LENGTH_BYTES = 8
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit

KINDS = {RAD_PLANE_TILED: "tiled", RAD_PLANE_TABLE: "table"}
KINDS_BY_NAME = {name: kind for kind, name in KINDS.items()}
ENCODING_FIELDS = ("scheme", "transform", "vec", "planes")
PLANE_FIELDS = ("name", "dtype", "kind", "block_rows", "block_cols", "rows", "cols")
CHECKSUM = re.compile(r"crc32:([0-9a-f]{8})")


class ContainerError(ValueError):
    """A container that cannot be written or read as asked: one line naming the file and the fault."""


def tensor_name(weight, plane):
    return f"{weight}.{plane}"


def checksum_text(crc):
    return f"crc32:{crc:08x}"


def parse_checksum(text):
    """The crc32 of a checksum text, or ContainerError."""
    match = CHECKSUM.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ContainerError(f"checksum {text!r} is not 'crc32:' and 8 lowercase hex digits")
    return int(match.group(1), 16)


def encoding_to_json(encoding):
    planes = []
    for plane in encoding.planes:
        if plane.dtype not in NAMES:
            raise ContainerError(f"encoding: plane {plane.name!r}: dtype {plane.dtype} has no name")
        if plane.kind not in KINDS:
            raise ContainerError(f"encoding: plane {plane.name!r}: kind {plane.kind} is neither tiled nor table")
        planes.append({"name": plane.name, "dtype": NAMES[plane.dtype], "kind": KINDS[plane.kind],
                       "block_rows": plane.block_rows, "block_cols": plane.block_cols,
                       "rows": plane.rows, "cols": plane.cols})
    return {"scheme": encoding.scheme, "transform": encoding.transform, "vec": encoding.vec,
            "planes": planes}


def encoding_from_json(value):
    """A RadEncoding from its JSON form; every field checked, ContainerError naming the first bad one."""
    _check_fields(value, ENCODING_FIELDS, "encoding")
    for field in ("scheme", "transform"):
        if not isinstance(value[field], str):
            raise ContainerError(f"encoding: {field} {value[field]!r} is not a string")
    if not _is_count(value["vec"]) or value["vec"] < 1:
        raise ContainerError(f"encoding: vec {value['vec']!r} is not a positive integer")
    if not isinstance(value["planes"], list) or len(value["planes"]) > RAD_MAX_PLANES:
        raise ContainerError(f"encoding: planes is not a list of at most {RAD_MAX_PLANES} planes")
    planes = [_plane_from_json(plane, index) for index, plane in enumerate(value["planes"])]
    names = [plane.name for plane in planes]
    if len(set(names)) != len(names):
        raise ContainerError(f"encoding: plane names repeat: {names}")
    return RadEncoding(scheme=value["scheme"], transform=value["transform"], vec=value["vec"],
                       planes=tuple(planes))


def _plane_from_json(value, index):
    _check_fields(value, PLANE_FIELDS, f"encoding: plane {index}")
    where = f"encoding: plane {value['name']!r}"
    if not isinstance(value["name"], str) or not value["name"]:
        raise ContainerError(f"encoding: plane {index}: name {value['name']!r} is not a non-empty string")
    if value["dtype"] not in BY_NAME:
        raise ContainerError(f"{where}: unknown dtype {value['dtype']!r} (known: {', '.join(BY_NAME)})")
    if value["kind"] not in KINDS_BY_NAME:
        raise ContainerError(f"{where}: unknown kind {value['kind']!r} (known: tiled, table)")
    for field in PLANE_FIELDS[3:]:
        if not _is_count(value[field]):
            raise ContainerError(f"{where}: {field} {value[field]!r} is not a non-negative integer")
    return RadPlane(name=value["name"], dtype=BY_NAME[value["dtype"]], kind=KINDS_BY_NAME[value["kind"]],
                    block_rows=value["block_rows"], block_cols=value["block_cols"],
                    rows=value["rows"], cols=value["cols"])


def _check_fields(value, fields, where):
    if not isinstance(value, dict):
        raise ContainerError(f"{where}: expected an object, found {type(value).__name__}")
    missing = [field for field in fields if field not in value]
    unknown = [field for field in value if field not in fields]
    if missing:
        raise ContainerError(f"{where}: missing field {missing[0]!r}")
    if unknown:
        raise ContainerError(f"{where}: unknown field {unknown[0]!r}")


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def weight_json(shape, encoding, plane_nbytes, checksums):
    """One weight's entry of the radiance header; `checksums` maps plane -> crc32."""
    return {"shape": list(shape), "encoding": encoding_to_json(encoding),
            "planes": {plane: {"nbytes": nbytes, "checksum": checksum_text(checksums[plane])}
                       for plane, nbytes in plane_nbytes.items()}}


def plan_layout(weights):
    """Every tensor's [start, stop) in the data area, in file order, pads included, and the data size.

    `weights` is an iterable of (weight, {plane: nbytes}) in the order the data is laid out."""
    tensors, offset, pads = {}, 0, 0
    for weight, planes in weights:
        for plane, nbytes in planes.items():
            aligned = _round_up(offset, ALIGN)
            if aligned > offset:
                tensors[f"{PAD_PREFIX}{pads}"] = (offset, aligned)
                pads += 1
            tensors[tensor_name(weight, plane)] = (aligned, aligned + nbytes)
            offset = aligned + nbytes
    return tensors, offset


def encode_header(tensors, radiance, length=None):
    """The 8-byte length and the space-padded JSON header: to `length` bytes when given (the header
    being rewritten in place), else to the least length that puts the data area on ALIGN."""
    header = {"__metadata__": {METADATA_KEY: json.dumps(radiance, separators=(",", ":"))}}
    for name, (start, stop) in tensors.items():
        header[name] = {"dtype": "U8", "shape": [stop - start], "data_offsets": [start, stop]}
    text = json.dumps(header, separators=(",", ":")).encode()
    if length is None:
        length = _round_up(LENGTH_BYTES + len(text), ALIGN) - LENGTH_BYTES
    if len(text) > length:
        raise ContainerError(f"header of {len(text)} bytes exceeds its reserved {length}")
    return struct.pack("<Q", length) + text.ljust(length, b" ")


def _round_up(value, step):
    return -(-value // step) * step
