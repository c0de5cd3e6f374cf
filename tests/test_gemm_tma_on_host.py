"""gemm_tma.cu (the TMA-fed, warp-specialised tensor-core GEMM) run on the host: its real text built
with g++ behind tests/fixtures/cuda_on_host.h (a block's 288 or 384 threads as fibers), with
wgmma_on_host.h's model of wgmma and tma_on_host.h's of the mbarriers, the tensor maps and TMA's
loads. What no card run shows in CI and the fake card's numpy form does not reach: the ring's
full/empty phases and parities (a wait that can never end is reported, not hung), the producer
refilling a stage only after every consumer warp's MMAs on it have retired (the wgmma model counts
a stage rewritten under an MMA in flight as a race), the boxes' coordinates along K and down the
rows, TMA's zero fill past M, N and K, the swizzled stages read back through wgmma's descriptors,
split K and its counters, e4m3's scales, and r4d_tma_maps' fields as the GEMM's loads use them; in
every cut the bench offers (device_tensor_cores.TMA_CUTS) but its clusters (the model runs a grid's
blocks one after another, and a cluster's blocks run together: their multicast loads and releases
into each other are checked on a card, tests/test_gemm_tma_cluster.py). Against a float64 product of the same
bf16 or e4m3 values; the kernel with a stage's release taken out, released before its MMAs
retire, or a ring parity flipped, must be caught. Skipped, saying so, where g++ is missing."""

import ctypes
import functools
import importlib

import ml_dtypes
import numpy as np
import pytest

import early_builds
from device_batch_support import FAKES, Pointers, fixture_module

FIXTURES = fixture_module("cuda_on_host").SHIM.parent
ON_HOST = fixture_module("cuda_on_host")
dk = importlib.import_module("radiance.plugins.kernels.libr4d.device_kernels")
tc = importlib.import_module("radiance.plugins.kernels.libr4d.device_tensor_cores")
needs_gxx = pytest.mark.skipif(ON_HOST.why() is not None, reason=str(ON_HOST.why()))

WGMMA_PTX = ("// ---- wgmma's PTX", "// ---- end of wgmma's PTX")
TMA_PTX = ("// ---- the mbarriers' and TMA's PTX", "// ---- end of the mbarriers' and TMA's PTX")
MAPS_PTX = ("// ---- the tensor maps' PTX", "// ---- end of the tensor maps' PTX")
REPLACED = {"extern __shared__ __align__(1024) u8 wg_shared[];": "u8* wg_shared = r4d_host_shared;",
            "extern __shared__ __align__(1024) u8 tm_shared[];": "u8* tm_shared = r4d_host_shared;",
            "__shared__ __align__(128) u32 staged[4][32];": "static u32 staged[4][32];",
            # gemm_wgmma.cu's entries, which R4D_WG_ONLY=3 leaves out (the host build's table of
            # entries is read from the text, #if or not)
            "WG_GEMM_ENTRY(TC_BF16, r4d_wgmma_gemm_bf16)": "", "WG_GEMM_ENTRY(TC_E4M3, r4d_wgmma_gemm_e4m3)": ""}
# the kernel with one of its orderings broken, which the model must notice (the first two in the late
# release, R4D_TMA_RELEASE=late, whose lines they change; the early release's own after them)
BROKEN = {"no release of a stage": ("            if (i > 0 && lane == 0) tm_release(empty + (i - 1) % WG_STAGES, peers);\n", "\n"),
          "a stage released before its MMAs retire": (
              "            wg_wait<1>();\n            __syncwarp();  // every lane past its wait (wait_group is .aligned: this only says so)\n"
              "            if (i > 0 && lane == 0) tm_release(empty + (i - 1) % WG_STAGES, peers);\n",
              "            if (lane == 0) tm_arrive(empty + i % WG_STAGES);\n            wg_wait<1>();\n"),
          # (the early release moved before its wait<0> goes unseen: the model runs a warp until it
          # blocks, and that wait retires the MMAs at once, before the producer runs again)
          "early: no release of a stage": ("                if (lane == 0) tm_release(empty + s, peers);\n", "\n"),
          "the producer's parity flipped": ("                tm_wait(empty + s, (round & 1) ^ 1);\n",
                                            "                tm_wait(empty + s, round & 1);\n"),
          "the consumers' parity flipped": ("            tm_wait(full + s, (u32)(i / WG_STAGES) & 1);\n",
                                            "            tm_wait(full + s, ((u32)(i / WG_STAGES) & 1) ^ 1);\n"),
          # three warpgroups, thread 0 loading (the 192-row cut)
          "the loader's parity flipped": ("                tm_wait(empty + back, (u32)((i - 1) / WG_STAGES) & 1);\n",
                                          "                tm_wait(empty + back, ((u32)((i - 1) / WG_STAGES) & 1) ^ 1);\n"),
          # (a loader that skips the wait alone goes unseen: the model runs a block's threads in order,
          # so every warp has released a stage before thread 0 runs again)
          "the loader refilling the stage still in use": (
              "                int back = (i - 1) % WG_STAGES, k = (t0 + i - 1 + WG_STAGES) * WG_KB;\n",
              "                int back = i % WG_STAGES, k = (t0 + i + WG_STAGES) * WG_KB;\n")}
