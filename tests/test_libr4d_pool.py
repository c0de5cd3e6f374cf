"""libr4d's thread pool (r4d_pool.h) and the GEMV shapes its 512-bit paths cut differently: the
same answers on one thread, on the cores there are, on more threads than cores, and with every core
taken by spinning processes (workers that lose their core mid-launch); the words the host
collectives wait on (spin, then a futex the writer wakes)."""

import ctypes
import multiprocessing
import os
import threading
import time

import numpy as np
import pytest

from radiance.engine.loading.registry import Registry
from test_libr4d_support import TOL_A16, TOL_F32, activations, launch, make_weight, rel_err, row_of


class Threads:
    """One registry whose libr4d runs on `threads` threads while used (the count is the loaded
    library's: every registry of this process shares it, so each use sets it first)."""

    def __init__(self, registry, threads):
        self.registry, self.threads = registry, threads

    def __enter__(self):
        module = libr4d_module(self.registry)
        self.before = module._STATE["native"].threads if module._STATE["native"] else 1
        module.set_threads(self.threads)
        return self.registry

    def __exit__(self, *_):
        libr4d_module(self.registry).set_threads(self.before)


@pytest.fixture(scope="module")
def registries():
    """libr4d on 1, 2 and 7 threads (on this 2-core machine: fewer, as many and more than the cores)."""
    registry = Registry(radiance_home="")
    yield {threads: Threads(registry, threads) for threads in (1, 2, 7)}
    registry.close()


def libr4d_module(registry):
    return next(lib for lib in registry.hierarchy if lib.name == "libr4d").module


def gemm(threads, library, fmt, n, k, m, weight, x, name=None, **extra):
    with threads as registry:
        return _gemm(registry, library, fmt, n, k, m, weight, x, name, **extra)


def _gemm(registry, library, fmt, n, k, m, weight, x, name=None, **extra):
    geometry = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1, **extra}
    if library == "libr4d" and name is None:
        name = f"r4d_gemv_{fmt}" if m <= 16 else f"r4d_gemm_{fmt}"
    y = np.full((m, n), np.nan, np.float32)
    assert launch(row_of(registry, "gemm", library, name), [x, None, y], geometry, {1: weight}) == 0
    return y


# K = 32 (one block), 96 (an odd count: the pair layout's lone last block), 576, 1536; N odd
# (the two-row GEMV's lone last row) and even; M = 1 (two rows at a time) and 2, 3, 5 (row groups)
SHAPES = [(1, 33, 32), (1, 17, 96), (3, 17, 96), (1, 577, 576), (2, 64, 1536), (5, 31, 96)]


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("m,n,k", SHAPES, ids=[f"M{m}-N{n}-K{k}" for m, n, k in SHAPES])
def test_decode_gemv_shapes_agree_with_libref(registries, fmt, m, n, k):
    weight, x = make_weight(fmt, n, k, seed=n + k), activations(m, k, seed=m)
    reference = gemm(registries[1], "libref", fmt, n, k, m, weight, x)
    for count, threads in registries.items():
        y = gemm(threads, "libr4d", fmt, n, k, m, weight, x, f"r4d_gemv_{fmt}", aq=16)
        assert rel_err(y, reference) <= TOL_A16, (count, rel_err(y, reference))


@pytest.mark.parametrize("fmt,m", [("q4_1", 1), ("q4_1", 4), ("q8_0", 1), ("q4_1", 37)])
def test_every_thread_count_gives_the_same_bits(registries, fmt, m):
    """A row's output does not depend on how the pool cut the launch (1, 2 or 7 threads on 2 cores)."""
    n, k = 1536, 576
    weight, x = make_weight(fmt, n, k, seed=9), activations(m, k, seed=10)
    outputs = [gemm(threads, "libr4d", fmt, n, k, m, weight, x) for threads in registries.values()]
    for other in outputs[1:]:
        np.testing.assert_array_equal(outputs[0], other)


def spin():
    while True:
        pass


def test_launches_stay_right_while_spinning_processes_take_every_core(registries):
    """Seven threads on cores taken by as many spinners as there are cores: workers lose their core
    in the middle of launches, and every launch still covers every chunk once."""
    threads = registries[7]
    n, k = 1536, 576
    weight, x = make_weight("q4_1", n, k, seed=3), activations(1, k, seed=4)
    expected = gemm(registries[1], "libr4d", "q4_1", n, k, 1, weight, x)
    prefill = activations(37, k, seed=5)
    expected_gemm = gemm(registries[1], "libr4d", "q4_1", n, k, 37, weight, prefill)
    context = multiprocessing.get_context("spawn")
    spinners = [context.Process(target=spin, daemon=True) for _ in range(len(os.sched_getaffinity(0)))]
    for spinner in spinners:
        spinner.start()
    try:
        with threads as registry:
            for _ in range(200):
                np.testing.assert_array_equal(_gemm(registry, "libr4d", "q4_1", n, k, 1, weight, x), expected)
            for _ in range(10):
                np.testing.assert_array_equal(_gemm(registry, "libr4d", "q4_1", n, k, 37, weight, prefill), expected_gemm)
    finally:
        for spinner in spinners:
            spinner.terminate()
        for spinner in spinners:
            spinner.join()


