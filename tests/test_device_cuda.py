"""The cuda backend on a real NVIDIA card: every kernel compiled by nvrtc at run time. Skipped, with
the reason, where cuda-bindings or a visible card is missing (CI has none). Run on the lent H200 by
bench/device_smoke.py."""

import mmap
import multiprocessing as mp
import os
import secrets
import time

import numpy as np
import pytest


def _card_reason():
    try:
        from cuda.bindings import driver
    except ImportError:
        return "cuda-bindings is not installed (pip install 'radiance[cuda]')"
    try:
        (err,) = driver.cuInit(0)
        if int(err) != 0:
            return f"no usable NVIDIA driver (cuInit: {err})"
        err, count = driver.cuDeviceGetCount()
        return None if int(err) == 0 and count > 0 else "no NVIDIA card is visible"
    except Exception as error:  # the driver library itself is absent
        return f"no NVIDIA driver: {type(error).__name__}: {error}"


REASON = _card_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))

SOURCE = r"""
struct RadChainRec { unsigned long long wait_word, wait_value, bump_word, bump_value; };

extern "C" __global__ void axpb(float* x, int n, float a, float b) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = a * x[i] + b;
}

extern "C" __global__ void noop() {}

extern "C" __global__ void tiled(float* out) {
    __shared__ float tile[4096];                  // 16 KiB static
    extern __shared__ float dynamic_tile[];
    tile[threadIdx.x] = threadIdx.x;
    dynamic_tile[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = tile[threadIdx.x] + dynamic_tile[threadIdx.x];
}

// words[0] is set by another process; the kernel then stores 42 into words[1] (0xdead on timeout).
extern "C" __global__ void wait_then_store(volatile unsigned long long* words, unsigned long long limit) {
    unsigned long long spins = 0;
    while (words[0] == 0 && spins < limit) { __nanosleep(1000); ++spins; }
    words[1] = words[0] ? 42ull : 0xdeadull;
    __threadfence_system();
}

// A chained kernel: the RadChainRec by value at offset 0 of its arguments.
extern "C" __global__ void scale_r4dchain(RadChainRec chain, float* x, int n) {
    volatile unsigned long long* wait = (volatile unsigned long long*)chain.wait_word;
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        unsigned long long spins = 0;
        while (*wait < chain.wait_value && spins < 20000000ull) { __nanosleep(1000); ++spins; }
    }
    __syncthreads();
    int i = threadIdx.x;
    if (i < n) x[i] *= 2.0f;
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) *(volatile unsigned long long*)chain.bump_word = chain.bump_value;
}

extern "C" __global__ void produce(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i;
    for (int k = 0; k < 200; ++k) v = v * 1.0000001f + 0.0f;   // some work before the trigger
    if (i < n) x[i] = (float)i;
    asm volatile("griddepcontrol.launch_dependents;");
}

extern "C" __global__ void consume(const float* x, float* y, int n) {
    asm volatile("griddepcontrol.wait;" ::: "memory");        // Hopper: wait for the primary grid
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + 1.0f;
}
"""

PRINTS = r'extern "C" __global__ void noisy(int v) { printf("%d\n", v); }'


@pytest.fixture(scope="module")
def device(tmp_path_factory):
    from radiance.device import CompileCache
    from radiance.device.cuda import CudaDevice
    card = CudaDevice(cache=CompileCache(tmp_path_factory.mktemp("kernels")))
    yield card
    card.close()


@pytest.fixture(scope="module")
def module(device):
    return device.load(device.compile(SOURCE))


def test_alloc_and_copies_round_trip(device):
    data = np.random.default_rng(1).integers(0, 256, 64 << 20, dtype=np.uint8)
    a, b = device.alloc(data.nbytes, "a"), device.alloc(data.nbytes, "b")
    device.copy_to_device(a, data)
    device.copy_device(b, a, data.nbytes)
    back = np.empty_like(data)
    device.copy_to_host(back, b)
    device.synchronize()
    assert np.array_equal(back, data)
    device.free(a), device.free(b)
    assert device.target.startswith("sm_") and device.budget.used == 0


