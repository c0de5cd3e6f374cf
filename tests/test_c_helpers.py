"""The engine's definitions of rad_plugin.h's helpers (radiance/engine/loading/rad_plugin.c) compute
what radiance.abi's Python helpers of the same names compute, bit for bit: every element load and
store of every core dtype, the argument readers, rad_weight_f32 through the core decoder, and
rad_wait_word's timeout."""

import ctypes
import threading
import time

import numpy as np
import pytest

from radiance.abi import (
    BITS, NAMES, RAD_E_DEVICE, RAD_OK, RadArgs, RadWeightPlanes, rad_load_bits, rad_load_f32,
    rad_store_bits, rad_store_f32, rad_tensor,
)
from radiance.engine.loading.c_structs import CBuilder
from radiance.engine.loading.helpers import helpers
from radiance.weights.decode import decode
from radiance.weights.formats import plain

P, I32, I64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64


@pytest.fixture(scope="module")
def lib():
    library = helpers()
    for name, args, result in (("rad_load_f32", [P, I32, I64], ctypes.c_float),
                               ("rad_store_f32", [P, I32, I64, ctypes.c_float], None),
                               ("rad_load_bits", [P, I32, I64], ctypes.c_uint64),
                               ("rad_store_bits", [P, I32, I64, ctypes.c_uint64], None),
                               ("rad_dtype_bits", [I32], I32),
                               ("rad_args_geti_or", [P, ctypes.c_char_p, I64], I64),
                               ("rad_args_getf_or", [P, ctypes.c_char_p, ctypes.c_double], ctypes.c_double),
                               ("rad_args_gets_or", [P, ctypes.c_char_p, ctypes.c_char_p], ctypes.c_char_p),
                               ("rad_arg_in", [P, ctypes.c_int], P),
                               ("rad_weight_f32", [P, P], ctypes.c_int),
                               ("rad_wait_word", [P, ctypes.c_uint64, ctypes.c_uint64], ctypes.c_int)):
        function = getattr(library, name)
        function.argtypes, function.restype = args, result
    return library


VALUES = np.array([0.0, -0.0, 1.0, -1.5, 0.1, 3.14159, 448, 449, 464, 465, 480, 1e6, -1e6, 6.0, 6.9, 65504, 65520,
                   1e-9, 2.0 ** -10, 2.0 ** -15, 2.0 ** -17, 5.96e-8, 1.2e-38, 3e38, np.inf, -np.inf, 0.0625, 7.0, -6.5,
                   255, -128, 127, 15, 63, 3],
                  np.float32)
FLOATS = ("f32", "f16", "bf16", "f64", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1")


@pytest.mark.parametrize("dtype", sorted(BITS), ids=lambda d: NAMES[d])
def test_element_stores_and_loads_match_the_python_helpers_bit_for_bit(lib, dtype):
    rng = np.random.default_rng(dtype)
    values = np.concatenate([VALUES, rng.normal(0, 50, 200).astype(np.float32),
                             rng.normal(0, 1e-3, 100).astype(np.float32)])
    if NAMES[dtype] not in FLOATS:  # integers and codes: values in their range (a cast out of range is the C's)
        bits = BITS[dtype]
        signed = NAMES[dtype].startswith("i")
        bits = min(bits, 24)  # exact in f32
        low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        values = np.trunc(np.clip(values, low, high)).astype(np.float32)
    n = len(values)
    nbytes = (n * BITS[dtype] + 7) // 8 + 8
    c_row, py_row = np.zeros(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    with np.errstate(over="ignore"):  # 1e6 into f16 is inf on both sides
        for i, value in enumerate(values):
            lib.rad_store_f32(c_row.ctypes.data, dtype, i, float(value))
            rad_store_f32(py_row, dtype, i, float(value))
    assert c_row.tobytes() == py_row.tobytes()
    for i in range(n):
        assert lib.rad_load_bits(c_row.ctypes.data, dtype, i) == rad_load_bits(py_row, dtype, i)
        c_value, py_value = lib.rad_load_f32(c_row.ctypes.data, dtype, i), rad_load_f32(py_row, dtype, i)
        assert np.float32(c_value).tobytes() == np.float32(py_value).tobytes() or (np.isnan(c_value) and np.isnan(py_value))
    assert lib.rad_dtype_bits(dtype) == BITS[dtype]


def test_bit_stores_keep_their_neighbours(lib):
    for dtype in (d for d in BITS if BITS[d] < 8):
        c_row, py_row = np.full(16, 0xA5, np.uint8), np.full(16, 0xA5, np.uint8)
        for i in range(10):
            lib.rad_store_bits(c_row.ctypes.data, dtype, i, (i * 7) & ((1 << BITS[dtype]) - 1))
            rad_store_bits(py_row, dtype, i, (i * 7) & ((1 << BITS[dtype]) - 1))
        assert c_row.tobytes() == py_row.tobytes(), NAMES[dtype]


def test_argument_readers(lib):
    builder = CBuilder()
    params, count = builder.params({"M": 7, "eps": 0.25, "dtype": "bf16"})
    x = np.ones((2, 3), np.float32)
    tensors = builder.tensors([rad_tensor(x), rad_tensor(None)])
    args = RadArgs.ctype(ctypes.addressof(tensors), 2, ctypes.addressof(params), count)
    pointer = ctypes.addressof(args)
    assert lib.rad_args_geti_or(pointer, b"M", -1) == 7 and lib.rad_args_geti_or(pointer, b"K", -1) == -1
    assert lib.rad_args_getf_or(pointer, b"eps", 0) == 0.25 and lib.rad_args_getf_or(pointer, b"M", 0) == 7.0
    assert lib.rad_args_gets_or(pointer, b"dtype", b"?") == b"bf16" and lib.rad_args_gets_or(pointer, b"M", b"?") == b"?"
    assert lib.rad_arg_in(pointer, 0) == ctypes.addressof(tensors) and lib.rad_arg_in(pointer, 1) is None
    assert lib.rad_arg_in(pointer, 2) is None


def test_rad_weight_f32_is_the_engines_core_decoder(lib):
    values = np.arange(-6, 6, dtype=np.float32).reshape(3, 4) / 4
    encoding = plain("f16")
    weight = RadWeightPlanes(encoding=encoding, rows=3, cols=4,
                             planes=[rad_tensor(values.astype(np.float16).view(np.uint8).reshape(3, 8))])
    builder, out = CBuilder(), np.zeros((3, 4), np.float32)
    assert lib.rad_weight_f32(ctypes.addressof(builder.weight(weight)), out.ctypes.data) == RAD_OK
    expected = decode(encoding, {"codes": weight.planes[0].data}, (3, 4))
    assert out.tolist() == expected.tolist() == values.tolist()


def test_rad_wait_word_waits_for_a_store_and_times_out(lib):
    word = np.zeros(1, np.uint64)
    start = time.monotonic()
    assert lib.rad_wait_word(word.ctypes.data, 1, 20_000_000) == RAD_E_DEVICE
    assert time.monotonic() - start >= 0.019
    threading.Timer(0.05, lambda: word.__setitem__(0, 3)).start()
    assert lib.rad_wait_word(word.ctypes.data, 2, 0) == RAD_OK and word[0] == 3
