"""libr4d's host fused rows on the GGUF block types (rows_kquants.py, r4d_kquants.c) at M <= 16:
rmsnorm_gemm2 (the attention's norm, q and k), rmsnorm_gemm2_silu_mul (the FFN's norm, gate, up and
silu * up), the two GEMVs of each over both weights' rows in one parallel region, and gemm_add (a
projection and the residual add). Each must leave every operand with the bits the chain of libr4d's
own rows leaves (docs/OPS.md: a fused row equals its library's chain), at every M of the decode
band, with row counts that cut the threads' shares and the boundary between the two weights
mid-chunk."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from radiance.abi import RAD_E_INVALID, RAD_OK
from radiance.weights import formats
from test_libr4d_gemm import r4d_row
from test_libr4d_kquants import TYPES, columns_for, gguf_weight
from test_libr4d_support import activations, launch, registry, row_of  # noqa: F401 (registry is a fixture)

EPS = 1e-5


def fused_row(reg, qtype, op="rmsnorm_gemm2_silu_mul"):
    return row_of(reg, op, "libr4d", f"r4d_{op}_{qtype.name.lower()}")


def norm_weight(k, seed):
    """The norm's weight as the container holds it: a plain f32 [1, k] tensor"""
    from test_libr4d_support import weight_planes
    values = np.random.default_rng(seed).uniform(0.5, 1.5, (1, k)).astype(np.float32)
    return weight_planes(formats.plain("f32"), {"codes": values}, (1, k)), values


def chain(reg, qtype, x, norm, wg, wu, m, k, n, aq, n2=None, silu=True):
    """normed, gate, up by libr4d's rmsnorm, its gemm rows of this band and its silu_mul (where
    `silu`), one launch each; up has n2 columns (else n)"""
    n2 = n2 or n
    normed, gate, up = (np.full((m, width), np.nan, np.float32) for width in (k, n, n2))
    assert launch(row_of(reg, "rmsnorm", "libr4d"), [x, None, normed], {"M": m, "n": k, "eps": EPS, "dtype": "f32"},
                  {1: norm}) == RAD_OK
    for weight, y, rows in ((wg, gate, n), (wu, up, n2)):
        geometry = {"M": m, "N": rows, "K": k, "wdtype": qtype.name.lower(), "dtype": "f32", "split_k": 1, "aq": aq}
        gemv = r4d_row(reg, m, geometry)
        assert gemv.name == f"r4d_gemv_{qtype.name.lower()}"
        assert launch(gemv, [normed, None, y], geometry, {1: weight}) == RAD_OK
    if silu:
        assert launch(row_of(reg, "silu_mul", "libr4d"), [gate, up, gate], {"M": m, "n": n, "dtype": "f32"}) == RAD_OK
    return normed, gate, up


def fused(reg, qtype, x, norm, wg, wu, m, k, n, aq, n2=None, op="rmsnorm_gemm2_silu_mul"):
    n2 = n2 or n
    normed, gate, up = (np.full((m, width), np.nan, np.float32) for width in (k, n, n2))
    width = "n.0" if op == "rmsnorm_gemm2_silu_mul" else "n"
    geometry = {"M": m, width: k, "eps": EPS, "K": k, "N.1": n, "N.2": n2, "wdtype": qtype.name.lower(),
                "dtype": "f32", "aq": aq}
    status = launch(fused_row(reg, qtype, op), [x, None, normed, None, gate, None, up], geometry,
                    {1: norm, 3: wg, 5: wu})
    assert status == RAD_OK
    return normed, gate, up


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("n", [98, 1536])
@pytest.mark.parametrize("aq", [16, 0])
def test_the_fused_ffn_front_leaves_the_chain_s_bits(registry, qtype, m, n, aq):
    k = columns_for(qtype)
    wg, _ = gguf_weight(qtype, n, k, seed=n + m)
    wu, _ = gguf_weight(qtype, n, k, seed=n + m + 1)
    norm, _ = norm_weight(k, seed=m)
    x = activations(m, k, seed=m + n)
    expected = chain(registry, qtype, x, norm, wg, wu, m, k, n, aq)
    got = fused(registry, qtype, x, norm, wg, wu, m, k, n, aq)
    for name, want, have in zip(("normed", "gate", "up"), expected, got):
        assert np.isfinite(have).all(), name
        assert np.array_equal(want, have), (name, float(np.abs(want - have).max()))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("aq", [16, 0])
