"""Calling one row cold, as rad-kbench does: its geometry (the case's parameters, the cold-call keys
and the derived values its own EQ constraints supply), its operands sized by its `opd_shape` and
checked against the case's, weights handed over as its `layout` hook asks, scratch of its hook's
size, `init`/`fini` around the launch. Every operand lies in the middle of an allocation with a
256-byte red zone of POISON on each side, checked after the launch: a row writing a byte past (or
before) an operand is named. On a card (`Card`) the same holds for device memory.

A weight a row relayouts is also handed back through its `unrelayout` and decoded: the planes must
decode to the values the canonical planes do (the stored weight against a dense oracle)."""

import time
from dataclasses import dataclass, field

import numpy as np

from radiance.abi import (
    RAD_C_EQ, RAD_DERIVED, RAD_DT_ENCODED, RAD_DT_NONE, RAD_DT_U8, RAD_E_UNSUPPORTED, RAD_OK, NAMES, RadArgs,
    RadTensor, RadWeightPlanes, dtype_from_numpy, rad_device_tensor, rad_tensor, rad_weight_f32,
)

from .kernel_cases import Weight

RED_ZONE = 256
POISON = 0xA5


class Skip(Exception):
    """The row cannot be called cold: the reason is the report's."""


class Failure(Exception):
    """The row misbehaved before its outputs could be measured (a status, a red zone, opd_shape)."""

    def __init__(self, measure: str, what: str):
        super().__init__(f"{measure}: {what}")
        self.measure, self.what = measure, what


def row_geometry(row, schema, geometry: dict) -> dict:
    """The geometry a row is launched with: the derived parameters its EQ constraints supply."""
    derived = {p.name for p in schema.params if p.req == RAD_DERIVED}
    resolved = dict(geometry)
    for c in row.info.constraints:
        if c.op == RAD_C_EQ and c.key in derived:
            resolved[c.key] = c.sval if c.sval is not None else c.ival
    return resolved


def check_opd_shape(row, schema, geometry: dict, wanted) -> None:
    """The row's opd_shape against the case's operands: Skip without one, Failure where they differ."""
    hook = row.info.opd_shape
    if hook is None:
        raise Skip("no opd_shape")
    try:
        given = hook(dict(geometry), len(schema.operands))
    except Exception as error:  # a plugin's hook may raise anything: it becomes the report's line
        raise Failure("opd_shape", f"raised {type(error).__name__}: {error}") from None
    if given is None or len(given) != len(schema.operands):
        raise Failure("opd_shape", f"gave {None if given is None else len(given)} operands, not {len(schema.operands)}")
    for spec, mine, case in zip(schema.operands, given, wanted):
        dims = tuple(mine.shape[:mine.ndim])
        want = tuple(case.shape[:case.ndim])
        if dims != want or mine.dtype != case.dtype:
            raise Failure("opd_shape", f"operand '{spec.name}' is {NAMES.get(mine.dtype, mine.dtype)} {list(dims)}, "
                                       f"the case's {NAMES.get(case.dtype, case.dtype)} {list(want)}")


# ------------------------------------------------------------------------------------------------
# host memory with red zones

@dataclass
class Guarded:
    """An array in the middle of a poisoned byte buffer."""
    name: str
    buffer: np.ndarray
    array: np.ndarray

    @classmethod
    def of(cls, name: str, values: np.ndarray) -> "Guarded":
        values = np.ascontiguousarray(values)
        buffer = np.full(values.nbytes + 2 * RED_ZONE, POISON, np.uint8)
        array = buffer[RED_ZONE:RED_ZONE + values.nbytes].view(values.dtype).reshape(values.shape)
        array[...] = values
        return cls(name, buffer, array)

    def breach(self) -> str | None:
        before = np.flatnonzero(self.buffer[:RED_ZONE] != POISON)
        after = np.flatnonzero(self.buffer[RED_ZONE + self.array.nbytes:] != POISON)
        if after.size:
            return f"operand '{self.name}' written {int(after[-1]) + 1} byte(s) past its end"
        if before.size:
            return f"operand '{self.name}' written {RED_ZONE - int(before[0])} byte(s) before its start"
        return None


