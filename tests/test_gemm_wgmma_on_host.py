"""gemm_wgmma.cu (the tensor-core GEMM on Hopper's warpgroup MMA) run on the host: its real text built
with g++ behind tests/fixtures/cuda_on_host.h, with tensor_core_on_host.h's cp.async and
tests/fixtures/wgmma_on_host.h's model of wgmma (descriptors decoded as the card reads them, the
128-byte swizzle applied to the address formed, wgmma's D layout, and each MMA reading its operands
both when issued and when its wait_group retires it). What a card's run cannot show in CI, and the
fake card's numpy form does not reach: the swizzled chunk each thread copies and the descriptors
that read it back for x and w alike, the 32-byte steps along K, the stages' order against
wait_group (a stage rewritten under an MMA still in flight, or read before every thread's copy is
in, counts a race), the output rows and columns each lane holds, M, N and K tails, split K and its
counters, e4m3's scales; in every cut the bench offers (device_tensor_cores.CUTS: the 128-, 64- and
32-byte swizzles, m64n128 and m64n256, 2 or 3 warpgroups, 2-5 stages, 1 or 2 k-tiles of MMAs in
flight). Against a float64 product of the same bf16 or e4m3 values; the kernel with its barrier or
its wait_group taken out, or waiting one group too few, must be caught. And nvcc's sm_90a build of
the default cut as a card gets it: registers, no spills, no static shared memory, the SS form of
HGMMA and QGMMA.
Skipped, saying so, where g++ (or nvcc, for its tests) is missing."""

import contextlib
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
from device_batch_support import Pointers, fixture_module
from device_sources import NVCC, sass

FIXTURES = Path(__file__).parent / "fixtures"
ON_HOST = fixture_module("cuda_on_host")
dk = importlib.import_module("radiance.plugins.kernels.libr4d.device_kernels")
tc = importlib.import_module("radiance.plugins.kernels.libr4d.device_tensor_cores")
needs_gxx = pytest.mark.skipif(ON_HOST.why() is not None, reason=str(ON_HOST.why()))
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: gemm_wgmma.cu's sm_90a build is not checked here")

PTX_START, PTX_END = "// ---- wgmma's PTX", "// ---- end of wgmma's PTX"
DYNAMIC = "extern __shared__ __align__(1024) u8 wg_shared[];"
# the kernel with one of its orderings taken out, which the host model must notice
BROKEN = {"no barrier before the MMAs": ("        wg_proxy_fence();\n        __syncthreads();\n", "        wg_proxy_fence();\n"),
          "no wait_group 1": ("        wg_wait<WG_DEPTH>();\n", "\n"),
          "a wait_group one deeper than the stages allow": ("        wg_wait<WG_DEPTH>();\n", "        wg_wait<WG_DEPTH + 1>();\n")}


def host_source(broken: str | None = None) -> str:
    """gemm_wgmma.cu's text as the engine puts it together, tensor_core.cu's inline PTX and the
    kernel's own replaced by their host forms; its dynamic shared memory the model's window."""
    tensor_core = (dk.FOLDER / "tensor_core.cu").read_text()
    text = dk.source("gemm_wgmma")
    assert tensor_core in text and text.count(PTX_START) == 1 and text.count(DYNAMIC) == 1
    plain = tensor_core[tensor_core.index("// The split-K epilogue."):]  # C++ with no PTX: kept
    host = (FIXTURES / "tensor_core_on_host.h").read_text() + plain + (FIXTURES / "wgmma_on_host.h").read_text()
    text = text.replace(tensor_core, host)
    start, end = text.index(PTX_START), text.index(PTX_END)
    assert "asm volatile(\"wgmma" not in text[end:] and "asm volatile(\"wgmma" not in text[:start]
    text = text[:start] + text[end:]
    text = text.replace(DYNAMIC, "u8* wg_shared = r4d_host_shared;")
    if broken is not None:
        old, new = BROKEN[broken]
        assert text.count(old) == 1, broken
        text = text.replace(old, new)
    return text


