"""The decode band on Hopper's tensor cores (device_skinny_band.py): the GEMV row and its fused rows at
M = 2 .. 8 of bf16 weights on an sm_90 launch r4d_split_bf16_dev (x, normed where the row folds a norm,
as 16 hi and lo bf16 rows) and gemm_skinny.cu's r4d_skinny_band_bf16 with the row's epilogue; M = 1,
other cards and other formats keep gemv.cu. Without a card: which kernel, the plans and their scratch,
the rows on a fake sm_90 (tests/fixtures/r4d_fake_kernels.py's forms) against libref's chains within
the GEMV's tolerance, and the kernel's own text on the host behind wgmma_on_host.h's model against a
float64 product (every mode, split K, tails). On a card the same rows are tests/test_device_rows.py's
bf16 cases (M = 3, 4, 8), which the band then serves."""

import ctypes
import functools
import importlib
import re
import subprocess

import ml_dtypes
import numpy as np
import pytest

import early_builds
from device_batch_support import Pointers, nvidia_fake
from device_sources import NVCC, sass
from radiance.abi import RAD_E_NOMEM, RAD_OK
from radiance.engine.running.device_stream import EngineStream
from test_device_rows_host import dev, device_weight, launch, pointers
from test_device_rows_support import Card
from test_device_tensor_cores import Recording, device_row, module
from test_gemm_skinny import ON_HOST, counter, host_source, needs_gxx, needs_nvcc
from test_libr4d_support import activations, make_weight, registry, rel_err, row_of  # noqa: F401 (registry)
from test_libr4d_support import launch as host_launch

dk = importlib.import_module("radiance.plugins.kernels.libr4d.device_kernels")
tc = importlib.import_module("radiance.plugins.kernels.libr4d.device_tensor_cores")
BAND = ["r4d_split_bf16_dev", "r4d_skinny_band_bf16"]


# ---- which kernel ---------------------------------------------------------------------------------

def test_the_band_takes_the_skinny_kernel_on_hopper_from_two_rows_of_bf16(registry, monkeypatch):
    tcm = module(registry, "device_tensor_cores")
    monkeypatch.setattr(tcm, "BAND_KERNEL", None)
    assert [tcm.band_kernel_for("cuda", "sm_90", "bf16", m) for m in range(1, 9)] == ["gemv"] + ["skinny"] * 7
    for vendor, target, fmt in [("cuda", "sm_89", "bf16"), ("cuda", "sm_90", "q8_0"), ("cuda", "sm_90", "fp8_channel"),
                                ("hip", "gfx942", "bf16"), ("fake", "fake_90", "bf16"), ("cuda", "sm_100", "bf16")]:
        assert tcm.band_kernel_for(vendor, target, fmt, 8) == "gemv", (vendor, target, fmt)
    monkeypatch.setattr(tcm, "BAND_KERNEL", "gemv")  # forced: the bench's comparison in one run
    assert tcm.band_kernel_for("cuda", "sm_90", "bf16", 8) == "gemv"
    monkeypatch.setattr(tcm, "BAND_KERNEL", "skinny")  # M = 1 too, but only where it can run
    assert tcm.band_kernel_for("cuda", "sm_90", "bf16", 1) == "skinny"
    assert tcm.band_kernel_for("cuda", "sm_89", "bf16", 8) == "gemv"
    monkeypatch.setattr(tcm, "BAND_KERNEL", "wgmma")
    with pytest.raises(ValueError, match="R4D_BAND_KERNEL='wgmma': one of gemv, skinny"):
        tcm.band_kernel_for("cuda", "sm_90", "bf16", 8)
    # the band's own cut: one warpgroup, four blocks a multiprocessor; a wrong one names its variable
    assert tcm.BAND_CUT == tcm.SkinnyCut(1, 128, 4) and tcm.BAND_L2 in tcm.BAND_L2S
    with pytest.raises(ValueError, match="R4D_BAND_CUT='3,128': warpgroups 1 or 2"):
        tcm.SkinnyCut.parse("3,128", "R4D_BAND_CUT")


