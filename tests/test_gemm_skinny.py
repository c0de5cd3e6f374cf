"""gemm_skinny.cu (the tensor-core GEMM of few rows of x on Hopper, the operands swapped: w's rows are
wgmma's M, x's rows its N) without a card: its cuts, which M it takes, its plan (x narrowed to bf16,
then the kernel over (w's row blocks, x's tiles, splits)), the row on a fake sm_90 card
(tests/fixtures/r4d_fake_kernels.py) against libref within the stated tolerance, and the kernel's own
text run on the host (tests/fixtures/cuda_on_host.h with wgmma_on_host.h's model of wgmma: its
descriptors, the swizzle, D's layout, MMAs read at issue and at retirement) against a float64
product: the transposed epilogue, x's tiles, M, N and K tails, split K and its counters; with a
barrier taken out, the model must notice. And nvcc's sm_90a build (registers, no spills, HGMMA of
the SK_MX columns). The same row on a real card: .carry's card script runs tests/test_device_batch_rows.py
with R4D_TC_KERNEL=skinny, and test_the_skinny_kernel_agrees_with_libref_on_a_card below."""

import ctypes
import functools
import importlib
import re
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import early_builds
from device_batch_support import Pointers, fixture_module, nvidia_fake
from device_sources import NVCC, sass
from radiance.abi import RAD_E_NOMEM, RAD_OK
from radiance.engine.running.device_stream import EngineStream
from test_device_rows_host import dev, device_weight, ints, launch, pointers
from test_device_batch_rows import DEVICE, STREAM, WHY, gemm_case
from test_device_rows_support import Card
from test_device_tensor_cores import BF16, Recording, device_row, module
from test_libr4d_support import activations, make_weight, registry, rel_err, row_of  # noqa: F401 (registry)
from test_libr4d_support import launch as host_launch

FIXTURES = Path(__file__).parent / "fixtures"
ON_HOST = fixture_module("cuda_on_host")
dk = importlib.import_module("radiance.plugins.kernels.libr4d.device_kernels")
tc = importlib.import_module("radiance.plugins.kernels.libr4d.device_tensor_cores")
needs_gxx = pytest.mark.skipif(ON_HOST.why() is not None, reason=str(ON_HOST.why()))
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: gemm_skinny.cu's sm_90a build is not checked here")


# ---- the cut, which M, the split ---------------------------------------------------------------------

def test_the_skinny_cuts_fit_the_launch_rule_and_say_what_is_wrong():
    assert tc.SKINNY_CUT == tc.SKINNY_CUTS[0] == tc.SkinnyCut(1, 128)
    assert [tc.skinny_variant(m) for m in (1, 8, 9, 16, 17, 33, 64, 65, 100, 128, 129, 300)] == \
        [8, 8, 16, 16, 32, 64, 64, 128, 128, 128, 128, 128]
    for cut in tc.SKINNY_CUTS:
        assert tc.SkinnyCut.parse(str(cut)) == cut
        for mx in tc.SKINNY_VARIANTS:
            stages, step = cut.stages(mx), cut.step(mx)
            # the stages fill the block's share (64 KiB, the launch's most, or less at four blocks), at least
            # MIN_STAGES of them, whole 8-row swizzle atoms; the blocks fit a multiprocessor's 228 KiB
            stage, budget = (cut.rows + mx) * step, cut.budget(mx)
            assert tc.SkinnyCut.MIN_STAGES <= stages <= tc.SkinnyCut.MAX_STAGES and step in (64, 128)
            assert cut.shared(mx) == stages * stage <= budget <= 64 << 10
            assert stages == tc.SkinnyCut.MAX_STAGES or (stages + 1) * stage > budget
            assert cut.blocks(mx) * (cut.shared(mx) + 1024) <= 228 << 10
            assert (cut.rows + mx) * step % (8 * step) == 0 and cut.blocks(mx) in (2, 3, 4)  # whole swizzle atoms
            assert f"-DSK_MX={mx}" in cut.defines(mx) and f"-DSK_STAGES={stages}" in cut.defines(mx)
    assert tc.SkinnyCut(1, 128).step(128) == 64 and tc.SkinnyCut(1, 128).step(64) == 128  # 2 stages of 128: halved
    assert tc.SkinnyCut.parse("1,128,4").blocks(64) == 4 and tc.SkinnyCut.parse("1,128,4").budget(64) == 56 << 10
    assert str(tc.SkinnyCut.parse("2,64,2")) == "2,64,2" and str(tc.SkinnyCut.parse("1,128")) == "1,128"
    for text, match in [("1", "two or three integers"), ("1,x", "two or three integers"), ("3,128", "warpgroups 1 or 2"),
                        ("1,32", "k_bytes 64 or 128"), ("1,128,5", "2, 3 or 4"), ("2,128,4", "at most 3")]:
        with pytest.raises(ValueError, match=match):
            tc.SkinnyCut.parse(text)


