"""gemv.cu's tensor-core path (M >= GEMV_TC_FROM activation rows; bf16, q8_0, q4_1 and e4m3 weights)
run on the host: its real text built with g++ behind tests/fixtures/cuda_on_host.h, with the host forms of
mma.m16n8k16 bf16 and cvt.rn.bf16x2 (tests/fixtures/tensor_core_on_host.h), its entry called with
numpy arrays as a card's launch would pass them. What a card's run cannot show in CI: the fragments'
owners, the permuted k slots a lane's bytes fill, the activation remainders, q8_0's block scales, the
rows past N, the warps' K parts met in shared memory, split K, the folded rmsnorm and the epilogues.
Against a float64 reference within the GEMV's tolerance, and against the FMA path (the same source
with the tensor-core path turned off); and the FMA path's e4m3 case at M = 1, the fp8 decode's. Skipped,
saying so, where g++ is missing."""

import ctypes
import functools
import importlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import early_builds
from device_batch_support import Pointers, fixture_module
from test_libr4d_support import activations

FIXTURES = Path(__file__).parent / "fixtures"
ON_HOST = fixture_module("cuda_on_host")
pytestmark = pytest.mark.skipif(ON_HOST.why() is not None, reason=str(ON_HOST.why()))

dk = importlib.import_module("radiance.plugins.kernels.libr4d.device_kernels")
FMT = {"bf16": 2, "q8_0": 3, "q4_1": 4, "fp8_channel": 5}
F32 = 0
DEFAULT = (4, 8, 1)  # GemvShape's default: warps, rows, steps in flight
SIXTEEN = (4, 4, 2)  # the cut before it: row groups of 16


def build(fmt, mode, norm, tensor_cores=True, shape=DEFAULT):
    """gemv.cu for the host: the host tensor-core forms between common.cu and the GEMV's parts."""
    common = (dk.FOLDER / "common.cu").read_text()
    text = dk.source("gemv")
    assert text.startswith(common)
    forms = (FIXTURES / "tensor_core_on_host.h").read_text()
    source = "#define R4D_GEMV_TC_ON_HOST 1\n" + common + "\n" + forms + text[len(common):]
    options = (f"-DR4D_GEMV_FMT={FMT[fmt]}", f"-DR4D_GEMV_MODE={mode}", f"-DR4D_GEMV_NORM={norm}",
               f"-DGEMV_WARPS={shape[0]}", f"-DGEMV_ROWS={shape[1]}", f"-DGEMV_PIPE={shape[2]}",
               f"-DGEMV_TC_FROM={8 if tensor_cores else 16}")
    return ON_HOST.build(source, options)


FORMATS = ["bf16", "q8_0", "q4_1", "fp8_channel"]
CASES = [(8, 40, 576, 1, DEFAULT), (5, 16, 1024, 1, DEFAULT), (6, 72, 2048, 2, DEFAULT), (7, 72, 512, 2, SIXTEEN)]
# Every library the tests ask for, each an early build (tests/early_builds.py): g++ takes a second or
# two a library, so the 18 begin beside the tests before this module's, in the order its tests ask.
LIBRARIES = [(fmt, 0, 0, tensor_cores, shape) for shape in dict.fromkeys(case[4] for case in CASES)
             for fmt in FORMATS for tensor_cores in (True, False)]
LIBRARIES += [("bf16", 2, 1, True, DEFAULT), ("bf16", 1, 0, True, DEFAULT)]


def build_name(fmt, mode, norm, tensor_cores, shape) -> str:
    return f"g++:gemv_tc:{fmt}:mode{mode}:norm{norm}:{'tc' if tensor_cores else 'fma'}:{shape[0]}x{shape[1]}x{shape[2]}"


EARLY_BUILDS = {} if ON_HOST.why() is not None else {build_name(*key): functools.partial(build, *key)
                                                        for key in LIBRARIES}


def library(fmt, mode, norm, tensor_cores=True, shape=DEFAULT):
    """The built library: its early build's value."""
    key = (fmt, mode, norm, tensor_cores, shape)
    assert key in LIBRARIES, f"{key} is not in LIBRARIES (add it there, so that it is built early)"
    return early_builds.result(build_name(*key), functools.partial(build, *key))