@pytest.mark.parametrize("rows,k,mode", [((4096, 1024, 1024), 4096, 0), ((14336,), 4096, 2), ((4096,), 14336, 1),
                                         ((128256,), 4096, 0), ((200, 72), 576, 0)])
def test_the_band_split_fills_a_wave_and_the_layout_follows_the_gemv_s(rows, k, mode):
    splits, per = tc.band_split(rows, k, mode)
    tiles = tc.band_tiles(rows, mode)
    steps = -(-k // (tc.BAND_CUT.step(tc.BAND_MX) // 2))
    assert tiles == (-(-rows[0] // 32) if mode == 2 else sum(-(-r // 64) for r in rows))
    assert 1 <= splits <= tc.SKINNY_MAX_SPLITS and (splits - 1) * per < steps <= splits * per
    wave = 132 * tc.BAND_CUT.blocks(tc.BAND_MX)
    end_to_end = lambda count, each: -(-tiles * count // wave) * each  # noqa: E731
    assert end_to_end(splits, per) <= end_to_end(1, steps)  # never slower end to end than one split
    assert (splits > 1) == (tiles < wave // 2 and steps >= 2 * tc.MIN_TILES_PER_SPLIT)  # k/v, down: split; gate and up: not
    base = 1000
    layout = tc.band_scratch_layout(8, rows, k, mode, base)
    assert min(layout.values()) >= 1024 and layout["rows"] + 2 * 16 * k <= layout["total"]  # after the GEMV's, aligned
    if splits > 1:  # the counters before the partials, in the same place at every M of the band
        assert layout["counters"] == 1024 and layout["partial"] >= layout["counters"] + 4 * tiles
        assert layout["rows"] >= layout["partial"] + 4 * splits * 8 * tiles * 64
        assert tc.band_scratch_layout(2, rows, k, mode, base)["counters"] == layout["counters"]


# ---- plans ------------------------------------------------------------------------------------------

def test_a_band_plan_splits_x_then_runs_the_band_kernel_after_the_gemv_s_scratch(registry):
    stream, row = Recording("sm_90"), device_row(registry, "r4dchain_rmsnorm_gemm3_plain_dev")
    x, normed = dev(0x1000, (8, 4096)), dev(0x3000, (8, 4096))
    outs = [dev(0x5000 + 0x1000 * i, (8, n)) for i, n in enumerate((4096, 1024, 1024))]
    weights = [device_weight("bf16", n, 4096, 0x7000000 + 0x1000000 * i) for i, n in enumerate((4096, 1024, 1024))]
    norm = device_weight("f32", 1, 4096, 0x6000000)
    for m in (1, 5):
        params = {"M": m, "n": 4096, "eps": 1e-5, "K": 4096, "N.1": 4096, "N.2": 1024, "N.3": 1024, "wdtype": "bf16",
                  "dtype": "f32"}
        need = row.info.scratch({**params, "M": 8})
        stream.launches.clear()
        tensors = [x, norm, normed, weights[0], outs[0], weights[1], outs[1], weights[2], outs[2]]
        assert launch(row, tensors, params, stream, 0x40000000, need) == RAD_OK
        names = [name for name, *_ in stream.launches]
        if m == 1:
            assert names == ["r4d_gemv_m1"]
            continue
        assert names == BAND
        (_, _, _, split), (_, grid, block, args) = stream.launches
        base = dk.gemv_scratch_layout(8, 6144, 4096, "bf16")[1]
        layout = tc.band_scratch_layout(m, (4096, 1024, 1024), 4096, 0, base)
        splits, per = tc.band_split((4096, 1024, 1024), 4096, 0)
        assert pointers(split, [0, 4, 7, 11]) == [0x1000, 0x6000000, 0x3000, 0x40000000 + layout["rows"]]
        assert grid == (96, 1, splits) and splits > 1 and block == (tc.BAND_CUT.threads, 1, 1)
        assert stream.shared == tc.BAND_CUT.shared(16)
        assert pointers(args, [0, 1, 2, 4, 5, 7, 8, 10, 11, 12, 13, 14]) == [
            0x40000000 + layout["rows"], 0x7000000, 0x5000, 0x8000000, 0x6000, 0x9000000, 0x7000, 0, 0, 0,
            0x40000000 + layout["partial"], 0x40000000 + layout["counters"]]
        assert stream.compiled[-1] == ("r4d_skinny_band_bf16", tc.band_options(0))
        assert launch(row, tensors, dict(params), stream, 0x40000000, layout["total"] - 1) == RAD_E_NOMEM


def test_the_band_s_kernels_wait_on_the_chain_before_reading_what_a_kernel_wrote():
    """r4d_split_bf16_dev lets the skinny kernel after it launch first (griddepcontrol.launch_dependents) and
    then waits before anything else; the skinny kernel copies only weights before its R4D_CHAIN_PROLOGUE,
    x's rows (r4d_split_bf16_dev's output) after it."""
    inputs, skinny = (dk.FOLDER / "gemm_inputs.cu").read_text(), (dk.FOLDER / "gemm_skinny.cu").read_text()
    start = inputs.index("r4d_split_bf16_dev(")
    body = inputs[inputs.index("{", start) + 1:inputs.index("\n}\n", start)]
    first = body.lstrip().split("\n#endif")[0]
    assert first.startswith("#if") and first.rstrip().endswith(
        'asm volatile("griddepcontrol.launch_dependents;\\n\\tgriddepcontrol.wait;" ::: "memory");'), first
    loop = skinny[skinny.index("__device__ __forceinline__ void sk_mainloop("):skinny.index("__device__ void sk_gemm(")]
    before, after = loop.split("R4D_CHAIN_PROLOGUE();")
    code = re.sub(r"//[^\n]*", "", before.split("{", 1)[1])  # the body before the wait, comments out
    assert "load_w(" in code and "wg_load<SK_MX>" not in code and not re.search(r"(?<![.\w])x(?!\w)", code), code
    assert "wg_load<SK_MX>(shared + s * SK_STAGE_BYTES + SK_W_BYTES, x," in after


# ---- the rows on a fake sm_90 against libref's chains ------------------------------------------------

@pytest.fixture(scope="module")
def on_hopper():
    device = nvidia_fake("sm_90")
    fake = Card(device, EngineStream(device))
    yield fake
    fake.close()
    device.close()


def chain(registry, op, operands, params, weights, read):
    arrays = [None if i in weights else np.array(o, copy=True) for i, o in enumerate(operands)]
    assert host_launch(row_of(registry, op, "libref"), arrays, params, weights) == RAD_OK
    return {i: arrays[i] for i in read}


def band_case(registry, on_hopper, op, name, operands, params, weights, kinds):
    """The row on the fake sm_90, its launches the band's, each operand in `kinds` within that
    TOLERANCE of libref's chain."""
    before = len(on_hopper.device.launches)
    got = on_hopper.run(device_row(registry, name), operands, params, weights, read=tuple(kinds))
    names = [launch.name for launch in on_hopper.device.launches[before:]]
    assert names[:2] == BAND, names
    want = chain(registry, op, operands, params, weights, tuple(kinds))
    for i, kind in kinds.items():
        err = rel_err(got[i], want[i])
        assert np.isfinite(got[i]).all() and err <= dk.TOLERANCE[kind], (name, i, err)
    return got, want, names


@pytest.mark.parametrize("m", [2, 5, 8])
def test_the_gemv_and_gemm_add_rows_agree_with_libref_on_the_band(registry, on_hopper, m):
    # 200 rows: a block's tail; 576 x 1536 splits K
    for n, k in ((200, 576), (576, 1536)):
        params = {"M": m, "N": n, "K": k, "wdtype": "bf16", "dtype": "f32", "split_k": 1}
        band_case(registry, on_hopper, "gemm", "r4dchain_gemv_plain_dev", [activations(m, k, m), None, np.zeros((m, n), np.float32)],
                  params, {1: make_weight("bf16", n, k, n + k)}, {2: "gemv"})
        params = {"M": m, "N": n, "K": k, "n": n, "wdtype": "bf16", "dtype": "f32"}
        band_case(registry, on_hopper, "gemm_add", "r4dchain_gemm_add_plain_dev",
                  [activations(m, k, 41), None, np.zeros((m, n), np.float32), activations(m, n, 42)], params,
                  {1: make_weight("bf16", n, k, 43)}, {2: "gemv", 3: "gemv"})


@pytest.mark.parametrize("m", [3, 8])
@pytest.mark.parametrize("norm_format", ["f32", "bf16"])
def test_the_fused_norm_rows_agree_with_libref_s_chains_on_the_band(registry, on_hopper, m, norm_format):
    hidden, (nq, nk), ffn = 576, (576, 200), 1000
    x, norm = activations(m, hidden, 31), make_weight(norm_format, 1, hidden, 32)
    zeros = lambda n: np.zeros((m, n), np.float32)  # noqa: E731
    weights = {1: norm, 3: make_weight("bf16", nq, hidden, 33), 5: make_weight("bf16", nk, hidden, 34),
               7: make_weight("bf16", nk, hidden, 35)}
    params = {"M": m, "n": hidden, "eps": 1e-5, "K": hidden, "N.1": nq, "N.2": nk, "N.3": nk, "wdtype": "bf16",
              "dtype": "f32"}
    band_case(registry, on_hopper, "rmsnorm_gemm3", "r4dchain_rmsnorm_gemm3_plain_dev",
              [x, None, zeros(hidden), None, zeros(nq), None, zeros(nk), None, zeros(nk)], params, weights,
              {2: "rmsnorm", 4: "gemv", 6: "gemv", 8: "gemv"})
    weights = {1: norm, 3: make_weight("bf16", ffn, hidden, 36), 5: make_weight("bf16", ffn, hidden, 37)}
    params = {"M": m, "n.0": hidden, "eps": 1e-5, "K": hidden, "N.1": ffn, "N.2": ffn, "wdtype": "bf16", "dtype": "f32"}
    band_case(registry, on_hopper, "rmsnorm_gemm2_silu_mul", "r4dchain_rmsnorm_gemm2_silu_mul_plain_dev",
              [x, None, zeros(hidden), None, zeros(ffn), None, zeros(ffn)], params, weights,
              {2: "rmsnorm", 4: "gemv", 6: "gemv"})


def test_the_lm_head_on_the_band_samples_the_chain_s_greedy_tokens(registry, on_hopper):
    m, rows, hidden, vocab = 4, 9, 576, 3000
    h = activations(rows, hidden, 51)
    h[8, 100] = 40.0  # row 8 (sequence 0's) with an outlier: its hi and lo carry it
    operands = [h, np.array([8, 0, 3, 5], np.int32), np.zeros((m, hidden), np.float32), None,
                np.zeros((m, hidden), np.float32), None, np.zeros((m, vocab), np.float32), np.zeros(m, np.float32),
                np.zeros(m, np.int32), np.ones(m, np.float32), np.array([[7, 3], [11, 4], [13, 5], [17, 6]], np.uint64),
                np.full(m, -1, np.int32)]
    params = {"M": m, "n": hidden, "eps": 1e-5, "N": vocab, "K": hidden, "wdtype": "bf16", "dtype": "f32", "vocab": vocab}
    weights = {3: make_weight("f32", 1, hidden, 52), 5: make_weight("bf16", vocab, hidden, 53)}
    got, want, names = band_case(registry, on_hopper, "take_rows_rmsnorm_gemm_sample",
                                 "r4dchain_take_rows_rmsnorm_gemm_sample_plain_dev", operands, params, weights,
                                 {2: "take_rows", 4: "rmsnorm", 6: "gemv", 11: "take_rows"})
    assert names == BAND + ["r4d_sample_groups_dev"]
    np.testing.assert_array_equal(got[11], np.argmax(got[6], axis=1))


def test_a_split_band_launch_gives_the_same_bits_launch_after_launch(registry, on_hopper):
    """The block's last split leaves its counter zero: a replay in the same scratch adds the splits again
    (the fake form asserts the counters zero at every launch)."""
    m, n, k = 4, 576, 1536
    assert tc.band_split((n,), k, 0)[0] > 1
    row = device_row(registry, "r4dchain_gemv_plain_dev")
    params = {"M": m, "N": n, "K": k, "wdtype": "bf16", "dtype": "f32", "split_k": 1}
    operands = [activations(m, k, 5), None, np.zeros((m, n), np.float32)]
    a = on_hopper.args(row, operands, params, {1: make_weight("bf16", n, k, 9)})
    on_hopper.replays_agree(row, a, 2, operands[2])


# ---- the kernel's text on the host ---------------------------------------------------------------------

def band_build(mode: int, l2: int = 0):
    return ON_HOST.build(host_source(band=True), ("-DR4D_WG_ONLY=3", *tc.BAND_CUT.defines(16), "-DSK_BAND=1",
                                                  f"-DSK_MODE={mode}", f"-DSK_L2={l2}"))


def band_library(mode: int, l2: int = 0):
    return early_builds.result(f"g++:gemm_skinny:band:{mode}:{l2}:{tc.BAND_CUT}", functools.partial(band_build, mode, l2))


EARLY_BUILDS = {}
if ON_HOST.why() is None:
    EARLY_BUILDS.update({f"g++:gemm_skinny:band:{mode}:{l2}:{tc.BAND_CUT}": functools.partial(band_build, mode, l2)
                         for mode, l2 in [(0, 0), (1, 0), (2, 0), (3, 0), (0, 256)]})


def hi_lo(x: np.ndarray) -> np.ndarray:
    """r4d_split_bf16_dev's 16 rows of x's M <= 8 rows (its numpy form's rounding)."""
    rows = np.zeros((16, x.shape[1]), np.float32)
    rows[:len(x)] = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    rows[8:8 + len(x)] = (x - rows[:len(x)]).astype(ml_dtypes.bfloat16).astype(np.float32)
    return rows.astype(ml_dtypes.bfloat16)


# (mode, M, weights' rows, K, splits, L2): three weights with tails (72 and 8 rows past whole blocks), K not a
# whole k-tile, split 3 ways with a short last split; the residual's add; gate and up pairs with a tail
# (40 rows: a block and 8); 16 splits, the most; the 256-byte L2 fetch's build (R4D_BAND_L2); the lm head's
# maxima a block (a tail of 8 rows; split 3 ways: the last split's block finds them)
HOST_CASES = [(0, 5, (128, 72, 8), 520, 3, 0), (0, 8, (64,), 256, 1, 0), (1, 2, (136,), 1024, 2, 0),
              (2, 7, (40, 40), 640, 2, 0), (2, 3, (64, 64), 2048, 16, 0), (0, 4, (200, 64), 384, 2, 256),
              (3, 6, (200,), 256, 1, 0), (3, 8, (136,), 1024, 3, 0)]


@needs_gxx
@pytest.mark.parametrize("mode,m,rows,k,splits,l2", HOST_CASES)
def test_the_band_kernel_as_written_computes_each_epilogue_on_the_modelled_card(mode, m, rows, k, splits, l2):
    rng = np.random.default_rng(m + k + mode)
    x = rng.standard_normal((m, k)).astype(np.float32)
    ws = [(rng.standard_normal((r, k), np.float32) / 8).astype(ml_dtypes.bfloat16) for r in rows]
    ys = [np.full((m, r), np.nan, np.float32) for r in rows]
    residual = rng.standard_normal((m, rows[0])).astype(np.float32)
    kept = residual.copy()
    steps = -(-k // (tc.BAND_CUT.step(16) // 2))
    per = -(-steps // splits)
    splits = -(-steps // per)
    tiles = tc.band_tiles(rows[:1] if mode == 2 else rows, mode)
    partial = np.full((splits, m, tiles * 64), np.nan, np.float32)
    counters = np.zeros(tiles, np.uint32)
    ptr = Pointers()
    args = [ptr(hi_lo(x).view(np.uint16))]
    for i in range(3):
        args += [ptr(ws[i].view(np.uint16)), ptr(ys[i]), ctypes.c_int(rows[i])] if i < len(rows) else \
            [ptr(None), ptr(None), ctypes.c_int(0)]
    best = np.full((tiles, m), np.nan, np.float32)
    best_index = np.full((tiles, m), -1, np.int32)
    args += [ptr(residual if mode == 1 else None), ptr(best if mode == 3 else None), ptr(best_index if mode == 3 else None),
             ptr(partial), ptr(counters), ctypes.c_int(m), ctypes.c_int(k), ctypes.c_int(per)]
    lib = band_library(mode, l2)
    names = ("r4d_wgmma_faults", "r4d_wgmma_races", "r4d_wgmma_mmas")
    start = [counter(lib, name) for name in names]
    array = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
    assert lib.r4d_host_launch(b"r4d_skinny_band_bf16", tiles, 1, splits, tc.BAND_CUT.threads, 1, 1, array) == 0
    lib.r4d_wgmma_left.restype = ctypes.c_longlong
    faults, races, mmas = [counter(lib, name) - s for name, s in zip(names, start)]
    assert (faults, races, lib.r4d_wgmma_left()) == (0, 0, 0) and mmas > 0
    assert not counters.any(), "the last split of each block leaves its counter zero"
    products = [x.astype(np.float64) @ w.astype(np.float64).T for w in ws]
    if mode == 2:
        gate, up = products
        want = [gate / (1 + np.exp(-gate)) * up, up]
    else:
        want = products if mode == 0 else [products[0]]  # modes 1 and 3: one weight
    for got, expected in zip(ys, want):
        assert np.isfinite(got).all()
        # hi + lo carry ~16 bits of x: far under the GEMV's 2e-5; a misplaced chunk or row is ~1
        assert np.abs(got - expected).max() / np.abs(expected).max() <= 2e-5
    if mode == 1:
        np.testing.assert_allclose(residual, kept + ys[0], rtol=0, atol=0)
    if mode == 3:  # each block's first maximum of each x row over its rows of the output the kernel wrote
        for block in range(tiles):
            part = ys[0][:, block * 64:(block + 1) * 64]
            np.testing.assert_array_equal(best_index[block], block * 64 + part.argmax(axis=1))
            np.testing.assert_array_equal(best[block], part.max(axis=1))


# ---- nvcc's build --------------------------------------------------------------------------------------

def nvcc_band(mode: int, l2: int = 0):
    folder = early_builds.folder() / "gemm_skinny_band_sm_90a"
    folder.mkdir(exist_ok=True)
    source, cubin = folder / "gemm_skinny.cu", folder / f"band_{mode}_{l2}.cubin"
    source.write_text(dk.source("gemm_skinny"))
    options = [option for option in tc.band_options(mode) if option.startswith("-D") and not option.startswith("-DSK_L2")]
    options.append(f"-DSK_L2={l2}")
    result = subprocess.run([NVCC, "-arch=sm_90a", "-std=c++17", *options, "-cubin", "-Xptxas", "-v", "-o", str(cubin),
                             str(source)], capture_output=True, text=True)
    return result, sass(cubin) if result.returncode == 0 else None


NVCC_CASES = [(0, 0), (1, 0), (2, 0), (3, 0), (2, 256)]  # every mode; the 256-byte L2 fetch of R4D_BAND_L2 in one
if NVCC is not None:
    EARLY_BUILDS.update({f"nvcc:gemm_skinny:band:{mode}:{l2}": functools.partial(nvcc_band, mode, l2) for mode, l2 in NVCC_CASES})


@needs_nvcc
@pytest.mark.parametrize("mode,l2", NVCC_CASES)
def test_the_band_builds_for_sm_90a_without_spills_or_a_stack(mode, l2):
    result, listing = early_builds.result(f"nvcc:gemm_skinny:band:{mode}:{l2}", functools.partial(nvcc_band, mode, l2))
    assert result.returncode == 0, result.stderr[-2000:]
    report = result.stdout + result.stderr
    assert "0 bytes stack frame, 0 bytes spill stores" in report, report
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    assert registers * tc.BAND_CUT.threads * tc.BAND_CUT.blocks(16) <= 65536, registers
    if listing is not None:
        assert "HGMMA.64x16x16.F32.BF16" in listing, listing[:2000]
