"""gemm_streamed.cu (the streamed GEMM of batched decode, M = 9..64) run on the host: its real text
built with g++ behind tests/fixtures/cuda_on_host.h, with tensor_core_on_host.h's mma.m16n8k16 and
cvt.rn.bf16x2 (warp-collectives over the PTX fragment layouts), its entries called with numpy
arrays as a card's launch passes them. What a card's run cannot show in CI: the swapped fragments
(weights as A, x as B), the permuted k slots a lane's 16 bytes fill and the x elements its B
fragments take to match, the double-buffered stages of x and their barriers, the rows past M and N,
K tails inside a step and a stage, split K and its counters, e4m3's decoding and scales, in several
cuts. Against a float64 product of the same bf16 x and weight values: the kernel's only rounding
is x's (the row's contract), so f32 accumulation leaves ~1e-6, and any fragment or slot mistake
is O(1). And nvcc's sm_90a build of every entry: no spills, its registers within the blocks a
multiprocessor the split plans for. Skipped, saying so, where g++ (or nvcc) is missing."""

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
from radiance.abi import RAD_OK
from radiance.engine.running.device_stream import EngineStream
from device_batch_support import Pointers, fixture_module, fp8_weight, nvidia_fake
from device_sources import NVCC
from test_device_rows_support import Card
from test_libr4d_support import activations, make_weight, registry, rel_err, row_of  # noqa: F401 (registry)
from test_libr4d_support import launch as host_launch

FIXTURES = Path(__file__).parent / "fixtures"
ON_HOST = fixture_module("cuda_on_host")
dk = importlib.import_module("radiance.plugins.kernels.libr4d.device_kernels")
sg = importlib.import_module("radiance.plugins.kernels.libr4d.device_streamed_gemm")
needs_gxx = pytest.mark.skipif(ON_HOST.why() is not None, reason=str(ON_HOST.why()))
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: gemm_streamed.cu's sm_90a build is not checked here")
# the accumulation's own error: f32 sums of exact products (bf16 x bf16), far below any layout mistake
ACCUMULATION = 1e-5


def host_source() -> str:
    """gemm_streamed.cu as the engine puts it together, tensor_core.cu's inline PTX replaced by its
    host forms (its split-K epilogue, plain C++, kept)."""
    tensor_core = (dk.FOLDER / "tensor_core.cu").read_text()
    text = dk.source("gemm_streamed")
    assert tensor_core in text
    plain = tensor_core[tensor_core.index("// The split-K epilogue."):]
    return text.replace(tensor_core, (FIXTURES / "tensor_core_on_host.h").read_text() + plain)


def host_library(cut):
    """The host build of every entry in `cut` (each an early build, tests/early_builds.py: g++ takes
    several seconds a cut, begun beside the tests before this module's)."""
    key = build_name(cut)
    assert key in EARLY_BUILDS or ON_HOST.why() is not None, f"{cut} is not in CUTS (add it there, so that it is built early)"
    return early_builds.result(key, functools.partial(ON_HOST.build, host_source(), cut.defines()))


def build_name(cut) -> str:
    return f"g++:gemm_streamed:{cut}"


def encode(kind, w):
    """(codes as stored, the f32 scales or None, the values the kernel multiplies by)"""
    if kind == "bf16":
        codes = w.astype(ml_dtypes.bfloat16)
        return codes.view(np.uint8), None, codes.astype(np.float64)
    scale = (np.abs(w).max(axis=1) / 448.0).astype(np.float32)
    codes = (w / scale[:, None]).astype(ml_dtypes.float8_e4m3fn)
    return codes.view(np.uint8), scale, codes.astype(np.float64) * scale[:, None].astype(np.float64)


def launch(library, name, grid, block, args):
    params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
    assert library.r4d_host_launch(name.encode(), *grid, *block, params) == 0, name


