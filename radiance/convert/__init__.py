"""rad-convert: GGUF files, Hugging Face folders and synthetic models to .rad containers, through
the architecture and quantiser plugins of the search path (docs/CONVERT.md).

The names below are imported on first use (PEP 562), not with the package: `radiance.convert.cache`,
which every `radiance` run imports, would otherwise pull in the whole converter (gguf, yaml, the
plugin registry: half a second of a process that only reads a .rad)."""

import importlib

# verify is imported now (it is light): a function named as its own submodule would otherwise be
# shadowed by the submodule, which the import system sets on the package when anything imports it
from .verify import verify

_HOMES = {"convert": "api", "convert_synthetic": "api", "synthetic_options": "api", "ConvertError": "errors",
          "Recipe": "recipe", "WeightError": "report", "table": "report"}

__all__ = ["convert", "convert_synthetic", "synthetic_options", "verify", "ConvertError", "Recipe", "WeightError",
           "table"]


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'radiance.convert' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