def encode(fmt, w):
    """(codes as stored, the scales as stored or None, the values the kernel reads), and q4_1's minimum
    plane (stored negated: value = code * scale - minimum) after them"""
    if fmt == "q4_1":  # f16 scale and minimum a block of 32, codes of 4 bits two a byte, the lower element low
        blocks = w.reshape(w.shape[0], -1, 32)
        low = blocks.min(axis=2).astype(np.float16)
        scale = ((blocks.max(axis=2) - low) / 15).astype(np.float16)
        inverse = 1 / np.maximum(scale.astype(np.float32), 1e-30)
        codes = np.clip(np.rint((blocks - low[..., None].astype(np.float32)) * inverse[..., None]), 0, 15).astype(np.uint8)
        values = codes.astype(np.float64) * scale[..., None].astype(np.float64) + low[..., None].astype(np.float64)
        flat = codes.reshape(w.shape[0], -1)
        packed = flat[:, 0::2] | flat[:, 1::2] << 4
        return np.ascontiguousarray(packed), scale, values.reshape(w.shape), (-low).astype(np.float16)
    if fmt == "q8_0":  # a f16 scale a block of 32, int8 codes
        blocks = w.reshape(w.shape[0], -1, 32)
        scale = (np.abs(blocks).max(axis=2) / 127.0).astype(np.float16)
        codes = np.round(blocks / np.maximum(scale[..., None].astype(np.float32), 1e-30)).astype(np.int8)
        values = codes.astype(np.float64) * scale[..., None].astype(np.float64)
        return codes.reshape(w.shape).view(np.uint8), scale, values.reshape(w.shape)
    if fmt == "bf16":
        codes = w.astype(ml_dtypes.bfloat16)
        return codes.view(np.uint8), None, codes.astype(np.float64)
    scale = (np.abs(w).max(axis=1) / 448.0).astype(np.float32)
    codes = (w / scale[:, None]).astype(ml_dtypes.float8_e4m3fn)
    return codes.view(np.uint8), scale, codes.astype(np.float64) * scale[:, None]


