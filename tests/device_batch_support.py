"""Support for the tests of libr4d's device rows for batches (imported by test_device_tensor_cores.py
and test_device_batch_rows.py; holds no tests): fp8 weights as rad-convert writes them, and a fake
card that says it is an NVIDIA card whose kernels are the numpy forms of
tests/fixtures/r4d_fake_kernels.py."""

import ctypes
import functools
import importlib.util
from pathlib import Path

import numpy as np

from radiance.abi import RadWeightPlanes, rad_tensor
from radiance.device.fake import FakeDevice, FakeKernel

FIXTURES = Path(__file__).parent / "fixtures"


@functools.cache
def fixture_module(name):
    """tests/fixtures/<name>.py, loaded once for the session (fixtures/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"_fixture_{name}", FIXTURES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FAKES = fixture_module("r4d_fake_kernels")


class Pointers:
    """ctypes pointers to numpy arrays for a kernel's host build (tests/fixtures/cuda_on_host.py), each
    array kept alive as long as this object; None is the null pointer."""

    def __init__(self):
        self.kept = []

    def __call__(self, array) -> ctypes.c_void_p:
        if array is None:
            return ctypes.c_void_p(0)
        self.kept.append(array)
        return ctypes.c_void_p(array.ctypes.data)


def fp8_weight(registry, rows, cols, seed, scale="channel") -> RadWeightPlanes:
    """Random N(0, 0.02) rows through the fp8 quantiser plugin, as rad-convert writes them."""
    info = registry.quantizers["fp8"][0]
    w = (np.random.default_rng(seed).standard_normal((rows, cols)) * 0.02).astype(np.float32)
    options = {"scale": scale}
    encoding = info.encoding("w", w.shape, options)
    planes = info.quantize(encoding, w, 0, options)
    return RadWeightPlanes(encoding=encoding, rows=rows, cols=cols,
                           planes=[rad_tensor(np.ascontiguousarray(planes[p.name])) for p in encoding.planes])


class NvidiaFake(FakeDevice):
    """The fake card, saying it is an NVIDIA card of its `target`: libr4d's device rows load on it
    (their build_target names cuda) and plan for that card; its kernels are the numpy forms. A
    kernel's compile options ride in its fake code object, and the numpy form sees those it was
    compiled with as `device.options` while it runs (gemm_wgmma.cu's cut is in its -DWG_* macros)."""
    vendor = "cuda"
    multiprocessors = 132

    def _compile(self, source: str, options) -> bytes:
        return super()._compile(source, options) + f"// options {' '.join(options)}\n".encode()

    def _load(self, code: bytes):
        names = super()._load(code)
        start = code.find(b"// options ")
        options = tuple(code[start + 11:code.index(b"\n", start)].decode().split()) if start >= 0 else ()
        return {name: options for name in names}

    def _function(self, module_handle, name: str):
        kernel, static = super()._function(module_handle, name)
        options = module_handle[name.encode()]

        def run(device, launch):
            device.options = options
            return kernel.fn(device, launch)
        return FakeKernel(run, static), static


def nvidia_fake(target="sm_89", kernels=None) -> NvidiaFake:
    # its own compiler version: the compile cache must not hand it a plain fake's code (no options line)
    return NvidiaFake({**FAKES.kernels(), **(kernels or {})}, target=target, device_bytes=1 << 31,
                      compiler_version="fake-4+options")
