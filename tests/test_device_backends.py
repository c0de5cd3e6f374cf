"""The cuda and hip backends against the interface and against their bindings, without a card:
the same call shapes as the base class, and every binding name they use present in the installed
cuda-bindings / hip-python (skipped, with the reason, where the binding is not installed)."""

import ast
import importlib
import importlib.util
import inspect
from pathlib import Path

import pytest

from radiance.device.base import Device
from radiance.device.fake import FakeDevice

BACKENDS = {"cuda": ("CudaDevice", {"driver": "cuda.bindings.driver", "nvrtc": "cuda.bindings.nvrtc"}),
            "hip": ("HipDevice", {"hip": "hip.hip", "hiprtc": "hip.hiprtc"})}


def backend_class(name):
    return getattr(importlib.import_module(f"radiance.device.{name}"), BACKENDS[name][0])


@pytest.mark.parametrize("name", ["cuda", "hip", "fake"])
def test_every_primitive_has_the_interfaces_call_shape(name):
    cls = FakeDevice if name == "fake" else backend_class(name)
    for method in sorted(Device.__abstractmethods__):
        expected = list(inspect.signature(getattr(Device, method)).parameters)
        got = list(inspect.signature(getattr(cls, method)).parameters)
        assert got == expected, f"{cls.__name__}.{method}{got} differs from Device.{method}{expected}"


def binding_names(module_name, roots):
    """Every `root.attr[.attr...]` chain the backend's source uses for a binding module root."""
    tree = ast.parse(Path(importlib.import_module(f"radiance.device.{module_name}").__file__).read_text())
    chains = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "_parent", None), ast.Attribute):
            parts, inner = [], node
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in roots:
                chains.add((inner.id, tuple(reversed(parts))))
    return chains


def from_import(path):
    """`from package import name`, as the backends write it (hip-python 10 aliases hip.hip lazily)."""
    package, name = path.rsplit(".", 1)
    module = importlib.import_module(package)
    return getattr(module, name) if hasattr(module, name) else importlib.import_module(path)


@pytest.mark.parametrize("name", ["cuda", "hip"])
def test_every_binding_name_the_backend_uses_exists(name):
    _cls, roots = BACKENDS[name]
    package = next(iter(roots.values())).split(".")[0]
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed here (pip install 'radiance[{'cuda' if name == 'cuda' else 'rocm'}]')")
    modules = {root: from_import(path) for root, path in roots.items()}
    missing = []
    for root, chain in sorted(binding_names(name, roots)):
        value = modules[root]
        for i, part in enumerate(chain):
            if part in ("value", "programmaticStreamSerializationAllowed") and i > 0:
                break  # fields of a struct instance, not module attributes
            if not hasattr(value, part):
                missing.append(f"{root}.{'.'.join(chain[:i + 1])}")
                break
            value = getattr(value, part)
    assert not missing, f"{name}.py uses names its bindings lack: {missing}"