def test_the_budget_refuses_before_the_driver_is_asked(device):
    from radiance.device import DeviceMemoryError
    with pytest.raises(DeviceMemoryError, match="'everything' of"):
        device.alloc(device.budget.limit + 1, "everything")


def test_nvrtc_compiles_a_kernel_that_runs_and_the_cache_hits(device, module):
    kernel = device.kernel(module, "axpb")
    from radiance.device import KernelArgs
    x = device.alloc(4096 * 4, "x")
    values = np.random.default_rng(2).standard_normal(4096).astype(np.float32)
    device.copy_to_device(x, values)
    device.launch(kernel, 16, 256, KernelArgs("axpb").pointer(x).i32(4096).f32(3.0).f32(0.5).pack())
    out = np.empty_like(values)
    device.copy_to_host(out, x)
    device.synchronize()
    np.testing.assert_array_equal(out, np.float32(3.0) * values + np.float32(0.5))
    device.compile(SOURCE)
    assert device.cache.last == "hit"
    device.free(x)


def test_printf_and_shared_memory_rules_on_real_code_objects(device, module):
    from radiance.device import KernelArgs, LaunchRuleError
    with pytest.raises(LaunchRuleError, match="kernel 'noisy': device printf"):
        device.kernel(device.load(device.compile(PRINTS)), "noisy")
    tiled = device.kernel(module, "tiled")
    assert tiled.static_shared == 16384
    out = device.alloc(256 * 4, "out")
    device.launch(tiled, 1, 256, KernelArgs("tiled").pointer(out).pack(), shared_bytes=48 * 1024)  # 64 KiB total
    device.synchronize()
    with pytest.raises(LaunchRuleError, match="kernel 'tiled'"):
        device.launch(tiled, 1, 256, KernelArgs("tiled").pointer(out).pack(), shared_bytes=48 * 1024 + 4)
    device.free(out)


def test_events_time_a_copy(device):
    a, b = device.alloc(256 << 20, "a"), device.alloc(256 << 20, "b")
    start, end = device.event(), device.event()
    device.record(start)
    device.copy_device(b, a, 256 << 20)
    device.record(end)
    assert 0 < device.elapsed_ms(start, end) < 1000
    device.free(a), device.free(b)


def test_graph_capture_replays_launches_in_order(device, module):
    from radiance.device import KernelArgs
    kernel = device.kernel(module, "axpb")
    x = device.alloc(1024 * 4, "x")
    device.copy_to_device(x, np.zeros(1024, np.float32))
    device.synchronize()
    stream = device.stream()
    device.begin_capture(stream)
    for a, b in ((2.0, 1.0), (3.0, 0.0), (1.0, 5.0)):
        device.launch(kernel, 4, 256, KernelArgs("axpb").pointer(x).i32(1024).f32(a).f32(b).pack(), stream=stream)
    graph_exec = device.instantiate(device.end_capture(stream))
    out = np.empty(1024, np.float32)
    device.copy_to_host(out, x, stream)
    device.synchronize(stream)
    assert (out == 0).all()  # captured, not run
    device.launch_graph(graph_exec, stream)
    device.launch_graph(graph_exec, stream)
    device.copy_to_host(out, x, stream)
    device.synchronize(stream)
    assert (out == 56).all()  # ((0*2+1)*3+0)+5 = 8, then ((8*2+1)*3)+5 = 56
    device.free(x)


def _set_word_later(path, delay):
    time.sleep(delay)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 4096) as mapping:
        np.frombuffer(mapping, np.uint64)[0] = 1
        del mapping


def _shm_words(nbytes=4096):
    path = f"/dev/shm/radtest.{os.getpid()}.{secrets.token_hex(4)}"
    with open(path, "wb") as f:
        f.truncate(nbytes)
    f = open(path, "r+b")
    mapping = mmap.mmap(f.fileno(), nbytes)
    f.close()
    return path, mapping, np.frombuffer(mapping, np.uint64)


