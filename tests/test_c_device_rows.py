"""A .so device row inside a captured decode graph, on the fake card: ootdev
(tests/fixtures/oot_device, built out of tree with cmake) serves `add` ahead of the fixture library
fakedev, which serves every other op with libref's arithmetic; its kernel, carried as source, is
launched through the RadStreamTable, recorded by the graph capture and replayed, and the tokens are
the host path's (libref's) bit for bit. bench/card_c_device_row.py is the same on a card."""

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from radiance.abi import RAD_OK, RadArgs
from radiance.device.compile_cache import CompileCache
from radiance.device.fake import FakeDevice
from radiance.engine.loading.registry import Registry
from radiance.engine.running.device import DeviceExecutor
from test_device_executor import fake_home, generate, host_view

FIXTURE = Path(__file__).parent / "fixtures" / "oot_device"


@pytest.fixture(scope="module")
def ootdev(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ootdev")
    cmake_dir = subprocess.run([sys.executable, "-m", "radiance.tools.config", "--cmakedir"], check=True,
                               capture_output=True, text=True).stdout.strip()
    for step in (["cmake", "-S", str(FIXTURE), "-B", str(folder / "build"), f"-Dradiance_DIR={cmake_dir}",
                  f"-DRAD_PLUGIN_INSTALL_HOME={folder / 'home'}", "-DRAD_BUILD_TARGET_EXTRA=fake"],
                 ["cmake", "--build", str(folder / "build")], ["cmake", "--install", str(folder / "build")]):
        result = subprocess.run(step, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
    return folder / "home" / "kernels" / "ootdev.so"


def fake_card(registry, cache: Path) -> FakeDevice:
    """fakedev's kernel runs libref's row of the launching node; ootdev_add adds what its parameter
    block (a, b, y, n) points at."""
    fakedev = next(library for library in registry.hierarchy if library.name == "fakedev").module
    oracle = {row.op: row for library in registry.hierarchy if library.name == "libref" for row in library.rows}

    def fakedev_launch(device, launch):
        (launch_id,) = struct.unpack_from("<q", launch.args.data, 0)
        op, args = fakedev.LAUNCHES[launch_id]
        assert oracle[op].info.launch(RadArgs(t=tuple(host_view(device, t) for t in args.t), params=args.params)) == RAD_OK

    def ootdev_add(device, launch):
        a, b, y, n = struct.unpack("<QQQq", launch.args.data)
        device.view(y, n, np.float32)[:] = device.view(a, n, np.float32) + device.view(b, n, np.float32)

    return FakeDevice({"fakedev_launch": fakedev_launch, "ootdev_add": ootdev_add}, device_bytes=1 << 30,
                      cache=CompileCache(cache))


def test_a_so_device_row_runs_inside_a_captured_decode_graph_and_agrees_with_libref(tmp_path, tiny_model, ootdev):
    host, worker = generate(tiny_model, Registry(radiance_home="", kernels="libref"), max_seqs=2)
    worker.close()
    home = fake_home(tmp_path)
    shutil.copy(ootdev, Path(home) / "kernels" / "ootdev.so")
    registry = Registry(radiance_home=home, kernels="ootdev,fakedev,libref")
    assert registry.refused == []
    device = fake_card(registry, tmp_path / "cache")
    tokens, worker = generate(tiny_model, registry, device, max_seqs=2, graphs=True)
    try:
        assert tokens == host
        served = {(launch.node.op, launch.band.row.plugin.name) for launch, _, _ in worker.graph.issued()}
        assert ("add", "ootdev") in served and {name for op, name in served if op != "add"} == {"fakedev"}
        executor = worker.executor
        assert isinstance(executor, DeviceExecutor) and (2, 2) in executor._graphs
        before = len(device.launches)
        executor.run(2, 2)  # a decode shape seen before: the graph replays, the C row is not called
        replayed = [launch.name for launch in device.launches[before:]]
        assert replayed.count("ootdev_add") == 2 * 2  # two residual adds a layer, two layers
        assert device.compiles == 2  # fakedev's source and ootdev's, each once
    finally:
        worker.close()
