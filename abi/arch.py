"""The structs of rad_arch.h. In Python: check(hyper: dict) -> "" or a one-line reason;
declare(hyper: dict, weights: {name: RadWeightInfo}) -> RadGraphDecl; RadNodeDecl.params a dict
(the C array of RadParam), operands a tuple of names, tables' `table` a RadTensor of a numpy array."""

from ._cstruct import CStr, Embedded, I32, I64, Ptr, cstruct
from .types import RadTensor


@cstruct
class RadWeightDecl:
    name: CStr
    source: CStr
    split: I32


@cstruct
class RadBufferDecl:
    name: CStr
    dtype: I32
    extent: I32
    cols: I64
    split: I32


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
class RadArchInfo:
    name: CStr
    doc: CStr
    check: Ptr = None
    declare: Ptr = None
