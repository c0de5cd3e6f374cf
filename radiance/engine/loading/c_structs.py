"""The ABI's structs between C and Python: what a C plugin's tables hold, read into radiance.abi's
dataclasses (`from_c`), and what the engine hands a C hook, written into their ctypes layouts
(`CBuilder`). The layouts are radiance.abi's (`Struct.ctype`, held to gcc's by the mirror test).

Read from C, every string is copied out and every array (a pointer with its `n_*` count) becomes a
tuple of dataclasses; a function pointer stays its address, for c_hooks.py to wrap. Written to C, a
builder keeps every buffer it made alive for as long as the builder lives.
"""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np

from radiance.abi import (
    NUMPY, RAD_DT_ENCODED, RAD_MAX_DIMS, RAD_P_F64, RAD_P_INT, RAD_P_STR, RadBufferDecl, RadConstraint,
    RadEncoding, RadGraphDecl, RadKernelInfo, RadNodeDecl, RadOperandSpec, RadOpSchema, RadParam, RadParamSpec,
    RadPlane, RadQuantizerInfo, RadQuantOption, RadTableDecl, RadTensor, RadTunable, RadWeightDecl, RadWeightInfo,
    RadWeightPlanes,
)
from radiance.abi.dtypes import row_bytes
from radiance.weights.planes import plane_nbytes, plane_shape

# (struct, field) -> the struct its array holds, `n_<field>` long
ARRAYS = {
    (RadOpSchema, "params"): RadParamSpec, (RadOpSchema, "operands"): RadOperandSpec,
    (RadKernelInfo, "constraints"): RadConstraint, (RadKernelInfo, "tunables"): RadTunable,
    (RadEncoding, "planes"): RadPlane, (RadQuantizerInfo, "options"): RadQuantOption,
    (RadGraphDecl, "weights"): RadWeightDecl, (RadGraphDecl, "tables"): RadTableDecl,
    (RadGraphDecl, "buffers"): RadBufferDecl, (RadGraphDecl, "nodes"): RadNodeDecl,
}
MAX_ARRAY = 1 << 20  # a count past this is a plugin's garbage, not a table


class CTableError(ValueError):
    """A table a C plugin returned that cannot be read: one line saying where."""


def text(value) -> str:
    """A C string (bytes or None) as str; NULL reads as ""."""
    if value is None:
        return ""
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise CTableError(f"a string that is not UTF-8: {value[:40]!r}") from None


def _array(pointer, count: int, element, where: str):
    if count < 0 or count > MAX_ARRAY:
        raise CTableError(f"{where}: count {count}")
    if count == 0:
        return ()
    if not pointer:
        raise CTableError(f"{where}: NULL with count {count}")
    items = ctypes.cast(pointer, ctypes.POINTER(element.ctype))
    return tuple(from_c(element, items[i]) for i in range(count))


def _params(pointer, count: int) -> dict:
    """A RadParam array as the dict Python plugins use."""
    if count <= 0:
        return {}
    items = ctypes.cast(pointer, ctypes.POINTER(RadParam.ctype))
    values = {}
    for i in range(count):
        p = items[i]
        values[text(p.key)] = {RAD_P_INT: lambda: int(p.i), RAD_P_F64: lambda: float(p.f),
                               RAD_P_STR: lambda: text(p.s)}.get(p.type, lambda: int(p.i))()
    return values


def _strings(pointer, count: int) -> tuple:
    if count <= 0:
        return ()
    items = ctypes.cast(pointer, ctypes.POINTER(ctypes.c_char_p))
    return tuple(text(items[i]) for i in range(count))


