"""The converter knows no family: an architecture plugin's import hooks (rad_arch.h) say which
sources it takes, the hyper-parameters they give and the weights those call for. A family the tree
does not have converts from a plugin in a temporary home; hooks out of contract are refused or are
one line naming the plugin; Llama 3.1's rope_freqs become the rope table's divisors."""

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as Q, GGUFWriter

from conftest import PREAMBLE
from radiance.convert import convert
from radiance.convert.cli import main
from radiance.engine.loading.model import weight_infos
from radiance.engine.loading.registry import Registry
from radiance.weights.container_reader import Container
from test_convert_gguf_files import HEAD_DIM, TENSORS, write_gguf

TOY = '''
def takes(kind, family):
    return kind == RAD_SOURCE_GGUF and family == "toy"

def hyper(source):
    width = source.meta.get("toy.width")
    if width is None:
        return "metadata toy.width is missing"
    return {"width": width, "vocab": source.tensors["embed"].rows, "context": 64}

def weights(hyper):
    return [RadWeightSpec(name="table", gguf="embed", ndim=2, rows=hyper["vocab"], cols=hyper["width"], fill=1),
            RadWeightSpec(name="scale", gguf="gain", ndim=1, rows=1, cols=hyper["width"], fill=2)]

ARCHITECTURES = [RadArchInfo(name="toy", doc="a family the tree does not have", check=lambda hyper: "",
                             declare=lambda hyper, weights: "nothing to run", takes=takes, hyper=hyper,
                             weights=weights)]

def rad_arch_count():
    return len(ARCHITECTURES)

def rad_arch_at(i):
    return ARCHITECTURES[i]
'''


def write_toy(path, width=True):
    writer = GGUFWriter(path, "toy")
    if width:
        writer.add_uint32("toy.width", 8)
    writer.add_tensor("embed", np.arange(40, dtype=np.float32).reshape(5, 8))
    writer.add_tensor("gain", np.ones(8, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def toy_home(home, body=TOY):
    source = PREAMBLE.format(abi="RAD_ABI_VERSION", kind="RAD_PLUGIN_ARCH", name="toy") + body
    home.write("architectures", "toy.py", source)
    return str(home.root)


def test_a_family_the_tree_does_not_have_converts_from_its_plugin(tmp_path, home):
    output = tmp_path / "toy.rad"
    errors = convert(write_toy(tmp_path / "toy.gguf"), output, radiance_home=toy_home(home))
    assert [error.name for error in errors] == ["table", "scale"] and all(e.relative == 0 for e in errors)
    with Container(output) as container:
        assert container.architecture == "toy"
        assert container.hyper == {"width": 8, "vocab": 5, "context": 64, "bos_token_id": None,
                                   "eos_token_ids": [], "add_bos": False}
        assert container.shape("table") == (5, 8) and container.shape("scale") == (8,)


def test_the_plugins_reason_is_the_one_line(tmp_path, home):
    source = write_toy(tmp_path / "toy.gguf", width=False)
    result = CliRunner().invoke(main, [str(source), "-o", str(tmp_path / "out.rad"),
                                       "--radiance-home", toy_home(home)])
    assert result.exit_code == 1 and result.stderr == f"rad-convert: error: {source}: metadata toy.width is missing\n"
    assert list(tmp_path.glob("out.rad*")) == []


def test_a_hook_that_raises_is_one_line_naming_the_plugin(tmp_path, home):
    root = toy_home(home, TOY.replace('    width = source.meta.get("toy.width")', '    width = 1 / 0'))
    source = write_toy(tmp_path / "toy.gguf")
    result = CliRunner().invoke(main, [str(source), "-o", str(tmp_path / "out.rad"), "--radiance-home", root])
    assert result.exit_code == 1
    assert result.stderr == (f"rad-convert: error: {source}: architecture 'toy' ({home.root / 'architectures' / 'toy.py'}): "
                             f"hyper raised ZeroDivisionError: division by zero\n")


def test_import_hooks_come_all_three_or_none(home):
    toy_home(home, TOY.replace("takes=takes, hyper=hyper,", "takes=takes,"))
    registry = Registry(str(home.root))
    try:
        assert "toy" not in registry.architectures
        assert [refusal.reason for refusal in registry.refused if refusal.path.stem == "toy"] == [
            "architecture 'toy' has the import hook takes but not hyper (all three or none)"]
    finally:
        registry.close()


def test_llama_3_1_rope_freqs_divide_the_rope_frequencies(tmp_path):
    factors = np.linspace(1.0, 8.0, HEAD_DIM // 2).astype(np.float32)
    source = write_gguf(tmp_path / "llama31.gguf", tensors={**TENSORS, "rope_freqs.weight": (Q.F32, (HEAD_DIM // 2,))},
                        values={"rope_freqs.weight": factors})
    output = tmp_path / "llama31.rad"
    convert(source, output)
    registry = Registry("")
    try:
        with Container(output) as container:
            assert "rope_freqs" not in container.weights
            assert container.hyper["rope_freq_factors"] == factors.tolist()
            llama = registry.architectures["llama"][0]
            hyper = dict(container.hyper)
            graph = llama.declare(hyper, weight_infos(container))
            table = next(t for t in graph.tables if t.name == "rope.inv_freq").data
            del hyper["rope_freq_factors"]
            plain = next(t for t in llama.declare(hyper, weight_infos(container)).tables if t.name == "rope.inv_freq").data
    finally:
        registry.close()
    # theta^(-2i/d) and the file's linear scaling, each frequency then divided by its factor
    np.testing.assert_allclose(table, plain.astype(np.float64) / factors, rtol=1e-6)


@pytest.mark.parametrize("args, message", [
    (["--hiden", "64"], "--synthetic llama: no shape option --hiden (its options: --hidden, --layers, --heads, "
                        "--kv-heads, --head-dim, --ffn, --vocab, --context, --rope-theta, --rms-eps, --tie-embeddings, --mtp-layers, --mtp-random)"),
    (["--hidden", "6x"], "--synthetic llama: --hidden '6x' is not an integer"),
])
def test_synthetic_shape_options_are_the_plugins(tmp_path, args, message):
    result = CliRunner().invoke(main, ["--synthetic", "llama", "-o", str(tmp_path / "m.rad"), *args])
    assert result.exit_code == 1 and result.stderr == f"rad-convert: error: {message}\n"


def test_shape_help_lists_the_plugins_options():
    result = CliRunner().invoke(main, ["--synthetic", "llama", "--shape-help"])
    assert result.exit_code == 0
    assert "  --kv-heads INT" in result.output and "key/value heads (default 3)" in result.output
