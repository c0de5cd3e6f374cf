"""A C plugin's function pointers as the Python callables the engine calls on any plugin, with the
Python plugins' signatures (docs/PLUGINS.md), so the engine never knows which kind it called:

    launch(a: RadArgs) -> status                   init(geometry) -> instance, fini(instance)
    scratch(geometry) -> bytes                     layout(weight, encoding, geometry) -> status
    relayout(weight: RadWeightPlanes, geometry) -> stored (a numpy array)
    unrelayout(stored, geometry) -> RadWeightPlanes
    opd_shape(geometry, n_operands) -> (RadTensor, ...) with data None
    tune_valid(geometry) -> bool
    quantiser: encoding(weight, shape, options), row_block(encoding, shape), quantize(encoding, rows,
        r0, options) -> {plane: raw bytes}, decode(encoding, planes, shape) -> f32 or RAD_E_UNSUPPORTED
    architecture: check(hyper) -> "" or a reason, declare(hyper, weights) -> RadGraphDecl

A launch's C RadArgs is built once per Python RadArgs (the executors build those once per step
shape) and refreshed where a launch changes it (the chain record, the link-gate word, the peers'
epoch); a hook that fails is one line naming the row and what it returned.
"""

from __future__ import annotations

import ctypes
import weakref
from ctypes import POINTER, byref, c_char_p, c_float, c_int, c_int32, c_int64, c_void_p

import numpy as np

from radiance.abi import (
    NUMPY, RAD_DT_NONE, RAD_E_UNSUPPORTED, RAD_MAX_DIMS, RAD_MAX_PLANES, RAD_OK, RadArgs, RadChainRec,
    RadEncoding, RadGraphDecl, RadParam, RadPeers, RadTensor, RadWeightPlanes, rad_tensor,
)
from radiance.abi.dtypes import BITS, row_bytes
from radiance.weights.planes import plane_shape, stored

from .c_stream import stream_table
from .c_structs import CBuilder, CTableError, from_c, tensor_from_c

P_PARAM, P_TENSOR, P_ENCODING = POINTER(RadParam.ctype), POINTER(RadTensor.ctype), POINTER(RadEncoding.ctype)
LAUNCH = ctypes.CFUNCTYPE(c_int, POINTER(RadArgs.ctype))
INIT = ctypes.CFUNCTYPE(c_int, P_PARAM, c_int32, POINTER(c_void_p))
FINI = ctypes.CFUNCTYPE(None, c_void_p)
SCRATCH = ctypes.CFUNCTYPE(c_int64, P_PARAM, c_int32)
LAYOUT = ctypes.CFUNCTYPE(c_int, c_char_p, P_ENCODING, P_PARAM, c_int32)
RELAYOUT = ctypes.CFUNCTYPE(c_int, P_ENCODING, P_TENSOR, c_int32, P_TENSOR)
OPD_SHAPE = ctypes.CFUNCTYPE(c_int, P_PARAM, c_int32, P_TENSOR, c_int32)
TUNE_VALID = ctypes.CFUNCTYPE(c_int, P_PARAM, c_int32)
Q_ENCODING = ctypes.CFUNCTYPE(c_int, c_char_p, POINTER(c_int64), c_int32, P_PARAM, c_int32, P_ENCODING)
Q_ROW_BLOCK = ctypes.CFUNCTYPE(c_int64, P_ENCODING, POINTER(c_int64), c_int32)
Q_QUANTIZE = ctypes.CFUNCTYPE(c_int, P_ENCODING, POINTER(c_float), c_int64, c_int64, c_int64, P_PARAM, c_int32,
                              P_TENSOR, c_int32)
Q_DECODE = ctypes.CFUNCTYPE(c_int, P_ENCODING, P_TENSOR, c_int32, POINTER(c_float), c_int64, c_int64)
A_CHECK = ctypes.CFUNCTYPE(c_int, P_PARAM, c_int32, c_char_p, c_int32)
A_DECLARE = ctypes.CFUNCTYPE(c_int, P_PARAM, c_int32, POINTER(ctypes.c_byte), c_int32, c_void_p)
ERROR_BYTES = 512


