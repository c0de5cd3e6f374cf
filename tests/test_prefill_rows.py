"""The fused rows above the decode band (device_prefill_rows.py): rmsnorm + q, k, v and rmsnorm + gate,
up + silu_mul from TMA_FROM rows. On a fake sm_90 (tests/fixtures/r4d_fake_kernels.py's forms) they
launch the norm with its bf16 rows, the maps and one grouped or SwiGLU TMA GEMM; with
R4D_PREFILL_FUSED=0, or on a card without the TMA kernel, the chain's own launches; both give the
same bits, within the tensor-core GEMM's tolerance of libref's chain. gemm_tma.cu's grouped and
SwiGLU forms themselves: tests/test_gemm_tma_on_host.py; on a card: tests/test_device_batch_rows.py."""

import importlib

import numpy as np
import pytest

from device_batch_support import nvidia_fake
from radiance.abi import RAD_OK
from radiance.engine.running.device_stream import EngineStream
from radiance.engine.selection.bands import row_refusal
from test_device_rows_support import Card
from test_device_tensor_cores import device_row
from test_libr4d_support import activations, make_weight, registry, rel_err, row_of  # noqa: F401 (registry)
from test_libr4d_support import launch as host_launch

dk = importlib.import_module("radiance.plugins.kernels.libr4d.device_kernels")
tc = importlib.import_module("radiance.plugins.kernels.libr4d.device_tensor_cores")
QKV, FFN = "r4dchain_rmsnorm_gemm3_tc_dev", "r4dchain_rmsnorm_gemm2_silu_mul_tc_dev"
ADD_QKV, ADD_FFN = "r4dchain_add_rmsnorm_gemm3_tc_dev", "r4dchain_add_rmsnorm_gemm2_silu_mul_tc_dev"
HIDDEN, (NQ, NK), FFN_ROWS = 256, (256, 72), 200  # 72 and 200 rows: tiles' tails


@pytest.fixture(scope="module", params=["sm_90", "sm_89"])
def card(request):
    device = nvidia_fake(request.param)
    fake = Card(device, EngineStream(device))
    yield fake
    fake.close()
    device.close()


def qkv_case(m, norm_format="bf16"):
    zeros = lambda n: np.zeros((m, n), np.float32)  # noqa: E731
    operands = [activations(m, HIDDEN, m), None, zeros(HIDDEN), None, zeros(NQ), None, zeros(NK), None, zeros(NK)]
    weights = {1: make_weight(norm_format, 1, HIDDEN, 2), 3: make_weight("bf16", NQ, HIDDEN, 3),
               5: make_weight("bf16", NK, HIDDEN, 5), 7: make_weight("bf16", NK, HIDDEN, 7)}
    params = {"M": m, "n": HIDDEN, "eps": 1e-5, "K": HIDDEN, "N.1": NQ, "N.2": NK, "N.3": NK, "wdtype": "bf16",
              "dtype": "f32"}
    return "rmsnorm_gemm3", QKV, operands, params, weights, (2, 4, 6, 8)


def ffn_case(m, norm_format="f32"):
    zeros = lambda n: np.zeros((m, n), np.float32)  # noqa: E731
    operands = [activations(m, HIDDEN, m + 1), None, zeros(HIDDEN), None, zeros(FFN_ROWS), None, zeros(FFN_ROWS)]
    weights = {1: make_weight(norm_format, 1, HIDDEN, 12), 3: make_weight("bf16", FFN_ROWS, HIDDEN, 13),
               5: make_weight("bf16", FFN_ROWS, HIDDEN, 15)}
    params = {"M": m, "n.0": HIDDEN, "eps": 1e-5, "K": HIDDEN, "N.1": FFN_ROWS, "N.2": FFN_ROWS, "wdtype": "bf16",
              "dtype": "f32"}
    return "rmsnorm_gemm2_silu_mul", FFN, operands, params, weights, (2, 4, 6)


def with_add(case):
    """The case's chain after the residual add: residual += x, then the chain on the residual."""
    op, name, operands, params, weights, read = case
    m, n = operands[0].shape
    residual = activations(m, n, m + 7)
    params = {**params, **({"n.1": params.pop("n.0")} if "n.0" in params else {})}
    params = {key if not key.startswith("N.") else f"N.{int(key[2:]) + 1}": value for key, value in params.items()}
    return (f"add_{op}", ADD_QKV if name == QKV else ADD_FFN, [residual, *operands], params,
            {i + 1: w for i, w in weights.items()}, (0, *[i + 1 for i in read]))


def launched(card, registry, case) -> tuple:
    """The outputs in the case's `read` and the launches' names (a fake card's; none on a real one)."""
    _, name, operands, params, weights, read = case
    before = len(getattr(card.device, "launches", ()))
    got = card.run(device_row(registry, name), operands, params, weights, read=read)
    return got, [launch.name for launch in getattr(card.device, "launches", ())[before:]]


def libref_chain(registry, case) -> dict:
    op, _, operands, params, weights, read = case
    arrays = [None if i in weights else np.array(o, copy=True) for i, o in enumerate(operands)]
    assert host_launch(row_of(registry, op, "libref"), arrays, params, weights) == RAD_OK
    return {i: arrays[i] for i in read}


