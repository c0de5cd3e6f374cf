"""The fused rows above the decode band (device_prefill_rows.py) on a real card, at Llama-3-8B's shapes:
on Hopper the norm with its bf16 rows, the maps and one grouped (q, k, v) or SwiGLU (gate, up, silu *
mul) launch of gemm_tma.cu; against the same rows with R4D_PREFILL_FUSED=0 (the chain's own launches,
each GEMM the batch rows' as tests/test_device_batch_rows.py checks them against libref): the norm
and every output whose chain GEMM sums K in one pass the same bits, the others (K split in the chain)
within f32 reassociation. Skips where no card is visible; without one: tests/test_prefill_rows.py."""

import numpy as np
import pytest

from test_device_batch_rows import DEVICE, on_card, pytestmark  # noqa: F401 (the card, its fixture, its skip)
from test_libr4d_support import activations, make_weight, registry, rel_err  # noqa: F401 (registry)
from test_prefill_rows import FFN, QKV, launched, tc, with_add

HIDDEN, NQ, NK, NF = 4096, 4096, 1024, 14336


def eight_b_case(m, ffn):
    zeros = lambda n: np.zeros((m, n), np.float32)  # noqa: E731
    x, norm = activations(m, HIDDEN, m), make_weight("bf16", 1, HIDDEN, 2)
    if ffn:
        operands = [x, None, zeros(HIDDEN), None, zeros(NF), None, zeros(NF)]
        weights = {1: norm, 3: make_weight("bf16", NF, HIDDEN, 13), 5: make_weight("bf16", NF, HIDDEN, 15)}
        params = {"M": m, "n.0": HIDDEN, "eps": 1e-5, "K": HIDDEN, "N.1": NF, "N.2": NF, "wdtype": "bf16", "dtype": "f32"}
        return "rmsnorm_gemm2_silu_mul", FFN, operands, params, weights, (2, 4, 6)
    operands = [x, None, zeros(HIDDEN), None, zeros(NQ), None, zeros(NK), None, zeros(NK)]
    weights = {1: norm, 3: make_weight("bf16", NQ, HIDDEN, 3), 5: make_weight("bf16", NK, HIDDEN, 5),
               7: make_weight("bf16", NK, HIDDEN, 7)}
    params = {"M": m, "n": HIDDEN, "eps": 1e-5, "K": HIDDEN, "N.1": NQ, "N.2": NK, "N.3": NK, "wdtype": "bf16",
              "dtype": "f32"}
    return "rmsnorm_gemm3", QKV, operands, params, weights, (2, 4, 6, 8)


@pytest.mark.parametrize("m", [2048, 300])
@pytest.mark.parametrize("ffn", [False, True])
@pytest.mark.parametrize("add", [True, False])
def test_the_fused_prefill_rows_give_the_chains_results_on_the_card(registry, on_card, monkeypatch, m, ffn, add):
    case = with_add(eight_b_case(m, ffn)) if add else eight_b_case(m, ffn)
    norms = (0, 3) if add else (2,)
    if DEVICE.target == "sm_90":  # the grouped forms serve: the first launch below takes them
        assert tc.kernel_for(DEVICE.vendor, DEVICE.target, "bf16", m) == "tma" and tc.groups_serve()
    monkeypatch.delenv("R4D_PREFILL_FUSED", raising=False)
    got, _ = launched(on_card, registry, case)
    monkeypatch.setenv("R4D_PREFILL_FUSED", "0")
    unfused, _ = launched(on_card, registry, case)
    for i in case[5]:
        assert np.isfinite(got[i]).all(), (case[1], m, i)
        n = case[2][i].shape[1]
        if i in norms or tc.split(m, n, HIDDEN, "bf16", "tma")[0] == 1:
            assert np.array_equal(got[i].view(np.uint32), unfused[i].view(np.uint32)), (case[1], m, i)
        else:
            assert rel_err(got[i], unfused[i]) <= 1e-5, (case[1], m, i)
