"""Sizes, byte ranges and slices from the encoding alone; slicing then decoding equals decoding then
slicing."""

import numpy as np
import pytest

from radiance.abi import (
    BITS, RAD_DT_F16, RAD_DT_F32, RAD_DT_I32, RAD_DT_U1, RAD_DT_U2, RAD_DT_U6, RAD_DT_U8,
    RAD_PLANE_TABLE,
)
from radiance.weights import formats
from radiance.weights.decode import decode
from radiance.weights.formats import encoding, table, tiled
from radiance.weights.planes import element_dtype, encoding_nbytes, plane_nbytes, plane_raw, plane_shape
from radiance.weights.slicing import row_byte_ranges, slice_cols, slice_rows

GRID = encoding("plain", tiled("codes", RAD_DT_U2, 1, 2), table("grid", RAD_DT_F16, 4, 2),
                tiled("signs", RAD_DT_U1), tiled("scale", RAD_DT_F16, 2, 4), vec=2)
ODD_U6 = encoding("affine", tiled("codes", RAD_DT_U6), tiled("scale", RAD_DT_F16, 1, 3),
                  tiled("min", RAD_DT_F16, 2, 0), tiled("min.1", RAD_DT_F32, 0, 0))
PERM = encoding("plain", tiled("codes", RAD_DT_U8), tiled("scale", RAD_DT_F16, 1, 4),
                table("t.perm", RAD_DT_I32, 1, 16), transform="perm")
FWHT = encoding("plain", tiled("codes", RAD_DT_U8), tiled("scale", RAD_DT_F16, 1, 4), transform="fwht8")


def random_planes(enc, shape, seed=0):
    """Raw bytes of every plane: integers within range, floats finite."""
    rng = np.random.default_rng(seed)
    planes = {}
    for plane in enc.planes:
        rows, cols = plane_shape(plane, shape)
        dtype = element_dtype(plane)
        if plane.name == "t.perm":
            values = rng.permutation(cols).astype(dtype).reshape(1, cols)
        elif plane.name == "codes" and enc.plane("grid"):
            values = rng.integers(0, enc.plane("grid").rows, (rows, cols)).astype(dtype)
        elif dtype.kind in "iu":
            bits = min(BITS[plane.dtype], 8 * dtype.itemsize)
            low, high = (-(1 << bits - 1), 1 << bits - 1) if dtype.kind == "i" else (0, 1 << bits)
            values = rng.integers(low, high, (rows, cols)).astype(dtype)
        else:
            values = rng.uniform(-4, 4, (rows, cols)).astype(np.float32).astype(dtype)
        planes[plane.name] = plane_raw(plane, values, shape)
    return planes


def test_sizes():
    assert encoding_nbytes(formats.q4_1(), (4096, 4096)) == 4096 * 2048 + 2 * 4096 * 128 * 2
    assert encoding_nbytes(formats.q4_k(), (2, 512)) == 2 * 2 * 144  # GGUF's 144 bytes per 256
    assert encoding_nbytes(formats.q6_k(), (2, 512)) == 2 * 2 * 210 + 1  # and the zero's byte
    assert [plane_nbytes(plane, (3, 40)) for plane in formats.nvfp4().planes] == [60, 9, 4]
    assert plane_nbytes(tiled("codes", RAD_DT_U6, 1, 3), (2, 10)) == 2 * 3  # 4 u6 a row
    assert plane_nbytes(table("grid", RAD_DT_U8, 256, 8), (1, 1)) == 2048
    assert encoding_nbytes(GRID, (6, 10)) == 6 * 2 + 16 + 6 * 2 + 3 * 3 * 2


def test_row_byte_ranges_are_the_bytes_of_a_row_slice():
    shape = (6, 96)
    planes = random_planes(formats.q4_1(), shape)
    assert row_byte_ranges(formats.q4_1(), shape, 2, 5) == {
        "codes": (96, 240), "scale": (12, 30), "min": (12, 30)}
    for enc, shape, r0, r1 in ((formats.q4_1(), shape, 2, 5), (ODD_U6, (6, 9), 2, 6), (GRID, (6, 10), 4, 6)):
        planes = random_planes(enc, shape)
        sliced, _ = slice_rows(enc, planes, shape, r0, r1)
        for name, (first, end) in row_byte_ranges(enc, shape, r0, r1).items():
            np.testing.assert_array_equal(planes[name].reshape(-1)[first:end], sliced[name].reshape(-1))


