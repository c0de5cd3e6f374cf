"""AMD device code checked without a card: every libr4d device source (as the engine hands it to a
compiler: common.cu and the parts it builds on before each op's file; the collectives' one module,
common.cu, allreduce.cu and allreduce_fused.cu, in both of the forms DeviceP2P compiles) and
spechub's HIP source compile with Debian's hipcc (ROCm 5.2, HIP_PLATFORM=amd, -include
hip/hip_runtime.h) for gfx90a and gfx1030, and the code objects hold the kernels the rows launch.
That ROCm knows no newer target: gfx942 (MI300) stays unverifiable here, and nothing says otherwise.
.ci/run installs hipcc (apt) where it can; elsewhere these tests skip, saying so."""

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import early_builds
from conftest import build_spechub
from device_sources import DEVICE, device_kernels
from radiance.collectives.device_p2p import MODULE_FILES, module_source
from radiance.device.fake import GLOBAL, bundle_images, elf_functions, expand_entry_macros

TARGETS = ("gfx90a", "gfx1030")
HIPCC = shutil.which("hipcc")

pytestmark = pytest.mark.skipif(HIPCC is None,
                                reason="hipcc is not on PATH (Debian's apt package hipcc, which .ci/run installs "
                                       "where apt-get may run): the AMD builds cannot be checked here")


@functools.cache
def sources() -> dict:
    """{name: the source text as the engine compiles it}: every .cu is one op's file or a part of one."""
    kernels = device_kernels()
    found = {name: kernels.source(name) for name in kernels.FILES}
    parts = {part for chosen in kernels.PARTS.values() for part in chosen}
    # the collectives' one module (device_p2p.module_source: common.cu, allreduce.cu, the row family's
    # allreduce_fused.cu), in both of the forms DeviceP2P compiles it (COMPILE_OPTIONS)
    text = module_source()
    found["allreduce"], found["allreduce_host_mapped"] = text, "#define RAD_P2P_HOST_MAPPED 1\n" + text
    every = {path.stem for path in DEVICE.glob("*.cu")}
    covered = {"common", *parts, *found, *(Path(name).stem for name in MODULE_FILES)} - {"allreduce_host_mapped"}
    assert every == covered, "a device source no build covers"
    return {name: text for name, text in found.items() if name not in kernels.NVIDIA_ONLY}  # AMD's builds


def hipcc(source: Path, out: Path):
    """One bundle holding a code object for each target (hipcc's temporary folders, which it leaves
    behind, beside it: the session removes them with the early builds' folder)."""
    temporary = out.parent / "tmp"
    temporary.mkdir(exist_ok=True)
    return subprocess.run(["hipcc", "--genco", *(f"--offload-arch={t}" for t in TARGETS), "-include",
                           "hip/hip_runtime.h", "-O3", "-DNDEBUG", "-o", str(out), str(source)],
                          capture_output=True, text=True,
                          env={**os.environ, "HIP_PLATFORM": "amd", "TMPDIR": str(temporary)})


def compile_source(name: str):
    """The early build of one source: (hipcc's result, the bundle's path)."""
    folder = early_builds.folder() / "amd"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.hip").write_text(sources()[name])
    return hipcc(folder / f"{name}.hip", folder / f"{name}.co"), folder / f"{name}.co"


def build_spechub_amd() -> Path:
    """The early build of spechub for both targets: its folder (home/ and build/ inside)."""
    folder = early_builds.folder() / "spechub-amd"
    build_spechub(folder, "-DRAD_GPU_TARGETS=gfx90a;gfx1030")
    return folder


def amd_names() -> list:
    """The names sources() will give (read from device_kernels.py without the sources themselves, so
    that a source no build covers fails the test, not the collection)."""
    kernels = device_kernels()
    return [name for name in (*kernels.FILES, "allreduce", "allreduce_host_mapped") if name not in kernels.NVIDIA_ONLY]


# The hipcc compiles (one a source, both targets in each) and spechub's AMD build begin when collection
# ends, beside the rest of the run (tests/early_builds.py); none where there is no hipcc.
EARLY_BUILDS = {} if HIPCC is None else {
    **{f"hipcc:{name}": functools.partial(compile_source, name) for name in amd_names()},
    "cmake:spechub-amd": build_spechub_amd}


def kernels_by_target(code: bytes) -> list:
    """The kernels of each device image of a bundle (or of one code object)."""
    images = bundle_images(code) if code.startswith(b"__CLANG_OFFLOAD_BUNDLE__") else [code]
    return [set(elf_functions(image)) for image in images]


def test_every_libr4d_device_source_compiles_for_gfx90a_and_gfx1030():
    names = list(sources())
    results = {name: early_builds.result(f"hipcc:{name}", functools.partial(compile_source, name)) for name in names}
    failures = [f"{name}: {(result.stderr.strip().splitlines() or ['?'])[-1]}"
                for name, (result, _) in results.items() if result.returncode != 0]
    assert not failures, "\n".join(failures)
    assert set(names) >= {"elementwise", "gemv", "gemm", "attention", "sample", "allreduce"}
    for name in names:
        # the entries a reader of the source finds (those a macro pastes together aside)
        expected = {entry for entry in GLOBAL.findall(expand_entry_macros(sources()[name])) if not entry.startswith("__")}
        images = kernels_by_target(results[name][1].read_bytes())
        assert len(images) == len(TARGETS), f"{name}: {len(images)} device images for {len(TARGETS)} targets"
        for built in images:
            assert built and expected <= built, f"{name}: {sorted(expected - built)} missing"
        assert images[0] == images[1], name


def test_spechub_builds_amd_code_objects_with_rad_add_plugin():
    folder = early_builds.result("cmake:spechub-amd", build_spechub_amd)
    home = folder / "home"
    assert (home / "kernels" / "spechub.so").is_file()
    for target in TARGETS:
        (kernels,) = kernels_by_target((folder / "build" / f"spechub.{target}.hsaco").read_bytes())
        assert {"spechub_propose", "spechub_verify"} <= kernels, target
    from radiance.engine.loading.registry import Registry

    registry = Registry(str(home), kernels="spechub")
    (library,) = [lib for lib in registry.hierarchy if lib.name == "spechub"]
    assert library.info.build_target.split() == ["host", "gfx90a", "gfx1030", "cuda", "hip"]
    registry.close()