def weight_operand(row, name: str, weight: Weight, geometry: dict, notes: list) -> RadTensor:
    """The weight as the row's layout hook asks; a relayout is handed back through unrelayout."""
    planes = weight.planes
    code = row.info.layout(name, planes.encoding, dict(geometry)) if row.info.layout else RAD_E_UNSUPPORTED
    if code == RAD_OK:
        if row.info.relayout is None:
            raise Failure("layout", f"weight '{name}': layout answered RAD_OK but the row has no relayout")
        stored = row.info.relayout(planes, dict(geometry))
        check_unrelayout(row, name, planes, stored, geometry, notes)
        return RadTensor(data=stored, dtype=RAD_DT_NONE, ndim=2, shape=(planes.rows, planes.cols, 0, 0))
    if code != RAD_E_UNSUPPORTED:
        raise Failure("layout", f"weight '{name}': layout answered {code}")
    return RadTensor(data=planes, dtype=RAD_DT_ENCODED, ndim=2, shape=(planes.rows, planes.cols, 0, 0))


def check_unrelayout(row, name: str, planes: RadWeightPlanes, stored, geometry: dict, notes: list) -> None:
    if row.info.unrelayout is None:
        notes.append(f"weight '{name}' relayouted: no unrelayout, its stored form not compared")
        return
    back = row.info.unrelayout(stored, dict(geometry))
    if not isinstance(back, RadWeightPlanes):
        raise Failure("unrelayout", f"weight '{name}': gave {type(back).__name__}, not RadWeightPlanes")
    want, got = rad_weight_f32(planes), rad_weight_f32(back)
    if np.shape(got) != np.shape(want) or not np.array_equal(np.asarray(got).view(np.uint32),
                                                             np.asarray(want).view(np.uint32)):
        raise Failure("unrelayout", f"weight '{name}': the stored form decodes to other values than the canonical "
                                    f"planes")


@dataclass
class HostCall:
    """A row's cold call on host memory: build once, launch as often as timed."""
    row: object
    schema: object
    geometry: dict
    operands: list  # numpy arrays and Weights, the case's
    guarded: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    args: RadArgs | None = None
    instance: object = None

    def build(self) -> None:
        tensors = []
        for spec, operand in zip(self.schema.operands, self.operands):
            if isinstance(operand, Weight):
                tensors.append(weight_operand(self.row, spec.name, operand, self.geometry, self.notes))
            else:
                guarded = Guarded.of(spec.name, operand)
                self.guarded.append(guarded)
                tensors.append(rad_tensor(guarded.array))
        scratch = None
        if self.row.info.scratch:
            size = int(self.row.info.scratch(dict(self.geometry)))
            scratch = Guarded.of("scratch", np.zeros(max(size, 1), np.uint8))
            self.guarded.append(scratch)
        if self.row.info.init:
            self.instance = self.row.info.init(dict(self.geometry))
        self.args = RadArgs(t=tuple(tensors), params=dict(self.geometry),
                            scratch=None if scratch is None else scratch.array,
                            scratch_bytes=0 if scratch is None else scratch.array.size, instance=self.instance)

    def launch(self) -> None:
        status = self.row.info.launch(self.args)
        if status not in (None, RAD_OK):
            raise Failure("status", f"launch returned {status}")
        for guarded in self.guarded:
            breach = guarded.breach()
            if breach:
                raise Failure("red zone", breach)

    def result(self, index: int) -> np.ndarray:
        return next(g.array for g in self.guarded if g.name == self.schema.operands[index].name).copy()

    def operand(self, name: str):
        return next((g.array for g in self.guarded if g.name == name), None)

    def close(self) -> None:
        if self.instance is not None and self.row.info.fini:
            self.row.info.fini(self.instance)
        self.instance = None


def time_launches(call, budget_s: float = 0.2, least: int = 3, most: int = 200, sync=None) -> float:
    """Median seconds of one launch of the built call, repeated on the same bytes; `sync` waits for
    a card's work (a launch there only enqueues)."""
    times = []
    started = time.perf_counter()
    while len(times) < most and (len(times) < least or time.perf_counter() - started < budget_s):
        t0 = time.perf_counter()
        call.row.info.launch(call.args)
        if sync is not None:
            sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


# ------------------------------------------------------------------------------------------------
# device memory with red zones

