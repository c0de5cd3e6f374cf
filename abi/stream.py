"""RadStream: what a device row's launch may do on a card (the specification, "What a launch may
do"). On a card `RadArgs.stream` is the engine's own queue, not a driver stream; a row reaches the
card only through it:

    kernel = stream.kernel(SOURCE, "rmsnorm_f32")           # compiled once per source and target,
                                                            # cached on disk; a dict lookup after that
    stream.launch(kernel, grid, block, KernelArgs("rmsnorm_f32").pointer(x)....pack(), shared_bytes)
    stream.copy(dst, src, nbytes)                           # device to device, asynchronous
    stream.memset32(dst, value, count)

Device tensors carry their device address as an int in `RadTensor.data` (rad_device_tensor), a
weight's planes likewise. Nothing here may allocate (device memory comes from the `scratch` hook)
or synchronise: a launch is issued in order on the queue, and may be captured into a graph.
Sources are HIP-flavoured C++ that nvrtc and hiprtc both take; `stream.vendor` ("cuda", "hip")
and `stream.target` ("sm_90", "gfx942") say which compiler runs. A code object built ahead of time
(a cubin from nvcc, an AMD code object from hipcc) loads through `module` and `function`: what a C
plugin's RadStreamTable (rad_stream.h, mirrored below) reaches."""

from __future__ import annotations

from typing import Any, Sequence

from . import constants as c
from ._cstruct import CStr, Fn, I32, I64, Ptr, U32, cstruct
from .kernel_args import PackedArgs
from .types import RadTensor


class RadStream:
    vendor: str = ""
    target: str = ""
    multiprocessors: int = 1

    def kernel(self, source: str, name: str, options: Sequence[str] = ()) -> Any:
        raise NotImplementedError

    def module(self, image: bytes, options: Sequence[str] = ()) -> Any:
        """A module from a code object's bytes: an ELF the card runs, or source text (compiled with
        `options`, through the same disk cache as `kernel`). The same bytes again: the same module."""
        raise NotImplementedError

    def function(self, module: Any, name: str) -> Any:
        """A kernel of a module, checked by the launch rules (no device printf or assert)."""
        raise NotImplementedError

    def launch(self, kernel: Any, grid, block, args: PackedArgs, shared_bytes: int = 0) -> None:
        raise NotImplementedError

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        raise NotImplementedError

    def memset32(self, dst: int, value: int, count: int) -> None:
        raise NotImplementedError


def rad_device_tensor(address: int, dtype: int, shape: Sequence[int], itemsize: int) -> RadTensor:
    """A row-major tensor at a device address; pitch in bytes, as rad_tensor gives a host array."""
    shape = tuple(int(extent) for extent in shape)
    pitch, step = [], itemsize
    for extent in reversed(shape):
        pitch.insert(0, step)
        step *= extent
    pad = (0,) * (c.RAD_MAX_DIMS - len(shape))
    return RadTensor(data=int(address), dtype=dtype, ndim=len(shape), shape=shape + pad, pitch=tuple(pitch) + pad)


@cstruct
class RadCodeObject:
    target: CStr
    data: Ptr = None
    bytes: I64


@cstruct
class RadStreamTable:
    """rad_stream.h's table: what the engine hands a C device row as RadArgs.stream. The engine
    fills it (radiance/engine/loading/c_stream.py); a Python row uses RadStream above."""
    size: U32
    vendor: CStr
    target: CStr
    multiprocessors: I32
    queue: Ptr = None
    module: Fn
    kernel: Fn
    launch: Fn
    copy: Fn
    memset32: Fn
    last_error: Fn