LOADER_CUT = next(cut for cut in tc.TMA_CUTS if cut.rows == 192)
HOST_CUTS = [cut for cut in tc.TMA_CUTS if cut.cluster == 1]  # the model's blocks run one at a time


def broken_cut(broken: str):
    return LOADER_CUT if "loader" in broken else tc.TMA_CUTS[0]


def broken_release(broken: str) -> str:
    return "late" if broken in ("no release of a stage", "a stage released before its MMAs retire") else "early"


def cut_out(text: str, markers: tuple, put: str = "") -> str:
    start, end = text.index(markers[0]), text.index(markers[1])
    assert text.count(markers[0]) == 1 and text.count(markers[1]) == 1
    return text[:start] + put + text[end:]


def host_source(broken: str | None = None) -> str:
    """gemm_tma.cu's text as the engine puts it together (gemm_wgmma.cu's PTX before it), every inline
    PTX part replaced by its host form, its shared memory the models' window."""
    tensor_core = (dk.FOLDER / "tensor_core.cu").read_text()
    text = dk.source("gemm_tma")
    assert tensor_core in text
    plain = tensor_core[tensor_core.index("// The split-K epilogue."):]  # C++ with no PTX: kept
    host = (FIXTURES / "tensor_core_on_host.h").read_text() + plain + (FIXTURES / "wgmma_on_host.h").read_text()
    text = text.replace(tensor_core, host)
    text = cut_out(text, WGMMA_PTX)
    text = cut_out(text, TMA_PTX, (FIXTURES / "tma_on_host.h").read_text())
    text = cut_out(text, MAPS_PTX)
    for old, new in REPLACED.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    assert "asm volatile(\"tensormap" not in text and "asm volatile(\"mbarrier" not in text
    if broken is not None:
        old, new = BROKEN[broken]
        assert text.count(old) == 1, broken
        text = text.replace(old, new)
    return text


def build(broken: str | None, cut, release: str):
    """The text built as the engine's options build it (device_tensor_cores.tma_defines) in `release`."""
    return ON_HOST.build(host_source(broken), ("-DR4D_WG_ONLY=3", "-DR4D_TM_ONLY=0", *tc.tma_defines(cut, release),
                                               "-DWG_GROUP=16"))


def build_name(broken, cut, release) -> str:
    return f"g++:gemm_tma:{broken or 'as written'}:cut {cut}:release {release}"


RELEASE = tc.TMA_RELEASE  # the process's (early unless R4D_TMA_RELEASE says otherwise)
EARLY_BUILDS = {}
if ON_HOST.why() is None:
    EARLY_BUILDS.update({build_name(None, cut, RELEASE): functools.partial(build, None, cut, RELEASE) for cut in HOST_CUTS})
    EARLY_BUILDS[build_name(None, tc.TMA_CUTS[0], "late")] = functools.partial(build, None, tc.TMA_CUTS[0], "late")
    EARLY_BUILDS.update({build_name(b, broken_cut(b), broken_release(b)): functools.partial(build, b, broken_cut(b), broken_release(b))
                         for b in BROKEN})


def library(broken=None, cut=tc.TMA_CUTS[0], release=RELEASE):
    return early_builds.result(build_name(broken, cut, release), functools.partial(build, broken, cut, release))


def counter(lib, name: str) -> int:
    return ctypes.c_longlong.in_dll(lib, name).value


COUNTERS = ("r4d_wgmma_faults", "r4d_wgmma_races", "r4d_wgmma_mmas", "r4d_tma_faults", "r4d_tma_hangs", "r4d_tma_loads")


