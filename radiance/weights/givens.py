"""The `givens` transform (ParoQuant's scaled pairwise rotations), inverted by the core decoder.

Per part (a block of the weight's rows with rotations of its own; one part unless `t.part` says
otherwise), the quantiser stored v = w . T over each row's columns, where

    T = diag(s) . G_0 . G_1 ... G_{K-1}

s the channel scales (`t.scale`, 1 without it) and G_k round k: disjoint column pairs (i, j), each
rotated by its angle a:  (x . G)_i = cos(a) x_i - sin(a) x_j,  (x . G)_j = sin(a) x_i + cos(a) x_j.
The decoder undoes the rounds last first, then the scales: w = v . G_{K-1}^T ... G_0^T . diag(1/s).

TABLE planes (docs/ENCODINGS.md, "Transforms"):
    t.pairs  integer [P*K x 2n]  row p*K + k: round k of part p, pairs (i0, j0, i1, j1, ...)
    t.angle  float   [P*K x n]   each pair's angle, radians
    t.scale  float   [P x cols]  optional: each part's channel scales
    t.part   integer [1 x P]     optional: each part's rows, in order, summing to the weight's rows
    t.dense  float   [P*cols x cols]  optional: each part's T^-1 composed; used in place of the
                                      rounds and scales (which may then be absent)

The rounds' arithmetic is f32 as the rest of the decoder, cos/sin taken in f64 and rounded to f32,
each product and sum rounded on its own (no FMA): the same weight decodes to the same bits anywhere.
`t.dense` is an f32 matrix product, summed in the order numpy's BLAS takes."""

import numpy as np

PAIRS, ANGLE, SCALE, PART, DENSE = "t.pairs", "t.angle", "t.scale", "t.part", "t.dense"
PLANES = (PAIRS, ANGLE, SCALE, PART, DENSE)
INTEGER_PLANES = (PAIRS, PART)


def parts(part, rows: int, name: str) -> list[tuple[int, int]]:
    """[(first row, end row)] of each part; one part without a `t.part` plane."""
    if part is None:
        return [(0, rows)]
    counts = np.asarray(part).reshape(-1)
    if counts.dtype.kind not in "iu" or (counts < 1).any() or int(counts.sum()) != rows:
        raise ValueError(f"{name}: plane {PART!r} must be positive row counts summing to the {rows} rows, "
                         f"not {counts.tolist()}")
    ends = np.cumsum(counts)
    return [(int(end - count), int(end)) for count, end in zip(counts, ends)]


def check_rounds(pairs: np.ndarray, angles: np.ndarray, cols: int, count: int, name: str) -> int:
    """K, the rounds of each of `count` parts, after refusing pairs that are out of range or not
    disjoint within a round."""
    if pairs.dtype.kind not in "iu":
        raise ValueError(f"{name}: plane {PAIRS!r} must be integers, not {pairs.dtype}")
    if pairs.ndim != 2 or pairs.shape[1] % 2 or pairs.shape[0] % count:
        raise ValueError(f"{name}: plane {PAIRS!r} is {list(pairs.shape)}: it must be [parts x rounds, 2 x pairs] "
                         f"for {count} part(s)")
    if angles.shape != (pairs.shape[0], pairs.shape[1] // 2):
        raise ValueError(f"{name}: plane {ANGLE!r} is {list(angles.shape)}, one angle per pair of {PAIRS!r} is "
                         f"{[pairs.shape[0], pairs.shape[1] // 2]}")
    if pairs.size and (pairs.min() < 0 or pairs.max() >= cols):
        raise ValueError(f"{name}: plane {PAIRS!r} names a column outside the {cols} columns")
    for index, row in enumerate(pairs):
        if len(np.unique(row)) != len(row):
            raise ValueError(f"{name}: plane {PAIRS!r} row {index}: a round's pairs must not share a column")
    return pairs.shape[0] // count


def unrotate(values: np.ndarray, pairs: np.ndarray, angles: np.ndarray) -> None:
    """values [rows, cols] . G^T for each round, last first, in place."""
    for k in range(len(pairs) - 1, -1, -1):
        i, j = pairs[k, 0::2], pairs[k, 1::2]
        theta = angles[k].astype(np.float64)
        c, s = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
        x, y = values[:, i].copy(), values[:, j].copy()
        values[:, i] = x * c + y * s
        values[:, j] = y * c - x * s


def invert(values: np.ndarray, table, name: str) -> np.ndarray:
    """w = v . T^-1 of every part. `table(plane name)` is that TABLE plane's typed values, or None
    where the encoding has no such plane."""
    rows, cols = values.shape
    spans = parts(table(PART), rows, name)
    dense = table(DENSE)
    if dense is not None:
        if dense.shape != (len(spans) * cols, cols):
            raise ValueError(f"{name}: plane {DENSE!r} is {list(dense.shape)}, not [{len(spans) * cols} x {cols}]")
        dense = dense.astype(np.float32)
        for p, (r0, r1) in enumerate(spans):
            values[r0:r1] = values[r0:r1] @ dense[p * cols:(p + 1) * cols]
        return values
    pairs, angles, scales = table(PAIRS), table(ANGLE), table(SCALE)
    if pairs is None or angles is None:
        raise ValueError(f"{name}: transform 'givens' needs TABLE planes {PAIRS!r} and {ANGLE!r}, or {DENSE!r}")
    rounds = check_rounds(np.asarray(pairs), np.asarray(angles), cols, len(spans), name)
    if scales is not None and scales.shape != (len(spans), cols):
        raise ValueError(f"{name}: plane {SCALE!r} is {list(scales.shape)}, not [{len(spans)} x {cols}]")
    for p, (r0, r1) in enumerate(spans):
        part = values[r0:r1]
        unrotate(part, np.asarray(pairs[p * rounds:(p + 1) * rounds]), np.asarray(angles[p * rounds:(p + 1) * rounds]))
        if scales is not None:
            np.divide(part, scales[p].astype(np.float32), out=part)
    return values
