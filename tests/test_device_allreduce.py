"""Device P2P collectives (collectives/device_p2p.py + plugins/kernels/libr4d/device/allreduce.cu).

Host tests read the source text and the engine side's arithmetic; the compile test needs nvrtc
(cuda-bindings) but no card; the card tests need two NVIDIA cards (the lent nvidia-h200-x2; run by
bench/allreduce_device.py --tests) and skip with the reason otherwise. One pair of spawned
processes, one card each, runs every card check once (module fixture); each test asserts its part.
"""

import functools
import mmap
import multiprocessing as mp
import os
import random
import re
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from radiance.collectives import device_p2p as p2p
from radiance.device import MAX_KERNEL_ARG_BYTES

from ranks_support import cards_reason, run_ranks

# ---- host: the source text and the engine side --------------------------------------------------

def test_the_source_and_the_engine_side_agree_on_the_layout():
    constants = p2p.source_constants()
    for name in ("MAX_WORLD", "MAX_BLOCKS", "THREADS", "READY_OFF", "DONE_OFF", "EPOCH_OFF", "ARRIVE_OFF",
                 "ERROR_OFF", "CTRL_BYTES", "STEP_BYTES", "TAG_STEP_BITS"):
        assert constants[name] == getattr(p2p, name), name
    # the control words fit the control part and do not overlap
    flags = p2p.MAX_WORLD * p2p.MAX_BLOCKS * 8
    assert p2p.READY_OFF + flags <= p2p.DONE_OFF and p2p.DONE_OFF + flags <= p2p.EPOCH_OFF
    assert p2p.EPOCH_OFF + p2p.MAX_BLOCKS * 8 <= p2p.ARRIVE_OFF < p2p.ERROR_OFF < p2p.CTRL_BYTES
    assert p2p.CTRL_BYTES % 4096 == 0
    # a block's two-shot piece of the largest slot has fewer steps than a tag's step field holds
    assert p2p.MAX_SLOT_BYTES // p2p.STEP_BYTES < (1 << p2p.TAG_STEP_BITS) - 1


def test_every_kernel_the_engine_launches_is_an_entry_point_of_the_source():
    text = p2p.source()
    entries = set(re.findall(r"^RAD_P2P_(?:REDUCE|GATHER)_ENTRY\((\w+),", text, re.M))
    assert entries == set(p2p.KERNELS)


def test_flags_are_system_scope_and_nothing_forbidden_is_used():
    text = p2p.source()
    code = "\n".join(line.split("//")[0] for line in text.splitlines())
    assert "ld.acquire.sys.global.u64" in code and "st.release.sys.global.u64" in code
    assert "__HIP_MEMORY_SCOPE_SYSTEM" in code                  # the HIP spelling of the same
    assert "printf" not in code and "multimem" not in code and "Multicast" not in code
    assert "#include" not in code                               # nvrtc and hiprtc need no headers
    engine = Path(p2p.__file__).read_text()
    assert "cuMulticast" not in engine and "multimem" not in engine


@pytest.mark.parametrize("total", [0, 1, 3, 7, 8, 9, 4095, 4096, 4097, 1000003])
@pytest.mark.parametrize("parts", [1, 2, 3, 8, 132, 512])
def test_pieces_cover_the_message_once_on_pack_boundaries(total, parts):
    for elems in (4, 8):
        pieces = [p2p.piece(total, parts, i, elems) for i in range(parts)]
        assert pieces[0][0] == 0 and pieces[-1][1] == total
        for (lo, hi), (lo2, _) in zip(pieces, pieces[1:]):
            assert lo <= hi == lo2 and (lo % elems == 0 or lo == total)


@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("count", [1, 5, 4096, 1000003])
def test_the_two_shot_layout_fits_the_slot(world, count):
    for dtype, itemsize in p2p.ITEMSIZE.items():
        elems = p2p.PACK_BYTES // itemsize
        stride = p2p.piece(count, world, 0, elems)[1]
        assert world * stride * itemsize <= p2p.slot_bytes_for(count * itemsize)
        assert all(p2p.piece(count, world, c, elems)[1] - p2p.piece(count, world, c, elems)[0] <= stride
                   for c in range(world))