class Card:
    """Allocations on a device (a real one or the fake card), each with poisoned red zones."""

    def __init__(self, device, stream):
        self.device, self.stream, self.zones, self.keep = device, stream, [], []

    def alloc(self, name: str, nbytes: int) -> int:
        allocation = self.device.alloc(nbytes + 2 * RED_ZONE, f"kbench {name}")
        self.keep.append(allocation)
        words = -(-(nbytes + 2 * RED_ZONE) // 4)
        self.device.memset32(allocation.ptr, POISON * 0x01010101, words, self.stream.handle)
        self.zones.append((name, allocation.ptr, nbytes))
        return allocation.ptr + RED_ZONE

    def upload(self, name: str, array: np.ndarray) -> RadTensor:
        array = np.ascontiguousarray(array)
        address = self.alloc(name, array.nbytes)
        self.device.copy_to_device(address, array, self.stream.handle)
        return rad_device_tensor(address, dtype_from_numpy(array.dtype), array.shape, array.itemsize)

    def download(self, address: int, like: np.ndarray) -> np.ndarray:
        out = np.empty_like(like)
        self.device.synchronize(self.stream.handle)
        self.device.copy_to_host(out, address, self.stream.handle)
        self.device.synchronize(self.stream.handle)
        return out

    def sync(self) -> None:
        self.device.synchronize(self.stream.handle)

    def breach(self) -> str | None:
        """The first red zone written since allocation, named."""
        self.device.synchronize(self.stream.handle)
        for name, ptr, nbytes in self.zones:
            for where, start in (("past its end", ptr + RED_ZONE + nbytes), ("before its start", ptr)):
                zone = np.empty(RED_ZONE, np.uint8)
                self.device.copy_to_host(zone, start, self.stream.handle)
                self.device.synchronize(self.stream.handle)
                bad = np.flatnonzero(zone != POISON)
                if bad.size:
                    count = int(bad[-1]) + 1 if where == "past its end" else RED_ZONE - int(bad[0])
                    return f"device operand '{name}' written {count} byte(s) {where}"
        return None

    def weight(self, row, name: str, weight: Weight, geometry: dict, notes: list) -> RadTensor:
        planes = weight.planes
        code = row.info.layout(name, planes.encoding, dict(geometry)) if row.info.layout else RAD_E_UNSUPPORTED
        if code == RAD_OK:
            stored = np.ascontiguousarray(row.info.relayout(planes, dict(geometry)))
            check_unrelayout(row, name, planes, stored, geometry, notes)
            return self.upload(name, stored)
        if code != RAD_E_UNSUPPORTED:
            raise Failure("layout", f"weight '{name}': layout answered {code}")
        on_card = []
        for spec, tensor in zip(planes.encoding.planes, planes.planes):
            data = np.ascontiguousarray(tensor.data if isinstance(tensor, RadTensor) else tensor).view(np.uint8)
            uploaded = self.upload(f"{name}.{spec.name}", data.reshape(-1))
            on_card.append(rad_device_tensor(uploaded.data, RAD_DT_U8, uploaded.shape[:1], 1))
        device_planes = RadWeightPlanes(encoding=planes.encoding, rows=planes.rows, cols=planes.cols, planes=on_card)
        return RadTensor(data=device_planes, dtype=RAD_DT_ENCODED, ndim=2, shape=(planes.rows, planes.cols, 0, 0))

    def close(self) -> None:
        self.device.synchronize(self.stream.handle)
        for allocation in self.keep:
            self.device.free(allocation)
        self.keep.clear()
        self.zones.clear()


@dataclass
class DeviceCall:
    """A device row's cold call: operands uploaded into red-zoned allocations, read back after."""
    row: object
    schema: object
    geometry: dict
    operands: list
    card: Card
    notes: list = field(default_factory=list)
    args: RadArgs | None = None
    host: dict = field(default_factory=dict)  # operand index -> (device address, host array like it)
    instance: object = None

    def build(self) -> None:
        tensors = []
        for i, (spec, operand) in enumerate(zip(self.schema.operands, self.operands)):
            if isinstance(operand, Weight):
                tensors.append(self.card.weight(self.row, spec.name, operand, self.geometry, self.notes))
            else:
                tensor = self.card.upload(spec.name, operand)
                self.host[i] = (tensor.data, operand)
                tensors.append(tensor)
        scratch, size = None, 0
        if self.row.info.scratch:
            size = int(self.row.info.scratch(dict(self.geometry)))
            scratch = self.card.alloc("scratch", max(size, 4))
            self.card.device.memset32(scratch, 0, -(-max(size, 4) // 4), self.card.stream.handle)
        if self.row.info.init:
            self.instance = self.row.info.init(dict(self.geometry))
        self.args = RadArgs(t=tuple(tensors), params=dict(self.geometry), scratch=scratch, scratch_bytes=size,
                            stream=self.card.stream, instance=self.instance)

    def launch(self) -> None:
        status = self.row.info.launch(self.args)
        if status not in (None, RAD_OK):
            raise Failure("status", f"launch returned {status}")
        breach = self.card.breach()
        if breach:
            raise Failure("red zone", breach)

    def result(self, index: int) -> np.ndarray:
        address, like = self.host[index]
        return self.card.download(address, like)

    def close(self) -> None:
        if self.instance is not None and self.row.info.fini:
            self.row.info.fini(self.instance)
        self.instance = None
