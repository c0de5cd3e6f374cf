"""A card rank's memory: activation buffers, the step inputs, tables, scratch and weights, each
allocated once from the device budget before the first step (nothing is allocated inside a launch).

The step inputs live in one host block mirrored by one device block at the same offsets, so a
step's inputs go over in a single copy and a captured graph finds them at fixed addresses. The
sampled tokens come last and are not in that copy: only the card writes them, so the next step's
feed (generation/feed.py) reads them on the card whatever the host's mirror holds."""

from __future__ import annotations

import numpy as np

from radiance.abi import (
    NUMPY, RAD_DT_ENCODED, RAD_DT_U8, RAD_EXTENT_SEQS, RAD_EXTENT_SLOTS, RAD_EXTENT_TOKENS, RadTensor,
    RAD_STEP_TOKENS, RadWeightPlanes, dtype_from_numpy, rad_device_tensor,
)

from .step_inputs import StepInputs

ALIGN = 256
UPLOAD_CHUNK_BYTES = 64 << 20


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


class DeviceInputs(StepInputs):
    """StepInputs whose arrays are views of one host block; `device` is its mirror's address."""

    def __init__(self, device, max_tokens: int, max_seqs: int, max_blocks: int):
        super().__init__(max_tokens, max_seqs, max_blocks)
        offsets, end = {}, 0
        for name in sorted(self.arrays, key=lambda name: name == RAD_STEP_TOKENS):  # the tokens last
            offsets[name] = end
            end = _aligned(end + self.arrays[name].nbytes)
        self.block = np.zeros(end, np.uint8)
        self.offsets = offsets
        self.sent = offsets[RAD_STEP_TOKENS]  # the bytes a step copies to the card: all but the tokens
        for name, array in list(self.arrays.items()):
            view = self.block[offsets[name]:offsets[name] + array.nbytes].view(array.dtype).reshape(array.shape)
            self.arrays[name] = view
        self.allocation = device.alloc(end, "step inputs")
        self.device = self.allocation.ptr

    def tensor(self, name: str, tokens: int, seqs: int) -> RadTensor:
        view = self.view(name, tokens, seqs)
        return rad_device_tensor(self.device + self.offsets[name], dtype_from_numpy(view.dtype), view.shape,
                                 view.itemsize)


class DeviceMemory:
    def __init__(self, device, link, buffers: dict, tables: dict, max_tokens: int, max_seqs: int, num_slots: int,
                 max_blocks: int):
        self.device, self.link = device, link
        self.allocations = []
        self.inputs = DeviceInputs(device, max_tokens, max_seqs, max_blocks)
        self.allocations.append(self.inputs.allocation)
        rows = {RAD_EXTENT_TOKENS: max_tokens, RAD_EXTENT_SEQS: max_seqs, RAD_EXTENT_SLOTS: num_slots}
        self.buffers = {}  # name -> (address, numpy dtype, max rows, cols, extent)
        for b in buffers.values():
            dtype = np.dtype(NUMPY[b.dtype])
            allocation = self.zeros(rows[b.extent] * b.cols * dtype.itemsize, f"buffer {b.name}")
            self.buffers[b.name] = (allocation.ptr, dtype, rows[b.extent], b.cols, b.extent)
        self.tables = {name: self.upload_tensor(table, f"table {name}") for name, table in tables.items()}
        self._weights: dict = {}
        device.synchronize()  # the zeroing above ran on the device's own stream, not the engine's

    # ---- allocation and upload ------------------------------------------------------------------
    def alloc(self, nbytes: int, label: str):
        allocation = self.device.alloc(max(int(nbytes), 1), label)
        self.allocations.append(allocation)
        return allocation

    def zeros(self, nbytes: int, label: str):
        words = -(-max(int(nbytes), 1) // 4)
        allocation = self.alloc(4 * words, label)  # whole words: a 32-bit memset may not pass the end
        self.device.memset32(allocation.ptr, 0, words)
        return allocation

    def upload(self, array: np.ndarray, label: str) -> int:
        """The bytes of `array` on the card, moved in chunks by the link scheduler (never while a
        collective holds the link gate)."""
        source = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        allocation = self.alloc(source.size, label)
        device = self.device

        def chunk(lo):
            def move():
                device.bind_thread()
                hi = min(lo + UPLOAD_CHUNK_BYTES, source.size)
                device.copy_to_device(allocation.ptr + lo, source[lo:hi])
                device.synchronize()
                return hi - lo
            return move

        self.link.submit((chunk(lo) for lo in range(0, source.size, UPLOAD_CHUNK_BYTES)), label).wait()
        return allocation.ptr

    def upload_tensor(self, tensor: RadTensor, label: str) -> RadTensor:
        array = np.asarray(tensor.data)
        return rad_device_tensor(self.upload(array, label), tensor.dtype, array.shape, array.itemsize)

    # ---- what rows read ----------------------------------------------------------------------------
    def buffer(self, name: str, tokens: int, seqs: int) -> RadTensor:
        address, dtype, rows, cols, extent = self.buffers[name]
        rows = {RAD_EXTENT_TOKENS: tokens, RAD_EXTENT_SEQS: seqs}.get(extent, rows)
        return rad_device_tensor(address, dtype_from_numpy(dtype), (rows, cols), dtype.itemsize)

    def read_buffer(self, name: str, rows: int) -> np.ndarray:
        """A buffer's first rows, copied back (after the step: the caller synchronizes first)."""
        address, dtype, _, cols, _ = self.buffers[name]
        out = np.empty((rows, cols), dtype)
        self.device.copy_to_host(out, address)
        self.device.synchronize()
        return out

    def write_buffer(self, name: str, rows: np.ndarray) -> None:
        """A buffer's first rows, copied in (before the step: done when this returns)."""
        address, dtype, _, cols, _ = self.buffers[name]
        self.device.copy_to_device(address, np.ascontiguousarray(rows, dtype).reshape(-1, cols))
        self.device.synchronize()

    def weight(self, host: RadTensor, label: str) -> RadTensor:
        """A weight as its row reads it (RankWeights.operand's form), on the card; one copy per
        host object, however many rows read it."""
        key = id(host.data)
        if key not in self._weights:
            if host.dtype == RAD_DT_ENCODED:
                planes: RadWeightPlanes = host.data
                on_card = [rad_device_tensor(self.upload(np.asarray(plane.data), f"{label}.{spec.name}"), RAD_DT_U8,
                                             np.asarray(plane.data).shape, 1)
                           for spec, plane in zip(planes.encoding.planes, planes.planes)]
                data = RadWeightPlanes(encoding=planes.encoding, rows=planes.rows, cols=planes.cols, planes=on_card)
                self._weights[key] = (RadTensor(data=data, dtype=RAD_DT_ENCODED, ndim=2, shape=host.shape), host)
            else:
                array = np.asarray(host.data)
                address = self.upload(array, label)
                self._weights[key] = (rad_device_tensor(address, dtype_from_numpy(array.dtype), array.shape,
                                                        array.itemsize), host)
        return self._weights[key][0]

    def release(self) -> None:
        self.device.synchronize()
        for allocation in reversed(self.allocations):
            self.device.free(allocation)
        self.allocations = []
