"""The fake backend as the stand-in for a card: copies, launch semantics and argument packing,
graph capture replaying launches in order, events, IPC handles (in one process and across two),
mapped host words."""

import multiprocessing as mp
import struct

import numpy as np
import pytest

from radiance.device import KernelArgs
from radiance.device.fake import FakeDevice

SOURCE = 'extern "C" __global__ void axpb(float* x, int n, float a, float b) { }'


@pytest.fixture(autouse=True)
def kernel_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIANCE_KERNEL_CACHE", str(tmp_path / "kernels"))


def axpb(device, launch):
    """x = a*x + b over n floats, reading its arguments from the packed block as C would."""
    ptr, n, a, b = struct.unpack_from("<Qiff", launch.args.data)
    x = device.view(ptr, n, np.float32)
    x[:] = a * x + b


@pytest.fixture
def device():
    fake = FakeDevice({"axpb": axpb})
    yield fake
    fake.close()


def launch_axpb(device, kernel, x, a, b, stream=None):
    device.launch(kernel, (1,), (64,), KernelArgs("axpb").pointer(x).i32(4).f32(a).f32(b).pack(), stream=stream)


def test_copies_round_trip_host_device_device_host(device):
    x, y = device.alloc(16, "x"), device.alloc(16, "y")
    device.copy_to_device(x, np.arange(4, dtype=np.float32))
    device.copy_device(y, x, 16)
    out = np.zeros(4, np.float32)
    device.copy_to_host(out, y)
    device.synchronize()
    assert out.tolist() == [0, 1, 2, 3]


def test_a_launch_reads_its_packed_arguments(device):
    kernel = device.kernel(device.load(device.compile(SOURCE)), "axpb")
    x = device.alloc(16, "x")
    device.copy_to_device(x, np.ones(4, np.float32))
    launch_axpb(device, kernel, x, 3.0, 1.0)
    out = np.zeros(4, np.float32)
    device.copy_to_host(out, x)
    assert out.tolist() == [4, 4, 4, 4]
    [record] = device.launches
    assert (record.grid, record.block, record.shared_bytes) == ((1, 1, 1), (64, 1, 1), 0)


def test_graph_capture_records_without_running_and_replays_in_order(device):
    kernel = device.kernel(device.load(device.compile(SOURCE)), "axpb")
    x = device.alloc(16, "x")
    device.copy_to_device(x, np.zeros(4, np.float32))
    stream = device.stream()
    device.begin_capture(stream)
    for a, b in ((2.0, 1.0), (3.0, 0.0), (1.0, 5.0)):  # order matters: ((0*2+1)*3+0)*1+5 = 8
        launch_axpb(device, kernel, x, a, b, stream)
    graph = device.end_capture(stream)
    out = np.zeros(4, np.float32)
    device.copy_to_host(out, x)
    assert out.tolist() == [0, 0, 0, 0] and device.launches == []  # captured, not run
    graph_exec = device.instantiate(graph)
    device.launch_graph(graph_exec, stream)
    device.copy_to_host(out, x)
    assert out.tolist() == [8, 8, 8, 8]
    device.launch_graph(graph_exec, stream)  # ((8*2+1)*3)+5 = 56
    device.copy_to_host(out, x)
    assert out.tolist() == [56, 56, 56, 56]
    assert [(l.args.data[12:20]) for l in device.launches[:3]] == [struct.pack("<ff", 2, 1), struct.pack("<ff", 3, 0),
                                                                   struct.pack("<ff", 1, 5)]


def test_events_time_the_work_between_them(device):
    start, end = device.event(), device.event()
    device.record(start)
    device.copy_to_device(device.alloc(1 << 20, "x"), np.ones(1 << 18, np.float32))
    device.record(end)
    assert device.elapsed_ms(start, end) >= 0


def test_an_ipc_handle_opens_the_same_bytes(device):
    x = device.alloc(4096, "x")
    handle = device.export_handle(x)
    peer = FakeDevice()
    try:
        mapped = peer.open_handle(handle, 4096, "x of the peer")
        peer.copy_to_device(mapped, np.full(1024, 7, np.int32))
        out = np.zeros(1024, np.int32)
        device.copy_to_host(out, x)
        assert (out == 7).all() and mapped.peer
        peer.close_handle(mapped)
    finally:
        peer.close()


def _child_writes_through_handle(handle, nbytes, done):
    peer = FakeDevice()
    mapped = peer.open_handle(handle, nbytes, "parent's buffer")
    peer.copy_to_device(mapped.ptr + 8, np.array([0xC0FFEE], np.uint64))
    peer.close_handle(mapped)
    peer.close()
    done.put("ok")


def test_an_ipc_handle_opens_in_another_process(device):
    x = device.alloc(64, "x")
    device.copy_to_device(x, np.zeros(8, np.uint64))
    context = mp.get_context("spawn")
    done = context.Queue()
    child = context.Process(target=_child_writes_through_handle, args=(device.export_handle(x), 64, done))
    child.start()
    assert done.get(timeout=60) == "ok"
    child.join(timeout=60)
    out = np.zeros(8, np.uint64)
    device.copy_to_host(out, x)
    assert out[1] == 0xC0FFEE and out[0] == 0


def test_a_mapped_host_word_is_stored_by_a_kernel_and_read_on_the_host():
    def bump(device, launch):
        (word, value) = struct.unpack_from("<QQ", launch.args.data)
        device.view(word, 1, np.uint64)[0] = value
    device = FakeDevice({"bump": bump})
    try:
        words = np.zeros(8, np.uint64)  # stands in for a shared-memory segment's words
        address = device.map_host(words)
        kernel = device.kernel(device.load(device.compile('extern "C" __global__ void bump(){}')), "bump")
        device.launch(kernel, 1, 1, KernelArgs("bump").pointer(address + 3 * 8).u64(41).pack())
        assert words[3] == 41
        device.unmap_host(words)
    finally:
        device.close()


def test_an_address_outside_every_allocation_is_an_error(device):
    x = device.alloc(16, "x")
    with pytest.raises(Exception, match="is in no allocation"):
        device.view(x.ptr + 8, 4, np.float32)



def test_a_process_that_exits_without_closing_its_fake_card_leaves_no_file():
    """Its allocations are files in /dev/shm; an exit that skips close() (a test failing midway) still
    unlinks them (a suite run once left 30 of one process behind)."""
    import os
    import subprocess
    import sys

    code = ("import os\nfrom radiance.device.fake import FakeDevice\n"
            "allocation = FakeDevice().alloc(4096, 'left open')\n"
            "print(os.getpid(), flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pid = done.stdout.strip()
    assert pid and not [name for name in os.listdir("/dev/shm") if name.startswith(f"radfake.{pid}.")]
