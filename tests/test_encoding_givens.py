"""The `givens` transform (radiance/weights/givens.py): a weight rotated and scaled as a ParoQuant
quantiser stores it decodes back to the weight, per part too, and through `t.dense`; malformed
rotation planes are refused naming the weight and the plane; a per-part weight takes no row cut."""

import numpy as np
import pytest

from radiance.abi import RAD_DT_F32, RAD_DT_I32
from radiance.weights.decode import decode
from radiance.weights.formats import encoding, table, tiled
from radiance.weights.slicing import ROWS, check_cut

COLS, ROUNDS = 8, 3


def rounds(rng, count: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` rounds of COLS / 2 disjoint pairs each (a shuffle of the columns, paired off) and angles."""
    pairs = np.stack([rng.permutation(COLS) for _ in range(count)]).astype(np.int32)
    return pairs, rng.uniform(-np.pi, np.pi, (count, COLS // 2)).astype(np.float32)


def forward(w: np.ndarray, pairs, angles, scale) -> np.ndarray:
    """What the quantiser stores, in f64: v = w . diag(s) . G_0 ... G_{K-1}."""
    v = w.astype(np.float64) * scale
    for k in range(len(pairs)):
        i, j = pairs[k, 0::2], pairs[k, 1::2]
        c, s = np.cos(angles[k].astype(np.float64)), np.sin(angles[k].astype(np.float64))
        x, y = v[:, i].copy(), v[:, j].copy()
        v[:, i], v[:, j] = c * x - s * y, s * x + c * y
    return v


def givens_encoding(parts: int, *extra):
    return encoding("plain", tiled("codes", RAD_DT_F32), table("t.pairs", RAD_DT_I32, parts * ROUNDS, COLS),
                    table("t.angle", RAD_DT_F32, parts * ROUNDS, COLS // 2), *extra, transform="givens")


def test_rotated_and_scaled_rows_decode_back_to_the_weight():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((5, COLS)).astype(np.float32)
    pairs, angles = rounds(rng, ROUNDS)
    scale = rng.uniform(0.5, 2, (1, COLS)).astype(np.float32)
    stored = forward(w, pairs, angles, scale).astype(np.float32)
    enc = givens_encoding(1, table("t.scale", RAD_DT_F32, 1, COLS))
    got = decode(enc, {"codes": stored, "t.pairs": pairs, "t.angle": angles, "t.scale": scale}, w.shape)
    np.testing.assert_allclose(got, w, rtol=0, atol=2e-6)
    assert not np.allclose(stored, w, atol=1e-2)  # the rotation did move the values


def test_each_part_is_undone_with_its_own_rounds_and_the_dense_form_agrees():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((6, COLS)).astype(np.float32)
    pairs, angles = rounds(rng, 2 * ROUNDS)  # part 0: rounds 0-2 over rows 0-1; part 1: 3-5 over rows 2-5
    stored = np.concatenate([forward(w[:2], pairs[:3], angles[:3], 1), forward(w[2:], pairs[3:], angles[3:], 1)])
    stored = stored.astype(np.float32)
    part = table("t.part", RAD_DT_I32, 1, 2)
    counts = np.array([[2, 4]], np.int32)
    got = decode(givens_encoding(2, part), {"codes": stored, "t.pairs": pairs, "t.angle": angles, "t.part": counts},
                 w.shape)
    np.testing.assert_allclose(got, w, rtol=0, atol=2e-6)
    # t.dense: each part's T^-1 = T^T (rotations alone), the rounds composed
    dense = np.concatenate([forward(np.eye(COLS), pairs[:3], angles[:3], 1).T,
                            forward(np.eye(COLS), pairs[3:], angles[3:], 1).T]).astype(np.float32)
    enc = encoding("plain", tiled("codes", RAD_DT_F32), part, table("t.dense", RAD_DT_F32, 2 * COLS, COLS),
                   transform="givens")
    got = decode(enc, {"codes": stored, "t.part": counts, "t.dense": dense}, w.shape)
    np.testing.assert_allclose(got, w, rtol=0, atol=2e-6)


@pytest.mark.parametrize("change, message", [
    (lambda p: p.__setitem__("t.pairs", np.tile(np.arange(COLS // 2, dtype=np.int32), (ROUNDS, 2))),
     "plane 't.pairs' row 0: a round's pairs must not share a column"),
    (lambda p: p["t.pairs"].__setitem__((0, 0), COLS), "plane 't.pairs' names a column outside the 8 columns"),
    (lambda p: p.__setitem__("t.part", np.array([[2, 2]], np.int32)),
     r"plane 't.part' must be positive row counts summing to the 5 rows, not \[2, 2\]"),
])
def test_malformed_rotation_planes_are_refused_naming_the_plane(change, message):
    rng = np.random.default_rng(5)
    pairs, angles = rounds(rng, 2 * ROUNDS)
    planes = {"codes": np.zeros((5, COLS), np.float32), "t.pairs": pairs[:ROUNDS], "t.angle": angles[:ROUNDS]}
    enc = givens_encoding(1)
    if "part" in message:
        enc = givens_encoding(2, table("t.part", RAD_DT_I32, 1, 2))
        planes.update({"t.pairs": pairs, "t.angle": angles})
    change(planes)
    with pytest.raises(ValueError, match=f"^blk.0: {message}"):
        decode(enc, planes, (5, COLS), "blk.0")


def test_the_encoding_needs_its_rotations_and_only_givens_takes_them():
    with pytest.raises(ValueError, match="transform 'givens' needs TABLE planes 't.pairs' and 't.angle', or 't.dense'"):
        decode(encoding("plain", tiled("codes", RAD_DT_F32), transform="givens"), {"codes": np.zeros((1, 4), np.float32)},
               (1, 4))
    with pytest.raises(ValueError, match="plane 't.angle' is not part of the 'plain' scheme"):
        decode(encoding("plain", tiled("codes", RAD_DT_F32), table("t.angle", RAD_DT_F32, 1, 2)),
               {"codes": np.zeros((1, 4), np.float32), "t.angle": np.zeros((1, 2), np.float32)}, (1, 4))


def test_a_weight_rotated_by_parts_takes_no_row_cut_and_one_part_does():
    single, parted = givens_encoding(1), givens_encoding(2, table("t.part", RAD_DT_I32, 1, 2))
    check_cut(single, (6, COLS), ROWS, 0, 3)
    check_cut(parted, (6, COLS), ROWS, 0, 6)
    with pytest.raises(ValueError, match=r"rows \[0, 3\) cut a 'givens' weight whose rotations go by parts"):
        check_cut(parted, (6, COLS), ROWS, 0, 3)