def tensor_from_c(c_tensor) -> RadTensor:
    """A RadTensor whose data the plugin owns, copied into a numpy array of its shape and dtype."""
    ndim = int(c_tensor.ndim)
    if not 0 <= ndim <= RAD_MAX_DIMS:
        raise CTableError(f"a tensor of {ndim} dimensions")
    shape = tuple(int(c_tensor.shape[d]) for d in range(ndim))
    data = None
    if c_tensor.data:
        dtype = NUMPY.get(int(c_tensor.dtype))
        if dtype is None:
            raise CTableError(f"a table of dtype {c_tensor.dtype}, which has no numpy type")
        count = int(np.prod(shape)) if shape else 1
        raw = ctypes.string_at(c_tensor.data, count * dtype.itemsize)
        data = np.frombuffer(raw, dtype).reshape(shape).copy()
    return RadTensor(data=data, dtype=int(c_tensor.dtype), ndim=ndim,
                     shape=shape + (0,) * (RAD_MAX_DIMS - ndim),
                     pitch=tuple(int(c_tensor.pitch[d]) for d in range(RAD_MAX_DIMS)))


def _is_string(cls, name: str) -> bool:
    return dict(cls.ctype._fields_)[name] is ctypes.c_char_p


def from_c(cls, c_value):
    """A dataclass of radiance.abi from its ctypes struct (or a pointer to one)."""
    if isinstance(c_value, ctypes._Pointer):
        if not c_value:
            raise CTableError(f"a NULL {cls.__name__}")
        c_value = c_value.contents
    values = {}
    for field in dataclasses.fields(cls):
        raw = getattr(c_value, field.name)
        if (cls, field.name) in ARRAYS:
            values[field.name] = _array(raw, int(getattr(c_value, "n_" + field.name)), ARRAYS[cls, field.name],
                                        f"{cls.__name__}.{field.name}")
        elif cls is RadNodeDecl and field.name == "params":
            values[field.name] = _params(raw, int(c_value.n_params))
        elif cls is RadNodeDecl and field.name == "operands":
            values[field.name] = _strings(raw, int(c_value.n_operands))
        elif cls is RadTableDecl and field.name == "table":
            values[field.name] = tensor_from_c(raw)
        elif _is_string(cls, field.name):  # NULL reads as the Python default: None where that is None
            values[field.name] = None if raw is None and field.default is None else text(raw)
        elif isinstance(raw, ctypes.Array):
            values[field.name] = tuple(raw)
        else:
            values[field.name] = raw  # numbers; pointers and function pointers as addresses (or None)
    return cls(**values)


# ---- Python -> C -------------------------------------------------------------------------------

def _address(data) -> int | None:
    """What a RadTensor.data holds, as an address: a numpy array's data, a device address (int)."""
    if data is None:
        return None
    if isinstance(data, np.ndarray):
        return data.ctypes.data
    if isinstance(data, (int, np.integer)):
        return int(data)
    raise TypeError(f"a tensor's data is a {type(data).__name__}, not an array or an address")


