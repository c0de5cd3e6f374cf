"""The launch rules the engine can check before a device kernel runs (the specification, "What a
launch may do"): at most 768 bytes of kernel arguments, at most 64 KiB of static plus dynamic
shared memory (LDS) per launch, and no device printf (a hostcall on AMD, `vprintf` on NVIDIA) or
assert (`__assertfail` on NVIDIA, `__assert_fail` through a hostcall on AMD). Every refusal is one
line that names the kernel."""

from __future__ import annotations

import re

from radiance.abi.constants import RAD_MAX_KERNEL_ARG_BYTES, RAD_MAX_SHARED_BYTES

MAX_KERNEL_ARG_BYTES = RAD_MAX_KERNEL_ARG_BYTES
MAX_SHARED_BYTES = RAD_MAX_SHARED_BYTES
ELF_MAGIC = b"\x7fELF"

# A PTX call of vprintf: `call.uni (retval0), vprintf, (...)`; nvcc may omit `.uni`.
PTX_PRINTF = re.compile(rb"\bcall(?:\.uni)?\s*\(\s*\w+\s*\)\s*,\s*vprintf\b")
PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$][\w$]*)")
# In a cubin, vprintf is an undefined symbol in the string table; in an AMD code object a kernel
# that prints takes a hidden hostcall (or printf) buffer argument in its metadata note.
ELF_PRINTF_MARKERS = (b"\x00vprintf\x00", b"hidden_hostcall_buffer", b"hidden_printf_buffer", b"__ockl_hostcall")
# A device assert: nvcc calls `__assertfail` (PTX: `call.uni __assertfail, (...)`), an undefined
# symbol of the cubin; an AMD assert reaches `__assert_fail`, a hostcall (caught above as well).
ELF_ASSERT_MARKERS = (b"\x00__assertfail\x00", b"\x00__assert_fail\x00")
PTX_ASSERT = re.compile(rb"\bcall(?:\.uni)?\s*(?:\(\s*\w+\s*\)\s*,\s*)?__assertfail\b")


class LaunchRuleError(RuntimeError):
    """A kernel the engine refuses to launch; the message names the kernel and the rule."""


def check_arg_bytes(kernel: str, nbytes: int) -> None:
    if nbytes > MAX_KERNEL_ARG_BYTES:
        raise LaunchRuleError(f"kernel {kernel!r}: {nbytes} bytes of kernel arguments, "
                              f"over the {MAX_KERNEL_ARG_BYTES}-byte limit")


def check_shared(kernel: str, static_bytes: int, dynamic_bytes: int) -> None:
    if dynamic_bytes < 0:
        raise LaunchRuleError(f"kernel {kernel!r}: negative dynamic shared memory ({dynamic_bytes})")
    total = static_bytes + dynamic_bytes
    if total > MAX_SHARED_BYTES:
        raise LaunchRuleError(f"kernel {kernel!r}: {static_bytes} static + {dynamic_bytes} dynamic = "
                              f"{total} bytes of shared memory, over the {MAX_SHARED_BYTES}-byte (64 KiB) limit")


def _ptx_body(code: bytes, kernel: str) -> bytes:
    """The text of one `.entry` in PTX, up to the next entry; the whole text if it is not found."""
    entries = list(PTX_ENTRY.finditer(code))
    for i, match in enumerate(entries):
        if match.group(1).decode() == kernel:
            end = entries[i + 1].start() if i + 1 < len(entries) else len(code)
            return code[match.start():end]
    return code


def uses_device_printf(code: bytes, kernel: str | None = None) -> bool:
    """Whether `kernel` (PTX text: that entry alone) or the code object (an ELF: cubin or AMD
    code object, as a whole, since symbols are not attributed to kernels here) prints."""
    if code.startswith(ELF_MAGIC):
        return any(marker in code for marker in ELF_PRINTF_MARKERS)
    text = _ptx_body(code, kernel) if kernel else code
    return PTX_PRINTF.search(text) is not None


def uses_device_assert(code: bytes, kernel: str | None = None) -> bool:
    """Whether `kernel` (PTX: that entry alone) or the code object (an ELF, as a whole) asserts."""
    if code.startswith(ELF_MAGIC):
        return any(marker in code for marker in ELF_ASSERT_MARKERS)
    return PTX_ASSERT.search(_ptx_body(code, kernel) if kernel else code) is not None


def check_no_printf(kernel: str, code: bytes) -> None:
    """The printf and the assert rule: neither may run in a launch."""
    where = "its code object" if code.startswith(ELF_MAGIC) else "its PTX"
    if uses_device_printf(code, kernel):
        raise LaunchRuleError(f"kernel {kernel!r}: device printf ({where} calls vprintf or a hostcall); "
                              "a launch may not print")
    if uses_device_assert(code, kernel):
        raise LaunchRuleError(f"kernel {kernel!r}: device assert ({where} calls __assertfail or "
                              "__assert_fail); a launch may not assert (build with -DNDEBUG)")
