"""The device.p2p fact probe: a real write/read-back through IPC handles with every peer, here
with the fake backend in real processes (shared memory stands in for a card's IPC mapping)."""

import multiprocessing as mp
import time
from pathlib import Path

import numpy as np

from radiance.device.fake import FakeDevice
from radiance.device.probe import pattern, probe_p2p


class FileExchange:
    """An all-gather through files in a folder: round r, rank i writes r.i, everyone reads r.*."""

    def __init__(self, folder: str, rank: int, world: int):
        self.folder, self.rank, self.world, self.round = Path(folder), rank, world, 0

    def __call__(self, payload: bytes) -> list[bytes]:
        temporary = self.folder / f"{self.round}.{self.rank}.tmp"
        temporary.write_bytes(payload)
        temporary.rename(self.folder / f"{self.round}.{self.rank}")
        paths = [self.folder / f"{self.round}.{r}" for r in range(self.world)]
        deadline = time.monotonic() + 60
        while not all(p.exists() for p in paths):
            assert time.monotonic() < deadline, "a peer never reached the exchange"
            time.sleep(0.002)
        self.round += 1
        return [p.read_bytes() for p in paths]


def _rank(folder, rank, world, ipc, results):
    device = FakeDevice(ipc=ipc)
    try:
        results.put((rank, probe_p2p(device, rank, world, FileExchange(folder, rank, world), slot_bytes=4096),
                     device.budget.used))
    finally:
        device.close()


def run_ranks(tmp_path, world, ipc=lambda rank: True):
    context = mp.get_context("spawn")
    results = context.Queue()
    ranks = [context.Process(target=_rank, args=(str(tmp_path), r, world, ipc(r), results)) for r in range(world)]
    for process in ranks:
        process.start()
    gathered = dict((r, (fact, used)) for r, fact, used in (results.get(timeout=120) for _ in ranks))
    for process in ranks:
        process.join(timeout=60)
        assert process.exitcode == 0
    return gathered


def test_three_ranks_that_reach_each_other_report_p2p(tmp_path):
    gathered = run_ranks(tmp_path, 3)
    for rank, (fact, used) in gathered.items():
        assert fact["device.p2p"] == 1, fact["detail"]
        assert fact["peers"] == {p: True for p in range(3) if p != rank}
        assert used == 0  # the probe buffer was freed


def test_one_rank_that_cannot_open_handles_puts_p2p_off_for_its_pairs_both_ways(tmp_path):
    gathered = run_ranks(tmp_path, 3, ipc=lambda rank: rank != 2)
    assert gathered[2][0]["device.p2p"] == 0
    assert "IPC handles cannot be opened" in gathered[2][0]["detail"]
    for rank in (0, 1):
        fact = gathered[rank][0]
        assert fact["device.p2p"] == 0 and fact["peers"] == {1 - rank: True, 2: False}
        assert "rank 2" in fact["detail"]


def test_a_single_rank_has_no_peers_to_probe():
    assert probe_p2p(FakeDevice(), 0, 1, lambda payload: [payload])["device.p2p"] == 1


def test_the_patterns_differ_per_pair():
    assert not np.array_equal(pattern(0, 1), pattern(1, 0))
    assert len({pattern(w, o).tobytes() for w in range(3) for o in range(3)}) == 9
