"""The engine's RadStream on a card: a device row's only way to the card. Modules are compiled
(through the device's disk cache) and loaded once per source, or per code object a C plugin
carries (`module`: an ELF loads as it is, source text compiles first); a kernel handle is a dict
lookup after the first launch, so a captured decode step pays nothing for it."""

from __future__ import annotations

from typing import Sequence

from radiance.abi import PackedArgs, RadStream

# An ELF (a cubin, an AMD code object) or a clang offload bundle loads as it is; other bytes are source.
BINARY_MAGICS = (b"\x7fELF", b"__CLANG_OFFLOAD_BUNDLE__")


class EngineStream(RadStream):
    def __init__(self, device, handle=None):
        self.device = device
        self.handle = handle if handle is not None else device.stream()
        self.vendor, self.target = device.vendor, device.target
        self.multiprocessors = int(getattr(device, "multiprocessors", 1))
        self._modules: dict = {}
        self._kernels: dict = {}
        self._images: dict = {}  # (code object, options) -> module
        self._functions: dict = {}  # (module, name) -> kernel
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

    def module(self, image: bytes, options: Sequence[str] = ()):
        key = (bytes(image), tuple(options))
        module = self._images.get(key)
        if module is None:
            if image.startswith(BINARY_MAGICS):
                module = self.device.load(image)
            else:
                try:
                    source = bytes(image).decode()
                except UnicodeDecodeError:
                    raise ValueError(f"a code object of {len(image)} bytes is neither an ELF, an offload "
                                     f"bundle nor source text") from None
                module = self.device.load(self.device.compile(source, tuple(options)))
            self._images[key] = module
        return module

    def function(self, module, name: str):
        key = (id(module), name)
        kernel = self._functions.get(key)
        if kernel is None:
            kernel = self._functions[key] = self.device.kernel(module, name)
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
