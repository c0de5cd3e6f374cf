"""The AMD backend: hip-python's hip and hiprtc, the same call shapes as cuda.py. Imported only on
a rank whose card is AMD (selection.py); hip-python itself is imported when the first device
opens, so this module imports anywhere.

Not yet run on an AMD card (none can be reached from this project): the calls follow hip-python's
documented signatures, every name it uses is checked against the installed hip-python by
tests/test_device_backends.py, and the rules above the primitives are the ones the fake backend
tests. hip-python returns `(err, *values)` tuples, as cuda-bindings does.
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np

from .base import Device, DeviceError, Kernel

hip = hiprtc = None  # the bindings, imported by the first device opened (see _bindings)

IPC_HANDLE_BYTES = 64  # HIP_IPC_HANDLE_SIZE


def _bindings() -> None:
    """Import hip-python on first use, so this module imports (and its class can be checked) anywhere."""
    global hip, hiprtc
    if hip is None:
        try:
            from hip import hip, hiprtc
        except ImportError as error:
            raise DeviceError(f"the rocm backend needs hip-python (pip install 'radiance[rocm]'): {error}") from None


def _error_name(err) -> str:
    if isinstance(err, hiprtc.hiprtcResult):
        return hiprtc.hiprtcGetErrorString(err)[1].decode()
    name = hip.hipGetErrorName(err)
    name = name[-1] if isinstance(name, tuple) else name
    return name.decode() if isinstance(name, bytes) else str(err)


def _check(result, what: str):
    err, *values = result
    if int(err) != 0:
        raise DeviceError(f"{what}: {_error_name(err)}")
    return values[0] if len(values) == 1 else tuple(values) if values else None


class HipDevice(Device):
    vendor = "hip"
    programmatic_launch = False  # no programmatic dependent launch on AMD: r4dchain waits in its prologue

    def __init__(self, ordinal: int = 0, cache=None, host_bytes: int | None = None):
        _bindings()
        _check(hip.hipInit(0), "hipInit")
        self.ordinal = ordinal
        self.bind_thread()
        properties = _check(hip.hipGetDeviceProperties(ordinal), "hipGetDeviceProperties")
        arch = properties.gcnArchName
        arch = (arch.decode() if isinstance(arch, bytes) else str(arch)).split("\0")[0]  # gfx942:sramecc+:xnack-
        name = properties.name
        self.name = (name.decode() if isinstance(name, bytes) else str(name)).split("\0")[0]
        self.multiprocessors = int(properties.multiProcessorCount)
        integrated = _check(hip.hipDeviceGetAttribute(hip.hipDeviceAttribute_t.hipDeviceAttributeIntegrated, ordinal),
                            "hipDeviceGetAttribute(integrated)")
        free, _total = _check(hip.hipMemGetInfo(), "hipMemGetInfo")
        rtc_major, rtc_minor = _check(hiprtc.hiprtcVersion(), "hiprtcVersion")
        super().__init__(target=arch, device_bytes=free, integrated=bool(integrated),
                         compiler_version=f"hiprtc-{rtc_major}.{rtc_minor}", host_bytes=host_bytes, cache=cache)
        self._streams, self._events, self._mapped = [], [], {}
        self._graph_execs = []  # destroyed by close
        self.default_stream = self.stream()

    def _stream(self, stream):
        return self.default_stream if stream is None else stream

    def bind_thread(self) -> None:
        _check(hip.hipSetDevice(self.ordinal), "hipSetDevice")

    # ---- memory, copies, IPC, mapped host words --------------------------------------------
    def _alloc(self, nbytes):
        return int(_check(hip.hipMalloc(nbytes), f"hipMalloc({nbytes})"))

    def _free(self, ptr):
        _check(hip.hipFree(ptr), "hipFree")

    def _copy_to_device(self, dst, src, nbytes, stream):
        _check(hip.hipMemcpyHtoDAsync(dst, src.ctypes.data, nbytes, self._stream(stream)), "hipMemcpyHtoDAsync")

    def _copy_to_host(self, dst, src, nbytes, stream):
        _check(hip.hipMemcpyDtoHAsync(dst.ctypes.data, src, nbytes, self._stream(stream)), "hipMemcpyDtoHAsync")

    def _copy_device(self, dst, src, nbytes, stream):
        _check(hip.hipMemcpyDtoDAsync(dst, src, nbytes, self._stream(stream)), "hipMemcpyDtoDAsync")

    def _memset32(self, dst, value, count, stream):
        _check(hip.hipMemsetD32Async(dst, value, count, self._stream(stream)), "hipMemsetD32Async")

    def export_handle(self, allocation) -> bytes:
        handle = _check(hip.hipIpcGetMemHandle(allocation.ptr), f"hipIpcGetMemHandle({allocation.label!r})")
        return ctypes.string_at(handle.as_c_void_p().value, IPC_HANDLE_BYTES)

    def _open_handle(self, handle):
        if len(handle) != IPC_HANDLE_BYTES:
            raise DeviceError(f"an IPC handle is {IPC_HANDLE_BYTES} bytes, got {len(handle)}")
        native = hip.hipIpcMemHandle_t()
        ctypes.memmove(native.as_c_void_p().value, handle, IPC_HANDLE_BYTES)
        return int(_check(hip.hipIpcOpenMemHandle(native, hip.hipIpcMemLazyEnablePeerAccess), "hipIpcOpenMemHandle"))

    def _close_handle(self, ptr):
        _check(hip.hipIpcCloseMemHandle(ptr), "hipIpcCloseMemHandle")

    def map_host(self, array: np.ndarray) -> int:
        start = array.ctypes.data  # whole pages, as in cuda.py
        base = start - start % mmap.PAGESIZE
        end = -(-(start + array.nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE
        flags = hip.hipHostRegisterMapped | hip.hipHostRegisterPortable
        _check(hip.hipHostRegister(base, end - base, flags), "hipHostRegister")
        device_base = int(_check(hip.hipHostGetDevicePointer(base, 0), "hipHostGetDevicePointer"))
        self._mapped[start] = base
        return device_base + (start - base)

    def unmap_host(self, array: np.ndarray) -> None:
        _check(hip.hipHostUnregister(self._mapped.pop(array.ctypes.data)), "hipHostUnregister")

    # ---- streams, events ------------------------------------------------------------------
    def stream(self):
        stream = _check(hip.hipStreamCreateWithFlags(hip.hipStreamNonBlocking), "hipStreamCreateWithFlags")
        self._streams.append(stream)
        return stream

    def synchronize(self, stream=None):
        _check(hip.hipStreamSynchronize(self._stream(stream)), "hipStreamSynchronize")

    def event(self):
        event = _check(hip.hipEventCreate(), "hipEventCreate")
        self._events.append(event)
        return event

    def record(self, event, stream=None):
        _check(hip.hipEventRecord(event, self._stream(stream)), "hipEventRecord")

    def wait_event(self, stream, event):
        _check(hip.hipStreamWaitEvent(self._stream(stream), event, 0), "hipStreamWaitEvent")

    def elapsed_ms(self, start, end) -> float:
        _check(hip.hipEventSynchronize(end), "hipEventSynchronize")
        return float(_check(hip.hipEventElapsedTime(start, end), "hipEventElapsedTime"))

    # ---- compile, load, launch ------------------------------------------------------------
    def _compile(self, source, options):
        program = _check(hiprtc.hiprtcCreateProgram(source.encode(), b"radiance.hip", 0, [], []), "hiprtcCreateProgram")
        try:
            # The reference contract has no FMA: contraction stays off unless a kernel asks for it.
            contract = [] if any(o.startswith("-ffp-contract") for o in options) else [b"-ffp-contract=off"]
            flags = [f"--offload-arch={self.target}".encode(), b"-std=c++17", *contract,
                     *(o.encode() for o in options)]
            (err,) = hiprtc.hiprtcCompileProgram(program, len(flags), flags)
            if int(err) != 0:
                size = _check(hiprtc.hiprtcGetProgramLogSize(program), "hiprtcGetProgramLogSize")
                log = bytearray(size)  # never a bytes object: b" " * 1 is the interpreter's shared b" "
                _check(hiprtc.hiprtcGetProgramLog(program, log), "hiprtcGetProgramLog")
                lines = [l for l in log.decode(errors="replace").splitlines() if "error" in l] or [_error_name(err)]
                raise DeviceError(f"hiprtc ({self.target}) refused the source: {lines[0].strip()}")
            size = _check(hiprtc.hiprtcGetCodeSize(program), "hiprtcGetCodeSize")
            code = bytearray(size)
            _check(hiprtc.hiprtcGetCode(program, code), "hiprtcGetCode")
            return bytes(code)
        finally:
            hiprtc.hiprtcDestroyProgram(program.createRef())

    def _load(self, code):
        return _check(hip.hipModuleLoadData(code), "hipModuleLoadData")

    def _function(self, module_handle, name):
        function = _check(hip.hipModuleGetFunction(module_handle, name.encode()), f"hipModuleGetFunction({name!r})")
        static = _check(hip.hipFuncGetAttribute(hip.hipFunction_attribute.HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function),
                        f"hipFuncGetAttribute({name!r})")
        return function, int(static)

    def _launch(self, kernel: Kernel, grid, block, shared_bytes, args, stream, programmatic):
        # One pointer per argument into the packed block, as in cuda.py; copied at launch.
        block_bytes = np.frombuffer(args.data, np.uint8).copy() if args.data else np.zeros(1, np.uint8)
        pointers = np.array([block_bytes.ctypes.data + o for o in args.offsets] or [0], np.uint64)
        params = pointers.ctypes.data if args.offsets else None
        _check(hip.hipModuleLaunchKernel(kernel.handle, *grid, *block, shared_bytes, self._stream(stream), params, None),
               f"hipModuleLaunchKernel({kernel.name!r})")

    # ---- graphs ---------------------------------------------------------------------------
    def begin_capture(self, stream):
        _check(hip.hipStreamBeginCapture(stream, hip.hipStreamCaptureMode.hipStreamCaptureModeThreadLocal),
               "hipStreamBeginCapture")

    def end_capture(self, stream):
        return _check(hip.hipStreamEndCapture(stream), "hipStreamEndCapture")

    def instantiate(self, graph):
        graph_exec, _node, _log = _check(hip.hipGraphInstantiate(graph, 0), "hipGraphInstantiate")
        hip.hipGraphDestroy(graph)  # the executable graph does not need the captured one
        self._graph_execs.append(graph_exec)
        return graph_exec

    def launch_graph(self, graph_exec, stream=None):
        _check(hip.hipGraphLaunch(graph_exec, self._stream(stream)), "hipGraphLaunch")

    def close(self):
        for graph_exec in self._graph_execs:
            hip.hipGraphExecDestroy(graph_exec)
        for stream in self._streams:
            hip.hipStreamDestroy(stream)
        for event in self._events:
            hip.hipEventDestroy(event)
        self._streams, self._events, self._graph_execs = [], [], []


def open_device(ordinal: int = 0, **options) -> HipDevice:
    return HipDevice(ordinal, **options)
