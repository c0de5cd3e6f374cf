"""Rows [r0, r1) or columns [c0, c1) of a weight with all its planes, from the encoding alone: what
a tensor-parallel rank loads. TABLE planes and whole-extent blocks (0) are carried whole; a cut
must fall on a block edge of every TILED plane (the weight's last, short block may end a cut), and
column cuts also on the transform's groups (fwhtN: N; perm and givens mix all columns); a givens
weight with parts (`t.part`) takes no row cut either.

Planes come in as raw bytes or typed arrays (as planes.stored reads them: np.uint8 is raw bytes)
and go out as raw bytes np.uint8 [r, row_bytes]. A row
cut of a row-major plane is a contiguous byte range (row_byte_ranges), so a row slice of an mmap
is a view and reads nothing else.
"""

import numpy as np

from radiance.abi import BITS, RAD_PLANE_TABLE, RadEncoding, RadPlane

from .planes import plane_array, plane_nbytes, plane_raw, plane_row_bytes, stored
from .givens import PART
from .transforms import column_unit

ROWS, COLS = 0, 1
_AXIS_NAMES = ("rows", "columns")


def _extent(plane: RadPlane, axis: int) -> int:
    return plane.block_rows if axis == ROWS else plane.block_cols


def check_cut(encoding: RadEncoding, shape: tuple[int, int], axis: int, start: int, stop: int,
              name: str = "weight") -> None:
    """Refuse, naming the weight, the plane and its block, a cut that would split a block."""
    what = f"{name}: {_AXIS_NAMES[axis]} [{start}, {stop})"
    if not 0 <= start < stop <= shape[axis]:
        raise ValueError(f"{what} are not a non-empty range within the {shape[axis]} {_AXIS_NAMES[axis]}")
    for plane in encoding.planes:
        extent = _extent(plane, axis)
        if plane.kind == RAD_PLANE_TABLE or not extent:
            continue
        if start % extent or (stop % extent and stop != shape[axis]):
            raise ValueError(f"{what} split the [{plane.block_rows}x{plane.block_cols}] blocks of "
                             f"plane {plane.name!r}: a cut must fall on a multiple of {extent}")
    whole = (start, stop) == (0, shape[ROWS])
    if axis == ROWS and encoding.transform == "givens" and encoding.plane(PART) is not None and not whole:
        raise ValueError(f"{what} cut a 'givens' weight whose rotations go by parts ({PART!r}): its parts "
                         f"are rows of the whole weight, so it is carried whole")
    if axis == COLS:
        unit = column_unit(encoding, shape[COLS], name)
        if start % unit or (stop % unit and stop != shape[COLS]):
            raise ValueError(f"{what} cut through transform {encoding.transform!r}, which mixes "
                             f"columns in groups of {unit}")


def _element_range(plane: RadPlane, shape, axis: int, start: int, stop: int) -> tuple[int, int]:
    """The plane's elements along `axis` that cover [start, stop) of the weight."""
    extent = _extent(plane, axis)
    if not extent:
        return (0, 1)
    return (start // extent, -(-stop // extent))


def _stored(planes: dict, plane: RadPlane, shape, name: str) -> np.ndarray:
    """The plane's raw bytes [r, row_bytes] over `shape`, refused naming the weight."""
    if plane.name not in planes:
        raise ValueError(f"{name}: plane {plane.name!r} of the encoding has no data")
    try:
        return stored(plane, planes[plane.name], shape)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None


def row_byte_ranges(encoding: RadEncoding, shape: tuple[int, int], r0: int, r1: int,
                    name: str = "weight") -> dict[str, tuple[int, int]]:
    """{plane name: (first byte, end byte)} within each stored plane that rows [r0, r1) need
    (a TABLE plane: all of it)."""
    check_cut(encoding, shape, ROWS, r0, r1, name)
    ranges = {}
    for plane in encoding.planes:
        if plane.kind == RAD_PLANE_TABLE:
            ranges[plane.name] = (0, plane_nbytes(plane, shape))
            continue
        first, end = _element_range(plane, shape, ROWS, r0, r1)
        row_bytes = plane_row_bytes(plane, shape)
        ranges[plane.name] = (first * row_bytes, end * row_bytes)
    return ranges


def slice_rows(encoding: RadEncoding, planes: dict, shape: tuple[int, int], r0: int, r1: int,
               name: str = "weight") -> tuple[dict, tuple[int, int]]:
    """({plane name: raw bytes of rows [r0, r1)}, (r1 - r0, cols)); row slices are views."""
    check_cut(encoding, shape, ROWS, r0, r1, name)
    sliced = {}
    for plane in encoding.planes:
        raw = _stored(planes, plane, shape, name)
        if plane.kind != RAD_PLANE_TABLE:
            first, end = _element_range(plane, shape, ROWS, r0, r1)
            raw = raw[first:end]
        sliced[plane.name] = raw
    return sliced, (r1 - r0, shape[COLS])


def slice_cols(encoding: RadEncoding, planes: dict, shape: tuple[int, int], c0: int, c1: int,
               name: str = "weight") -> tuple[dict, tuple[int, int]]:
    """({plane name: raw bytes of columns [c0, c1)}, (rows, c1 - c0))."""
    check_cut(encoding, shape, COLS, c0, c1, name)
    new_shape = (shape[ROWS], c1 - c0)
    sliced = {}
    for plane in encoding.planes:
        raw = _stored(planes, plane, shape, name)
        if plane.kind == RAD_PLANE_TABLE:
            sliced[plane.name] = raw
            continue
        first, end = _element_range(plane, shape, COLS, c0, c1)
        bits = BITS[plane.dtype]
        if bits % 8 == 0:  # whole bytes per element: a byte range of every row
            sliced[plane.name] = raw[:, first * bits // 8:end * bits // 8]
        else:  # a bit stream: unpack, cut, pack again so every row still starts on a byte
            typed = plane_array(plane, raw, shape)[:, first:end]
            sliced[plane.name] = plane_raw(plane, np.ascontiguousarray(typed), new_shape)
    return sliced, new_shape

