"""The structs of rad_quant.h. Python quantisers pass Python callables:
encoding(weight, shape, options) -> RadEncoding; row_block(encoding, shape) -> int;
quantize(encoding, rows: f32 ndarray, r0, options) -> {plane name: ndarray};
decode(encoding, planes, shape) -> f32 ndarray or RAD_E_UNSUPPORTED."""

from ._cstruct import CStr, Fn, I32, Ptr, cstruct


@cstruct
class RadQuantOption:
    key: CStr
    type: I32
    deflt: CStr
    doc: CStr


@cstruct
class RadQuantizerInfo:
    name: CStr
    doc: CStr
    options: Ptr = ()
    n_options: I32
    encoding: Fn
    row_block: Fn
    quantize: Fn
    decode: Fn