def launch(lib, x, m, k, weights, outputs, splits=1, norm=None, residual=None, eps=1e-5, shape=DEFAULT, entry=8):
    """r4d_gemv_m{entry} (8 unless asked) over one row group per warps x rows rows; `weights` [(codes,
    scale)] and `outputs` [y] per segment (up to three); returns the lanes that took part in an MMA."""
    ptr = Pointers()

    n_total = sum(weight[0].shape[0] for weight in weights)
    warps, group = shape[0], shape[0] * shape[1]
    chunk = -(-k // splits)
    partial = np.zeros(splits * m * n_total, np.float32) if splits > 1 else None
    counters = np.zeros(-(-n_total // group), np.uint32)
    normed = np.zeros((m, k), np.float32)
    args = [ptr(x), ctypes.c_int(m), ctypes.c_int(k), ctypes.c_int(chunk), ptr(partial), ptr(counters)]
    for seg in range(3):
        if seg < len(weights):
            codes, scale, *minimum = weights[seg]
            args += [ptr(codes), ptr(scale), ptr(minimum[0] if minimum else None), ptr(outputs[seg]),
                     ctypes.c_int(codes.shape[0])]
        else:
            args += [ctypes.c_void_p(0)] * 4 + [ctypes.c_int(0)]
    args += [ptr(norm), ctypes.c_int(F32), ctypes.c_float(eps), ptr(normed), ctypes.c_void_p(0), ctypes.c_void_p(0),
             ctypes.c_int(m), ptr(residual), ctypes.c_void_p(0), ctypes.c_void_p(0)]
    params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
    lanes = ctypes.c_longlong.in_dll(lib, "r4d_mma16_lanes")
    before = lanes.value
    name = f"r4d_gemv_m{entry}".encode()
    assert lib.r4d_host_launch(name, -(-n_total // group), splits, 1, warps * 32, 1, 1, params) == 0
    assert not counters.any(), "the last block of each row group leaves its counter zero"
    return lanes.value - before


def rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,n,k,splits,shape", CASES)
def test_the_tensor_core_gemv_agrees_with_f64_and_the_fma_path(fmt, m, n, k, splits, shape):
    """Rows past N in the last group, K not a whole number of a warp's steps, split K, and a cut of
    32-row groups (four tiles a warp)."""
    rng = np.random.default_rng(n + k)
    w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
    codes, scale, values, *minimum = encode(fmt, w)
    x = activations(m, k, m + n)
    want = x.astype(np.float64) @ values.T
    results = {}
    for tensor_cores in (True, False):
        y = np.full((m, n), np.nan, np.float32)
        lanes = launch(library(fmt, 0, 0, tensor_cores, shape), x, m, k, [(codes, scale, *minimum)], [y], splits=splits,
                       shape=shape)
        assert (lanes > 0) == tensor_cores, lanes
        assert np.isfinite(y).all() and rel(y, want) <= dk.TOLERANCE["gemv"], (tensor_cores, rel(y, want))
        results[tensor_cores] = y
    # the two paths add in different orders: close, not the same bits
    assert rel(results[True], results[False]) <= dk.TOLERANCE["gemv"]


@pytest.mark.parametrize("splits", [1, 2])
def test_the_fp8_fma_path_at_one_row_agrees_with_f64_and_with_the_eight_row_entry(splits):
    """e4m3 codes (negative, and subnormal ones written in) at M = 1, the decode GEMV's case: the
    MT = 1 entry against f64 and bit for bit against the MT = 8 entry given one row (a lane's sums
    are the same whatever MT); each row's f32 scale is read once, as its rows are set up (gemv_row's hold)."""
    n, k = 40, 1536
    rng = np.random.default_rng(17 + splits)
    w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
    codes, scale, values = encode("fp8_channel", w)
    subnormal = rng.choice(n * k, 64, replace=False)  # codes 0x01..0x07 and 0x81..0x87: e4m3's subnormals
    codes.reshape(-1)[subnormal] = rng.integers(1, 8, 64).astype(np.uint8) | (rng.integers(0, 2, 64) << 7).astype(np.uint8)
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * scale[:, None].astype(np.float64)
    assert (np.abs(codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)) < 2.0 ** -6).sum() >= 64
    x = activations(1, k, 5)
    want = x.astype(np.float64) @ values.T
    results = []
    for entry in (1, 8):
        y = np.full((1, n), np.nan, np.float32)
        lanes = launch(library("fp8_channel", 0, 0, False), x, 1, k, [(codes, scale)], [y], splits=splits, entry=entry)
        assert lanes == 0
        assert np.isfinite(y).all() and rel(y, want) <= dk.TOLERANCE["gemv"], (entry, rel(y, want))
        results.append(y)
    np.testing.assert_array_equal(results[0], results[1])


def test_the_tensor_core_gemv_folds_the_norm_and_pairs_gate_with_up():
    """rmsnorm(x) * g, then gate and up in one launch with silu(gate) * up in the epilogue (mode 2)."""
    m, ffn, k = 7, 48, 512
    rng = np.random.default_rng(3)
    x = activations(m, k, 11)
    g = (1.0 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    gate, up = ((rng.standard_normal((ffn, k)) * 0.02).astype(np.float32) for _ in range(2))
    (gc, _, gv), (uc, _, uv) = encode("bf16", gate), encode("bf16", up)
    out, partner = np.full((m, ffn), np.nan, np.float32), np.full((m, ffn), np.nan, np.float32)
    lanes = launch(library("bf16", 2, 1), x, m, k, [(gc, None), (uc, None)], [out, partner], norm=g)
    assert lanes > 0
    x64 = x.astype(np.float64)
    normed = x64 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + 1e-5) * g
    a, b = normed @ gv.T, normed @ uv.T
    assert rel(partner, b) <= dk.TOLERANCE["gemv"]
    assert rel(out, a / (1 + np.exp(-a)) * b) <= dk.TOLERANCE["gemv"]


def test_the_tensor_core_gemv_adds_into_the_residual():
    m, n, k = 8, 32, 256
    w = (np.random.default_rng(5).standard_normal((n, k)) * 0.02).astype(np.float32)
    codes, _, values = encode("bf16", w)
    x, residual = activations(m, k, 6), activations(m, n, 7)
    y = np.full((m, n), np.nan, np.float32)
    start = residual.copy()
    assert launch(library("bf16", 1, 0), x, m, k, [(codes, None)], [y], residual=residual) > 0
    want = x.astype(np.float64) @ values.T
    assert rel(y, want) <= dk.TOLERANCE["gemv"]
    np.testing.assert_array_equal(residual, start + y)
