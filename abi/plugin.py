"""The helpers of rad_plugin.h, for Python plugins. A tensor's `data` is a numpy array holding
its elements (byte-addressable dtypes) or its packed bytes (uint8, sub-byte dtypes)."""

import os
import time

import numpy as np

from . import constants as c
from .dtypes import BITS, NUMPY, UNPACKED, dtype_from_numpy
from .types import RadTensor


def rad_tensor(array, dtype=None) -> RadTensor:
    """Wrap a numpy array; `dtype` names the RAD_DT_* of packed sub-byte bytes."""
    if array is None:
        return RadTensor(data=None)
    dtype = dtype_from_numpy(array.dtype) if dtype is None else dtype
    shape = tuple(array.shape) + (0,) * (c.RAD_MAX_DIMS - array.ndim)
    pitch = tuple(array.strides) + (0,) * (c.RAD_MAX_DIMS - array.ndim)
    return RadTensor(data=array, dtype=dtype, ndim=array.ndim, shape=shape, pitch=pitch)


def rad_arg_in(a, i):
    """Operand i, or None when it is absent (a null data)."""
    if i >= len(a.t) or a.t[i].data is None:
        return None
    return a.t[i]


def rad_tensor_rows(t) -> int:
    rows = 1
    for extent in t.shape[: t.ndim - 1]:
        rows *= extent
    return rows


def rad_tensor_lastdim(t) -> int:
    return t.shape[t.ndim - 1] if t.ndim else 1


def rad_tensor_row_pitch(t) -> int:
    return t.pitch[t.ndim - 2] if t.ndim >= 2 else 0


def rad_dtype_bits(dtype: int) -> int:
    return BITS[dtype]


_MISSING = object()


def _get(a, key, fallback):
    value = a.params.get(key, _MISSING) if a.params else _MISSING
    if value is _MISSING:
        if fallback is _MISSING:
            raise KeyError(f"parameter {key!r} is not in the resolved geometry")
        return fallback
    return value


def rad_args_geti(a, key):
    return int(_get(a, key, _MISSING))


def rad_args_getf(a, key):
    return float(_get(a, key, _MISSING))


def rad_args_gets(a, key):
    return str(_get(a, key, _MISSING))


def rad_args_geti_or(a, key, fallback):
    value = _get(a, key, None)
    return fallback if value is None else int(value)


def rad_args_getf_or(a, key, fallback):
    value = _get(a, key, None)
    return fallback if value is None else float(value)


def rad_args_gets_or(a, key, fallback):
    value = _get(a, key, None)
    return fallback if value is None else str(value)


