"""libr4d's tensor-core gemm rows (device_batch_rows.py, device_tensor_cores.py, device/gemm_mma.cu)
without a card: which kernel each card gets, splits and scratch, the launch plans, the rows on a fake
card that says it is an sm_89 NVIDIA card (tests/fixtures/r4d_fake_kernels.py runs each kernel's
arithmetic in numpy) against libref within the tolerance docs/OPS.md states, and every new source
compiled by nvrtc as the engine compiles it (skipped, saying so, where nvrtc is not installed).
The same rows on a real card: tests/test_device_batch_rows.py."""

import os
import re

import numpy as np
import pytest

from radiance.abi import (
    RAD_DT_ENCODED, RAD_E_INVALID, RAD_E_NOMEM, RAD_OK, RadTensor, RadWeightPlanes, rad_device_tensor, rad_tensor,
)
from radiance.device.fake import expand_entry_macros
from radiance.engine.running.device_stream import EngineStream
from device_batch_support import fp8_weight, nvidia_fake
from device_sources import sass
from test_device_rows_host import Recorder, dev, device_weight, ints, launch, pointers
from test_device_rows_support import Card
from test_libr4d_support import activations, make_weight, registry, rel_err, row_of  # noqa: F401 (registry)
from test_libr4d_support import launch as host_launch

BF16, FP8 = "r4dchain_gemm_tc_bf16_dev", "r4dchain_gemm_tc_fp8_dev"


def module(registry, name):
    import importlib
    lib = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    return importlib.import_module(f"{lib.module.__name__}.{name}")


def device_row(registry, name):
    lib = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    return next(row for row in lib.rows if row.name == name)


class Recording(Recorder):
    """test_device_rows_host's recording stream, reading entry points through their macros (gemm_mma.cu
    defines its entries with TC_GEMM_ENTRY) as the fake compiler does."""

    def kernel(self, source, name, options=()):
        return super().kernel(source + expand_entry_macros(source), name, options)


# ---- which kernel, splits, scratch -------------------------------------------------------------

def test_each_card_gets_the_kernel_its_tensor_cores_run(registry, monkeypatch):
    tc = module(registry, "device_tensor_cores")
    monkeypatch.setattr(tc, "KERNEL", None)
    table = {("cuda", "sm_90"): ("wgmma", "wgmma"), ("cuda", "sm_90a"): ("wgmma", "wgmma"),
             ("cuda", "sm_89"): ("mma", "mma"), ("cuda", "sm_80"): ("mma", "simt"), ("cuda", "sm_86"): ("mma", "simt"),
             ("cuda", "sm_75"): ("simt", "simt"), ("hip", "gfx942"): ("simt", "simt"), ("fake", "fake_90"): ("simt", "simt")}
    for (vendor, target), kernels in table.items():
        assert (tc.kernel_for(vendor, target, "bf16"), tc.kernel_for(vendor, target, "e4m3")) == kernels, target
    # Hopper's bf16 GEMMs above the GEMV band and below SKINNY_BELOW on the skinny kernel, from
    # TMA_FROM rows on the TMA kernel; e4m3's and those between on wgmma
    ms = (tc.GEMV_MAX_M, tc.GEMV_MAX_M + 1, tc.SKINNY_BELOW - 1, tc.SKINNY_BELOW, tc.TMA_FROM - 1, tc.TMA_FROM, 2048)
    assert tc.GEMV_MAX_M + 1 < tc.SKINNY_BELOW <= tc.TMA_FROM
    assert [tc.kernel_for("cuda", "sm_90a", "bf16", m) for m in ms] == \
        ["wgmma", "skinny", "skinny", "wgmma", "wgmma", "tma", "tma"]
    assert tc.kernel_for("cuda", "sm_90a", "e4m3", 2048) == tc.kernel_for("cuda", "sm_90a", "e4m3", 64) == "wgmma"
    assert tc.kernel_for("cuda", "sm_89", "bf16", 2048) == "mma"
    monkeypatch.setattr(tc, "KERNEL", "skinny")  # bf16's alone: e4m3 keeps the card's kernel
    assert [tc.kernel_for("cuda", "sm_90", kind, 2048) for kind in ("bf16", "e4m3")] == ["skinny", "wgmma"]
    monkeypatch.setattr(tc, "KERNEL", "simt")
    assert tc.kernel_for("cuda", "sm_90", "bf16") == "simt"
    assert tc.kernel_for("cuda", "sm_90", "bf16", 2048) == "simt"
    monkeypatch.setattr(tc, "KERNEL", "tensor")
    with pytest.raises(ValueError, match="R4D_TC_KERNEL='tensor'"):
        tc.kernel_for("cuda", "sm_90", "bf16")