def build(broken: str | None = None, cut=tc.CUTS[0], group: int = 16):
    return ON_HOST.build(host_source(broken), ("-DR4D_WG_ONLY=0", *cut.defines(), f"-DWG_GROUP={group}"))


def build_name(broken: str | None = None, cut=tc.CUTS[0], group: int = 16) -> str:
    return f"g++:gemm_wgmma:{broken or 'as written'}:cut {cut}:groups of {group}"


def nvcc_build(only: int, cut=tc.CUTS[0]):
    """(nvcc's result with ptxas' report, cuobjdump's SASS or None) of the entry R4D_WG_ONLY=only for
    sm_90a, in `cut` as that entry's kind takes it."""
    folder = early_builds.folder() / "gemm_wgmma_sm_90a"
    folder.mkdir(exist_ok=True)
    cut = cut.for_kind(tc.KINDS[only - 1])
    source, cubin = folder / "gemm_wgmma.cu", folder / f"gemm_wgmma_{only}_{str(cut).replace(',', '_')}.cubin"
    source.write_text(dk.source("gemm_wgmma"))
    result = subprocess.run([NVCC, "-arch=sm_90a", "-fmad=false", f"-DR4D_WG_ONLY={only}", *cut.defines(), "-cubin",
                             "-Xptxas", "-v", "-o", str(cubin), str(source)], capture_output=True, text=True)
    return result, sass(cubin) if result.returncode == 0 else None


# the host builds: every cut offered as each kind takes it (e4m3 at most 128 rows)
HOST_CUTS = sorted({cut.for_kind(kind) for cut in tc.CUTS for kind in tc.KINDS}, key=str)
EARLY_BUILDS = {}
if ON_HOST.why() is None:
    EARLY_BUILDS.update({build_name(b): functools.partial(build, b) for b in BROKEN})
    EARLY_BUILDS.update({build_name(None, cut): functools.partial(build, None, cut) for cut in HOST_CUTS})
    EARLY_BUILDS[build_name(None, tc.CUTS[0], 4)] = functools.partial(build, None, tc.CUTS[0], 4)
# ptxas's checks (registers, spills, both operands by descriptor) for the default cut alone: a
# 128 x 256 cut takes ptxas up to three minutes, and the others are checked on a card, compiled by
# nvrtc, by bench/card_prefill_gemm.py --cuts all (their agreement on the host model is above)
NVCC_CUTS = (tc.CUTS[0],)
if NVCC is not None:
    EARLY_BUILDS.update({f"nvcc:gemm_wgmma:{only}:{cut}": functools.partial(nvcc_build, only, cut)
                         for cut in NVCC_CUTS for only in (1, 2)})


def library(broken: str | None = None, cut=tc.CUTS[0], group: int = 16):
    return early_builds.result(build_name(broken, cut, group), functools.partial(build, broken, cut, group))


@contextlib.contextmanager
def in_force(cut):
    """device_tensor_cores planning with `cut` (WGMMA_CUT, as the bench sets it between cuts)."""
    before, tc.WGMMA_CUT = tc.WGMMA_CUT, cut
    try:
        yield
    finally:
        tc.WGMMA_CUT = before


def counter(lib, name: str) -> int:
    return ctypes.c_longlong.in_dll(lib, name).value


