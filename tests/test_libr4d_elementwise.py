"""libr4d's rmsnorm, add, silu_mul, take_rows and sample rows against libref's: the same bits (the
same tokens for sample) on SmolLM2-135M's widths, at M = 1 and a prefill M, in place where the
llama graph runs them in place."""

import numpy as np
import pytest

from test_libr4d_support import (  # noqa: F401 (registry is a fixture)
    FFN, HIDDEN, PREFILL_M, VOCAB, launch, make_weight, registry, row_of,
)

LIBRARIES = ("libr4d", "libref")


def both(registry, op, make_operands, params, weights=None):
    """Run libr4d's and libref's row on fresh copies of the same operands."""
    results = {}
    for library in LIBRARIES:
        operands = make_operands()
        assert launch(row_of(registry, op, library), operands, params, weights) == 0, library
        results[library] = operands
    return results["libr4d"], results["libref"]


def residual_stream(m, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, n)).astype(np.float32) * rng.uniform(0.1, 30)
    x[:, rng.choice(n, 3, replace=False)] *= 20  # outlier channels
    return x


@pytest.mark.parametrize("m", [1, 8, 9, PREFILL_M])
@pytest.mark.parametrize("wdtype", ["f32", "bf16"])
def test_rmsnorm(registry, m, wdtype):
    x = residual_stream(m + 2, HIDDEN, m)
    weight = make_weight(wdtype, 1, HIDDEN, seed=4)
    params = {"M": m, "n": HIDDEN, "eps": 1e-5, "dtype": "f32"}
    ours, ref = both(registry, "rmsnorm", lambda: [x, None, np.full((m + 2, HIDDEN), 3.0, np.float32)], params,
                     {1: weight})
    np.testing.assert_array_equal(ours[2], ref[2])
    assert (ours[2][m:] == 3.0).all()


@pytest.mark.parametrize("m", [1, PREFILL_M])
def test_add_in_place(registry, m):
    h, t = residual_stream(m, HIDDEN, 1), residual_stream(m, HIDDEN, 2)
    params = {"M": m, "n": HIDDEN, "dtype": "f32"}

    def operands():
        a = h.copy()
        return [a, t.copy(), a]  # the residual add: y is a

    ours, ref = both(registry, "add", operands, params)
    np.testing.assert_array_equal(ours[0], ref[0])
    np.testing.assert_array_equal(ours[0], h + t)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # libref's exp(800)
@pytest.mark.parametrize("m", [1, PREFILL_M])
def test_silu_mul_in_place(registry, m):
    rng = np.random.default_rng(m)
    gate = (rng.standard_normal((m, FFN)) * 4).astype(np.float32)
    gate[0, :6] = [0.0, -0.0, 90.0, -90.0, 1e-30, -800.0]
    up = rng.standard_normal((m, FFN)).astype(np.float32)
    params = {"M": m, "n": FFN, "dtype": "f32"}

    def operands():
        g = gate.copy()
        return [g, up.copy(), g]  # the llama graph writes y over gate

    ours, ref = both(registry, "silu_mul", operands, params)
    np.testing.assert_array_equal(ours[0], ref[0])


def test_take_rows(registry):
    x = residual_stream(PREFILL_M, HIDDEN, 3)
    index = np.array([36, 0, 17, 17], np.int32)
    params = {"M": 4, "n": HIDDEN, "dtype": "f32"}
    ours, ref = both(registry, "take_rows", lambda: [x, index, np.zeros((6, HIDDEN), np.float32)], params)
    np.testing.assert_array_equal(ours[2], ref[2])
    np.testing.assert_array_equal(ours[2][:4], x[index])


def logits(m, seed, spread=4.0, ties=False):
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal((m, VOCAB)) * spread).astype(np.float32)
    values[:, rng.choice(VOCAB, 50, replace=False)] += 12  # a few likely tokens
    if ties:
        values = np.round(values)
    return values


SAMPLING = [  # (temperature, top_k, top_p)
    (0.0, 0, 1.0), (0.7, 0, 1.0), (0.7, 0, 0.9), (1.0, 40, 1.0), (1.3, 40, 0.95), (0.3, 1, 1.0),
    (2.0, 0, 0.5), (1.0, VOCAB, 0.99), (0.8, 5, 0.3), (5.0, 0, 1.0),
]


@pytest.mark.parametrize("ties", [False, True])
def test_sample_draws_libref_s_tokens(registry, ties):
    m = len(SAMPLING) * 3
    values = logits(m, seed=int(ties), ties=ties)
    temperature = np.array([t for t, _, _ in SAMPLING] * 3, np.float32)
    top_k = np.array([k for _, k, _ in SAMPLING] * 3, np.int32)
    top_p = np.array([p for _, _, p in SAMPLING] * 3, np.float32)
    rng = np.stack([np.arange(m, dtype=np.uint64) * 7919 + 1, np.arange(m, dtype=np.uint64) % 5], axis=1)
    params = {"M": m, "vocab": VOCAB}
    ours, ref = both(registry, "sample", lambda: [values, temperature, top_k, top_p, rng,
                                                  np.full(m + 1, -1, np.int32)], params)
    np.testing.assert_array_equal(ours[5], ref[5])
    assert ours[5][m] == -1


def test_sample_over_many_seeds_and_steps(registry):
    values = logits(1, seed=7, spread=2.0)
    for seed in range(40):
        for temperature, top_k, top_p in ((1.0, 0, 1.0), (0.9, 0, 0.8), (1.5, 50, 0.9)):
            operands = lambda: [values, np.array([temperature], np.float32), np.array([top_k], np.int32),
                                np.array([top_p], np.float32), np.array([[seed, seed * 3]], np.uint64),
                                np.zeros(1, np.int32)]
            ours, ref = both(registry, "sample", operands, {"M": 1, "vocab": VOCAB})
            assert ours[5][0] == ref[5][0], (seed, temperature, top_k, top_p)