def run(kind, m, n, k, cut, splits, w_stride=1, seed=0):
    """The entry for M over an [N, K] weight in `cut`, K in `splits` chunks of whole stages, then
    (split) r4d_streamed_reduce: (y, the float64 reference)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    w[1, : k // 3] *= 1e-3  # small weights: e4m3's subnormal codes
    codes, scale, values = encode(kind, w)
    if kind == "e4m3" and not w_stride:
        scale = scale[:1].copy()
        values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * np.float64(scale[0])
    x = activations(m, k, seed + 1)
    stages = -(-k // cut.stage)
    k_chunk = -(-stages // splits) * cut.stage
    assert -(-k // k_chunk) == splits, "a split left empty"
    y = np.full((m, n), np.nan, np.float32)
    partial = np.full(splits * m * n, np.nan, np.float32) if splits > 1 else None
    ptr = Pointers()
    library = host_library(cut)  # every entry (the host's table names them all)
    launch(library, sg.entry(kind, m), *sg.grid(n, splits, cut),
           [ptr(x), ptr(codes), ptr(scale), ctypes.c_int(w_stride), ptr(y), ptr(partial), ctypes.c_int(m), ctypes.c_int(n),
            ctypes.c_int(k), ctypes.c_int(k_chunk)])
    if splits > 1:
        assert np.isnan(y).all(), "a split launch leaves y to the reduction"
        launch(library, sg.REDUCE, *sg.reduce_grid(m, n),
               [ptr(partial), ptr(scale), ctypes.c_int(w_stride), ptr(y), ctypes.c_int(m), ctypes.c_int(n), ctypes.c_int(splits)])
    want = x.astype(ml_dtypes.bfloat16).astype(np.float64) @ values.T
    return y, want


def rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


# two cuts (each a g++ build of several seconds): two warps of one tile (32 rows a block: several
# blocks of a small N) over 64-element stages, two steps in flight, a 16-byte load a lane a row a
# step; one warp of two tiles over 128-element stages, three steps in flight, two loads (bf16: 16
# elements a lane, 4 MMAs a step, as e4m3 takes them)
SMALL = sg.StreamedCut(warps=2, tiles=1, stage=64, pipe=2)
DEEP = sg.StreamedCut(warps=1, tiles=2, stage=128, pipe=3, chunks=2)
CUTS = (SMALL, DEEP)
EARLY_BUILDS = {} if ON_HOST.why() is not None else {
    build_name(cut): functools.partial(ON_HOST.build, host_source(), cut.defines()) for cut in CUTS}
CASES = [
    # (kind, M, N, K, cut, splits): MT = 16, 32 and 64; rows past M and N; K ending inside a step
    # (328: 5 stages and a step of 8 of 32; 520: of 8 of DEEP's 64, one of its two loads) and inside a
    # stage; split K
    ("bf16", 13, 80, 328, SMALL, 1),
    ("bf16", 32, 72, 520, DEEP, 3),
    ("bf16", 50, 40, 256, DEEP, 2),
    ("bf16", 64, 48, 192, SMALL, 1),
    ("e4m3", 20, 48, 336, SMALL, 2),
    ("e4m3", 9, 40, 128, DEEP, 1),
    ("e4m3", 64, 32, 256, DEEP, 2),
]


@needs_gxx
@pytest.mark.parametrize("kind,m,n,k,cut,splits", CASES)
def test_the_streamed_gemm_agrees_with_f64_of_bf16_x(kind, m, n, k, cut, splits):
    y, want = run(kind, m, n, k, cut, splits)
    assert np.isfinite(y).all() and rel(y, want) <= ACCUMULATION, rel(y, want)


@needs_gxx
def test_the_streamed_gemm_scales_by_one_scale_for_all_rows():
    """fp8 with a per-tensor scale (w_stride 0), split."""
    y, want = run("e4m3", 17, 32, 256, SMALL, 2, w_stride=0, seed=4)
    assert np.isfinite(y).all() and rel(y, want) <= ACCUMULATION, rel(y, want)


@needs_gxx
def test_a_wrong_stage_buffer_is_caught():
    """The test's own check: x's stages read from the other buffer gives a large error, not a pass."""
    text = host_source()
    wrong = text.replace("&gs_x[(s / STEPS) & 1][0]", "&gs_x[((s / STEPS) + 1) & 1][0]")
    assert wrong != text
    cut = SMALL
    m, n, k = 16, 32, 256
    rng = np.random.default_rng(1)
    codes, _, values = encode("bf16", (rng.standard_normal((n, k)) * 0.05).astype(np.float32))
    x = activations(m, k, 2)
    y = np.full((m, n), np.nan, np.float32)
    ptr = Pointers()
    launch(ON_HOST.build(wrong, cut.defines()), sg.entry("bf16", m), *sg.grid(n, 1, cut),
           [ptr(x), ptr(codes), ptr(None), ctypes.c_int(0), ptr(y), ptr(None), ctypes.c_int(m), ctypes.c_int(n),
            ctypes.c_int(k), ctypes.c_int(k)])
    want = x.astype(ml_dtypes.bfloat16).astype(np.float64) @ values.T
    assert rel(y, want) > 1e-2


@needs_gxx
@pytest.mark.parametrize("fmt,m", [("bf16", 20), ("fp8_channel", 40)])
def test_the_row_launches_the_real_kernel_that_agrees_with_libref(registry, monkeypatch, fmt, m):
    """The tensor-core gemm row with the streamed GEMM on, on a fake sm_90 card whose kernel is this
    source built on the host: the row's packed arguments as the kernel reads them, its split and
    scratch, against libref within the row's bf16 tolerance (x rounded to bf16 is the only loss)."""
    lib = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    streamed = importlib.import_module(f"{lib.module.__name__}.device_streamed_gemm")
    tc = importlib.import_module(f"{lib.module.__name__}.device_tensor_cores")
    monkeypatch.setattr(streamed, "SERVING", streamed.Serving(SMALL))
    device = nvidia_fake("sm_90", ON_HOST.kernels(host_source(), lambda launch: streamed.SERVING.cut.defines()))
    card = Card(device, EngineStream(device))
    try:
        n, k = 96, 576
        weight = make_weight("bf16", n, k, 7) if fmt == "bf16" else fp8_weight(registry, n, k, 7, "channel")
        x = activations(m, k, 8)
        params = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
        row = next(row for row in lib.rows if row.name == ("r4dchain_gemm_tc_bf16_dev" if fmt == "bf16" else "r4dchain_gemm_tc_fp8_dev"))
        got = card.run(row, [x, None, np.full((m, n), np.nan, np.float32)], params, {1: weight}, read=(2,))[2]
        ran, added = device.launches
        assert ran.name == streamed.entry("bf16" if fmt == "bf16" else "e4m3", m) and ran.grid == (3, 1, 2), ran
        assert added.name == streamed.REDUCE, added
        want = np.zeros((m, n), np.float32)
        assert host_launch(row_of(registry, "gemm", "libref"), [x, None, want], params, {1: weight}) == RAD_OK
        assert np.isfinite(got).all() and 0 < rel_err(got, want) <= tc.TOLERANCE["bf16"], rel_err(got, want)
    finally:
        card.close()
        device.close()


@needs_nvcc
def test_nvcc_builds_every_entry_for_sm_90a_without_spills(tmp_path):
    source = tmp_path / "gemm_streamed.cu"
    source.write_text(dk.source("gemm_streamed"))
    done = subprocess.run([NVCC, "-arch=sm_90a", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "gs.cubin"),
                           str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    report = done.stderr
    entries = re.findall(r"Compiling entry function '(\w+)'", report)
    assert sorted(entries) == sorted([*sg.ENTRIES, sg.REDUCE]), entries
    assert " 0 bytes spill stores" in report and not re.search(r"[1-9]\d* bytes spill", report), report
    cut = sg.StreamedCut()
    for name, registers in zip(entries, re.findall(r"Used (\d+) registers", report)):
        if name == sg.REDUCE:
            assert int(registers) * sg.REDUCE_THREADS <= 65536, registers
            continue
        blocks = cut.blocks_a_multiprocessor(int(name.rsplit("_m", 1)[1]), name.split("_")[3])
        assert int(registers) * cut.threads * blocks <= 65536, (name, registers, blocks)
