"""The chained all_reduce (all_reduce_host_r4dchain) publishes its own contribution first, then waits
in its prologue for the chain's wait word, bumped late by another process, and reduces only after it."""

import time

import numpy as np

from radiance.abi import RAD_LINK_ENDED, RadArgs, rad_tensor
from radiance.collectives import ChainWords, Segment, chain_record, new_run_id, set_chain, slot_bytes
from radiance.collectives.peers import DATA_OFFSET, FLAG_READY, HEADER_BYTES, N_FLAGS
from test_collectives_harness import load_kernel, run_ranks

M, N = 4, 1000
BUMP_DELAY = 0.4
BUFFER = 64 << 10


def contribution(rank):
    return np.arange(M * N, dtype=np.float32).reshape(M, N) * (rank + 1)


def _chained_rank(rank):
    kernel = load_kernel()
    words = ChainWords.attach(rank.run_id, 0)  # the chain words the test process created
    owner, peers = rank.peers(buffer_bytes=BUFFER)
    x = contribution(rank.rank)
    gate = np.ones(1, np.uint64)
    args = set_chain(RadArgs(t=(rad_tensor(x),), params={"M": M, "n": N, "dtype": "f32"}, peers=peers, link_gate=gate),
                     words.record(rank.rank, 5, 10 + rank.rank, 7))
    started = time.monotonic_ns()
    status = kernel.all_reduce_host_r4dchain(args)
    returned = time.monotonic_ns()
    bumped = int(words.word(10 + rank.rank)[0])
    rank.sync()
    owner.close()
    words.close()
    return status, int(gate[0]), started, returned, bumped, x


def test_the_chained_collective_publishes_then_waits_in_its_prologue():
    import threading

    run_id = new_run_id()
    words = ChainWords.create(run_id, 0, count=16)
    seen = {}

    def late_bumper():
        """Another thread of this process plays the producer the chain waits for: it waits until
        every rank has published epoch 1, changes rank 0's published bytes, then bumps late."""
        segments, flags = {}, {}
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and len(flags) < 2:
                for r in range(2):
                    if r not in segments:  # map it as soon as it exists: the mapping outlives an unlink
                        try:
                            segments[r] = Segment.attach(run_id, "peers", r)
                        except FileNotFoundError:
                            continue
                    if int(segments[r].words(HEADER_BYTES, N_FLAGS)[FLAG_READY]) >= 1:
                        flags[r] = segments[r]
                time.sleep(0.0005)
            seen["published"] = sorted(flags)
            time.sleep(BUMP_DELAY)  # the ranks are now waiting in their prologue
            if 0 in flags:  # epoch 1 uses slot 1: add 1.0 to rank 0's first element, before the bump
                first = DATA_OFFSET + slot_bytes(BUFFER)
                flags[0].array[first:first + 4].view(np.float32)[0] += 1.0
        finally:  # bump whatever happened, so no rank waits for ever
            seen["bump"] = time.monotonic_ns()
            for r in range(2):
                words.word(r)[0] = 5
            for segment in segments.values():
                segment.close()

    bumper = threading.Thread(target=late_bumper)
    bumper.start()
    try:
        results = run_ranks(_chained_rank, 2, run_id=run_id)
    finally:
        bumper.join()
        words.close()
    assert seen["published"] == [0, 1], "each rank published its contribution before the chain's word was bumped"
    expected = contribution(0) + contribution(1)
    expected[0, 0] += 1.0  # written into rank 0's published bytes before the bump: the reduction came after
    for rank, (status, gate, started, returned, bumped, x) in enumerate(results):
        assert status == RAD_LINK_ENDED and gate == 0
        assert returned > seen["bump"] > started, f"rank {rank} returned before the bump"
        assert np.array_equal(x, expected), f"rank {rank} reduced before the chain's wait word was bumped"
        assert bumped == 7, "the row bumps its bump word once done"


def test_a_record_already_satisfied_does_not_wait_and_one_rank_bumps_too():
    kernel = load_kernel()
    words = ChainWords.local(4)
    words.word(0)[0] = 3
    x = np.ones((1, 8), np.float32)
    args = RadArgs(t=(rad_tensor(x),), params={"M": 1, "n": 8, "dtype": "f32"},
                   chain=chain_record(words.word(0), 3, words.word(1), 9))
    start = time.monotonic()
    assert kernel.all_reduce_host_r4dchain(args) == 0
    assert time.monotonic() - start < 0.5 and int(words.word(1)[0]) == 9