def launch(lib, name, grid, block, args) -> None:
    array = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
    assert lib.r4d_host_launch(name.encode(), *grid, *block, array) == 0, name


def run(lib, kind, x, w, m, n, k, splits=1, x_scale=None, w_scale=None, w_stride=1, cut=tc.TMA_CUTS[0]):
    """r4d_tma_maps then the GEMM, as device_batch_rows plans them in `cut`: y, and the models'
    counters during the GEMM (and the MMAs it left pending)."""
    before_cut, tc.TMA_CUT = tc.TMA_CUT, cut
    try:
        steps = -(-k // tc.k_tile(kind, "tma"))
        per = -(-steps // splits)
        splits = -(-steps // per)
        (gx, gy, gz), block = tc.grid(m, n, splits, "tma", kind)
    finally:
        tc.TMA_CUT = before_cut
    y = np.full((m, n), np.nan, np.float32)
    partial = np.full((gz, m, n), np.nan, np.float32)
    counters = np.zeros(gx * gy, np.uint32)
    maps = np.zeros(256 // 8, np.uint64)  # 256 bytes, 8-aligned (the card's scratch: 256-aligned)
    ptr = Pointers()
    row_bytes = k * (2 if kind == "bf16" else 1)
    launch(lib, "r4d_tma_maps", (1, 1, 1), (32, 1, 1),
           [ptr(x), ptr(w), ctypes.c_int(m), ctypes.c_int(n), ctypes.c_int(row_bytes), ptr(maps)])
    before = [counter(lib, name) for name in COUNTERS]
    launch(lib, f"r4d_tma_gemm_{kind}", (gx, gy, gz), block,
           [ptr(maps), ptr(x_scale), ptr(w_scale), ctypes.c_int(w_stride), ptr(y), ptr(partial), ptr(counters),
            ctypes.c_int(m), ctypes.c_int(n), ctypes.c_int(k), ctypes.c_int(per)])
    model = {name[4:]: counter(lib, name) - b for name, b in zip(COUNTERS, before)}
    lib.r4d_wgmma_left.restype = ctypes.c_longlong
    model["left"] = lib.r4d_wgmma_left()
    if not model["tma_hangs"]:
        assert not counters.any(), "the last block of each tile leaves its counter zero"
    return y, model, gx * gy * gz


def operands(kind, m, n, k, seed):
    """x's rows as the GEMM reads them (bf16 bits, or e4m3 codes) and w, and their float64 values."""
    rng = np.random.default_rng(seed)
    if kind == "bf16":
        x = rng.standard_normal((m, k), np.float32).astype(ml_dtypes.bfloat16)
        w = (rng.standard_normal((n, k), np.float32) / 8).astype(ml_dtypes.bfloat16)
        return x.view(np.uint16), w.view(np.uint16), x.astype(np.float64), w.astype(np.float64)
    x = np.clip(rng.standard_normal((m, k)) * 64, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    w = np.clip(rng.standard_normal((n, k)) * 64, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return x.view(np.uint8), w.view(np.uint8), x.astype(np.float64), w.astype(np.float64)


# (kind, M, N, K, splits, w scales a row): tails in M, N and K (K 520 bf16: 1040 bytes, past the
# last stage's 64), split K, both scale strides, 18 row tiles (a group of 16 and one of 2)
CASES = [("bf16", 200, 300, 520, 1, True), ("bf16", 37, 256, 1024, 3, True), ("bf16", 130, 128, 64, 1, True),
         ("bf16", 17 * 128 + 5, 136, 128, 2, True), ("e4m3", 150, 136, 528, 1, True), ("e4m3", 20, 200, 1024, 2, False)]


def check(kind, m, n, k, splits, per_row, cut, release=RELEASE):
    x, w, xv, wv = operands(kind, m, n, k, m + n + k)
    rng = np.random.default_rng(k)
    x_scale = w_scale = None
    want = xv @ wv.T
    if kind == "e4m3":
        x_scale = rng.uniform(0.5, 2, m).astype(np.float32)
        w_scale = rng.uniform(0.5, 2, n if per_row else 1).astype(np.float32)
        want = want * x_scale[:, None] * (w_scale[None, :] if per_row else w_scale[0])
    y, model, blocks = run(library(None, cut, release), kind, x, w, m, n, k, splits, x_scale, w_scale, int(per_row), cut)
    assert (model["wgmma_faults"], model["wgmma_races"], model["left"], model["tma_faults"], model["tma_hangs"]) == (0,) * 5
    steps = -(-k // (cut.k_bytes // (2 if kind == "bf16" else 1)))
    tiles = -(-m // cut.rows) * -(-n // cut.cols)
    # every k-step of every tile once: two boxes a step, k_bytes / 32 MMAs a consumer thread
    assert model["tma_loads"] == 2 * tiles * steps and model["wgmma_mmas"] == tiles * steps * 2 * cut.rows * cut.k_bytes // 32
    assert np.isfinite(y).all()
    err = np.abs(y - want).max() / np.abs(want).max()
    assert err <= 2e-6, (kind, m, n, k, splits, str(cut), err)  # f32 sums of exact products: a misplaced chunk is ~1


@needs_gxx
@pytest.mark.parametrize("kind,m,n,k,splits,per_row", CASES)
def test_the_kernel_as_written_computes_the_product_on_the_modelled_card(kind, m, n, k, splits, per_row):
    check(kind, m, n, k, splits, per_row, tc.TMA_CUTS[0])


@needs_gxx
@pytest.mark.parametrize("kind,m,n,k,splits,per_row", [CASES[0], CASES[3], CASES[5]])
def test_the_late_release_computes_the_product_on_the_modelled_card(kind, m, n, k, splits, per_row):
    """R4D_TMA_RELEASE=late (a stage released after the next one's MMAs are issued), the bench's comparison."""
    check(kind, m, n, k, splits, per_row, tc.TMA_CUTS[0], "late")


@needs_gxx
@pytest.mark.parametrize("cut", [str(cut) for cut in HOST_CUTS[1:]])
@pytest.mark.parametrize("kind,m,n,k,splits,per_row", [CASES[0], CASES[5]])
def test_every_cut_offered_computes_the_product_on_the_modelled_card(cut, kind, m, n, k, splits, per_row):
    """The bench's other cuts: 32-byte stages in a ring of seven, 256 columns, 192 rows (three
    warpgroups, thread 0 issuing the loads between its steps)."""
    check(kind, m, n, k, splits, per_row, tc.TmaCut.parse(cut))


@needs_gxx
@pytest.mark.parametrize("broken", list(BROKEN))
def test_the_model_catches_a_ring_out_of_order(broken):
    """Without a release the producer waits forever (a hang, reported); a release before the MMAs
    retire, or a loader that does not wait for it, lets TMA rewrite a stage under them (a race); a
    flipped parity either hangs or reads a stage before or after its round."""
    x, w, xv, wv = operands("bf16", 130, 256, 512, 5)
    cut = broken_cut(broken)
    y, model, _ = run(library(broken, cut, broken_release(broken)), "bf16", x, w, 130, 256, 512, cut=cut)
    wrong = not np.isfinite(y).all() or np.abs(y - xv @ wv.T).max() > 1e-3
    assert model["tma_hangs"] + model["wgmma_races"] + model["tma_faults"] > 0 or wrong, (broken, model)


def run_forms(lib, x, weights, m, k, swiglu):
    """r4d_tma_maps_group then r4d_tma_gemm_bf16_group (swiglu False: every weight's y) or
    r4d_tma_gemm_bf16_swiglu (gate's weight then up's: gate's y, up's y), in the default cuts (`lib`
    built in TMA_CUT, or SWIGLU_CUT for swiglu), as the fused prefill rows plan them; and the models'
    counters."""
    rows = [w.shape[0] for w in weights]
    ys = [np.full((m, rows[0] if swiglu else n), np.nan, np.float32) for n in rows]
    maps = np.zeros(4 * 128 // 8, np.uint64)
    ptr = Pointers()
    padded = [*weights, *[weights[0]] * (3 - len(weights))]
    counts = [*rows, *[0] * (3 - len(rows))]
    box = tc.SWIGLU_CUT.cols // 2 if swiglu else tc.TMA_CUT.cols
    launch(lib, tc.TMA_MAPS_GROUP, (1, 1, 1), (32, 1, 1),
           [ptr(x), *[ptr(w) for w in padded], ctypes.c_int(m), *[ctypes.c_int(n) for n in counts],
            ctypes.c_int(len(weights)), ctypes.c_int(2 * k), ctypes.c_int(box), ptr(maps)])
    before = [counter(lib, name) for name in COUNTERS]
    if swiglu:
        grid, block = tc.swiglu_grid(m, rows[0])
        launch(lib, tc.TMA_SWIGLU, grid, block, [ptr(maps), ptr(ys[0]), ptr(ys[1]), ctypes.c_int(m),
                                                 ctypes.c_int(rows[0]), ctypes.c_int(k)])
    else:
        grid, block = tc.group_grid(m, tuple(rows))
        outputs = [*ys, *[ys[0]] * (3 - len(ys))]
        launch(lib, tc.TMA_GROUP, grid, block, [ptr(maps), *[ptr(y) for y in outputs], ctypes.c_int(m),
                                                *[ctypes.c_int(n) for n in counts], ctypes.c_int(len(weights)),
                                                ctypes.c_int(k)])
    model = {name[4:]: counter(lib, name) - b for name, b in zip(COUNTERS, before)}
    lib.r4d_wgmma_left.restype = ctypes.c_longlong
    model["left"] = lib.r4d_wgmma_left()
    return ys, model


@needs_gxx
@pytest.mark.parametrize("m,rows,k", [(200, (300, 128, 100), 520), (130, (256,), 64), (17 * 128 + 5, (136, 40), 128),
                                      (200, (1024, 4096 + 64, 100), 64), (200, (100, 136), 4096)])
def test_the_grouped_form_gives_each_weights_plain_product_bit_for_bit(m, rows, k):
    """q, k and v in one launch: each weight's tiles after the one before's, tails in M, every N and K;
    the same bits as a plain launch per weight over the same bf16 rows (the same sums in the same
    order), every tile's k-steps loaded once."""
    lib = library()
    x, _, xv, _ = operands("bf16", m, 8, k, m + k)
    weights = [operands("bf16", 8, n, k, n + 1)[1] for n in rows]
    ys, model = run_forms(lib, x, weights, m, k, swiglu=False)
    for w, y in zip(weights, ys):  # numpy's float64 product of the same bf16 values, within f32 sums
        ref = xv @ w.view(ml_dtypes.bfloat16).astype(np.float64).T
        assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max() * max(1.0, k / 512), (w.shape, np.abs(y - ref).max())
    assert (model["wgmma_faults"], model["wgmma_races"], model["left"], model["tma_faults"], model["tma_hangs"]) == (0,) * 5
    steps, cut = -(-k // (tc.TMA_CUT.k_bytes // 2)), tc.TMA_CUT
    assert model["tma_loads"] == 2 * steps * sum(-(-m // cut.rows) * -(-n // cut.cols) for n in rows)
    for w, y in zip(weights, ys):
        plain, _, _ = run(lib, "bf16", x, w, m, w.shape[0], k)
        assert np.array_equal(y.view(np.uint32), plain.view(np.uint32))


@needs_gxx
@pytest.mark.parametrize("m,n,k", [(200, 300, 520), (130, 64, 64), (300, 1000, 128), (200, 4096 + 64, 64), (200, 100, 4096)])
def test_the_swiglu_form_gives_the_unfused_chains_bits(m, n, k):
    """gate and up paired in a tile (half the cut's columns of each weight a box): up is up's plain product, gate is
    r4d_silu_mul of the plain products, bit for bit; three boxes a k-step of each tile. In SwiGLU's own
    cut (112 columns: 56 rows of each weight a box)."""
    lib = library(cut=tc.SWIGLU_CUT)
    x, _, _, _ = operands("bf16", m, 8, k, m + k)
    gate_w, up_w = (operands("bf16", 8, n, k, n + seed)[1] for seed in (1, 2))
    (gate, up), model = run_forms(lib, x, [gate_w, up_w], m, k, swiglu=True)
    assert (model["wgmma_faults"], model["wgmma_races"], model["left"], model["tma_faults"], model["tma_hangs"]) == (0,) * 5
    steps, cut = -(-k // (tc.SWIGLU_CUT.k_bytes // 2)), tc.SWIGLU_CUT
    assert model["tma_loads"] == 3 * steps * -(-m // cut.rows) * -(-n // (cut.cols // 2))
    plain_gate, _, _ = run(lib, "bf16", x, gate_w, m, n, k, cut=tc.SWIGLU_CUT)
    plain_up, _, _ = run(lib, "bf16", x, up_w, m, n, k, cut=tc.SWIGLU_CUT)
    assert np.array_equal(up.view(np.uint32), plain_up.view(np.uint32))
    assert np.array_equal(gate.view(np.uint32), FAKES.silu_mul_values(plain_gate, plain_up).view(np.uint32))