def test_greedy_takes_the_first_maximum_and_survives_odd_logits(registry):
    values = np.zeros((3, VOCAB), np.float32)
    values[0, [10, 20]] = 5.0
    values[1, :] = -np.inf
    values[1, 77] = 0.0
    values[2, 5] = np.nan  # libref: argmax returns the NaN's index; so must we
    hot = values.copy()
    hot[0, 3] = np.inf
    params = {"M": 3, "vocab": VOCAB}
    operands = lambda: [values, np.zeros(3, np.float32), np.zeros(3, np.int32), np.ones(3, np.float32),
                        np.zeros((3, 2), np.uint64), np.zeros(3, np.int32)]
    ours, ref = both(registry, "sample", operands, params)
    np.testing.assert_array_equal(ours[5], ref[5])
    assert list(ours[5]) == [10, 77, 5]
    drawn = lambda: [hot, np.ones(3, np.float32), np.zeros(3, np.int32), np.full(3, 0.9, np.float32),
                     np.ones((3, 2), np.uint64), np.zeros(3, np.int32)]
    with np.errstate(invalid="ignore"):
        ours, ref = both(registry, "sample", drawn, params)
    np.testing.assert_array_equal(ours[5], ref[5])


@pytest.mark.parametrize("m", [1, PREFILL_M])
def test_native_add_rmsnorm_is_libref_s_add_then_rmsnorm(registry, m):
    """rows.add_rmsnorm: the tail libr4d offers the fused all_reduce + add + rmsnorm row."""
    library = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    function = library.module.rows.add_rmsnorm(library.module._STATE["native"])
    residual, x = residual_stream(m, HIDDEN, 5), residual_stream(m, HIDDEN, 6)
    w = np.random.default_rng(7).uniform(0.5, 1.5, HIDDEN).astype(np.float32)
    ours_r, ours_y = residual.copy(), np.zeros((m, HIDDEN), np.float32)
    for _ in range(2):  # the second call reuses the heads it keeps per set of arrays
        ours_r[...] = residual
        assert function(ours_r, x, w, ours_y, m, HIDDEN, 1e-5) == 0
    ref_r, ref_y = residual.copy(), np.zeros((m, HIDDEN), np.float32)
    assert launch(row_of(registry, "add", "libref"), [ref_r, x, ref_r], {"M": m, "n": HIDDEN, "dtype": "f32"}) == 0
    from radiance.weights import formats
    from test_libr4d_support import weight_planes
    norm = weight_planes(formats.plain("f32"), {"codes": w[None, :]}, (1, HIDDEN))
    assert launch(row_of(registry, "rmsnorm", "libref"), [ref_r, None, ref_y],
                  {"M": m, "n": HIDDEN, "eps": 1e-5, "dtype": "f32"}, {1: norm}) == 0
    np.testing.assert_array_equal(ours_r, ref_r)
    np.testing.assert_array_equal(ours_y, ref_y)


@pytest.mark.parametrize("m", [1, 9, PREFILL_M])
@pytest.mark.parametrize("wdtype", ["f32", "bf16"])
def test_fused_add_rmsnorm_row_is_libref_s_chain(registry, m, wdtype):
    """r4d_add_rmsnorm (what serves add + rmsnorm at TP 1, its collectives elided) against libref's
    chain row: the same residual and the same normed rows, rows past M untouched."""
    residual, x = residual_stream(m + 2, HIDDEN, 11), residual_stream(m + 2, HIDDEN, 12)
    weight = make_weight(wdtype, 1, HIDDEN, seed=13)
    params = {"M": m, "n": HIDDEN, "eps": 1e-5, "dtype": "f32"}
    ours, ref = both(registry, "add_rmsnorm", lambda: [residual.copy(), x, None,
                                                       np.full((m + 2, HIDDEN), 3.0, np.float32)], params, {2: weight})
    np.testing.assert_array_equal(ours[0], ref[0])
    np.testing.assert_array_equal(ours[3], ref[3])
    np.testing.assert_array_equal(ours[0][m:], residual[m:])
    assert (ours[3][m:] == 3.0).all() and not np.array_equal(ours[0][:m], residual[:m])


def test_sample_when_the_draw_rounds_to_one_after_a_top_p_cut(registry, monkeypatch):
    """f32(u) == 1 (u > 1 - 2**-25): no running sum exceeds u * total, and libref takes the last
    token its top_p cut kept; so must libr4d, whose order is only the head of libref's."""
    import sys

    for library in LIBRARIES:
        package = row_of(registry, "sample", library).plugin.module.__name__
        monkeypatch.setattr(sys.modules[f"{package}.sample"], "uniform", lambda seed, step: 1.0 - 2.0 ** -30)
    values = np.full((1, VOCAB), -100.0, np.float32)
    values[0, :3] = [10.0, 9.5, 9.0]  # the head: three values within 20 of the maximum
    operands = lambda: [values, np.ones(1, np.float32), np.zeros(1, np.int32), np.full(1, 0.9999, np.float32),
                        np.ones((1, 2), np.uint64), np.zeros(1, np.int32)]
    ours, ref = both(registry, "sample", operands, {"M": 1, "vocab": VOCAB})
    assert ref[5][0] == 2
    assert ours[5][0] == ref[5][0]