def rad_load_bits(row, dtype: int, i: int) -> int:
    """The raw bits of element i of a row (a numpy array of the row's bytes or elements)."""
    raw = np.ascontiguousarray(row).view(np.uint8).reshape(-1)
    bits = BITS[dtype]
    if bits >= 8:
        width = bits // 8
        return int.from_bytes(raw[i * width:(i + 1) * width].tobytes(), "little")
    start = i * bits
    window = int.from_bytes(raw[start // 8:(start + bits - 1) // 8 + 1].tobytes(), "little")
    return (window >> (start % 8)) & ((1 << bits) - 1)


def rad_store_bits(row, dtype: int, i: int, value: int) -> None:
    raw = row.view(np.uint8).reshape(-1)
    bits = BITS[dtype]
    if bits >= 8:
        width = bits // 8
        raw[i * width:(i + 1) * width] = np.frombuffer(int(value).to_bytes(width, "little"), np.uint8)
        return
    start = i * bits
    first, last = start // 8, (start + bits - 1) // 8
    window = int.from_bytes(raw[first:last + 1].tobytes(), "little")
    mask = ((1 << bits) - 1) << (start % 8)
    window = (window & ~mask) | ((int(value) << (start % 8)) & mask)
    raw[first:last + 1] = np.frombuffer(window.to_bytes(last - first + 1, "little"), np.uint8)


def _scalar_dtype(dtype):
    return NUMPY.get(dtype) or UNPACKED[dtype]


def rad_load_f32(row, dtype: int, i: int) -> float:
    bits = rad_load_bits(row, dtype, i)
    scalar = _scalar_dtype(dtype)
    if BITS[dtype] < 8 and scalar.kind != "f" and dtype != c.RAD_DT_FP4_E2M1:
        value = bits - (1 << BITS[dtype]) if dtype == c.RAD_DT_I4 and bits >= 8 else bits
        return float(np.float32(value))
    width = max(scalar.itemsize, 1)
    array = np.frombuffer(int(bits).to_bytes(width, "little"), dtype=scalar)
    return float(array[0].astype(np.float32))


def rad_store_f32(row, dtype: int, i: int, value: float) -> None:
    """Narrowing rounds to nearest even (numpy / ml_dtypes casts)."""
    scalar = _scalar_dtype(dtype)
    narrowed = np.asarray(np.float32(value)).astype(scalar)
    bits = int.from_bytes(narrowed.tobytes(), "little")
    if BITS[dtype] < 8:
        bits &= (1 << BITS[dtype]) - 1
    rad_store_bits(row, dtype, i, bits)


def rad_backoff():
    """Pauses for a polling loop that never burns a core another rank needs: spin briefly, then
    yield the core, then sleep with a back-off up to 200 us. `for _ in rad_backoff(): if ready: break`."""
    spins, pause = 0, 0.0
    while True:
        spins += 1
        if spins >= 256:
            pause = min(pause * 2 or 2e-6, 2e-4)
            time.sleep(pause)
        elif spins >= 64:
            os.sched_yield()
        yield spins


def rad_wait_word(word, value: int, timeout_ns: int = 0) -> int:
    """Wait until word[0] >= value (rad_backoff's pauses). `word` is a one-element uint64 numpy view."""
    deadline = time.monotonic_ns() + timeout_ns if timeout_ns else None
    for _ in rad_backoff():
        if word[0] >= value:
            return c.RAD_OK
        if deadline is not None and time.monotonic_ns() > deadline:
            return c.RAD_E_DEVICE


# rad_plugin.h declares rad_weight_f32 and the engine that loads a plugin defines it; here the
# engine hands its core decoder in (engine_defines_weight_decoder) before it imports any plugin.
_engine_decoder = None


def engine_defines_weight_decoder(decode) -> None:
    """The engine's side of rad_weight_f32: `decode(encoding, planes, (rows, cols))` -> f32 [rows,
    cols]. radiance/engine/loading/loader.py calls it; a plugin never does."""
    global _engine_decoder
    _engine_decoder = decode


def rad_weight_f32(weight) -> np.ndarray:
    """A RadWeightPlanes decoded to f32 [rows, cols] by the engine's core decoder (plain and
    affine schemes). Declared here, defined by the engine, as rad_plugin.h's helpers are."""
    if _engine_decoder is None:
        raise RuntimeError("rad_weight_f32: no engine has defined the core decoder (the engine's loader "
                           "hands it in before it imports a plugin)")
    planes = {spec.name: tensor.data for spec, tensor in zip(weight.encoding.planes, weight.planes)}
    return _engine_decoder(weight.encoding, planes, (weight.rows, weight.cols))


def rad_weight_from_f32(values) -> "RadWeightPlanes":
    """f32 [rows, cols] (a vector: one row) as a RadWeightPlanes of the plain f32 encoding: what an
    `unrelayout` hands back for a weight its `relayout` decoded to dense f32."""
    from .encoding import RadEncoding, RadPlane
    from .types import RadWeightPlanes
    values = np.ascontiguousarray(values, dtype=np.float32)
    values = values.reshape(1, -1) if values.ndim == 1 else values
    encoding = RadEncoding(scheme="plain", planes=(RadPlane("codes", c.RAD_DT_F32, c.RAD_PLANE_TILED, 1, 1),))
    codes = values.view(np.uint8).reshape(values.shape[0], -1)
    return RadWeightPlanes(encoding=encoding, rows=values.shape[0], cols=values.shape[1],
                           planes=[rad_tensor(codes)])
