"""The distribution: one top-level module, `radiance`; the in-tree home installed as files and
found last on the search path from a wheel; in-tree plugins that use only what a third party has."""

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "plugins"
ALLOWED_IMPORTS = {"radiance.abi", "numpy", "ml_dtypes", "__future__", *sys.stdlib_module_names}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, text=True)
    (path,) = out.glob("radiance-*.whl")
    return path


def test_wheel_installs_no_top_level_module_but_radiance(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/", 1)[0] for name in names}
    assert {entry for entry in top_level if not entry.endswith(".dist-info")} == {"radiance"}
    for header in ("rad_abi.h", "rad_types.h", "rad_encoding.h", "rad_plugin.h", "rad_quant.h", "rad_stream.h",
                   "cmake/radianceConfig.cmake", "cmake/radianceConfigVersion.cmake", "cmake/rad_embed.cmake"):
        assert f"radiance/abi/{header}" in names
    assert "radiance/engine/loading/rad_plugin.c" in names  # the helpers a C plugin binds to
    assert "radiance/plugins/kernels/libref/__init__.py" in names
    assert not [name for name in names if "__pycache__" in name]


def _run(code: str, env_extra: dict, cwd: Path) -> str:
    env = {**os.environ, **env_extra}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return result.stdout


LIST_PLUGINS = """
import json, radiance
from radiance.engine.loading.registry import Registry
registry = Registry()
print(json.dumps({"radiance": radiance.__file__, "homes": [str(h) for h in registry.homes],
                  "plugins": {p.name: str(p.path) for kind in registry.plugins.values() for p in kind},
                  "refused": [str(r) for r in registry.refused]}))
"""


def test_the_installed_home_comes_last_from_a_wheel(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    user_home = tmp_path / "user_home"
    (user_home / "kernels").mkdir(parents=True)
    found = json.loads(_run(LIST_PLUGINS, {"PYTHONPATH": str(target), "RADIANCE_HOME": str(user_home)}, tmp_path))
    assert found["radiance"].startswith(str(target))
    assert found["homes"] == [str(user_home), str(target / "radiance" / "plugins")]
    assert found["plugins"]["libref"].startswith(str(target)) and found["refused"] == []


def test_in_tree_plugins_load_from_a_home_outside_the_source_tree(tmp_path):
    """The specification's out-of-tree check: copies of every in-tree plugin, loaded from another
    home against the installed package, shadow the originals and load without a refusal."""
    home = tmp_path / "oot"
    kinds = [kind for kind in ("kernels", "architectures", "quantizers") if (PLUGINS / kind).is_dir()]
    for kind in kinds:
        shutil.copytree(PLUGINS / kind, home / kind, ignore=shutil.ignore_patterns("__pycache__"))
    found = json.loads(_run(LIST_PLUGINS, {"RADIANCE_HOME": str(home)}, tmp_path))
    copied = {entry.stem if entry.is_file() else entry.name
              for kind in kinds for entry in (home / kind).iterdir() if not entry.name.startswith(("_", "."))}
    assert copied and found["refused"] == []
    from_copies = {name for name, path in found["plugins"].items() if path.startswith(str(home))}
    assert len(from_copies) == len(copied)


def _imports(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module


@pytest.mark.parametrize("path", sorted(PLUGINS.glob("*/**/*.py")), ids=lambda p: str(p.relative_to(PLUGINS)))
def test_plugins_import_nothing_of_radiance_but_the_abi(path):
    for module in _imports(path):
        allowed = module in ALLOWED_IMPORTS or module.split(".")[0] in ALLOWED_IMPORTS - {"radiance"}
        assert allowed, f"{path} imports {module}: a plugin may import only radiance.abi (and numpy, ml_dtypes)"


GENERATE = """
import json, sys
from radiance.config import Config
from radiance.generation.engine import Engine
from radiance.generation.sequence import SamplingParams
from radiance.generation.text import TextCodec
from radiance.ranks.worker import Worker

def generate(kernels):
    config = Config(model=sys.argv[1], kernels=kernels, accept_reference=True, progress=False, return_buffer="logits")
    worker = Worker(config).build()
    text = TextCodec(worker.model.container.tokenizer, None, worker.model.hyper)
    engine = Engine(config, worker.execute, text)
    sequence = engine.add(list(range(1, 30)), SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    logits = []
    while engine.scheduler.has_work:
        engine.step()
        logits.append(worker.executor.read_buffer("logits", 1).tolist())
    rows = sorted({line.split("|")[-1] for line in worker.graph.lines()})
    worker.close()
    return {"tokens": sequence.output_ids, "logits": logits, "rows": rows}

print(json.dumps({"mine": generate("ootkernels,libref"), "libref": generate("libref")}))
"""


def test_a_c_plugin_built_out_of_tree_against_the_installed_wheel_serves_a_generation_as_libref(wheel, tmp_path,
                                                                                                 tiny_model):
    """The specification's out-of-tree build: the wheel installed, a C library outside the tree built
    with cmake against the installed package in a fresh folder, installed into a home, loaded from
    $RADIANCE_HOME; its rows run in a generation and agree with libref's bit for bit."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(target)}
    cmake_dir = subprocess.run([sys.executable, "-m", "radiance.tools.config", "--cmakedir"], env=env, check=True,
                               capture_output=True, text=True, cwd=tmp_path).stdout.strip()
    assert cmake_dir == str(target / "radiance" / "abi" / "cmake")
    fresh, home = tmp_path / "fresh", tmp_path / "home"
    shutil.copytree(Path(__file__).parent / "fixtures" / "oot_kernels", fresh)
    for step in (["cmake", "-S", str(fresh), "-B", str(fresh / "build"), f"-Dradiance_DIR={cmake_dir}",
                  f"-DRAD_PLUGIN_INSTALL_HOME={home}"],
                 ["cmake", "--build", str(fresh / "build")], ["cmake", "--install", str(fresh / "build")]):
        result = subprocess.run(step, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
    assert (home / "kernels" / "ootkernels.so").is_file()
    ran = json.loads(_run(GENERATE.replace("sys.argv[1]", repr(str(tiny_model))),
                          {"PYTHONPATH": str(target), "RADIANCE_HOME": str(home)}, tmp_path))
    mine, oracle = ran["mine"], ran["libref"]
    assert {"ootkernels:oot_rmsnorm", "ootkernels:oot_add"} <= set(mine["rows"])
    assert not any(row.startswith("ootkernels") for row in oracle["rows"])
    assert len(mine["tokens"]) == 6 and mine["tokens"] == oracle["tokens"] and mine["logits"] == oracle["logits"]
