"""One plane of an encoding, from the struct alone: its element shape and byte size over a weight,
and the two forms its data takes.

A TILED plane with block [br, bc] (0 = the whole extent) over a [rows, cols] weight holds
[ceil(rows/br), ceil(cols/bc)] elements: element (i, j) covers rows [i*br, (i+1)*br) and columns
[j*bc, (j+1)*bc), the last block of each axis cut short where the weight ends. A TABLE plane holds
its own [rows, cols] whatever the weight. Stored, a plane is raw bytes, row-major, every row
starting on a byte (sub-byte rows are bit streams, lowest bits first): np.uint8 [r, row_bytes].
Typed, it is [r, c] of its element type (NUMPY, or UNPACKED for sub-byte types). Where both forms
are accepted, an np.uint8 array always means raw bytes.
"""

import numpy as np

from radiance.abi import (
    BITS, NAMES, NUMPY, RAD_DT_FP4_E2M1, RAD_DT_I4, RAD_PLANE_TABLE, RAD_PLANE_TILED, UNPACKED,
    RadEncoding, RadPlane, pack_bits, row_bytes, unpack_bits,
)


def block(plane: RadPlane, shape: tuple[int, int]) -> tuple[int, int]:
    """The [br, bc] a TILED plane's element covers, 0 resolved to the weight's extent."""
    rows, cols = shape
    return (plane.block_rows or rows, plane.block_cols or cols)


def plane_shape(plane: RadPlane, shape: tuple[int, int]) -> tuple[int, int]:
    """The [r, c] elements of a plane over a [rows, cols] weight."""
    if plane.kind == RAD_PLANE_TABLE:
        return (plane.rows, plane.cols)
    if plane.kind != RAD_PLANE_TILED:
        raise ValueError(f"plane {plane.name!r}: kind {plane.kind} is neither TILED nor TABLE")
    if plane.block_rows < 0 or plane.block_cols < 0:
        raise ValueError(f"plane {plane.name!r}: negative block [{plane.block_rows}x{plane.block_cols}]")
    rows, cols = shape
    br, bc = block(plane, shape)
    return (-(-rows // br) if rows else 0, -(-cols // bc) if cols else 0)


def plane_row_bytes(plane: RadPlane, shape: tuple[int, int]) -> int:
    return row_bytes(plane.dtype, plane_shape(plane, shape)[1])


def plane_nbytes(plane: RadPlane, shape: tuple[int, int]) -> int:
    """Bytes the plane takes stored over a [rows, cols] weight."""
    return plane_shape(plane, shape)[0] * plane_row_bytes(plane, shape)


def encoding_nbytes(encoding: RadEncoding, shape: tuple[int, int]) -> int:
    """Bytes of every plane of the encoding over a [rows, cols] weight."""
    return sum(plane_nbytes(plane, shape) for plane in encoding.planes)


def element_dtype(plane: RadPlane) -> np.dtype:
    """The numpy type of one typed element (uint8/int8/float4_e2m1fn for sub-byte types)."""
    if plane.dtype not in BITS:
        raise ValueError(f"plane {plane.name!r}: unknown dtype {plane.dtype}")
    return UNPACKED[plane.dtype] if BITS[plane.dtype] < 8 else NUMPY[plane.dtype]


def _refuse(plane: RadPlane, data: np.ndarray, shape: tuple[int, int]) -> None:
    r, c = plane_shape(plane, shape)
    raise ValueError(
        f"plane {plane.name!r} ({NAMES[plane.dtype]} [{r}x{c}] over a {shape[0]}x{shape[1]} "
        f"weight) needs {plane_nbytes(plane, shape)} raw bytes (np.uint8) or a typed "
        f"{element_dtype(plane)} [{r}x{c}] array, not {data.dtype} {list(data.shape)}")


def _raw_rows(plane: RadPlane, data: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Raw bytes of any shape -> [r, row_bytes] (a view)."""
    if data.size != plane_nbytes(plane, shape):
        _refuse(plane, data, shape)
    r, c = plane_shape(plane, shape)
    return data.reshape(r, row_bytes(plane.dtype, c))


def _typed_elements(plane: RadPlane, data: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    if data.dtype != element_dtype(plane) or data.shape != plane_shape(plane, shape):
        _refuse(plane, data, shape)
    return data


def plane_raw(plane: RadPlane, values: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Typed [r, c] elements -> the plane's raw bytes, np.uint8 [r, row_bytes] (sub-byte types
    packed: their typed form is a byte per element)."""
    values = _typed_elements(plane, np.asarray(values), shape)
    r, c = values.shape
    bits = BITS[plane.dtype]
    if bits >= 8:
        return np.ascontiguousarray(values).view(np.uint8).reshape(r, row_bytes(plane.dtype, c))
    return pack_bits(values.view(np.uint8) & np.uint8((1 << bits) - 1), bits)


def stored(plane: RadPlane, data: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """A plane's data as raw bytes [r, row_bytes]. An np.uint8 array IS raw bytes (any shape of
    the plane's byte size); an array of another type is typed elements (float16, int8, ml_dtypes'
    bfloat16/fp8/fp4 ...). Typed u1..u8 values are uint8 too, so pack them with plane_raw first."""
    data = np.asarray(data)
    if data.dtype == np.uint8:
        return _raw_rows(plane, data, shape)
    return plane_raw(plane, data, shape)


def plane_array(plane: RadPlane, data: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """A plane's data as typed [r, c] elements: raw bytes (np.uint8) unpacked and viewed, a typed
    array of another type checked and returned as is."""
    data = np.asarray(data)
    if data.dtype != np.uint8:
        return _typed_elements(plane, data, shape)
    raw = _raw_rows(plane, data, shape)
    bits = BITS[plane.dtype]
    if bits >= 8:
        return raw.view(NUMPY[plane.dtype])
    codes = unpack_bits(raw, bits, plane_shape(plane, shape)[1])
    if plane.dtype == RAD_DT_I4:  # two's complement: 8..15 are -8..-1
        return (codes.astype(np.int8) ^ np.int8(8)) - np.int8(8)
    if plane.dtype == RAD_DT_FP4_E2M1:
        return codes.view(UNPACKED[RAD_DT_FP4_E2M1])
    return codes
