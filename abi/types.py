"""The structs of rad_types.h, field for field. In Python, pointers hold Python objects: tuples of
structs for arrays, callables for function pointers, numpy arrays for RadTensor.data, and a dict
for RadArgs.params (the resolved geometry)."""

import ctypes

from ._cstruct import CStr, Dims, F64, Fn, I32, I64, Ptr, U32, U64, cstruct
from .constants import RAD_C_DIV, RAD_C_EQ, RAD_C_GE, RAD_C_IN, RAD_C_LE, RAD_MAX_DIMS


@cstruct
class RadPluginInfo:
    kind: U32
    name: CStr
    version: CStr
    description: CStr
    build_target: CStr


@cstruct
class RadConstraint:
    key: CStr
    op: I32
    ival: I64
    sval: CStr = None


def RAD_CEQ(key, value):
    """Equality; a string value compares as a string (C: RAD_CEQS)."""
    if isinstance(value, str):
        return RadConstraint(key, RAD_C_EQ, 0, value)
    return RadConstraint(key, RAD_C_EQ, int(value), None)


def RAD_CEQS(key, value):
    return RadConstraint(key, RAD_C_EQ, 0, value)


def RAD_CLE(key, value):
    return RadConstraint(key, RAD_C_LE, int(value), None)


def RAD_CGE(key, value):
    return RadConstraint(key, RAD_C_GE, int(value), None)


def RAD_CDIV(key, value):
    return RadConstraint(key, RAD_C_DIV, int(value), None)


def RAD_CIN(key, values):
    """Membership in a set written as text, separated by spaces or commas."""
    return RadConstraint(key, RAD_C_IN, 0, values)


@cstruct
class RadParamSpec:
    name: CStr
    type: I32
    req: I32
    role: I32


@cstruct
class RadOperandSpec:
    name: CStr
    role: I32
    fixed: I32


@cstruct
class RadOpSchema:
    op: CStr
    params: Ptr = ()
    n_params: I32
    operands: Ptr = ()
    n_operands: I32
    doc: CStr


@cstruct
class RadTensor:
    data: Ptr = None
    dtype: I32
    ndim: I32
    shape: Dims(ctypes.c_int64, RAD_MAX_DIMS)
    pitch: Dims(ctypes.c_int64, RAD_MAX_DIMS)


@cstruct
class RadWeightPlanes:
    encoding: Ptr = None  # a RadEncoding
    rows: I64
    cols: I64
    n_planes: I32
    planes: Ptr = ()  # RadTensor of raw bytes each, in encoding.planes order

    def plane(self, name):
        """The raw bytes of the plane of that name, or None."""
        for spec, tensor in zip(self.encoding.planes, self.planes):
            if spec.name == name:
                return tensor.data
        return None


@cstruct
class RadParam:
    key: CStr
    type: I32
    i: I64
    f: F64
    s: CStr = None


@cstruct
class RadChainRec:
    wait_word: U64  # in Python: see radiance.abi.plugin.ChainWords
    wait_value: U64
    bump_word: U64
    bump_value: U64


@cstruct
class RadLink:
    """In Python `send(array)` and `recv(array)` take a contiguous numpy array and return a status;
    `ctx` is the engine's (C: the first argument of both)."""
    ctx: Ptr = None
    send: Fn
    recv: Fn


@cstruct
class RadPeers:
    rank: I32
    world_size: I32
    buffers: Ptr = ()
    buffer_bytes: I64
    flags: Ptr = ()
    epoch: U64
    link: Ptr = None  # a RadLink to a peer beyond shared memory, else None


@cstruct
class RadArgs:
    t: Ptr = ()
    n_t: I32
    params: Ptr = None
    n_params: I32
    scratch: Ptr = None
    scratch_bytes: I64
    instance: Ptr = None
    stream: Ptr = None
    peers: Ptr = None
    link_gate: Ptr = None
    chain: Ptr = None


@cstruct
class RadTunable:
    name: CStr
    values: CStr
    deflt: I64


@cstruct
class RadKernelInfo:
    name: CStr
    op: CStr
    family: CStr
    computes: CStr
    shape: CStr
    dtypes: CStr
    domain: I32
    priority: I32
    constraints: Ptr = ()
    n_constraints: I32
    launch: Fn
    init: Fn
    fini: Fn
    scratch: Fn
    layout: Fn
    relayout: Fn
    unrelayout: Fn
    opd_shape: Fn
    replaces: CStr
    tunables: Ptr = ()
    n_tunables: I32
    tune_valid: Fn
