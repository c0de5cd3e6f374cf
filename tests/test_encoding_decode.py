"""The core decoder on small hand-computed cases, step by step of the specification's formula."""

import ml_dtypes
import numpy as np
import pytest

from radiance.abi import (
    RAD_DT_F16, RAD_DT_F32, RAD_DT_I8, RAD_DT_I32, RAD_DT_U1, RAD_DT_U2, RAD_DT_U4, RAD_DT_U8,
)
from radiance.weights import formats
from radiance.weights.decode import decode
from radiance.weights.formats import encoding, table, tiled
from radiance.weights.planes import plane_raw


def f32(rows):
    return np.array(rows, np.float32)


def decoded(enc, typed, shape):
    """Decode typed planes through their raw bytes, as they are stored."""
    return decode(enc, {name: plane_raw(enc.plane(name), values, shape)
                        for name, values in typed.items()}, shape)


def test_plain_f16_and_raw_bytes_decode_alike():
    values = np.array([[1.5, -2.0, 0.25]], np.float16)
    expected = f32([[1.5, -2.0, 0.25]])
    np.testing.assert_array_equal(decode(formats.plain("f16"), {"codes": values}, (1, 3)), expected)
    raw = values.view(np.uint8).reshape(-1)
    np.testing.assert_array_equal(decode(formats.plain("f16"), {"codes": raw}, (1, 3)), expected)


def test_codes_times_a_scale_per_block():
    codes = np.array([[1, -2, 3, 4], [5, 6, -7, 8]], np.int8)
    scale = np.array([[0.5, 2.0], [1.0, -1.0]], np.float16)
    encoded = formats.q8_0(group=2)
    np.testing.assert_array_equal(decode(encoded, {"codes": codes, "scale": scale}, (2, 4)),
                                  f32([[0.5, -1, 6, 8], [5, 6, 7, -8]]))


def test_a_block_cut_short_at_the_edge():
    codes = np.array([[1, 2, 3, 4, 5]], np.int8)
    scale = np.array([[1.0, 10.0, 100.0]], np.float16)  # blocks [0,2) [2,4) [4,5)
    np.testing.assert_array_equal(decode(formats.q8_0(group=2), {"codes": codes, "scale": scale},
                                         (1, 5)), f32([[1, 2, 30, 40, 500]]))


def test_zero_then_scale_then_min():
    enc = encoding("affine", tiled("codes", RAD_DT_U4), tiled("zero", RAD_DT_U8, 1, 2),
                   tiled("scale", RAD_DT_F16, 1, 4), tiled("min", RAD_DT_F16, 1, 4))
    planes = {"codes": np.array([[0, 5, 15, 9]], np.uint8), "zero": np.array([[1, 8]], np.uint8),
              "scale": np.array([[2.0]], np.float16), "min": np.array([[-0.5]], np.float16)}
    # q - zero = [-1, 4, 7, 1]; * 2 = [-2, 8, 14, 2]; - (-0.5)
    np.testing.assert_array_equal(decoded(enc, planes, (1, 4)), f32([[-1.5, 8.5, 14.5, 2.5]]))


def test_q4_1_stores_minus_m():
    planes = {"codes": np.array([[0, 15]], np.uint8), "scale": np.array([[0.5]], np.float16),
              "min": np.array([[-3.0]], np.float16)}  # GGUF m = 3: w = d*q + m
    np.testing.assert_array_equal(decoded(formats.q4_1(group=2), planes, (1, 2)), f32([[3, 10.5]]))


def test_grid_of_two_values_per_code():
    enc = encoding("plain", tiled("codes", RAD_DT_U2, 1, 2), table("grid", RAD_DT_I8, 4, 2), vec=2)
    grid = np.array([[0, 1], [2, 3], [-4, 5], [6, -7]], np.int8)
    planes = {"codes": np.array([[3, 0, 2], [1, 1, 0]], np.uint8), "grid": grid}
    np.testing.assert_array_equal(decoded(enc, planes, (2, 5)),  # the last code's 2nd value is cut
                                  f32([[6, -7, 0, 1, -4], [2, 3, 2, 3, 0]]))


def test_table_signs_and_two_scale_levels():
    enc = encoding("plain", tiled("codes", RAD_DT_U2), table("table", RAD_DT_F32, 1, 4),
                   tiled("signs", RAD_DT_U1), tiled("scale", RAD_DT_F16, 1, 2),
                   tiled("scale.1", RAD_DT_F32, 2, 0))
    planes = {"codes": np.array([[0, 1, 2, 3], [3, 2, 1, 0], [1, 1, 1, 1]], np.uint8),
              "table": f32([[0.5, 1, 2, 4]]),
              "signs": np.array([[0, 1, 0, 1], [1, 1, 0, 0], [0, 0, 0, 1]], np.uint8),
              "scale": np.array([[1, 2], [3, 4], [5, 6]], np.float16),
              "scale.1": f32([[10], [-1]])}  # rows [0, 2) and row 2
    np.testing.assert_array_equal(decoded(enc, planes, (3, 4)), f32(
        [[5, -10, 40, -80], [-120, -60, 40, 20], [-5, -5, -6, 6]]))