class HookFailed(RuntimeError):
    """A C hook returned a failure: one line naming the row (or quantiser) and the status."""


class Hook:
    """One function pointer, called with the Python signature; `__name__` is the hook's name."""

    def __init__(self, ftype, address: int, hook: str, owner: str):
        self.fn, self.__name__, self.owner = ftype(address), hook, owner

    def fail(self, what) -> HookFailed:
        return HookFailed(f"{self.owner}: {self.__name__} {what}")

    def __repr__(self):
        return f"<C {self.__name__} of {self.owner}>"


class Instance:
    """What a C init made: the pointer handed back in RadArgs.instance and to fini."""

    def __init__(self, pointer: int | None):
        self.pointer = pointer


class StoredWeight(np.ndarray):
    """What a C relayout produced: the row's own form, which remembers what it was made from so
    its unrelayout can give the canonical planes back."""
    encoding = None
    rows = cols = 0


def _geometry(builder: CBuilder, geometry: dict):
    return builder.params(dict(geometry or {}))


# ---- a kernel row's hooks ----------------------------------------------------------------------

class _Args:
    """The C RadArgs of one Python RadArgs, and what keeps its buffers alive."""

    def __init__(self, args):
        self.t, self.params, self.scratch = args.t, args.params, args.scratch
        self.instance, self.stream, self.peers = args.instance, args.stream, args.peers
        builder = self.builder = CBuilder()
        tensors = builder.tensors(args.t)
        params, count = builder.params(dict(args.params or {}))
        self.c = RadArgs.ctype(ctypes.addressof(tensors), len(args.t), ctypes.addressof(params), count)
        if args.scratch is not None:
            self.c.scratch = ctypes.c_void_p(_pointer(args.scratch)).value
            self.c.scratch_bytes = int(args.scratch_bytes or getattr(args.scratch, "nbytes", 0))
        if args.instance is not None:
            self.c.instance = args.instance.pointer if isinstance(args.instance, Instance) else _pointer(args.instance)
        self.table = stream_table(args.stream) if args.stream is not None else None
        if self.table is not None:
            self.c.stream = self.table.address
        self.c_peers = None
        if isinstance(args.peers, RadPeers):
            peers = args.peers
            buffers = (c_void_p * peers.world_size)(*(_pointer(b) for b in peers.buffers))
            flags = (c_void_p * peers.world_size)(*(_pointer(f) for f in peers.flags))
            self.c_peers = RadPeers.ctype(peers.rank, peers.world_size, ctypes.addressof(buffers), peers.buffer_bytes,
                                          ctypes.addressof(flags), peers.epoch)
            builder.keep += [buffers, flags, peers.buffers, peers.flags]
            self.c.peers = ctypes.addressof(self.c_peers)
        self.c_chain = RadChainRec.ctype()
        self.pointer = byref(self.c)

    def current(self, args) -> bool:
        return (args.t is self.t and args.params is self.params and args.scratch is self.scratch
                and args.instance is self.instance and args.stream is self.stream and args.peers is self.peers)

    def refresh(self, args) -> None:
        """What may change from one launch to the next of the same RadArgs."""
        self.c.link_gate = None if args.link_gate is None else _pointer(args.link_gate)
        if args.chain is None:
            self.c.chain = None
        else:
            chain = args.chain
            self.c_chain.wait_word, self.c_chain.bump_word = _pointer(chain.wait_word), _pointer(chain.bump_word)
            self.c_chain.wait_value, self.c_chain.bump_value = int(chain.wait_value), int(chain.bump_value)
            self.c.chain = ctypes.addressof(self.c_chain)
        if self.c_peers is not None:
            self.c_peers.epoch = int(args.peers.epoch)

    def after(self, args) -> None:
        if self.c_peers is not None:
            args.peers.epoch = int(self.c_peers.epoch)  # a collective row bumps it once per launch


def _pointer(value) -> int:
    if isinstance(value, np.ndarray):
        return value.ctypes.data
    return int(getattr(value, "ptr", value))