@pytest.mark.parametrize("add", [False, True])
@pytest.mark.parametrize("make", [qkv_case, ffn_case])
def test_the_rows_launch_one_grouped_gemm_on_hopper_and_the_chain_elsewhere_with_the_same_bits(
        registry, card, monkeypatch, make, add):
    """Hopper: the norm (its bf16 rows), the maps, one GEMM; R4D_PREFILL_FUSED=0 and sm_89: the chain's
    own launches. Every output (the residual, normed, q, k, v; normed, gate, up) the same either way,
    and within the tensor-core GEMM's tolerance of libref's chain (the norm within the device
    rmsnorm's, the residual's add exact)."""
    case = with_add(make(300)) if add else make(300)
    stated = importlib.import_module("radiance.plugins.kernels.libr4d.device_prefill_rows").stated_tolerances()
    norms = (0, 3) if add else (2,)
    monkeypatch.delenv("R4D_PREFILL_FUSED", raising=False)
    got, names = launched(card, registry, case)
    hopper = card.device.target == "sm_90"
    if hopper:
        last = tc.TMA_GROUP if case[0].endswith("gemm3") else tc.TMA_SWIGLU
        assert names == ["r4d_add_rmsnorm_bf16_dev", tc.TMA_MAPS_GROUP, last], names
    else:
        assert names[0] == "r4d_add_rmsnorm_bf16_dev" and tc.TMA_GROUP not in names and tc.TMA_MAPS_GROUP not in names
    monkeypatch.setenv("R4D_PREFILL_FUSED", "0")
    unfused, names = launched(card, registry, case)
    gemms = 3 if case[0].endswith("gemm3") else 2
    if hopper:
        assert names == ["r4d_add_rmsnorm_bf16_dev", *["r4d_narrow_bf16_dev", "r4d_tma_maps", "r4d_tma_gemm_bf16"] * gemms,
                         *(["r4d_silu_mul_dev"] if gemms == 2 else [])], names
    want = libref_chain(registry, case)
    for i in case[5]:
        # the same bits where the chain's GEMM sums K in one pass, as at a prefill's thousands of rows
        # (tests/test_gemm_tma_on_host.py); this small K the chain's GEMM splits in two, so f32 order
        splits = tc.split(300, case[2][i].shape[1], HIDDEN, "bf16", "tma")[0]
        if i in norms or splits == 1:
            assert np.array_equal(got[i].view(np.uint32), unfused[i].view(np.uint32)), (case[1], i)
        else:
            assert rel_err(got[i], unfused[i]) <= 1e-6, (case[1], i)
        err = rel_err(got[i], want[i])
        held = 0.0 if add and i == 0 else dk.TOLERANCE["rmsnorm"] if i in norms else stated[case[1]]
        assert np.isfinite(got[i]).all() and err <= held, (case[1], i, err)



@pytest.mark.parametrize("without", ["grouped", "swiglu"])
def test_each_form_leaves_its_rows_to_the_chain_alone_where_its_own_cut_lacks_it(registry, card, monkeypatch, without):
    """The grouped form is planned in TMA_CUT and SwiGLU's in SWIGLU_CUT: a cut without the forms (256
    columns) for one of them sends that form's rows to the chain's launches and leaves the other's grouped."""
    if card.device.target != "sm_90":
        pytest.skip("the grouped forms are Hopper's")
    monkeypatch.delenv("R4D_PREFILL_FUSED", raising=False)
    package = next(lib for lib in registry.hierarchy if lib.name == "libr4d").module.__name__  # the rows' own modules
    cuts = importlib.import_module(f"{package}.device_tensor_cores")
    monkeypatch.setattr(cuts, "TMA_CUT" if without == "grouped" else "SWIGLU_CUT", cuts.TmaCut.parse("256,32,5"))
    importlib.import_module(f"{package}.device_rows")._PLANS.clear()
    _, qkv = launched(card, registry, qkv_case(300))
    _, ffn = launched(card, registry, ffn_case(300))
    grouped, chained = (ffn, qkv) if without == "grouped" else (qkv, ffn)
    assert grouped[1:] == [tc.TMA_MAPS_GROUP, tc.TMA_SWIGLU if without == "grouped" else tc.TMA_GROUP], grouped
    assert tc.TMA_MAPS_GROUP not in chained and "r4d_tma_gemm_bf16" in chained, chained

def test_the_rows_serve_from_the_tma_kernels_rows_and_below_leave_the_chain_to_the_band_rows(registry):
    """From TMA_FROM rows (where Hopper's bf16 GEMMs are gemm_tma.cu's) on bf16 weights; below, the
    skinny and streamed GEMMs keep the chain (add_rmsnorm's fusion and the plain GEMM rows)."""
    for make in (qkv_case, ffn_case):
        op, name, _, params, _, _ = make(tc.TMA_FROM)
        row, schema = device_row(registry, name), registry.ops[op].schema
        assert row.info.replaces
        assert row_refusal(row, schema, params, {}) is None, name
        assert "M" in row_refusal(row, schema, {**params, "M": tc.TMA_FROM - 1}, {}), name
        assert "wdtype" in row_refusal(row, schema, {**params, "wdtype": "q8_0"}, {}), name


def test_the_scratch_holds_the_bf16_rows_after_the_counters_and_every_chain_gemms_need(registry):
    """The grouped path's bf16 rows and maps lie past the split-K counters' region, and the hook's
    size covers them and each GEMM of the chain as the batch rows plan it, at the band's most rows."""
    pr = importlib.import_module("radiance.plugins.kernels.libr4d.device_prefill_rows")
    layout = pr.scratch_layout(2048, 4096)
    assert layout["rows"] >= tc.COUNTER_BYTES and layout["maps"] >= layout["rows"] + 2 * 2048 * 4096
    geometry = {"M": 2048, "K": 4096, "N.1": 14336, "N.2": 14336}
    assert device_row(registry, FFN).info.scratch(geometry) >= layout["total"]
    assert device_row(registry, FFN).info.scratch(geometry) >= tc.scratch_bytes(2048, 14336, 4096, "bf16")