def run(lib, kind, x, w, m, n, k, splits=1, x_scale=None, w_scale=None, w_stride=1, cut=tc.CUTS[0]):
    """One launch as device_batch_rows plans it in `cut` (the grid, the block, the split of K): y,
    and the model's (faults, races, MMAs, MMAs left pending) during it."""
    with in_force(cut):
        k_tile = tc.k_tile(kind, "wgmma")
        steps = -(-k // k_tile)
        per = -(-steps // splits)
        splits = -(-steps // per)
        (gx, gy, gz), block = tc.grid(m, n, splits, "wgmma", kind)
    y = np.full((m, n), np.nan, np.float32)
    partial = np.full((gz, m, n), np.nan, np.float32)
    counters = np.zeros(gx * gy, np.uint32)
    ptr = Pointers()

    args = [ptr(x), ptr(x_scale), ptr(w), ptr(w_scale), ctypes.c_int(w_stride), ptr(y), ptr(partial), ptr(counters),
            ctypes.c_int(m), ctypes.c_int(n), ctypes.c_int(k), ctypes.c_int(per)]
    before = [counter(lib, name) for name in ("r4d_wgmma_faults", "r4d_wgmma_races", "r4d_wgmma_mmas")]
    array = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
    assert lib.r4d_host_launch(f"r4d_wgmma_gemm_{kind}".encode(), gx, gy, gz, *block, array) == 0
    lib.r4d_wgmma_left.restype = ctypes.c_longlong
    model = [counter(lib, name) - b for name, b in zip(("r4d_wgmma_faults", "r4d_wgmma_races", "r4d_wgmma_mmas"), before)]
    left = lib.r4d_wgmma_left()
    assert not counters.any(), "the last block of each tile leaves its counter zero"
    return y, (*model, left), gx * gy * gz


def operands(kind, m, n, k, seed):
    """x's rows as the GEMM reads them (bf16 bits, or e4m3 codes with row scales) and w, with their
    values in float64."""
    rng = np.random.default_rng(seed)
    if kind == "bf16":
        x = rng.standard_normal((m, k), np.float32).astype(ml_dtypes.bfloat16)
        w = (rng.standard_normal((n, k), np.float32) / 8).astype(ml_dtypes.bfloat16)
        return x.view(np.uint16), w.view(np.uint16), x.astype(np.float64), w.astype(np.float64)
    x = np.clip(rng.standard_normal((m, k)) * 64, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    w = np.clip(rng.standard_normal((n, k)) * 64, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return x.view(np.uint8), w.view(np.uint8), x.astype(np.float64), w.astype(np.float64)


# (kind, M, N, K, splits, w scales a row): tails in M, N and K, split K, both scale strides, and
# 18 row tiles of 128 (a whole group of 16 and a group of 2: the kernel's order of tiles)
CASES = [("bf16", 200, 300, 520, 1, True), ("bf16", 37, 256, 1024, 3, True), ("bf16", 130, 128, 64, 1, True),
         ("bf16", 17 * 128 + 5, 136, 128, 2, True),
         ("e4m3", 150, 136, 528, 1, True), ("e4m3", 20, 200, 1024, 2, False)]


def check(kind, m, n, k, splits, per_row, cut):
    x, w, xv, wv = operands(kind, m, n, k, m + n + k)
    rng = np.random.default_rng(k)
    x_scale = w_scale = None
    want = xv @ wv.T
    if kind == "e4m3":
        x_scale = rng.uniform(0.5, 2, m).astype(np.float32)
        w_scale = rng.uniform(0.5, 2, n if per_row else 1).astype(np.float32)
        want = want * x_scale[:, None] * (w_scale[None, :] if per_row else w_scale[0])
    cut = cut.for_kind(kind)
    y, (faults, races, mmas, left), _ = run(library(None, cut), kind, x, w, m, n, k, splits, x_scale, w_scale,
                                            int(per_row), cut)
    assert (faults, races, left) == (0, 0, 0)
    tiles, steps = -(-m // cut.rows) * -(-n // cut.cols), -(-k // (cut.k_bytes // (2 if kind == "bf16" else 1)))
    # each thread of each tile: k_bytes / 32 MMAs a k-step, every k-step once
    assert mmas == tiles * steps * cut.threads * cut.k_bytes // 32
    assert np.isfinite(y).all()
    err = np.abs(y - want).max() / np.abs(want).max()
    assert err <= 2e-6, (kind, m, n, k, splits, str(cut), err)  # f32 sums of exact products: any misplaced chunk is ~1


@needs_gxx
@pytest.mark.parametrize("kind,m,n,k,splits,per_row", CASES)
def test_the_kernel_as_written_computes_the_product_on_the_modelled_card(kind, m, n, k, splits, per_row):
    check(kind, m, n, k, splits, per_row, tc.CUTS[0])


@needs_gxx
@pytest.mark.parametrize("cut", [str(cut) for cut in tc.CUTS[1:]])
@pytest.mark.parametrize("kind,m,n,k,splits,per_row", [CASES[0], CASES[5]])
def test_every_cut_offered_computes_the_product_on_the_modelled_card(cut, kind, m, n, k, splits, per_row):
    """The bench's other cuts (device_tensor_cores.CUTS): 128- and 64-byte swizzles, 2 to 5 stages,
    one or two k-tiles of MMAs in flight, 128 and 256 columns, three warpgroups, with tails in M, N
    and K (bf16) and split K (e4m3): two cases a cut, the default's six above."""
    check(kind, m, n, k, splits, per_row, tc.WgmmaCut.parse(cut))


@needs_gxx
def test_groups_of_four_row_tiles_cover_every_tile_once():
    """WG_GROUP = 4 over 18 row tiles and the default cut's column tiles (3 of 128, or 2 of 256): groups
    of 4 and a last group of 2 (R4D_WG_GROUP chooses the order on a card)."""
    m, n, k, cut = 17 * 128 + 5, 300, 128, tc.CUTS[0]
    x, w, xv, wv = operands("bf16", m, n, k, 4)
    y, (faults, races, mmas, left), _ = run(library(None, cut, 4), "bf16", x, w, m, n, k, cut=cut)
    columns = -(-n // cut.cols)
    assert (faults, races, left) == (0, 0, 0)
    assert mmas == 18 * columns * (k // (cut.k_bytes // 2)) * cut.threads * cut.k_bytes // 32
    want = xv @ wv.T
    assert np.abs(y - want).max() / np.abs(want).max() <= 2e-6


@needs_gxx
@pytest.mark.parametrize("broken", list(BROKEN))
def test_the_model_catches_a_kernel_that_reads_a_stage_out_of_order(broken):
    """Without the barrier, a thread issues its MMAs before the other threads' copies of the tile are
    in; without the wait_group (or with one that leaves a group more in flight), a later tile's
    copies overwrite a stage whose MMAs are still in flight."""
    x, w, xv, wv = operands("bf16", 130, 256, 512, 5)
    y, (faults, races, mmas, left), _ = run(library(broken), "bf16", x, w, 130, 256, 512)
    assert races > 0 and mmas > 0, broken  # (and without wait_group 1, more MMAs pending than a card holds: faults)
    if broken == "no wait_group 1":  # retired at the end, over stages rewritten since: wrong sums too
        assert np.abs(y - xv @ wv.T).max() > 1e-3


@needs_nvcc
@pytest.mark.parametrize("cut", [str(cut) for cut in NVCC_CUTS])
@pytest.mark.parametrize("only", [1, 2])
def test_the_sm_90a_build_fits_its_blocks_a_multiprocessor_and_reads_both_operands_from_shared_memory(only, cut):
    cut = tc.WgmmaCut.parse(cut)
    result, listing = early_builds.result(f"nvcc:gemm_wgmma:{only}:{cut}", functools.partial(nvcc_build, only, cut))
    assert result.returncode == 0, result.stderr[-2000:]
    cut = cut.for_kind(tc.KINDS[only - 1])
    report = result.stderr
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    # __launch_bounds__(threads, blocks): the blocks' threads in the 64K registers of a multiprocessor
    assert registers * cut.threads * cut.blocks <= 65536, report
    assert "0 bytes spill stores, 0 bytes spill loads" in report and "bytes smem" not in report, report
    assert "Potential Performance Loss" not in report, report  # ptxas serialising the wgmmas
    if listing is not None:
        instruction = f"HGMMA.64x{cut.cols}x16.F32.BF16" if only == 1 else f"QGMMA.64x{cut.cols}x32.F32.E4M3.E4M3"
        mmas = [line for line in listing.splitlines() if instruction in line]
        # SS: A from a descriptor too (RS would name a register in its place: "R24, R88, gdesc[...]")
        assert mmas and len(mmas) % (cut.k_bytes // 32) == 0, mmas
        assert all(re.search(r"R\d+, gdesc\[UR\d+\], R\d+", line) for line in mmas), mmas
        assert "LDGSTS.E.BYPASS.128" in listing and f"WARPGROUP.DEPBAR.LE gsb0, 0x{cut.depth}" in listing
        assert "LDL" not in listing and "STL" not in listing
