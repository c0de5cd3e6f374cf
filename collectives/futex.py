"""Sleeping on a 32-bit word in shared memory until another process changes it: Linux futexes,
called through ctypes (which lets go of the GIL for the call, so a rank's heartbeat thread runs on).

A waiter passes the value it last saw; the kernel compares the word with it under its own lock and
sleeps only if they are equal, so a change made before the sleep is never missed: the writer stores
the new value, then wakes. The futexes are process-shared (no FUTEX_PRIVATE_FLAG): the word lives in
a mapping of a /dev/shm file that every process maps, which the kernel keys by the file's page.

Where there is no futex (another kernel, an unknown architecture), `wait` sleeps with
radiance.abi.rad_backoff's pauses instead and `wake` does nothing; callers re-read the word either way.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import time

from radiance.abi import rad_backoff

SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
FUTEX_WAIT = 0
FUTEX_WAKE = 1
WAKE_ALL = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _syscall():
    if SYS_FUTEX is None or not os.uname().sysname == "Linux":
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_long
    return function


_SYSCALL = _syscall()
available = _SYSCALL is not None


def wait(address: int, expected: int, timeout_s: float) -> None:
    """Sleep while the u32 at `address` holds `expected`, at most `timeout_s`; returns early on a wake,
    a signal, or a word that already differs. The caller reads the word again to know which."""
    if _SYSCALL is None:
        deadline = time.monotonic() + timeout_s
        word = ctypes.c_uint32.from_address(address)
        for _ in rad_backoff():
            if word.value != expected or time.monotonic() >= deadline:
                return
        return
    whole = int(timeout_s)
    timeout = _Timespec(whole, int((timeout_s - whole) * 1e9))
    result = _SYSCALL(ctypes.c_long(SYS_FUTEX), ctypes.c_void_p(address), ctypes.c_int(FUTEX_WAIT),
                      ctypes.c_uint32(expected & 0xFFFFFFFF), ctypes.byref(timeout), None, ctypes.c_uint32(0))
    if result == -1:
        code = ctypes.get_errno()
        if code not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
            raise OSError(code, f"futex wait: {os.strerror(code)}")


def wake(address: int) -> None:
    """Wake every process sleeping on the u32 at `address` (after the caller has changed it)."""
    if _SYSCALL is None:
        return
    result = _SYSCALL(ctypes.c_long(SYS_FUTEX), ctypes.c_void_p(address), ctypes.c_int(FUTEX_WAKE),
                      ctypes.c_int(WAKE_ALL), None, None, ctypes.c_uint32(0))
    if result == -1:
        code = ctypes.get_errno()
        raise OSError(code, f"futex wake: {os.strerror(code)}")
