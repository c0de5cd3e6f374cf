"""attention_tiles.cu (the tensor-core attention of batches and prefill chunks) run on the host: its
real text built with g++ behind tests/fixtures/cuda_on_host.h, with the host forms of cp.async,
ldmatrix (plain and transposed), mma.m16n8k16 bf16, cvt.rn.bf16x2 and ex2 (tests/fixtures/
tensor_core_on_host.h), its store and tiles entries called with numpy arrays as a card's launch would
pass them. What a card's run cannot show in CI: the fragments' and ldmatrix rows' owners, the bf16
tiles' indexing and double buffer, this step's keys from the bf16 rows against older keys from the
cache, the slots looked up ahead, the causal masks and the tiles a warp skips, the padding rows of
short tiles, mixed sequences, the split merges and their counters. Against exact attention in
float64 and against libref's attention row, within device_attention_tiles.TOLERANCE; against a
float64 reference of the kernel's own roundings (q * scale * log2(e), k and v to bf16) far tighter,
which a wrong mask or a lost tile exceeds. Skipped, saying so, where g++ is missing."""

import ctypes
import functools
import re
import subprocess
import importlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import early_builds
from device_batch_support import Pointers, fixture_module
from device_sources import NVCC
from radiance.abi import RAD_OK
from test_device_tensor_cores import attention_operands
from test_libr4d_support import rel_err, registry, row_of  # noqa: F401 (registry)
from test_libr4d_support import launch as host_launch

FIXTURES = Path(__file__).parent / "fixtures"
ON_HOST = fixture_module("cuda_on_host")
pytestmark = pytest.mark.skipif(ON_HOST.why() is not None, reason=str(ON_HOST.why()))

dk = importlib.import_module("radiance.plugins.kernels.libr4d.device_kernels")
at = importlib.import_module("radiance.plugins.kernels.libr4d.device_attention_tiles")
LOG2E = 1.4426950408889634


def host_source() -> str:
    """attention_tiles.cu's text with tensor_core.cu's and its own inline PTX replaced by their host
    forms (tests/fixtures/tensor_core_on_host.h), its dynamic shared memory a static array."""
    tensor_core = (dk.FOLDER / "tensor_core.cu").read_text()
    text = dk.source("attention_tiles")
    assert tensor_core in text
    text = text.replace(tensor_core, (FIXTURES / "tensor_core_on_host.h").read_text())
    start, end = text.index("// 2^x (ex2.approx"), text.index("template <int D, int G>")
    dynamic = "extern __shared__ __align__(16) float at_shared[];"
    assert "asm" not in text[end:] and dynamic in text
    floats = max(at.shared_bytes(d, cut) for d in at.HEAD_DIMS for cut in at.CUTS) // 4
    return text[:start] + text[end:].replace(dynamic, f"static float at_shared[{floats}] __attribute__((aligned(16)));")


