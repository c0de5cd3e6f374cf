"""gemm_tma.cu's grouped (r4d_tma_gemm_bf16_group) and SwiGLU (r4d_tma_gemm_bf16_swiglu) entries with
r4d_tma_maps_group, launched raw over one x's bf16 rows as the fused prefill rows plan them
(device_prefill_rows.group_steps; tests/tma_group_launches.py), against the launches they stand for:
r4d_tma_maps and r4d_tma_gemm_bf16 unsplit a weight, and for SwiGLU r4d_silu_mul_dev after them. The
outputs must be those launches' bits, and within f32 summation of float64 numpy's product. On a fake
sm_90 (tests/fixtures/r4d_fake_kernels.py's forms) always; on a card where one is visible (Hopper: the
8B shapes at M = 2048, and tails). The CUDA itself on the host: tests/test_gemm_tma_on_host.py."""

import numpy as np
import pytest

from device_batch_support import nvidia_fake
from radiance.engine.running.device_stream import EngineStream
from test_device_rows_support import Card, card
from tma_group_launches import Case, issue, tc

DEVICE, STREAM, WHY = card()
# the brief's tails: M 200 (a row tile's tail), n 1024, 4096 + 64 and 100, K 4096 and 64
TAILS = [(200, (1024, 4160, 100), 64), (200, (100, 1024), 4096)]
EIGHT_B = [(2048, (4096, 1024, 1024), 4096)]
SWIGLU_TAILS = [(200, 4160, 64), (200, 100, 4096)]


@pytest.fixture(scope="module", params=["fake", "card"])
def hopper(request):
    if request.param == "fake":
        device = nvidia_fake("sm_90")
        on_card = Card(device, EngineStream(device))
        yield on_card
        on_card.close()
        device.close()
        return
    if DEVICE is None or DEVICE.target != "sm_90":
        pytest.skip(f"no Hopper card: {WHY or DEVICE.target}")
    on_card = Card(DEVICE, STREAM)
    yield on_card
    on_card.close()


def drawn(m, rows, k, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    return x, [(rng.standard_normal((n, k)) * 0.02).astype(np.float32) for n in rows]


def near_numpy(y, x, w, rows) -> float:
    """max |y - ref| / max |ref| on `rows`, ref float64 of the bf16 values."""
    from tma_group_launches import bf16_codes
    import ml_dtypes
    xb = bf16_codes(x[rows]).view(ml_dtypes.bfloat16).astype(np.float64)
    wb = bf16_codes(w).view(ml_dtypes.bfloat16).astype(np.float64)
    ref = xb @ wb.T
    return float(np.abs(y[rows] - ref).max() / np.abs(ref).max())


def ran(hopper, case):
    issue(hopper.stream, case.fused_steps())
    issue(hopper.stream, case.plain_chain())
    return case.read(case.fused), case.read(case.plain)


def sample(m):
    return np.unique(np.linspace(0, m - 1, 16).astype(int))


@pytest.mark.parametrize("m,rows,k", TAILS + EIGHT_B)
def test_the_grouped_entry_gives_each_weights_plain_bits(hopper, m, rows, k):
    if m > 1024 and hopper.device is not DEVICE:
        pytest.skip("the 8B shapes on the card alone (the fake's numpy would take minutes)")
    x, weights = drawn(m, rows, k, m + k)
    case = Case(hopper, x, weights)
    grid, _ = case.fused_steps()[-1].grid, None
    cut = tc.TMA_CUT
    assert grid[0] == sum(-(-n // cut.cols) for n in rows) * -(-m // cut.rows)
    fused, plain = ran(hopper, case)
    for y, want, w in zip(fused, plain, weights):
        assert np.isfinite(y).all(), (m, rows, k)
        assert np.array_equal(y.view(np.uint32), want.view(np.uint32)), (m, rows, k, w.shape)
        assert near_numpy(y, x, w, sample(m)) <= 1e-5, (m, rows, k, w.shape)


@pytest.mark.parametrize("m,n,k", SWIGLU_TAILS + [(2048, 14336, 4096)])
def test_the_swiglu_entry_gives_the_unfused_chains_bits(hopper, m, n, k):
    if m > 1024 and hopper.device is not DEVICE:
        pytest.skip("the 8B shapes on the card alone")
    x, (gate_w, up_w) = drawn(m, (n, n), k, m + n)
    case = Case(hopper, x, [gate_w, up_w], swiglu=True)
    (gate, up), (want_gate, want_up) = ran(hopper, case)
    assert np.isfinite(gate).all() and np.isfinite(up).all()
    assert np.array_equal(up.view(np.uint32), want_up.view(np.uint32))
    assert np.array_equal(gate.view(np.uint32), want_gate.view(np.uint32))
    assert near_numpy(up, x, up_w, sample(m)) <= 1e-5
    rows = sample(m)
    g = (x[rows].astype(np.float64) @ gate_w.astype(np.float64).T)  # loose: silu_mul of unrounded sums
    expect = g / (1 + np.exp(-g)) * (x[rows].astype(np.float64) @ up_w.astype(np.float64).T)
    assert np.abs(gate[rows] - expect).max() <= 2e-2 * np.abs(expect).max()


def test_the_grouped_forms_refuse_a_cut_without_them(monkeypatch):
    """Only a cut of a producer warp and 112 or 128 columns builds them: elsewhere the plan says so."""
    monkeypatch.setattr(tc, "TMA_CUT", tc.TmaCut.parse("256,32,5"))
    with pytest.raises(ValueError, match="no grouped or SwiGLU forms"):
        tc.group_grid(2048, (4096, 1024, 1024))
    assert not tc.groups_serve() and tc.swiglu_grid(2048, 14336)  # SwiGLU's own cut still has its form
    monkeypatch.setattr(tc, "SWIGLU_CUT", tc.TmaCut.parse("256,32,5"))
    with pytest.raises(ValueError, match="no grouped or SwiGLU forms"):
        tc.swiglu_grid(2048, 14336)
    monkeypatch.setattr(tc, "TMA_CUT", tc.TMA_CUTS[0])
    monkeypatch.setattr(tc, "SWIGLU_CUT", tc.TmaCut.parse("112,128,2"))
    assert tc.groups_serve()
    with pytest.raises(ValueError, match="1 to 3 weights"):
        tc.group_grid(2048, (1024,) * 4)
    # 1024, 4160 and 100 columns in tiles of 128; SwiGLU's 4160 in tiles of 56 of each weight
    assert tc.group_grid(200, (1024, 4160, 100)) == ((2 * (8 + 33 + 1), 1, 1), (288, 1, 1))
    assert tc.swiglu_grid(200, 4160) == ((2 * 75, 1, 1), (288, 1, 1))
    monkeypatch.setattr(tc, "SWIGLU_CUT", tc.TmaCut.parse("128,64,3"))
    assert tc.swiglu_grid(200, 4160) == ((2 * 65, 1, 1), (288, 1, 1))
