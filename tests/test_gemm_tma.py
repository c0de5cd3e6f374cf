"""gemm_tma.cu (the tensor-core GEMM fed by TMA from a producer warp, R4D_TC_KERNEL=tma) without a
card: its cuts and their launch rule, the row's plan (x narrowed, r4d_tma_maps writing both tensor
maps into the scratch, then the GEMM reading them), the row on a fake sm_90 card
(tests/fixtures/r4d_fake_kernels.py: the maps' form records what each map describes, the GEMM's form
reads x and w through them) against libref within the stated tolerance, and nvcc's sm_90a build of
every cut the bench offers (registers, no spills: every PTX instruction assembled by ptxas).
The same row on a real card: tests/test_device_batch_rows.py with R4D_TC_KERNEL=tma."""

import functools
import importlib
import re
import subprocess

import numpy as np
import pytest

import early_builds
from device_batch_support import fp8_weight, nvidia_fake
from device_sources import NVCC, sass
from radiance.abi import RAD_E_NOMEM, RAD_OK
from radiance.engine.running.device_stream import EngineStream
from radiance.plugins.kernels.libr4d.device_tensor_cores import TMA_CUTS
from test_device_rows_host import dev, device_weight, ints, launch, pointers
from test_device_rows_support import Card
from test_device_tensor_cores import BF16, FP8, CASES, Recording, device_row, module
from test_libr4d_support import activations, make_weight, registry, rel_err, row_of  # noqa: F401 (registry)
from test_libr4d_support import launch as host_launch


def test_the_tma_cuts_fit_the_launch_rule_and_say_what_is_wrong(registry):
    tc = module(registry, "device_tensor_cores")
    assert tc.TMA_CUT == tc.TMA_CUTS[0] and len(set(tc.TMA_CUTS)) == len(tc.TMA_CUTS)
    for cut in tc.TMA_CUTS:
        assert tc.TmaCut.parse(str(cut)) == cut and cut.shared <= 64 << 10
        # a consumer warpgroup a 64 rows, and a producer warp where there are one or two
        assert cut.threads == {64: 128 + 32, 128: 256 + 32, 192: 384}[cut.rows]
        assert cut.blocks == {(64, 128): 4, (128, 112): 2, (128, 128): 2}.get((cut.rows, cut.cols), 1)
    # SwiGLU's: two stages of 128 bytes of K, which 128 columns would pass 64 KiB with by their barriers
    assert tc.SWIGLU_CUT == tc.TMA_CUTS[1] and tc.SWIGLU_CUT.shared == 2 * 240 * 128 + 2 * 16 + 16
    assert tc.TmaCut(128, 128, 2).stage_bytes * 2 == 65536
    assert tc.TmaCut.parse("128,64,3").shared == 3 * 256 * 64 + 3 * 16 + 16 and str(tc.TmaCut.parse("256,32,4,128")) == "256,32,4"
    assert tc.TmaCut.parse("256,32,4,192").defines()[0] == "-DWG_WARPGROUPS=3"
    cluster = tc.TmaCut.parse("128,64,3,128,2,2")
    assert (cluster.cluster, cluster.x_box, cluster.w_box, str(cluster)) == (4, 64, 64, "128,64,3,128,2,2")
    assert "-DTM_CLUSTER_M=2" in cluster.defines() and "-DTM_CLUSTER_N=1" in tc.TmaCut.parse("128,64,3,128,2,1").defines()
    # a cluster's tiles: 2048 x 6144 is 8 x 48 of 2 x 1; 300 rows leave the second block of each cluster past M
    assert tc.TmaCut.parse("128,64,3,128,2,1").blocks_for(2048, 6144) == 16 * 48
    assert tc.TmaCut.parse("128,64,3,128,2,2").blocks_for(300, 200) == 2 * 1 * 4
    for text, match in [("128,64", "three, four or six"), ("128,x,3", "three, four or six"), ("192,64,3", "cols 112, 128 or 256"),
                        ("128,16,3", "k_bytes"), ("128,64,1", "stages >= 2"), ("128,64,4", "65536"),
                        ("256,128,2", "65536"), ("128,64,2,192", "192 with 256"), ("256,32,4,256", "rows 64, 128 or 192"),
                        ("256,32,5,192", "65536"), ("128,64,3,128,2", "three, four or six"),
                        ("128,64,3,128,4,1", "cluster_m and cluster_n 1 or 2"), ("256,32,4,192,2,1", "a producer warp"),
                        ("256,32,4,64", "64 with 128 cols"), ("128,128,2", "65536"), ("112,128,2,64", "112 cols with 128 rows"),
                        ("112,64,3,128,2,1", "112 cols with 128 rows and no cluster")]:
        with pytest.raises(ValueError, match=match):
            tc.TmaCut.parse(text)


