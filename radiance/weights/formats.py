"""Common encodings as data (docs/ENCODINGS.md gives each one's planes and formula).

Conventions fixed here: a constant over the whole weight is a TILED plane of block [0x0] (one
element, carried whole by every slice): Q4_0's zero of 8, Q5_0's of 16, Q3_K's of 4, Q6_K's of 32,
a per-tensor scale. A GGUF minimum that is added (Q4_1, Q5_1: w = d*q + m) is stored negated
(min = -m), so the decoder follows the specification's v = q*scale - min literally; the k-quants'
minimums (Q2_K, Q4_K, Q5_K) are subtracted already.
"""

from radiance.abi import (
    BY_NAME, RAD_DT_F16, RAD_DT_F32, RAD_DT_FP4_E2M1, RAD_DT_FP8_E4M3, RAD_DT_I8, RAD_DT_U2, RAD_DT_U3,
    RAD_DT_U4, RAD_DT_U5, RAD_DT_U6, RAD_DT_U8, RAD_PLANE_TABLE, RAD_PLANE_TILED, RadEncoding, RadPlane,
)

WHOLE = 0  # a block extent of 0: the whole extent of the weight


def tiled(name: str, dtype: int, block_rows: int = 1, block_cols: int = 1) -> RadPlane:
    """A plane covering the weight, one element per [block_rows, block_cols] block."""
    return RadPlane(name=name, dtype=dtype, kind=RAD_PLANE_TILED,
                    block_rows=block_rows, block_cols=block_cols)


def table(name: str, dtype: int, rows: int, cols: int) -> RadPlane:
    """A plane of its own [rows, cols] (codebook, grid, permutation), carried whole by slices."""
    return RadPlane(name=name, dtype=dtype, kind=RAD_PLANE_TABLE, rows=rows, cols=cols)


def encoding(scheme: str, *planes: RadPlane, transform: str = "", vec: int = 1) -> RadEncoding:
    return RadEncoding(scheme=scheme, transform=transform, vec=vec, planes=tuple(planes))


def plain(dtype: int | str) -> RadEncoding:
    """Unquantised: the codes are the values (f32, f16, bf16, ...); a dtype code or its name."""
    return encoding("plain", tiled("codes", BY_NAME[dtype] if isinstance(dtype, str) else dtype))


def q8_0(group: int = 32) -> RadEncoding:
    """w = code * scale: i8 codes, an f16 scale per `group` columns."""
    return encoding("plain", tiled("codes", RAD_DT_I8), tiled("scale", RAD_DT_F16, 1, group))


def q4_0(group: int = 32) -> RadEncoding:
    """w = (code - 8) * scale: u4 codes, a u8 zero of 8 for the whole weight, f16 scale per group."""
    return encoding("affine", tiled("codes", RAD_DT_U4), tiled("zero", RAD_DT_U8, WHOLE, WHOLE),
                    tiled("scale", RAD_DT_F16, 1, group))


def q4_1(group: int = 32) -> RadEncoding:
    """w = code * scale - min: u4 codes, f16 scale and f16 min per group (min holds GGUF's -m)."""
    return encoding("affine", tiled("codes", RAD_DT_U4), tiled("scale", RAD_DT_F16, 1, group),
                    tiled("min", RAD_DT_F16, 1, group))


def q5_0(group: int = 32) -> RadEncoding:
    """w = (code - 16) * scale: u5 codes, a u8 zero of 16 for the whole weight, f16 scale per group."""
    return encoding("affine", tiled("codes", RAD_DT_U5), tiled("zero", RAD_DT_U8, WHOLE, WHOLE),
                    tiled("scale", RAD_DT_F16, 1, group))


def q5_1(group: int = 32) -> RadEncoding:
    """w = code * scale - min: u5 codes, f16 scale and f16 min per group (min holds GGUF's -m)."""
    return encoding("affine", tiled("codes", RAD_DT_U5), tiled("scale", RAD_DT_F16, 1, group),
                    tiled("min", RAD_DT_F16, 1, group))


def q2_k() -> RadEncoding:
    """w = code * scale * scale.1 - min * min.1: u2 codes; u4 scale and u4 min per 16, each times
    an f16 (scale.1 = GGUF d, min.1 = GGUF dmin) per 256."""
    return encoding("affine", tiled("codes", RAD_DT_U2),
                    tiled("scale", RAD_DT_U4, 1, 16), tiled("scale.1", RAD_DT_F16, 1, 256),
                    tiled("min", RAD_DT_U4, 1, 16), tiled("min.1", RAD_DT_F16, 1, 256))


def q3_k() -> RadEncoding:
    """w = (code - 4) * scale * scale.1: u3 codes (GGUF's two low bits | the hmask bit << 2), a u8
    zero of 4 for the whole weight, an i8 scale per 16 (GGUF's 6-bit scale - 32), an f16 scale.1
    (GGUF d) per 256."""
    return encoding("affine", tiled("codes", RAD_DT_U3), tiled("zero", RAD_DT_U8, WHOLE, WHOLE),
                    tiled("scale", RAD_DT_I8, 1, 16), tiled("scale.1", RAD_DT_F16, 1, 256))


def q4_k() -> RadEncoding:
    """w = code * scale * scale.1 - min * min.1: u4 codes; u6 scale and u6 min per 32, each times
    an f16 (scale.1 = GGUF d, min.1 = GGUF dmin) per 256."""
    return encoding("affine", tiled("codes", RAD_DT_U4),
                    tiled("scale", RAD_DT_U6, 1, 32), tiled("scale.1", RAD_DT_F16, 1, 256),
                    tiled("min", RAD_DT_U6, 1, 32), tiled("min.1", RAD_DT_F16, 1, 256))


def q5_k() -> RadEncoding:
    """w = code * scale * scale.1 - min * min.1: u5 codes (GGUF ql | qh << 4); u6 scale and u6 min
    per 32, each times an f16 (scale.1 = GGUF d, min.1 = GGUF dmin) per 256."""
    return encoding("affine", tiled("codes", RAD_DT_U5),
                    tiled("scale", RAD_DT_U6, 1, 32), tiled("scale.1", RAD_DT_F16, 1, 256),
                    tiled("min", RAD_DT_U6, 1, 32), tiled("min.1", RAD_DT_F16, 1, 256))


def q6_k() -> RadEncoding:
    """w = (code - 32) * scale * scale.1: u6 codes (GGUF ql | qh << 4), a u8 zero of 32 for the
    whole weight, an i8 scale per 16, an f16 scale.1 (GGUF d) per 256."""
    return encoding("affine", tiled("codes", RAD_DT_U6), tiled("zero", RAD_DT_U8, WHOLE, WHOLE),
                    tiled("scale", RAD_DT_I8, 1, 16), tiled("scale.1", RAD_DT_F16, 1, 256))


def fp8() -> RadEncoding:
    """w = code * scale: fp8 e4m3 (OCP) codes, one f32 scale for the whole weight."""
    return encoding("plain", tiled("codes", RAD_DT_FP8_E4M3), tiled("scale", RAD_DT_F32, WHOLE, WHOLE))


def nvfp4() -> RadEncoding:
    """w = code * scale * scale.1: fp4 e2m1 codes, an e4m3 scale per 16, one f32 scale.1."""
    return encoding("plain", tiled("codes", RAD_DT_FP4_E2M1), tiled("scale", RAD_DT_FP8_E4M3, 1, 16),
                    tiled("scale.1", RAD_DT_F32, WHOLE, WHOLE))
