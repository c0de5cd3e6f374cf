"""attention_decode.cu (the decode attention of batches) run on the host: its real text built with g++
behind tests/fixtures/cuda_on_host.h, its entry called with numpy arrays as a card's launch would
pass them, at the grid device_attention_decode.py plans. What a card's run cannot show in CI: the
streams' key order and masks (a half-warp past the chunk), the slots looked up a turn ahead, this
step's key read from the k, v rows and stored by split 0's blocks, the contexts cut into splits (one
key, a chunk and one more, the grid's most), the streams' and the splits' merges and their counters.
Against exact attention in float64 and libref's attention row, within docs/OPS.md's attention
tolerance (device_kernels.TOLERANCE["attention"]: the kernel is f32 throughout); a wrong mask exceeds it
by far. Skipped, saying so, where g++ is missing; nvcc's sm_90 build where nvcc is."""

import ctypes
import functools
import importlib
import re
import subprocess

import numpy as np
import pytest

import early_builds
from device_batch_support import Pointers, fixture_module
from device_sources import NVCC
from radiance.abi import RAD_OK
from test_device_tensor_cores import attention_operands
from test_libr4d_support import rel_err, registry, row_of  # noqa: F401 (registry)
from test_libr4d_support import launch as host_launch

ON_HOST = fixture_module("cuda_on_host")
pytestmark = pytest.mark.skipif(ON_HOST.why() is not None, reason=str(ON_HOST.why()))

dk = importlib.import_module("radiance.plugins.kernels.libr4d.device_kernels")
ad = importlib.import_module("radiance.plugins.kernels.libr4d.device_attention_decode")