@pytest.mark.parametrize("cut", ["112,128,2", "128,64,3", "256,32,5", "256,32,4,192", "128,64,3,128,2,2"])
def test_a_tma_plan_narrows_x_builds_its_maps_then_runs_the_gemm_on_them(registry, monkeypatch, cut):
    tc = module(registry, "device_tensor_cores")
    monkeypatch.setattr(tc, "KERNEL", "tma")
    monkeypatch.setattr(tc, "TMA_CUT", tc.TmaCut.parse(cut))
    cut = tc.TMA_CUT
    stream, row = Recording("sm_90"), device_row(registry, BF16)
    w, x, y = device_weight("bf16", 4096, 4096, 0x7000000), dev(0x1000, (300, 4096)), dev(0x2000, (300, 4096))
    params = {"M": 300, "N": 4096, "K": 4096, "wdtype": "bf16", "dtype": "f32", "split_k": 1}
    need = row.info.scratch({**params, "M": 2048})
    assert launch(row, [x, w, y], params, stream, 0x9000000, need) == RAD_OK
    (narrow, *_), (maps, mgrid, mblock, margs), (kernel, grid, block, args) = stream.launches
    layout = tc.scratch_layout(300, 4096, 4096, "bf16", "tma")
    rows, at = 0x9000000 + layout["codes"], 0x9000000 + layout["maps"]
    assert (narrow, maps, mgrid, mblock) == ("r4d_narrow_bf16_dev", "r4d_tma_maps", (1, 1, 1), (32, 1, 1))
    # the maps: x's bf16 rows and w's codes, [300 | 4096 rows, 8192 bytes], into the scratch's 256 bytes
    assert pointers(margs, [0, 1, 5]) == [rows, 0x7000000, at] and ints(margs, [2, 3, 4]) == [300, 4096, 8192]
    assert at % 128 == 0 and layout["total"] >= layout["maps"] + 256 and layout["total"] <= need
    assert layout["maps"] >= layout["codes"] + 2 * 300 * 4096
    splits, per = tc.split(300, 4096, 4096, "bf16", "tma")
    # the clusters' tiles in clusters: 2 x 1 tiles of 128 x 128 for 2 x 2 clusters (the second row past M at 300)
    tiles = -(-300 // (cut.rows * cut.cluster_m)) * -(-4096 // (cut.cols * cut.cluster_n)) * cut.cluster
    assert (kernel, grid, block) == ("r4d_tma_gemm_bf16", (tiles, 1, splits), (cut.threads, 1, 1))
    assert splits == (1 if tiles >= 132 * cut.blocks else splits) and per * splits * cut.k_bytes // 2 >= 4096
    assert stream.shared == cut.shared
    assert pointers(args, [0, 4]) == [at, 0x2000] and ints(args, [7, 8, 9, 10]) == [300, 4096, 4096, per]
    options = ("--gpu-architecture=sm_90a", "-DR4D_WG_ONLY=3", *tc.tma_defines(cut), "-DWG_GROUP=16")
    assert stream.compiled == [("r4d_narrow_bf16_dev", ()), ("r4d_tma_maps", (*options[:2], "-DR4D_TM_ONLY=3", *options[2:])),
                               ("r4d_tma_gemm_bf16", (*options[:2], "-DR4D_TM_ONLY=1", *options[2:]))]
    assert launch(row, [x, w, y], dict(params), stream, 0x9000000, layout["total"] - 1) == RAD_E_NOMEM


def test_a_tma_fp8_plan_maps_the_e4m3_codes(registry, monkeypatch):
    tc = module(registry, "device_tensor_cores")
    monkeypatch.setattr(tc, "KERNEL", "tma")
    stream, row = Recording("sm_90"), device_row(registry, FP8)
    from radiance.abi import RAD_DT_ENCODED, RadTensor, RadWeightPlanes, rad_device_tensor
    weight = fp8_weight(registry, 1024, 576, 3)
    planes = [rad_device_tensor(0x7000000 + 0x1000000 * i, 6, (t.data.size,), 1) for i, t in enumerate(weight.planes)]
    w = RadTensor(data=RadWeightPlanes(encoding=weight.encoding, rows=1024, cols=576, planes=planes),
                  dtype=RAD_DT_ENCODED, ndim=2, shape=(1024, 576, 0, 0))
    params = {"M": 200, "N": 1024, "K": 576, "wdtype": "fp8_channel", "dtype": "f32", "split_k": 1}
    need = row.info.scratch({**params, "M": 256})
    assert launch(row, [dev(0x1000, (200, 576)), w, dev(0x2000, (200, 1024))], params, stream, 0x9000000, need) == RAD_OK
    assert [name for name, *_ in stream.launches] == ["r4d_quantize_e4m3_dev", "r4d_tma_maps", "r4d_tma_gemm_e4m3"]
    layout = tc.scratch_layout(200, 1024, 576, "e4m3", "tma")
    margs, args = stream.launches[1][3], stream.launches[2][3]
    assert pointers(margs, [0, 1, 5]) == [0x9000000 + layout["codes"], 0x7000000, 0x9000000 + layout["maps"]]
    assert ints(margs, [4]) == [576]  # a byte an e4m3 value
    assert pointers(args, [0, 1, 2]) == [0x9000000 + layout["maps"], 0x9000000 + layout["scales"], 0x8000000]
    assert ints(args, [3]) == [1]


@pytest.fixture(scope="module")
def on_hopper():
    device = nvidia_fake("sm_90")
    card = Card(device, EngineStream(device))
    yield card
    card.close()
    device.close()


# every case in the default cut, a bf16 and an fp8 case (tails, split K) in the others
ARITHMETIC = [(str(TMA_CUTS[0]), *case) for case in CASES] + [(str(cut), *case) for cut in TMA_CUTS[1:]
                                                              for case in (CASES[2], CASES[6])]


@pytest.mark.parametrize("cut,fmt,n,k,m", ARITHMETIC)
def test_the_tma_kernels_arithmetic_agrees_with_libref(registry, on_hopper, monkeypatch, cut, fmt, n, k, m):
    tc = module(registry, "device_tensor_cores")
    monkeypatch.setattr(tc, "KERNEL", "tma")
    monkeypatch.setattr(tc, "TMA_CUT", tc.TmaCut.parse(cut))
    monkeypatch.setattr(module(registry, "device_streamed_gemm"), "SERVING", None)  # the tile kernels, at every M
    weight = make_weight(fmt, n, k, n + k) if fmt == "bf16" else fp8_weight(registry, n, k, n + k, fmt[4:] or "tensor")
    x = activations(m, k, m)
    params = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
    row = device_row(registry, BF16 if fmt == "bf16" else FP8)
    before = len(on_hopper.device.launches)
    got = on_hopper.run(row, [x, None, np.zeros((m, n), np.float32)], params, {1: weight}, read=(2,))[2]
    kind = "bf16" if fmt == "bf16" else "e4m3"
    first = "r4d_narrow_bf16_dev" if kind == "bf16" else "r4d_quantize_e4m3_dev"
    assert [launch.name for launch in on_hopper.device.launches[before:]] == [first, "r4d_tma_maps", f"r4d_tma_gemm_{kind}"]
    want = np.zeros((m, n), np.float32)
    assert host_launch(row_of(registry, "gemm", "libref"), [x, None, want], params, {1: weight}) == RAD_OK
    err = rel_err(got, want)
    assert 0 < err <= tc.TOLERANCE[kind], (fmt, n, k, m, err)


# ---- nvcc's sm_90a build, as nvrtc builds it for a card --------------------------------------------

def tc_module():
    return importlib.import_module("radiance.plugins.kernels.libr4d.device_tensor_cores")


def nvcc_build(only: int, cut: str):
    """nvcc's result (ptxas' report in its stderr) for entry R4D_TM_ONLY=only of gemm_tma.cu in `cut`,
    with the options the row asks nvrtc for (device_tensor_cores.options) in that cut."""
    dk = importlib.import_module("radiance.plugins.kernels.libr4d.device_kernels")
    tc = importlib.import_module("radiance.plugins.kernels.libr4d.device_tensor_cores")
    folder = early_builds.folder() / "gemm_tma_sm_90a"
    folder.mkdir(exist_ok=True)
    source, cubin = folder / "gemm_tma.cu", folder / f"gemm_tma_{only}_{cut.replace(',', '_')}.cubin"
    source.write_text(dk.source("gemm_tma"))
    options = [o for o in tc.options(tc.TMA_ENTRIES[only - 1])[1:] if not o.startswith(("-DWG_", "-DTM_"))]
    options += [*tc.tma_defines(tc.TmaCut.parse(cut)), f"-DWG_GROUP={tc.WGMMA_GROUP}"]
    return subprocess.run([NVCC, "-arch=sm_90a", "-fmad=false", *options, "-cubin", "-Xptxas", "-v", "-o", str(cubin),
                           str(source)], capture_output=True, text=True)


# (cut, entry): each entry in the default cut; m64n256 bf16 and e4m3, three warpgroups (thread 0
# loading) and the 32-byte swizzle in the others (ptxas takes ~5 s on a 256-column entry)
BUILDS = [("128,64,3", 1), ("128,64,3", 2), ("128,64,3", 3), ("112,128,2", 1), ("112,128,2", 2), ("112,128,2", 3),
          ("256,32,5", 1), ("256,32,4,192", 1), ("256,64,2,192", 2), ("128,32,7", 3)]
EARLY_BUILDS = {f"nvcc:gemm_tma:{only}:{cut}": functools.partial(nvcc_build, only, cut)
                for cut, only in BUILDS} if NVCC is not None else {}


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: gemm_tma.cu's sm_90a build is not checked here")
@pytest.mark.parametrize("cut,only", BUILDS)
def test_gemm_tma_builds_for_sm_90a_without_spills(cut, only):
    """ptxas assembles every instruction (TMA, mbarriers, tensormap.replace, wgmma) and keeps each
    entry in registers: two blocks a multiprocessor at 128 x 128 (at most 96 a thread: 18 warps, 5 on a
    sub-partition), one otherwise (at most 168: 9 or 12 warps), and no wgmma serialised."""
    entry = ("r4d_tma_gemm_bf16", "r4d_tma_gemm_e4m3", "r4d_tma_maps")[only - 1]
    result = early_builds.result(f"nvcc:gemm_tma:{only}:{cut}", functools.partial(nvcc_build, only, cut))
    assert result.returncode == 0, result.stderr[-2000:]
    report = result.stderr
    assert f"Compiling entry function '{entry}' for 'sm_90a'" in report and "0 bytes spill stores" in report
    assert "Potential Performance Loss" not in report, report  # ptxas serialising the wgmmas
    used = int(report.split("Used ")[1].split(" registers")[0])
    assert used <= (96 if tc_module().TmaCut.parse(cut).blocks > 1 or only == 3 else 168), (entry, cut, used)
    cubin = early_builds.folder() / "gemm_tma_sm_90a" / f"gemm_tma_{only}_{cut.replace(',', '_')}.cubin"
    listing = sass(cubin)
    if listing is not None and only < 3:  # TMA's loads, the mbarriers, wgmma with both operands by descriptor
        cols = tc_module().TmaCut.parse(cut).cols
        mma = f"HGMMA.64x{cols}x16.F32.BF16" if only == 1 else f"QGMMA.64x{cols}x32.F32.E4M3.E4M3"
        assert "UTMALDG.2D" in listing and "SYNCS.ARRIVE.TRANS64" in listing and "UTMACCTL.IV" in listing, entry
        mmas = [line for line in listing.splitlines() if mma in line]
        assert mmas and all(re.search(r"R\d+, gdesc\[UR\d+\], R\d+", line) for line in mmas), mmas
        assert "LDL" not in listing and "STL" not in listing


def test_the_streamed_gemm_keeps_batched_decode_where_tma_takes_the_tiles(registry, monkeypatch):
    """R4D_TC_KERNEL=tma replaces the tile kernel only: M <= 32 still takes the streamed GEMM."""
    tc, sg = module(registry, "device_tensor_cores"), module(registry, "device_streamed_gemm")
    monkeypatch.setattr(tc, "KERNEL", "tma")
    monkeypatch.setattr(sg, "SERVING", sg.Serving(sg.StreamedCut()))
    stream, row = Recording("sm_90"), device_row(registry, BF16)
    w, y = device_weight("bf16", 4096, 4096, 0x7000000), dev(0x2000, (16, 4096))
    params = {"M": 16, "N": 4096, "K": 4096, "wdtype": "bf16", "dtype": "f32", "split_k": 1}
    assert launch(row, [dev(0x1000, (16, 4096)), w, y], params, stream, 0x9000000, row.info.scratch({**params, "M": 256})) == RAD_OK
    assert stream.launches[0][0] == sg.entry("bf16", 16) and "r4d_tma_maps" not in [name for name, *_ in stream.launches]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: gemm_tma.cu's sm_90a build is not checked here")
@pytest.mark.parametrize("cut", ["128,64,3", "128,32,7", "112,128,2"])
def test_the_grouped_and_swiglu_entries_build_beside_the_bf16_one_without_spills(cut):
    """R4D_TM_ONLY=1 builds r4d_tma_gemm_bf16 with its grouped and SwiGLU forms (the fused prefill rows'):
    in a cut of 128 x 128 or SwiGLU's 128 x 112, each entry two blocks a multiprocessor (at most 96 registers), no spill, no
    wgmma serialised; the maps' build (R4D_TM_ONLY=3) has r4d_tma_maps_group beside r4d_tma_maps."""
    tc = tc_module()
    for only, entries in [(1, ("r4d_tma_gemm_bf16", tc.TMA_GROUP, tc.TMA_SWIGLU)), (3, ("r4d_tma_maps", tc.TMA_MAPS_GROUP))]:
        result = early_builds.result(f"nvcc:gemm_tma:{only}:{cut}", functools.partial(nvcc_build, only, cut))
        assert result.returncode == 0, result.stderr[-2000:]
        assert "Potential Performance Loss" not in result.stderr, result.stderr
        reports = {part.split("'")[0]: part for part in result.stderr.split("Compiling entry function '")[1:]}
        assert set(entries) <= set(reports), (cut, sorted(reports))
        for entry in entries:
            report = reports[entry]
            assert "0 bytes spill stores" in report, (entry, report)
            assert int(report.split("Used ")[1].split(" registers")[0]) <= 96, (entry, cut, report)
