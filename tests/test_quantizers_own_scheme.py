"""A quantiser with a scheme of its own: its decode hook decodes what it wrote and returns
RAD_E_UNSUPPORTED for anything else, and the converter measures its error through that hook
without knowing the method; a quantiser that breaks the contract is refused with one line."""

import numpy as np
import pytest

from radiance.abi import RAD_E_UNSUPPORTED
from radiance.convert import Recipe, convert_synthetic
from radiance.convert.decoding import decode_weight
from radiance.convert.plugins import Plugins
from radiance.weights import formats
from radiance.weights.container_reader import Container

TERNARY = """
import numpy as np

def encoding(weight, shape, options):
    return RadEncoding(scheme="ternary", planes=(RadPlane("codes", RAD_DT_U2, RAD_PLANE_TILED, 1, 1),
                                                 RadPlane("scale", RAD_DT_F32, RAD_PLANE_TILED, 1, 0)))

def row_block(encoding, shape):
    return 5

def quantize(encoding, rows, r0, options):
    scale = np.abs(rows).mean(axis=1, keepdims=True).astype(np.float32)
    codes = (np.sign(rows) * (np.abs(rows) > scale * options["threshold"]) + 1).astype(np.uint8)
    return {"codes": pack_bits(codes, 2), "scale": scale.view(np.uint8)}

def decode(encoding, planes, shape):
    if encoding.scheme != "ternary":
        return RAD_E_UNSUPPORTED
    codes = unpack_bits(planes["codes"].reshape(shape[0], -1), 2, shape[1]).astype(np.float32)
    return (codes - 1) * planes["scale"].reshape(shape[0], 4).view(np.float32)

QUANTIZERS = [RadQuantizerInfo(name="ternary", doc="-1, 0, +1 times a per-row scale",
                               options=[RadQuantOption("threshold", RAD_P_F64, "0.5", "zero below this * scale")],
                               encoding=encoding, row_block=row_block, quantize=quantize, decode=decode)]

def rad_quant_count():
    return 1

def rad_quant_at(i):
    return QUANTIZERS[i]
"""

SMALL = dict(hidden=64, layers=1, heads=4, kv_heads=2, ffn=96, vocab=300)


def recipe_file(tmp_path, quantizer, options=""):
    path = tmp_path / "recipe.toml"
    path.write_text(f'[[rule]]\nmatch = "layers.*.ffn.*"\nquantizer = "{quantizer}"\n{options}')
    return path


def test_the_hook_decodes_its_own_scheme_and_declines_others(home):
    home.quantizer("ternary", TERNARY)
    with Plugins(str(home.root)) as quantizers:
        ternary = quantizers.by_name["ternary"]
        assert ternary.decode(formats.q8_0(), {}, (1, 32)) is None  # RAD_E_UNSUPPORTED
        assert ternary.info.decode(formats.q8_0(), {}, (1, 32)) == RAD_E_UNSUPPORTED
        rows = np.array([[0.9, -0.1, -1.1, 0.2]], np.float32)
        job = ternary.job("w", (1, 4), lambda r0, r1: rows, ternary.options({}))
        planes, _ = job.produce(0, 1)
        expected = np.array([[0.575, 0, -0.575, 0]], np.float32)
        np.testing.assert_allclose(decode_weight(job.encoding, planes, (1, 4), quantizers.by_name), expected)
        with pytest.raises(ValueError, match="scheme 'ternary' is decoded by no loaded quantiser"):
            decode_weight(job.encoding, planes, (1, 4), {})


def test_the_error_report_goes_through_the_hook(home, tmp_path):
    home.quantizer("ternary", TERNARY)
    output = tmp_path / "model.rad"
    errors = convert_synthetic(output, "llama", SMALL, 3,
                               recipe_file(tmp_path, "ternary", "options = {threshold = 0.7}"),
                               str(home.root))
    by_name = {error.name: error for error in errors}
    assert by_name["layers.0.ffn.up"].method == "ternary threshold=0.7"
    assert 0.3 < by_name["layers.0.ffn.up"].relative < 0.9  # a ternary code of Gaussian values
    assert by_name["layers.0.attn.q"].method == "plain dtype=bf16"
    with Container(output) as container:
        assert container.encoding("layers.0.ffn.down").scheme == "ternary"
        stored = container.metadata["relative_error"]["weights"]["layers.0.ffn.up"]
        assert stored == pytest.approx(by_name["layers.0.ffn.up"].relative, rel=1e-2)