def test_the_prefill_gemm_still_agrees_with_libref(registries):
    weight, x = make_weight("q4_1", 192, 576, seed=1), activations(40, 576, seed=2)
    reference = gemm(registries[1], "libref", "q4_1", 192, 576, 40, weight, x)
    for threads in registries.values():
        assert rel_err(gemm(threads, "libr4d", "q4_1", 192, 576, 40, weight, x), reference) <= TOL_F32


def test_a_word_wait_returns_once_another_thread_stores_and_wakes(registries):
    native = libr4d_module(registries[2].registry)._STATE["native"]
    if native is None:
        pytest.skip("no native build")
    word = np.zeros(1, np.uint64)
    address = word.ctypes.data

    def writer():
        time.sleep(0.05)  # long past the spin: the waiter is asleep on the futex by now
        word[0] = 5
        native.lib.r4d_wake_word(address)

    thread = threading.Thread(target=writer)
    thread.start()
    assert native.lib.r4d_wait_word(address, 5, 1000, 1000, 10_000_000_000) == 0
    thread.join()
    assert word[0] == 5
    assert native.lib.r4d_wait_word(address, 4, 0, 0, 0) == 0  # already there: no wait
    assert native.lib.r4d_wait_word(address, 6, 1000, 1000, 2_000_000) == -1  # nobody stores 6: the timeout
    assert ctypes.sizeof(ctypes.c_uint64) == word.itemsize


@pytest.mark.parametrize("option,threads", [("--threads", 1), ("--threads", 3)])
def test_radiance_threads_sets_the_rank_s_threads(tiny_model, option, threads):
    """`radiance --threads N`: the line libr4d logs when it opens (RADIANCE_LOG=debug) names its threads."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "radiance.tools.generate", "--model", str(tiny_model), "--prompt",
                             "hello", "--max-tokens", "2", "--temperature", "0", option, str(threads)],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "RADIANCE_THREADS": "2", "RADIANCE_LOG": "debug"})
    assert result.returncode == 0, result.stderr
    assert f"{threads} thread(s)" in result.stderr, result.stderr


def test_radiance_launch_threads_per_rank_sets_each_rank_s_threads(tiny_model):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "radiance.tools.launch", "--tp", "2", "--model", str(tiny_model),
                             "--prompt", "hello", "--max-tokens", "2", "--temperature", "0", "--threads-per-rank", "3"],
                            capture_output=True, text=True, timeout=180, env={**os.environ, "RADIANCE_LOG": "debug"})
    assert result.returncode == 0, result.stderr
    # the ranks' lines (the launcher opens the plugins too, to check the split before it starts a rank)
    lines = [line for line in result.stderr.splitlines() if line.startswith("[rank ") and "libr4d:" in line
             and "thread(s)" in line]
    assert sorted(line.split()[1] for line in lines) == ["0]", "1]"], result.stderr
    assert all("3 thread(s)" in line for line in lines), lines


def test_prepared_activations_are_shared_only_while_the_rows_are_unchanged(registries):
    """GEMVs reading one x (q, k, v) take the activations the first prepared; the same buffer
    written since (a row changed by one element, in place) is prepared again, never taken stale."""
    threads, k = registries[2], 576
    weights = [make_weight("q4_1", n, k, seed=n) for n in (576, 192, 192)]
    x = activations(1, k, seed=6)
    first = [gemm(threads, "libr4d", "q4_1", w.rows, k, 1, w, x) for w in weights]
    alone = [gemm(registries[1], "libr4d", "q4_1", w.rows, k, 1, w, x.copy()) for w in weights]
    for shared, single in zip(first, alone):
        np.testing.assert_array_equal(shared, single)
    x[0, 100] += 1.0  # in place: same address, new contents
    changed = gemm(threads, "libr4d", "q4_1", 576, k, 1, weights[0], x)
    fresh = gemm(registries[1], "libr4d", "q4_1", 576, k, 1, weights[0], x.copy())
    np.testing.assert_array_equal(changed, fresh)
    assert not np.array_equal(changed, first[0])
