"""The .so loader: a C plugin and its Python twin become the same records and answer every hook
alike; identity, the ABI check, declining and refusals unload the library; rad-info and rad-schemas
read .so files too. The plugins are compiled here with the C compiler against abi/'s headers."""

import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import script

from radiance.abi import (
    HEADERS_DIR, RAD_ABI_VERSION, RAD_DT_F32, RAD_E_DTYPE, RAD_LAYOUT_ANY, RAD_OK, RadArgs, RadEncoding, RadTensor,
    RadWeightPlanes, rad_tensor,
)
from radiance.engine.loading.registry import Registry
from radiance.weights.formats import plain

FIXTURES = Path(__file__).parent / "fixtures"


def compile_plugin(source: Path | str, target: Path, *defines: str) -> Path:
    """A .so from one C file (a path, or the text of one) against the engine's headers."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(source, str):
        path = target.parent.parent / f"{target.stem}.c"  # beside the home, not in its kind folder
        path.write_text(source)
        source = path
    subprocess.run(["gcc", "-std=gnu11", "-shared", "-fPIC", "-Wall", "-Werror", "-I", str(HEADERS_DIR),
                    *(f"-D{d}" for d in defines), "-o", str(target), str(source)], check=True, capture_output=True)
    return target


def mapped(path: Path) -> bool:
    """Whether this process maps the file (dlopen'ed and not closed)."""
    return str(path.resolve()) in Path("/proc/self/maps").read_text()


@pytest.fixture
def twins(tmp_path):
    """The twin library as a .so in one home and as a .py in another; the registry over both."""
    c_home, py_home = tmp_path / "c", tmp_path / "py"
    compile_plugin(FIXTURES / "twin" / "twin.c", c_home / "kernels" / "twin_c.so", 'TWIN_NAME="twin_c"')
    (py_home / "kernels").mkdir(parents=True)
    (py_home / "kernels" / "twin_py.py").write_text((FIXTURES / "twin" / "twin.py").read_text())
    registry = Registry(f"{c_home}:{py_home}", kernels="twin_c,twin_py")
    assert registry.refused == []
    (c,) = [lib for lib in registry.hierarchy if lib.name == "twin_c"]
    (py,) = [lib for lib in registry.hierarchy if lib.name == "twin_py"]
    yield c, py
    registry.close()


HOOKS = ("launch", "init", "fini", "scratch", "layout", "relayout", "unrelayout", "opd_shape", "tune_valid")


def test_a_so_and_its_python_twin_make_the_same_records(twins):
    c, py = twins
    assert c.info.version == py.info.version == "1.2" and c.info.build_target == py.info.build_target
    assert c.schemas == py.schemas and c.schemas[0].params[2].type == 2  # eps: f64
    assert c.reference == py.reference is False
    for c_row, py_row in zip(c.rows, py.rows, strict=True):
        assert (c_row.reference, c_row.concurrent, c_row.collective, c_row.chain, c_row.tolerance) == \
               (py_row.reference, py_row.concurrent, py_row.collective, py_row.chain, py_row.tolerance)
        for field in ("name", "op", "family", "computes", "shape", "dtypes", "domain", "priority", "constraints",
                      "n_constraints", "replaces", "tunables", "n_tunables"):
            assert getattr(c_row.info, field) == getattr(py_row.info, field), field
        assert [getattr(c_row.info, h) is None for h in HOOKS] == [getattr(py_row.info, h) is None for h in HOOKS]
    assert c.rows[0].info.constraints[2].sval == "f32 bf16" and c.rows[0].info.constraints[0].sval is None
    assert [row.reference for row in c.rows] == [False, True] and c.rows[0].chain and c.rows[1].collective == 1
    assert [row.tolerance for row in c.rows] == [None, 4e-3]  # rad_kernel_tolerance: negative is the op's


def _weight():
    values = np.arange(12, dtype=np.float32).reshape(3, 4) - 2.5
    return values, RadWeightPlanes(encoding=plain("f32"), rows=3, cols=4,
                                   planes=[rad_tensor(values.view(np.uint8).reshape(3, 16))])


def test_every_hook_of_the_so_answers_as_the_python_twin_does(twins):
    c, py = twins
    geometry = {"M": 64, "N": 16, "dtype": "f32", "eps": 0.5, "split_k": 2}
    values, weight = _weight()
    answers = []
    for library in (c, py):
        info = library.rows[0].info
        stored = info.relayout(weight, geometry)
        instance = info.init(geometry)
        x, y = np.arange(32, dtype=np.float32).reshape(2, 16), np.zeros((2, 16), np.float32)
        scratch = np.zeros(info.scratch(geometry), np.uint8)
        args = RadArgs(t=(rad_tensor(x), RadTensor(data=stored, ndim=2, shape=(4, 3, 0, 0)), rad_tensor(y)),
                       params={**geometry, "M": 2}, scratch=scratch, scratch_bytes=scratch.size, instance=instance)
        statuses = [info.launch(args)]
        x += 1  # the same RadArgs again, new contents: the C side reads them in place
        statuses.append(info.launch(args))
        info.fini(instance)
        shapes = [(t.dtype, t.ndim, tuple(t.shape[:2])) for t in info.opd_shape(geometry, 3)]
        answers.append(dict(stored=np.asarray(stored).tolist(), y=y.tolist(), statuses=statuses,
                            scratch=info.scratch(geometry), shapes=shapes,
                            layout=[info.layout("w", plain("f32"), geometry), info.layout("table", plain("f32"), geometry),
                                    info.layout("w", RadEncoding(scheme="mine"), geometry)],
                            tune=[info.tune_valid({"N": 16, "sk": 4}), info.tune_valid({"N": 18, "sk": 4})]))
    assert answers[0] == answers[1]
    assert answers[0]["layout"] == [RAD_OK, RAD_LAYOUT_ANY, RAD_E_DTYPE] and answers[0]["tune"] == [True, False]
    assert answers[0]["stored"] == values.T.tolist() and answers[0]["statuses"] == [RAD_OK, RAD_OK]
    assert answers[0]["y"] == ((np.arange(32).reshape(2, 16) + 1) * 16 - 2.5 + 64).tolist()
    assert answers[0]["shapes"] == [(RAD_DT_F32, 2, (64, 16)), (RAD_DT_F32, 2, (16, 16)), (RAD_DT_F32, 2, (64, 16))]


def test_unrelayout_gives_the_canonical_planes_back(twins):
    c, _ = twins
    info = c.rows[0].info
    values, weight = _weight()
    back = info.unrelayout(info.relayout(weight, {}), {})
    assert (back.rows, back.cols) == (3, 4) and back.encoding is weight.encoding
    assert back.planes[0].data.view(np.float32).reshape(3, 4).tolist() == values.tolist()


def test_a_failing_hook_is_one_line_naming_the_row(tmp_path):
    source = (FIXTURES / "twin" / "twin.c").read_text().replace("static int init(const RadParam* geometry, int32_t n, void** instance) {",
                                                               "static int init(const RadParam* geometry, int32_t n, void** instance) {\n    if (n) return RAD_E_NOMEM;")
    compile_plugin(source, tmp_path / "h" / "kernels" / "broken.so", 'TWIN_NAME="broken"')
    registry = Registry(str(tmp_path / "h"), kernels="broken")
    (row, _) = registry.rows_for("t_twin")
    with pytest.raises(RuntimeError, match=r"^row 'twin_small_r4dchain' of broken.so: init returned -5$"):
        row.info.init({"N": 16})


ABI_SOURCE = """
#include "rad_abi.h"
uint32_t rad_plugin_abi_version(void) {{ return {abi}; }}
const RadPluginInfo* rad_plugin_info(void) {{
    static const RadPluginInfo i = {{RAD_PLUGIN_KERNEL, "{name}", "0.1", "", "host"}};
    return &i;
}}
int rad_kernel_schema_count(void) {{ return 0; }}
const RadOpSchema* rad_kernel_schema_at(int i) {{ (void)i; return 0; }}
int rad_kernel_count(void) {{ return 0; }}
const RadKernelInfo* rad_kernel_at(int i) {{ (void)i; return 0; }}
{extra}
"""


def test_a_so_built_for_another_abi_is_refused_naming_both_numbers_and_unloaded(tmp_path):
    path = compile_plugin(ABI_SOURCE.format(abi=RAD_ABI_VERSION + 1, name="future", extra=""),
                          tmp_path / "h" / "kernels" / "future.so")
    registry = Registry(str(tmp_path / "h"))
    (refusal,) = [r for r in registry.refused if r.path == path]
    assert str(refusal) == f"{path}: built for ABI {RAD_ABI_VERSION + 1}, this engine is ABI {RAD_ABI_VERSION}"
    assert not mapped(path)


def test_a_declining_so_is_unloaded_and_the_rest_load(tmp_path, capsys):
    marker = tmp_path / "opened"
    declining = compile_plugin(ABI_SOURCE.format(
        abi="RAD_ABI_VERSION", name="picky",
        extra=f'#include <stdio.h>\nint rad_plugin_open(void) {{ fclose(fopen("{marker}", "w")); return RAD_E_UNSUPPORTED; }}'),
        tmp_path / "h" / "kernels" / "picky.so")
    fine = compile_plugin(ABI_SOURCE.format(abi="RAD_ABI_VERSION", name="fine", extra=""),
                          tmp_path / "h" / "kernels" / "fine.so")
    registry = Registry(str(tmp_path / "h"))
    assert marker.exists() and registry.declined == [declining] and registry.refused == []
    assert not mapped(declining) and mapped(fine)
    assert [lib.name for lib in registry.hierarchy if lib.path.parent.parent == tmp_path / "h"] == ["fine"]
    assert "declined this machine (rad_plugin_open returned RAD_E_UNSUPPORTED)" in capsys.readouterr().err


@pytest.mark.parametrize("extra,body,reason", [
    ("", "kernel", "exports no rad_kernel_count()"),
    ("int rad_missing_function(void);\nint rad_plugin_open(void) { return rad_missing_function(); }", "ok",
     "cannot be opened: "),
    ("", "null_info", "rad_plugin_info() raised CTableError: a NULL RadPluginInfo"),
    ("int rad_plugin_open(void) { return RAD_E_DEVICE; }", "ok", "rad_plugin_open() returned -6"),
])
def test_a_malformed_so_is_refused_in_one_line_and_unloaded(tmp_path, extra, body, reason):
    source = ABI_SOURCE.format(abi="RAD_ABI_VERSION", name="bad", extra=extra)
    if body == "kernel":
        source = source.replace("int rad_kernel_count(void) { return 0; }", "")
    if body == "null_info":
        source = source.replace("return &i;", "(void)i; return 0;")
    path = compile_plugin(source, tmp_path / "h" / "kernels" / "bad.so")
    registry = Registry(str(tmp_path / "h"))
    (refusal,) = [r for r in registry.refused if r.path == path]
    assert reason in refusal.reason and "\n" not in str(refusal)
    if body == "ok" and "missing" in extra:
        assert "rad_missing_function" in refusal.reason
    assert not mapped(path)


def test_rad_info_and_rad_schemas_read_so_files_even_refused_ones(twins, tmp_path):
    c, py = twins
    old = compile_plugin((FIXTURES / "twin" / "twin.c").read_text().replace("return RAD_ABI_VERSION;", "return 7;")
                         .replace("{\"M\", RAD_P_INT, RAD_REQUIRED, RAD_PROLE_SEQ_CHUNK}, {\"N\"",
                                  "{\"M\", RAD_P_INT, RAD_REQUIRED, RAD_PROLE_SEQ_CHUNK}, {\"K\""),
                         tmp_path / "old" / "kernels" / "twin_old.so", 'TWIN_NAME="twin_old"')
    schemas = subprocess.run([script("rad-schemas"), str(c.path), str(py.path), str(old)],
                             capture_output=True, text=True)
    assert schemas.returncode == 1, schemas.stderr
    assert f"op 't_twin': {old} disagrees with {c.path}: parameter 1 is 'N' (int, required, none) there, " \
           f"'K' (int, required, none) here" in schemas.stdout
    assert "1 disagreement across 3 plugins, 1 ops" in schemas.stdout
    info = subprocess.run([script("rad-info"), "--plugins", "--radiance-home",
                           f"{c.path.parent.parent}:{tmp_path / 'old'}"], capture_output=True, text=True)
    assert info.returncode == 0, info.stderr
    line = next(line for line in info.stdout.splitlines() if " twin_c " in line)
    assert line.startswith("kernels") and "1 ops, 2 rows" in line and str(c.path) in line
    assert f"refused: {old}: built for ABI 7, this engine is ABI {RAD_ABI_VERSION}" in info.stdout
