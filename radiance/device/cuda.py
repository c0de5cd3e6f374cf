"""The NVIDIA backend: cuda-bindings' driver API and nvrtc. Imported only on a rank whose card is
NVIDIA (selection.py); cuda-bindings itself is imported when the first device opens, so this
module imports anywhere.

Every cuda-bindings call returns a tuple `(err, *values)`; `_check` turns a failure into a
DeviceError naming the call and CUDA's error name. Kernels are compiled by nvrtc to a cubin for the
card's own architecture (sm_90 on Hopper), so no PTX is JIT-compiled at load.
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np

from .base import Device, DeviceError, Kernel

driver = nvrtc = None  # the bindings, imported by the first device opened (see _bindings)

IPC_HANDLE_BYTES = 64              # CU_IPC_HANDLE_SIZE
DEFAULT_SHARED_LIMIT = 48 * 1024   # above this a kernel must opt in to dynamic shared memory


def _bindings() -> None:
    """Import cuda-bindings on first use, so this module imports (and its class can be checked) anywhere."""
    global driver, nvrtc
    if driver is None:
        try:
            from cuda.bindings import driver, nvrtc
        except ImportError as error:
            raise DeviceError(f"the cuda backend needs cuda-bindings (pip install 'radiance[cuda]'): {error}") from None


def _error_name(err) -> str:
    if isinstance(err, nvrtc.nvrtcResult):
        return nvrtc.nvrtcGetErrorString(err)[1].decode()
    code, name = driver.cuGetErrorName(err)
    return name.decode() if int(code) == 0 and name else str(err)


def _check(result, what: str):
    err, *values = result
    if int(err) != 0:
        raise DeviceError(f"{what}: {_error_name(err)}")
    return values[0] if len(values) == 1 else tuple(values) if values else None


class CudaDevice(Device):
    vendor = "cuda"

    def __init__(self, ordinal: int = 0, cache=None, host_bytes: int | None = None):
        _bindings()
        _check(driver.cuInit(0), "cuInit")
        self.device = _check(driver.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
        self.context = _check(driver.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        self.bind_thread()
        attribute = lambda a: _check(driver.cuDeviceGetAttribute(a, self.device), f"cuDeviceGetAttribute({a.name})")
        major = attribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = attribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        self.name = _check(driver.cuDeviceGetName(256, self.device), "cuDeviceGetName").split(b"\0")[0].decode()
        bus = _check(driver.cuDeviceGetPCIBusId(32, self.device), "cuDeviceGetPCIBusId")
        self.bus_id = (bus if isinstance(bus, str) else bytes(bus).split(b"\0")[0].decode()).lower()
        self.multiprocessors = attribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        free, _total = _check(driver.cuMemGetInfo(), "cuMemGetInfo")
        nvrtc_major, nvrtc_minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
        super().__init__(target=f"sm_{major}{minor}", device_bytes=free,
                         integrated=bool(attribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_INTEGRATED)),
                         compiler_version=f"nvrtc-{nvrtc_major}.{nvrtc_minor}", host_bytes=host_bytes, cache=cache)
        self.programmatic_launch = major >= 9     # griddepcontrol / programmatic stream serialization
        self._streams, self._events, self._mapped = [], [], {}
        self._graph_execs = []  # destroyed by close, before the context they live in is released
        self._shared_opt_in: dict[int, int] = {}  # function handle -> dynamic shared bytes allowed
        self.default_stream = self.stream()

    def _stream(self, stream):
        return self.default_stream if stream is None else stream

    def bind_thread(self) -> None:
        """Make this card's context current in the calling thread (each thread that issues work)."""
        _check(driver.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    # ---- memory, copies, IPC, mapped host words --------------------------------------------
    def _alloc(self, nbytes):
        return int(_check(driver.cuMemAlloc(nbytes), f"cuMemAlloc({nbytes})"))

    def _free(self, ptr):
        _check(driver.cuMemFree(ptr), "cuMemFree")

    def _copy_to_device(self, dst, src, nbytes, stream):
        _check(driver.cuMemcpyHtoDAsync(dst, src.ctypes.data, nbytes, self._stream(stream)), "cuMemcpyHtoDAsync")

    def _copy_to_host(self, dst, src, nbytes, stream):
        _check(driver.cuMemcpyDtoHAsync(dst.ctypes.data, src, nbytes, self._stream(stream)), "cuMemcpyDtoHAsync")

    def _copy_device(self, dst, src, nbytes, stream):
        _check(driver.cuMemcpyDtoDAsync(dst, src, nbytes, self._stream(stream)), "cuMemcpyDtoDAsync")

    def _memset32(self, dst, value, count, stream):
        _check(driver.cuMemsetD32Async(dst, value, count, self._stream(stream)), "cuMemsetD32Async")

    def export_handle(self, allocation) -> bytes:
        handle = _check(driver.cuIpcGetMemHandle(allocation.ptr), f"cuIpcGetMemHandle({allocation.label!r})")
        return ctypes.string_at(handle.getPtr(), IPC_HANDLE_BYTES)

    def _open_handle(self, handle):
        if len(handle) != IPC_HANDLE_BYTES:
            raise DeviceError(f"an IPC handle is {IPC_HANDLE_BYTES} bytes, got {len(handle)}")
        native = driver.CUipcMemHandle()
        ctypes.memmove(native.getPtr(), handle, IPC_HANDLE_BYTES)
        flags = driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        return int(_check(driver.cuIpcOpenMemHandle(native, flags), "cuIpcOpenMemHandle"))

    def _close_handle(self, ptr):
        _check(driver.cuIpcCloseMemHandle(ptr), "cuIpcCloseMemHandle")

    def map_host(self, array: np.ndarray) -> int:
        # Register whole pages: a shared-memory segment is page aligned, and registering the page a
        # word sits in lets the same segment's other words be registered with it, once.
        start = array.ctypes.data
        base = start - start % mmap.PAGESIZE
        end = -(-(start + array.nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE
        flags = driver.CU_MEMHOSTREGISTER_DEVICEMAP | driver.CU_MEMHOSTREGISTER_PORTABLE
        _check(driver.cuMemHostRegister(base, end - base, flags), "cuMemHostRegister")
        device_base = int(_check(driver.cuMemHostGetDevicePointer(base, 0), "cuMemHostGetDevicePointer"))
        self._mapped[start] = base
        return device_base + (start - base)

    def unmap_host(self, array: np.ndarray) -> None:
        _check(driver.cuMemHostUnregister(self._mapped.pop(array.ctypes.data)), "cuMemHostUnregister")

    # ---- streams, events ------------------------------------------------------------------
    def stream(self):
        stream = _check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self._streams.append(stream)
        return stream

    def synchronize(self, stream=None):
        _check(driver.cuStreamSynchronize(self._stream(stream)), "cuStreamSynchronize")

    def event(self):
        event = _check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")
        self._events.append(event)
        return event

    def record(self, event, stream=None):
        _check(driver.cuEventRecord(event, self._stream(stream)), "cuEventRecord")

    def wait_event(self, stream, event):
        _check(driver.cuStreamWaitEvent(self._stream(stream), event, 0), "cuStreamWaitEvent")

    def elapsed_ms(self, start, end) -> float:
        _check(driver.cuEventSynchronize(end), "cuEventSynchronize")
        return float(_check(driver.cuEventElapsedTime(start, end), "cuEventElapsedTime"))

    # ---- compile, load, launch ------------------------------------------------------------
    def _compile(self, source, options):
        return nvrtc_compile(source, self.target, options)

    def _load(self, code):
        return _check(driver.cuModuleLoadData(code), "cuModuleLoadData")

    def _function(self, module_handle, name):
        function = _check(driver.cuModuleGetFunction(module_handle, name.encode()), f"cuModuleGetFunction({name!r})")
        static = _check(driver.cuFuncGetAttribute(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function),
                        f"cuFuncGetAttribute({name!r})")
        return function, int(static)

    def _launch(self, kernel: Kernel, grid, block, shared_bytes, args, stream, programmatic):
        function, stream = kernel.handle, self._stream(stream)
        key = int(function)
        # Past 48 KiB of static + dynamic shared memory a kernel must opt in to the dynamic part.
        if kernel.static_shared + shared_bytes > DEFAULT_SHARED_LIMIT and self._shared_opt_in.get(key, 0) < shared_bytes:
            _check(driver.cuFuncSetAttribute(function, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                             shared_bytes), f"cuFuncSetAttribute({kernel.name!r})")
            self._shared_opt_in[key] = shared_bytes
        # One pointer per argument into the packed block; the driver copies the values at launch.
        block_bytes = np.frombuffer(args.data, np.uint8).copy() if args.data else np.zeros(1, np.uint8)
        pointers = np.array([block_bytes.ctypes.data + o for o in args.offsets] or [0], np.uint64)
        params = pointers.ctypes.data if args.offsets else None
        if not programmatic:
            _check(driver.cuLaunchKernel(function, *grid, *block, shared_bytes, stream, params, 0),
                   f"cuLaunchKernel({kernel.name!r})")
            return
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = block
        config.sharedMemBytes, config.hStream = shared_bytes, stream
        attribute = driver.CUlaunchAttribute()
        attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attribute.value.programmaticStreamSerializationAllowed = 1
        config.attrs, config.numAttrs = [attribute], 1
        _check(driver.cuLaunchKernelEx(config, function, params, 0), f"cuLaunchKernelEx({kernel.name!r})")

    # ---- graphs ---------------------------------------------------------------------------
    def begin_capture(self, stream):
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        _check(driver.cuStreamBeginCapture(stream, mode), "cuStreamBeginCapture")

    def end_capture(self, stream):
        return _check(driver.cuStreamEndCapture(stream), "cuStreamEndCapture")

    def instantiate(self, graph):
        """The executable graph of a captured one; the captured graph is destroyed (the executable
        one does not need it), the executable one by close()."""
        graph_exec = _check(driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        driver.cuGraphDestroy(graph)
        self._graph_execs.append(graph_exec)
        return graph_exec

    def launch_graph(self, graph_exec, stream=None):
        _check(driver.cuGraphLaunch(graph_exec, self._stream(stream)), "cuGraphLaunch")

    def close(self):
        for graph_exec in self._graph_execs:
            driver.cuGraphExecDestroy(graph_exec)
        for stream in self._streams:
            driver.cuStreamDestroy(stream)
        for event in self._events:
            driver.cuEventDestroy(event)
        self._streams, self._events, self._graph_execs = [], [], []
        driver.cuDevicePrimaryCtxRelease(self.device)


def nvrtc_compile(source: str, target: str, options=()) -> bytes:
    """A cubin of `source` for `target` (sm_90; sm_90a for Hopper's wgmma, which a kernel asks for
    with its own --gpu-architecture option, taking the place of the card's), through nvrtc. Needs
    no card: tests compile every device source with it where nvrtc is installed."""
    _bindings()
    program = _check(nvrtc.nvrtcCreateProgram(source.encode(), b"radiance.cu", 0, [], []), "nvrtcCreateProgram")
    try:
        # The reference contract has no FMA: contraction stays off unless a kernel asks for it.
        contract = [] if any(o.startswith("--fmad") for o in options) else [b"--fmad=false"]
        arch = [] if any(o.startswith("--gpu-architecture") for o in options) else [f"--gpu-architecture={target}".encode()]
        flags = [*arch, b"--std=c++17", *contract, *(o.encode() for o in options)]
        (err,) = nvrtc.nvrtcCompileProgram(program, len(flags), flags)
        if int(err) != 0:
            size = _check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
            log = bytearray(size)  # never a bytes object: b" " * 1 is the interpreter's shared b" "
            _check(nvrtc.nvrtcGetProgramLog(program, log), "nvrtcGetProgramLog")
            lines = [l for l in log.decode(errors="replace").splitlines() if "error" in l] or [_error_name(err)]
            raise DeviceError(f"nvrtc ({target}) refused the source: {lines[0].strip()}")
        size = _check(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
        cubin = bytearray(size)
        _check(nvrtc.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
        return bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def open_device(ordinal: int = 0, **options) -> CudaDevice:
    return CudaDevice(ordinal, **options)
