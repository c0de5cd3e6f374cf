"""libr4d's device sources as the engine puts them together, and nvcc's sm_90 cubin of one (imported
by test_amd_builds.py, test_device_gemma_rows.py and test_device_gguf_rows.py; holds no tests). The
compiles are early builds (tests/early_builds.py): begun when collection ends, beside the run."""

import importlib.util
import shutil
import subprocess
from pathlib import Path

import early_builds

DEVICE = Path(__file__).resolve().parent.parent / "plugins" / "kernels" / "libr4d" / "device"
NVCC = shutil.which("nvcc")


def device_kernels():
    """libr4d's device_kernels.py (standard library only), which puts each op's source together."""
    spec = importlib.util.spec_from_file_location("libr4d_device_kernels", DEVICE.parent / "device_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sm_90_cubin(name: str, attention: tuple = ()):
    """nvcc's sm_90 cubin of the op source `name` (with attention_options(*attention) where given):
    (nvcc's result, the cubin's path)."""
    kernels = device_kernels()
    options = kernels.attention_options(*attention) if attention else ()
    folder = early_builds.folder() / "sm_90"
    folder.mkdir(exist_ok=True)
    stem = "_".join([name, *map(str, attention)])
    (folder / f"{stem}.cu").write_text(kernels.source(name))
    result = subprocess.run([NVCC, "-arch=sm_90", "-cubin", *options, "-o", str(folder / f"{stem}.cubin"),
                             str(folder / f"{stem}.cu")], capture_output=True, text=True)
    return result, folder / f"{stem}.cubin"
