"""Calling libr4d's device rows on a real card as the engine will (imported by test_device_rows.py
and bench/device_ops.py; holds no tests): operands uploaded with device.alloc / copy_to_device,
weights as RadWeightPlanes of device plane tensors (or the uploaded relayout where the row's layout
hook asks for one), scratch of the hook's size, the launch on an EngineStream, the result read back.
`card()` is None, with the reason, where no CUDA/HIP card is visible or its binding is missing."""

import os

import numpy as np

from radiance.abi import (
    RAD_DT_ENCODED, RAD_DT_U8, RAD_E_UNSUPPORTED, RAD_OK, RadArgs, RadTensor, RadWeightPlanes, dtype_from_numpy,
    rad_device_tensor,
)


def card():
    """(device, stream, None) or (None, None, why). The card is found as `radiance` finds it: the
    one a visibility variable names, else the first card of the machine."""
    try:
        from radiance.launch.devices import pin_this_process
        from radiance.device.selection import backend_name, open_device
        environ = dict(os.environ)
        pin_this_process(environ)
        if backend_name(environ) is None:
            return None, None, "no card on this machine (none in /proc/driver/nvidia/gpus or the kfd topology)"
        device = open_device(environ)
    except Exception as error:  # the binding missing, or no card behind the variable
        return None, None, f"no card: {type(error).__name__}: {error}"
    from radiance.engine.running.device_stream import EngineStream
    return device, EngineStream(device), None


def libr4d_on_card():
    """A card bench's start: (device, stream, registry, libr4d's library) on the card `card()` finds;
    where there is none, "no card: why" printed and exit status 1."""
    device, stream, why = card()
    if device is None:
        print(f"no card: {why}")
        raise SystemExit(1)
    from radiance.engine.loading.registry import Registry

    registry = Registry(radiance_home="")
    return device, stream, registry, next(lib for lib in registry.hierarchy if lib.name == "libr4d")


class Card:
    """Uploads and launches on one device; keeps every allocation until `close`."""

    def __init__(self, device, stream):
        self.device, self.stream, self.keep = device, stream, []

    def alloc(self, nbytes, label="test"):
        allocation = self.device.alloc(max(int(nbytes), 4), label)
        self.keep.append(allocation)
        return allocation.ptr

    def upload(self, array) -> RadTensor:
        array = np.ascontiguousarray(array)
        address = self.alloc(array.nbytes)
        self.device.copy_to_device(address, array, self.stream.handle)
        self.device.synchronize(self.stream.handle)
        return rad_device_tensor(address, dtype_from_numpy(array.dtype), array.shape, array.itemsize)

    def download(self, tensor: RadTensor, like) -> np.ndarray:
        out = np.empty_like(like)
        self.device.synchronize(self.stream.handle)
        self.device.copy_to_host(out, tensor.data, self.stream.handle)
        self.device.synchronize(self.stream.handle)
        return out

    def weight(self, row, weight: RadWeightPlanes, geometry) -> RadTensor:
        code = row.info.layout("w", weight.encoding, dict(geometry)) if row.info.layout else RAD_E_UNSUPPORTED
        if code == RAD_OK:
            return self.upload(np.ascontiguousarray(row.info.relayout(weight, dict(geometry))))
        assert code == RAD_E_UNSUPPORTED, f"{row.name}: layout answered {code}"
        planes = [self.upload(np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)) for t in weight.planes]
        planes = [rad_device_tensor(p.data, RAD_DT_U8, p.shape[:1], 1) for p in planes]
        device_planes = RadWeightPlanes(encoding=weight.encoding, rows=weight.rows, cols=weight.cols, planes=planes)
        return RadTensor(data=device_planes, dtype=RAD_DT_ENCODED, ndim=2, shape=(weight.rows, weight.cols, 0, 0))

    def args(self, row, operands, params, weights=None) -> RadArgs:
        """RadArgs of device tensors: numpy operands uploaded, weights as the row's layout asks."""
        tensors = []
        for i, operand in enumerate(operands):
            if weights and i in weights:
                tensors.append(self.weight(row, weights[i], params))
            elif isinstance(operand, RadTensor):
                tensors.append(operand)
            else:
                tensors.append(self.upload(operand))
        scratch, size = None, 0
        if row.info.scratch:
            size = int(row.info.scratch(dict(params)))
            scratch = self.alloc(size, "scratch")
            self.device.memset32(scratch, 0, -(-max(size, 4) // 4), self.stream.handle)  # as the engine does
        return RadArgs(t=tuple(tensors), params=dict(params), scratch=scratch, scratch_bytes=size, stream=self.stream)

    def run(self, row, operands, params, weights=None, read=()):
        """Launch once; returns {index: host copy} of the operands in `read` (shaped as given)."""
        a = self.args(row, operands, params, weights)
        status = row.info.launch(a)
        assert status == RAD_OK, (row.name, status)
        return {i: self.download(a.t[i], operands[i]) for i in read}

    def replays_agree(self, row, a: RadArgs, out: int, like, times: int = 3) -> np.ndarray:
        """Launch `a` `times` times with the same scratch (as a graph replays it): operand `out` must
        come out the same bits every time (split K's counters reset, partials added in one order);
        returns it."""
        results = []
        for _ in range(times):
            assert row.info.launch(a) == RAD_OK, row.name
            results.append(self.download(a.t[out], like))
        for other in results[1:]:
            np.testing.assert_array_equal(results[0], other)
        return results[0]

    def close(self):
        self.device.synchronize(self.stream.handle)
        for allocation in self.keep:
            self.device.free(allocation)
        self.keep.clear()