@pytest.mark.parametrize("m,n,k", [(64, 4096, 4096), (64, 28672, 4096), (64, 4096, 14336), (16, 1024, 4096),
                                   (9, 576, 576), (128, 6144, 4096), (300, 4096, 4096)])
def test_the_skinny_split_fills_132_multiprocessors_with_whole_k_tiles(m, n, k):
    splits, per = tc.split(m, n, k, "bf16", "skinny")
    mx = tc.skinny_variant(m)
    steps, tiles = -(-k // tc.k_tile("bf16", "skinny", m)), -(-n // 64) * -(-m // mx)
    assert tc.k_tile("bf16", "skinny", m) == tc.SKINNY_CUT.step(mx) // 2
    assert 1 <= splits <= tc.SKINNY_MAX_SPLITS and (splits - 1) * per < steps <= splits * per
    assert splits == 1 or (per >= tc.MIN_TILES_PER_SPLIT and tiles * (splits - 1) < 132 * tc.SKINNY_CUT.blocks(mx))
    # the tiles alone fill a wave: no split; else a split of at least two
    assert (splits == 1) == (tiles >= 132 * tc.SKINNY_CUT.blocks(mx) or steps < 2 * tc.MIN_TILES_PER_SPLIT)
    layout = tc.scratch_layout(m, n, k, "bf16", "skinny")
    assert ("partial" in layout) == (splits > 1) and layout["codes"] >= layout.get("partial", 0) + 4 * splits * m * n * (splits > 1)
    assert layout["total"] >= layout["codes"] + 2 * m * k and tc.scratch_bytes(max(m, 256), n, k, "bf16") >= layout["total"]


def test_a_skinny_plan_narrows_x_then_runs_the_kernel_over_w_row_blocks_and_x_tiles(registry):
    tc = module(registry, "device_tensor_cores")
    stream, row = Recording("sm_90"), device_row(registry, BF16)
    w, y = device_weight("bf16", 4096, 4096, 0x7000000), dev(0x2000, (100, 4096))
    for m in (33, 100):
        x = dev(0x1000, (m, 4096))
        params = {"M": m, "N": 4096, "K": 4096, "wdtype": "bf16", "dtype": "f32", "split_k": 1}
        need = row.info.scratch({**params, "M": 256})
        stream.launches.clear(), stream.compiled.clear()
        assert launch(row, [x, w, y], params, stream, 0x9000000, need) == RAD_OK
        (narrow, _, _, nargs), (kernel, grid, block, args) = stream.launches
        layout = tc.scratch_layout(m, 4096, 4096, "bf16", "skinny")
        rows, cut, mx = 0x9000000 + layout["codes"], tc.SKINNY_CUT, tc.skinny_variant(m)
        splits, per = tc.split(m, 4096, 4096, "bf16", "skinny")
        assert narrow == "r4d_narrow_bf16_dev" and pointers(nargs, [0, 2]) == [0x1000, rows]
        assert (kernel, grid, block) == ("r4d_skinny_gemm_bf16", (4096 // cut.rows, 1, splits), (cut.threads, 1, 1))
        assert splits > 1 and stream.shared == cut.shared(mx)
        assert stream.compiled[-1] == (kernel, ("--gpu-architecture=sm_90a", "-DR4D_WG_ONLY=3", *cut.defines(mx)))
        assert pointers(args, [0, 2, 5, 6, 7]) == [rows, 0x7000000, 0x2000, 0x9000000 + layout["partial"], 0x9000000]
        assert ints(args, [8, 9, 10, 11]) == [m, 4096, 4096, per]
        assert launch(row, [x, w, y], dict(params), stream, 0x9000000, layout["total"] - 1) == RAD_E_NOMEM


# ---- the row on a fake sm_90 ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def on_hopper():
    device = nvidia_fake("sm_90")
    fake = Card(device, EngineStream(device))
    yield fake
    fake.close()
    device.close()


# (N, K, M): M's tails at 9, 17, 33, 100 (x's tiles of 16, 32, 64, 128) and 200 (two of 128); N not a
# multiple of 64; K split (1024 x 4096) and not (576 x 576 at 64 rows: 9 blocks, 9 k-tiles)
SKINNY_CASES = [(576, 576, 9), (1536, 576, 17), (1000, 1536, 33), (1024, 4096, 64), (600, 1024, 100), (576, 576, 200)]


@pytest.mark.parametrize("cut", [str(cut) for cut in tc.SKINNY_CUTS])
@pytest.mark.parametrize("n,k,m", SKINNY_CASES)
def test_the_skinny_row_agrees_with_libref_on_a_fake_hopper(registry, on_hopper, monkeypatch, cut, n, k, m):
    tc = module(registry, "device_tensor_cores")  # the row's (the plugin's module), not this file's import
    monkeypatch.setattr(tc, "KERNEL", "skinny")  # M = 200 too (its default band ends at SKINNY_BELOW)
    monkeypatch.setattr(tc, "SKINNY_CUT", tc.SkinnyCut.parse(cut))
    monkeypatch.setattr(module(registry, "device_streamed_gemm"), "SERVING", None)
    weight, x = make_weight("bf16", n, k, n + k), activations(m, k, m)
    params = {"M": m, "N": n, "K": k, "wdtype": "bf16", "dtype": "f32", "split_k": 1}
    before = len(on_hopper.device.launches)
    got = on_hopper.run(device_row(registry, BF16), [x, None, np.zeros((m, n), np.float32)], params, {1: weight}, read=(2,))[2]
    assert [launch.name for launch in on_hopper.device.launches[before:]] == ["r4d_narrow_bf16_dev", "r4d_skinny_gemm_bf16"]
    want = np.zeros((m, n), np.float32)
    assert host_launch(row_of(registry, "gemm", "libref"), [x, None, want], params, {1: weight}) == RAD_OK
    assert 0 < rel_err(got, want) <= tc.TOLERANCE["bf16"]


# ---- the kernel's text on the host ----------------------------------------------------------------

PTX_START, PTX_END = "// ---- wgmma's PTX", "// ---- end of wgmma's PTX"
DYNAMIC = {"extern __shared__ __align__(1024) u8 wg_shared[];": "u8* wg_shared = r4d_host_shared;",
           "extern __shared__ __align__(1024) u8 sk_shared[];": "u8* sk_shared = r4d_host_shared;",
           # gemm_wgmma.cu's entries, which R4D_WG_ONLY=3 leaves out (the host build's table of entries is
           # read from the text, #if or not)
           "WG_GEMM_ENTRY(TC_BF16, r4d_wgmma_gemm_bf16)": "", "WG_GEMM_ENTRY(TC_E4M3, r4d_wgmma_gemm_e4m3)": ""}
BROKEN = {"no barrier before the MMAs": ("        __syncthreads();\n        u64 a = wg_desc(stage + warpgroup * 64 * WG_KB), b = wg_desc(stage + SK_W_BYTES);",
                                         "        u64 a = wg_desc(stage + warpgroup * 64 * WG_KB), b = wg_desc(stage + SK_W_BYTES);"),
          "no wait_group 1": ("        wg_wait<1>();\n", "\n")}


BAND_START, PLAIN_ENTRY = "// ---- the decode band", "#if !SK_BAND\nextern \"C\""


def host_source(broken: str | None = None, band: bool = False) -> str:
    """gemm_skinny.cu's text as the engine puts it together (common.cu, tensor_core.cu, gemm_wgmma.cu's
    PTX and loader, the kernel), the inline PTX replaced by the host forms
    (tests/test_gemm_wgmma_on_host.py's), the dynamic shared memory the model's window; with the
    entry the build compiles alone (the decode band's with `band`: the host build's table of entries
    is read from the text, #if or not)."""
    tensor_core = (dk.FOLDER / "tensor_core.cu").read_text()
    text = dk.source("gemm_skinny")
    assert tensor_core in text and text.count(PTX_START) == 1
    plain = tensor_core[tensor_core.index("// The split-K epilogue."):]
    host = (FIXTURES / "tensor_core_on_host.h").read_text() + plain + (FIXTURES / "wgmma_on_host.h").read_text()
    text = text.replace(tensor_core, host)
    start, end = text.index(PTX_START), text.index(PTX_END)
    text = text[:start] + text[end:]
    for old, new in DYNAMIC.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    start = text.index(BAND_START)
    if band:  # the plain entry out: from its #if to the band's part
        plain = text.index(PLAIN_ENTRY)
        text = text[:plain] + text[start:]
    else:
        text = text[:start]
    if broken is not None:
        old, new = BROKEN[broken]
        assert text.count(old) == 1, broken
        text = text.replace(old, new)
    return text


def build(mx: int, cut, broken: str | None = None):
    return ON_HOST.build(host_source(broken), ("-DR4D_WG_ONLY=3", *cut.defines(mx)))


def library(mx: int, cut=tc.SKINNY_CUTS[0], broken: str | None = None):
    return early_builds.result(f"g++:gemm_skinny:{broken or 'as written'}:{mx}:{cut}", functools.partial(build, mx, cut, broken))


HOST_BUILDS = [(mx, tc.SKINNY_CUTS[0]) for mx in tc.SKINNY_VARIANTS] + [(64, cut) for cut in tc.SKINNY_CUTS[1:]]
EARLY_BUILDS = {}
if ON_HOST.why() is None:
    EARLY_BUILDS.update({f"g++:gemm_skinny:as written:{mx}:{cut}": functools.partial(build, mx, cut, None)
                         for mx, cut in HOST_BUILDS})


def counter(lib, name: str) -> int:
    return ctypes.c_longlong.in_dll(lib, name).value


def run_on_host(lib, m, n, k, splits, cut):
    """One launch as device_batch_rows plans it for M, in `cut`, with `splits` forced: y, (faults,
    races, MMAs, MMAs left pending) and the values in float64."""
    rng = np.random.default_rng(m + n + k)
    x = rng.standard_normal((m, k), np.float32).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal((n, k), np.float32) / 8).astype(ml_dtypes.bfloat16)
    before, tc.SKINNY_CUT = tc.SKINNY_CUT, cut
    try:
        steps = -(-k // tc.k_tile("bf16", "skinny", m))
        per = -(-steps // splits)
        (gx, gy, gz), block = tc.grid(m, n, -(-steps // per), "skinny", "bf16")
    finally:
        tc.SKINNY_CUT = before
    y = np.full((m, n), np.nan, np.float32)
    partial = np.full((gz, m, n), np.nan, np.float32)
    counters = np.zeros(gx * gy, np.uint32)
    ptr = Pointers()
    args = [ptr(x.view(np.uint16)), ptr(None), ptr(w.view(np.uint16)), ptr(None), ctypes.c_int(0), ptr(y), ptr(partial),
            ptr(counters), ctypes.c_int(m), ctypes.c_int(n), ctypes.c_int(k), ctypes.c_int(per)]
    names = ("r4d_wgmma_faults", "r4d_wgmma_races", "r4d_wgmma_mmas")
    start = [counter(lib, name) for name in names]
    array = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
    assert lib.r4d_host_launch(b"r4d_skinny_gemm_bf16", gx, gy, gz, *block, array) == 0
    lib.r4d_wgmma_left.restype = ctypes.c_longlong
    model = [counter(lib, name) - s for name, s in zip(names, start)]
    assert not counters.any(), "the last block of each tile leaves its counter zero"
    return y, (*model, lib.r4d_wgmma_left()), x.astype(np.float64) @ w.astype(np.float64).T, (gx, gy, gz)


# (M, N, K, splits): each SK_MX with tails in M (3 of 8, 9 of 16, 17 of 32, 33 of 64, 100 of 128), N (w rows past
# the matrix: 136 = 2 x 64 + 8) and K (520 bf16: a k-tile's part), split K (2 and 3, a last split short;
# 16, the most: every load of sk_add_splits' batches), x in two tiles of 128 (M = 130)
HOST_CASES = [(3, 136, 520, 2), (9, 136, 520, 1), (17, 200, 1024, 3), (33, 136, 640, 2), (64, 64, 256, 1), (100, 72, 384, 2),
              (130, 64, 128, 1), (20, 72, 1024, 16)]


@needs_gxx
@pytest.mark.parametrize("m,n,k,splits", HOST_CASES)
def test_the_kernel_as_written_computes_the_product_on_the_modelled_card(m, n, k, splits):
    cut = tc.SKINNY_CUTS[0]
    mx = tc.skinny_variant(m)
    y, (faults, races, mmas, left), want, (gx, gy, gz) = run_on_host(library(mx, cut), m, n, k, splits, cut)
    assert (faults, races, left) == (0, 0, 0) and gz == splits
    step = cut.step(mx)
    # every thread of every block: step / 32 MMAs a k-tile, every k-tile once
    assert mmas == gx * gy * -(-k // (step // 2)) * cut.threads * step // 32
    assert np.isfinite(y).all()
    assert np.abs(y - want).max() / np.abs(want).max() <= 2e-6  # f32 sums of exact products: a misplaced chunk is ~1


@needs_gxx
@pytest.mark.parametrize("cut", [str(cut) for cut in tc.SKINNY_CUTS[1:]])
def test_the_other_cuts_compute_the_product_on_the_modelled_card(cut):
    """Four blocks a multiprocessor (64-byte stages at SK_MX 64), two warpgroups (128 of w's rows a block)."""
    cut = tc.SkinnyCut.parse(cut)
    y, (faults, races, mmas, left), want, _ = run_on_host(library(64, cut), 40, 200, 640, 2, cut)
    assert (faults, races, left) == (0, 0, 0) and mmas > 0
    assert np.abs(y - want).max() / np.abs(want).max() <= 2e-6


@needs_gxx
@pytest.mark.parametrize("broken", list(BROKEN))
def test_the_model_catches_a_skinny_kernel_that_reads_a_stage_out_of_order(broken):
    """Without the barrier a warp's MMAs read the stage before the other threads' copies are in;
    without the wait_group a later tile's copies overwrite a stage whose MMAs are in flight."""
    lib = early_builds.result(f"g++:gemm_skinny:{broken}:32:{tc.SKINNY_CUTS[0]}",
                              functools.partial(build, 32, tc.SKINNY_CUTS[0], broken))
    y, (faults, races, mmas, left), want, _ = run_on_host(lib, 20, 128, 1024, 1, tc.SKINNY_CUTS[0])
    assert races + faults > 0 and mmas > 0, broken


# ---- nvcc's build ---------------------------------------------------------------------------------

def nvcc_build(mx: int, cut):
    folder = early_builds.folder() / "gemm_skinny_sm_90a"
    folder.mkdir(exist_ok=True)
    source, cubin = folder / "gemm_skinny.cu", folder / f"gemm_skinny_{mx}_{str(cut).replace(',', '_')}.cubin"
    source.write_text(dk.source("gemm_skinny"))
    result = subprocess.run([NVCC, "-arch=sm_90a", "-fmad=false", "-std=c++17", "-DR4D_WG_ONLY=3", *cut.defines(mx),
                             "-cubin", "-Xptxas", "-v", "-o", str(cubin), str(source)], capture_output=True, text=True)
    return result, sass(cubin) if result.returncode == 0 else None


if NVCC is not None:
    EARLY_BUILDS.update({f"nvcc:gemm_skinny:{mx}": functools.partial(nvcc_build, mx, tc.SKINNY_CUTS[0]) for mx in (16, 64)})


@needs_nvcc
@pytest.mark.parametrize("mx", [16, 64])
def test_the_sm_90a_build_runs_hgmma_of_x_rows_without_spills(mx):
    result, listing = early_builds.result(f"nvcc:gemm_skinny:{mx}", functools.partial(nvcc_build, mx, tc.SKINNY_CUTS[0]))
    assert result.returncode == 0, result.stderr[-2000:]
    report = result.stdout + result.stderr
    assert "0 bytes spill stores" in report and not re.search(r"[1-9]\d* bytes spill", report), report
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    assert registers * tc.SKINNY_CUT.threads * tc.SKINNY_CUT.blocks(mx) <= 65536, registers
    if listing is not None:
        assert f"HGMMA.64x{mx}x16.F32.BF16" in listing, listing[:2000]


# ---- on a card ------------------------------------------------------------------------------------

CARD_CASES = [(4096, 4096, 9), (1000, 4096, 17), (14336, 4096, 33), (4096, 14336, 64), (1536, 576, 100),
              (576, 1536, 64), (28672, 4096, 64), (6144, 4096, 128)]


@pytest.mark.skipif(DEVICE is None or tc.sm_of(getattr(DEVICE, "target", "")) != 90,
                    reason=f"the skinny kernel needs an sm_90 card: {WHY or getattr(DEVICE, 'target', '')}")
@pytest.mark.parametrize("cut,n,k,m", [(str(tc.SKINNY_CUTS[0]), *case) for case in CARD_CASES]
                         + [(str(cut), *CARD_CASES[i]) for cut in tc.SKINNY_CUTS[1:] for i in (1, 3, 7)])
def test_the_skinny_kernel_agrees_with_libref_on_a_card(registry, monkeypatch, cut, n, k, m):
    """M's tails of every SK_MX, N not a multiple of 64 (1000), K split (most) and not (28672 x 4096 at
    64 rows: 448 blocks, one split); the other cuts on three of them."""
    tc = module(registry, "device_tensor_cores")
    monkeypatch.setattr(tc, "SKINNY_CUT", tc.SkinnyCut.parse(cut))
    monkeypatch.setattr(module(registry, "device_streamed_gemm"), "SERVING", None)
    fixture = Card(DEVICE, STREAM)
    try:
        gemm_case(registry, fixture, monkeypatch, "skinny", "bf16", n, k, m)
    finally:
        fixture.close()
