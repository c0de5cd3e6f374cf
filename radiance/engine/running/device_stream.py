"""The engine's RadStream on a card: a device row's only way to the card. Modules are compiled
(through the device's disk cache) and loaded once per source; a kernel handle is a dict lookup
after the first launch, so a captured decode step pays nothing for it."""

from __future__ import annotations

from typing import Sequence

from radiance.abi import PackedArgs, RadStream


class EngineStream(RadStream):
    def __init__(self, device, handle=None):
        self.device = device
        self.handle = handle if handle is not None else device.stream()
        self.vendor, self.target = device.vendor, device.target
        self.multiprocessors = int(getattr(device, "multiprocessors", 1))
        self._modules: dict = {}
        self._kernels: dict = {}
        self.programmatic = False  # set by the executor around a chained row's launch

    def kernel(self, source: str, name: str, options: Sequence[str] = ()):
        key = (name, source, tuple(options))
        kernel = self._kernels.get(key)
        if kernel is None:
            module_key = (source, tuple(options))
            module = self._modules.get(module_key)
            if module is None:
                module = self._modules[module_key] = self.device.load(self.device.compile(source, tuple(options)))
            kernel = self._kernels[key] = self.device.kernel(module, name)
        return kernel

    def launch(self, kernel, grid, block, args: PackedArgs, shared_bytes: int = 0) -> None:
        self.device.launch(kernel, grid, block, args, shared_bytes, stream=self.handle, programmatic=self.programmatic)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self.device.copy_device(dst, src, nbytes, self.handle)

    def memset32(self, dst: int, value: int, count: int) -> None:
        self.device.memset32(dst, value, count, self.handle)

    def synchronize(self) -> None:
        """The engine's, between steps; a row never calls it."""
        self.device.synchronize(self.handle)
