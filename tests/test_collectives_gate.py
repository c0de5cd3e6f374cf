"""The link gate and the link scheduler: bulk chunks are never in flight while a rank's gate is held
(real rank processes running collectives while a weight load streams), colour 2 ends its hold before
its launch returns, colour 1's hold is ended by the engine, and a colour-2 row that leaves the gate
held is reported by name."""

import time

import numpy as np
import pytest

from radiance.abi import RAD_E_DEVICE, RAD_LINK_ENDED, RAD_OK, RadArgs, rad_tensor
from radiance.collectives import LinkGate, LinkGateError, LinkScheduler, launch_collective
from test_collectives_harness import load_kernel, run_ranks

MIB = 1 << 20


def _weights(nbytes):
    src = np.arange(nbytes // 4, dtype=np.uint32)
    return src, np.zeros_like(src)


def _records(scheduler):
    chunks = [(c.start, c.end, c.nbytes) for c in scheduler.chunks]
    holds = [(h.colour, h.row, h.start, h.end, h.returned, h.seen_clear, h.ended_by) for h in scheduler.holds]
    return chunks, holds


def _launch_plan(kernel, peers, rank, world):
    rng = np.random.default_rng(rank)
    m, n = 8, 1024
    x = rng.standard_normal((m, n)).astype(np.float32)
    residual = np.zeros((m, n), np.float32)
    w = np.ones(n, np.float32)
    y = np.empty((m, n), np.float32)
    gathered = np.empty((m, n * world), np.float32)
    base = {"M": m, "n": n, "dtype": "f32"}
    return [
        ("all_reduce_host", 2, RadArgs(t=(rad_tensor(x),), params=base, peers=peers)),
        ("all_gather_host", 1, RadArgs(t=(rad_tensor(x), rad_tensor(gathered)), params=base, peers=peers)),
        ("all_reduce_add_rmsnorm_host", 2,
         RadArgs(t=(rad_tensor(x), rad_tensor(residual), rad_tensor(w), rad_tensor(y)), params={**base, "eps": 1e-5},
                 peers=peers)),
    ]


def _streaming_rank(rank):
    """A weight load streams through the scheduler while the rank launches 90 collectives."""
    kernel = load_kernel()
    gate = LinkGate.create(rank.run_id, rank.rank)
    owner, peers = rank.peers(buffer_bytes=1 * MIB)
    src, dst = _weights(96 * MIB)
    statuses = []
    with LinkScheduler(gate, chunk_bytes=256 << 10) as scheduler:
        rank.sync()
        plan = _launch_plan(kernel, peers, rank.rank, rank.world)
        transfer = None
        for i in range(90):
            name, colour, args = plan[i % len(plan)]
            launch = next(info.launch for info, _ in kernel.HOST_ROWS if info.name == name)
            statuses.append(scheduler.launch_collective(launch, args, colour, name))
            if transfer is None:
                # the load starts once both ranks are past a first hold: on a busy machine a peer that
                # came late to it could otherwise leave the whole load before it, and nothing between holds
                transfer = scheduler.copy(dst, src, "weights")
            if i % 3 == 0:  # the compute between collectives, when bulk chunks move: let one through
                moved, deadline = len(scheduler.chunks), time.monotonic() + 2
                while len(scheduler.chunks) == moved and not transfer.done and time.monotonic() < deadline:
                    time.sleep(0.0002)
        transfer.wait(30)
        records = _records(scheduler)
        stats = scheduler.hold_stats()
    copied = bool(np.array_equal(dst, src))
    rank.sync()
    owner.close()
    gate.close()
    return statuses, records, stats, copied


def test_bulk_chunks_are_never_in_flight_while_the_gate_is_held():
    for rank, (statuses, (chunks, holds), stats, copied) in enumerate(run_ranks(_streaming_rank, 2)):
        assert copied, "the weights arrived whole"
        assert set(statuses) <= {RAD_OK, RAD_LINK_ENDED} and len(holds) == 90 == stats["holds"]
        assert stats["by_colour"][1]["holds"] == 30 and stats["by_colour"][2]["holds"] == 60
        for colour, row, start, end, returned, seen_clear, ended_by in holds:
            assert start <= end <= returned or colour == 1, row
            assert ended_by == ("kernel" if colour == 2 else "engine"), row
            overlapping = [c for c in chunks if c[0] < end and c[1] > start]
            assert not overlapping, f"rank {rank}: a chunk was in flight during the hold of {row}"
        # not vacuous: the load went on between holds, not only before the first or after the last
        first_end, last_start = min(h[3] for h in holds), max(h[2] for h in holds)
        assert sum(first_end <= c[0] and c[1] <= last_start for c in chunks) >= 10, f"rank {rank}: no interleaving"


def _colour_two_rank(rank):
    """The fused row at M=512, n=4096: its peers' bytes land, it ends the hold, then it spends
    milliseconds on the residual add and the ordered rmsnorm before it returns."""
    kernel = load_kernel()
    gate = LinkGate.create(rank.run_id, rank.rank)
    m, n = 512, 4096
    owner, peers = rank.peers(buffer_bytes=m * n * 4)
    src, dst = _weights(64 * MIB)
    x = np.full((m, n), rank.rank + 1.0, np.float32)
    residual, w, y = np.zeros((m, n), np.float32), np.ones(n, np.float32), np.empty((m, n), np.float32)
    args = RadArgs(t=(rad_tensor(x), rad_tensor(residual), rad_tensor(w), rad_tensor(y)),
                   params={"M": m, "n": n, "eps": 1e-5, "dtype": "f32"}, peers=peers)
    statuses = []
    with LinkScheduler(gate, chunk_bytes=64 << 10) as scheduler:
        rank.sync()
        for _ in range(4):
            transfer = scheduler.copy(dst, src, "weights")  # pending when the hold begins
            statuses.append(scheduler.launch_collective(kernel.all_reduce_add_rmsnorm_host, args, 2))
            transfer.wait(60)
        records = _records(scheduler)
    rank.sync()
    owner.close()
    gate.close()
    return statuses, records


def test_colour_2_ends_its_hold_before_its_launch_completes():
    """The scheduler's worker must get a core during the epilogue to see it; on a loaded machine it
    may miss some launches, so one launch of four per rank is the evidence asked for."""
    for rank, (statuses, (chunks, holds)) in enumerate(run_ranks(_colour_two_rank, 2)):
        assert statuses == [RAD_LINK_ENDED] * 4 and [h[6] for h in holds] == ["kernel"] * 4
        early = 0
        for colour, row, start, end, returned, seen_clear, ended_by in holds:
            assert end == (min(seen_clear, returned) if seen_clear else returned)
            if seen_clear and seen_clear < returned:
                moved = [c for c in chunks if seen_clear <= c[0] < returned]
                assert moved, f"rank {rank}: the gate was free, yet no chunk moved"
                early += 1
        assert early, f"rank {rank}: the hold never ended before the launch returned"


def leaky_all_reduce(a):
    """A colour-2 row that forgets to end the hold but says it did."""
    return RAD_LINK_ENDED


def quiet_all_reduce(a):
    """A colour-2 row that neither ends the hold nor says it did."""
    return RAD_OK


def failing_all_reduce(a):
    return RAD_E_DEVICE


def test_a_colour_2_row_leaving_the_gate_held_is_reported_and_the_link_freed():
    src, dst = _weights(8 * MIB)
    args = RadArgs(t=(), params={})
    with LinkScheduler(LinkGate(), chunk_bytes=1 * MIB) as scheduler:
        scheduler.hold(1, "test")
        transfer = scheduler.copy(dst, src, "weights")
        time.sleep(0.05)
        assert not transfer.done and not scheduler.chunks, "nothing moves while the gate is held"
        scheduler.release()
        transfer.wait(10)
        leaked = "row 'leaky_all_reduce' is colour 2 but returned RAD_LINK_ENDED with the link gate still held"
        with pytest.raises(LinkGateError, match=leaked):
            scheduler.launch_collective(leaky_all_reduce, args, 2)
        assert not scheduler.gate.held and scheduler.holds[-1].ended_by.startswith("engine")
        with pytest.raises(LinkGateError, match="row 'my_row' is colour 2 but returned RAD_OK"):
            scheduler.launch_collective(quiet_all_reduce, args, 2, name="my_row")
        # a row's own error code comes back (the caller reports it), with the hold ended
        assert scheduler.launch_collective(failing_all_reduce, args, 2) == RAD_E_DEVICE
        assert not scheduler.gate.held
        scheduler.copy(dst, np.zeros_like(src), "again").wait(10)  # the link is usable again
    assert not dst.any()
    gate = np.zeros(1, np.uint64)
    with pytest.raises(LinkGateError, match="row 'leaky_all_reduce'"):
        launch_collective(leaky_all_reduce, RadArgs(t=(), params={}, link_gate=gate), 2)
    assert gate[0] == 0


def test_colour_1_holds_the_gate_for_the_whole_launch_and_the_engine_ends_it():
    seen = []

    def colour_one_row(a):
        seen.append(int(a.link_gate[0]))
        return RAD_OK

    with LinkScheduler() as scheduler:
        assert scheduler.launch_collective(colour_one_row, RadArgs(t=(), params={}), 1) == RAD_OK
        hold = scheduler.holds[-1]
        assert seen == [hold.seq] and hold.seq != 0 and not scheduler.gate.held and hold.ended_by == "engine"
        scheduler.hold(1, "first")
        with pytest.raises(LinkGateError, match="already held"):
            scheduler.hold(1, "second")
        scheduler.release()
        assert scheduler.hold_stats()["holds"] == 2


def test_the_real_rows_end_their_hold_on_one_rank():
    kernel = load_kernel()
    x = np.ones((2, 3), np.float32)
    with LinkScheduler() as scheduler:
        for info, colour in kernel.HOST_ROWS:
            name = info.name
            t = (rad_tensor(x), rad_tensor(np.empty((2, 3), np.float32)))
            if name == "all_reduce_add_rmsnorm_host":
                t = (rad_tensor(x), rad_tensor(np.zeros((2, 3), np.float32)), rad_tensor(np.ones(3, np.float32)), t[1])
            args = RadArgs(t=t[:1] if info.op == "all_reduce" else t,
                           params={"M": 2, "n": 3, "eps": 1e-5, "dtype": "f32"})
            status = scheduler.launch_collective(info.launch, args, colour, name)
            assert status == (RAD_LINK_ENDED if colour == 2 else RAD_OK), name
            assert scheduler.holds[-1].ended_by == ("kernel" if colour == 2 else "engine") and not scheduler.gate.held