class Launch(Hook):
    def __init__(self, address: int, owner: str):
        super().__init__(LAUNCH, address, "launch", owner)
        self._args: dict[int, _Args] = {}

    def __call__(self, args) -> int:
        key = id(args)
        state = self._args.get(key)
        if state is None or not state.current(args):
            if state is None:  # an id seen again belongs to a new RadArgs only once the old one died
                weakref.finalize(args, self._args.pop, key, None)
            state = self._args[key] = _Args(args)
        state.refresh(args)
        status = self.fn(state.pointer)
        state.after(args)
        if state.table is not None:
            error = state.table.take_pending()
            if error is not None:
                raise error
        return status


class Init(Hook):
    def __init__(self, address, owner):
        super().__init__(INIT, address, "init", owner)

    def __call__(self, geometry):
        builder, instance = CBuilder(), c_void_p()
        params, count = _geometry(builder, geometry)
        status = self.fn(params, count, byref(instance))
        if status != RAD_OK:
            raise self.fail(f"returned {status}")
        return Instance(instance.value)


class Fini(Hook):
    def __init__(self, address, owner):
        super().__init__(FINI, address, "fini", owner)

    def __call__(self, instance) -> None:
        self.fn(instance.pointer if isinstance(instance, Instance) else instance)


class Scratch(Hook):
    def __init__(self, address, owner):
        super().__init__(SCRATCH, address, "scratch", owner)

    def __call__(self, geometry) -> int:
        builder = CBuilder()
        nbytes = int(self.fn(*_geometry(builder, geometry)))
        if nbytes < 0:
            raise self.fail(f"returned {nbytes} bytes")
        return nbytes


class Layout(Hook):
    def __init__(self, address, owner):
        super().__init__(LAYOUT, address, "layout", owner)

    def __call__(self, weight: str, encoding: RadEncoding, geometry) -> int:
        builder = CBuilder()
        return int(self.fn(weight.encode(), byref(builder.encoding(encoding)), *_geometry(builder, geometry)))


def _allocate(c_tensor, what) -> np.ndarray:
    """The array a sized RadTensor asks for (its dtype and shape), and its data and pitch set."""
    ndim = int(c_tensor.ndim)
    if not 1 <= ndim <= RAD_MAX_DIMS:
        raise what(f"asked for a tensor of {ndim} dimensions")
    shape = [int(c_tensor.shape[d]) for d in range(ndim)]
    if min(shape) < 0:
        raise what(f"asked for a tensor of shape {shape}")
    dtype = int(c_tensor.dtype)
    if dtype in NUMPY:
        array = np.zeros(shape, NUMPY[dtype])
    elif dtype in BITS:  # sub-byte: whole bytes per row
        array = np.zeros(shape[:-1] + [row_bytes(dtype, shape[-1])], np.uint8)
    elif dtype == RAD_DT_NONE:  # the row's own bytes
        array = np.zeros(shape, np.uint8)
    else:
        raise what(f"asked for a tensor of dtype {dtype}")
    c_tensor.data = array.ctypes.data
    for d in range(RAD_MAX_DIMS):
        c_tensor.pitch[d] = array.strides[d] if d < array.ndim else 0
    return array


class Relayout(Hook):
    """Two calls: the first with `out->data` NULL and `out->shape` the weight's [rows, cols] sizes
    the stored form (the hook sets dtype, ndim, shape), the engine allocates it, the second fills it."""

    def __init__(self, address, owner):
        super().__init__(RELAYOUT, address, "relayout", owner)

    def __call__(self, weight: RadWeightPlanes, geometry=None) -> np.ndarray:
        builder, out = CBuilder(), RadTensor.ctype()
        out.ndim, out.shape[0], out.shape[1] = 2, weight.rows, weight.cols
        encoding, planes = byref(builder.encoding(weight.encoding)), builder.tensors(weight.planes)
        for attempt in ("sizing", "filling"):
            status = self.fn(encoding, planes, len(weight.planes), byref(out))
            if status != RAD_OK:
                raise self.fail(f"returned {status} {attempt} the stored form")
            if attempt == "sizing":
                array = _allocate(out, self.fail)
        result = array.view(StoredWeight)
        result.encoding, result.rows, result.cols = weight.encoding, weight.rows, weight.cols
        return result


