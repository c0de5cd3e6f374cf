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
and `stream.target` ("sm_90", "gfx942") say which compiler runs."""

from __future__ import annotations

from typing import Any, Sequence

from . import constants as c
from .kernel_args import PackedArgs
from .types import RadTensor


class RadStream:
    vendor: str = ""
    target: str = ""
    multiprocessors: int = 1

    def kernel(self, source: str, name: str, options: Sequence[str] = ()) -> Any:
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
