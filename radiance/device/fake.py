"""A host-memory backend for tests: the sanctioned stand-in for a card in CI.

Memory is real host memory at real addresses: each allocation is a file in /dev/shm mapped into
the process, so an IPC handle (the file's name) opens in another process and both see the same
bytes, as two ranks see a card's IPC-mapped buffer. A mapped host word is the array itself. In a
rank of a launch (RADIANCE_RUN_ID set) the files are named as the run's segments,
`rad.<run>.fake.<pid>.<n>.<random>`, so the launcher's teardown (collectives.shm.unlink_run) sweeps
those of a rank it had to kill; elsewhere `radfake.<pid>.<n>.<random>`. A card's memory goes with its
process; these files would not, were nobody to sweep them.

"Compilation" turns HIP/CUDA-flavoured source into a PTX-like listing (`.entry` per
`__global__` function, `call.uni (retval0), vprintf` where it prints), so the launch rules run on
it; entry points a function-like macro defines (libr4d's allreduce.cu) are expanded first.
Launching a kernel calls the Python function registered under its name with the device and a
FakeLaunch. Streams run their work at once, in issue order; a stream being captured records it
instead, and an instantiated graph replays the records in order.

A rank process runs on a fake card only when a test asks (`RADIANCE_TEST_FAKE_CARD`, set by the
launcher for `RADIANCE_TEST_FAKE_CARDS`; launch/devices.py): `open_device` below then builds the
FakeDevice, its kernels' Python functions from the file `RADIANCE_TEST_FAKE_KERNELS` names
(a module with `kernels() -> {name: function}`; docs/DEVICE.md).
"""

from __future__ import annotations

import atexit
import bisect
import itertools
import json
import mmap
import os
import re
import secrets
import struct
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .base import Device, DeviceError, Kernel
from .kernel_args import PackedArgs