def test_the_fused_attention_norm_q_and_k_leave_the_chain_s_bits(registry, qtype, m, aq):
    """rmsnorm_gemm2: q of 576 rows and k of 192 (SmolLM2's), or 98 and 50 (each weight's shares cut
    short); k's rows start mid-chunk of the shared list when q's count is not a multiple of 16"""
    k = columns_for(qtype)
    for nq, nk in ((576, 192), (98, 50)):
        wq, _ = gguf_weight(qtype, nq, k, seed=nq + m)
        wk, _ = gguf_weight(qtype, nk, k, seed=nk + m)
        norm, _ = norm_weight(k, seed=m + 2)
        x = activations(m, k, seed=m + nq)
        expected = chain(registry, qtype, x, norm, wq, wk, m, k, nq, aq, n2=nk, silu=False)
        got = fused(registry, qtype, x, norm, wq, wk, m, k, nq, aq, n2=nk, op="rmsnorm_gemm2")
        for name, want, have in zip(("normed", "q", "k"), expected, got):
            assert np.isfinite(have).all(), name
            assert np.array_equal(want, have), (name, nq, float(np.abs(want - have).max()))


def test_the_fused_row_serves_the_decode_band_only_and_refuses_mismatched_weights(registry):
    row = fused_row(registry, Q.Q5_0)
    assert row.info.replaces == ("rmsnorm(x,norm,normed)+gemm(normed,wg,gate)+gemm(normed,wu,up)"
                                 "+silu_mul(gate,up,gate)")
    assert "M<=16" in row.info.shape
    k, n = 576, 64
    wg, _ = gguf_weight(Q.Q5_0, n, k, seed=1)
    wu, _ = gguf_weight(Q.Q5_0, n + 32, k, seed=2)  # up's rows are not N.2
    norm, _ = norm_weight(k, seed=3)
    normed, gate, up = np.zeros((1, k), np.float32), np.zeros((1, n), np.float32), np.zeros((1, n), np.float32)
    geometry = {"M": 1, "n.0": k, "eps": EPS, "K": k, "N.1": n, "N.2": n, "wdtype": "q5_0", "dtype": "f32"}
    status = launch(row, [activations(1, k, 4), None, normed, None, gate, None, up], geometry, {1: norm, 3: wg, 5: wu})
    assert status == RAD_E_INVALID


def gemm_add_row(reg, qtype):
    return row_of(reg, "gemm_add", "libr4d", f"r4d_gemm_add_{qtype.name.lower()}")


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("aq", [16, 0])
def test_the_projection_with_the_residual_add_leaves_the_chain_s_bits(registry, qtype, m, aq):
    """gemm_add (the o projection's at TP 1, which leaves the FFN's norm to the row above): y and
    the residual as libr4d's GEMV row, then its add row, leave them"""
    k, n = columns_for(qtype), 98
    weight, _ = gguf_weight(qtype, n, k, seed=m + 7)
    x = activations(m, k, seed=m)
    residual = activations(m, n, seed=m + 1)
    geometry = {"M": m, "N": n, "K": k, "wdtype": qtype.name.lower(), "dtype": "f32", "split_k": 1, "aq": aq}
    want_y, want_residual = np.full((m, n), np.nan, np.float32), residual.copy()
    assert launch(r4d_row(registry, m, geometry), [x, None, want_y], geometry, {1: weight}) == RAD_OK
    assert launch(row_of(registry, "add", "libr4d"), [want_residual, want_y, want_residual],
                  {"M": m, "n": n, "dtype": "f32"}) == RAD_OK
    y, got_residual = np.full((m, n), np.nan, np.float32), residual.copy()
    assert launch(gemm_add_row(registry, qtype), [x, None, y, got_residual], {**geometry, "n": n}, {1: weight}) == RAD_OK
    assert np.array_equal(y, want_y) and np.array_equal(got_residual, want_residual)
    assert not np.array_equal(got_residual, residual)
