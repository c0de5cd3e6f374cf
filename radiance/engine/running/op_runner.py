"""One op run by itself, outside a model's graph (the speculative decoder's draft and verify ops):
its row chosen as the engine chooses every row (the hierarchy, the bands of its ranged extent, the
reference gate, the library's device code against the card), then launched with a RadArgs built
here. On the host the operands are the caller's numpy arrays. On a card they are copied up into
buffers the runner keeps (grown to the largest asked), the row launched on an engine stream, the
outputs (operands the schema says are written) copied back, then the stream synchronised."""

from __future__ import annotations

import numpy as np

from radiance.abi import (
    RAD_DOMAIN_DEVICE, RAD_DOMAIN_HOST, RAD_OK, RAD_OPD_IN, RAD_OPD_INOUT, RAD_OPD_OUT, RadArgs, dtype_from_numpy,
    rad_device_tensor, rad_tensor,
)
from radiance.engine.selection.bands import SelectionError, resolve
from radiance.engine.selection.device_targets import leave_out_foreign_device_code

from .device_stream import EngineStream


class OpError(RuntimeError):
    """A row returned an error: names the op, the row and the code."""


class OpRunner:
    def __init__(self, registry, op: str, geometry: dict, max_extent: int, accept_reference: bool = False,
                 device=None, facts: dict | None = None):
        entry = registry.ops.get(op)
        if entry is None:
            raise SelectionError(f"no loaded kernel library declares op '{op}'")
        if device is not None:
            leave_out_foreign_device_code(registry, device.vendor, device.target)
        domain = RAD_DOMAIN_DEVICE if device is not None else RAD_DOMAIN_HOST
        self.op, self.schema, self.device = op, entry.schema, device
        self.resolution = resolve(op, entry.schema, registry.rows_for(op), dict(geometry),
                                  facts if facts is not None else {"device.p2p": 0}, domain, max_extent,
                                  accept_reference)
        self.resolution.instantiate()
        self.stream = EngineStream(device) if device is not None else None
        self._scratch: dict = {}  # id(band) -> (scratch, bytes)
        self._buffers: dict = {}  # operand index -> a device Allocation
        self._allocations: list = []  # the scratch on a card
        for band in self.resolution.bands:
            nbytes = int(band.row.info.scratch(dict(band.geometry))) if band.row.info.scratch else 0
            if nbytes > 0 and device is not None:
                self._allocations.append(device.alloc(nbytes, f"scratch {band.row.name}"))
                device.memset32(self._allocations[-1], 0, -(-nbytes // 4))
                self._scratch[id(band)] = (self._allocations[-1].ptr, nbytes)
            elif nbytes > 0:
                self._scratch[id(band)] = (np.zeros(nbytes, np.uint8), nbytes)

    def row(self, extent: int):
        """The row that serves this extent."""
        return self.resolution.band_for(extent).row

    def __call__(self, extent: int, *operands: np.ndarray) -> None:
        """Run the op over `extent` (its ranged parameter) on the operands, positional in the
        schema's order; the written ones are filled in place."""
        band = self.resolution.band_for(extent)
        if len(operands) != len(self.schema.operands):
            raise ValueError(f"op '{self.op}' takes {len(self.schema.operands)} operands, {len(operands)} given")
        scratch, scratch_bytes = self._scratch.get(id(band), (None, 0))
        params = {**band.geometry, self.resolution.ranged: extent}
        tensors = (tuple(rad_tensor(array) for array in operands) if self.device is None
                   else tuple(self._upload(i, array) for i, array in enumerate(operands)))
        args = RadArgs(t=tensors, params=params, scratch=scratch, scratch_bytes=scratch_bytes, instance=band.instance,
                       stream=self.stream)
        status = band.row.info.launch(args)
        if status != RAD_OK:
            raise OpError(f"op '{self.op}': row {band.row.plugin.name}:{band.row.name} returned {status}")
        if self.device is not None:
            for i, (spec, array) in enumerate(zip(self.schema.operands, operands)):
                if spec.role in (RAD_OPD_OUT, RAD_OPD_INOUT):
                    self.device.copy_to_host(array, self._buffers[i].ptr, self.stream.handle)
            self.device.synchronize(self.stream.handle)

    def _upload(self, index: int, array: np.ndarray):
        if not array.flags.c_contiguous:
            raise ValueError(f"op '{self.op}': operand {self.schema.operands[index].name} is not contiguous")
        buffer = self._buffers.get(index)
        if buffer is None or buffer.nbytes < array.nbytes:
            if buffer is not None:
                self.device.free(buffer)
            buffer = self._buffers[index] = self.device.alloc(max(array.nbytes, 1),
                                                              f"{self.op} {self.schema.operands[index].name}")
        if self.schema.operands[index].role in (RAD_OPD_IN, RAD_OPD_INOUT):
            self.device.copy_to_device(buffer.ptr, array, self.stream.handle)
        return rad_device_tensor(buffer.ptr, dtype_from_numpy(array.dtype), array.shape, array.itemsize)

    def close(self) -> None:
        self.resolution.release()
        if self.device is not None:
            self.device.synchronize(self.stream.handle)
            for buffer in [*self._buffers.values(), *self._allocations]:
                self.device.free(buffer)
            self._buffers.clear()
            self._allocations.clear()
