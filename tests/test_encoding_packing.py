"""Sub-byte bit streams (radiance.abi.packing) and the raw <-> typed forms of a plane."""

import ml_dtypes
import numpy as np
import pytest

from radiance.abi import (
    RAD_DT_BF16, RAD_DT_FP4_E2M1, RAD_DT_FP8_E4M3, RAD_DT_I4, RAD_DT_U4, RAD_DT_U6, pack_bits,
    rad_load_bits, unpack_bits,
)
from radiance.weights.formats import tiled
from radiance.weights.planes import plane_array, plane_raw

BITS = (1, 2, 3, 4, 5, 6, 7, 8)
COUNTS = (1, 3, 5, 7, 13, 33, 64)


def reference_pack(values, bits):
    """The bit stream built one bit at a time, independently of pack_bits' grouping."""
    rows, count = values.shape
    stream = np.zeros((rows, ((count * bits + 7) // 8) * 8), np.uint8)
    for bit in range(bits):
        stream[:, bit:count * bits:bits] = (values >> bit) & 1
    return np.packbits(stream, axis=1, bitorder="little")


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("count", COUNTS)
def test_round_trip_and_layout(bits, count):
    values = np.random.default_rng(bits * 100 + count).integers(0, 1 << bits, (3, count), np.uint8)
    packed = pack_bits(values, bits)
    assert packed.dtype == np.uint8 and packed.shape == (3, (count * bits + 7) // 8)
    np.testing.assert_array_equal(packed, reference_pack(values, bits))
    np.testing.assert_array_equal(unpack_bits(packed, bits, count), values)


@pytest.mark.parametrize("bits", (1, 2, 4, 6))
def test_agrees_with_the_abi_element_reader(bits):
    values = np.random.default_rng(bits).integers(0, 1 << bits, (1, 29), np.uint8)
    packed = pack_bits(values, bits)[0]
    assert [rad_load_bits(packed, {1: 13, 2: 14, 4: RAD_DT_U4, 6: RAD_DT_U6}[bits], i)
            for i in range(29)] == values[0].tolist()


def test_known_bytes():
    np.testing.assert_array_equal(pack_bits(np.array([[1, 2, 3]]), 4), [[0x21, 0x03]])
    # 1 | 2 << 6 | 3 << 12 | 4 << 18 = 0x103081; a fifth value starts a new 3-byte group
    np.testing.assert_array_equal(pack_bits(np.array([[1, 2, 3, 4, 63]]), 6),
                                  [[0x81, 0x30, 0x10, 0x3F]])
    np.testing.assert_array_equal(pack_bits(np.array([[1, 0, 1], [0, 1, 1]]), 1), [[5], [6]])


def test_rows_start_on_a_byte():
    packed = pack_bits(np.array([[3, 3, 3], [1, 1, 1]]), 2)
    np.testing.assert_array_equal(packed, [[0b111111], [0b010101]])


def test_refusals():
    with pytest.raises(ValueError, match="outside the 4-bit range"):
        pack_bits(np.array([[16]]), 4)
    with pytest.raises(ValueError, match=r"take 2 bytes a row, not 3"):
        unpack_bits(np.zeros((1, 3), np.uint8), 4, 3)
    with pytest.raises(ValueError, match="only 1 to 8 bits"):
        pack_bits(np.zeros((1, 2), np.uint8), 9)


def test_plane_forms_of_signed_and_float_types():
    shape = (2, 6)
    i4 = np.array([[-8, -1, 0, 1, 7, -3], [2, -2, 3, -4, 5, -6]], np.int8)
    raw = plane_raw(tiled("codes", RAD_DT_I4), i4, shape)
    assert raw.shape == (2, 3)
    np.testing.assert_array_equal(plane_array(tiled("codes", RAD_DT_I4), raw, shape), i4)

    fp4 = np.array([[0.5, -6, 1.5, 0, 3, -0.5]] * 2, np.float32).astype(ml_dtypes.float4_e2m1fn)
    raw = plane_raw(tiled("codes", RAD_DT_FP4_E2M1), fp4, shape)
    np.testing.assert_array_equal(raw[0], [0xF1, 0x03, 0x95])  # 0.5=1 -6=0xF 1.5=3 0 3=5 -0.5=9
    back = plane_array(tiled("codes", RAD_DT_FP4_E2M1), raw, shape).astype(np.float32)
    np.testing.assert_array_equal(back, fp4.astype(np.float32))

    for dtype, numpy_type in ((RAD_DT_BF16, ml_dtypes.bfloat16),
                              (RAD_DT_FP8_E4M3, ml_dtypes.float8_e4m3fn)):
        values = np.array([[1.5, -2, 448, 0.125, 3, -0.25]] * 2, np.float32).astype(numpy_type)
        raw = plane_raw(tiled("codes", dtype), values, shape)
        assert raw.dtype == np.uint8 and raw.shape == (2, 6 * values.itemsize)
        np.testing.assert_array_equal(plane_array(tiled("codes", dtype), raw, shape), values)


def test_a_plane_of_the_wrong_size_is_refused_by_name():
    with pytest.raises(ValueError, match=r"plane 'scale' .* needs 4 raw bytes"):
        plane_array(tiled("scale", RAD_DT_U4, 1, 2), np.zeros(5, np.uint8), (2, 7))
