"""The CMake package a plugin builds with (abi/cmake): rad-config finds it, find_package fails at
configure time on another ABI number (both printed), cmake --install puts a plugin in the home of
the radiance it was built against unless RAD_PLUGIN_INSTALL_HOME says another, rad_add_plugin
refuses a kind that is no home folder. The build against an installed wheel, loaded and run in a
generation, is tests/test_packaging.py's."""

import os
import subprocess
from pathlib import Path

import pytest
from conftest import script

from radiance.abi import HEADERS_DIR, RAD_ABI_VERSION
from radiance.plugins import HOME

FIXTURE = Path(__file__).parent / "fixtures" / "oot_kernels"


def rad_config(*args) -> str:
    result = subprocess.run([script("rad-config"), *args], capture_output=True, text=True, check=True)
    return result.stdout.strip()


def configure(source: Path, build: Path, *options, env=None):
    return subprocess.run(["cmake", "-S", str(source), "-B", str(build), f"-Dradiance_DIR={rad_config('--cmakedir')}",
                           *options], capture_output=True, text=True, env={**os.environ, **(env or {})})


def cache(build: Path, name: str) -> str:
    for line in (build / "CMakeCache.txt").read_text().splitlines():
        if line.startswith(name + ":"):
            return line.split("=", 1)[1]
    raise KeyError(name)


def project(tmp_path: Path, body: str, name: str = "project") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "rows.c").write_text((FIXTURE / "rows.c").read_text())
    (folder / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.21)\nproject(p LANGUAGES C)\n" + body)
    return folder


def test_rad_config_prints_the_package_the_headers_the_home_and_the_abi():
    assert (Path(rad_config("--cmakedir")) / "radianceConfig.cmake").is_file()
    assert Path(rad_config("--includedir")) == HEADERS_DIR and (HEADERS_DIR / "rad_stream.h").is_file()
    assert Path(rad_config("--home")) == HOME and rad_config("--abi") == str(RAD_ABI_VERSION)
    assert f"abi: {RAD_ABI_VERSION}" in rad_config().splitlines()


def test_find_package_sets_the_variables_and_installs_into_the_radiance_home(tmp_path):
    body = ("find_package(radiance REQUIRED)\nrad_plugin_defaults()\n"
            "foreach(v RADIANCE_ABI_VERSION RADIANCE_HOME RADIANCE_KERNELS_DIR RADIANCE_ARCHITECTURES_DIR "
            "RADIANCE_QUANTIZERS_DIR)\n  message(STATUS \"${v}=${${v}}\")\nendforeach()\n"
            "rad_add_plugin(ootkernels kernels SOURCES rows.c)\n")
    source = project(tmp_path, body)
    result = configure(source, tmp_path / "build", env={"RAD_PLUGIN_INSTALL_HOME": ""})
    assert result.returncode == 0, result.stderr
    for name, value in (("RADIANCE_ABI_VERSION", RAD_ABI_VERSION), ("RADIANCE_HOME", HOME),
                        ("RADIANCE_KERNELS_DIR", HOME / "kernels"), ("RADIANCE_ARCHITECTURES_DIR", HOME / "architectures"),
                        ("RADIANCE_QUANTIZERS_DIR", HOME / "quantizers")):
        assert f"-- {name}={value}\n" in result.stdout
    assert cache(tmp_path / "build", "RAD_PLUGIN_INSTALL_HOME") == str(HOME)
    assert f"installs into {HOME}/kernels" in result.stdout
    # the environment variable, then -D, say another home
    other = configure(source, tmp_path / "env", env={"RAD_PLUGIN_INSTALL_HOME": str(tmp_path / "mine")})
    assert cache(tmp_path / "env", "RAD_PLUGIN_INSTALL_HOME") == str(tmp_path / "mine"), other.stderr
    configure(source, tmp_path / "flag", f"-DRAD_PLUGIN_INSTALL_HOME={tmp_path / 'flagged'}")
    assert cache(tmp_path / "flag", "RAD_PLUGIN_INSTALL_HOME") == str(tmp_path / "flagged")


def test_a_fresh_build_installs_a_loadable_plugin_into_the_home_asked_for(tmp_path):
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    for name in ("CMakeLists.txt", "rows.c"):
        (fresh / name).write_text((FIXTURE / name).read_text())
    home = tmp_path / "home"
    assert configure(fresh, tmp_path / "build", f"-DRAD_PLUGIN_INSTALL_HOME={home}").returncode == 0
    for step in (["cmake", "--build", str(tmp_path / "build")], ["cmake", "--install", str(tmp_path / "build")]):
        result = subprocess.run(step, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
    from radiance.engine.loading.registry import Registry

    registry = Registry(str(home))
    (library,) = [lib for lib in registry.hierarchy if lib.name == "ootkernels"]
    assert library.path == home / "kernels" / "ootkernels.so" and library.info.build_target == "host"
    assert [row.name for row in library.rows] == ["oot_rmsnorm", "oot_add"] and registry.refused == []
    registry.close()


def test_asking_for_another_abi_fails_at_configure_time_naming_both(tmp_path):
    asked = RAD_ABI_VERSION - 1
    source = project(tmp_path, f"find_package(radiance {asked} REQUIRED)\n")
    result = configure(source, tmp_path / "build")
    assert result.returncode != 0
    text = " ".join((result.stdout + result.stderr).split())
    assert f'requested version "{asked}"' in text and f"version: {RAD_ABI_VERSION}" in text
    same = project(tmp_path, f"find_package(radiance {RAD_ABI_VERSION} REQUIRED)\n", name="same")
    assert configure(same, tmp_path / "ok").returncode == 0


@pytest.mark.parametrize("call,message", [
    ("rad_add_plugin(x kernel SOURCES rows.c)", "the kind is kernels, architectures or quantizers"),
    ("rad_add_plugin(x kernels)", "no SOURCES"),
])
def test_rad_add_plugin_refuses_what_it_cannot_build(tmp_path, call, message):
    result = configure(project(tmp_path, f"find_package(radiance REQUIRED)\n{call}\n"), tmp_path / "build")
    assert result.returncode != 0 and message in " ".join(result.stderr.split())
