"""libr4d's device rows, what needs no card: the Philox host mirror against numpy, the rows'
registration (device domain only; host selection unchanged), every kernel a plan names present in
its source, and each row's launch plan (kernels, grids, packed arguments, caching) through a
recording RadStream."""

import os
from pathlib import Path

import numpy as np
import pytest

from radiance.abi import (
    RAD_DOMAIN_DEVICE, RAD_DOMAIN_HOST, RAD_DT_ENCODED, RAD_DT_F32, RAD_DT_I32, RAD_E_NOMEM, RAD_OK, RadArgs,
    RadStream, RadTensor, RadWeightPlanes, rad_device_tensor,
)
from radiance.engine.selection.bands import resolve
from test_libr4d_support import make_weight, registry  # noqa: F401 (registry is a fixture)


GEMMA = {"scale", "rmsnorm_heads", "gelu_tanh_mul", "sliding_attention"}  # device_gemma_rows.py
FUSED = {"rmsnorm_gemm3", "rmsnorm_gemm2_silu_mul", "gemm_add", "rope_attention", "take_rows_rmsnorm_gemm_sample",
         "add_rmsnorm", "add_rmsnorm_gemm3", "add_rmsnorm_gemm2_silu_mul"}


def library(registry):
    return next(lib for lib in registry.hierarchy if lib.name == "libr4d")


def module(registry, name):
    import importlib
    return importlib.import_module(f"{library(registry).module.__name__}.{name}")


def test_philox_mirror_is_numpy_s_draw(registry):
    philox = module(registry, "device_philox")
    for seed, step in [(0, 0), (1, 5), (42, 7), (123456789, 2**63), (2**64 - 1, 2**64 - 1), (7, 2**32 - 1)]:
        counter = np.array([step, 0, 0, 0], np.uint64)
        expected = np.random.Generator(np.random.Philox(key=seed, counter=counter)).random()
        assert philox.uniform(seed, step) == expected, (seed, step)


def test_device_rows_are_listed_with_the_device_domain_and_leave_host_selection_alone(registry):
    lib = library(registry)
    assert lib.info.build_target.split() == ["host", "cuda", "hip"]
    device = {row.name: row for row in lib.rows if row.info.domain == RAD_DOMAIN_DEVICE and not row.collective}
    assert {row.op for row in device.values()} == {"embedding", "rmsnorm", "gemm", "rope", "attention", "add",
                                                    "silu_mul", "take_rows", "sample", *FUSED, *GEMMA}
    assert all(row.info.replaces for row in device.values() if row.op in FUSED)
    assert all(name.endswith("_dev") for name in device)
    chained = [name for name in device if device[name].op not in ("all_reduce", "all_gather")]
    assert all(name.startswith("r4dchain_") for name in chained)
    assert all(lib.module.rad_kernel_chain(i) for i, row in enumerate(lib.rows) if row.name in chained)
    gemm = registry.rows_for("gemm")
    for wdtype, label in (("q4_1", "q4_1"), ("q8_0", "q8_0"), ("bf16", "plain")):
        geometry = {"N": 4096, "K": 4096, "wdtype": wdtype, "dtype": "f32"}
        host = resolve("gemm", registry.ops["gemm"].schema, gemm, geometry, {}, RAD_DOMAIN_HOST, 256)
        assert all(band.row.info.domain == RAD_DOMAIN_HOST for band in host.bands)
        dev = resolve("gemm", registry.ops["gemm"].schema, gemm, geometry, {}, RAD_DOMAIN_DEVICE, 256)
        above = "r4dchain_gemm_tc_bf16_dev" if wdtype == "bf16" else f"r4dchain_gemm_{label}_dev"  # tensor cores
        assert [(b.lo, b.hi, b.row.name) for b in dev.bands] == [(1, 8, f"r4dchain_gemv_{label}_dev"),
                                                                 (9, 256, above)]


