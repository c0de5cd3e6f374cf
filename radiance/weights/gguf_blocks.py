"""GGUF block formats split into encoding planes, without requantising (the GGUF importer's core).

A GGUF tensor of logical shape [rows, cols] (GGUF's ne reversed; a 1-D tensor is one row) is
`rows` rows of `cols / block_size` blocks. Each block's fields become elements of planes, in the
order the elements have in the weight (ggml interleaves nibbles and bit planes inside a block;
here every plane is a plain bit stream along the row). Encodings: radiance.weights.formats.
"""

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from radiance.abi import RadEncoding, pack_bits

from . import formats

ENCODINGS = {
    Q.F32: lambda: formats.plain("f32"), Q.F16: lambda: formats.plain("f16"),
    Q.BF16: lambda: formats.plain("bf16"), Q.Q8_0: formats.q8_0, Q.Q4_0: formats.q4_0,
    Q.Q4_1: formats.q4_1, Q.Q5_0: formats.q5_0, Q.Q5_1: formats.q5_1, Q.Q2_K: formats.q2_k,
    Q.Q3_K: formats.q3_k, Q.Q4_K: formats.q4_k, Q.Q5_K: formats.q5_k, Q.Q6_K: formats.q6_k,
}
Q4_0_ZERO = 8   # ggml Q4_0: w = d * (q - 8)
Q5_0_ZERO = 16  # ggml Q5_0: w = d * ((ql | qh << 4) - 16)
Q3_K_ZERO = 4   # ggml Q3_K: w = d * (scale - 32) * (ql - (hmask bit ? 0 : 4))
Q3_K_SCALE_OFFSET = 32
Q6_K_ZERO = 32  # ggml Q6_K: w = d * scale * ((ql | qh << 4) - 32)


def _type(qtype, name: str) -> Q:
    qtype = Q(qtype) if isinstance(qtype, int) else qtype
    if qtype not in ENCODINGS:
        supported = ", ".join(q.name for q in ENCODINGS)
        raise ValueError(f"{name}: GGUF type {qtype.name} is not imported (supported: {supported})")
    return qtype


def gguf_encoding(qtype, name: str = "tensor") -> RadEncoding:
    """The encoding a GGUF type imports as."""
    return ENCODINGS[_type(qtype, name)]()


def _field(raw: np.ndarray) -> np.ndarray:
    """[rows, blocks, n] bytes of a block field -> [rows, blocks * n] raw plane bytes."""
    return np.ascontiguousarray(raw).reshape(raw.shape[0], -1)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[rows, runs, L] bytes of ggml's u4 runs (low nibbles: elements 0..L-1 of the run, high
    nibbles: L..2L-1) -> [rows, runs * 2L] elements in order."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(qs.shape[0], -1)