BROKEN = {
    "planes of the wrong shape": ("return {'codes': np.zeros((1, 1), np.uint8)}", "plane 'codes'"),
    "an error code": ("return RAD_E_INVALID", f"quantize returned {-4}"),
    "an exception": ("raise RuntimeError('out of luck')", "quantize raised RuntimeError: out of luck"),
}


@pytest.mark.parametrize("fault", sorted(BROKEN))
def test_a_quantiser_breaking_the_contract_is_named(home, tmp_path, fault):
    body, message = BROKEN[fault]
    home.quantizer("broken", f"""
import numpy as np

def encoding(weight, shape, options):
    return RadEncoding(scheme="plain", planes=(RadPlane("codes", RAD_DT_F32, RAD_PLANE_TILED, 1, 1),))

def quantize(encoding, rows, r0, options):
    {body}

def rad_quant_count():
    return 1

def rad_quant_at(i):
    return RadQuantizerInfo(name="broken", doc="", encoding=encoding, quantize=quantize)
""")
    output = tmp_path / "model.rad"
    with pytest.raises(ValueError) as raised:
        convert_synthetic(output, "llama", SMALL, 0, recipe_file(tmp_path, "broken"), str(home.root))
    assert "weight 'layers.0.ffn.gate'" in str(raised.value) and message in str(raised.value)
    assert "\n" not in str(raised.value)
    assert list(tmp_path.glob("model.rad*")) == []


def test_a_whole_weight_plane_must_not_change_between_row_blocks(home, tmp_path):
    home.quantizer("drifting", """
import numpy as np

def encoding(weight, shape, options):
    return RadEncoding(scheme="plain", planes=(RadPlane("codes", RAD_DT_F32, RAD_PLANE_TILED, 1, 1),
                                               RadPlane("scale", RAD_DT_F32, RAD_PLANE_TILED, 0, 0)))

def row_block(encoding, shape):
    return 1

def quantize(encoding, rows, r0, options):
    return {"codes": rows.view(np.uint8), "scale": np.full((1, 1), r0 + 1, np.float32).view(np.uint8)}

def rad_quant_count():
    return 1

def rad_quant_at(i):
    return RadQuantizerInfo(name="drifting", doc="", encoding=encoding, row_block=row_block, quantize=quantize)
""")
    with pytest.raises(ValueError, match="plane 'scale' covers every row but differs between row blocks"):
        convert_synthetic(tmp_path / "model.rad", "llama", SMALL, 0, recipe_file(tmp_path, "drifting"), str(home.root))


def test_recipe_rules_are_checked_against_the_plugins_options(home, tmp_path):
    home.quantizer("ternary", TERNARY)
    with Plugins(str(home.root)) as quantizers:
        recipe = Recipe.load(recipe_file(tmp_path, "ternary"), quantizers)
        quantizer, options = recipe.choose("layers.3.ffn.up", 2)
        assert (quantizer.name, options) == ("ternary", {"threshold": 0.5})
        assert recipe.choose("layers.3.attn.q", 2)[1] == {"dtype": "bf16"}
        assert recipe.choose("output_norm", 1)[1] == {"dtype": "f32"}
        with pytest.raises(ValueError, match="option 'threshold' = 'high' is not a number"):
            Recipe.load(recipe_file(tmp_path, "ternary", 'options = {threshold = "high"}'), quantizers)


def test_libref_reads_a_quantisers_own_scheme_through_its_decode_hook(home):
    """rad_weight_f32 (the engine's decoder, which libref's relayout uses) falls back to the loaded
    quantisers' decode hooks for a scheme the core does not know."""
    from radiance.abi import RAD_OK, RadWeightPlanes, rad_tensor
    from radiance.engine.loading.registry import Registry
    from radiance.weights.planes import stored

    home.quantizer("ternary", TERNARY)
    registry = Registry(radiance_home=str(home.root), kernels="libref")
    try:
        [(info, _)] = [registry.quantizers["ternary"]]
        rows = np.array([[0.9, -0.1, -1.1, 0.2], [0.3, 0.3, -0.3, 0.0]], np.float32)
        options = {"threshold": 0.5}
        encoding = info.encoding("w", rows.shape, options)
        planes = info.quantize(encoding, rows, 0, options)
        weight = RadWeightPlanes(encoding=encoding, rows=2, cols=4,
                                 planes=[rad_tensor(stored(p, planes[p.name], rows.shape)) for p in encoding.planes])
        [gemm] = [row for row in registry.rows_for("gemm") if row.plugin.name == "libref"]
        assert gemm.info.layout("w", encoding, {}) == RAD_OK
        np.testing.assert_array_equal(gemm.info.relayout(weight, {}), info.decode(encoding, planes, rows.shape))
    finally:
        registry.close()
