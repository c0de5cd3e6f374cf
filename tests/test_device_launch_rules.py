"""The launch rules the engine checks: shared memory (static + dynamic) and device printf, each
refusal naming the kernel; the 768-byte argument rule at launch."""

import pytest

from radiance.device import DeviceError, KernelArgs, LaunchRuleError, PackedArgs
from radiance.device.fake import FakeDevice, FakeKernel
from radiance.device.launch_rules import uses_device_printf

PTX = b"""
.version 8.0
.target sm_90
.extern .func (.param .b32 func_retval0) vprintf (.param .b64 vprintf_param_0, .param .b64 vprintf_param_1);
.visible .entry quiet(.param .u64 quiet_param_0)
{
\tret;
}
.visible .entry noisy(.param .u64 noisy_param_0)
{
\t{
\t.param .b64 param0;
\t.param .b32 retval0;
\tcall.uni (retval0), vprintf, (param0, param1);
\t}
\tret;
}
"""


@pytest.fixture(autouse=True)
def kernel_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIANCE_KERNEL_CACHE", str(tmp_path / "kernels"))


def kernel_of(device, name):
    return device.kernel(device.load(device.compile(f'extern "C" __global__ void {name}() {{}}')), name)


def test_printf_is_found_in_the_entry_that_calls_vprintf_and_only_there():
    assert uses_device_printf(PTX, "noisy")
    assert not uses_device_printf(PTX, "quiet")
    assert uses_device_printf(PTX)  # the module as a whole prints


def test_a_printing_kernel_is_refused_at_load_naming_it():
    device = FakeDevice({"noisy": lambda d, l: None, "quiet": lambda d, l: None})
    module = device.load(device.compile('extern "C" __global__ void quiet() {}\n'
                                        'extern "C" __global__ void noisy(int x) { printf("%d", x); }'))
    device.kernel(module, "quiet")
    with pytest.raises(LaunchRuleError, match=r"kernel 'noisy': device printf \(its PTX calls vprintf"):
        device.kernel(module, "noisy")
    # The same rule on the PTX text nvrtc would produce:
    from radiance.device.base import Module
    with pytest.raises(LaunchRuleError, match="kernel 'noisy'"):
        device.kernel(Module(None, PTX), "noisy")


def test_code_objects_are_checked_as_a_whole_for_vprintf_or_a_hostcall():
    assert uses_device_printf(b"\x7fELF" + b"\0" * 8 + b".strtab\0vprintf\0", "k")
    assert uses_device_printf(b"\x7fELF" + b".value_kind: hidden_hostcall_buffer", "k")
    assert not uses_device_printf(b"\x7fELF" + b"\0my_vprintf_free_kernel\0", "k")


def test_static_plus_dynamic_shared_memory_over_64_kib_is_refused_naming_the_kernel():
    device = FakeDevice({"tiled": FakeKernel(lambda d, l: None, static_shared=16 * 1024)})
    kernel = kernel_of(device, "tiled")
    device.launch(kernel, 1, 1, KernelArgs("tiled").pack(), shared_bytes=48 * 1024)  # exactly 64 KiB
    with pytest.raises(LaunchRuleError, match=r"kernel 'tiled': 16384 static \+ 49156 dynamic = 65540 bytes"):
        device.launch(kernel, 1, 1, KernelArgs("tiled").pack(), shared_bytes=48 * 1024 + 4)
    assert len(device.launches) == 1


def test_arguments_over_768_bytes_are_refused_at_launch_too():
    device = FakeDevice({"wide": lambda d, l: None})
    kernel = kernel_of(device, "wide")
    with pytest.raises(LaunchRuleError, match="kernel 'wide': 800 bytes"):
        device.launch(kernel, 1, 1, PackedArgs("wide", bytes(800), (0,)))
    assert device.launches == []


def test_arguments_packed_for_another_kernel_are_refused():
    device = FakeDevice({"a": lambda d, l: None})
    with pytest.raises(DeviceError, match="kernel 'a' launched with arguments packed for 'b'"):
        device.launch(kernel_of(device, "a"), 1, 1, KernelArgs("b").pack())


def test_a_programmatic_launch_on_a_card_without_it_is_refused_naming_the_kernel():
    device = FakeDevice({"chained_r4dchain": lambda d, l: None}, programmatic=False, target="gfx942")
    with pytest.raises(DeviceError, match="kernel 'chained_r4dchain': programmatic dependent launch needs NVIDIA"):
        device.launch(kernel_of(device, "chained_r4dchain"), 1, 1, KernelArgs("chained_r4dchain").pack(),
                      programmatic=True)


def test_a_device_assert_is_refused_like_a_printf():
    """nvcc leaves `__assertfail` undefined in a cubin that asserts; its PTX calls it."""
    from radiance.device.launch_rules import check_no_printf, uses_device_assert

    assert uses_device_assert(b"\x7fELF" + b"\0" * 8 + b".strtab\0__assertfail\0", "k")
    assert not uses_device_assert(b"\x7fELF" + b"\0my__assertfail_free\0", "k")
    assert uses_device_assert(b".visible .entry k(\n\tcall.uni __assertfail, (param0, param1);\n", "k")
    with pytest.raises(LaunchRuleError, match=r"kernel 'k': device assert \(its code object calls __assertfail"):
        check_no_printf("k", b"\x7fELF" + b"\0" * 8 + b"\0__assert_fail\0")
