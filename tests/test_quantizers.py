"""The in-tree quantisers, found on the search path as any plugin is: their encodings equal the
common formats, their planes are canonical, and each round trip stays within the bound
docs/QUANTIZERS.md documents for it."""

import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from radiance.abi import unpack_bits
from radiance.engine.loading.registry import Registry
from radiance.weights import formats
from radiance.weights.decode import decode
from radiance.weights.planes import plane_array, plane_row_bytes, plane_shape

EXPECTED = {"q8_0": formats.q8_0(), "q4_1": formats.q4_1(), "fp8": formats.fp8(), "nvfp4": formats.nvfp4(),
            "plain": formats.plain("bf16")}
SLACK = 4 * np.finfo(np.float32).eps  # the decoder's f32 arithmetic, relative to |w|


@pytest.fixture(scope="module")
def quantizers():
    registry = Registry(radiance_home="")
    yield {name: info for name, (info, _) in registry.quantizers.items()}
    registry.close()


def defaults(info):
    kinds = {1: int, 2: float, 3: str}
    return {option.key: kinds[option.type](option.deflt) for option in info.options}


def samples():
    rng = np.random.default_rng(7)
    normal = rng.standard_normal((24, 100)).astype(np.float32) * 0.02
    outliers = normal.copy()
    outliers[::5, ::17] *= 300
    constant = np.full((3, 64), 0.375, np.float32)
    mixed = np.vstack([np.zeros((2, 96), np.float32), rng.uniform(-4, 4, (6, 96)).astype(np.float32)])
    wide = rng.standard_normal((4, 1000)).astype(np.float32) * 50
    tiny = normal * np.float32(1e-4)  # f16 scales in the subnormal range
    return {"normal": normal, "outliers": outliers, "constant": constant, "mixed": mixed, "wide": wide,
            "tiny": tiny}


def quantized(info, rows, options=None):
    options = defaults(info) | (options or {})
    encoding = info.encoding("w", rows.shape, options)
    step = info.row_block(encoding, rows.shape) or rows.shape[0]
    blocks = [info.quantize(encoding, rows[r0:r0 + step], r0, options) for r0 in range(0, rows.shape[0], step)]
    planes = {name: np.vstack([block[name] for block in blocks]) if plane.block_rows else blocks[0][name]
              for name, plane in ((p.name, p) for p in encoding.planes)}
    return encoding, planes


def typed(encoding, planes, shape, name):
    """A plane's values broadcast over the weight, f32 [rows, cols]."""
    plane = encoding.plane(name)
    values = plane_array(plane, planes[name], shape).astype(np.float32)
    br, bc = plane.block_rows or shape[0], plane.block_cols or shape[1]
    return np.repeat(np.repeat(values, br, axis=0), bc, axis=1)[:shape[0], :shape[1]]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_encoding_equals_the_common_format(quantizers, name):
    info = quantizers[name]
    assert info.encoding("w", (64, 128), defaults(info)) == EXPECTED[name]
    assert info.doc and all(option.doc and option.deflt for option in info.options)


def test_group_option_reaches_the_encoding(quantizers):
    assert quantizers["q8_0"].encoding("w", (4, 128), {"group": 64}) == formats.q8_0(64)
    assert quantizers["q4_1"].encoding("w", (4, 128), {"group": 128}) == formats.q4_1(128)
    assert quantizers["plain"].encoding("w", (4, 128), {"dtype": "f16"}) == formats.plain("f16")
    with pytest.raises(ValueError, match="group 0"):
        quantizers["q8_0"].encoding("w", (4, 128), {"group": 0})


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("sample", sorted(samples()))
def test_planes_are_canonical_raw_bytes(quantizers, name, sample):
    rows = samples()[sample]
    encoding, planes = quantized(quantizers[name], rows)
    assert sorted(planes) == sorted(plane.name for plane in encoding.planes)
    for plane in encoding.planes:
        assert planes[plane.name].dtype == np.uint8
        assert planes[plane.name].shape == (plane_shape(plane, rows.shape)[0], plane_row_bytes(plane, rows.shape))


@pytest.mark.parametrize("sample", sorted(samples()))
@pytest.mark.parametrize("name", ["q8_0", "q4_1"])
def test_integer_codes_within_half_a_scale(quantizers, name, sample):
    rows = samples()[sample]
    encoding, planes = quantized(quantizers[name], rows)
    scale = typed(encoding, planes, rows.shape, "scale")
    error = np.abs(decode(encoding, planes, rows.shape) - rows)
    assert (error <= scale / 2 * (1 + SLACK) + SLACK * np.abs(rows)).all()


@pytest.mark.parametrize("sample", sorted(samples()))
def test_fp8_within_its_bound(quantizers, sample):
    rows = samples()[sample]
    encoding, planes = quantized(quantizers["fp8"], rows)
    scale = typed(encoding, planes, rows.shape, "scale")
    assert scale[0, 0] * 448 == pytest.approx(np.abs(rows).max(), rel=1e-6)
    error = np.abs(decode(encoding, planes, rows.shape) - rows)
    assert (error <= np.maximum(2.0**-4 * np.abs(rows), 2.0**-10 * scale) * (1 + SLACK)).all()


