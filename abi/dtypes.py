"""Element types: bits per element and the numpy dtype of the byte-addressable ones.
bf16 and fp8/fp4 come from ml_dtypes, imported where one is first met; sub-byte integer codes are
bit streams along a row."""

import numpy as np

from . import constants as c

BITS = {
    c.RAD_DT_F32: 32, c.RAD_DT_F16: 16, c.RAD_DT_BF16: 16, c.RAD_DT_F64: 64,
    c.RAD_DT_I8: 8, c.RAD_DT_U8: 8, c.RAD_DT_I16: 16, c.RAD_DT_U16: 16,
    c.RAD_DT_I32: 32, c.RAD_DT_U32: 32, c.RAD_DT_I64: 64, c.RAD_DT_U64: 64,
    c.RAD_DT_U1: 1, c.RAD_DT_U2: 2, c.RAD_DT_U3: 3, c.RAD_DT_U4: 4, c.RAD_DT_U5: 5, c.RAD_DT_U6: 6,
    c.RAD_DT_I4: 4,
    c.RAD_DT_FP4_E2M1: 4, c.RAD_DT_FP8_E4M3: 8, c.RAD_DT_FP8_E5M2: 8,
}

class _Types(dict):
    """{RAD_DT_*: numpy dtype}, numpy's own types at once and ml_dtypes' (bf16, fp8, fp4) on first use:
    importing ml_dtypes costs a process about a second of CPU (0.7.0 on a 2-core EPYC; 0.3 s for 0.6.0),
    which every rank and CLI process that never meets those types should not pay."""

    def __init__(self, own: dict, extended: dict):
        super().__init__(own)
        self._extended = dict(extended)  # RAD_DT_* -> the ml_dtypes attribute

    def _resolve(self) -> None:
        if self._extended:
            import ml_dtypes

            for code, name in self._extended.items():
                dict.__setitem__(self, code, np.dtype(getattr(ml_dtypes, name)))
            self._extended.clear()

    def __missing__(self, code):
        if code in self._extended:
            self._resolve()
            return dict.__getitem__(self, code)
        raise KeyError(code)

    def __contains__(self, code) -> bool:
        return dict.__contains__(self, code) or code in self._extended

    def get(self, code, default=None):
        return self[code] if code in self else default

    def items(self):
        self._resolve()
        return dict.items(self)

    def values(self):
        self._resolve()
        return dict.values(self)

    def keys(self):
        self._resolve()
        return dict.keys(self)

    def __iter__(self):
        self._resolve()
        return dict.__iter__(self)

    def __len__(self) -> int:
        return dict.__len__(self) + len(self._extended)


NUMPY = _Types({
    c.RAD_DT_F32: np.dtype(np.float32), c.RAD_DT_F16: np.dtype(np.float16), c.RAD_DT_F64: np.dtype(np.float64),
    c.RAD_DT_I8: np.dtype(np.int8), c.RAD_DT_U8: np.dtype(np.uint8),
    c.RAD_DT_I16: np.dtype(np.int16), c.RAD_DT_U16: np.dtype(np.uint16),
    c.RAD_DT_I32: np.dtype(np.int32), c.RAD_DT_U32: np.dtype(np.uint32),
    c.RAD_DT_I64: np.dtype(np.int64), c.RAD_DT_U64: np.dtype(np.uint64),
}, {c.RAD_DT_BF16: "bfloat16", c.RAD_DT_FP8_E4M3: "float8_e4m3fn", c.RAD_DT_FP8_E5M2: "float8_e5m2"})

# Sub-byte types read as these once their bits are unpacked.
UNPACKED = _Types({
    c.RAD_DT_U1: np.dtype(np.uint8), c.RAD_DT_U2: np.dtype(np.uint8), c.RAD_DT_U3: np.dtype(np.uint8),
    c.RAD_DT_U5: np.dtype(np.uint8),
    c.RAD_DT_U4: np.dtype(np.uint8), c.RAD_DT_U6: np.dtype(np.uint8),
    c.RAD_DT_I4: np.dtype(np.int8),
}, {c.RAD_DT_FP4_E2M1: "float4_e2m1fn"})

NAMES = {
    c.RAD_DT_F32: "f32", c.RAD_DT_F16: "f16", c.RAD_DT_BF16: "bf16", c.RAD_DT_F64: "f64",
    c.RAD_DT_I8: "i8", c.RAD_DT_U8: "u8", c.RAD_DT_I16: "i16", c.RAD_DT_U16: "u16",
    c.RAD_DT_I32: "i32", c.RAD_DT_U32: "u32", c.RAD_DT_I64: "i64", c.RAD_DT_U64: "u64",
    c.RAD_DT_U1: "u1", c.RAD_DT_U2: "u2", c.RAD_DT_U3: "u3", c.RAD_DT_U4: "u4", c.RAD_DT_U5: "u5",
    c.RAD_DT_U6: "u6", c.RAD_DT_I4: "i4",
    c.RAD_DT_FP4_E2M1: "fp4_e2m1", c.RAD_DT_FP8_E4M3: "fp8_e4m3", c.RAD_DT_FP8_E5M2: "fp8_e5m2",
}
BY_NAME = {name: code for code, name in NAMES.items()}


def dtype_bits(dtype: int) -> int:
    return BITS[dtype]


def dtype_from_numpy(dtype) -> int:
    dtype = np.dtype(dtype)
    for code, candidate in dict.items(NUMPY):  # numpy's own first: no ml_dtypes for them
        if candidate == dtype:
            return code
    for code, candidate in NUMPY.items():
        if candidate == dtype:
            return code
    raise ValueError(f"no RAD_DT_* for numpy dtype {dtype}")


def row_bytes(dtype: int, count: int) -> int:
    """Bytes of a row of `count` elements: sub-byte rows round up to a whole byte."""
    return (count * BITS[dtype] + 7) // 8