CASES = [  # encoding, shape, a row cut, a column cut
    (formats.q4_1(), (6, 96), (2, 5), (32, 96)),
    (formats.q8_0(), (3, 64), (1, 2), (0, 32)),
    (formats.q4_k(), (4, 512), (1, 3), (256, 512)),
    (formats.q6_k(), (3, 512), (0, 2), (256, 512)),
    (formats.nvfp4(), (4, 48), (3, 4), (16, 32)),
    (formats.fp8(), (5, 7), (1, 4), (2, 5)),
    (GRID, (6, 10), (2, 6), (4, 10)),
    (ODD_U6, (6, 9), (2, 4), (3, 6)),
    (FWHT, (2, 32), (1, 2), (8, 24)),
    (PERM, (5, 16), (1, 4), None),
]


@pytest.mark.parametrize("enc, shape, rows, cols", CASES)
def test_slice_then_decode_equals_decode_then_slice(enc, shape, rows, cols):
    planes = random_planes(enc, shape, seed=shape[1])
    whole = decode(enc, planes, shape)
    sliced, new_shape = slice_rows(enc, planes, shape, *rows)
    assert new_shape == (rows[1] - rows[0], shape[1])
    assert sum(raw.nbytes for raw in sliced.values()) == encoding_nbytes(enc, new_shape)
    np.testing.assert_array_equal(decode(enc, sliced, new_shape), whole[rows[0]:rows[1]])
    if cols is None:
        return
    sliced, new_shape = slice_cols(enc, planes, shape, *cols)
    assert new_shape == (shape[0], cols[1] - cols[0])
    assert sum(raw.nbytes for raw in sliced.values()) == encoding_nbytes(enc, new_shape)
    np.testing.assert_array_equal(decode(enc, sliced, new_shape), whole[:, cols[0]:cols[1]])
    both, both_shape = slice_rows(enc, sliced, new_shape, *rows)
    np.testing.assert_array_equal(decode(enc, both, both_shape), whole[rows[0]:rows[1], cols[0]:cols[1]])


def test_table_planes_and_whole_extent_blocks_are_carried_whole():
    planes = random_planes(PERM, (5, 16))
    sliced, _ = slice_rows(PERM, planes, (5, 16), 3, 5)
    np.testing.assert_array_equal(sliced["t.perm"], planes["t.perm"])
    assert PERM.plane("t.perm").kind == RAD_PLANE_TABLE
    planes = random_planes(formats.q6_k(), (2, 512))
    sliced, _ = slice_cols(formats.q6_k(), planes, (2, 512), 256, 512)
    np.testing.assert_array_equal(sliced["zero"], planes["zero"])


NAME = "blk.3.attn_q"


@pytest.mark.parametrize("call, enc, shape, cut, message", [
    ("columns", formats.q4_1(), (2, 64), (16, 64),
     r"columns \[16, 64\) split the \[1x32\] blocks of plane 'scale': a cut must fall on a multiple of 32"),
    ("columns", formats.q4_1(), (2, 64), (0, 48), r"columns \[0, 48\) split the \[1x32\] blocks"),
    ("rows", ODD_U6, (6, 9), (2, 5), r"rows \[2, 5\) split the \[2x0\] blocks of plane 'min'"),
    ("bytes", ODD_U6, (6, 9), (1, 4), r"rows \[1, 4\) split the \[2x0\] blocks of plane 'min'"),
    ("columns", PERM, (5, 16), (0, 8), r"columns \[0, 8\) cut through transform 'perm'"),
    ("columns", FWHT, (2, 32), (16, 20), r"columns \[16, 20\) cut through transform 'fwht8'"),
    ("bytes", formats.q8_0(), (4, 32), (2, 9), r"rows \[2, 9\) are not a non-empty range within the 4 rows"),
    ("bytes", formats.q8_0(), (4, 32), (2, 2), r"rows \[2, 2\) are not a non-empty range"),
])
def test_a_bad_cut_is_refused_naming_weight_plane_and_block(call, enc, shape, cut, message):
    planes = random_planes(enc, shape)
    calls = {"rows": lambda: slice_rows(enc, planes, shape, *cut, name=NAME),
             "columns": lambda: slice_cols(enc, planes, shape, *cut, name=NAME),
             "bytes": lambda: row_byte_ranges(enc, shape, *cut, name=NAME)}
    with pytest.raises(ValueError, match=f"^{NAME}: {message}"):
        calls[call]()