def test_a_mapped_shared_memory_word_crosses_processes_both_ways(device, module):
    from radiance.device import KernelArgs
    path, mapping, words = _shm_words()
    try:
        address = device.map_host(words)
        device.launch(device.kernel(module, "wait_then_store"), 1, 1,
                      KernelArgs("wait_then_store").pointer(address).u64(20_000_000).pack())
        child = mp.get_context("spawn").Process(target=_set_word_later, args=(path, 0.3))
        child.start()
        deadline = time.monotonic() + 30
        while words[1] == 0 and time.monotonic() < deadline:  # read on the host while the kernel runs
            time.sleep(0.001)
        device.synchronize()
        child.join(timeout=30)
        assert int(words[1]) == 42
        device.unmap_host(words)
    finally:
        del words
        mapping.close()
        os.unlink(path)


def test_a_chain_record_at_offset_0_waits_and_bumps_on_the_card(device, module):
    from radiance.device import KernelArgs, write_chain
    path, mapping, words = _shm_words()
    try:
        address = device.map_host(words)
        x = device.alloc(64 * 4, "x")
        device.copy_to_device(x, np.ones(64, np.float32))
        device.synchronize()
        args = write_chain(KernelArgs("scale_r4dchain").chain().pointer(x).i32(64).pack(),
                           wait_word=address, wait_value=7, bump_word=address + 64, bump_value=9)
        device.launch(device.kernel(module, "scale_r4dchain"), 1, 64, args)
        time.sleep(0.2)
        assert int(words[8]) == 0  # still waiting in its prologue
        words[0] = 7
        device.synchronize()
        assert int(words[8]) == 9
        out = np.empty(64, np.float32)
        device.copy_to_host(out, x)
        device.synchronize()
        assert (out == 2).all()
        device.unmap_host(words)
        device.free(x)
    finally:
        del words
        mapping.close()
        os.unlink(path)


def _open_in_child(handle, nbytes, results):
    from radiance.device import CompileCache
    from radiance.device.cuda import CudaDevice
    import tempfile
    card = CudaDevice(cache=CompileCache(tempfile.mkdtemp()))
    peer = card.open_handle(handle, nbytes, "parent's buffer")
    seen = np.empty(nbytes, np.uint8)
    card.copy_to_host(seen, peer)
    card.copy_to_device(peer, (np.arange(nbytes) % 251).astype(np.uint8))
    card.synchronize()
    results.put(bytes(seen[:16]))
    card.close_handle(peer)
    card.close()


def test_an_ipc_handle_opens_in_another_process_on_the_same_card(device):
    nbytes = 1 << 20
    x = device.alloc(nbytes, "shared")
    device.copy_to_device(x, np.full(nbytes, 0xAB, np.uint8))
    device.synchronize()
    context = mp.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_open_in_child, args=(device.export_handle(x), nbytes, results))
    child.start()
    assert results.get(timeout=120) == b"\xab" * 16
    child.join(timeout=60)
    assert child.exitcode == 0
    back = np.empty(nbytes, np.uint8)
    device.copy_to_host(back, x)
    device.synchronize()
    assert np.array_equal(back, (np.arange(nbytes) % 251).astype(np.uint8))
    device.free(x)


def test_a_programmatic_dependent_launch_waits_with_griddepcontrol(device, module):
    from radiance.device import KernelArgs
    if not device.programmatic_launch:
        pytest.skip(f"{device.target} has no programmatic dependent launch (needs sm_90)")
    n = 1 << 22
    x, y = device.alloc(n * 4, "x"), device.alloc(n * 4, "y")
    produce, consume = device.kernel(module, "produce"), device.kernel(module, "consume")
    for _ in range(3):
        device.copy_to_device(x, np.zeros(n, np.float32))
        device.launch(produce, n // 256, 256, KernelArgs("produce").pointer(x).i32(n).pack())
        device.launch(consume, n // 256, 256, KernelArgs("consume").pointer(x).pointer(y).i32(n).pack(), programmatic=True)
        out = np.empty(n, np.float32)
        device.copy_to_host(out, y)
        device.synchronize()
        np.testing.assert_array_equal(out, np.arange(n, dtype=np.float32) + 1)
    device.free(x), device.free(y)