class CBuilder:
    """Writes Python values into C structs for one call (or one cached RadArgs), keeping every
    buffer alive with itself."""

    def __init__(self):
        self.keep: list = []
        self._encodings: dict = {}

    def string(self, value: str | None):
        if value is None:
            return None
        raw = ctypes.c_char_p(value.encode())
        self.keep.append(raw)
        return raw.value

    def params(self, values: dict):
        """A dict -> (RadParam array, count), typed from each value."""
        array = (RadParam.ctype * max(1, len(values)))()
        for i, (key, value) in enumerate(values.items()):
            p = array[i]
            p.key = self.string(str(key))
            if isinstance(value, str):
                p.type, p.s = RAD_P_STR, self.string(value)
            elif isinstance(value, (float, np.floating)):
                p.type, p.f = RAD_P_F64, float(value)
            else:
                p.type, p.i = RAD_P_INT, int(value)
        self.keep.append(array)
        return array, len(values)

    def encoding(self, encoding: RadEncoding):
        key = id(encoding)
        if key in self._encodings:
            return self._encodings[key][1]
        planes = (RadPlane.ctype * max(1, len(encoding.planes)))()
        for i, plane in enumerate(encoding.planes):
            planes[i] = RadPlane.ctype(self.string(plane.name), plane.dtype, plane.kind, plane.block_rows,
                                       plane.block_cols, plane.rows, plane.cols)
        c_encoding = RadEncoding.ctype(self.string(encoding.scheme), self.string(encoding.transform),
                                       encoding.vec, len(encoding.planes), ctypes.addressof(planes))
        self.keep += [planes, c_encoding]
        self._encodings[key] = (encoding, c_encoding)
        return c_encoding

    def tensor_into(self, c_tensor, tensor: RadTensor) -> None:
        c_tensor.dtype, c_tensor.ndim = int(tensor.dtype), int(tensor.ndim)
        for d in range(RAD_MAX_DIMS):
            c_tensor.shape[d] = int(tensor.shape[d]) if d < len(tensor.shape) else 0
            c_tensor.pitch[d] = int(tensor.pitch[d]) if d < len(tensor.pitch) else 0
        if isinstance(tensor.data, RadWeightPlanes):
            c_tensor.dtype = RAD_DT_ENCODED
            c_tensor.data = ctypes.addressof(self.weight(tensor.data))
        else:
            c_tensor.data = _address(tensor.data)
        self.keep.append(tensor.data)

    def tensors(self, tensors) -> ctypes.Array:
        array = (RadTensor.ctype * max(1, len(tensors)))()
        for i, tensor in enumerate(tensors):
            self.tensor_into(array[i], tensor)
        self.keep.append(array)
        return array

    def plane_tensors(self, encoding: RadEncoding, planes: dict, shape) -> ctypes.Array:
        """Each plane's raw bytes ({name: array}) as RadTensor [plane rows, row bytes], in the encoding's order."""
        tensors = []
        for plane in encoding.planes:
            data = planes[plane.name]
            rows, cols = plane_shape(plane, shape)
            raw = np.ascontiguousarray(data).view(np.uint8) if isinstance(data, np.ndarray) else data
            tensors.append(RadTensor(data=raw, dtype=plane.dtype, ndim=2, shape=(rows, cols, 0, 0),
                                     pitch=(row_bytes(plane.dtype, cols), 0, 0, 0)))
        return self.tensors(tensors)

    def weight(self, weight: RadWeightPlanes):
        planes = self.tensors(weight.planes)
        c_weight = RadWeightPlanes.ctype(ctypes.addressof(self.encoding(weight.encoding)), weight.rows, weight.cols,
                                         len(weight.planes), ctypes.addressof(planes))
        self.keep.append(c_weight)
        return c_weight

    def weight_infos(self, weights: dict):
        array = (RadWeightInfo.ctype * max(1, len(weights)))()
        for i, info in enumerate(weights.values()):
            array[i] = RadWeightInfo.ctype(self.string(info.name), info.rows, info.cols, self.string(info.format))
        self.keep.append(array)
        return array, len(weights)


def weight_from_c(c_weight) -> tuple[RadEncoding, dict, tuple[int, int]]:
    """A RadWeightPlanes in C (the engine's own, handed back by a plugin) as (encoding, {plane: raw
    bytes viewed in place}, (rows, cols)), what the core decoder takes."""
    encoding = from_c(RadEncoding, ctypes.cast(c_weight.encoding, ctypes.POINTER(RadEncoding.ctype)))
    shape = (int(c_weight.rows), int(c_weight.cols))
    if int(c_weight.n_planes) != len(encoding.planes):
        raise CTableError(f"a weight of {c_weight.n_planes} planes, its encoding has {len(encoding.planes)}")
    tensors = ctypes.cast(c_weight.planes, ctypes.POINTER(RadTensor.ctype))
    planes = {}
    for i, plane in enumerate(encoding.planes):
        nbytes = plane_nbytes(plane, shape)
        buffer = (ctypes.c_uint8 * nbytes).from_address(tensors[i].data)
        planes[plane.name] = np.frombuffer(buffer, np.uint8)
    return encoding, planes, shape
