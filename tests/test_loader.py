"""Loading plugins from homes: shadowing, ABI and kind checks, decline, refusals, close."""

import numpy as np
import pytest

from radiance.abi import RAD_ABI_VERSION, RadWeightPlanes, rad_tensor, rad_weight_f32
from radiance.engine.loading.registry import KernelsError, Registry
from radiance.weights.formats import plain

GEMM = """
SCHEMAS = [schema("t_gemm", ("M", "N"))]
ROWS = [row("{row}", "t_gemm")]
"""


def names(registry):
    return [lib.name for lib in registry.hierarchy if lib.path.parent.parent.name != "plugins"]


def refusal(registry, fragment):
    matches = [str(r) for r in registry.refused if fragment in str(r.path)]
    assert matches, f"no refusal for {fragment}: {registry.refused}"
    return matches[0]


def test_earlier_home_shadows_same_name_file(home, second_home):
    first = home.kernel("mine", GEMM.format(row="first"), filename="lib.py")
    second = second_home.kernel("theirs", GEMM.format(row="second"), filename="lib.py")
    registry = Registry(f"{home.root}:{second_home.root}")
    assert [row.name for row in registry.rows_for("t_gemm")] == ["first"]
    assert [(s.candidate.path, s.by.path) for s in registry.shadowed] == [(second, first)]


def test_abi_mismatch_names_both_numbers_and_the_file(home):
    path = home.kernel("old", GEMM.format(row="r"), abi="7")
    registry = Registry(str(home.root))
    message = refusal(registry, "old.py")
    assert str(path) in message and "ABI 7" in message and f"ABI {RAD_ABI_VERSION}" in message
    assert names(registry) == []


def test_kind_must_match_the_folder(home):
    home.kernel("misfiled", GEMM.format(row="r"), kind="RAD_PLUGIN_QUANT")
    message = refusal(Registry(str(home.root)), "misfiled.py")
    assert "declares kind 3 (quantizers) but was found in kernels/" in message


def test_decline_unloads_without_failing(home, capsys):
    home.kernel("picky", GEMM.format(row="r") + "\ndef rad_plugin_open():\n    return RAD_E_UNSUPPORTED\n")
    home.kernel("easy", GEMM.format(row="e"))
    registry = Registry(str(home.root))
    assert names(registry) == ["easy"]
    assert [p.name for p in registry.declined] == ["picky.py"] and registry.refused == []
    assert "declined this machine" in capsys.readouterr().err


def test_close_runs_at_shutdown(home, tmp_path):
    marker = tmp_path / "closed"
    home.kernel("closing", GEMM.format(row="r") + f"\ndef rad_plugin_close():\n    open({str(marker)!r}, 'w').write('x')\n")
    registry = Registry(str(home.root))
    assert not marker.exists()
    registry.close()
    assert marker.exists()


@pytest.mark.parametrize("body,reason", [
    ("raise RuntimeError('boom')\n" + GEMM.format(row="r"), "raised on import: RuntimeError: boom"),
    ('SCHEMAS = [schema("t_gemm", ("M",))]\nROWS = [RadKernelInfo(name="r", op="t_gemm", launch=launch, '
     'domain=RAD_DOMAIN_HOST, constraints=[RadConstraint("M", 9, 1)])]\n', "unknown constraint operator 9 on 'M'"),
    ('SCHEMAS = [schema("t_gemm", ("M",))]\nROWS = [row("r", "t_gemm"), row("r", "t_gemm")]\n',
     "duplicate row name 'r' (rows 0 and 1)"),
    ('SCHEMAS = [schema("t_gemm", ("M",))]\nROWS = [row("r", "t_gemm", RAD_CEQ("K", 4))]\n',
     "constraint on 'K', which op 't_gemm' does not declare and is no device.* fact"),
    ('SCHEMAS = []\nROWS = [row("r", "t_unknown_op")]\n', "implements op 't_unknown_op', which no loaded library declares"),
    ('SCHEMAS = [schema("t_gemm", ("M",))]\nROWS = [row("all_reduce_r4dchain", "t_gemm")]\n',
     "rad_kernel_chain is false but the name has 'r4dchain'"),
    ('SCHEMAS = [schema("t_gemm", ("M",))]\nROWS = [row("all_reduce_plain", "t_gemm")]\n'
     'def rad_kernel_chain(i):\n    return 1\n', "rad_kernel_chain is true but the name lacks 'r4dchain'"),
    ('SCHEMAS = [schema("t_gemm", ("M",))]\nROWS = [row("r", "t_gemm")]\n'
     'def rad_kernel_tolerance(i):\n    return float("nan")\n', "row 'r': rad_kernel_tolerance is nan, not a finite number"),
    ('SCHEMAS = [schema("t_gemm", ("M",))]\nROWS = [row("r", "t_gemm")]\n'
     'def rad_kernel_tolerance(i):\n    return "loose"\n', "rad_kernel_tolerance(0) returned 'loose', not a number"),
])
def test_malformed_plugin_refused_while_the_rest_load(home, body, reason):
    home.kernel("broken", body)
    home.kernel("fine", GEMM.format(row="ok"))
    registry = Registry(str(home.root))
    message = refusal(registry, "broken.py")
    assert reason in message and message.startswith(str(home.root / "kernels" / "broken.py"))
    assert names(registry) == ["fine"]
    assert [row.name for row in registry.rows_for("t_gemm")] == ["ok"]