# (name, q heads, kv heads, head_dim, contexts (one decode token each: position context - 1), chunk)
CASES = [
    # Llama-3-8B's group of 4 at head_dim 128: one key, a stream's worth, a chunk and one more, splits
    ("g4_d128", 8, 2, 128, [1, 2, 5, 17, 129, 300], 128),
    # a context longer than the grid's splits of chunks: the chunk grows (2 splits of 64 at most)
    ("g4_d128_long", 8, 2, 128, [700, 64, 65], 64),
    # SmolLM2's group of 3 at head_dim 64, and one query head a kv head
    ("g3_d64", 9, 3, 64, [40, 1, 200], 64),
    ("g1_d64", 2, 2, 64, [33, 90], 32),
]
KEYS = sorted({(d, heads // kv) for _, heads, kv, d, _, _ in CASES})


def build(d, group):
    return ON_HOST.build(dk.source("attention_decode"), ad.options(d, group))


EARLY_BUILDS = {} if ON_HOST.why() is not None else {f"g++:attention_decode:d{d}:g{g}": functools.partial(build, d, g)
                                                      for d, g in KEYS}
NVCC_SHAPES = [(128, 4), (128, 8), (64, 3), (64, 1)]


def library(d, group):
    assert (d, group) in KEYS, f"{(d, group)} is not in KEYS (add its case, so that it is built early)"
    return early_builds.result(f"g++:attention_decode:d{d}:g{group}", functools.partial(build, d, group))


def launch(operands, params, chunk, grid_splits=None, lib=None):
    """r4d_attend_decode over copies of the caches (the default build's, or `lib`'s); returns (out,
    k_cache, v_cache)."""
    q, k, v, k_cache, v_cache, slots, positions, cu, lengths, blocks, _ = operands
    k_cache, v_cache = k_cache.copy(), v_cache.copy()
    seqs = len(lengths)
    heads, kv, d, bs = params["q_heads"], params["kv_heads"], params["head_dim"], params["block_size"]
    group = heads // kv
    splits = grid_splits or ad.MAX_SPLITS
    out = np.full((seqs, heads * d), np.nan, np.float32)
    partial = np.full(seqs * kv * splits * ad.partial_floats(group, d), np.nan, np.float32)
    counters = np.zeros(seqs * kv, np.uint32)
    ptr = Pointers()
    args = [ptr(q), ptr(k), ptr(v), ptr(k_cache), ptr(v_cache), ptr(slots), ptr(positions), ptr(lengths), ptr(blocks),
            ptr(out), ptr(partial), ptr(counters), ctypes.c_int(blocks.shape[1]), ctypes.c_int(heads), ctypes.c_int(kv),
            ctypes.c_int(d), ctypes.c_int(bs), ctypes.c_int(chunk), ctypes.c_float(params["scale"])]
    array = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
    lib = lib or library(d, group)
    assert lib.r4d_host_launch(b"r4d_attend_decode", seqs, kv, splits, ad.THREADS, 1, 1, array) == 0
    assert not counters.any(), "the last block of each (sequence, kv head) leaves its counter zero"
    return out, k_cache, v_cache


def reference(operands, params) -> np.ndarray:
    """Softmax attention in float64 over each token's visible cache rows (the step's own k, v stored)."""
    q, k, v, k_cache, v_cache, slots, positions, cu, lengths, blocks, _ = operands
    k_cache, v_cache = k_cache.copy(), v_cache.copy()
    k_cache[slots], v_cache[slots] = k, v
    heads, kv, d, bs = params["q_heads"], params["kv_heads"], params["head_dim"], params["block_size"]
    group = heads // kv
    out = np.zeros((len(positions), heads, d))
    for s in range(len(lengths)):
        seen = np.arange(min(int(positions[s]), int(lengths[s]) - 1) + 1)
        rows = blocks[s, seen // bs] * bs + seen % bs
        for h in range(heads):
            keys = k_cache[rows, h // group * d:(h // group + 1) * d].astype(np.float64)
            score = q[s, h * d:(h + 1) * d].astype(np.float64) @ keys.T * params["scale"]
            weights = np.exp(score - score.max())
            out[s, h] = weights @ v_cache[rows, h // group * d:(h // group + 1) * d] / weights.sum()
    return out.reshape(len(positions), heads * d)


def case_operands(name, seed=None):
    _, heads, kv, d, contexts, chunk = next(c for c in CASES if c[0] == name)
    operands, params = attention_operands(heads, kv, d, [(c - 1, 1) for c in contexts], seed=seed or len(name))
    operands[0][:, :d] *= 4  # peaked weights in one head
    return operands, params, chunk


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_the_decode_attention_agrees_with_f64_and_libref(registry, case):
    operands, params, chunk = case_operands(case)
    splits = ad.splits(len(operands[8]), params["kv_heads"], operands[9].shape[1] * params["block_size"]) if case != "g4_d128_long" else 2
    out, k_cache, v_cache = launch(operands, params, chunk, splits)
    assert np.isfinite(out).all()
    slots = operands[5]
    np.testing.assert_array_equal(k_cache[slots], operands[1])  # the step's k, v at their slots
    np.testing.assert_array_equal(v_cache[slots], operands[2])
    others = np.setdiff1d(np.arange(len(k_cache)), slots)
    np.testing.assert_array_equal(k_cache[others], operands[3][others])  # nothing else written
    tolerance = dk.TOLERANCE["attention"]
    assert 0 < rel_err(out, reference(operands, params)) <= tolerance, rel_err(out, reference(operands, params))
    libref = [np.array(o, copy=True) for o in operands]
    assert host_launch(row_of(registry, "attention", "libref"), libref, params) == RAD_OK
    assert rel_err(out, libref[10]) <= tolerance, rel_err(out, libref[10])


@pytest.mark.parametrize("keys,ahead", [(2, 0), (4, 1)])
def test_the_cuts_the_bench_sweeps_agree_too(keys, ahead):
    """R4D_AD_KEYS=2 (two keys a stream at a time) and R4D_AD_AHEAD=1 (the next keys' rows asked into
    the L2): the same rows within f32 rounding as the default cut."""
    operands, params, chunk = case_operands("g4_d128", seed=43)
    options = tuple(o for o in ad.options(128, 4) if not o.startswith(("-DR4D_AD_KEYS=", "-DR4D_AD_AHEAD=")))
    lib = ON_HOST.build(dk.source("attention_decode"), (*options, f"-DR4D_AD_KEYS={keys}", f"-DR4D_AD_AHEAD={ahead}"))
    cut, _, _ = launch(operands, params, chunk, 4, lib)
    default, _, _ = launch(operands, params, chunk, 4)
    assert rel_err(cut, reference(operands, params)) <= dk.TOLERANCE["attention"]
    assert rel_err(cut, default) <= 1e-6


def test_split_and_whole_contexts_agree_and_a_launch_repeats_its_bits():
    """One split per sequence against the grid's most: the same rows within f32 rounding; and a second
    launch of the split grid gives the first's bits (the merges' fixed orders)."""
    operands, params, _ = case_operands("g4_d128", seed=41)
    whole, _, _ = launch(operands, params, 1 << 20, 1)
    split, _, _ = launch(operands, params, 16, ad.MAX_SPLITS)
    again, _, _ = launch(operands, params, 16, ad.MAX_SPLITS)
    assert rel_err(split, whole) <= 1e-6 and rel_err(split, whole) > 0
    np.testing.assert_array_equal(split, again)


def test_a_wrong_mask_would_show():
    """The checks above can fail: every token seeing one key fewer moves the rows far past the tolerance."""
    operands, params, chunk = case_operands("g4_d128", seed=42)
    out, _, _ = launch(operands, params, chunk, 4)
    shifted = [np.array(o, copy=True) for o in operands]
    shifted[6] = np.maximum(shifted[6] - 1, 0)
    assert rel_err(out, reference(shifted, params)) > 100 * dk.TOLERANCE["attention"]


def test_the_geometry_covers_batches_and_keeps_its_scratch_in_the_tail():
    """The chunk grows with the (sequence, kv head) pairs (batch 1: 32 keys, 8: 128, 32 and 64: 256);
    the grid's z covers the block table's keys in chunks up to MAX_SPLITS and the tail's partials;
    the tail sits at the scratch's end whatever the step."""
    assert [ad.chunk(batch, 8) for batch in (1, 2, 4, 8, 16, 32, 64)] == [32, 32, 64, 128, 256, 256, 256]
    assert ad.grid(8, 8, 1088) == ((8, 8, 9), (128, 1, 1)) and ad.grid(64, 8, 8192)[0] == (64, 8, 8)
    assert ad.splits(8, 8, 8192, ad.band_partials(8)) == ad.MAX_SPLITS  # the band's rows: every split they want
    assert ad.splits(32, 8, 1 << 20) == ad.PARTIALS // 256 and ad.splits(4096, 8, 8192) == 1
    assert ad.splits(ad.COUNTERS // 8 + 1, 8, 1 << 20, 1 << 30) == 1  # past COUNTERS pairs: no split, no counter
    assert ad.token_splits(1, 32, 128) == (1, 1) and ad.token_splits(129, 32, 128) == (2, 65)
    assert ad.token_splits(8192, 32, 128) == (32, 256)
    for seqs in (1, 8, 9, 33, 64, 512, 2048):
        for partials in (ad.PARTIALS, ad.band_partials(8)):
            assert seqs * 8 * ad.splits(seqs, 8, 131072, partials) <= max(partials, seqs * 8), (seqs, partials)
    tail = ad.tail_bytes(4, 128)
    assert tail == ad.PARTIALS * 4 * 130 * 4 + 4 * ad.COUNTERS and ad.tail_bytes(4, 128, ad.band_partials(8)) < tail
    assert ad.scratch_layout(tail + 1000, 4, 128) == {"partial": 1000, "counters": 1000 + tail - 4 * ad.COUNTERS}
    with pytest.raises(ValueError, match="tail needs"):
        ad.scratch_layout(tail - 1, 4, 128)
    assert ad.serves("cuda", "sm_90", 32, 32, 128, 4) and ad.serves("cuda", "sm_80", 9, 9, 64, 8)
    assert not ad.serves("cuda", "sm_90", 40, 32, 128, 4)  # a prefill chunk beside decode tokens
    assert not ad.serves("hip", "gfx942", 32, 32, 128, 4) and not ad.serves("cuda", "sm_90", 32, 32, 96, 4)
    assert not ad.serves("cuda", "sm_90", 32, 32, 256, 8)  # 8 heads of 256: the merge's shared memory


def nvcc_build(d, group):
    folder = early_builds.folder() / "attention_decode_sm_90"
    folder.mkdir(exist_ok=True)
    stem = folder / f"d{d}_g{group}"
    stem.with_suffix(".cu").write_text(dk.source("attention_decode"))
    options = [*ad.options(d, group), "-arch=sm_90", "-fmad=false"]
    result = subprocess.run([NVCC, *options, "-cubin", "-Xptxas", "-v", "-o", str(stem.with_suffix(".cubin")),
                             str(stem.with_suffix(".cu"))], capture_output=True, text=True)
    return result


if NVCC is not None:
    EARLY_BUILDS.update({f"nvcc:attention_decode:{shape}": functools.partial(nvcc_build, *shape) for shape in NVCC_SHAPES})


@pytest.mark.parametrize("shape", NVCC_SHAPES)
def test_nvcc_builds_it_for_sm_90_without_spilling(shape):
    """The source as a card gets it (common.cu first), nvcc for sm_90 with the device layer's
    --fmad=false: both entries spill nothing; r4d_attend_decode has no stack (the rope entry's is
    sincos's f64 range reduction, as attention.cu's). Skipped where nvcc is missing."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH: the CUDA source cannot be compiled here")
    result = early_builds.result(f"nvcc:attention_decode:{shape}", functools.partial(nvcc_build, *shape))
    assert result.returncode == 0, result.stderr[-2000:]
    reports = re.findall(r"Compiling entry function '(\w+)'.*?\n.*?(\d+) bytes stack frame, (\d+) bytes spill stores, "
                         r"(\d+) bytes spill loads", result.stderr, re.S)
    assert sorted(name for name, *_ in reports) == ["r4d_attend_decode", "r4d_attend_decode_rope"], result.stderr[-1500:]
    for name, stack, stores, loads in reports:
        assert stores == loads == "0" and (stack == "0" or name.endswith("_rope")), (name, stack, stores, loads)