def test_grids_are_bounded_and_grow_with_the_message():
    assert p2p.grid_for("one_shot", 8 << 10, 2, 264) == 1
    assert p2p.grid_for("one_shot", 1, 8, 264) == 1
    assert p2p.grid_for("one_shot", 1 << 30, 2, 264) == 264
    assert p2p.grid_for("two_shot", 1 << 20, 2, 264) == p2p.grid_for("one_shot", 1 << 19, 2, 264)
    assert p2p.grid_for("one_shot", 1 << 30, 2, 10_000) == 10_000  # DeviceP2P caps it at MAX_BLOCKS


def test_the_kernel_arguments_fit_the_launch_rule():
    from radiance.device import KernelArgs
    args = (KernelArgs("rad_all_gather_b32").raw(bytes(8 * p2p.MAX_WORLD), 8).pointer(1 << 40).pointer(1 << 41)
            .u64(3).u64(5).i32(1).i32(2).u64(4096).u64(0).u64(10).u64(0).pack())
    assert len(args) == 136 <= MAX_KERNEL_ARG_BYTES
    assert args.offsets[:3] == (0, 64, 72)


def _nvrtc_reason():
    try:
        from cuda.bindings import nvrtc
        nvrtc.nvrtcVersion()
    except Exception as error:  # not installed, or its library is missing
        return f"nvrtc is not available here (cuda-bindings + nvidia-cuda-nvrtc): {type(error).__name__}: {error}"
    return None


@pytest.mark.skipif(_nvrtc_reason() is not None, reason=str(_nvrtc_reason()))
def test_the_source_compiles_with_nvrtc_for_hopper_without_a_card():
    from cuda.bindings import nvrtc
    program = nvrtc.nvrtcCreateProgram(p2p.source().encode(), b"allreduce.cu", 0, [], [])[1]
    try:
        flags = [b"--gpu-architecture=sm_90", b"--std=c++17", b"--fmad=false"]
        (err,) = nvrtc.nvrtcCompileProgram(program, len(flags), flags)
        size = nvrtc.nvrtcGetProgramLogSize(program)[1]
        log = bytearray(size)  # b" " * 1 would be the shared b" ", written over
        nvrtc.nvrtcGetProgramLog(program, log)
        assert int(err) == 0, bytes(log).decode(errors="replace")
        ptx = bytearray(nvrtc.nvrtcGetPTXSize(program)[1])
        nvrtc.nvrtcGetPTX(program, ptx)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    ptx = bytes(ptx).decode(errors="replace")
    for name in p2p.KERNELS:
        assert f".entry {name}(" in ptx
    assert "ld.acquire.sys" in ptx and "st.release.sys" in ptx and "vprintf" not in ptx
    assert b" " * 1 == bytes([32]), "nvrtc wrote into the interpreter's shared one-byte object"


# ---- the card: two processes, one card each ---------------------------------------------------------

class FileExchange:
    """All-gather through files: round r, rank i writes r.i and reads every r.*."""

    def __init__(self, folder, rank, world):
        self.folder, self.rank, self.world, self.round = Path(folder), rank, world, 0

    def __call__(self, payload):
        temporary = self.folder / f"{self.round}.{self.rank}.tmp"
        temporary.write_bytes(payload)
        temporary.rename(self.folder / f"{self.round}.{self.rank}")
        paths = [self.folder / f"{self.round}.{r}" for r in range(self.world)]
        deadline = time.monotonic() + 120
        while not all(p.exists() for p in paths):
            if time.monotonic() > deadline:
                raise TimeoutError("a peer never reached the exchange")
            time.sleep(0.0005)
        self.round += 1
        return [p.read_bytes() for p in paths]


