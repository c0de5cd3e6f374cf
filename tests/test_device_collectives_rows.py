"""libr4d's device collective rows on two cards (plugins/kernels/libr4d/collectives_device.py over
collectives/device_peers.py): both forms, P2P and host-staged, through the rows themselves with the
engine's objects (EngineStream, DevicePeers, a mapped gate word), exact against numpy.

Two spawned processes, one card each (CUDA_VISIBLE_DEVICES), run every check once (module fixture)
and each test asserts its part. Skips, naming why, with fewer than 2 NVIDIA cards (run on the lent
nvidia-h200-x2 by bench/allreduce_device_rows.py --tests). The host-only checks are in
tests/test_device_collectives_rows_host.py.
"""

import mmap
import multiprocessing as mp
import os
import tempfile
import traceback

import numpy as np
import pytest

from ranks_support import cards_reason, run_ranks

KiB, MiB = 1 << 10, 1 << 20
SIZES = [8 * KiB, 1 * MiB, 8 * MiB]       # bytes of f32 per rank
ROW = 1024                                # n: every message is [M, 1024] f32
BUFFER = 8 * MiB
FORMS = ("p2p", "host")
WORLD = 2


def inputs(rank, count, seed):
    return np.random.default_rng([seed, rank, count]).standard_normal(count, dtype=np.float32)


def rank_order_sum(count, seed):
    acc = inputs(0, count, seed).copy()
    for r in range(1, WORLD):
        acc = acc + inputs(r, count, seed)
    return acc


def gather_parts(rank, m, seed):
    return np.random.default_rng([seed, 99, rank, m]).standard_normal((m, ROW), dtype=np.float32)


def _card_rank(rank, run_id, barrier, queue):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    report = {"rank": rank}
    try:
        _card_checks(rank, run_id, barrier, report)
    except Exception as error:  # noqa: BLE001  (reported to the test, which fails naming it)
        report["error"] = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
    queue.put(report)