def test_minimum_levels_multiply_before_subtracting():
    enc = encoding("affine", tiled("codes", RAD_DT_U8), tiled("min", RAD_DT_U8, 1, 2),
                   tiled("min.1", RAD_DT_F16, 0, 0))
    planes = {"codes": np.array([[10, 10, 10, 10]], np.uint8), "min": np.array([[1, 3]], np.uint8),
              "min.1": np.array([[0.5]], np.float16)}
    np.testing.assert_array_equal(decoded(enc, planes, (1, 4)), f32([[9.5, 9.5, 8.5, 8.5]]))


def hadamard(size):
    matrix = np.ones((1, 1), np.float32)
    while matrix.shape[0] < size:
        matrix = np.block([[matrix, matrix], [matrix, -matrix]])
    return matrix


def test_fwht_is_the_unnormalised_hadamard_per_group():
    enc = encoding("plain", tiled("codes", RAD_DT_F32), transform="fwht4")
    stored = f32([[1, 0, 0, 0, 0, 1, 0, 0], [1, 2, 3, 4, 0, 0, 0, 2]])
    np.testing.assert_array_equal(decode(enc, {"codes": stored}, (2, 8)), f32(
        [[1, 1, 1, 1, 1, -1, 1, -1], [10, -2, -4, 0, 2, -2, -2, 2]]))


def test_fwht_inverts_a_quantiser_that_stored_w_h_over_n():
    weight = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    stored = (weight.reshape(3, 2, 32) @ hadamard(32) / 32).reshape(3, 64)
    enc = encoding("plain", tiled("codes", RAD_DT_F32), transform="fwht32")
    np.testing.assert_allclose(decode(enc, {"codes": stored}, (3, 64)), weight, atol=1e-5)


def test_perm_puts_stored_column_j_at_perm_j():
    enc = encoding("plain", tiled("codes", RAD_DT_F32), table("t.perm", RAD_DT_I32, 1, 3),
                   transform="perm")
    planes = {"codes": f32([[10, 20, 30]]), "t.perm": np.array([[2, 0, 1]], np.int32)}
    np.testing.assert_array_equal(decode(enc, planes, (1, 3)), f32([[20, 30, 10]]))


def test_fp8_per_tensor_and_nvfp4():
    codes = f32([[1.5, -2, 448, 0.25]]).astype(ml_dtypes.float8_e4m3fn)
    planes = {"codes": codes, "scale": f32([[0.5]])}
    np.testing.assert_array_equal(decode(formats.fp8(), planes, (1, 4)), f32([[0.75, -1, 224, 0.125]]))
    codes = f32([[6] * 16 + [-0.5] * 16]).astype(ml_dtypes.float4_e2m1fn)
    planes = {"codes": codes, "scale": f32([[2, 0.25]]).astype(ml_dtypes.float8_e4m3fn),
              "scale.1": f32([[3]])}
    np.testing.assert_array_equal(decoded(formats.nvfp4(), planes, (1, 32)),
                                  f32([[36] * 16 + [-0.375] * 16]))


@pytest.mark.parametrize("enc, planes, message", [
    (encoding("mine", tiled("codes", RAD_DT_U8)), {}, "scheme 'mine' is a quantiser's own"),
    (encoding("plain", tiled("codes", RAD_DT_F32), transform="rotor"), {},
     "not supported by the core decoder"),
    (encoding("plain", tiled("codes", RAD_DT_U4), tiled("zero", RAD_DT_U8, 0, 0)), {},
     "'plain' encoding has no zero"),
    (encoding("plain", tiled("codes", RAD_DT_U8), tiled("scale.1", RAD_DT_F16, 1, 4)), {},
     "skip a level"),
    (encoding("plain", tiled("codes", RAD_DT_U8), tiled("bias", RAD_DT_F16)), {},
     "plane 'bias' is not part of"),
    (encoding("plain", tiled("codes", RAD_DT_U4), table("table", RAD_DT_F32, 1, 2)),
     {"codes": np.array([[0x10, 0x12]], np.uint8), "table": f32([[1, 2]])},
     "code 2 runs past the 2 entries of plane 'table'"),
    (formats.q8_0(), {"codes": np.zeros((1, 4), np.int8)}, "plane 'scale' of the encoding has no data"),
    (formats.q8_0(), {"codes": np.zeros((1, 4), np.int8), "scale": np.zeros(3, np.uint8)},
     r"plane 'scale' \(f16 \[1x1\] over a 1x4 weight\) needs 2 raw bytes"),
    (formats.q8_0(), {"codes": np.zeros((1, 4), np.int16), "scale": np.zeros(2, np.uint8)},
     r"plane 'codes' .* or a typed int8 \[1x4\] array, not int16 \[1, 4\]"),
    (encoding("plain", tiled("codes", RAD_DT_F32), transform="fwht3"), {}, "power-of-two"),
])
def test_refusals_name_the_weight_and_the_plane(enc, planes, message):
    with pytest.raises(ValueError, match=f"^blk.0.ffn_up: .*{message}"):
        decode(enc, planes, (1, 4), name="blk.0.ffn_up")