def test_every_kernel_name_is_defined_in_its_source(registry):
    dk = module(registry, "device_kernels")
    for name in dk.FILES:
        text = dk.source(name)
        assert text.startswith("// libr4d device rows: helpers")
    gemv = dk.source("gemv")
    for mt in (1, 2, 4, 8):
        assert f"GEMV_ENTRY({mt})" in gemv
    assert dk.gemv_options("q4_1", 2, 1)[:3] == ("-DR4D_GEMV_FMT=FMT_Q4_1", "-DR4D_GEMV_MODE=2", "-DR4D_GEMV_NORM=1")
    assert dk.attention_options(128, 4) == ("-DR4D_ATT_D=128", "-DR4D_ATT_G=4", "-DR4D_ATT_AHEAD=0")
    assert [dk.gemv_variant(m) for m in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    with pytest.raises(ValueError):
        dk.gemv_variant(9)
    assert dk.padded(49152) == 65536 and dk.padded(128256) == 131072 and dk.padded(1) == 1
    assert dk.sample_scratch_bytes(2, 1000) == 2 * (1024 * 8 + 4000)
    assert dk.gemm_grid(65, 4097) == ((65, 2, 1), (256, 1, 1))
    assert dk.gemv_grid(14336, shape=dk.GemvShape(4, 4, 2)) == ((896, 1, 1), (128, 1, 1))
    assert dk.gemv_grid(14336, shape=dk.GemvShape(8, 2, 1)) == ((896, 1, 1), (256, 1, 1))
    assert dk.gemv_grid(14336) == ((-(-14336 // dk.GEMV.group), 1, 1), (32 * dk.GEMV.warps, 1, 1))


class Recorder(RadStream):
    vendor, target, multiprocessors = "cuda", "sm_90", 132

    def __init__(self, target="sm_90", multiprocessors=132):
        self.compiled, self.launches, self.target, self.multiprocessors = [], [], target, multiprocessors

    def kernel(self, source, name, options=()):
        macro = {"r4d_gemv_m": "r4d_gemv_m##MT(", "r4d_attend": "r4d_attend_##WHICH(",
                 "r4d_gemv_stream_m": "r4d_gemv_stream_m##MT("}
        assert f" {name}(" in source or any(name.startswith(k) and v in source for k, v in macro.items()), name
        self.compiled.append((name, tuple(options)))
        return name

    def launch(self, kernel, grid, block, args, shared_bytes=0):
        assert args.kernel == kernel
        self.launches.append((kernel, tuple(grid), tuple(block), args))
        self.shared = shared_bytes


# The two GEMV kernels: gemv_stream.cu on sm_80 and later (no split-K arguments; a card of 32
# multiprocessors, so that SmolLM2's shapes keep its warps busy), gemv.cu before
KERNELS = {"sm_90": ("r4d_gemv_stream_m", 0), "sm_75": ("r4d_gemv_m", 3)}
MULTIPROCESSORS = 32


def dev(address, shape, dtype=RAD_DT_F32, itemsize=4):
    return rad_device_tensor(address, dtype, shape, itemsize)


def device_weight(fmt, rows, cols, base):
    host = make_weight(fmt, rows, cols, 1)
    planes = [rad_device_tensor(base + 0x100000 * i, 6, (t.data.size,), 1) for i, t in enumerate(host.planes)]
    weight = RadWeightPlanes(encoding=host.encoding, rows=rows, cols=cols, planes=planes)
    return RadTensor(data=weight, dtype=RAD_DT_ENCODED, ndim=2, shape=(rows, cols, 0, 0))


def launch(row, tensors, params, stream, scratch=None, scratch_bytes=0):
    return row.info.launch(RadArgs(t=tuple(tensors), params=params, stream=stream, scratch=scratch,
                                   scratch_bytes=scratch_bytes))


def device_row(registry, name):
    return next(row for row in library(registry).rows if row.name == name)


def test_gemv_and_gemm_plans_pack_the_plane_addresses_and_are_cached(registry):
    stream = Recorder()
    w = device_weight("q4_1", 192, 576, 0x7000000)
    x, y = dev(0x1000, (4, 576)), dev(0x2000, (4, 192))
    params = {"M": 3, "N": 192, "K": 576, "wdtype": "q4_1", "dtype": "f32", "split_k": 1}
    row = device_row(registry, "r4dchain_gemv_q4_1_dev")
    assert launch(row, [x, w, y], params, stream) == RAD_OK
    assert launch(row, [x, w, y], params, stream) == RAD_OK
    # planned once, launched twice
    assert [(name, options[:3]) for name, options in stream.compiled] == [
        ("r4d_gemv_m4", ("-DR4D_GEMV_FMT=FMT_Q4_1", "-DR4D_GEMV_MODE=0", "-DR4D_GEMV_NORM=0"))]
    kernel, grid, block, args = stream.launches[-1]
    group = module(registry, "device_kernels").GEMV.group  # a block's row group
    assert (kernel, grid, block) == ("r4d_gemv_m4", (-(-192 // group), 1, 1), (128, 1, 1))
    assert pointers(args, [0, 6, 7, 8, 9]) == [0x1000, 0x7000000, 0x7100000, 0x7200000, 0x2000]
    assert pointers(args, [11, 16]) == [0, 0]  # no second or third weight
    gemm = device_row(registry, "r4dchain_gemm_q4_1_dev")
    assert launch(gemm, [x, w, y], {**params, "M": 70}, stream) == RAD_OK
    assert stream.launches[-1][:3] == ("r4d_gemm_dev", (3, 2, 1), (256, 1, 1))


def pointers(args, indices):
    return [int.from_bytes(args.data[args.offsets[i]:args.offsets[i] + 8], "little") for i in indices]


def ints(args, indices):
    return [int.from_bytes(args.data[args.offsets[i]:args.offsets[i] + 4], "little", signed=True) for i in indices]


def attention_tensors(m, seqs, max_blocks):
    return [dev(0x1000, (m, 9 * 64)), dev(0x2000, (m, 3 * 64)), dev(0x3000, (m, 3 * 64)),
            dev(0x4000, (256, 192)), dev(0x5000, (256, 192)), dev(0x6000, (m,), RAD_DT_I32),
            dev(0x7000, (m,), RAD_DT_I32), dev(0x8000, (seqs + 1,), RAD_DT_I32),
            dev(0x9000, (seqs,), RAD_DT_I32), dev(0xa000, (seqs, max_blocks), RAD_DT_I32), dev(0xb000, (m, 576))]


ATTENTION = {"q_heads": 9, "kv_heads": 3, "head_dim": 64, "block_size": 16, "scale": 0.125, "dtype": "f32"}


def test_attention_sizes_sequences_and_blocks_from_shapes(registry):
    stream = Recorder()
    m, seqs, max_blocks = 5, 3, 7
    params = {"M": m, **ATTENTION}
    row = device_row(registry, "r4dchain_attention_dev")
    need = row.info.scratch({**params, "M": 8})
    assert launch(row, attention_tensors(m, seqs, max_blocks), params, stream) == RAD_E_NOMEM  # no scratch
    assert launch(row, attention_tensors(m, seqs, max_blocks), params, stream, 0x9000000, need) == RAD_OK
    (store, store_grid, store_block, _), (attend, grid, block, args) = stream.launches
    dk = module(registry, "device_kernels")
    splits = dk.attention_splits(m, 3, 132)
    assert (store, store_grid, store_block) == ("r4d_kv_store_dev", (1, m, 1), (256, 1, 1))
    assert (attend, grid, block) == ("r4d_attend_cache", (m, 3, splits), (256, 1, 1)) and splits > 1
    assert ints(args, range(14, 21)) == [seqs, max_blocks, 9, 3, 64, 16, 0]
    ad = module(registry, "device_attention_decode")
    # no inv_freq; the partials first in the scratch, the counters in its tail (zero between launches)
    assert pointers(args, [11, 12, 13]) == [0, 0x9000000, 0x9000000 + need - 4 * ad.COUNTERS]
    assert stream.compiled[-1] == ("r4d_attend_cache", ("-DR4D_ATT_D=64", "-DR4D_ATT_G=3", "-DR4D_ATT_AHEAD=0"))


def test_a_short_context_takes_fewer_whole_tile_splits_than_the_grid(registry):
    """attention.cu's split of a token's keys (token_splits mirrors it): the 8B shape at batch 1 has
    32 splits in its grid; 512 keys take 16 blocks of one 32-key tile, 8192 keys all 32 of 256."""
    dk = module(registry, "device_kernels")
    grid = dk.attention_splits(1, 8, 132)
    assert grid == dk.ATT_MAX_SPLITS == 32 and dk.attention_splits(8, 8, 132) == 5
    assert [dk.token_splits(keys, grid) for keys in (1, 31, 33, 512, 1000, 8192)] == [
        (1, 32), (1, 32), (2, 32), (16, 32), (32, 32), (32, 256)]
    assert dk.token_splits(8192, 5) == (5, 1664) and dk.token_splits(0, 5) == (1, 32)
    for keys in range(1, 3000, 7):  # every key in exactly one split, none empty
        splits, chunk = dk.token_splits(keys, grid)
        assert chunk % dk.ATT_TILE == 0 and (splits - 1) * chunk < keys <= splits * chunk <= grid * chunk


def test_r4d_att_splits_sets_the_grids_splits_within_the_scratch(registry, monkeypatch):
    """R4D_ATT_SPLITS (device_kernels.ATT_SPLITS): the grid's splits for every shape, never past
    what the scratch holds (M * kv_heads + 512 partials); a bad value is refused naming it."""
    dk = module(registry, "device_kernels")
    assert dk.ATT_SPLITS is None and dk.ATT_AHEAD == 0  # the suite runs without either
    assert [dk.setting("R4D_ATT_SPLITS", text, 1, dk.ATT_MAX_SPLITS) for text in ("1", "7", "32")] == [1, 7, 32]
    for text in ("0", "33", "x", "2.5"):
        with pytest.raises(ValueError, match=f"R4D_ATT_SPLITS={text!r}: expected an integer 1..32"):
            dk.setting("R4D_ATT_SPLITS", text, 1, dk.ATT_MAX_SPLITS)
    monkeypatch.setattr(dk, "ATT_SPLITS", 4)
    assert dk.attention_splits(1, 8, 132) == 4 and dk.attention_splits(8, 8, 132) == 4
    monkeypatch.setattr(dk, "ATT_SPLITS", 32)
    assert dk.attention_splits(1, 8, 132) == 32 and dk.attention_splits(64, 8, 132) == 2
    for m, kv in [(1, 1), (1, 8), (8, 8), (64, 8), (300, 4)]:
        assert dk.attention_splits(m, kv, 132) * m * kv <= m * kv + 512


def test_rope_attention_is_one_kernel_that_rotates_and_reads_this_steps_keys(registry):
    stream = Recorder()
    q, k, v, k_cache, v_cache, slots, positions, cu, ctx, tables, out = attention_tensors(1, 1, 4)
    inv_freq = dev(0xc000, (32,))
    params = {"M": 1, **ATTENTION, "interleaved": 1}
    row = device_row(registry, "r4dchain_rope_attention_dev")
    assert row.info.replaces.startswith("rope(q,k,positions,inv_freq)+attention(")
    need = row.info.scratch({**params, "M": 8})
    tensors = [q, k, positions, inv_freq, v, k_cache, v_cache, slots, cu, ctx, tables, out]
    assert launch(row, tensors, params, stream, 0x9000000, need) == RAD_OK
    ((kernel, grid, block, args),) = stream.launches
    assert kernel == "r4d_attend_fresh" and grid[:2] == (1, 3)
    assert pointers(args, [0, 1, 2, 6, 11]) == [0x1000, 0x2000, 0x3000, 0x7000, 0xc000]
    assert ints(args, [20]) == [1]  # interleaved


def test_sample_refuses_a_missing_scratch_and_packs_the_padded_span(registry):
    stream, row = Recorder(), device_row(registry, "r4dchain_sample_dev")
    tensors = [dev(0x1000, (2, 1000)), dev(0x2000, (2,)), dev(0x3000, (2,), RAD_DT_I32), dev(0x4000, (2,)),
               dev(0x5000, (2, 2), 12, 8), dev(0x6000, (2,), RAD_DT_I32)]
    params = {"M": 2, "vocab": 1000}
    assert launch(row, tensors, params, stream) == RAD_E_NOMEM
    need = row.info.scratch({"M": 2, "vocab": 1000})
    assert launch(row, tensors, params, stream, scratch=0x900000, scratch_bytes=need) == RAD_OK
    kernel, grid, block, args = stream.launches[-1]
    assert (grid, block) == ((2, 1, 1), (1024, 1, 1))
    assert int.from_bytes(args.data[args.offsets[-1]:args.offsets[-1] + 4], "little") == 1024


def test_every_chained_kernel_waits_in_its_prologue():
    """A programmatic dependent launch is only safe if the kernel waits before touching memory the
    kernel before it writes. The GEMVs load their first weight steps first (weights are written by
    no kernel), then wait before any activation is read; attention's blocks load their first tile's
    keys of earlier positions first (no kernel of the step writes those cache rows), then wait before
    q, this step's keys or the scratch are touched."""
    import re

    folder = Path(__file__).resolve().parent.parent / "plugins" / "kernels" / "libr4d" / "device"
    for name in ("elementwise", "gemm", "attention", "sample"):
        source = (folder / f"{name}.cu").read_text()
        kernels = list(re.finditer(r"__global__", source))
        assert kernels, name
        for kernel in kernels:
            body = source[source.index("{", kernel.end()) + 1:].lstrip()
            if name == "attention" and "r4d_attend_" in source[kernel.start():kernel.start() + 120]:
                assert body.startswith("/* attend() waits on the chain */"), body[:80]
                continue
            assert body.startswith("R4D_CHAIN_PROLOGUE();"), (name, source[kernel.start():kernel.start() + 80])
    for name in ("attention", "attention_window"):  # their attend() entries hold no access of their own
        source = (folder / f"{name}.cu").read_text()
        for kernel in re.finditer(r"r4d_attend_", source):
            if "__global__" in source[max(0, kernel.start() - 80):kernel.start()]:
                body = source[source.index("{", kernel.end()) + 1:]
                body = body[:body.index("(p);")]
                assert "attend<" in body and "p." not in body and "[" not in body, body
    attention = (folder / "attention.cu").read_text()
    body = attention[attention.index("__device__ void attend("):attention.index("// One module per")]
    wait = body.index("R4D_CHAIN_PROLOGUE();")
    before = body[:wait]
    assert body.count("R4D_CHAIN_PROLOGUE();") == 1
    for touched in ("p.q", "p.out", "p.partial", "p.counters", "p.slots", "s_q[i]", "s_fresh[i]", "r4d_arrive"):
        assert touched not in before, touched
    loads = re.findall(r"load_(?:keys|values)<[^>]*>\(p, keys, j0, j0, (min\([^)]*\)),", before)
    assert loads == ["min(j1, keys.fresh)"] * 2 and before.count("load_") == 2, loads
    gemv = (folder / "gemv.cu").read_text()
    # both paths of gemv.cu: the FMA one and the tensor cores' (whose activations are read by __ldg)
    for path, load, use in (("gemv_fma", "r4d_stream16(rows[r].codes", "consume<FMT, MT, GEMV_ROWS>("),
                            ("gemv_tc", "gemv_tc_load<FMT>(rows[i].codes", "gemv_mma(")):
        start = gemv.index(f"__device__ __forceinline__ void {path}(")
        body = gemv[start:gemv.index("\n}\n", start)]
        wait = body.index("R4D_CHAIN_PROLOGUE();")
        before = body[:wait]
        assert load in before and "x[" not in before and "gemv_x(" not in before and "__ldg" not in before, path
        assert wait < body.index("gemv_input<MT>(") < body.index(use), path
    stream = (folder / "gemv_stream.cu").read_text()
    body = stream[stream.index("__device__ void gemv_stream("):stream.index("#define GEMV_STREAM_ENTRY")]
    wait = body.index("R4D_CHAIN_PROLOGUE();")
    assert "loader.next()" in body[:wait] and "x[" not in body[:wait] and "gemv_x(" not in body[:wait]
    assert wait < body.index("gemv_input<MT>(") < body.index("consume<FMT, MT, GS_UNIT>(")


def test_narrow_gemvs_split_k_into_whole_pipelined_steps(registry):
    dk = module(registry, "device_kernels")
    cut = dk.GemvShape(4, 4, 2)  # row groups of 16
    assert dk.gemv_split(14336, 4096, "bf16", shape=cut) == (1, 4096)  # 896 blocks fill the card already
    assert dk.gemv_split(512, 4096, "bf16", shape=cut) == (8, 512)     # 32 blocks: K in 8 chunks of 2 steps
    assert dk.gemv_split(14336, 4096, "bf16", shape=dk.GemvShape(4, 8, 1)) == (1, 4096)  # 448 blocks: a second wave of splits would not fit
    assert dk.gemv_split(6144, 4096, "bf16", shape=dk.GemvShape(4, 8, 1)) == (2, 2048)   # 192 blocks: 2 chunks, 384 in all
    for n, k, fmt in [(512, 4096, "bf16"), (2048, 4096, "bf16"), (4096, 2048, "bf16"), (4096, 14336, "q8_0"),
                      (1000, 4000, "q4_1"), (576, 1536, "q4_1")]:
        splits, chunk = dk.gemv_split(n, k, fmt)
        step = 32 * dk.GEMV_CHUNK_ELEMENTS[fmt]
        assert 1 <= splits <= dk.GEMV_MAX_SPLITS and (splits - 1) * chunk < k <= splits * chunk
        assert splits == 1 or (chunk % step == 0 and chunk >= 2 * step)
        offset, total = dk.gemv_scratch_layout(8, n, k, fmt)
        assert (total == 0) == (splits == 1)
        assert splits == 1 or total - offset == 4 * splits * 8 * n


def test_a_split_gemv_plans_its_partials_in_the_rows_scratch(registry):
    stream = Recorder()
    w = device_weight("q8_0", 256, 4096, 0x7000000)
    x, y = dev(0x1000, (1, 4096)), dev(0x2000, (1, 256))
    params = {"M": 8, "N": 256, "K": 4096, "wdtype": "q8_0", "dtype": "f32", "split_k": 1}
    row = device_row(registry, "r4dchain_gemv_q8_0_dev")
    need = row.info.scratch({**params, "M": 1})
    assert 0 < need < row.info.scratch(dict(params))  # the band's M = 8 bounds what M = 1 needs
    assert launch(row, [x, w, y], {**params, "M": 1}, stream, 0x9000000, need - 1) == RAD_E_NOMEM
    assert launch(row, [x, w, y], {**params, "M": 1}, stream, 0x9000000, need) == RAD_OK
    kernel, grid, block, args = stream.launches[-1]
    splits, chunk = module(registry, "device_kernels").gemv_split(256, 4096, "q8_0")
    assert grid == (-(-256 // module(registry, "device_kernels").GEMV.group), splits, 1) and splits > 1
    (k_chunk,) = ints(args, [3])
    partial, counters = pointers(args, [4, 5])
    assert k_chunk == chunk and counters == 0x9000000 and partial > counters


@pytest.fixture
def stream_kernel_on(registry, monkeypatch):
    """gemv_stream.cu turned on, as R4D_GEMV_STREAM=1 turns it on for a process."""
    dk = module(registry, "device_kernels")
    monkeypatch.setattr(dk, "STREAM", dk.StreamShape.parse("1"))
    return dk


@pytest.mark.parametrize("target", KERNELS)
def test_fused_gemv_rows_pack_every_weight_the_norm_and_their_epilogue(registry, stream_kernel_on, target):
    stream, (name, shift), dk = Recorder(target, MULTIPROCESSORS), KERNELS[target], stream_kernel_on
    x, normed = dev(0x1000, (1, 576)), dev(0x1800, (1, 576))
    norm = device_weight("f32", 1, 576, 0x6000000)
    wq, wk, wv = (device_weight("q4_1", rows, 576, base) for rows, base in
                  ((576, 0x7000000), (192, 0x8000000), (192, 0x9000000)))
    q, k, v = dev(0x2000, (1, 576)), dev(0x3000, (1, 192)), dev(0x4000, (1, 192))
    params = {"M": 1, "n": 576, "eps": 1e-5, "K": 576, "N.1": 576, "N.2": 192, "N.3": 192, "wdtype": "q4_1",
              "dtype": "f32"}
    row = device_row(registry, "r4dchain_rmsnorm_gemm3_q4_1_dev")
    scratch = row.info.scratch(dict(params))
    assert launch(row, [x, norm, normed, wq, q, wk, k, wv, v], params, stream, 0x5000000, scratch) == RAD_OK
    kernel, grid, block, args = stream.launches[-1]
    # gemv.cu: a block a row group (dk.GEMV.group rows); gemv_stream.cu: a few blocks a multiprocessor, no more
    stream_blocks = min(MULTIPROCESSORS * dk.STREAM.blocks, 960 // dk.STREAM.unit)
    assert kernel == f"{name}1" and grid[0] == (stream_blocks if shift == 0 else -(-960 // dk.GEMV.group))
    assert stream.compiled[-1][1][:3] == ("-DR4D_GEMV_FMT=FMT_Q4_1", "-DR4D_GEMV_MODE=0", "-DR4D_GEMV_NORM=1")
    at = [i + shift for i in (3, 6, 8, 11, 13, 16, 18)]
    assert pointers(args, at) == [0x7000000, 0x2000, 0x8000000, 0x3000, 0x9000000, 0x4000, 0x6000000]
    assert ints(args, [i + shift for i in (7, 12, 17)]) == [576, 192, 192]
    # gate and up paired (mode 2), the residual add (mode 1)
    gate, up = dev(0x2000, (1, 1536)), dev(0x3000, (1, 1536))
    wg, wu = device_weight("q4_1", 1536, 576, 0x7000000), device_weight("q4_1", 1536, 576, 0x8000000)
    pair = {"M": 1, "n.0": 576, "eps": 1e-5, "K": 576, "N.1": 1536, "N.2": 1536, "wdtype": "q4_1", "dtype": "f32"}
    row = device_row(registry, "r4dchain_rmsnorm_gemm2_silu_mul_q4_1_dev")
    assert launch(row, [x, norm, normed, wg, gate, wu, up], pair, stream, 0x5000000, row.info.scratch(pair)) == RAD_OK
    assert stream.launches[-1][1][0] == (min(MULTIPROCESSORS * dk.STREAM.blocks, 3072 // dk.STREAM.unit) if shift == 0 else 3072 // dk.GEMV.group)
    assert stream.compiled[-1][1][1] == "-DR4D_GEMV_MODE=2"
    w, y, residual = device_weight("q4_1", 576, 1536, 0x7000000), dev(0x2000, (1, 576)), dev(0x3000, (1, 576))
    plus = {"M": 1, "N": 576, "K": 1536, "n": 576, "wdtype": "q4_1", "dtype": "f32"}
    row = device_row(registry, "r4dchain_gemm_add_q4_1_dev")
    assert launch(row, [dev(0x1000, (1, 1536)), w, y, residual], plus, stream, 0x5000000, row.info.scratch(plus)) == RAD_OK
    assert pointers(stream.launches[-1][3], [25 + shift]) == [0x3000] and stream.compiled[-1][1][1] == "-DR4D_GEMV_MODE=1"


def test_the_stream_gemv_is_opt_in(registry):
    dk = module(registry, "device_kernels")
    assert dk.STREAM is None or os.environ.get("R4D_GEMV_STREAM")
    stream = Recorder("sm_90", MULTIPROCESSORS)
    row = device_row(registry, "r4dchain_gemv_plain_dev")
    params = {"M": 1, "N": 4096, "K": 4096, "wdtype": "bf16", "dtype": "f32", "split_k": 1}
    w = device_weight("bf16", 4096, 4096, 0x7000000)
    need = row.info.scratch(dict(params))
    assert launch(row, [dev(0x1000, (1, 4096)), w, dev(0x2000, (1, 4096))], params, stream, 0x9000000, need) == RAD_OK
    assert stream.launches[-1][0] == ("r4d_gemv_stream_m1" if dk.STREAM else "r4d_gemv_m1")
    assert dk.StreamShape.parse("1") == dk.StreamShape() and dk.StreamShape.parse("4,4,2,4,0") == dk.StreamShape()


def test_the_stream_gemv_serves_shapes_that_keep_its_warps_busy(registry):
    dk = module(registry, "device_kernels")
    shape = dk.StreamShape(warps=4, blocks=4, unit=2)  # 2112 warps on 132 multiprocessors
    assert dk.streams("cuda", "sm_90", 1, [4096, 1024, 1024], 132, shape)
    assert dk.streams("cuda", "sm_90", 4, [4096], 132, shape)                # 2048 units: one a warp or so
    assert not dk.streams("cuda", "sm_90", 1, [1024], 132, shape)            # 512 units: gemv.cu splits K
    assert not dk.streams("cuda", "sm_90", 5, [14336], 132, shape)           # MT = 8: gemv.cu
    assert not dk.streams("cuda", "sm_90", 1, [14336, 129], 132, shape)      # a matrix of odd rows
    assert not dk.streams("cuda", "sm_75", 1, [4096], 68, shape)
    assert not dk.streams("hip", "gfx942", 1, [4096], 304, shape)
    assert dk.stream_grid(28672, 132, shape) == ((528, 1, 1), (128, 1, 1))
    assert dk.stream_grid(600, 132, shape) == ((300, 1, 1), (128, 1, 1))
    assert dk.StreamShape.parse("8,2,4,3,1") == dk.StreamShape(8, 2, 4, 3, 1)
    assert dk.argmax_groups(128256) == -(-128256 // dk.GEMV.group) and dk.argmax_groups(64) == 32  # gemv.cu's groups, or blocks


def test_another_gemv_cut_is_three_or_four_integers_and_reaches_the_compiler(registry):
    dk = module(registry, "device_kernels")
    shape = dk.GemvShape.parse("8,2,4")
    assert shape == dk.GemvShape(8, 2, 4) and shape.group == 16 and shape.tensor_cores_from == 8
    assert dk.gemv_options("bf16", shape=shape)[-4:] == ("-DGEMV_WARPS=8", "-DGEMV_ROWS=2", "-DGEMV_PIPE=4",
                                                         "-DGEMV_TC_FROM=8")
    assert dk.GemvShape.parse("4,4,2,2").defines()[-1] == "-DGEMV_TC_FROM=2"
    for text, fault in (("4,4", "three or four integers"), ("4,3,2", "an even"), ("64,4,2", "warps 1..32"),
                        ("4,4,2,3", "tensor_cores_from")):
        with pytest.raises(ValueError, match=fault):
            dk.GemvShape.parse(text)


@pytest.mark.parametrize("target", KERNELS)
def test_the_fused_lm_head_is_a_gemv_with_an_argmax_then_the_sampler(registry, stream_kernel_on, target):
    stream, (name, shift), dk = Recorder(target, MULTIPROCESSORS), KERNELS[target], stream_kernel_on
    h, index, rows, normed = dev(0x1000, (7, 576)), dev(0x1800, (2,), RAD_DT_I32), dev(0x2000, (2, 576)), dev(0x2800, (2, 576))
    norm, w = device_weight("f32", 1, 576, 0x6000000), device_weight("q8_0", 49152, 576, 0x7000000)
    logits = dev(0x3000, (2, 49152))
    sampling = [dev(0x4000, (2,)), dev(0x4100, (2,), RAD_DT_I32), dev(0x4200, (2,)), dev(0x4300, (2, 2), 12, 8),
                dev(0x4400, (2,), RAD_DT_I32)]
    params = {"M": 2, "n": 576, "eps": 1e-5, "N": 49152, "K": 576, "wdtype": "q8_0", "dtype": "f32", "vocab": 49152}
    row = device_row(registry, "r4dchain_take_rows_rmsnorm_gemm_sample_q8_0_dev")
    tensors = [h, index, rows, norm, normed, w, logits, *sampling]
    assert launch(row, tensors, params, stream, 0x9000000, 100) == RAD_E_NOMEM
    assert launch(row, tensors, params, stream, 0x9000000, row.info.scratch(dict(params))) == RAD_OK
    (head, grid, _, args), (sampler, sample_grid, _, sample_args) = stream.launches
    assert head == f"{name}2" and sampler == "r4d_sample_groups_dev" and sample_grid == (2, 1, 1)
    assert ints(args, [24 + shift]) == [7]  # x_rows: the rows take_rows may pick
    best, best_index = pointers(args, [26 + shift, 27 + shift])
    # the sampler reduces one maximum a row group (gemv.cu) or a block (gemv_stream.cu)
    assert pointers(sample_args, [9, 10]) == [best, best_index] and ints(sample_args, [11]) == [grid[0]]
    assert grid[0] == (MULTIPROCESSORS * dk.STREAM.blocks if shift == 0 else 49152 // dk.GEMV.group)


def test_a_llama_graph_takes_the_fused_add_rmsnorm_above_the_decode_band_alone(tiny_model):
    """TP 1 on an NVIDIA card: above M = 8 (a prefill, a batch) every residual add that a norm follows
    is one r4dchain_add_rmsnorm_dev launch; at M <= 8 gemm_add and the norm-folded GEMVs keep them."""
    from device_batch_support import nvidia_fake
    from radiance.config import Config
    from radiance.engine.loading.registry import Registry
    from radiance.ranks.worker import Worker
    config = Config(model=str(tiny_model), radiance_home="", kernels="libr4d,libref", progress=False, max_context=128)
    registry, device = Registry(radiance_home="", kernels="libr4d,libref"), nvidia_fake("sm_90")
    worker = Worker(config, device=device, registry=registry).build()
    try:
        prefill = [launch.band.row.name for launch in worker.graph.launches(16, 1)]
        decode = [launch.band.row.name for launch in worker.graph.launches(1, 1)]
        layers = sum(name.startswith("r4dchain_attention") for name in prefill)
    finally:
        worker.close()
        device.close()
        registry.close()
    assert layers >= 2, prefill
    # two a layer but the last: its down projection's add meets take_rows (the rows sampled), not a norm
    assert prefill.count("r4dchain_add_rmsnorm_dev") == 2 * layers - 1, prefill
    assert "r4dchain_add_dev" in prefill and prefill.count("r4dchain_rmsnorm_dev") == 1, prefill
    assert "r4dchain_add_rmsnorm_dev" not in decode and any(name.startswith("r4dchain_gemm_add") for name in decode)


def test_an_fp8_llama_decodes_on_the_fused_fp8_rows(tmp_path):
    """bench/fp8_channel.toml's conversion (e4m3, a scale per output channel; lm head untied), TP 1 on
    an NVIDIA card: a decode step is the fused rows, five a layer, every GEMV in them the fp8 form,
    as a bf16 model's are the plain form (the 163 launches of the 8B shape's step)."""
    from device_batch_support import nvidia_fake
    from radiance.config import Config
    from radiance.convert.api import convert_synthetic
    from radiance.engine.loading.registry import Registry
    from radiance.ranks.worker import Worker
    recipe = Path(__file__).resolve().parent.parent / "bench" / "fp8_channel.toml"
    model = tmp_path / "fp8.rad"
    convert_synthetic(model, "llama", dict(hidden=128, layers=2, heads=4, kv_heads=2, ffn=256, vocab=512, context=256,
                                           tie_embeddings=False), seed=5, recipe=recipe)
    config = Config(model=str(model), radiance_home="", kernels="libr4d,libref", progress=False, max_context=128)
    registry, device = Registry(radiance_home="", kernels="libr4d,libref"), nvidia_fake("sm_90")
    worker = Worker(config, device=device, registry=registry).build()
    try:
        decode = [launch.band.row.name for launch in worker.graph.launches(1, 1)]
    finally:
        worker.close()
        device.close()
        registry.close()
    fused = ["r4dchain_rmsnorm_gemm3_fp8_dev", "r4dchain_rope_attention_dev", "r4dchain_gemm_add_fp8_dev",
             "r4dchain_rmsnorm_gemm2_silu_mul_fp8_dev", "r4dchain_gemm_add_fp8_dev"]
    assert decode == ["r4dchain_embedding_dev", *fused, *fused, "r4dchain_take_rows_rmsnorm_gemm_sample_fp8_dev"], decode