def _bits(qh: np.ndarray) -> np.ndarray:
    """[rows, blocks, n] bytes -> [rows, blocks, 8n] their bits, lowest first (bit i of the
    little-endian word: ggml's qh of Q5_0 and Q5_1)."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _bit_planes(qh: np.ndarray) -> np.ndarray:
    """[rows, blocks, 32] bytes of ggml's k-quant high bits (Q3_K's hmask, Q5_K's qh) -> [rows,
    blocks, 256]: element 32b + l is bit b of byte l."""
    rows, blocks = qh.shape[:2]
    shifted = qh.reshape(rows, blocks, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1)
    return (shifted & 1).reshape(rows, blocks, 256)


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """[rows, blocks, 64] bytes of ggml's 2-bit runs (Q2_K, Q3_K) -> [rows, blocks, 256]: each half
    of 128 elements from 32 bytes, element 32s + l of the half from bits 2s..2s+1 of byte l."""
    rows, blocks = qs.shape[:2]
    shifted = qs.reshape(rows, blocks, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    return (shifted & 3).reshape(rows, blocks, 256)


def _q3_k_scales(scales: np.ndarray) -> np.ndarray:
    """[rows, blocks, 12] packed bytes -> [rows, blocks * 16] i8 scales (the 6-bit value - 32):
    scale i's low 4 bits are the low nibble of byte i (i < 8) or the high nibble of byte i - 8, its
    top 2 bits bits 2k..2k+1 of byte 8 + i % 4, k = i // 4."""
    rows, blocks = scales.shape[:2]
    low = np.concatenate([scales[..., :8] & 15, scales[..., :8] >> 4], axis=-1)
    high = (scales[..., 8:12].reshape(rows, blocks, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 3
    value = (low | (high.reshape(rows, blocks, 16) << 4)).astype(np.int8) - np.int8(Q3_K_SCALE_OFFSET)
    return value.reshape(rows, -1).view(np.uint8)


def _q4_k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[rows, blocks, 12] packed bytes -> the 8 u6 scales and 8 u6 minimums of each block, each
    [rows, blocks * 8] (ggml get_scale_min_k4: sub-blocks 0-3 in the low 6 bits of bytes 0-3 and
    4-7, sub-blocks 4-7 split between bytes 8-11 and the top 2 bits of bytes 0-7)."""
    low, high, mixed = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    scale = np.concatenate([low & 63, (mixed & 15) | ((low >> 6) << 4)], axis=-1)
    minimum = np.concatenate([high & 63, (mixed >> 4) | ((high >> 6) << 4)], axis=-1)
    return scale.reshape(scales.shape[0], -1), minimum.reshape(scales.shape[0], -1)


def _q6_k_codes(ql: np.ndarray, qh: np.ndarray) -> np.ndarray:
    """[rows, blocks, 128] ql and [rows, blocks, 64] qh -> [rows, blocks * 256] u6 codes. Each half
    of 128 elements: ql bytes 0-63 give elements 0-63 (low nibble) and 64-127 (high nibble); qh
    byte i gives elements i, 32+i, 64+i, 96+i from its bit pairs 0-1, 2-3, 4-5, 6-7."""
    rows, blocks = ql.shape[:2]
    low = ql.reshape(rows, blocks, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(2, 1)
    high = qh.reshape(rows, blocks, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    low = (low & 15).reshape(rows, blocks, 256)
    high = (high & 3).reshape(rows, blocks, 256)
    return (low | (high << 4)).reshape(rows, -1)


def split_blocks(data: np.ndarray, qtype, shape: tuple[int, int], name: str = "tensor") -> dict:
    """A GGUF tensor's bytes -> {plane name: raw plane bytes np.uint8 [r, row_bytes]} of
    gguf_encoding(qtype), for the logical shape [rows, cols]."""
    qtype = _type(qtype, name)
    rows, cols = shape
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    data = np.asarray(data).view(np.uint8).reshape(-1)
    if cols % block_size or data.size != rows * cols // block_size * type_size:
        raise ValueError(f"{name}: {data.size} bytes of {qtype.name} do not hold a {rows}x{cols} "
                         f"tensor ({type_size} bytes per {block_size} columns)")
    blocks = data.reshape(rows, cols // block_size, type_size)
    if qtype in (Q.F32, Q.F16, Q.BF16):
        return {"codes": data.reshape(rows, -1)}
    if qtype == Q.Q8_0:
        return {"codes": _field(blocks[..., 2:]), "scale": _field(blocks[..., :2])}
    if qtype == Q.Q4_0:
        return {"codes": pack_bits(_nibbles(blocks[..., 2:]), 4),
                "zero": np.full((1, 1), Q4_0_ZERO, np.uint8), "scale": _field(blocks[..., :2])}
    if qtype == Q.Q4_1:
        negated = -np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)  # min = -m, exact
        return {"codes": pack_bits(_nibbles(blocks[..., 4:]), 4), "scale": _field(blocks[..., :2]),
                "min": _field(negated.view(np.uint8))}
    if qtype == Q.Q5_0:  # d, 4 bytes of high bits, 16 bytes of nibbles
        codes = _nibbles(blocks[..., 6:]) | (_bits(blocks[..., 2:6]).reshape(rows, -1) << 4)
        return {"codes": pack_bits(codes, 5), "zero": np.full((1, 1), Q5_0_ZERO, np.uint8),
                "scale": _field(blocks[..., :2])}
    if qtype == Q.Q5_1:  # d, m, 4 bytes of high bits, 16 bytes of nibbles
        negated = -np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)  # min = -m, exact
        codes = _nibbles(blocks[..., 8:]) | (_bits(blocks[..., 4:8]).reshape(rows, -1) << 4)
        return {"codes": pack_bits(codes, 5), "scale": _field(blocks[..., :2]),
                "min": _field(negated.view(np.uint8))}
    if qtype == Q.Q2_K:  # 16 bytes of scale | min << 4, 64 bytes of 2-bit runs, d, dmin
        scales = blocks[..., 0:16]
        return {"codes": pack_bits(_crumbs(blocks[..., 16:80]).reshape(rows, -1), 2),
                "scale": pack_bits(_field(scales & 15), 4), "scale.1": _field(blocks[..., 80:82]),
                "min": pack_bits(_field(scales >> 4), 4), "min.1": _field(blocks[..., 82:84])}
    if qtype == Q.Q3_K:  # 32 bytes of hmask, 64 bytes of 2-bit runs, 12 bytes of scales, d
        codes = _crumbs(blocks[..., 32:96]) | (_bit_planes(blocks[..., 0:32]) << 2)
        return {"codes": pack_bits(codes.reshape(rows, -1), 3), "zero": np.full((1, 1), Q3_K_ZERO, np.uint8),
                "scale": _q3_k_scales(blocks[..., 96:108]), "scale.1": _field(blocks[..., 108:110])}
    if qtype == Q.Q5_K:  # d, dmin, 12 bytes of u6 scales and minimums, 32 bytes of qh, 128 of nibbles
        scale, minimum = _q4_k_scales(blocks[..., 4:16])
        low = _nibbles(blocks[..., 48:].reshape(rows, -1, 32))
        codes = low | (_bit_planes(blocks[..., 16:48]).reshape(rows, -1) << 4)
        return {"codes": pack_bits(codes, 5), "scale": pack_bits(scale, 6), "scale.1": _field(blocks[..., 0:2]),
                "min": pack_bits(minimum, 6), "min.1": _field(blocks[..., 2:4])}
    if qtype == Q.Q4_K:  # d, dmin, 12 bytes of u6 scales and minimums, 128 bytes of nibbles
        scale, minimum = _q4_k_scales(blocks[..., 4:16])
        return {"codes": pack_bits(_nibbles(blocks[..., 16:].reshape(rows, -1, 32)), 4),
                "scale": pack_bits(scale, 6), "scale.1": _field(blocks[..., 0:2]),
                "min": pack_bits(minimum, 6), "min.1": _field(blocks[..., 2:4])}
    # Q6_K: ql 128 bytes, qh 64 bytes, i8 scales 16 bytes, d
    return {"codes": pack_bits(_q6_k_codes(blocks[..., :128], blocks[..., 128:192]), 6),
            "zero": np.full((1, 1), Q6_K_ZERO, np.uint8), "scale": _field(blocks[..., 192:208]),
            "scale.1": _field(blocks[..., 208:210])}
