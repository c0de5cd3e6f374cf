"""The harness of the collectives tests (real rank processes started with spawn, real shared memory)
and the tests of the segments themselves: naming, attach, cleanup, the resource tracker, /dev/shm
space, and the kernel file's imports."""

import ast
import hashlib
import importlib.util
import multiprocessing as mp
import os
import queue
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import pytest

from radiance.collectives import HostPeers, Segment, ShmSpaceError, list_run, new_run_id, shm_free_bytes, unlink_run

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "plugins" / "kernels" / "libr4d" / "collectives.py"
SHM = Path("/dev/shm")
BARRIER_TIMEOUT = 30


def load_kernel():
    """libr4d's collectives.py as a standalone module (it imports nothing of radiance's but the ABI)."""
    spec = importlib.util.spec_from_file_location("libr4d_collectives_under_test", KERNEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def digest(array) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def rank_order_sum(parts):
    total = parts[0].copy()
    for part in parts[1:]:
        total = total + part
    return total


class Rank:
    """What a rank process's target receives."""

    def __init__(self, run_id, rank, world, barrier, extra):
        self.run_id, self.rank, self.world, self.barrier, self.extra = run_id, rank, world, barrier, extra

    def sync(self):
        self.barrier.wait(BARRIER_TIMEOUT)

    def peers(self, buffer_bytes=1 << 20):
        """HostPeers.create, barrier, attach: the launcher's two-step setup."""
        owner = HostPeers.create(self.run_id, self.rank, self.world, buffer_bytes)
        self.sync()
        return owner, owner.attach()


def _entry(target, run_id, rank, world, barrier, results, extra):
    try:
        value = target(Rank(run_id, rank, world, barrier, extra))
        results.put((rank, "ok", value))
    except BaseException:  # noqa: BLE001 - handed to the parent
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(target, world, extra=None, timeout=45.0, run_id=None, keep_segments=False):
    """Start `world` spawned processes running target(Rank); return their results by rank. A rank
    that raises fails the test with its traceback; the run's segments are unlinked afterwards."""
    ctx = mp.get_context("spawn")
    run_id = run_id or new_run_id()
    barrier, results = ctx.Barrier(world), ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(target, run_id, r, world, barrier, results, extra), daemon=True)
             for r in range(world)]
    values, deadline = {}, time.monotonic() + timeout
    try:
        for proc in procs:
            proc.start()
        while len(values) < world:
            try:
                rank, kind, value = results.get(timeout=0.5)
            except queue.Empty:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world)) - set(values))
                    raise AssertionError(f"ranks {missing} did not finish in {timeout} s")
                dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in values]
                if dead:
                    raise AssertionError(f"rank {dead[0][0]} died with exit code {dead[0][1]}")
                continue
            if kind == "error":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            values[rank] = value
        for proc in procs:
            proc.join(10)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        if not keep_segments:
            unlink_run(run_id)
    return [values[r] for r in range(world)]


# ---- the tests of this file ---------------------------------------------------------------------

