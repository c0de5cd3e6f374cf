"""The engine's device-memory budget: over-allocation refused naming the sizes, the integrated-GPU
eighth, no allocation while a launch is issued, and frees given back."""

import pytest

from radiance.device import DeviceMemoryError, KernelArgs
from radiance.device.fake import FakeDevice

MiB = 1 << 20


@pytest.fixture(autouse=True)
def kernel_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIANCE_KERNEL_CACHE", str(tmp_path / "kernels"))


def test_an_allocation_over_the_budget_is_refused_naming_it_and_the_sizes():
    device = FakeDevice(device_bytes=64 * MiB)
    try:
        first = device.alloc(48 * MiB, "weights")
        with pytest.raises(DeviceMemoryError, match=r"'kv cache' of 32.00 MiB refused: 16.00 MiB of the 64.00 MiB"):
            device.alloc(32 * MiB, "kv cache")
        assert device.budget.used == 48 * MiB
        device.free(first)
        assert device.budget.used == 0
        device.free(device.alloc(64 * MiB, "kv cache"))  # exactly the budget fits
    finally:
        device.close()


def test_integrated_graphics_leave_an_eighth_of_host_ram_to_the_host():
    host = 8 * 1024 * MiB
    device = FakeDevice(device_bytes=16 * 1024 * MiB, integrated=True, host_bytes=host)
    assert device.budget.limit == host - host // 8
    with pytest.raises(DeviceMemoryError, match="an eighth of host RAM stays with the host"):
        device.budget.take(host - host // 8 + 1, "weights")
    device.budget.take(host - host // 8, "weights")  # the rest is usable


def test_a_discrete_card_is_budgeted_by_its_own_memory_not_host_ram():
    device = FakeDevice(device_bytes=141 << 30, integrated=False, host_bytes=8 << 30)
    assert device.budget.limit == 141 << 30


def test_no_allocation_while_a_launch_is_issued():
    def greedy(device, launch):
        device.alloc(MiB, "scratch of my own")
    device = FakeDevice({"greedy": greedy})
    try:
        kernel = device.kernel(device.load(device.compile('extern "C" __global__ void greedy() {}')), "greedy")
        with pytest.raises(DeviceMemoryError, match="'scratch of my own'.*inside the launch of 'greedy'.*scratch hook"):
            device.launch(kernel, 1, 1, KernelArgs("greedy").pack())
        assert device.budget.used == 0
    finally:
        device.close()


def test_a_failed_backend_allocation_gives_its_bytes_back():
    class Failing(FakeDevice):
        def _alloc(self, nbytes):
            raise OSError("no memory")
    device = Failing()
    with pytest.raises(OSError):
        device.alloc(MiB, "x")
    assert device.budget.used == 0
