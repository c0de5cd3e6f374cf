"""gemm_tma.cu in clusters (device_tensor_cores.TmaCut's cluster_m x cluster_n: blocks down M share w's
tile, across N x's, each loading its share and TMA multicasting it to its peers) against the same
kernel unclustered (UNCLUSTERED, the same tile, ring and MMA order): the plain entry, the grouped q, k,
v form and the SwiGLU form must give the unclustered launches' bits, tails included (M and N that
leave a cluster's second block past them: it loads its shares for its peers and stores nothing).
On a fake sm_90 always (the plans: grids in clusters, the maps' boxes a block's share); on a card
where a Hopper is visible, the kernel itself (tests/test_gemm_tma_on_host.py's model runs one block at
a time, so a cluster's loads into its peers and their releases are checked here alone)."""

import numpy as np
import pytest

from test_gemm_tma_group import DEVICE, drawn, hopper  # noqa: F401  (the fake's and the card's fixture)
from tma_group_launches import Case, issue, tc

CLUSTER_CUTS = [str(cut) for cut in tc.TMA_CUTS if cut.cluster > 1]
UNCLUSTERED = tc.TmaCut.parse("128,64,3")  # the clustered cuts' tile and ring
# M 200 and 300: a cluster of two down M with its second block past M; N 100 and 4160: a part tile,
# and w's rows a block's share of the tile cuts across; K 64 (one stage), 4096; the 8B q, k, v on a card
SHAPES = [(200, (1024, 4160, 100), 64), (300, (100, 1024), 4096)]
EIGHT_B = [(2048, (4096, 1024, 1024), 4096)]


def outputs(hopper, x, weights, cut, swiglu, monkeypatch):  # noqa: F811
    """(the grouped or SwiGLU form's outputs, the plain launches') in `cut`."""
    monkeypatch.setattr(tc, "TMA_CUT", cut)
    monkeypatch.setattr(tc, "SWIGLU_CUT", cut)
    case = Case(hopper, x, weights, swiglu=swiglu)
    grid = case.fused_steps()[-1].grid
    columns = cut.cols // 2 if swiglu else cut.cols
    assert grid == (sum(cut.blocks_for(case.m, n, columns) for n in case.n[:1 if swiglu else None]), 1, 1)
    assert grid[0] % cut.cluster == 0
    issue(hopper.stream, case.fused_steps())
    issue(hopper.stream, case.plain_chain())
    return case.read(case.fused), case.read(case.plain)


def same_bits(got, want) -> bool:
    return all(np.isfinite(g).all() and np.array_equal(g.view(np.uint32), w.view(np.uint32)) for g, w in zip(got, want))


def test_the_cluster_cuts_are_offered_and_read_in_clusters():
    assert [str(tc.TmaCut.parse(text)) for text in CLUSTER_CUTS] == CLUSTER_CUTS
    assert {(tc.TmaCut.parse(text).cluster_m, tc.TmaCut.parse(text).cluster_n) for text in CLUSTER_CUTS} == {(2, 1), (1, 2), (2, 2)}


@pytest.mark.parametrize("cut", CLUSTER_CUTS)
@pytest.mark.parametrize("m,rows,k", SHAPES + EIGHT_B)
def test_a_cluster_cut_gives_the_unclustered_bits(hopper, monkeypatch, cut, m, rows, k):  # noqa: F811
    if m > 1024 and hopper.device is not DEVICE:
        pytest.skip("the 8B shapes on the card alone (the fake's numpy would take minutes)")
    x, weights = drawn(m, rows, k, m + k)
    grouped, plain = outputs(hopper, x, weights, tc.TmaCut.parse(cut), False, monkeypatch)
    want_grouped, want_plain = outputs(hopper, x, weights, UNCLUSTERED, False, monkeypatch)
    assert same_bits(plain, want_plain), (cut, m, rows, k)
    assert same_bits(grouped, want_grouped), (cut, m, rows, k)


@pytest.mark.parametrize("cut", CLUSTER_CUTS)
@pytest.mark.parametrize("m,n,k", [(200, 4160, 64), (300, 100, 4096), (2048, 14336, 4096)])
def test_a_cluster_cuts_swiglu_gives_the_unclustered_bits(hopper, monkeypatch, cut, m, n, k):  # noqa: F811
    if m > 1024 and hopper.device is not DEVICE:
        pytest.skip("the 8B shapes on the card alone")
    x, weights = drawn(m, (n, n), k, m + n)
    (gate, up), plain = outputs(hopper, x, weights, tc.TmaCut.parse(cut), True, monkeypatch)
    (want_gate, want_up), want_plain = outputs(hopper, x, weights, UNCLUSTERED, True, monkeypatch)
    assert same_bits([gate, up], [want_gate, want_up]), (cut, m, n, k)
    assert same_bits(plain, want_plain), (cut, m, n, k)