def test_kernel_file_imports_nothing_of_radiance_but_the_abi():
    tree = ast.parse(KERNEL.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports: the file stands alone"
            imported.add(node.module)
    allowed = {"radiance.abi", "numpy", *sys.stdlib_module_names}
    assert {name for name in imported if name.split(".")[0] not in allowed and name not in allowed} == set()
    assert {name for name in imported if name.startswith("radiance")} == {"radiance.abi"}


def _create_and_check(rank: Rank):
    owner, peers = rank.peers(buffer_bytes=10_000)
    names = list_run(rank.run_id)
    assert len(peers.buffers) == rank.world and len(peers.flags) == rank.world
    assert all(b.dtype == np.uint8 and b.size == 2 * peers.buffer_bytes for b in peers.buffers)
    assert all(f.dtype == np.uint64 and f.strides == (64,) for f in peers.flags)
    # what rank r writes into its own segment, every peer reads in its view
    peers.buffers[rank.rank][:4] = rank.rank + 1
    peers.flags[rank.rank][3] = 100 + rank.rank
    rank.sync()
    seen = [(int(peers.buffers[r][0]), int(peers.flags[r][3])) for r in range(rank.world)]
    rank.sync()
    owner.close()
    rank.sync()
    return names, seen, list_run(rank.run_id)


def test_segments_are_shared_named_by_run_and_gone_after_close():
    run_id = new_run_id()
    results = run_ranks(_create_and_check, 3, run_id=run_id, keep_segments=True)
    for names, seen, after in results:
        assert names == [f"rad.{run_id}.peers.{r}" for r in range(3)]
        assert seen == [(r + 1, 100 + r) for r in range(3)]
        assert after == []
    assert not list(SHM.glob(f"rad.{run_id}.*"))


CREATE_AND_EXIT = """
import sys
from radiance.collectives import HostPeers, LinkGate, ChainWords
run_id = sys.argv[1]
HostPeers.create(run_id, 0, 1, 4096)
LinkGate.create(run_id, 0)
ChainWords.create(run_id, 0)
from multiprocessing import shared_memory  # the tracker is what would unlink and warn
print("created")
"""


def test_segments_outlive_their_creator_and_unlink_run_removes_them():
    """No resource_tracker unlinks a run's segment when the creating process exits (nor warns of a
    leak); the supervisor's unlink_run removes every segment of the run and no other run's."""
    run_id, other = new_run_id(), new_run_id() + "x"
    result = subprocess.run([sys.executable, "-c", CREATE_AND_EXIT, run_id], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "created" in result.stdout, result.stderr
    assert "leaked" not in result.stderr and "resource_tracker" not in result.stderr, result.stderr
    keep = Segment.create(other, "peers", 0, 4096)
    try:
        assert list_run(run_id) == [f"rad.{run_id}.{kind}.0" for kind in ("chain", "gate", "peers")]
        assert sorted(unlink_run(run_id)) == [f"rad.{run_id}.{k}.0" for k in ("chain", "gate", "peers")]
        assert list_run(run_id) == [] and not list(SHM.glob(f"rad.{run_id}.*"))
        assert list_run(other) == [keep.name]
    finally:
        keep.close()
        keep.unlink()


def _killed_mid_run(rank: Rank):
    owner, peers = rank.peers()
    rank.sync()
    if rank.rank == 1:
        os.kill(os.getpid(), 9)
    return list_run(rank.run_id)


def test_a_killed_rank_leaves_segments_that_unlink_run_removes():
    run_id = new_run_id()
    with pytest.raises(AssertionError, match="rank 1 died with exit code -9"):
        run_ranks(_killed_mid_run, 2, run_id=run_id, keep_segments=True, timeout=30)
    assert f"rad.{run_id}.peers.1" in list_run(run_id)
    unlink_run(run_id)
    assert list_run(run_id) == []


def test_too_little_dev_shm_is_a_clear_error_before_anything_is_created():
    run_id = new_run_id()
    too_big = shm_free_bytes() + (1 << 30)
    with pytest.raises(ShmSpaceError, match=r"too little /dev/shm: need \d+\.\d MiB, \d+\.\d MiB free"):
        HostPeers.create(run_id, 0, 2, too_big)
    assert list_run(run_id) == []


def test_attach_names_the_missing_rank_and_checks_the_geometry():
    run_id = new_run_id()
    zero = HostPeers.create(run_id, 0, 2, 4096)
    try:
        with pytest.raises(FileNotFoundError, match="rank 1"):
            zero.attach()
        one = HostPeers.create(run_id, 1, 2, 8192)
        with pytest.raises(RuntimeError, match="rank 1 created its peers segment for world 2 with 8192-byte"):
            zero.attach()
        one.close()
        with pytest.raises(FileExistsError):
            HostPeers.create(run_id, 0, 2, 4096)
    finally:
        zero.close()
        unlink_run(run_id)
    assert list_run(run_id) == []
