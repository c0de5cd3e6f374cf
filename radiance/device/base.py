"""The device interface: one small abstract class, the same call shapes for every backend.

The public methods here enforce what the engine can check on any card (the memory budget, the
compile cache, the launch rules, argument/kernel agreement) and then call a backend's primitive
(the underscore methods). A backend (cuda.py, hip.py, fake.py) implements only the primitives, so
every rule is exercised by the host tests through the fake backend.

Handles (streams, events, modules, graphs) are opaque objects of the backend; device addresses are
ints. `stream=None` means the device's own default stream (a non-blocking stream it creates).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .budget import DeviceBudget, DeviceMemoryError  # noqa: F401  (re-exported)
from .compile_cache import CompileCache
from .kernel_args import PackedArgs
from .launch_rules import LaunchRuleError, check_arg_bytes, check_no_printf, check_shared  # noqa: F401


class DeviceError(RuntimeError):
    """A driver call that failed, or a use of the device layer it refuses; one line, naming what."""


@dataclass(frozen=True)
class Allocation:
    ptr: int
    nbytes: int
    label: str
    peer: bool = False  # opened from a peer's IPC handle: not ours to free, not in our budget


@dataclass(frozen=True)
class Module:
    handle: Any
    code: bytes


@dataclass(frozen=True)
class Kernel:
    name: str
    handle: Any
    static_shared: int
    module: Module = field(repr=False)


def _dim3(value: int | Sequence[int], what: str) -> tuple[int, int, int]:
    dims = (int(value),) if isinstance(value, (int, np.integer)) else tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3 or min(dims) < 1:
        raise ValueError(f"{what} {value!r}: one to three positive extents")
    return dims + (1,) * (3 - len(dims))


def _address(value) -> int:
    return int(getattr(value, "ptr", value))


class Device(ABC):
    vendor = ""                     # "cuda", "hip" or "fake"
    programmatic_launch = False     # NVIDIA Hopper programmatic dependent launch

    def __init__(self, *, target: str, device_bytes: int, integrated: bool, compiler_version: str,
                 host_bytes: int | None = None, cache: CompileCache | None = None):
        self.target = target                        # "sm_90", "gfx942", ...
        self.integrated = integrated
        self.compiler_version = compiler_version
        self.budget = DeviceBudget(device_bytes, integrated, host_bytes)
        self.cache = cache if cache is not None else CompileCache()

    def bind_thread(self) -> None:
        """Make this card current in the calling thread (a backend with per-thread state overrides)."""

    # ---- memory -------------------------------------------------------------------------
    def alloc(self, nbytes: int, label: str) -> Allocation:
        self.budget.take(nbytes, label)
        try:
            return Allocation(self._alloc(nbytes), nbytes, label)
        except BaseException:
            self.budget.give(nbytes)
            raise

    def free(self, allocation: Allocation) -> None:
        if allocation.peer:
            raise DeviceError(f"allocation {allocation.label!r} was opened from a peer: close_handle it")
        self._free(allocation.ptr)
        self.budget.give(allocation.nbytes)

    def launching(self, kernel: str):
        """Context manager around issuing a launch: an allocation inside it is refused."""
        return self.budget.launching(kernel)

    # ---- copies (asynchronous on the stream) --------------------------------------------
    def copy_to_device(self, dst, src: np.ndarray, stream=None) -> None:
        src = np.ascontiguousarray(src)
        self._copy_to_device(_address(dst), src, src.nbytes, stream)

    def copy_to_host(self, dst: np.ndarray, src, stream=None) -> None:
        if not dst.flags.c_contiguous:
            raise ValueError("copy_to_host needs a contiguous destination array")
        self._copy_to_host(dst, _address(src), dst.nbytes, stream)

    def copy_device(self, dst, src, nbytes: int, stream=None) -> None:
        self._copy_device(_address(dst), _address(src), int(nbytes), stream)

    def memset32(self, dst, value: int, count: int, stream=None) -> None:
        """`count` 32-bit words at `dst` set to `value`, asynchronously on the stream."""
        self._memset32(_address(dst), int(value) & 0xFFFFFFFF, int(count), stream)

    # ---- IPC ----------------------------------------------------------------------------
    def open_handle(self, handle: bytes, nbytes: int, label: str) -> Allocation:
        return Allocation(self._open_handle(bytes(handle)), nbytes, label, peer=True)

    def close_handle(self, allocation: Allocation) -> None:
        if not allocation.peer:
            raise DeviceError(f"allocation {allocation.label!r} is our own: free it")
        self._close_handle(allocation.ptr)

    # ---- compile, load, launch ------------------------------------------------------------
    def compile(self, source: str, options: Sequence[str] = ()) -> bytes:
        """Source -> code object for this card's target, through the disk cache."""
        return self.cache.get_or_compile(source, self.target, self.compiler_version, tuple(options),
                                         lambda: self._compile(source, tuple(options)))

    def load(self, code: bytes) -> Module:
        return Module(self._load(bytes(code)), bytes(code))

    def kernel(self, module: Module, name: str) -> Kernel:
        check_no_printf(name, module.code)
        handle, static_shared = self._function(module.handle, name)
        return Kernel(name, handle, static_shared, module)

    def launch(self, kernel: Kernel, grid, block, args: PackedArgs, shared_bytes: int = 0,
               stream=None, programmatic: bool = False) -> None:
        if args.kernel != kernel.name:
            raise DeviceError(f"kernel {kernel.name!r} launched with arguments packed for {args.kernel!r}")
        check_arg_bytes(kernel.name, len(args.data))
        check_shared(kernel.name, kernel.static_shared, shared_bytes)
        if programmatic and not self.programmatic_launch:
            raise DeviceError(f"kernel {kernel.name!r}: programmatic dependent launch needs NVIDIA sm_90 or "
                              f"newer; this {self.vendor} card ({self.target}) has none")
        with self.launching(kernel.name):
            self._launch(kernel, _dim3(grid, "grid"), _dim3(block, "block"), int(shared_bytes), args,
                         stream, programmatic)

    # ---- primitives every backend implements ----------------------------------------------
    @abstractmethod
    def _alloc(self, nbytes: int) -> int: ...
    @abstractmethod
    def _free(self, ptr: int) -> None: ...
    @abstractmethod
    def _copy_to_device(self, dst: int, src: np.ndarray, nbytes: int, stream) -> None: ...
    @abstractmethod
    def _copy_to_host(self, dst: np.ndarray, src: int, nbytes: int, stream) -> None: ...
    @abstractmethod
    def _copy_device(self, dst: int, src: int, nbytes: int, stream) -> None: ...
    @abstractmethod
    def _memset32(self, dst: int, value: int, count: int, stream) -> None: ...
    @abstractmethod
    def export_handle(self, allocation: Allocation) -> bytes: ...
    @abstractmethod
    def _open_handle(self, handle: bytes) -> int: ...
    @abstractmethod
    def _close_handle(self, ptr: int) -> None: ...
    @abstractmethod
    def map_host(self, array: np.ndarray) -> int:
        """Register a host array (a POSIX shared-memory word, say) as mapped memory: the device
        address of array[0], which a kernel may load from and store to at system scope."""
    @abstractmethod
    def unmap_host(self, array: np.ndarray) -> None: ...
    @abstractmethod
    def stream(self) -> Any: ...
    @abstractmethod
    def synchronize(self, stream=None) -> None: ...
    @abstractmethod
    def event(self) -> Any: ...
    @abstractmethod
    def record(self, event, stream=None) -> None: ...
    @abstractmethod
    def wait_event(self, stream, event) -> None: ...
    @abstractmethod
    def elapsed_ms(self, start, end) -> float: ...
    @abstractmethod
    def _compile(self, source: str, options: tuple[str, ...]) -> bytes: ...
    @abstractmethod
    def _load(self, code: bytes) -> Any: ...
    @abstractmethod
    def _function(self, module_handle, name: str) -> tuple[Any, int]:
        """(function handle, its static shared bytes)."""
    @abstractmethod
    def _launch(self, kernel: Kernel, grid: tuple[int, int, int], block: tuple[int, int, int],
                shared_bytes: int, args: PackedArgs, stream, programmatic: bool) -> None: ...
    @abstractmethod
    def begin_capture(self, stream) -> None: ...
    @abstractmethod
    def end_capture(self, stream) -> Any: ...
    @abstractmethod
    def instantiate(self, graph) -> Any: ...
    @abstractmethod
    def launch_graph(self, graph_exec, stream=None) -> None: ...
    @abstractmethod
    def close(self) -> None: ...