def _card_checks(rank, run_id, barrier, report):
    from radiance.abi import RAD_DT_F32, RAD_LINK_ENDED, RadArgs, rad_device_tensor
    from radiance.collectives.device_peers import DevicePeers
    from radiance.collectives.peers import HostPeers
    from radiance.collectives.shm import list_run
    from radiance.engine.running.device_stream import EngineStream
    from radiance.plugins.kernels.libr4d import collectives_device as rows
    from radiance.device import CompileCache
    from radiance.device.cuda import CudaDevice

    host = HostPeers.create(run_id, rank, WORLD, 4096)
    barrier.wait(timeout=60)
    host.attach()
    device = CudaDevice(cache=CompileCache(tempfile.mkdtemp(prefix="radk")))
    stream = EngineStream(device)
    page = mmap.mmap(-1, mmap.PAGESIZE)
    word = np.frombuffer(page, np.uint64, count=1)
    gate = device.map_host(word)
    x = device.alloc(BUFFER, "x")
    y = device.alloc(WORLD * BUFFER, "y")

    def reduce_args(peers, m):
        return RadArgs(t=(rad_device_tensor(x.ptr, RAD_DT_F32, (m, ROW), 4),), params={"n": ROW, "dtype": "f32"},
                       stream=stream, peers=peers, link_gate=gate)

    def gather_args(peers, m):
        return RadArgs(t=(rad_device_tensor(x.ptr, RAD_DT_F32, (m, ROW), 4),
                          rad_device_tensor(y.ptr, RAD_DT_F32, (m, WORLD * ROW), 4)),
                       params={"n": ROW, "dtype": "f32"}, stream=stream, peers=peers, link_gate=gate)

    def check_reduce(m, seed):
        got = np.empty(m * ROW, np.float32)
        device.copy_to_host(got, x, stream.handle)
        stream.synchronize()
        return bool(np.array_equal(got.view(np.uint32), rank_order_sum(m * ROW, seed).view(np.uint32)))

    def check_gather(m, seed):
        got = np.empty((m, WORLD * ROW), np.float32)
        device.copy_to_host(got, y, stream.handle)
        stream.synchronize()
        want = np.concatenate([gather_parts(r, m, seed) for r in range(WORLD)], axis=1)
        return bool(np.array_equal(got.view(np.uint32), want.view(np.uint32)))

    for form in FORMS:
        peers = DevicePeers(device, host, p2p=(form == "p2p"), buffer_bytes=BUFFER)
        result = report[form] = {"world": peers.world_size, "rank": peers.rank}
        hooks = {info.name: info.launch for info, _ in rows.DEVICE_ROWS}
        reduce_row = hooks["all_reduce_p2p" + ("_host" if form == "host" else "")]
        gather_row = hooks["all_gather_p2p" + ("_host" if form == "host" else "")]
        # plain launches, the gate hold taken as the executor takes it
        for nbytes in SIZES:
            m = nbytes // 4 // ROW
            for op, row, args, fill, check in (
                    ("all_reduce", reduce_row, reduce_args(peers, m), lambda s: inputs(rank, m * ROW, s), check_reduce),
                    ("all_gather", gather_row, gather_args(peers, m), lambda s: gather_parts(rank, m, s), check_gather)):
                seed = nbytes % 1000 + 1
                device.copy_to_device(x, fill(seed), stream.handle)
                stream.memset32(gate, 1, 1)
                status = row(args)
                exact = check(m, seed)
                result[f"{op} {nbytes}"] = {"status_ended": status == RAD_LINK_ENDED, "exact": exact,
                                            "gate": int(word[0])}
        # both kernels in both forms, whichever the size would pick (DevicePeers picks by size)
        for nbytes in (1 * MiB, 8 * MiB):
            count = nbytes // 4
            for kernel in ("one_shot", "two_shot"):
                seed = 300 + nbytes % 1000
                device.copy_to_device(x, inputs(rank, count, seed), stream.handle)
                peers.impl.all_reduce(x.ptr, x.ptr, count, "f32", stream=stream.handle, form=kernel)
                result[f"kernel {kernel} {nbytes}"] = check_reduce(count // ROW, seed)
        result["default_kernel"] = {n: peers.impl.form_for(n) for n in SIZES}
        # the same launches captured in one graph (gate memsets included, as the executor captures
        # them), replayed twice with new inputs. Should capturing the memset of the mapped gate word
        # fail, the error is reported and the kernels alone are captured, so the rest still runs.
        graph_report = result["graph"] = {}
        capture = device.stream()
        device.synchronize()
        captured = EngineStream(device, capture)

        def capture_reduces(with_memset):
            device.begin_capture(capture)
            try:
                for nbytes in SIZES:   # one all_reduce per size, each in place on the first nbytes of x
                    a = reduce_args(peers, nbytes // 4 // ROW)
                    a.stream = captured
                    if with_memset:
                        captured.memset32(gate, 1, 1)
                    status = reduce_row(a)
                    if status != RAD_LINK_ENDED:
                        raise RuntimeError(f"all_reduce row under capture returned {status}")
            except BaseException:
                try:
                    device.end_capture(capture)
                except Exception:  # noqa: BLE001  (the capture is invalidated already)
                    pass
                raise
            return device.instantiate(device.end_capture(capture))

        try:
            graph = capture_reduces(True)
        except Exception:  # noqa: BLE001
            graph_report["memset_capture_error"] = traceback.format_exc()
            graph = capture_reduces(False)
        if graph is not None:
            # Launch k sums every rank's first SIZES[k] bytes of the current x (earlier launches'
            # sums included): numpy replays the same sequence in the same order.
            for replay in range(2):
                seed = 500 + replay
                m_last = SIZES[-1] // 4 // ROW
                device.copy_to_device(x, inputs(rank, m_last * ROW, seed), stream.handle)
                stream.synchronize()
                word[0] = 5
                device.launch_graph(graph, capture)
                device.synchronize(capture)
                got = np.empty(m_last * ROW, np.float32)
                device.copy_to_host(got, x, stream.handle)
                stream.synchronize()
                want = np.stack([inputs(r, m_last * ROW, seed) for r in range(WORLD)])
                for nbytes in SIZES:
                    count = nbytes // 4
                    acc = want[0, :count].copy()
                    for r in range(1, WORLD):
                        acc = acc + want[r, :count]
                    want[:, :count] = acc
                graph_report[f"replay {replay}"] = {
                    "exact": bool(np.array_equal(got.view(np.uint32), want[rank].view(np.uint32))),
                    "gate": int(word[0])}
            # and a graph of all_gather launches, replayed with new inputs
            device.begin_capture(capture)
            m_last = SIZES[-1] // 4 // ROW
            a = gather_args(peers, m_last)
            a.stream = captured
            if "memset_capture_error" not in graph_report:
                captured.memset32(gate, 1, 1)
            gather_row(a)
            gather_graph = device.instantiate(device.end_capture(capture))
            for replay in range(2):
                seed = 700 + replay
                device.copy_to_device(x, gather_parts(rank, m_last, seed), stream.handle)
                stream.synchronize()
                word[0] = 5
                device.launch_graph(gather_graph, capture)
                device.synchronize(capture)
                graph_report[f"gather replay {replay}"] = {"exact": check_gather(m_last, seed), "gate": int(word[0])}
        result["timed_out"] = peers.timed_out()
        stream.synchronize()
        device.synchronize(capture)
        peers.close()
        barrier.wait(timeout=60)
        result["left_in_shm"] = [n for n in list_run(run_id) if ".devpeers." in n]
    device.unmap_host(word)
    device.free(x), device.free(y)
    host.close()


@pytest.fixture(scope="module")
def card_reports():
    reason = cards_reason(WORLD, "device collective rows")
    if reason:
        pytest.skip(reason)
    from radiance.collectives.shm import new_run_id, unlink_run
    context, run_id = mp.get_context("spawn"), new_run_id()
    queue, barrier = context.Queue(), context.Barrier(WORLD)
    ranks = [context.Process(target=_card_rank, args=(r, run_id, barrier, queue)) for r in range(WORLD)]
    try:
        return run_ranks(ranks, queue)
    finally:
        unlink_run(run_id)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("op", ["all_reduce", "all_gather"])
@pytest.mark.parametrize("nbytes", SIZES)
def test_rows_are_exact_and_end_the_gate(card_reports, form, op, nbytes):
    for report in card_reports:
        got = report[form][f"{op} {nbytes}"]
        assert got == {"status_ended": True, "exact": True, "gate": 0}, (report["rank"], form, op, nbytes, got)


@pytest.mark.parametrize("form", FORMS)
def test_both_kernels_are_exact_in_both_forms(card_reports, form):
    for report in card_reports:
        for kernel in ("one_shot", "two_shot"):
            for nbytes in (1 * MiB, 8 * MiB):
                assert report[form][f"kernel {kernel} {nbytes}"] is True, (report["rank"], form, kernel, nbytes)
    # the rows above ran the kernel the size picks: one-shot on P2P up to 8 MiB, two-shot past 1 MiB host-staged
    assert card_reports[0]["p2p"]["default_kernel"] == {n: "one_shot" for n in SIZES}
    assert card_reports[0]["host"]["default_kernel"] == {n: "one_shot" if n <= MiB else "two_shot" for n in SIZES}


@pytest.mark.parametrize("form", FORMS)
def test_captured_launches_replay_with_new_inputs(card_reports, form):
    for report in card_reports:
        graph = report[form]["graph"]
        for key in ("replay 0", "replay 1", "gather replay 0", "gather replay 1"):
            assert graph[key] == {"exact": True, "gate": 0}, (report["rank"], form, key, graph[key])


@pytest.mark.parametrize("form", FORMS)
def test_the_gate_memset_is_captured_with_the_launches(card_reports, form):
    for report in card_reports:
        graph = report[form]["graph"]
        assert "memset_capture_error" not in graph, graph["memset_capture_error"]


@pytest.mark.parametrize("form", FORMS)
def test_no_wait_timed_out_and_close_leaves_nothing_in_shm(card_reports, form):
    for report in card_reports:
        assert report[form]["world"] == WORLD and report[form]["rank"] == report["rank"]
        assert report[form]["timed_out"] is False
        assert report[form]["left_in_shm"] == []
