"""The structs of rad_arch.h. In Python: check(hyper: dict) -> "" or a one-line reason;
declare(hyper: dict, weights: {name: RadWeightInfo}) -> RadGraphDecl; RadNodeDecl.params a dict
(the C array of RadParam), operands a tuple of names, tables' `table` a RadTensor of a numpy array.

The import hooks: takes(kind, family) -> bool; hyper(source: RadSourceInfo) -> dict, or a one-line
reason (str); weights(hyper: dict) -> [RadWeightSpec]. RadSourceInfo.meta is a dict (lists and
tables as Python lists and dicts), tensors a dict {source name: RadWeightInfo}, read_f32 a callable
(tensor name) -> f32 ndarray, reader None."""

from ._cstruct import CStr, Embedded, F64, Fn, I32, I64, Ptr, cstruct
from .types import RadTensor


@cstruct
class RadWeightDecl:
    name: CStr
    source: CStr
    split: I32
    parts: I32


@cstruct
class RadBufferDecl:
    name: CStr
    dtype: I32
    extent: I32
    cols: I64
    split: I32
    parts: I32


@cstruct
class RadTableDecl:
    name: CStr
    table: Embedded(RadTensor) = None

    @property
    def data(self):
        return self.table.data


@cstruct
class RadNodeDecl:
    op: CStr
    name: CStr
    extent: I32
    params: Ptr = None
    n_params: I32
    split: CStr
    operands: Ptr = ()
    n_operands: I32

    def __post_init__(self):
        self.params = dict(self.params or {})
        self.n_params = len(self.params)


@cstruct
class RadGraphDecl:
    weights: Ptr = ()
    n_weights: I32
    tables: Ptr = ()
    n_tables: I32
    buffers: Ptr = ()
    n_buffers: I32
    nodes: Ptr = ()
    n_nodes: I32


@cstruct
class RadWeightInfo:
    name: CStr
    rows: I64
    cols: I64
    format: CStr


@cstruct
class RadSourceInfo:
    kind: I32
    family: CStr
    meta: Ptr = None
    n_meta: I32
    tensors: Ptr = None
    n_tensors: I32
    read_f32: Fn = None
    reader: Ptr = None

    def __post_init__(self):
        self.meta, self.tensors = dict(self.meta or {}), dict(self.tensors or {})
        self.n_meta, self.n_tensors = len(self.meta), len(self.tensors)


@cstruct
class RadWeightSpec:
    name: CStr
    gguf: CStr
    hf: CStr
    ndim: I32
    rows: I64
    cols: I64
    optional: I32
    fill: I32
    hf_offset: F64

    @property
    def shape(self) -> tuple:
        """As the container stores it: (rows, cols), or (cols,) for a vector."""
        return (self.cols,) if self.ndim == 1 else (self.rows, self.cols)


@cstruct
class RadArchOption:
    key: CStr
    type: I32
    deflt: CStr
    doc: CStr


@cstruct
class RadArchInfo:
    name: CStr
    doc: CStr
    check: Ptr = None
    declare: Ptr = None
    takes: Fn = None
    hyper: Fn = None
    weights: Fn = None
    synthetic: Ptr = ()
    n_synthetic: I32
