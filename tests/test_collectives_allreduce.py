"""all_reduce_host and all_gather_host between real rank processes over shared memory: bit-identical
rank-order sums on every rank around the one-shot / reduce-scatter threshold and at odd sizes, at
world 2, 3 and 4; many epochs with ranks at random speeds; all_gather's layout."""

import os
import random
import time

import numpy as np
import pytest

from radiance.abi import RAD_E_NOMEM, RAD_LINK_ENDED, RAD_OK, RadArgs, rad_tensor
from test_collectives_harness import digest, load_kernel, rank_order_sum, run_ranks

ONE_SHOT = 1 << 62
TWO_SHOT = 0


def contribution(case, rank, m, n):
    """Rank's x for a case: magnitudes spread over six decades, so the order of the sum shows."""
    rng = np.random.default_rng([case, rank])
    scale = 10.0 ** rng.uniform(-3, 3, (m, n))
    return (rng.standard_normal((m, n)) * scale).astype(np.float32)


def cases_for(world, kernel):
    limit = kernel.one_shot_max_bytes(world)
    elems = min(limit, 1 << 20) // 4
    around = [(1, elems - 1), (1, elems), (1, elems + 1), (3, elems // 3 + 1)]
    odd = [(1, 1), (1, 7), (5, 333), (7, 1001), (13, 4099)]
    cases = [(m, n, None) for m, n in odd + around]  # the row's own choice
    cases += [(m, n, TWO_SHOT) for m, n in odd + around[2:]]  # reduce-scatter forced, tiny chunks too
    cases += [(m, n, ONE_SHOT) for m, n in around[2:]]
    return cases


def _all_reduce_rank(rank):
    kernel = load_kernel()
    owner, peers = rank.peers(buffer_bytes=4 << 20)
    gate = np.zeros(1, np.uint64)
    out = []
    for case, (m, n, limit) in enumerate(cases_for(rank.world, kernel)):
        x = contribution(case, rank.rank, m, n)
        params = {"M": m, "n": n, "dtype": "f32"}
        if limit is not None:
            params["one_shot_max_bytes"] = limit
        gate[0] = 1
        status = kernel.all_reduce_host(RadArgs(t=(rad_tensor(x),), params=params, peers=peers, link_gate=gate))
        parts = [contribution(case, r, m, n) for r in range(rank.world)]
        expected = rank_order_sum(parts)
        reverse = rank_order_sum(parts[::-1])
        mismatched = int(np.count_nonzero(x.view(np.uint32) != expected.view(np.uint32)))
        out.append((status, int(gate[0]), digest(x), mismatched, not np.array_equal(expected, reverse)))
    epoch = int(peers.epoch)
    rank.sync()
    owner.close()
    return out, epoch


@pytest.mark.parametrize("world", [2, 3, 4])
def test_all_reduce_is_the_rank_order_sum_bit_for_bit_on_every_rank(world):
    kernel = load_kernel()
    cases = cases_for(world, kernel)
    results = run_ranks(_all_reduce_rank, world)
    for rank, (out, epoch) in enumerate(results):
        assert epoch == len(cases), "one epoch per launch"
        for case, (status, gate, _, mismatched, _) in enumerate(out):
            assert (status, gate) == (RAD_LINK_ENDED, 0), f"case {cases[case]}: colour 2 ends the hold"
            assert mismatched == 0, f"rank {rank}, case {cases[case]}: {mismatched} elements differ from the sum"
    for case in range(len(cases)):
        assert len({out[case][2] for out, _ in results}) == 1, f"case {cases[case]}: ranks disagree"
    if world >= 3:  # the check tells orders apart: on the larger cases the reverse order gives other bits
        assert all(results[0][0][case][4] for case, (m, n, _) in enumerate(cases) if m * n > 1000)


def _threshold_rank(rank):
    """Which form ran is visible in the flags: reduce-scatter stores DONE, one-shot does not."""
    kernel = load_kernel()
    owner, peers = rank.peers(buffer_bytes=1 << 20)
    limit = kernel.one_shot_max_bytes(rank.world)
    seen = []
    for count in (limit // 4, limit // 4 + 1):
        x = np.ones((1, count), np.float32)
        kernel.all_reduce_host(RadArgs(t=(rad_tensor(x),), params={"M": 1, "n": count, "dtype": "f32"}, peers=peers))
        seen.append(int(peers.flags[rank.rank][kernel.DONE]) == peers.epoch)
    rank.sync()
    owner.close()
    return limit, seen


def test_the_threshold_splits_where_the_row_says():
    for limit, (at_limit_two_shot, above_two_shot) in run_ranks(_threshold_rank, 3):
        assert limit == 256 << 10
        assert not at_limit_two_shot and above_two_shot


def _random_speeds_rank(rank):
    """300 launches of all_reduce (one-shot and reduce-scatter) and all_gather; every rank sleeps at
    random before a launch and, inside the row, between seeing a peer's flag and reading its slot
    (a slow reader while a fast peer has moved on)."""
    kernel = load_kernel()
    plain_wait = kernel.wait_word
    slow = random.Random(1000 + rank.rank)

    def slow_wait(word, value, timeout_ns=0):
        status = plain_wait(word, value, timeout_ns)
        if slow.random() < 0.15:
            time.sleep(slow.uniform(0, 0.002))
        return status

    kernel.wait_word = slow_wait
    owner, peers = rank.peers(buffer_bytes=64 << 10)
    bad = []
    for epoch in range(300):
        plan = random.Random(epoch)  # the same on every rank: every rank launches the same sequence
        m, n = plan.choice([(1, 1), (1, 9), (2, 100), (3, 1001), (4, 3000)])
        kind = plan.choice(["one", "two", "gather"])
        if slow.random() < 0.2:
            time.sleep(slow.uniform(0, 0.003))
        x = contribution(epoch, rank.rank, m, n)
        params = {"M": m, "n": n, "dtype": "f32"}
        if kind == "gather":
            y = np.full((m, n * rank.world), np.nan, np.float32)
            status = kernel.all_gather_host(RadArgs(t=(rad_tensor(x), rad_tensor(y)), params=params, peers=peers))
            expected = np.concatenate([contribution(epoch, r, m, n) for r in range(rank.world)], axis=1)
            got = y
        else:
            params["one_shot_max_bytes"] = ONE_SHOT if kind == "one" else TWO_SHOT
            status = kernel.all_reduce_host(RadArgs(t=(rad_tensor(x),), params=params, peers=peers))
            expected = rank_order_sum([contribution(epoch, r, m, n) for r in range(rank.world)])
            got = x
        if status != RAD_OK or not np.array_equal(got.view(np.uint32), expected.view(np.uint32)):
            bad.append((epoch, kind, m, n, status))
    rank.sync()
    owner.close()
    return bad


def test_many_epochs_with_ranks_at_random_speeds_never_corrupt_a_result():
    for rank, bad in enumerate(run_ranks(_random_speeds_rank, 3, timeout=50)):
        assert bad == [], f"rank {rank}: wrong results at {bad[:5]}"


def _all_gather_rank(rank):
    kernel = load_kernel()
    owner, peers = rank.peers(buffer_bytes=1 << 20)
    out = []
    for case, (m, n) in enumerate([(1, 1), (3, 7), (17, 1001), (64, 4096)]):
        x = contribution(case, rank.rank, m, n)
        y = np.full((m, n * rank.world), np.nan, np.float32)
        gate = np.ones(1, np.uint64)
        args = RadArgs(t=(rad_tensor(x), rad_tensor(y)), params={"M": m, "n": n, "dtype": "f32"}, peers=peers,
                       link_gate=gate)
        status = kernel.all_gather_host(args)
        expected = np.concatenate([contribution(case, r, m, n) for r in range(rank.world)], axis=1)
        out.append((status, int(gate[0]), bool(np.array_equal(y, expected)), digest(y)))
    rank.sync()
    owner.close()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_all_gather_places_rank_r_at_columns_r_n(world):
    results = run_ranks(_all_gather_rank, world)
    for rank, out in enumerate(results):
        for case, (status, gate, equal, _) in enumerate(out):
            assert status == RAD_OK and equal, f"rank {rank}, case {case}"
            assert gate == 1, "all_gather_host is colour 1: the engine, not the row, ends the hold"
    assert all(len({out[case][3] for out in results}) == 1 for case in range(4))


def _too_big_rank(rank):
    kernel = load_kernel()
    owner, peers = rank.peers(buffer_bytes=4096)
    x = np.ones((1, 2048), np.float32)  # 8 KiB: more than a 4 KiB slot
    status = kernel.all_reduce_host(RadArgs(t=(rad_tensor(x),), params={"M": 1, "n": 2048, "dtype": "f32"},
                                            peers=peers))
    small = np.full((1, 4), rank.rank + 1.0, np.float32)  # the next launch still agrees on the epoch
    after = kernel.all_reduce_host(RadArgs(t=(rad_tensor(small),), params={"M": 1, "n": 4, "dtype": "f32"},
                                           peers=peers))
    rank.sync()
    owner.close()
    return status, after, small.tolist()


def test_a_message_larger_than_the_slot_is_refused_alike_on_every_rank():
    for status, after, small in run_ranks(_too_big_rank, 2):
        assert status == RAD_E_NOMEM and after == RAD_OK and small == [[3.0] * 4]


def test_one_rank_without_peers_is_the_identity():
    kernel = load_kernel()
    x = contribution(0, 0, 3, 5)
    before = x.copy()
    y = np.empty((3, 5), np.float32)
    params = {"M": 3, "n": 5, "dtype": "f32"}
    assert kernel.all_reduce_host(RadArgs(t=(rad_tensor(x),), params=params)) == RAD_OK
    assert kernel.all_gather_host(RadArgs(t=(rad_tensor(x), rad_tensor(y)), params=params)) == RAD_OK
    assert np.array_equal(x, before) and np.array_equal(y, before)
    assert os.path.basename(kernel.__file__) == "collectives.py"
