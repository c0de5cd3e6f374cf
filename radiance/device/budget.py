"""The engine's budget of device memory. Every device allocation goes through it; a kernel never
allocates (its scratch comes from the `scratch` hook, sized at declare), so an allocation while a
launch is being issued is refused. On integrated graphics device memory is host memory, and the
budget leaves an eighth of host RAM to the host (the specification, "A library for a new card")."""

from __future__ import annotations

import os
from contextlib import contextmanager


class DeviceMemoryError(MemoryError):
    """An allocation the budget refuses; the message names the allocation and the sizes."""


def host_ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def show(nbytes: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes} B"


class DeviceBudget:
    def __init__(self, device_bytes: int, integrated: bool = False, host_bytes: int | None = None):
        self.integrated = integrated
        if integrated:
            host = host_bytes if host_bytes is not None else host_ram_bytes()
            self.limit = min(device_bytes, host - host // 8)
        else:
            self.limit = device_bytes
        self.used = 0
        self._launching: str | None = None

    @property
    def free(self) -> int:
        return self.limit - self.used

    def take(self, nbytes: int, label: str) -> None:
        if nbytes <= 0:
            raise ValueError(f"allocation {label!r}: {nbytes} bytes (must be positive)")
        if self._launching is not None:
            raise DeviceMemoryError(f"allocation {label!r} of {show(nbytes)} inside the launch of "
                                    f"{self._launching!r}: device memory for a launch comes from the scratch hook")
        if nbytes > self.free:
            why = " (integrated: an eighth of host RAM stays with the host)" if self.integrated else ""
            raise DeviceMemoryError(f"allocation {label!r} of {show(nbytes)} refused: {show(self.free)} of the "
                                    f"{show(self.limit)} device budget left{why}")
        self.used += nbytes

    def give(self, nbytes: int) -> None:
        self.used -= nbytes
        assert self.used >= 0, "more device memory given back than taken"

    @contextmanager
    def launching(self, kernel: str):
        """While a launch of `kernel` is being issued, no allocation is allowed."""
        previous, self._launching = self._launching, kernel
        try:
            yield
        finally:
            self._launching = previous