class Unrelayout(Hook):
    """The inverse: the stored form in (one tensor), the canonical planes out (the engine allocates
    them at the encoding's sizes)."""

    def __init__(self, address, owner):
        super().__init__(RELAYOUT, address, "unrelayout", owner)

    def __call__(self, stored_form, geometry=None) -> RadWeightPlanes:
        if not isinstance(stored_form, StoredWeight):
            raise self.fail("was handed a stored form its relayout did not make")
        encoding, shape = stored_form.encoding, (stored_form.rows, stored_form.cols)
        planes = [np.zeros((plane_shape(p, shape)[0], row_bytes(p.dtype, plane_shape(p, shape)[1])), np.uint8)
                  for p in encoding.planes]
        builder = CBuilder()
        source = builder.tensors([RadTensor(data=np.asarray(stored_form), dtype=RAD_DT_NONE, ndim=stored_form.ndim,
                                            shape=tuple(stored_form.shape) + (0,) * (4 - stored_form.ndim),
                                            pitch=tuple(stored_form.strides) + (0,) * (4 - stored_form.ndim))])
        out = builder.plane_tensors(encoding, {p.name: a for p, a in zip(encoding.planes, planes)}, shape)
        status = self.fn(byref(builder.encoding(encoding)), source, 1, out)
        if status != RAD_OK:
            raise self.fail(f"returned {status}")
        return RadWeightPlanes(encoding=encoding, rows=shape[0], cols=shape[1], planes=[rad_tensor(a) for a in planes])


class OpdShape(Hook):
    def __init__(self, address, owner):
        super().__init__(OPD_SHAPE, address, "opd_shape", owner)

    def __call__(self, geometry, n_operands: int) -> tuple:
        builder = CBuilder()
        operands = (RadTensor.ctype * max(1, n_operands))()
        status = self.fn(*_geometry(builder, geometry), operands, n_operands)
        if status != RAD_OK:
            raise self.fail(f"returned {status}")
        return tuple(tensor_from_c(operands[i]) for i in range(n_operands))


class TuneValid(Hook):
    def __init__(self, address, owner):
        super().__init__(TUNE_VALID, address, "tune_valid", owner)

    def __call__(self, geometry) -> bool:
        return bool(self.fn(*_geometry(CBuilder(), geometry)))


ROW_HOOKS = {"launch": Launch, "init": Init, "fini": Fini, "scratch": Scratch, "layout": Layout,
             "relayout": Relayout, "unrelayout": Unrelayout, "opd_shape": OpdShape, "tune_valid": TuneValid}


def wrap_row(info, library: str):
    """A RadKernelInfo read from C (hooks as addresses) with its hooks wrapped."""
    owner = f"row '{info.name}' of {library}"
    for hook, cls in ROW_HOOKS.items():
        address = getattr(info, hook)
        setattr(info, hook, cls(address, owner) if address else None)
    return info


# ---- a quantiser's hooks -----------------------------------------------------------------------

def _c_encoding(builder, encoding):
    return byref(builder.encoding(encoding))


def _shape(shape) -> ctypes.Array:
    return (c_int64 * len(shape))(*shape)


class QEncoding(Hook):
    def __init__(self, address, owner):
        super().__init__(Q_ENCODING, address, "encoding", owner)

    def __call__(self, weight: str, shape, options: dict) -> RadEncoding:
        builder, out = CBuilder(), RadEncoding.ctype()
        status = self.fn(weight.encode(), _shape(shape), len(shape), *builder.params(options), byref(out))
        if status != RAD_OK:
            raise self.fail(f"returned {status} for '{weight}' {list(shape)}")
        if not 0 <= out.n_planes <= RAD_MAX_PLANES:
            raise self.fail(f"gave {out.n_planes} planes for '{weight}'")
        return from_c(RadEncoding, out)


class QRowBlock(Hook):
    def __init__(self, address, owner):
        super().__init__(Q_ROW_BLOCK, address, "row_block", owner)

    def __call__(self, encoding, shape) -> int:
        builder = CBuilder()
        return int(self.fn(_c_encoding(builder, encoding), _shape(shape), len(shape)))


