"""libr4d's device sources as the engine puts them together, and nvcc's sm_90 cubin of one (imported
by test_amd_builds.py, test_device_gemma_rows.py and test_device_gguf_rows.py; holds no tests). The
compiles are early builds (tests/early_builds.py): begun when collection ends, beside the run; and a
cubin's SASS, where cuobjdump is found (imported by test_device_tensor_cores.py and
test_gemm_wgmma_on_host.py too)."""

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


def sass(cubin) -> str | None:
    """cuobjdump's SASS of a cubin (its path, or its bytes), or None where no cuobjdump is found (on PATH,
    or from the pip wheels nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm, which install beside each other)."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        try:
            import nvidia.cu13 as cu13
            found = sorted(Path(cu13.__path__[0]).glob("bin/cuobjdump"))
            tool = str(found[0]) if found else None
        except ImportError:
            tool = None
    if tool is None:
        return None
    if isinstance(cubin, (bytes, bytearray)):
        path = early_builds.folder() / f"sass_{abs(hash(bytes(cubin)))}.cubin"
        path.write_bytes(cubin)
        cubin = path
    environment = early_builds.environment()
    environment["PATH"] = f"{Path(tool).parent}:{environment.get('PATH', '')}"  # its nvdisasm beside it
    done = subprocess.run([tool, "--dump-sass", str(cubin)], capture_output=True, text=True, env=environment)
    return done.stdout if done.returncode == 0 else None