def test_a_row_may_implement_an_op_a_later_library_declares(home):
    home.kernel("fast", 'SCHEMAS = []\nROWS = [row("quick", "t_gemm")]\n')
    home.kernel("oracle", GEMM.format(row="slow") + "\ndef rad_plugin_reference():\n    return 1\n")
    registry = Registry(str(home.root))
    assert [row.name for row in registry.rows_for("t_gemm")] == ["quick", "slow"]
    assert registry.ops["t_gemm"].plugin.name == "oracle"


def test_package_folder_plugin_with_relative_import(home):
    home.write("kernels/pkg", "rows.py", "from radiance.abi import *\nNAME = 'from_a_submodule'\n")
    home.kernel("pkg", "from . import rows\n" + GEMM.format(row="r").replace('"r"', "rows.NAME"),
                filename="pkg/__init__.py")
    registry = Registry(str(home.root))
    assert [row.name for row in registry.rows_for("t_gemm")] == ["from_a_submodule"]


def test_schema_conflict_refuses_the_later_library_naming_both(home):
    first = home.kernel("alpha", GEMM.format(row="a"))
    second = home.kernel("beta", 'SCHEMAS = [schema("t_gemm", ("M", "K"))]\nROWS = [row("b", "t_gemm")]\n')
    registry = Registry(str(home.root), kernels="alpha,beta")
    message = refusal(registry, "beta.py")
    assert str(second) in message and str(first) in message and "declares op 't_gemm' differently" in message
    assert "parameter 1 is 'N' (int, required, none) there, 'K' (int, required, none) here" in message


def test_schema_conflict_follows_hierarchy_order(home):
    home.kernel("alpha", GEMM.format(row="a"))
    home.kernel("beta", 'SCHEMAS = [schema("t_gemm", ("M", "K"))]\nROWS = [row("b", "t_gemm")]\n')
    registry = Registry(str(home.root), kernels="beta")
    assert "alpha.py" in str(registry.refused[0].path)
    assert registry.ops["t_gemm"].plugin.name == "beta"


def test_two_quantizers_of_one_name_refused_both_named(home):
    body = ("def encode(weight, shape, options):\n    return RadEncoding()\n"
            "def quantize(encoding, rows, r0, options):\n    return {}\n"
            "Q = [RadQuantizerInfo(name='q8', doc='d', encoding=encode, quantize=quantize)]\n"
            "def rad_quant_count():\n    return len(Q)\n"
            "def rad_quant_at(i):\n    return Q[i]\n")
    first = home.quantizer("qa", body)
    second = home.quantizer("qb", body)
    registry = Registry(str(home.root))
    message = refusal(registry, "qb.py")
    assert "quantiser 'q8'" in message and str(first) in message and str(second) in message
    assert registry.quantizers["q8"][1].path == first


def test_unmatched_kernels_entry_is_warned_by_name(home, capsys):
    home.kernel("alpha", GEMM.format(row="a"))
    registry = Registry(str(home.root), kernels="nosuchlib,alpha")
    assert registry.unmatched == ["nosuchlib"]
    assert "[radiance] --kernels entry 'nosuchlib' matches no kernel library" in capsys.readouterr().err


def test_kernels_entry_naming_a_refused_library_is_an_error(home):
    home.kernel("old", GEMM.format(row="r"), abi="3")
    with pytest.raises(KernelsError, match="--kernels names 'old', which was refused: .*ABI 3"):
        Registry(str(home.root), kernels="old")


def test_radiance_home_variable_is_a_search_path(home, second_home, monkeypatch):
    home.kernel("alpha", GEMM.format(row="a"))
    second_home.kernel("beta", GEMM.format(row="b"))
    monkeypatch.setenv("RADIANCE_HOME", f"{second_home.root}:{home.root}")
    assert names(Registry()) == ["beta", "alpha"]
    assert names(Registry(str(home.root))) == ["alpha"]  # --radiance-home overrides


def test_a_quantiser_without_its_hooks_is_refused_naming_them(home):
    home.quantizer("hollow", "Q = [RadQuantizerInfo(name='hollow', doc='d')]\n"
                             "def rad_quant_count():\n    return 1\ndef rad_quant_at(i):\n    return Q[i]\n")
    assert refusal(Registry(str(home.root)), "hollow.py").endswith("quantiser 'hollow' lacks encoding and quantize")


def test_rad_weight_f32_is_the_engines_decoder_handed_in_before_a_plugin_is_imported(home, monkeypatch):
    monkeypatch.setattr("radiance.abi.plugin._engine_decoder", None)  # a process no engine has loaded into
    weight = RadWeightPlanes(encoding=plain("f32"), rows=2, cols=3,
                             planes=[rad_tensor(np.arange(6, dtype=np.float32).view(np.uint8).reshape(2, 12))])
    with pytest.raises(RuntimeError, match="rad_weight_f32: no engine has defined the core decoder"):
        rad_weight_f32(weight)
    # a plugin that decodes at import: the loader defined the decoder before importing it
    home.kernel("decodes", """
        import numpy as np
        CODES = RadPlane(name="codes", dtype=RAD_DT_F32, kind=RAD_PLANE_TILED, block_rows=1, block_cols=1)
        WEIGHT = RadWeightPlanes(encoding=RadEncoding(scheme="plain", planes=[CODES]), rows=1, cols=2,
                                 planes=[rad_tensor(np.array([[1.5, -2.0]], np.float32).view(np.uint8))])
        DECODED = rad_weight_f32(WEIGHT)
        SCHEMAS = [schema("t_op")]
        ROWS = [row("r", "t_op")]
    """)
    (library,) = [lib for lib in Registry(str(home.root)).hierarchy if lib.name == "decodes"]
    assert library.module.DECODED.tolist() == [[1.5, -2.0]]
    assert rad_weight_f32(weight).tolist() == [[0, 1, 2], [3, 4, 5]]