class QQuantize(Hook):
    """The engine allocates every plane over the block's rows (a TABLE plane whole) and the
    quantiser fills them: {plane name: raw bytes [plane rows, row bytes]}."""

    def __init__(self, address, owner):
        super().__init__(Q_QUANTIZE, address, "quantize", owner)

    def __call__(self, encoding, rows: np.ndarray, r0: int, options: dict) -> dict:
        rows = np.ascontiguousarray(rows, np.float32)
        count, cols = rows.shape
        planes = {p.name: np.zeros((plane_shape(p, (count, cols))[0], row_bytes(p.dtype, plane_shape(p, (count, cols))[1])),
                                   np.uint8) for p in encoding.planes}
        builder = CBuilder()
        out = builder.plane_tensors(encoding, planes, (count, cols))
        status = self.fn(_c_encoding(builder, encoding), rows.ctypes.data_as(POINTER(c_float)), r0, count, cols,
                         *builder.params(options), out, len(encoding.planes))
        if status != RAD_OK:
            raise self.fail(f"returned {status} for rows {r0}..{r0 + count}")
        return planes


class QDecode(Hook):
    def __init__(self, address, owner):
        super().__init__(Q_DECODE, address, "decode", owner)

    def __call__(self, encoding, planes: dict, shape):
        rows, cols = shape
        raw = {p.name: stored(p, planes[p.name], shape) for p in encoding.planes}
        builder = CBuilder()
        out = np.zeros((rows, cols), np.float32)
        status = self.fn(_c_encoding(builder, encoding), builder.plane_tensors(encoding, raw, shape), len(raw),
                         out.ctypes.data_as(POINTER(c_float)), rows, cols)
        if status == RAD_E_UNSUPPORTED:
            return RAD_E_UNSUPPORTED
        if status != RAD_OK:
            raise self.fail(f"returned {status}")
        return out


QUANT_HOOKS = {"encoding": QEncoding, "row_block": QRowBlock, "quantize": QQuantize, "decode": QDecode}


def wrap_quantizer(info, library: str):
    owner = f"quantiser '{info.name}' of {library}"
    for hook, cls in QUANT_HOOKS.items():
        address = getattr(info, hook)
        setattr(info, hook, cls(address, owner) if address else None)
    return info


# ---- an architecture's hooks -------------------------------------------------------------------

def _hyper(hyper: dict) -> dict:
    """The hyper-parameters a C hook can take: numbers and strings (a bool as 0/1)."""
    return {key: int(value) if isinstance(value, bool) else value for key, value in hyper.items()
            if isinstance(value, (bool, int, float, str, np.integer, np.floating))}


class ACheck(Hook):
    def __init__(self, address, owner):
        super().__init__(A_CHECK, address, "check", owner)

    def __call__(self, hyper: dict) -> str:
        builder, error = CBuilder(), ctypes.create_string_buffer(ERROR_BYTES)
        status = self.fn(*builder.params(_hyper(hyper)), error, ERROR_BYTES)
        if status == RAD_OK:
            return ""
        return error.value.decode(errors="replace") or f"check returned {status}"


class ADeclare(Hook):
    def __init__(self, address, owner):
        super().__init__(A_DECLARE, address, "declare", owner)

    def __call__(self, hyper: dict, weights: dict) -> RadGraphDecl:
        builder, out = CBuilder(), RadGraphDecl.ctype()
        infos, count = builder.weight_infos(weights)
        status = self.fn(*builder.params(_hyper(hyper)), ctypes.cast(infos, POINTER(ctypes.c_byte)), count,
                         ctypes.addressof(out))
        if status != RAD_OK:
            raise self.fail(f"returned {status}")
        try:
            return from_c(RadGraphDecl, out)
        except CTableError as error:
            raise self.fail(f"gave a graph that cannot be read: {error}") from None


ARCH_HOOKS = {"check": ACheck, "declare": ADeclare}


def wrap_architecture(info, library: str):
    owner = f"architecture '{info.name}' of {library}"
    for hook, cls in ARCH_HOOKS.items():
        address = getattr(info, hook)
        setattr(info, hook, cls(address, owner) if address else None)
    return info
