"""Backend selection by the card a rank was given, and the rule that a host rank imports no GPU
library (cuda-bindings, hip-python, torch)."""

import os
import subprocess
import sys
import textwrap

import pytest

from radiance.device import backend_name, open_device
from radiance.device.base import Device


@pytest.mark.parametrize("environ, expected", [
    ({"CUDA_VISIBLE_DEVICES": "GPU-2f1c"}, "cuda"),
    ({"CUDA_VISIBLE_DEVICES": "0"}, "cuda"),
    ({"ROCR_VISIBLE_DEVICES": "1"}, "hip"),
    ({}, None),
    ({"CUDA_VISIBLE_DEVICES": ""}, None),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, None),
    ({"ROCR_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": "0"}, "cuda"),
])
def test_the_pinning_variable_names_the_backend(environ, expected):
    assert backend_name(environ) == expected


def test_two_vendors_at_once_is_refused_naming_both():
    with pytest.raises(ValueError, match="ROCR_VISIBLE_DEVICES='0'.*CUDA_VISIBLE_DEVICES='1'"):
        backend_name({"ROCR_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"})


def test_a_host_rank_opens_no_device():
    assert open_device({}) is None


@pytest.mark.parametrize("module, cls", [("cuda", "CudaDevice"), ("hip", "HipDevice")])
def test_each_backend_module_imports_here_and_implements_the_whole_interface(module, cls):
    backend = __import__(f"radiance.device.{module}", fromlist=[cls])
    device_class = getattr(backend, cls)
    assert issubclass(device_class, Device)
    assert not device_class.__abstractmethods__, f"{cls} leaves {sorted(device_class.__abstractmethods__)} abstract"


HOST_PATH = textwrap.dedent("""
    import sys
    import numpy as np
    import radiance
    import radiance.device as device
    from radiance.device.fake import FakeDevice
    from radiance.ranks.facts import measure_facts

    assert device.open_device() is None
    assert measure_facts(0, 1, None)["device.p2p"] == 0
    fake = FakeDevice({"noop": lambda d, l: None})
    module = fake.load(fake.compile('extern "C" __global__ void noop() {}'))
    fake.launch(fake.kernel(module, "noop"), 1, 1, device.KernelArgs("noop").pack())
    fake.close()
    print(sorted(m for m in sys.modules if m.split(".")[0] in ("cuda", "hip", "torch", "rocm", "cupy")))
""")


def test_the_host_path_imports_no_gpu_library(tmp_path):
    environ = {k: v for k, v in os.environ.items() if not k.endswith("VISIBLE_DEVICES")}
    environ["RADIANCE_KERNEL_CACHE"] = str(tmp_path)
    # Run away from the checkout, so `radiance` resolves to the installed package, not a bare folder.
    done = subprocess.run([sys.executable, "-c", HOST_PATH], env=environ, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