# (name, q heads, kv heads, head_dim, sequences as (first position, new tokens), warps, splits)
CASES = [
    # a whole prompt from 0 (causal: tiles past the diagonal skipped, the diagonal's masked), 8 warps
    ("prefill_g4_d128", 8, 2, 128, [(0, 100)], 8, 1),
    # the same prompt with its context split three ways (partials merged by each tile's last block)
    ("prefill_g4_d128_split", 8, 2, 128, [(0, 100)], 8, 3),
    # a chunk after 300 cached beside decode tokens of other contexts (chunked prefill), 4 warps, split
    ("chunk_and_decode_g8_d64", 8, 1, 64, [(300, 40), (77, 1), (5, 1), (1000, 1)], 4, 4),
    # one query head a kv head, two prompts of mixed lengths, 4 and 8 warps
    ("mha_g1_d64_w4", 2, 2, 64, [(0, 70), (0, 33)], 4, 1),
    ("mha_g1_d64_w8", 2, 2, 64, [(0, 150), (0, 9)], 8, 1),
    # eight query heads a kv head after a cached context, split in two
    ("gqa_g8_d128", 8, 1, 128, [(200, 50)], 8, 2),
    # SmolLM2's heads, 9 over 3 (tiles of 42 tokens: a warp's rows cross tokens), two prompts from 0
    ("smollm2_g3_d64", 9, 3, 64, [(0, 90), (0, 9)], 8, 1),
    # decode tokens alone (a tile of one token: warps of padding rows)
    ("decode_g4_d128", 8, 2, 128, [(p, 1) for p in (3, 40, 255, 256, 700)], 4, 5),
]
KEYS = sorted({(d, heads // kv, warps) for _, heads, kv, d, _, warps, _ in CASES})


# the cuts other than the default (device_attention_tiles.CUTS) on cases with tails: (case, cut)
VARIANTS = [("prefill_g4_d128", "48,0"), ("prefill_g4_d128", "48,1"), ("prefill_g4_d128_split", "48,1"),
            ("mha_g1_d64_w8", "48,1"), ("gqa_g8_d128", "48,1"), ("smollm2_g3_d64", "48,1"),
            ("chunk_and_decode_g8_d64", "32,1")]
DEFAULT = str(at.CUTS[0])
KEYS = sorted({*((d, g, w, DEFAULT) for d, g, w in KEYS),
               *((d, heads // kv, warps, cut) for name, cut in VARIANTS
                 for case, heads, kv, d, _, warps, _ in CASES if case == name)})


def build(d, group, warps, cut=DEFAULT):
    return ON_HOST.build(host_source(), at.options(d, group, warps, at.Cut.parse(cut)))


def build_name(d, group, warps, cut=DEFAULT) -> str:
    return f"g++:attention_tiles:d{d}:g{group}:w{warps}" + ("" if cut == DEFAULT else f":cut{cut}")


EARLY_BUILDS = {} if ON_HOST.why() is not None else {build_name(*key): functools.partial(build, *key) for key in KEYS}
# nvcc's sm_90 builds of the source as a card gets it: registers and spills, the instructions
NVCC_SHAPES = [(128, 4, 8), (128, 4, 4), (128, 8, 8), (64, 1, 4), (64, 3, 8), (128, 4, 8, "48,0"), (128, 4, 8, "48,1"),
               (128, 4, 4, "48,1"), (64, 1, 8, "48,1"), (128, 8, 8, "48,1")]


def nvcc_build(d, group, warps, cut=DEFAULT):
    """(nvcc's result with ptxas' report, the PTX's text) of attention_tiles.cu for sm_90."""
    folder = early_builds.folder() / "attention_tiles_sm_90"
    folder.mkdir(exist_ok=True)
    stem = folder / (f"d{d}_g{group}_w{warps}" + ("" if cut == DEFAULT else f"_cut{cut.replace(',', '_')}"))
    stem.with_suffix(".cu").write_text(dk.source("attention_tiles"))
    options = [*at.options(d, group, warps, at.Cut.parse(cut)), "-arch=sm_90", "-fmad=false"]
    result = subprocess.run([NVCC, *options, "-cubin", "-Xptxas", "-v", "-o", str(stem.with_suffix(".cubin")),
                             str(stem.with_suffix(".cu"))], capture_output=True, text=True)
    ptx = subprocess.run([NVCC, *options, "-ptx", "-o", str(stem.with_suffix(".ptx")), str(stem.with_suffix(".cu"))],
                         capture_output=True, text=True)
    return result, stem.with_suffix(".ptx").read_text() if ptx.returncode == 0 else ""


if NVCC is not None:
    EARLY_BUILDS.update({f"nvcc:attention_tiles:{shape}": functools.partial(nvcc_build, *shape) for shape in NVCC_SHAPES})


def library(d, group, warps, cut=DEFAULT):
    key = (d, group, warps, cut)
    assert key in KEYS, f"{key} is not in KEYS (add its case, so that it is built early)"
    return early_builds.result(build_name(*key), functools.partial(build, *key))


def launch(lib, operands, params, warps, splits, fresh=True):
    """r4d_kv_store_bf16_dev (the step's k, v at their slots, and narrowed to bf16 rows), then
    r4d_attend_tiles over the caches, with those rows (`fresh`) or without (every key from the f32
    cache); returns (out, the lanes that took part in an MMA)."""
    q, k, v, k_cache, v_cache, slots, positions, cu, lengths, blocks, _ = operands
    k_cache, v_cache = k_cache.copy(), v_cache.copy()
    m, seqs = len(positions), len(lengths)
    heads, kv, d, group = params["q_heads"], params["kv_heads"], params["head_dim"], params["q_heads"] // params["kv_heads"]
    width = kv * d
    fresh_k, fresh_v = np.zeros((m, width), np.uint16), np.zeros((m, width), np.uint16)
    tokens = warps * 16 // group
    tiles = sum(-(-int(cu[s + 1] - cu[s]) // tokens) for s in range(seqs))
    out = np.full((m, heads * d), np.nan, np.float32)
    partial = np.full(m * kv * splits * group * (d + 2), np.nan, np.float32)
    counters = np.zeros(tiles * kv, np.uint32)
    ptr = Pointers()

    def call(name, grid, block, args):
        array = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
        assert lib.r4d_host_launch(name, *grid, *block, array) == 0

    (gx, gy, gz), block = at.store_grid(m, width)
    call(b"r4d_kv_store_bf16_dev", (gx, gy, gz), block, [ptr(k), ptr(v), ptr(k_cache), ptr(v_cache), ptr(slots),
                                                          ctypes.c_int(width), ptr(fresh_k), ptr(fresh_v)])
    np.testing.assert_array_equal(k_cache[slots], k)
    np.testing.assert_array_equal(fresh_v, v.astype(ml_dtypes.bfloat16).view(np.uint16))
    args = [ptr(q), ptr(k_cache), ptr(v_cache), ptr(positions), ptr(cu), ptr(lengths), ptr(blocks), ptr(out),
            ptr(partial), ptr(counters), ctypes.c_int(seqs), ctypes.c_int(blocks.shape[1]), ctypes.c_int(heads),
            ctypes.c_int(kv), ctypes.c_int(params["block_size"]), ctypes.c_float(params["scale"]),
            ptr(fresh_k if fresh else None), ptr(fresh_v if fresh else None)]
    lanes = ctypes.c_longlong.in_dll(lib, "r4d_mma16_lanes")
    before = lanes.value
    # one tile more than there are: the grid's bound may exceed the tiles, and those blocks return
    call(b"r4d_attend_tiles", (tiles + 1, kv, splits), (32 * warps, 1, 1), args)
    assert not counters.any(), "the last block of each tile leaves its counter zero"
    return out, lanes.value - before


def reference(operands, params, rounded: bool) -> np.ndarray:
    """Softmax attention in float64 over each token's visible cache rows; `rounded`: of the kernel's
    bf16 inputs (q * scale * log2(e), k, v), the weights exact."""
    q, k, v, k_cache, v_cache, slots, positions, cu, lengths, blocks, _ = operands
    k_cache, v_cache = k_cache.copy(), v_cache.copy()
    k_cache[slots], v_cache[slots] = k, v
    heads, kv, d, bs = params["q_heads"], params["kv_heads"], params["head_dim"], params["block_size"]
    group, scale = heads // kv, params["scale"]
    bf16 = (lambda x: x.astype(ml_dtypes.bfloat16).astype(np.float64)) if rounded else (lambda x: x.astype(np.float64))
    out = np.zeros((len(positions), heads, d))
    for s in range(len(lengths)):
        for i in range(int(cu[s]), int(cu[s + 1])):
            seen = np.arange(min(int(positions[i]), int(lengths[s]) - 1) + 1)
            rows = blocks[s, seen // bs] * bs + seen % bs
            for h in range(heads):
                kvh = h // group
                keys = bf16(k_cache[rows, kvh * d:(kvh + 1) * d])
                values = bf16(v_cache[rows, kvh * d:(kvh + 1) * d])
                if rounded:
                    score = bf16(q[i, h * d:(h + 1) * d] * np.float32(scale * LOG2E)) @ keys.T
                    weights = np.exp2(score - score.max())
                else:
                    score = q[i, h * d:(h + 1) * d].astype(np.float64) @ keys.T * scale
                    weights = np.exp(score - score.max())
                out[i, h] = weights @ values / weights.sum()
    return out.reshape(len(positions), heads * d)


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_the_attention_tiles_agree_with_f64_and_libref(registry, case):
    _, heads, kv, d, sequences, warps, splits = next(c for c in CASES if c[0] == case)
    operands, params = attention_operands(heads, kv, d, sequences, seed=len(case))
    # peaked weights in one head: q scaled up where the bf16 scores matter most
    operands[0][:, :d] *= 4
    out, lanes = launch(library(d, heads // kv, warps), operands, params, warps, splits)
    assert lanes > 0 and np.isfinite(out).all()
    exact = reference(operands, params, rounded=False)
    assert 0 < rel_err(out, exact) <= at.TOLERANCE, rel_err(out, exact)
    # the kernel's own roundings in f64: what is left is the weights' bf16 and the f32 sums
    assert rel_err(out, reference(operands, params, rounded=True)) <= 3e-3
    libref = [np.array(o, copy=True) for o in operands]
    assert host_launch(row_of(registry, "attention", "libref"), libref, params) == RAD_OK
    assert rel_err(out, libref[10]) <= at.TOLERANCE, rel_err(out, libref[10])


def test_the_split_and_whole_contexts_give_the_same_rows_within_the_weights_rounding():
    """One prompt, 1 and 3 splits: each split's online softmax is its own, merged in log2 units."""
    operands, params = attention_operands(8, 2, 128, [(0, 100)], seed=21)
    lib = library(128, 4, 8)
    whole, _ = launch(lib, operands, params, 8, 1)
    split, _ = launch(lib, operands, params, 8, 3)
    assert rel_err(split, whole) <= 3e-3


def test_a_wrong_mask_would_show():
    """The check above can fail: the same launch with every token's position moved one key back
    (one visible key fewer) moves the rows far past the tolerance."""
    operands, params = attention_operands(8, 2, 128, [(0, 100)], seed=22)
    out, _ = launch(library(128, 4, 8), operands, params, 8, 1)
    shifted = [np.array(o, copy=True) for o in operands]
    shifted[6] = np.maximum(shifted[6] - 1, 0)
    assert rel_err(out, reference(shifted, params, rounded=False)) > 10 * at.TOLERANCE


@pytest.mark.parametrize("case", ["prefill_g4_d128", "chunk_and_decode_g8_d64"])
def test_this_steps_keys_from_the_bf16_rows_give_the_cache_s_bits(case):
    """The step's keys by cp.async of the bf16 rows (all of a prompt from 0; a chunk's after its
    cached context) or from the f32 cache narrowed in registers: the same bf16 tiles, the same bits."""
    _, heads, kv, d, sequences, warps, splits = next(c for c in CASES if c[0] == case)
    operands, params = attention_operands(heads, kv, d, sequences, seed=23)
    lib = library(d, heads // kv, warps)
    rows, _ = launch(lib, operands, params, warps, splits, fresh=True)
    cache, _ = launch(lib, operands, params, warps, splits, fresh=False)
    np.testing.assert_array_equal(rows, cache)


@pytest.mark.parametrize("shape", NVCC_SHAPES)
def test_nvcc_builds_it_for_sm_90_on_bf16_tensor_cores_without_spilling(shape):
    """The source as a card gets it (common.cu and tensor_core.cu first), nvcc for sm_90 with the
    device layer's --fmad=false: no spill and no stack (ptxas' report: the registers are near 255), and
    the PTX holds the bf16 MMA, both ldmatrix forms, cp.async and ex2. Skipped where nvcc is missing."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH: the CUDA source cannot be compiled here")
    result, ptx = early_builds.result(f"nvcc:attention_tiles:{shape}", functools.partial(nvcc_build, *shape))
    assert result.returncode == 0, result.stderr[-2000:]
    report = [line for line in result.stderr.splitlines() if "r4d_attend_tiles" in line or "spill" in line]
    assert re.search(r"0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", result.stderr), report
    assert "bytes spill stores" in result.stderr and not re.search(r"[1-9]\d* bytes spill", result.stderr), report
    for instruction in ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", "cp.async.cg.shared.global", "ex2.approx"):
        assert instruction in ptx, instruction


@pytest.mark.parametrize("offset", [0, 4])
def test_the_store_writes_the_cache_and_the_bf16_rows_aligned_or_not(offset):
    """r4d_kv_store_bf16_dev: k and v at their cache slots in f32 (attention.cu's store) and narrowed to
    bf16 rows (nearest even); by 16 bytes where aligned, one value at a time where k sits 4 bytes
    past a 16-byte boundary; other cache rows untouched."""
    operands, params = attention_operands(8, 2, 128, [(30, 9), (5, 3)], seed=31)
    _, k, v, k_cache, v_cache, slots, *_ = operands
    m, width = k.shape
    moved = np.zeros(m * width + offset // 4, np.float32)
    moved[offset // 4:] = k.reshape(-1)
    k_moved = moved[offset // 4:].reshape(m, width)  # 4 bytes past the array's (aligned) start where offset is 4
    caches = [k_cache.copy(), v_cache.copy()]
    fresh = [np.zeros((m, width), np.uint16) for _ in range(2)]
    ptr = Pointers()
    args = [ptr(k_moved), ptr(v), ptr(caches[0]), ptr(caches[1]), ptr(slots), ctypes.c_int(width), ptr(fresh[0]),
            ptr(fresh[1])]
    array = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
    grid, block = at.store_grid(m, width)
    assert library(128, 4, 8).r4d_host_launch(b"r4d_kv_store_bf16_dev", *grid, *block, array) == 0
    others = np.setdiff1d(np.arange(len(k_cache)), slots)
    for cache, rows, before, narrowed in zip(caches, (k, v), (k_cache, v_cache), fresh):
        np.testing.assert_array_equal(cache[slots], rows)
        np.testing.assert_array_equal(cache[others], before[others])
        np.testing.assert_array_equal(narrowed, rows.astype(ml_dtypes.bfloat16).view(np.uint16))


@pytest.mark.parametrize("case,cut", VARIANTS)
def test_every_cut_agrees_with_f64_within_the_tolerance(case, cut):
    """Each cut (device_attention_tiles.CUTS) on the cases' tails: prompts not a multiple of 32 or 48
    keys, GQA groups 8, 4, 3 and 1, head_dim 64 and 128, split contexts, a chunk after a cached
    context beside decode tokens (4 warps: 32 keys, lazy rescale alone). Against exact attention
    within the tolerance, against the kernel's own roundings as tight as the default cut."""
    _, heads, kv, d, sequences, warps, splits = next(c for c in CASES if c[0] == case)
    operands, params = attention_operands(heads, kv, d, sequences, seed=len(case))
    operands[0][:, :d] *= 4
    out, lanes = launch(library(d, heads // kv, warps, cut), operands, params, warps, splits)
    assert lanes > 0 and np.isfinite(out).all()
    assert 0 < rel_err(out, reference(operands, params, rounded=False)) <= at.TOLERANCE
    assert rel_err(out, reference(operands, params, rounded=True)) <= 3e-3
    default, _ = launch(library(d, heads // kv, warps), operands, params, warps, splits)
    assert rel_err(out, default) <= 3e-3


@pytest.mark.parametrize("case,keys", [("prefill_g4_d128", 48), ("chunk_and_decode_g8_d64", 32)])
def test_the_lazy_rescale_gives_the_same_bits(case, keys):
    """lazy 1 leaves out multiplies by exactly 1: the rows of lazy 0 bit for bit, where max moves
    (early tiles, every tile's first) and where it stays."""
    _, heads, kv, d, sequences, warps, splits = next(c for c in CASES if c[0] == case)
    operands, params = attention_operands(heads, kv, d, sequences, seed=41)
    eager, _ = launch(library(d, heads // kv, warps, f"{keys},0" if keys != 32 else DEFAULT), operands, params, warps,
                      splits)
    lazy, _ = launch(library(d, heads // kv, warps, f"{keys},1"), operands, params, warps, splits)
    np.testing.assert_array_equal(lazy, eager)


def test_a_wrong_mask_would_show_in_the_48_key_cut():
    """As test_a_wrong_mask_would_show, for 48-key tiles (a diagonal that crosses them elsewhere)."""
    operands, params = attention_operands(8, 2, 128, [(0, 100)], seed=22)
    out, _ = launch(library(128, 4, 8, "48,1"), operands, params, 8, 1)
    shifted = [np.array(o, copy=True) for o in operands]
    shifted[6] = np.maximum(shifted[6] - 1, 0)
    assert rel_err(out, reference(shifted, params, rounded=False)) > 10 * at.TOLERANCE


def test_the_cut_parses_and_reaches_the_build():
    assert at.Cut.parse("48,1") == at.Cut(48, 1) and str(at.Cut(48, 1)) == "48,1"
    for bad in ("64,0", "48", "32,2", "a,b"):
        with pytest.raises(ValueError):
            at.Cut.parse(bad)
    assert at.options(128, 4, 8, at.CUTS[0]) == ("-DR4D_AT_D=128", "-DR4D_AT_G=4", "-DR4D_AT_WARPS=8")
    assert at.options(128, 4, 8, at.Cut(48, 1))[3:] == ("-DR4D_AT_KT=48", "-DR4D_AT_LAZY=1")
    assert at.options(128, 4, 4, at.Cut(48, 1))[3:] == ("-DR4D_AT_KT=32", "-DR4D_AT_LAZY=1")
    assert at.shared_bytes(128, at.Cut(48, 0)) == 2 * 2 * 48 * 136 * 2 <= 65536