# an entry's name after its attributes: __launch_bounds__(...), and __cluster_dims__(...) or a macro in
# capitals standing for it (gemm_tma.cu's TM_CLUSTER_DIMS)
GLOBAL = re.compile(r"__global__\s+void\s+(?:(?:__cluster_dims__\s*\([^)]*\)|[A-Z][A-Z0-9_]*)\s+)?"
                    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)\s*\(")
MACRO = re.compile(r"^#define\s+([A-Za-z_]\w*)\(([^)]*)\)(.*)$", re.M)
KERNELS_VARIABLE = "RADIANCE_TEST_FAKE_KERNELS"
ALIGNMENT = 256  # like cudaMalloc, every allocation starts 256-byte aligned (an mmap is page aligned)


@dataclass(frozen=True)
class FakeKernel:
    fn: Callable
    static_shared: int = 0


@dataclass(frozen=True)
class FakeLaunch:
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: PackedArgs
    programmatic: bool


class FakeStream:
    def __init__(self):
        self.capture: list[Callable] | None = None  # the records while capturing


class FakeEvent:
    def __init__(self):
        self.ns: int | None = None


# This process's fake-card files not yet freed: unlinked at exit, so a process that ends without
# closing its card (a test that fails midway, say) leaves none in /dev/shm. A SIGKILL still does;
# in a launch the run's sweep takes those.
_LIVE_FILES: set = set()


@atexit.register
def _unlink_live_files() -> None:
    for name in list(_LIVE_FILES):
        try:
            os.unlink(f"/dev/shm/{name}")
        except OSError:
            pass
    _LIVE_FILES.clear()


def _allocation_prefix() -> str:
    """A launch's run owns a rank's fake-card files (the launcher sweeps rad.<run>.*); else radfake."""
    run = os.environ.get("RADIANCE_RUN_ID")
    return f"rad.{run}.fake" if run else "radfake"


class FakeDevice(Device):
    vendor = "fake"

    def __init__(self, kernels: dict[str, Callable | FakeKernel] | None = None, *, target: str = "fake_90",
                 device_bytes: int = 1 << 30, integrated: bool = False, host_bytes: int | None = None,
                 cache=None, compiler_version: str = "fake-4", ipc: bool = True, programmatic: bool = True):
        super().__init__(target=target, device_bytes=device_bytes, integrated=integrated,
                         compiler_version=compiler_version, host_bytes=host_bytes, cache=cache)
        self.kernels = {name: k if isinstance(k, FakeKernel) else FakeKernel(k) for name, k in (kernels or {}).items()}
        self.ipc, self.programmatic_launch = ipc, programmatic
        self.compiles = 0                   # how often the "compiler" ran (the cache tests count it)
        self.launches: list[FakeLaunch] = []  # every kernel that ran, in order
        self._starts: list[int] = []        # sorted region starts, for address lookup
        self._regions: dict[int, tuple[np.ndarray, object, str | None]] = {}  # start -> (bytes, mmap, file)
        self._counter = itertools.count()
        self._owned: set[int] = set()      # starts of our own allocations (their files are ours to unlink)
        self.default_stream = FakeStream()

    # ---- address space --------------------------------------------------------------------
    def _add_region(self, array: np.ndarray, mapping=None, name: str | None = None) -> int:
        start = array.ctypes.data
        bisect.insort(self._starts, start)
        self._regions[start] = (array, mapping, name)
        return start

    def _drop_region(self, start: int) -> None:
        array, mapping, name = self._regions.pop(start)
        self._starts.remove(start)
        del array
        if mapping is not None:
            mapping.close()

    def view(self, address: int, count: int, dtype=np.uint8) -> np.ndarray:
        """The memory at a device address, as a numpy view; an address no region holds is an error."""
        dtype = np.dtype(dtype)
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0:
            region = self._regions[self._starts[i]][0]
            offset = address - self._starts[i]
            if offset + count * dtype.itemsize <= region.nbytes:
                return region[offset:offset + count * dtype.itemsize].view(dtype)
        raise DeviceError(f"address {address:#x} (+{count * dtype.itemsize} bytes) is in no allocation")

    def _map_file(self, name: str, nbytes: int, create: bool) -> int:
        path = f"/dev/shm/{name}"
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, nbytes)
            mapping = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        return self._add_region(np.frombuffer(mapping, np.uint8), mapping, name)

    # ---- primitives ------------------------------------------------------------------------
    def _alloc(self, nbytes: int) -> int:
        name = f"{_allocation_prefix()}.{os.getpid()}.{next(self._counter)}.{secrets.token_hex(4)}"
        ptr = self._map_file(name, nbytes, create=True)
        self._owned.add(ptr)
        _LIVE_FILES.add(name)
        return ptr

    def _free(self, ptr: int) -> None:
        name = self._regions[ptr][2]
        self._drop_region(ptr)
        self._owned.discard(ptr)
        _LIVE_FILES.discard(name)
        os.unlink(f"/dev/shm/{name}")

    def export_handle(self, allocation) -> bytes:
        name = self._regions[allocation.ptr][2]
        return json.dumps({"name": name, "nbytes": allocation.nbytes}).encode()

    def _open_handle(self, handle: bytes) -> int:
        if not self.ipc:
            raise DeviceError("IPC handles cannot be opened on this (fake) device")
        record = json.loads(handle)
        return self._map_file(record["name"], record["nbytes"], create=False)

    def _close_handle(self, ptr: int) -> None:
        self._drop_region(ptr)

    def map_host(self, array: np.ndarray) -> int:
        return self._add_region(array.reshape(-1).view(np.uint8))

    def unmap_host(self, array: np.ndarray) -> None:
        self._drop_region(array.ctypes.data)

    def _enqueue(self, stream, work: Callable) -> None:
        stream = stream or self.default_stream
        if stream.capture is not None:
            stream.capture.append(work)
        else:
            work()

    def _copy_to_device(self, dst, src, nbytes, stream):
        data = src.reshape(-1).view(np.uint8).copy()  # the host array may change after the call
        self._enqueue(stream, lambda: self.view(dst, nbytes).__setitem__(slice(None), data))

    def _copy_to_host(self, dst, src, nbytes, stream):
        self._enqueue(stream, lambda: dst.reshape(-1).view(np.uint8).__setitem__(slice(None), self.view(src, nbytes)))

    def _copy_device(self, dst, src, nbytes, stream):
        self._enqueue(stream, lambda: self.view(dst, nbytes).__setitem__(slice(None), self.view(src, nbytes)))

    def _memset32(self, dst, value, count, stream):
        self._enqueue(stream, lambda: self.view(dst, 4 * count).view(np.uint32).__setitem__(slice(None), value))

    def stream(self) -> FakeStream:
        return FakeStream()

    def synchronize(self, stream=None) -> None:
        pass  # the work ran when it was issued

    def event(self) -> FakeEvent:
        return FakeEvent()

    def record(self, event, stream=None) -> None:
        self._enqueue(stream, lambda: setattr(event, "ns", time.perf_counter_ns()))

    def wait_event(self, stream, event) -> None:
        pass  # in-order, immediate execution: the event has already happened

    def elapsed_ms(self, start, end) -> float:
        if start.ns is None or end.ns is None:
            raise DeviceError("elapsed_ms: an event has not been recorded")
        return (end.ns - start.ns) / 1e6

    def _compile(self, source: str, options) -> bytes:
        self.compiles += 1
        source = expand_entry_macros(source)
        names = GLOBAL.findall(source)
        bodies = re.split(r"__global__", source)[1:]
        lines = [f"// fake code object for {self.target}"]
        for name, body in zip(names, bodies):
            lines.append(f".visible .entry {name}(")
            if re.search(r"\bprintf\s*\(", body):
                lines.append("\tcall.uni (retval0), vprintf, (param0, param1);")
        return "\n".join(lines).encode() + b"\n"

    def _load(self, code: bytes):
        if code.startswith(b"\x7fELF"):  # a real code object (a C plugin's cubin or AMD object): its functions
            return {name.encode() for name in elf_functions(code)}
        if code.startswith(BUNDLE_MAGIC):  # hipcc --genco's offload bundle: the device entries' functions
            return {name.encode() for image in bundle_images(code) for name in elf_functions(image)}
        return set(re.findall(rb"\.entry\s+(\w+)", code))

    def _function(self, module_handle, name: str):
        if name.encode() not in module_handle:
            raise DeviceError(f"kernel {name!r} is not in the module")
        if name not in self.kernels:
            raise DeviceError(f"kernel {name!r} has no Python function in the fake registry")
        return self.kernels[name], self.kernels[name].static_shared

    def _launch(self, kernel: Kernel, grid, block, shared_bytes, args, stream, programmatic):
        record = FakeLaunch(kernel.name, grid, block, shared_bytes, args, programmatic)

        def run():
            self.launches.append(record)
            kernel.handle.fn(self, record)
        self._enqueue(stream, run)

    def begin_capture(self, stream) -> None:
        if stream is None or stream.capture is not None:
            raise DeviceError("begin_capture needs a stream of our own that is not already capturing")
        stream.capture = []

    def end_capture(self, stream) -> list[Callable]:
        if stream.capture is None:
            raise DeviceError("end_capture on a stream that is not capturing")
        graph, stream.capture = stream.capture, None
        return graph

    def instantiate(self, graph) -> tuple[Callable, ...]:
        return tuple(graph)

    def launch_graph(self, graph_exec, stream=None) -> None:
        for work in graph_exec:
            self._enqueue(stream, work)

    def close(self) -> None:
        for start in list(self._starts):
            if start in self._owned:
                self._free(start)
            else:
                self._drop_region(start)


BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"


def bundle_images(code: bytes) -> list[bytes]:
    """The device ELFs of a clang offload bundle (magic, entry count, then offset, size, triple
    length and triple of each entry)."""
    (count,) = struct.unpack_from("<Q", code, len(BUNDLE_MAGIC))
    at, images = len(BUNDLE_MAGIC) + 8, []
    for _ in range(count):
        offset, size, length = struct.unpack_from("<QQQ", code, at)
        triple = code[at + 24:at + 24 + length]
        at += 24 + length
        if not triple.startswith(b"host") and code[offset:offset + 4] == b"\x7fELF":
            images.append(code[offset:offset + size])
    return images


def elf_functions(code: bytes) -> list[str]:
    """The defined function symbols of a 64-bit little-endian ELF (a cubin's kernels, an AMD code
    object's): what the fake card can launch of a code object a C plugin carries."""
    (shoff,) = struct.unpack_from("<Q", code, 0x28)
    entsize, count = struct.unpack_from("<HH", code, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", code, shoff + i * entsize) for i in range(count)]
    names = []
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, symsize in sections:
        if kind != 2 or not symsize:  # SHT_SYMTAB
            continue
        strtab = sections[link][4]
        for at in range(offset, offset + size, symsize):
            name_at, info, _other, shndx = struct.unpack_from("<IBBH", code, at)
            if info & 0xF == 2 and shndx != 0:  # STT_FUNC, defined
                end = code.index(b"\0", strtab + name_at)
                names.append(code[strtab + name_at:end].decode())
    return names


def expand_entry_macros(source: str) -> str:
    """The source with every function-like macro that defines a `__global__` entry expanded where
    it is invoked at the start of a line (text substitution of whole-word parameters and `##` pasting,
    as cpp does for these), and those macros' definitions dropped."""
    source = source.replace("\\\n", " ")
    macros = {m[1]: ([p.strip() for p in m[2].split(",")], m[3]) for m in MACRO.finditer(source)
              if "__global__" in m[3]}
    if not macros:
        return source
    out = []
    for line in source.splitlines():
        match = re.match(r"^\s*([A-Za-z_]\w*)\((.*)\)\s*;?\s*(//.*)?$", line)
        if line.startswith("#define") and MACRO.match(line) and MACRO.match(line)[1] in macros:
            continue
        if match and match[1] in macros:
            params, body = macros[match[1]]
            args = [a.strip() for a in match[2].split(",")]
            for param, arg in zip(params, args):
                body = re.sub(rf"\b{re.escape(param)}\b", arg, body)
            line = re.sub(r"\s*##\s*", "", body)  # token pasting: r4d_attend_##WHICH -> r4d_attend_fresh
        out.append(line)
    return "\n".join(out)


def open_device(**options) -> FakeDevice:
    """A rank's fake card (selection.py's backend "fake"): kernels from RADIANCE_TEST_FAKE_KERNELS."""
    path = os.environ.get(KERNELS_VARIABLE)
    kernels = {}
    if path:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_radiance_fake_kernels", path)
        if spec is None or not os.path.isfile(path):
            raise DeviceError(f"{KERNELS_VARIABLE}={path}: no such Python file")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        kernels = module.kernels()
    return FakeDevice(kernels, **options)