def bf16_bits(values_f32):
    """Round f32 to bf16 (nearest even), as uint16 bits: what the kernel does."""
    u = np.ascontiguousarray(values_f32, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


@functools.lru_cache(maxsize=8)
def inputs(rank, count, dtype, seed):
    """Rank `rank`'s x: f32 values or bf16 bits, the same on every process that asks."""
    values = np.random.default_rng([seed, rank, count]).standard_normal(count, dtype=np.float32)
    return values if dtype == "f32" else bf16_bits(values)


@functools.lru_cache(maxsize=4)
def expected_sum(world, count, dtype, seed):
    """((x_0 + x_1) + ...) in f32, rounded once."""
    xs = [inputs(r, count, dtype, seed) for r in range(world)]
    acc = xs[0].astype(np.float32) if dtype == "f32" else bf16_to_f32(xs[0])
    for x in xs[1:]:
        acc = acc + (x if dtype == "f32" else bf16_to_f32(x))
    return acc if dtype == "f32" else bf16_bits(acc)


SIZES = [8 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]   # bytes of f32 / bf16
ODD_COUNTS = [1, 3, 7, 9, 1001, 12345, 196611, 1048573]
BUFFER = 64 << 20


def _card_rank(rank, world, folder, queue):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    report = {"rank": rank}
    try:
        _card_checks(rank, world, folder, report)
    except Exception as error:  # noqa: BLE001  (reported to the test, which fails naming it)
        import traceback
        report["error"] = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
    queue.put(report)


def _card_checks(rank, world, folder, report):
    from cuda.bindings import driver
    from radiance.device import CompileCache
    from radiance.device.cuda import CudaDevice
    device = CudaDevice(cache=CompileCache(tempfile.mkdtemp(prefix="radk")))
    exchange = FileExchange(folder, rank, world)
    coll = p2p.DeviceP2P(device, rank, world, BUFFER, exchange)
    x, y = device.alloc(BUFFER, "x"), device.alloc(BUFFER + 4096, "y")

    def run(count, dtype, form, seed, in_place=False):
        mine = inputs(rank, count, dtype, seed)
        device.copy_to_device(x, mine)
        out = x if in_place else y
        used = coll.all_reduce(x, out, count, dtype, form=form)
        got = np.empty_like(mine)
        device.copy_to_host(got, out)
        device.synchronize()
        want = expected_sum(world, count, dtype, seed)
        return used, bool(np.array_equal(got.view(np.uint8), want.view(np.uint8))), got.tobytes()

    import hashlib
    exact, digests = {}, {}
    for dtype in ("f32", "bf16"):
        itemsize = p2p.ITEMSIZE[dtype]
        cases = [(nbytes // itemsize, form) for nbytes in SIZES for form in ("one_shot", "two_shot", None)]
        cases += [(count, form) for count in ODD_COUNTS for form in ("one_shot", "two_shot")]
        for i, (count, form) in enumerate(cases):
            used, ok, raw = run(count, dtype, form, seed=count % 1000, in_place=(i % 4 == 3))
            key = f"{dtype} count={count} form={form or 'auto:' + used}"
            exact[key], digests[key] = ok, hashlib.sha256(raw).hexdigest()
    report["exact"], report["digests"] = exact, digests

    # Many epochs, no host sync between them: in place, each launch doubles the previous sum, so a
    # launch that read another epoch's bytes shows (120 launches: 2**-49 grows to at most 2**70).
    # Forms alternate; rank 1 stalls at random.
    count = 300_007
    values = (np.random.default_rng([7, rank]).integers(1, 1024, count) * 2.0 ** -60).astype(np.float32)
    device.copy_to_device(x, values)
    rng, launches = random.Random(rank), 0
    for k in range(60):
        coll.all_reduce(x, x, count, "f32", form=("one_shot", "two_shot", "one_shot")[k % 3])
        launches += 1
        if rank == 1 and rng.random() < 0.1:
            time.sleep(rng.random() * 0.002)
    stream = device.stream()
    device.synchronize()
    device.begin_capture(stream)
    for k in range(30):
        coll.all_reduce(x, x, count, "f32", form=("two_shot", "one_shot")[k % 2], stream=stream)
    graph = device.instantiate(device.end_capture(stream))
    for _ in range(2):
        device.launch_graph(graph, stream)
        launches += 30
    device.synchronize(stream)
    got = np.empty(count, np.float32)
    device.copy_to_host(got, x)
    device.synchronize()
    both = [(np.random.default_rng([7, r]).integers(1, 1024, count) * 2.0 ** -60).astype(np.float32)
            for r in range(world)]
    want = (both[0] + both[1]) * np.float32(2.0 ** (launches - 1))
    report["epochs"] = {"launches": launches, "exact": bool(np.array_equal(got, want)),
                        "finite": bool(np.isfinite(got).all())}

    # all_gather: a row length that packs (vector path) and one that does not.
    gathers = {}
    for m, n, itemsize in ((64, 4096, 2), (3, 1001, 4), (5, 8, 4)):
        dtype = np.uint16 if itemsize == 2 else np.uint32
        parts = [np.random.default_rng([11, r, n]).integers(0, 60000, (m, n)).astype(dtype) for r in range(world)]
        device.copy_to_device(x, parts[rank])
        coll.all_gather(x, y, m, n, itemsize)
        got = np.empty((m, world * n), dtype)
        device.copy_to_host(got, y)
        device.synchronize()
        gathers[f"{m}x{n}x{itemsize}"] = bool(np.array_equal(got, np.concatenate(parts, axis=1)))
    report["all_gather"] = gathers

    # Colour 2: the gate word (mapped host memory) is 0 while the kernel is still running.
    page = mmap.mmap(-1, mmap.PAGESIZE)
    word = np.frombuffer(page, np.uint64, count=1)
    gate = device.map_host(word)
    gates = {}
    for label, launch in (("one_shot", lambda: coll.all_reduce(x, y, 4096, "bf16", form="one_shot", gate=gate, linger_ns=300_000_000)),
                          ("two_shot", lambda: coll.all_reduce(x, y, 1 << 20, "f32", form="two_shot", gate=gate, linger_ns=300_000_000)),
                          ("all_gather", lambda: coll.all_gather(x, y, 16, 4096, 4, gate=gate, linger_ns=300_000_000))):
        device.synchronize()
        exchange(b"gate")
        word[0] = 7
        done = device.event()
        t0 = time.monotonic()
        launch()
        device.record(done)
        while word[0] != 0 and time.monotonic() - t0 < 10:
            pass
        seen = time.monotonic() - t0
        pending = driver.cuEventQuery(done)[0] == driver.CUresult.CUDA_ERROR_NOT_READY
        device.synchronize()
        gates[label] = {"ended": int(word[0]) == 0, "kernel_still_running": bool(pending), "seconds": round(seen, 4),
                        "total": round(time.monotonic() - t0, 4)}
    device.unmap_host(word)
    report["gate"] = gates
    report["timed_out"] = coll.timed_out()
    device.free(x), device.free(y)
    coll.close()


@pytest.fixture(scope="module")
def card_reports():
    reason = cards_reason(2, "device P2P collectives")
    if reason:
        pytest.skip(reason)
    context, folder = mp.get_context("spawn"), tempfile.mkdtemp(prefix="radar")
    queue = context.Queue()
    ranks = [context.Process(target=_card_rank, args=(r, 2, folder, queue)) for r in range(2)]
    return run_ranks(ranks, queue, timeout=180)


def test_results_are_the_rank_order_sum_for_8k_to_64m_and_odd_sizes(card_reports):
    for report in card_reports:
        wrong = [k for k, ok in report["exact"].items() if not ok]
        assert not wrong, f"rank {report['rank']}: not the rank-order sum: {wrong}"


def test_every_rank_holds_the_same_bits(card_reports):
    a, b = (r["digests"] for r in card_reports)
    assert a.keys() == b.keys() and [k for k in a if a[k] != b[k]] == []


def test_many_epochs_without_a_reset_plain_and_in_a_graph(card_reports):
    for report in card_reports:
        assert report["epochs"]["exact"] and report["epochs"]["finite"], report["epochs"]


def test_all_gather_places_each_ranks_x(card_reports):
    for report in card_reports:
        assert all(report["all_gather"].values()), report["all_gather"]


def test_the_gate_word_ends_at_0_before_the_kernel_completes(card_reports):
    for report in card_reports:
        for label, gate in report["gate"].items():
            assert gate["ended"] and gate["kernel_still_running"], (report["rank"], label, gate)


def test_no_wait_timed_out(card_reports):
    assert not any(r["timed_out"] for r in card_reports)
