"""GGUF block formats split into planes decode to exactly what gguf's own dequantiser gives, in f32,
bit for bit: every type that llama.cpp's common presets write (Q4_K_M, Q4_K_S, Q5_K_M, Q6_K, Q8_0, Q4_0
and the Q2_K/Q3_K of the smaller presets), on random blocks and on gguf-quantised weights."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from radiance.weights.decode import decode
from radiance.weights.gguf_blocks import gguf_encoding, split_blocks
from radiance.weights.planes import encoding_nbytes
from radiance.weights.slicing import slice_cols, slice_rows

# Byte offsets of each block's f16 fields, overwritten with finite values (random bytes elsewhere).
F16_FIELDS = {Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q2_K: (80, 82),
              Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
TYPES = (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.F16, Q.BF16, Q.F32)
SUPPORTED = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K"


def assert_same_bits(decoded, expected):
    """Equal as f32 bit patterns (so -0.0 and +0.0 differ), not only as values."""
    assert decoded.dtype == np.float32 and decoded.shape == expected.shape
    np.testing.assert_array_equal(decoded.view(np.uint32), expected.astype(np.float32).view(np.uint32))


def random_tensor(qtype, rows, blocks, seed):
    """Raw GGUF bytes of a [rows, blocks * block_size] tensor: random quants, finite f16 fields."""
    rng = np.random.default_rng(seed)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if qtype in (Q.F16, Q.BF16, Q.F32):
        values = rng.standard_normal((rows, blocks * block_size)).astype(np.float32)
        return quantize(values, qtype).view(np.uint8).reshape(rows, -1)
    data = rng.integers(0, 256, (rows, blocks, type_size), np.uint8)
    for offset in F16_FIELDS[qtype]:
        field = rng.uniform(-2, 2, (rows, blocks, 1)).astype(np.float16)
        data[..., offset:offset + 2] = field.view(np.uint8)
    return data.reshape(rows, -1)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_random_blocks_decode_exactly_as_gguf(qtype):
    block_size = GGML_QUANT_SIZES[qtype][0]
    rows, cols = 5, 3 * max(block_size, 32)
    data = random_tensor(qtype, rows, cols // block_size, seed=int(qtype))
    planes = split_blocks(data, qtype, (rows, cols))
    encoding = gguf_encoding(qtype)
    assert sum(raw.nbytes for raw in planes.values()) == encoding_nbytes(encoding, (rows, cols))
    expected = dequantize(data, qtype).reshape(rows, cols).astype(np.float32)
    assert_same_bits(decode(encoding, planes, (rows, cols)), expected)
    part, shape = slice_rows(encoding, planes, (rows, cols), 1, 3)  # a rank's rows and columns
    assert_same_bits(decode(encoding, part, shape), expected[1:3])
    cut = cols // 3
    part, shape = slice_cols(encoding, planes, (rows, cols), cut, cols)
    assert_same_bits(decode(encoding, part, shape), expected[:, cut:])


@pytest.mark.parametrize("qtype", TYPES[:-3], ids=lambda q: q.name)
def test_every_code_and_scale_pattern_decodes_exactly(qtype):
    """Many rows of random bytes: every code, every packed scale and both signs of every f16 field
    (zero, subnormal and the largest finite ones among them)."""
    block_size = GGML_QUANT_SIZES[qtype][0]
    data = random_tensor(qtype, 64, 4, seed=100 + int(qtype)).reshape(64, 4, -1)
    specials = np.array([0.0, -0.0, 6e-8, -6e-8, 65504.0, -65504.0, 1.0, -1.0], np.float16)
    for offset in F16_FIELDS[qtype]:
        data[:8, 0, offset:offset + 2] = specials.reshape(8, 1).view(np.uint8)
    data = data.reshape(64, -1)
    planes = split_blocks(data, qtype, (64, 4 * block_size))
    expected = dequantize(data, qtype).reshape(64, 4 * block_size)
    assert_same_bits(decode(gguf_encoding(qtype), planes, (64, 4 * block_size)), expected)


@pytest.mark.parametrize("qtype", (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1), ids=lambda q: q.name)
def test_gguf_quantised_weights_decode_exactly_and_slice(qtype):
    weight = np.random.default_rng(7).standard_normal((6, 128)).astype(np.float32)
    data = quantize(weight, qtype)
    planes = split_blocks(data, qtype, weight.shape)
    encoding = gguf_encoding(qtype)
    expected = dequantize(data, qtype).reshape(weight.shape)
    assert_same_bits(decode(encoding, planes, weight.shape), expected)
    rank, rank_shape = slice_rows(encoding, planes, weight.shape, 2, 4)
    np.testing.assert_array_equal(decode(encoding, rank, rank_shape), expected[2:4])
    rank, rank_shape = slice_cols(encoding, planes, weight.shape, 64, 128)
    np.testing.assert_array_equal(decode(encoding, rank, rank_shape), expected[:, 64:])


@pytest.mark.parametrize("qtype", (Q.IQ2_XXS, Q.IQ4_NL, Q.TQ1_0, Q.Q8_1), ids=lambda q: q.name)
def test_an_unsupported_type_is_named(qtype):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    with pytest.raises(ValueError, match=rf"^blk.0.ffn_down: GGUF type {qtype.name} is not imported "
                                         rf"\(supported: {SUPPORTED}\)"):
        split_blocks(np.zeros(type_size * (256 // block_size), np.uint8), qtype, (1, 256), name="blk.0.ffn_down")


def test_a_size_that_does_not_fit_the_shape_is_refused():
    with pytest.raises(ValueError, match=r"^token_embd: 40 bytes of Q8_0 do not hold a 1x64 tensor"):
        split_blocks(np.zeros(40, np.uint8), Q.Q8_0, (1, 64), name="token_embd")
