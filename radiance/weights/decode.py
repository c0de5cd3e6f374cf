"""The core decoder of the `plain` and `affine` schemes, in the specification's order:

    q = code | grid[code][k] | table[code]     codes TILED [1x1], or [1xV] with a grid
    q = -q where the signs bit is set          signs TILED u1
    q = q - zero                               zero TILED            (affine only)
    v = q * scale * scale.1 * ...              every scale level, left to right
    v = v - min * min.1 * ...                  the minimum levels' product (affine only)
    w = v . T^-1                               the inverse transform, per row over columns

Every step is whole-array numpy in f32: a TILED plane is broadcast over the weight through a
[rows/br, br, cols/bc, bc] view of it (or, where a block is cut short at the edge, expanded by
index), never a loop over elements or blocks.
"""

import math

import numpy as np

from radiance.abi import RadEncoding

from . import givens
from .levels import check_encoding, levels
from .planes import block, plane_array
from .transforms import PERM, check_transform, fwht, fwht_size, unpermute


def on_grid(values: np.ndarray, plane_block: tuple[int, int], shape: tuple[int, int],
            grid: tuple[int, int]) -> np.ndarray:
    """A TILED plane's [r, c] values resampled onto a grid of `grid` blocks over the weight (each
    block of the plane a whole number of grid blocks)."""
    if tuple(plane_block) == tuple(grid):
        return values
    rows, cols = shape
    row_index = np.arange(-(-rows // grid[0])) * grid[0] // plane_block[0]
    col_index = np.arange(-(-cols // grid[1])) * grid[1] // plane_block[1]
    return values[np.ix_(row_index, col_index)]


def apply(op, values: np.ndarray, plane_values: np.ndarray, plane_block: tuple[int, int]) -> None:
    """values [rows, cols] = op(values, the plane broadcast over its blocks), in place."""
    rows, cols = values.shape
    br, bc = plane_block
    if rows % br == 0 and cols % bc == 0:
        view = values.reshape(rows // br, br, cols // bc, bc)
        op(view, plane_values[:, None, :, None], out=view)
    else:
        op(values, on_grid(plane_values, plane_block, (rows, cols), (1, 1)), out=values)


def _negate_where(values, signs, out):
    return np.negative(values, out=out, where=signs)


def _typed(encoding: RadEncoding, planes: dict, shape, name: str, plane_name: str):
    plane = encoding.plane(plane_name)
    if plane_name not in planes:
        raise ValueError(f"{name}: plane {plane_name!r} of the encoding has no data")
    try:
        return plane_array(plane, planes[plane_name], shape)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None


def _lookup(codes: np.ndarray, entries: np.ndarray, name: str, plane_name: str) -> np.ndarray:
    if codes.size and int(codes.max()) >= len(entries):
        raise ValueError(f"{name}: a code {int(codes.max())} runs past the {len(entries)} entries "
                         f"of plane {plane_name!r}")
    return entries[codes]


def _codes(encoding: RadEncoding, planes: dict, shape, name: str) -> np.ndarray:
    """q [rows, cols] f32: the codes, or what they index in the grid or the table."""
    rows, cols = shape
    codes = _typed(encoding, planes, shape, name, "codes")
    if encoding.plane("grid"):
        grid = _typed(encoding, planes, shape, name, "grid").astype(np.float32)
        q = _lookup(codes, grid, name, "grid").reshape(rows, -1)  # [rows, c/V, V] -> [rows, c]
        return np.ascontiguousarray(q[:, :cols])
    if encoding.plane("table"):
        table = _typed(encoding, planes, shape, name, "table").astype(np.float32).reshape(-1)
        return _lookup(codes, table, name, "table")
    return codes.astype(np.float32)


def _level_product(encoding, planes, shape, name, base):
    """The product of the `base` levels on their common grid, and that grid's block."""
    found = levels(encoding, base, name)
    blocks = [block(plane, shape) for plane in found]
    grid = (math.gcd(*(b[0] for b in blocks)), math.gcd(*(b[1] for b in blocks)))
    product = None
    for plane, plane_block in zip(found, blocks):
        values = _typed(encoding, planes, shape, name, plane.name).astype(np.float32)
        values = on_grid(values, plane_block, shape, grid)
        product = values if product is None else product * values
    return product, grid


def decode(encoding: RadEncoding, planes: dict, shape: tuple[int, int],
           name: str = "weight") -> np.ndarray:
    """The weight as f32 [rows, cols] from its planes ({plane name: raw bytes or typed [r, c]})."""
    rows, cols = shape
    if rows < 1 or cols < 1:
        raise ValueError(f"{name}: cannot decode an empty {rows}x{cols} weight")
    check_encoding(encoding, name)
    check_transform(encoding, cols, name)
    values = _codes(encoding, planes, shape, name)
    signs = encoding.plane("signs")
    if signs:
        negative = _typed(encoding, planes, shape, name, "signs").astype(bool)
        apply(_negate_where, values, negative, block(signs, shape))
    zero = encoding.plane("zero")
    if zero:
        offset = _typed(encoding, planes, shape, name, "zero").astype(np.float32)
        apply(np.subtract, values, offset, block(zero, shape))
    for plane in levels(encoding, "scale", name):
        scale = _typed(encoding, planes, shape, name, plane.name).astype(np.float32)
        apply(np.multiply, values, scale, block(plane, shape))
    if levels(encoding, "min", name):
        minimum, grid = _level_product(encoding, planes, shape, name, "min")
        apply(np.subtract, values, minimum, grid)
    size = fwht_size(encoding.transform, name)
    if size:
        fwht(values, size)
    if encoding.transform == "perm":
        values = unpermute(values, _typed(encoding, planes, shape, name, PERM), name)
    if encoding.transform == "givens":
        def table(plane):
            return _typed(encoding, planes, shape, name, plane) if encoding.plane(plane) else None
        values = givens.invert(values, table, name)
    return values

