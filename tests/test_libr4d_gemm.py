"""libr4d's gemm and embedding rows against libref's on SmolLM2-135M's geometries: every linear
weight of a layer at Q4_1, the tied 49152x576 Q8_0 lm head, plain f32/f16/bf16; M = 1 (the decode
GEMV band) and M = 37 (the prefill GEMM band); both activation paths of the GEMV."""

import numpy as np
import pytest

from radiance.engine.selection.bands import resolve
from test_libr4d_support import (  # noqa: F401 (registry is a fixture)
    HIDDEN, LINEAR, PREFILL_M, TOL_F32, TOLERANCE, VOCAB, activations, launch, make_weight, registry, rel_err,
    row_of,
)

_REFERENCE: dict = {}


def r4d_row(registry, m, geometry):
    """The libr4d row the engine's selection gives this band."""
    rows = [row for row in registry.rows_for("gemm") if row.plugin.name == "libr4d"]
    resolution = resolve("gemm", registry.ops["gemm"].schema, rows, geometry, {}, 1, 256)
    return resolution.band_for(m).row


def reference(registry, key, x, weight, n):
    if key not in _REFERENCE:
        y = np.zeros((x.shape[0], n), np.float32)
        geometry = {"M": x.shape[0], "N": n, "K": x.shape[1], "dtype": "f32"}
        assert launch(row_of(registry, "gemm", "libref"), [x, None, y], geometry, {1: weight}) == 0
        _REFERENCE[key] = y
    return _REFERENCE[key]


def run_gemm(registry, fmt, n, k, m, seed, **extra):
    weight = make_weight(fmt, n, k, seed)
    x = activations(m, k, seed + 1)
    geometry = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1, **extra}
    row = r4d_row(registry, m, geometry)
    y = np.full((m, n), np.nan, np.float32)
    assert launch(row, [x, None, y], geometry, {1: weight}) == 0, row.name
    return row, y, reference(registry, (fmt, n, k, m, seed), x, weight, n)


@pytest.mark.parametrize("name,n,k", LINEAR, ids=[item[0] for item in LINEAR])
@pytest.mark.parametrize("m", [1, PREFILL_M])
def test_q4_1_linear_weights(registry, name, n, k, m):
    """The default of each band: the decode GEMV with int16 activations, the prefill GEMM in f32."""
    row, y, ref = run_gemm(registry, "q4_1", n, k, m, seed=n + k)
    assert row.name == ("r4d_gemv_q4_1" if m == 1 else "r4d_gemm_q4_1")
    tolerance = TOLERANCE[16] if m == 1 else TOL_F32
    assert rel_err(y, ref) <= tolerance, (row.name, rel_err(y, ref))


@pytest.mark.parametrize("name,n,k", LINEAR, ids=[item[0] for item in LINEAR])
@pytest.mark.parametrize("aq", [0, 8, 16])
def test_q4_1_decode_activation_paths(registry, name, n, k, aq):
    row, y, ref = run_gemm(registry, "q4_1", n, k, 1, seed=n + k, aq=aq)
    assert rel_err(y, ref) <= TOLERANCE[aq], (aq, rel_err(y, ref))


@pytest.mark.parametrize("m", [1, 3, 4, 5, 16, 17, PREFILL_M])
def test_q4_1_every_row_count_of_both_bands(registry, m):
    for aq in (0, 8, 16):
        row, y, ref = run_gemm(registry, "q4_1", 192, 576, m, seed=5, aq=aq)
        tolerance = TOLERANCE[aq] if row.name.startswith("r4d_gemv") else TOL_F32
        assert rel_err(y, ref) <= tolerance, (m, aq, rel_err(y, ref))


@pytest.mark.parametrize("m,aq", [(1, 16), (1, 8), (1, 0), (PREFILL_M, 16), (PREFILL_M, 0)])
def test_q8_0_lm_head(registry, m, aq):
    """Both bands take `aq`: the prefill GEMM's int16 path (16, its default on AVX2) is held to the
    GEMV's int16 tolerance, its f32 panels (0) to the f32 one."""
    row, y, ref = run_gemm(registry, "q8_0", VOCAB, HIDDEN, m, seed=11, aq=aq)
    assert row.name == ("r4d_gemv_q8_0" if m == 1 else "r4d_gemm_q8_0")
    assert rel_err(y, ref) <= TOLERANCE[aq], (row.name, rel_err(y, ref))
    if aq != 8:  # what greedy sampling reads
        np.testing.assert_array_equal(np.argmax(y, axis=1), np.argmax(ref, axis=1))


@pytest.mark.parametrize("name,n,k", LINEAR + [("odd", 97, HIDDEN)], ids=[item[0] for item in LINEAR] + ["odd"])
@pytest.mark.parametrize("m", [17, PREFILL_M, 130])
def test_q8_0_prefill_gemm_on_every_linear_shape(registry, name, n, k, m):
    """The prefill GEMM's default on q8_0 weights (int16 activations on AVX2 builds, f32 panels on
    the others) within the int16 tolerance, every row and column written (tiles of 4 x 2 and their
    tails: 17, 37 and 130 rows, an odd N)."""
    row, y, ref = run_gemm(registry, "q8_0", n, k, m, seed=n + k + m)
    assert row.name == "r4d_gemm_q8_0" and not np.isnan(y).any()
    assert rel_err(y, ref) <= TOLERANCE[16], (name, m, rel_err(y, ref))


@pytest.mark.parametrize("fmt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("m,k", [(1, 576), (PREFILL_M, 576), (2, 100), (PREFILL_M, 100)])
def test_plain_weights(registry, fmt, m, k):
    row, y, ref = run_gemm(registry, fmt, 96, k, m, seed=3)
    assert row.name.endswith("_plain")
    assert rel_err(y, ref) <= TOL_F32, rel_err(y, ref)


@pytest.mark.parametrize("fmt,vocab", [("q8_0", VOCAB), ("q4_1", 4096), ("f16", 1000), ("bf16", 1000), ("f32", 1000)])
def test_embedding_rows_are_exactly_libref_s(registry, fmt, vocab):
    table = make_weight(fmt, vocab, HIDDEN, seed=21)
    ids = np.random.default_rng(0).integers(0, vocab, PREFILL_M).astype(np.int32)
    ids[:3] = [0, vocab - 1, 0]
    geometry = {"M": PREFILL_M, "n": HIDDEN, "vocab": vocab, "wdtype": fmt, "dtype": "f32"}
    out = {}
    for library in ("libr4d", "libref"):
        y = np.full((PREFILL_M + 2, HIDDEN), 7.0, np.float32)  # a buffer longer than the step
        assert launch(row_of(registry, "embedding", library), [ids, None, y], geometry, {1: table}) == 0
        out[library] = y
    np.testing.assert_array_equal(out["libr4d"], out["libref"])
    assert (out["libr4d"][PREFILL_M:] == 7.0).all()


def test_an_id_outside_the_table_is_refused(registry):
    table = make_weight("q8_0", 64, 64, seed=1)
    y = np.zeros((2, 64), np.float32)
    geometry = {"M": 2, "n": 64, "vocab": 64, "wdtype": "q8_0", "dtype": "f32"}
    assert launch(row_of(registry, "embedding", "libr4d"), [np.array([1, 64], np.int32), None, y], geometry,
                  {1: table}) != 0