@pytest.mark.parametrize("sample", sorted(samples()))
def test_nvfp4_within_its_bound(quantizers, sample):
    rows = samples()[sample]
    encoding, planes = quantized(quantizers["nvfp4"], rows)
    step = typed(encoding, planes, rows.shape, "scale") * typed(encoding, planes, rows.shape, "scale.1")
    tensor_scale = typed(encoding, planes, rows.shape, "scale.1")
    error = np.abs(decode(encoding, planes, rows.shape) - rows)
    assert (error <= np.maximum(step, 6 * 2.0**-10 * tensor_scale) * (1 + SLACK) + SLACK * np.abs(rows)).all()


@pytest.mark.parametrize("dtype, relative", [("f32", 0.0), ("f16", 2.0**-11), ("bf16", 2.0**-8)])
def test_plain_within_half_an_ulp(quantizers, dtype, relative):
    rows = samples()["wide"]
    encoding, planes = quantized(quantizers["plain"], rows, {"dtype": dtype})
    decoded = decode(encoding, planes, rows.shape)
    assert (np.abs(decoded - rows) <= relative * np.abs(rows)).all()


def test_per_tensor_scales_take_the_whole_weight(quantizers):
    for name in ("fp8", "nvfp4"):
        info = quantizers[name]
        assert info.row_block(info.encoding("w", (4096, 4096), {}), (4096, 4096)) == 0
    for name in ("q8_0", "q4_1", "plain"):
        info = quantizers[name]
        step = info.row_block(info.encoding("w", (100_000, 4096), defaults(info)), (100_000, 4096))
        assert 1 <= step < 100_000


def test_row_blocks_quantise_rows_independently(quantizers):
    rows = samples()["outliers"]
    for name in ("q8_0", "q4_1", "plain"):
        info = quantizers[name]
        options = defaults(info)
        encoding = info.encoding("w", rows.shape, options)
        whole = info.quantize(encoding, rows, 0, options)
        halves = [info.quantize(encoding, rows[r0:r0 + 12], r0, options) for r0 in (0, 12)]
        for plane in whole:
            assert np.array_equal(whole[plane], np.vstack([half[plane] for half in halves]))


def gguf_blocks(codes_per_block, scale, extra=()):
    """[rows, blocks, n] fields as GGUF block bytes, fields in order."""
    return np.concatenate([scale.view(np.uint8).reshape(*scale.shape, 2)]
                          + [field.view(np.uint8).reshape(*field.shape, 2) for field in extra]
                          + [codes_per_block], axis=2)


def test_q4_1_planes_read_by_gguf_give_the_same_weight(quantizers):
    """The min plane holds -m: rebuilt as GGUF Q4_1 blocks (d, m, nibbles), gguf dequantises alike."""
    rows = samples()["mixed"]
    encoding, planes = quantized(quantizers["q4_1"], rows)
    count, cols = rows.shape
    codes = unpack_bits(planes["codes"], 4, cols).reshape(count, -1, 32)
    nibbles = codes[..., :16] | (codes[..., 16:] << 4)  # ggml: element j low, j + 16 high
    scale = planes["scale"].view(np.float16).reshape(count, -1)
    m = -planes["min"].view(np.float16).reshape(count, -1)
    blocks = gguf_blocks(nibbles, scale, [m]).reshape(count, -1)
    assert np.array_equal(dequantize(blocks, Q.Q4_1), decode(encoding, planes, rows.shape))


def test_q8_0_planes_read_by_gguf_give_the_same_weight(quantizers):
    rows = samples()["normal"][:, :96]
    encoding, planes = quantized(quantizers["q8_0"], rows)
    count = rows.shape[0]
    blocks = gguf_blocks(planes["codes"].reshape(count, -1, 32), planes["scale"].view(np.float16).reshape(count, -1))
    assert np.array_equal(dequantize(blocks.reshape(count, -1), Q.Q8_0), decode(encoding, planes, rows.shape))


def test_out_of_range_values_are_refused(quantizers):
    huge = np.full((1, 32), 1e8, np.float32)
    for name, options in (("q8_0", {"group": 32}), ("q4_1", {"group": 32}), ("plain", {"dtype": "f16"})):
        info = quantizers[name]
        with pytest.raises(ValueError, match="f16"):
            info.quantize(info.encoding("w", huge.shape, options), huge * (-1 if name == "q4_1" else 1), 0, options)
    with pytest.raises(ValueError, match="non-finite"):
        info = quantizers["fp8"]
        info.quantize(info.encoding("w", (1, 2), {}), np.array([[1, np.inf]], np.float32), 0, {})


def test_nvfp4_codes_are_e2m1_and_scales_e4m3(quantizers):
    rows = samples()["normal"]
    encoding, planes = quantized(quantizers["nvfp4"], rows)
    codes = plane_array(encoding.plane("codes"), planes["codes"], rows.shape)
    assert codes.dtype == ml_dtypes.float4_e2m1fn and np.abs(codes.astype(np.float32)).max() == 6
    scale = plane_array(encoding.plane("scale"), planes["scale"], rows.shape).astype(np.float32)
    assert scale.max() == 448  # the block holding the tensor's amax
