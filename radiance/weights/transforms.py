"""The inverse transforms of the core decoder, applied per row over columns (w = v . T^-1), and the
column cuts each transform allows.

- ""      : none.
- "fwhtN" : the quantiser stored v = (w . H_N) / N, blockwise over each row's columns in groups of
            N (N a power of two dividing cols; H_N the natural-order Sylvester Hadamard matrix of
            +-1, H_N . H_N = N I). The 1/N lives in the stored scale, so the inverse is the
            unnormalised transform again: w = v . H_N, group by group.
- "perm"  : GPTQ act-order. TABLE `t.perm` [1 x cols] of integers: stored column j holds logical
            column perm[j] (the quantiser stored v = w[:, perm], so its groups run in processing
            order); the inverse is w[:, perm] = v.
- "givens": ParoQuant's scaled pairwise rotations, TABLE planes `t.pairs`, `t.angle`, optional
            `t.scale`, `t.part` and `t.dense` (givens.py).
"""

import numpy as np

from radiance.abi import RadEncoding

PERM = "t.perm"


def fwht_size(transform: str, name: str = "weight") -> int:
    """N of "fwhtN", or 0 when the transform is not a Hadamard."""
    if not transform.startswith("fwht"):
        return 0
    digits = transform[4:]
    size = int(digits) if digits.isdigit() else 0
    if size < 1 or size & (size - 1):
        raise ValueError(f"{name}: transform {transform!r} needs a power-of-two size, as in 'fwht32'")
    return size


def column_unit(encoding: RadEncoding, cols: int, name: str = "weight") -> int:
    """Columns a column cut must be a multiple of for this transform (cols: no column cut)."""
    transform = encoding.transform
    if transform == "":
        return 1
    size = fwht_size(transform, name)
    return size if size else cols


def check_transform(encoding: RadEncoding, cols: int, name: str = "weight") -> None:
    """Refuse a transform the core decoder cannot invert over `cols` columns."""
    transform = encoding.transform
    if transform in ("", "perm", "givens"):
        return
    size = fwht_size(transform, name)
    if not size:
        raise ValueError(f"{name}: transform {transform!r} is not supported by the core decoder "
                         f"(it inverts '', 'fwhtN', 'perm' and 'givens'; a quantiser's decode hook does the rest)")
    if cols % size:
        raise ValueError(f"{name}: transform {transform!r} needs the columns ({cols}) to be a "
                         f"multiple of {size}")


def fwht(values: np.ndarray, size: int) -> np.ndarray:
    """values [rows, cols] -> values . H_size over each group of `size` columns, unnormalised,
    in place (log2(size) butterfly stages, each over the whole array)."""
    rows, cols = values.shape
    half = 1
    while half < size:
        # [rows, cols / (2 half), 2, half]: the two halves of every pair of half-groups
        pairs = values.reshape(rows, cols // (2 * half), 2, half)
        first = pairs[:, :, 0, :].copy()
        pairs[:, :, 0, :] += pairs[:, :, 1, :]
        np.subtract(first, pairs[:, :, 1, :], out=pairs[:, :, 1, :])
        half *= 2
    return values


def unpermute(values: np.ndarray, perm: np.ndarray, name: str = "weight") -> np.ndarray:
    """values [rows, cols] stored in act order -> logical order: w[:, perm] = v."""
    cols = values.shape[1]
    perm = np.asarray(perm).reshape(-1)
    if perm.dtype.kind not in "iu" or perm.shape != (cols,):
        raise ValueError(f"{name}: plane {PERM!r} must be {cols} integers (one per column), "
                         f"not {perm.dtype} {list(perm.shape)}")
    if not np.array_equal(np.sort(perm), np.arange(cols)):
        raise ValueError(f"{name}: plane {PERM!r} is not a permutation of the {cols} columns")
    logical = np.empty_like(values)
    logical[:, perm] = values
    return logical
