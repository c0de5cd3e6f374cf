"""AMD device code checked without a card: every libr4d device source (as the engine hands it to a
compiler: common.cu and the parts it builds on before each op's file; the collectives' one module,
common.cu, allreduce.cu and allreduce_fused.cu, in both of the forms DeviceP2P compiles) and
spechub's HIP source compile with Debian's hipcc (ROCm 5.2, HIP_PLATFORM=amd, -include
hip/hip_runtime.h) for gfx90a and gfx1030, and the code objects hold the kernels the rows launch.
That ROCm knows no newer target: gfx942 (MI300) stays unverifiable here, and nothing says otherwise.
.ci/run installs hipcc (apt) where it can; elsewhere these tests skip, saying so."""

import importlib.util
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import build_spechub
from radiance.collectives.device_p2p import MODULE_FILES, module_source
from radiance.device.fake import GLOBAL, bundle_images, elf_functions, expand_entry_macros

ROOT = Path(__file__).resolve().parent.parent
DEVICE = ROOT / "plugins" / "kernels" / "libr4d" / "device"
TARGETS = ("gfx90a", "gfx1030")

pytestmark = pytest.mark.skipif(shutil.which("hipcc") is None,
                                reason="hipcc is not on PATH (Debian's apt package hipcc, which .ci/run installs "
                                       "where apt-get may run): the AMD builds cannot be checked here")


def device_kernels():
    """libr4d's device_kernels.py (standard library only), which puts each op's source together."""
    spec = importlib.util.spec_from_file_location("libr4d_device_kernels", DEVICE.parent / "device_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    """One bundle holding a code object for each target."""
    return subprocess.run(["hipcc", "--genco", *(f"--offload-arch={t}" for t in TARGETS), "-include",
                           "hip/hip_runtime.h", "-O3", "-DNDEBUG", "-o", str(out), str(source)],
                          capture_output=True, text=True, env={**os.environ, "HIP_PLATFORM": "amd"})


def kernels_by_target(code: bytes) -> list:
    """The kernels of each device image of a bundle (or of one code object)."""
    images = bundle_images(code) if code.startswith(b"__CLANG_OFFLOAD_BUNDLE__") else [code]
    return [set(elf_functions(image)) for image in images]


def test_every_libr4d_device_source_compiles_for_gfx90a_and_gfx1030(tmp_path):
    names = list(sources())
    for name in names:
        (tmp_path / f"{name}.hip").write_text(sources()[name])
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda name: hipcc(tmp_path / f"{name}.hip", tmp_path / f"{name}.co"), names))
    failures = [f"{name}: {(result.stderr.strip().splitlines() or ['?'])[-1]}"
                for name, result in zip(names, results) if result.returncode != 0]
    assert not failures, "\n".join(failures)
    assert set(names) >= {"elementwise", "gemv", "gemm", "attention", "sample", "allreduce"}
    for name in names:
        # the entries a reader of the source finds (those a macro pastes together aside)
        expected = {entry for entry in GLOBAL.findall(expand_entry_macros(sources()[name])) if not entry.startswith("__")}
        images = kernels_by_target((tmp_path / f"{name}.co").read_bytes())
        assert len(images) == len(TARGETS), f"{name}: {len(images)} device images for {len(TARGETS)} targets"
        for built in images:
            assert built and expected <= built, f"{name}: {sorted(expected - built)} missing"
        assert images[0] == images[1], name


def test_spechub_builds_amd_code_objects_with_rad_add_plugin(tmp_path):
    home = build_spechub(tmp_path, "-DRAD_GPU_TARGETS=gfx90a;gfx1030")
    assert (home / "kernels" / "spechub.so").is_file()
    for target in TARGETS:
        (kernels,) = kernels_by_target((tmp_path / "build" / f"spechub.{target}.hsaco").read_bytes())
        assert {"spechub_propose", "spechub_verify"} <= kernels, target
    from radiance.engine.loading.registry import Registry

    registry = Registry(str(home), kernels="spechub")
    (library,) = [lib for lib in registry.hierarchy if lib.name == "spechub"]
    assert library.info.build_target.split() == ["host", "gfx90a", "gfx1030", "cuda", "hip"]
    registry.close()
