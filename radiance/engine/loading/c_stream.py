"""The RadStreamTable a C device row gets as RadArgs.stream (abi/rad_stream.h): the engine's
RadStream (radiance.abi.stream; EngineStream on a card) behind C function pointers. Every call runs
the engine's own code, so a C row's kernels meet the same compile cache, the same launch rules
(768 bytes of parameters, 64 KiB of shared memory, no device printf or assert) and the same graph
capture as a Python row's.

Modules and kernels are handed to C as small integer handles. An error inside a call becomes its
status and the table's last error (what `last_error` returns, then clears); an error the row did not
read back is raised by the launch adaptor once the row returns (c_hooks.py), so the engine reports
it naming the kernel whatever the row did with the status."""

from __future__ import annotations

import ctypes
import weakref
from ctypes import POINTER, c_char_p, c_int, c_int32, c_int64, c_uint32, c_void_p

from radiance.abi import RAD_E_DEVICE, RAD_E_INVALID, RAD_OK, PackedArgs, RadStreamTable

MODULE_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_int64, c_char_p, POINTER(c_void_p))
KERNEL_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_char_p, POINTER(c_void_p))
LAUNCH_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, POINTER(c_uint32), POINTER(c_uint32), c_void_p, c_int64,
                             POINTER(c_uint32), c_int32, c_int64)
COPY_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_void_p, c_int64)
MEMSET_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_uint32, c_int64)
ERROR_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_int64)
MAX_IMAGE_BYTES = 1 << 30
MAX_PARAM_BYTES = 1 << 16  # read no further; the launch rule (768 bytes) speaks below this


class StreamTable:
    """One engine stream served to C. `pending` is an error no row has read back yet."""

    def __init__(self, stream):
        self.stream = stream
        self._objects: list = [None]  # handle -> module or kernel (handle 0 is NULL)
        self._images: dict = {}  # (address, bytes, options) -> module handle
        self._kernels: dict = {}  # (module handle, name) -> kernel handle
        self.status, self.message, self.pending = RAD_OK, "", None
        self._callbacks = (MODULE_FN(self._module), KERNEL_FN(self._kernel), LAUNCH_FN(self._launch),
                           COPY_FN(self._copy), MEMSET_FN(self._memset32), ERROR_FN(self._last_error))
        self._vendor, self._target = (str(getattr(stream, name, "")).encode() for name in ("vendor", "target"))
        self.table = RadStreamTable.ctype(ctypes.sizeof(RadStreamTable.ctype), self._vendor, self._target,
                                          int(getattr(stream, "multiprocessors", 1)), None,
                                          *(ctypes.cast(callback, c_void_p).value for callback in self._callbacks))
        self.table.queue = ctypes.addressof(self.table)  # what a row hands back; the calls know their table

    @property
    def address(self) -> int:
        return ctypes.addressof(self.table)

    def _handle(self, thing) -> int:
        self._objects.append(thing)
        return len(self._objects) - 1

    def _object(self, handle, what: str):
        index = int(handle or 0)
        if not 0 < index < len(self._objects):
            raise ValueError(f"{what} handle {index} is not one this stream gave out")
        return self._objects[index]

    def _fail(self, error: BaseException, status: int = RAD_E_DEVICE) -> int:
        if self.status == RAD_OK:
            self.status, self.message, self.pending = status, f"{type(error).__name__}: {error}", error
        return status

    def take_pending(self):
        """The error no row read back, cleared."""
        error, self.pending = self.pending, None
        self.status, self.message = RAD_OK, ""
        return error

    def _module(self, _queue, image, nbytes, options, out):
        try:
            if not image or not 0 < nbytes <= MAX_IMAGE_BYTES:
                raise ValueError(f"a code object of {nbytes} bytes at {image or 0:#x}")
            words = tuple((options or b"").decode().split())
            key = (image, nbytes, words)
            handle = self._images.get(key)
            if handle is None:
                handle = self._images[key] = self._handle(self.stream.module(ctypes.string_at(image, nbytes), words))
            out[0] = handle
            return RAD_OK
        except Exception as error:  # noqa: BLE001 - never across into C
            return self._fail(error, RAD_E_INVALID if isinstance(error, ValueError) else RAD_E_DEVICE)

    def _kernel(self, _queue, module, name, out):
        try:
            key = (int(module or 0), name)
            handle = self._kernels.get(key)
            if handle is None:
                kernel = self.stream.function(self._object(module, "module"), (name or b"").decode())
                handle = self._kernels[key] = self._handle(kernel)
            out[0] = handle
            return RAD_OK
        except Exception as error:  # noqa: BLE001
            return self._fail(error)

    def _launch(self, _queue, kernel, grid, block, params, nbytes, offsets, n_offsets, shared_bytes):
        try:
            function = self._object(kernel, "kernel")
            if not 0 <= nbytes <= MAX_PARAM_BYTES or (nbytes and not params):
                raise ValueError(f"kernel {function.name!r}: a parameter block of {nbytes} bytes")
            data = ctypes.string_at(params, nbytes) if nbytes else b""
            starts = tuple(offsets[i] for i in range(n_offsets)) if offsets and n_offsets > 0 else (0,) if nbytes else ()
            self.stream.launch(function, tuple(grid[i] for i in range(3)), tuple(block[i] for i in range(3)),
                               PackedArgs(function.name, data, starts), int(shared_bytes))
            return RAD_OK
        except Exception as error:  # noqa: BLE001
            return self._fail(error)

    def _copy(self, _queue, dst, src, nbytes):
        try:
            self.stream.copy(int(dst or 0), int(src or 0), int(nbytes))
            return RAD_OK
        except Exception as error:  # noqa: BLE001
            return self._fail(error)

    def _memset32(self, _queue, dst, value, count):
        try:
            self.stream.memset32(int(dst or 0), int(value), int(count))
            return RAD_OK
        except Exception as error:  # noqa: BLE001
            return self._fail(error)

    def _last_error(self, _queue, message, nbytes):
        status, text = self.status, self.message.encode()[:max(0, nbytes - 1)]
        if message and nbytes > 0:
            ctypes.memmove(message, text + b"\0", len(text) + 1)
        self.status, self.message, self.pending = RAD_OK, "", None
        return status


_tables: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def stream_table(stream) -> StreamTable:
    """The table serving this engine stream, made once per stream."""
    table = _tables.get(stream)
    if table is None:
        table = _tables[stream] = StreamTable(stream)
    return table