def test_k_is_split_only_where_the_tiles_cannot_fill_the_card(registry):
    tc = module(registry, "device_tensor_cores")
    assert tc.split(2048, 4096, 4096, "bf16") == (1, 128)        # 512 tiles: no split
    for m, n, k, kind in [(9, 4096, 4096, "bf16"), (64, 1024, 4096, "bf16"), (32, 4096, 14336, "e4m3"),
                          (200, 576, 576, "bf16"), (16, 576, 1536, "e4m3")]:
        splits, per = tc.split(m, n, k, kind)
        steps = -(-k // tc.k_tile(kind))
        assert 1 <= splits <= tc.MAX_SPLITS and (splits - 1) * per < steps <= splits * per, (m, n, k)
        assert splits == 1 or per >= tc.MIN_TILES_PER_SPLIT
        layout = tc.scratch_layout(m, n, k, kind)
        assert ("partial" in layout) == (splits > 1) and ("codes" in layout) == (kind == "e4m3")
        assert all(offset % 256 == 0 for offset in layout.values())
        assert tc.scratch_bytes(256, n, k, kind) >= layout["total"]
    assert tc.split(9, 4096, 4096, "bf16")[0] == 8  # 32 tiles of a batched decode step: K in 8
    assert tc.tile_m(64) == 64 and tc.tile_m(65) == 128 and tc.shared_bytes(65) == 3 * 256 * 80 <= 64 << 10


def test_the_rows_take_the_band_above_the_gemv_for_bf16_and_fp8(registry):
    from radiance.abi import RAD_DOMAIN_DEVICE
    from radiance.engine.selection.bands import resolve
    gemm = registry.rows_for("gemm")
    expected = {"bf16": ("plain", BF16), "fp8_channel": ("fp8", FP8), "fp8": ("fp8", FP8),
                "q4_1": ("q4_1", "r4dchain_gemm_q4_1_dev")}
    for wdtype, (gemv, above) in expected.items():
        geometry = {"N": 4096, "K": 4096, "wdtype": wdtype, "dtype": "f32"}
        resolution = resolve("gemm", registry.ops["gemm"].schema, gemm, geometry, {}, RAD_DOMAIN_DEVICE, 2048)
        assert [(b.lo, b.hi, b.row.name) for b in resolution.bands] == [
            (1, 8, f"r4dchain_gemv_{gemv}_dev"), (9, 2048, above)], wdtype
    row = device_row(registry, FP8)
    from radiance.weights import formats
    assert row.info.layout("w", formats.fp8_channel(), {"K": 64}) == row.info.layout("w", formats.fp8(), {"K": 64})
    assert row.info.layout("w", formats.plain("bf16"), {"K": 64}) != row.info.layout("w", formats.fp8(), {"K": 64})


# ---- launch plans -------------------------------------------------------------------------------

@pytest.mark.parametrize("cut", ["default", "128,128,128,2", "192,256,32,4"])
def test_a_wgmma_plan_narrows_x_then_asks_for_sm_90a_and_its_swizzled_stages(registry, monkeypatch, cut):
    tc = module(registry, "device_tensor_cores")
    monkeypatch.setattr(tc, "KERNEL", "wgmma")  # M = 37: the skinny kernel's by default
    if cut != "default":
        monkeypatch.setattr(tc, "WGMMA_CUT", tc.WgmmaCut.parse(cut))
    cut = tc.WGMMA_CUT
    stream, row = Recording("sm_90"), device_row(registry, BF16)
    w, x, y = device_weight("bf16", 4096, 4096, 0x7000000), dev(0x1000, (37, 4096)), dev(0x2000, (37, 4096))
    params = {"M": 37, "N": 4096, "K": 4096, "wdtype": "bf16", "dtype": "f32", "split_k": 1}
    need = row.info.scratch({**params, "M": 256})
    assert launch(row, [x, w, y], params, stream, 0x9000000, need) == RAD_OK
    (narrow, ngrid, nblock, nargs), (kernel, grid, block, args) = stream.launches
    layout = tc.scratch_layout(37, 4096, 4096, "bf16", "wgmma")
    rows = 0x9000000 + layout["codes"]
    assert (narrow, nblock) == ("r4d_narrow_bf16_dev", (256, 1, 1)) and ngrid[0] * 256 * 8 >= 37 * 4096
    assert pointers(nargs, [0, 2]) == [0x1000, rows] and pointers(nargs, [1]) == [37 * 4096]
    splits, per = tc.split(37, 4096, 4096, "bf16", "wgmma")
    # one row tile of 4096 / cols column tiles, split K in 8 (a wave holds 132 x the cut's blocks a multiprocessor)
    assert (kernel, grid, block) == ("r4d_wgmma_gemm_bf16", (4096 // cut.cols, 1, splits), (2 * cut.rows, 1, 1))
    assert splits == 8 and tc.k_tile("bf16", "wgmma") == cut.k_bytes // 2
    assert stream.shared == cut.stages * (cut.rows + cut.cols) * cut.k_bytes <= 64 << 10
    warpgroups = f"-DWG_WARPGROUPS={cut.rows // 64}"
    assert stream.compiled == [("r4d_narrow_bf16_dev", ()),
                               ("r4d_wgmma_gemm_bf16", ("--gpu-architecture=sm_90a", "-DR4D_WG_ONLY=1", warpgroups,
                                                         f"-DWG_BN={cut.cols}", f"-DWG_KB={cut.k_bytes}",
                                                         f"-DWG_STAGES={cut.stages}", f"-DWG_DEPTH={cut.depth}",
                                                         "-DWG_GROUP=16"))]
    assert pointers(args, [0, 2, 5, 6, 7]) == [rows, 0x7000000, 0x2000, 0x9000000 + layout["partial"], 0x9000000]
    assert ints(args, [8, 9, 10, 11]) == [37, 4096, 4096, per] and per * cut.k_bytes // 2 * splits >= 4096
    # the bf16 rows overlap neither the partials nor the counters, and the scratch hook sized for them
    assert layout["codes"] >= layout["partial"] + 4 * splits * 37 * 4096 and layout["total"] <= need
    assert layout["total"] >= layout["codes"] + 2 * 37 * 4096
    assert launch(row, [x, w, y], dict(params), stream, 0x9000000, layout["total"] - 1) == RAD_E_NOMEM


def test_the_wgmma_cuts_fit_the_launch_rule_and_say_what_is_wrong(registry):
    """Every cut the bench offers fits RAD_MAX_SHARED_BYTES and parses back from its text; e4m3 takes
    at most two warpgroups; R4D_WG_CUT's mistakes are named."""
    tc = module(registry, "device_tensor_cores")
    assert tc.WGMMA_CUT == tc.CUTS[0] and len(set(tc.CUTS)) == len(tc.CUTS)
    for cut in tc.CUTS:
        assert tc.WgmmaCut.parse(str(cut)) == cut and cut.shared <= 64 << 10
        assert cut.blocks == (2 if (cut.rows, cut.cols) == (128, 128) else 1)
        assert cut.for_kind("bf16") == cut and cut.for_kind("e4m3").rows == 128
    assert tc.WgmmaCut.parse("128,128,128,2").shared == 64 << 10 and tc.WgmmaCut.parse("192,256,32,4").threads == 384
    assert str(tc.WgmmaCut.parse("128,256,32,5,1")) == "128,256,32,5" and tc.WgmmaCut.parse("128,256,32,5,2").depth == 2
    for text, match in [("128,256,32", "four or five"), ("128,256,32,x", "four or five"), ("128,256,128,2", "65536"),
                        ("64,128,64,4", "rows 128 or 192"), ("128,128,16,4", "k_bytes"), ("192,128,64,2", "192 with 256"),
                        ("128,128,64,1", "stages >= depth"), ("128,128,128,2,2", "stages >= depth"),
                        ("128,256,32,5,3", "depth 1 or 2")]:
        with pytest.raises(ValueError, match=match):
            tc.WgmmaCut.parse(text)


def test_a_bf16_plan_is_one_mma_kernel_over_its_tiles(registry):
    tc = module(registry, "device_tensor_cores")
    stream, row = Recording("sm_89"), device_row(registry, BF16)
    w, x, y = device_weight("bf16", 4096, 4096, 0x7000000), dev(0x1000, (37, 4096)), dev(0x2000, (37, 4096))
    params = {"M": 37, "N": 4096, "K": 4096, "wdtype": "bf16", "dtype": "f32", "split_k": 1}
    need = row.info.scratch({**params, "M": 256})
    assert launch(row, [x, w, y], params, stream, 0x9000000, need) == RAD_OK
    ((kernel, grid, block, args),) = stream.launches
    splits, per = tc.split(37, 4096, 4096, "bf16")
    assert (kernel, grid, block) == ("r4d_mma_gemm_bf16_m64", (32, 1, splits), (256, 1, 1)) and splits > 1
    assert stream.shared == 3 * (64 + 128) * 80
    assert stream.compiled == [("r4d_mma_gemm_bf16_m64", ("-DR4D_TC_ONLY=1",))]
    layout = tc.scratch_layout(37, 4096, 4096, "bf16")
    assert pointers(args, [0, 2, 5, 6, 7]) == [0x1000, 0x7000000, 0x2000, 0x9000000 + layout["partial"], 0x9000000]
    assert ints(args, [8, 9, 10, 11]) == [37, 4096, 4096, per]
    # too little scratch for the split: the row says so, it does not overrun
    assert launch(row, [x, w, y], dict(params), stream, 0x9000000, layout["total"] - 1) == RAD_E_NOMEM
    assert launch(row, [dev(0x1004, (37, 4096)), w, y], dict(params), stream, 0x9000000, need) == RAD_E_INVALID


def test_an_fp8_plan_quantises_x_into_the_scratch_then_runs_the_e4m3_kernel(registry):
    tc = module(registry, "device_tensor_cores")
    stream, row = Recording("sm_89"), device_row(registry, FP8)
    weight = fp8_weight(registry, 1024, 576, 3)
    planes = [rad_device_tensor(0x7000000 + 0x1000000 * i, 6, (t.data.size,), 1) for i, t in enumerate(weight.planes)]
    w = RadTensor(data=RadWeightPlanes(encoding=weight.encoding, rows=1024, cols=576, planes=planes),
                  dtype=RAD_DT_ENCODED, ndim=2, shape=(1024, 576, 0, 0))
    x, y = dev(0x1000, (200, 576)), dev(0x2000, (200, 1024))
    params = {"M": 200, "N": 1024, "K": 576, "wdtype": "fp8_channel", "dtype": "f32", "split_k": 1}
    need = row.info.scratch({**params, "M": 256})
    assert launch(row, [x, w, y], params, stream, 0x9000000, need) == RAD_OK
    (quantize, qgrid, _, qargs), (kernel, grid, _, args) = stream.launches
    layout = tc.scratch_layout(200, 1024, 576, "e4m3")
    codes, scales = 0x9000000 + layout["codes"], 0x9000000 + layout["scales"]
    assert (quantize, qgrid) == ("r4d_quantize_e4m3_dev", (200, 1, 1))
    assert pointers(qargs, [0, 3, 4]) == [0x1000, codes, scales]
    splits, _ = tc.split(200, 1024, 576, "e4m3")
    assert (kernel, grid) == ("r4d_mma_gemm_e4m3_m128", (8, 2, splits)) and splits == 2
    assert pointers(args, [0, 1, 2, 3, 5, 7]) == [codes, scales, 0x7000000, 0x8000000, 0x2000, 0x9000000]
    assert ints(args, [4]) == [1]  # a scale per row
    assert stream.compiled == [("r4d_quantize_e4m3_dev", ()), ("r4d_mma_gemm_e4m3_m128", ("-DR4D_TC_ONLY=4",))]


@pytest.mark.parametrize("target,kernel", [("sm_75", "r4d_gemm_dev"), ("sm_80", "r4d_mma_gemm_bf16_m128")])
def test_older_cards_take_the_simt_tiles_from_the_same_row(registry, target, kernel):
    stream, row = Recording(target), device_row(registry, BF16)
    w, x, y = device_weight("bf16", 512, 576, 0x7000000), dev(0x1000, (100, 576)), dev(0x2000, (100, 512))
    params = {"M": 100, "N": 512, "K": 576, "wdtype": "bf16", "dtype": "f32", "split_k": 1}
    assert launch(row, [x, w, y], params, stream, 0x9000000, row.info.scratch({**params, "M": 256})) == RAD_OK
    assert stream.launches[-1][0] == kernel


# ---- on the fake card, against libref --------------------------------------------------------------

CASES = [("bf16", 576, 576, 9), ("bf16", 1536, 576, 64), ("bf16", 576, 1536, 65), ("bf16", 1024, 4096, 16),
         ("bf16", 1024, 576, 200), ("fp8_channel", 1536, 576, 37), ("fp8_channel", 576, 1536, 9),
         ("fp8_channel", 512, 1024, 130), ("fp8", 512, 1024, 20)]


@pytest.fixture(scope="module", params=["sm_89", "sm_90"])
def on_fake(request):
    """A fake sm_89 card (mma.sync's kernels) and a fake sm_90 one (wgmma's)."""
    device = nvidia_fake(request.param)
    card = Card(device, EngineStream(device))
    card.kernel = {"sm_89": "mma", "sm_90": "wgmma"}[request.param]
    yield card
    card.close()
    device.close()


@pytest.mark.parametrize("fmt,n,k,m", CASES)
def test_the_kernels_arithmetic_agrees_with_libref_within_the_stated_tolerance(registry, on_fake, monkeypatch, fmt, n, k, m):
    tc = module(registry, "device_tensor_cores")
    monkeypatch.setattr(module(registry, "device_streamed_gemm"), "SERVING", None)  # the tile kernels, at every M
    weight = make_weight(fmt, n, k, n + k) if fmt == "bf16" else fp8_weight(registry, n, k, n + k, fmt[4:] or "tensor")
    x = activations(m, k, m)
    params = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
    row = device_row(registry, BF16 if fmt == "bf16" else FP8)
    before = len(on_fake.device.launches)
    got = on_fake.run(row, [x, None, np.zeros((m, n), np.float32)], params, {1: weight}, read=(2,))[2]
    ran = [launch.name for launch in on_fake.device.launches[before:]]
    kind = "bf16" if fmt == "bf16" else "e4m3"
    kernel = tc.kernel_for("cuda", on_fake.device.target, kind, m)  # on the sm_90: bf16 up to SKINNY_BELOW, skinny
    assert kernel in ((on_fake.kernel, "skinny") if kind == "bf16" else (on_fake.kernel,))
    first = {"e4m3": ["r4d_quantize_e4m3_dev"], "bf16": ["r4d_narrow_bf16_dev"] if on_fake.kernel == "wgmma" else []}
    assert ran == first[kind] + [tc.entry(kind, m, kernel)]
    want = np.zeros((m, n), np.float32)
    assert host_launch(row_of(registry, "gemm", "libref"), [x, None, want], params, {1: weight}) == RAD_OK
    err = rel_err(got, want)
    assert 0 < err <= tc.TOLERANCE[kind], (fmt, n, k, m, err)


def test_a_split_gemm_gives_the_same_bits_launch_after_launch(registry, on_fake):
    """The last block of each tile resets its counter: a replay with the same scratch adds the
    splits again (the fake form finds the counters zero at every launch, or fails)."""
    row = device_row(registry, BF16)
    params = {"M": 12, "N": 1024, "K": 4096, "wdtype": "bf16", "dtype": "f32", "split_k": 1}
    operands = [activations(12, 4096, 1), None, np.zeros((12, 1024), np.float32)]
    a = on_fake.args(row, operands, params, {1: make_weight("bf16", 1024, 4096, 2)})
    on_fake.replays_agree(row, a, 2, operands[2])
    assert module(registry, "device_tensor_cores").split(12, 1024, 4096, "bf16", on_fake.kernel)[0] > 1



def test_the_split_counters_outlive_every_step_in_one_scratch_of_the_gemm(registry, on_fake):
    """The engine gives the GEMM row one scratch for every step: a prefill's bf16 rows, a streamed
    GEMM's partials (M <= 32) and a split tile GEMM's (M 40, 65) all land in it, one step after another.
    The split-K counters keep a region of their own at the scratch's start, which no step's rows or
    partials reach (the forms assert them zero at launch: laid at the start of whatever each M's
    layout was, a 2048-row step's rows, or a 20-row step's partials, were found in them)."""
    from radiance.abi import RadArgs
    tc = module(registry, "device_tensor_cores")
    row = device_row(registry, BF16)
    n, k = 1024, 4096
    weight = make_weight("bf16", n, k, 5)
    size = row.info.scratch({"M": 2048, "N": n, "K": k, "wdtype": "bf16", "dtype": "f32", "split_k": 1})
    scratch = on_fake.alloc(size, "scratch")
    on_fake.device.memset32(scratch, 0, size // 4, on_fake.stream.handle)
    splits = {}
    for m in (2048, 65, 20, 40, 300, 12):
        params = {"M": m, "N": n, "K": k, "wdtype": "bf16", "dtype": "f32", "split_k": 1}
        x = activations(m, k, m)
        operands = [x, None, np.zeros((m, n), np.float32)]
        a = on_fake.args(row, operands, params, {1: weight})
        a = RadArgs(t=a.t, params=a.params, scratch=scratch, scratch_bytes=size, stream=a.stream)
        assert row.info.launch(a) == RAD_OK, m
        got = on_fake.download(a.t[2], operands[2])
        want = np.zeros((m, n), np.float32)
        assert host_launch(row_of(registry, "gemm", "libref"), [x, None, want], params, {1: weight}) == RAD_OK
        assert rel_err(got, want) <= tc.TOLERANCE["bf16"], (m, rel_err(got, want))
        splits[m] = tc.split(m, n, k, "bf16", tc.kernel_for("cuda", on_fake.device.target, "bf16", m))[0]
    assert splits[65] > 1 and splits[40] > 1  # split tiles after a 2048-row step and a streamed one

# ---- the streamed GEMM (gemm_streamed.cu) for batched decode, where it serves ------------------------

def test_the_streamed_gemm_serves_up_to_32_rows_unless_told_otherwise(registry, monkeypatch):
    sg = module(registry, "device_streamed_gemm")
    if os.environ.get("R4D_STREAMED_GEMM"):
        pytest.skip("R4D_STREAMED_GEMM is set in this environment: the default is not what loaded")
    assert sg.SERVING == sg.Serving(sg.StreamedCut(), sg.DEFAULT_MAX_M, over_skinny=False) and sg.DEFAULT_MAX_M == 32
    assert sg.serves("wgmma", "bf16", 9) and sg.serves("mma", "e4m3", 32) and not sg.serves("wgmma", "bf16", 33)
    # where the card's kernel is the skinny GEMM (Hopper, bf16), that one serves: it was faster there
    assert not sg.serves("skinny", "bf16", 9) and not sg.serves("skinny", "bf16", 32)


def test_on_hopper_bf16_batches_of_9_to_32_take_the_skinny_gemm_and_e4m3_the_streamed_one(registry, monkeypatch):
    sg, tc = module(registry, "device_streamed_gemm"), module(registry, "device_tensor_cores")
    monkeypatch.setattr(sg, "SERVING", sg.Serving(sg.StreamedCut(), sg.DEFAULT_MAX_M, over_skinny=False))
    monkeypatch.setattr(tc, "KERNEL", None)
    for m in (9, 16, 32):
        assert sg.serves(tc.kernel_for("cuda", "sm_90a", "bf16", m), "bf16", m) is False
        assert sg.serves(tc.kernel_for("cuda", "sm_90a", "e4m3", m), "e4m3", m) is True
        assert sg.serves(tc.kernel_for("cuda", "sm_89", "bf16", m), "bf16", m) is True  # no skinny kernel there


def test_the_streamed_gemm_serves_up_to_64_rows_on_mma_cards_where_turned_on(registry, monkeypatch):
    sg = module(registry, "device_streamed_gemm")
    monkeypatch.setattr(sg, "SERVING", None)
    assert not sg.serves("wgmma", "bf16", 32)
    monkeypatch.setattr(sg, "SERVING", sg.Serving(sg.StreamedCut()))
    assert sg.serves("wgmma", "bf16", 9) and sg.serves("mma", "e4m3", 64) and sg.serves("skinny", "bf16", 32)
    assert not sg.serves("wgmma", "bf16", 65) and not sg.serves("simt", "bf16", 32)
    assert [sg.variant(m) for m in (9, 16, 17, 32, 33, 64)] == [16, 16, 32, 32, 64, 64]
    with pytest.raises(ValueError, match="M <= 64"):
        sg.variant(65)


@pytest.mark.parametrize("text,match", [("8,2,64", "four or five integers"), ("8,2,96,2", "stage 64"),
                                        ("16,2,64,2", "warps 1, 2, 4 or 8"), ("8,3,64,2", "tiles 1 or 2"),
                                        ("8,2,64,x", "four or five integers"), ("8,2,64,2,3", "chunks 1 or 2")])
def test_a_streamed_cut_says_what_is_wrong(registry, text, match):
    sg = module(registry, "device_streamed_gemm")
    assert sg.StreamedCut.parse("1") == sg.StreamedCut() and sg.StreamedCut.parse("4,1,128,3").rows == 64
    assert str(sg.StreamedCut.parse("8,2,64,1,2")) == "8,2,64,1,2" and str(sg.StreamedCut()) == "8,2,64,2"
    with pytest.raises(ValueError, match=match):
        sg.StreamedCut.parse(text)


@pytest.mark.parametrize("m,n,k,splits", [
    # Llama-3-8B's o at M = 64 (16 row blocks of 256, one block a multiprocessor): 8 splits, 128 blocks;
    # at M = 32 (two a multiprocessor) 16; gate+up: 112 row blocks fill a wave alone at 64, take 2 at 32
    (64, 4096, 4096, 8), (32, 4096, 4096, 16), (64, 28672, 4096, 1), (32, 28672, 4096, 2), (64, 4096, 14336, 8),
    (16, 128256, 4096, 1), (64, 576, 64, 1)])
def test_the_streamed_split_fills_a_wave_with_whole_stages(registry, m, n, k, splits):
    sg = module(registry, "device_streamed_gemm")
    cut = sg.StreamedCut()
    got, k_chunk = sg.split(m, n, k, "bf16", cut)
    assert got == splits and k_chunk % cut.stage == 0 and (got - 1) * k_chunk < k <= got * k_chunk
    layout = sg.scratch_layout(m, n, k, "bf16", cut)
    assert layout["total"] == (0 if splits == 1 else layout["partial"] + 4 * splits * m * n)


def test_a_streamed_plan_is_one_launch_of_its_entry_in_its_cut(registry, monkeypatch):
    sg = module(registry, "device_streamed_gemm")
    monkeypatch.setattr(sg, "SERVING", sg.Serving(sg.StreamedCut()))
    stream, row = Recording("sm_90"), device_row(registry, BF16)
    w, x, y = device_weight("bf16", 4096, 4096, 0x7000000), dev(0x1000, (37, 4096)), dev(0x2000, (37, 4096))
    params = {"M": 37, "N": 4096, "K": 4096, "wdtype": "bf16", "dtype": "f32", "split_k": 1}
    need = row.info.scratch({**params, "M": 256})
    assert launch(row, [x, w, y], params, stream, 0x9000000, need) == RAD_OK
    (kernel, grid, block, args), (reduce, rgrid, rblock, rargs) = stream.launches
    splits, k_chunk = sg.split(37, 4096, 4096, "bf16", sg.SERVING.cut)
    assert (kernel, grid, block) == ("r4d_streamed_gemm_bf16_m64", (16, 1, splits), (256, 1, 1)) and splits > 1
    options = ("-DGS_ONLY=3", *sg.SERVING.cut.defines())
    assert stream.compiled == [(kernel, options), ("r4d_streamed_reduce", options)]  # one module
    layout, tc = sg.scratch_layout(37, 4096, 4096, "bf16", sg.SERVING.cut), module(registry, "device_tensor_cores")
    assert layout["total"] == 4 * splits * 37 * 4096 and layout["partial"] == 0
    partial = 0x9000000 + tc.COUNTER_BYTES  # after the tile kernels' split counters, which no other step touches
    assert pointers(args, [0, 1, 2, 4, 5]) == [0x1000, 0x7000000, 0, 0x2000, partial]
    assert ints(args, [3, 6, 7, 8, 9]) == [0, 37, 4096, 4096, k_chunk]
    # the reduction: every output, 4 a thread, the splits in the scratch
    assert (reduce, rgrid, rblock) == ("r4d_streamed_reduce", (-(-37 * 4096 // 4 // 256), 1, 1), (256, 1, 1))
    assert pointers(rargs, [0, 1, 3]) == [partial, 0, 0x2000] and ints(rargs, [2, 4, 5, 6]) == [0, 37, 4096, splits]
    # too little scratch for the split: the row says so, it does not overrun
    assert launch(row, [x, w, y], dict(params), stream, 0x9000000, tc.COUNTER_BYTES + layout["total"] - 1) == RAD_E_NOMEM
    # above 64 rows, the kernel the card runs without it: on an sm_90 the skinny kernel, the tile GEMM past it
    for m, kernel in [(65, "r4d_skinny_gemm_bf16"), (tc.SKINNY_BELOW, "r4d_wgmma_gemm_bf16")]:
        assert launch(row, [dev(0x1000, (m, 4096)), w, y], {**params, "M": m}, stream, 0x9000000, need) == RAD_OK
        assert stream.launches[-1][0] == kernel


@pytest.mark.parametrize("fmt,n,k,m", [("bf16", 576, 576, 9), ("bf16", 1536, 576, 64), ("bf16", 1024, 4096, 16),
                                       ("bf16", 576, 1536, 33), ("fp8_channel", 1536, 576, 37),
                                       ("fp8_channel", 576, 1536, 9), ("fp8", 512, 1024, 20)])
def test_the_streamed_gemm_agrees_with_libref_within_the_stated_tolerance(registry, on_fake, monkeypatch, fmt, n, k, m):
    sg, tc = module(registry, "device_streamed_gemm"), module(registry, "device_tensor_cores")
    monkeypatch.setattr(sg, "SERVING", sg.Serving(sg.StreamedCut()))
    weight = make_weight(fmt, n, k, n + k) if fmt == "bf16" else fp8_weight(registry, n, k, n + k, fmt[4:] or "tensor")
    x = activations(m, k, m)
    params = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
    row = device_row(registry, BF16 if fmt == "bf16" else FP8)
    before = len(on_fake.device.launches)
    got = on_fake.run(row, [x, None, np.zeros((m, n), np.float32)], params, {1: weight}, read=(2,))[2]
    kind = "bf16" if fmt == "bf16" else "e4m3"
    split = sg.split(m, n, k, kind, sg.SERVING.cut)[0] > 1
    assert [launch.name for launch in on_fake.device.launches[before:]] == [sg.entry(kind, m)] + ["r4d_streamed_reduce"] * split
    want = np.zeros((m, n), np.float32)
    assert host_launch(row_of(registry, "gemm", "libref"), [x, None, want], params, {1: weight}) == RAD_OK
    # bf16's tolerance for both kinds: x is only rounded to bf16, never quantised to e4m3
    assert 0 < rel_err(got, want) <= tc.TOLERANCE["bf16"], (fmt, n, k, m, rel_err(got, want))


def test_a_split_streamed_gemm_gives_the_same_bits_launch_after_launch(registry, on_fake, monkeypatch):
    sg = module(registry, "device_streamed_gemm")
    monkeypatch.setattr(sg, "SERVING", sg.Serving(sg.StreamedCut()))
    row = device_row(registry, BF16)
    params = {"M": 12, "N": 1024, "K": 4096, "wdtype": "bf16", "dtype": "f32", "split_k": 1}
    operands = [activations(12, 4096, 1), None, np.zeros((12, 1024), np.float32)]
    a = on_fake.args(row, operands, params, {1: make_weight("bf16", 1024, 4096, 2)})
    on_fake.replays_agree(row, a, 2, operands[2])
    gemm, reduce = on_fake.device.launches[-2:]
    assert (gemm.name, reduce.name) == ("r4d_streamed_gemm_bf16_m16", "r4d_streamed_reduce") and gemm.grid[2] > 1


# ---- nvrtc, as the engine compiles ------------------------------------------------------------------

def nvrtc_or_skip():
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError as error:
        pytest.skip(f"nvrtc is not installed here (pip install cuda-bindings nvidia-cuda-nvrtc): {error}")
    from radiance.device.cuda import nvrtc_compile
    return nvrtc_compile



@pytest.mark.parametrize("entry,target,instruction", [
    ("r4d_mma_gemm_bf16_m64", "sm_80", "HMMA.16816.F32.BF16"), ("r4d_mma_gemm_bf16_m128", "sm_90", "HMMA.16816.F32.BF16"),
    # e4m3: Ada's own QMMA; Hopper runs mma.sync's e4m3 as f16 HMMA after unpacking (only wgmma has QGMMA there)
    ("r4d_mma_gemm_e4m3_m64", "sm_89", "QMMA.16832.F32.E4M3.E4M3"), ("r4d_mma_gemm_e4m3_m128", "sm_90", "F2FP.F16.E4M3.UNPACK")])
def test_the_mma_gemm_compiles_through_nvrtc_to_tensor_core_instructions(registry, tmp_path, entry, target, instruction):
    compile_ = nvrtc_or_skip()
    dk, tc = module(registry, "device_kernels"), module(registry, "device_tensor_cores")
    cubin = compile_(dk.source("gemm_mma"), target, tc.options(entry))
    assert entry.encode() in cubin
    listing = sass(cubin)
    if listing is not None:
        assert instruction in listing and "LDSM" in listing and "LDGSTS" in listing, entry
        gemm = listing[listing.index(f"Function : {entry}"):]
        assert "LDL" not in gemm or entry == "r4d_mma_gemm_e4m3_m128"  # 16 bytes spilled there (-Xptxas -v)


@pytest.mark.parametrize("entry,instruction", [("r4d_wgmma_gemm_bf16", "HGMMA.64x{cols}x16.F32.BF16"),
                                               ("r4d_wgmma_gemm_e4m3", "QGMMA.64x{cols}x32.F32.E4M3.E4M3")])
def test_the_wgmma_gemm_compiles_for_sm_90a_to_warpgroup_instructions(registry, tmp_path, entry, instruction):
    """The row's options ask for sm_90a in place of the card's sm_90 (the engine compiles for the
    card's target and hands the options after it), in the cut it plans with (the MMA's N its columns)."""
    compile_ = nvrtc_or_skip()
    dk, tc = module(registry, "device_kernels"), module(registry, "device_tensor_cores")
    instruction = instruction.format(cols=tc.wgmma_cut(entry.rsplit("_", 1)[1]).cols)
    cubin = compile_(dk.source("gemm_wgmma"), "sm_90", tc.options(entry))
    assert entry.encode() in cubin
    listing = sass(cubin)
    if listing is not None:
        assert instruction in listing and "WARPGROUP.ARRIVE" in listing and "LDL" not in listing, entry
        assert "code for sm_90a" in listing and "LDGSTS" in listing
        # both operands by descriptor (wgmma's SS form; A from registers would name a register first)
        mmas = [line for line in listing.splitlines() if instruction in line]
        assert mmas and all(re.search(r"R\d+, gdesc\[UR\d+\], R\d+", line) for line in mmas), mmas


@pytest.mark.parametrize("entry", ["r4d_streamed_gemm_bf16_m16", "r4d_streamed_gemm_bf16_m64", "r4d_streamed_gemm_e4m3_m32"])
def test_the_streamed_gemm_compiles_through_nvrtc_to_bf16_mma_without_spills(registry, entry):
    """As the row compiles it for an H200 (sm_90; mma.sync needs no sm_90a): bf16 HMMAs, the
    weights' 16-byte loads (LDG.E...128), no local memory."""
    compile_ = nvrtc_or_skip()
    dk, sg = module(registry, "device_kernels"), module(registry, "device_streamed_gemm")
    cubin = compile_(dk.source("gemm_streamed"), "sm_90", sg.options(entry, sg.StreamedCut()))
    assert entry.encode() in cubin
    listing = sass(cubin)
    if listing is not None:
        assert "HMMA.16816.F32.BF16" in listing and re.search(r"LDG\.E[.\w]*128", listing) and "LDL" not in listing, entry


def test_the_e4m3_quantiser_compiles_through_nvrtc(registry):
    compile_ = nvrtc_or_skip()
    cubin = compile_(module(registry, "device_kernels").source("gemm_inputs"), "sm_89")
    assert b"r4d_quantize_e4m3_dev" in cubin


@pytest.mark.parametrize("fmt", ["fp8_channel", "fp8"])
def test_the_fp8_gemv_compiles_through_nvrtc(registry, fmt):
    """Where cuobjdump is found: the plain GEMV's M = 1 entry converts its codes on the card
    (common.cu's r4d_fp8x4: F2FP.F16.E4M3.UNPACK), with no FMUL left of r4d_fp8's multiply by 2^120
    (the folded norm's and silu's products are FMULs: mode 0, no norm)."""
    compile_ = nvrtc_or_skip()
    dk = module(registry, "device_kernels")
    cubin = compile_(dk.source("gemv"), "sm_90", dk.gemv_options(fmt, 2, 1))
    assert b"r4d_gemv_m1" in cubin and b"r4d_gemv_m8" in cubin
    listing = sass(compile_(dk.source("gemv"), "sm_90", dk.gemv_options(fmt)))
    if listing is not None:
        entry = listing[listing.index("Function : r4d_gemv_m1"):]
        entry = entry[:entry.index("Function :", 10)] if "Function :" in entry[10:] else entry
        assert "F2FP.F16.E4M3.UNPACK" in entry and "FMUL" not in entry


# ---- attention for batches (attention_tiles.cu) ----------------------------------------------------

ATTENTION = "r4dchain_attention_tc_dev"


def attention_operands(heads, kv, d, sequences, block_size=16, seed=0):
    """sequences: (first position, new tokens); the cache holds random rows for earlier positions
    (tests/test_device_rows.py's attention_case, here for the fake card)."""
    rng = np.random.default_rng(seed)
    seqs, lengths = len(sequences), [p + t for p, t in sequences]
    max_blocks = max(-(-n // block_size) for n in lengths)
    blocks = rng.permutation(seqs * max_blocks + 4)[: seqs * max_blocks].reshape(seqs, max_blocks).astype(np.int32)
    slots_total, width = (seqs * max_blocks + 4) * block_size, kv * d
    positions = [j for first, count in sequences for j in range(first, first + count)]
    slots = [blocks[s, j // block_size] * block_size + j % block_size
             for s, (first, count) in enumerate(sequences) for j in range(first, first + count)]
    m = len(positions)
    cu = np.concatenate([[0], np.cumsum([t for _, t in sequences])]).astype(np.int32)
    operands = [rng.standard_normal((m, heads * d)).astype(np.float32), rng.standard_normal((m, width)).astype(np.float32),
                rng.standard_normal((m, width)).astype(np.float32),
                rng.standard_normal((slots_total, width)).astype(np.float32),
                rng.standard_normal((slots_total, width)).astype(np.float32), np.array(slots, np.int32),
                np.array(positions, np.int32), cu, np.array(lengths, np.int32), blocks, np.zeros((m, heads * d), np.float32)]
    params = {"M": m, "q_heads": heads, "kv_heads": kv, "head_dim": d, "block_size": block_size,
              "scale": 1.0 / np.sqrt(d), "dtype": "f32", "seqs": seqs}
    return operands, params


ATTENTION_CASES = {
    # 12 decode tokens of mixed contexts (to 1500): tiles of one token, the context split
    "decode_batch": (8, 2, 128, [(p, 1) for p in (3, 17, 40, 100, 255, 256, 511, 700, 999, 1200, 1499, 64)]),
    # a prefill chunk of 40 tokens after 300 cached, beside decode tokens (chunked prefill)
    "chunk_and_decode": (8, 2, 128, [(300, 40), (77, 1), (5, 1), (1000, 1)]),
    # SmolLM2's heads (9 over 3, head_dim 64: tiles of 21 tokens) prefilling from 0
    "smollm2_prefill": (9, 3, 64, [(0, 50), (0, 9)]),
    # one query head a kv head, a whole-prompt prefill of 70 tokens: tiles of 64 tokens
    "mha_prefill": (2, 2, 64, [(0, 70)]),
}


@pytest.mark.parametrize("case", sorted(ATTENTION_CASES))
def test_the_attention_tiles_agree_with_libref_within_the_stated_tolerance(registry, on_fake, case):
    at = module(registry, "device_attention_tiles")
    heads, kv, d, sequences = ATTENTION_CASES[case]
    operands, params = attention_operands(heads, kv, d, sequences, seed=len(case))
    row = device_row(registry, ATTENTION)
    before = len(on_fake.device.launches)
    got = on_fake.run(row, operands, params, read=(3, 4, 10))
    ran = on_fake.device.launches[before:]
    if params["M"] == len(sequences):  # a decode step: attention_decode.cu alone
        ad = module(registry, "device_attention_decode")
        assert [launch.name for launch in ran] == ["r4d_attend_decode"]
        assert ran[0].grid == ad.grid(len(sequences), kv, operands[9].shape[1] * params["block_size"])[0]
    else:
        assert [launch.name for launch in ran] == ["r4d_kv_store_bf16_dev", "r4d_attend_tiles"]
        assert ran[1].grid == at.grid(params["M"], len(sequences), kv, heads // kv)[0]
    arrays = [np.array(o, copy=True) for o in operands]
    assert host_launch(row_of(registry, "attention", "libref"), arrays, params) == RAD_OK
    np.testing.assert_array_equal(got[3], arrays[3])  # the step's k, v stored at their slots
    np.testing.assert_array_equal(got[4], arrays[4])
    err = rel_err(got[10], arrays[10])
    assert 0 < err <= at.TOLERANCE, (case, err)


def test_the_split_counters_outlive_every_step_in_one_scratch(registry, on_fake):
    """The engine gives a row one scratch for every step: a long prefill on the tiles (their bf16 rows
    written over the scratch's first 1.2 MB), a decode step on attention_decode.cu, a chunk beside
    decode tokens on split tiles, a split prefill. Every kernel's counters (the forms assert them zero
    at launch) sit in the scratch's tail, which no kernel's rows or partials reach, so each launch
    still agrees with libref (with the tiles' counters beside their rows, the chunk's counters would
    lie in the long prefill's bf16 rows)."""
    from radiance.abi import RadArgs
    row = device_row(registry, ATTENTION)
    steps = [(0, 600)], [(p, 1) for p in (700, 3, 1200, 64, 9, 2000, 1, 300, 88)], [(300, 40), (77, 1), (5, 1)], \
        [(0, 300), (40, 9)]
    size = row.info.scratch({"M": 2048, "q_heads": 8, "kv_heads": 2, "head_dim": 128})
    scratch = on_fake.alloc(size, "scratch")
    on_fake.device.memset32(scratch, 0, size // 4, on_fake.stream.handle)
    dk = module(registry, "device_kernels")
    for i, sequences in enumerate(steps):
        operands, params = attention_operands(8, 2, 128, sequences, seed=51 + i)
        decoding = all(count == 1 for _, count in sequences)
        limit = dk.TOLERANCE["attention"] if decoding else 3e-2
        a = on_fake.args(row, operands, params)
        a = RadArgs(t=a.t, params=a.params, scratch=scratch, scratch_bytes=size, stream=a.stream)
        before = len(on_fake.device.launches)
        assert row.info.launch(a) == RAD_OK
        names = [launch.name for launch in on_fake.device.launches[before:]]
        assert names[-1] == ("r4d_attend_decode" if decoding else "r4d_attend_tiles"), names
        want = [np.array(o, copy=True) for o in operands]
        assert host_launch(row_of(registry, "attention", "libref"), want, params) == RAD_OK
        got = on_fake.download(a.t[10], operands[10])
        assert rel_err(got, want[10]) <= limit, (names, rel_err(got, want[10]))


@pytest.mark.parametrize("interleaved", [0, 1])
def test_the_fused_rows_decode_steps_take_the_decode_kernel_and_agree_with_libref(registry, on_fake, interleaved):
    """rope_attention on a decode step of 5 sequences: r4d_attend_decode_rope alone (its numpy form: q and
    k rotated as rope rotates them, then the decode kernel's splits): q, k and the cache as libref's
    rope_attention leaves them, bit for bit, the output within attention's tolerance."""
    dk = module(registry, "device_kernels")
    operands, params = attention_operands(8, 2, 128, [(p, 1) for p in (0, 31, 500, 1200, 77)], seed=interleaved)
    q, k, v, k_cache, v_cache, slots, positions, cu, lengths, blocks, out = operands
    inv_freq = (1.0 / 10000.0 ** (np.arange(0, 128, 2, dtype=np.float64) / 128)).astype(np.float32)
    fused = [q, k, positions, inv_freq, v, k_cache, v_cache, slots, cu, lengths, blocks, out]
    params = {key: value for key, value in params.items() if key != "seqs"} | {"interleaved": interleaved}
    before = len(on_fake.device.launches)
    got = on_fake.run(device_row(registry, "r4dchain_rope_attention_dev"), fused, params, None, (0, 1, 5, 6, 11))
    assert [launch.name for launch in on_fake.device.launches[before:]] == ["r4d_attend_decode_rope"]
    want = [np.array(o, copy=True) for o in fused]
    assert host_launch(row_of(registry, "rope_attention", "libref"), want, params, None) == RAD_OK
    for i in (0, 1, 5, 6):
        np.testing.assert_array_equal(got[i], want[i], err_msg=f"operand {i}")
    assert 0 < rel_err(got[11], want[11]) <= dk.TOLERANCE["attention"], rel_err(got[11], want[11])


def test_the_attention_tiles_split_the_context_only_where_tiles_are_few(registry):
    at = module(registry, "device_attention_tiles")
    # no split at 2048 tokens: the scratch holds the step's k and v rows in bf16 alone
    rows = 2 * 2048 * 8 * 128
    assert at.splits(2048, 8, 4) == 1 and at.scratch_layout(2048, 1, 8, 4, 128) == {
        "fresh_k": 0, "fresh_v": rows, "total": 2 * rows}
    assert at.splits(64, 8, 4) == 9 and at.grid(64, 64, 8, 4)[0] == (64, 8, 9)   # 64 decode tokens
    assert at.tiles_bound(40, 2, 4) == 4 and at.tiles_bound(9, 9, 4) == 9 and at.tokens_per_tile(3) == 21
    layout, rows = at.scratch_layout(64, 64, 8, 4, 128), 2 * 64 * 8 * 128
    assert layout["partial"] == 2 * rows and "counters" not in layout  # the counters: the scratch's tail
    assert at.counters(64, 64, 8, 4) == 64 * 8 and at.counters(2048, 1, 8, 4) == 0
    assert layout["total"] - layout["partial"] == 4 * 64 * 8 * 9 * 4 * 130
    assert at.scratch_bytes(256, 8, 4, 128) >= layout["total"] and at.shared_bytes(128) == 34816
    assert at.store_grid(2048, 1024) == ((1, 2048, 1), (256, 1, 1))
    # a prefill takes 8 warps (128 rows: 32 tokens of 4 heads), decode tokens and short chunks 4
    assert at.warps(2048, 1, 4) == 8 and at.grid(2048, 1, 8, 4) == ((64, 8, 1), (256, 1, 1))
    assert at.warps(64, 64, 4) == 4 and at.warps(40, 2, 4) == 4 and at.warps(64, 2, 4) == 8
    # 8 warps split more (fewer tiles): the scratch hook covers them
    assert at.scratch_layout(64, 1, 8, 4, 128)["total"] > layout["total"]
    assert at.scratch_bytes(256, 8, 4, 128) >= at.scratch_layout(64, 1, 8, 4, 128)["total"]
    assert at.serves("cuda", "sm_80", 128, 4) and at.serves("cuda", "sm_90", 64, 8)
    assert not at.serves("cuda", "sm_75", 128, 4) and not at.serves("hip", "gfx942", 128, 4)
    assert not at.serves("cuda", "sm_90", 96, 4) and not at.serves("cuda", "sm_90", 128, 16)


@pytest.mark.parametrize("target,d,kernels", [("sm_90", 128, ["r4d_kv_store_bf16_dev", "r4d_attend_tiles"]),
                                              ("sm_90", 96, ["r4d_kv_store_dev", "r4d_attend_cache"]),
                                              ("sm_75", 128, ["r4d_kv_store_dev", "r4d_attend_cache"])])
def test_attention_plans_take_the_tiles_where_they_serve_and_attention_cu_elsewhere(registry, target, d, kernels):
    stream, row = Recording(target), device_row(registry, ATTENTION)
    m, seqs, heads, kv = 12, 3, 8, 2
    tensors = [dev(0x1000, (m, heads * d)), dev(0x2000, (m, kv * d)), dev(0x3000, (m, kv * d)),
               dev(0x4000, (512, kv * d)), dev(0x5000, (512, kv * d)), dev(0x6000, (m,), 3), dev(0x7000, (m,), 3),
               dev(0x8000, (seqs + 1,), 3), dev(0x9000, (seqs,), 3), dev(0xa000, (seqs, 32), 3), dev(0xb000, (m, heads * d))]
    params = {"M": m, "q_heads": heads, "kv_heads": kv, "head_dim": d, "block_size": 16, "scale": 0.1, "dtype": "f32"}
    need = row.info.scratch({**params, "M": 256})
    assert launch(row, tensors, params, stream, 0x9000000, need) == RAD_OK
    assert [name for name, *_ in stream.launches] == kernels
    if kernels[1] == "r4d_attend_tiles":
        _, grid, block, args = stream.launches[1]
        at = module(registry, "device_attention_tiles")
        assert (grid, block, stream.shared) == ((3, 2, at.splits(m, kv, 4)), (128, 1, 1), at.shared_bytes(d))
        assert stream.compiled[-1] == ("r4d_attend_tiles", (f"-DR4D_AT_D={d}", "-DR4D_AT_G=4", "-DR4D_AT_WARPS=4"))
        layout, ad = at.scratch_layout(m, seqs, kv, 4, d), module(registry, "device_attention_decode")
        tail_counters = ad.scratch_layout(need, 4, d)["counters"]  # shared with the decode kernel, at the end
        assert tail_counters == need - 4 * ad.COUNTERS >= layout["total"]
        assert pointers(args, [0, 3, 7, 8, 9]) == [0x1000, 0x7000, 0xb000, 0x9000000 + layout["partial"],
                                                  0x9000000 + tail_counters]
        assert ints(args, [10, 11, 12, 13, 14]) == [seqs, 32, heads, kv, 16]
        assert pointers(args, [16, 17]) == [0x9000000, 0x9000000 + layout["fresh_v"]]
        _, grid, block, store = stream.launches[0]
        assert (grid, block) == at.store_grid(m, kv * d)
        assert pointers(store, [6, 7]) == [0x9000000, 0x9000000 + layout["fresh_v"]]


@pytest.mark.parametrize("target,d,group,warps", [("sm_80", 64, 3, 4), ("sm_90", 128, 4, 4), ("sm_90", 128, 4, 8),
                                                    ("sm_90", 128, 8, 8), ("sm_90", 64, 1, 8)])
def test_the_attention_tiles_compile_through_nvrtc_to_bf16_tensor_core_instructions(registry, tmp_path, target, d, group,
                                                                                     warps):
    compile_ = nvrtc_or_skip()
    dk, at = module(registry, "device_kernels"), module(registry, "device_attention_tiles")
    cubin = compile_(dk.source("attention_tiles"), target, at.options(d, group, warps))
    assert b"r4d_attend_tiles" in cubin
    listing = sass(cubin)
    if listing is not None:
        assert "HMMA.16816.F32.BF16" in listing and "LDGSTS" in listing and "LDSM" in listing and "LDL" not in listing
