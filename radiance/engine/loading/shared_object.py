"""A .so plugin opened for the loader: its exports, resolved by exact name, as Python callables with
the signatures a .py plugin's module-level functions have, returning radiance.abi's dataclasses.
So loader.py reads a .so exactly as it reads a .py, and the records it makes are the same.

The engine's rad_plugin.h helpers are loaded globally first (helpers.py); the plugin is opened with
RTLD_NOW (a symbol nothing defines refuses it at once, named) and RTLD_LOCAL (two plugins' own
symbols never meet). `unload` closes it again: for a plugin that declined or was refused, before
any of its code can be reached.
"""

from __future__ import annotations

import _ctypes
import ctypes
import os
from ctypes import POINTER, c_double, c_int, c_uint32
from pathlib import Path

from radiance.abi import RadArchInfo, RadKernelInfo, RadOpSchema, RadPluginInfo, RadQuantizerInfo

from .c_hooks import wrap_architecture, wrap_quantizer, wrap_row
from .c_structs import from_c
from .helpers import HelpersUnavailable, helpers
from .records import PluginRefused


def _plain(restype, argtypes=()):
    def adapt(plugin, function):
        function.restype, function.argtypes = restype, list(argtypes)
        return lambda *args: function(*args)
    return adapt


def _table_entry(struct, wrap=None):
    def adapt(plugin, function):
        function.restype, function.argtypes = POINTER(struct.ctype), [c_int]

        def at(i):
            value = from_c(struct, function(int(i)))
            return wrap(value, plugin.path.name) if wrap else value
        return at
    return adapt


def _info(plugin, function):
    function.restype, function.argtypes = POINTER(RadPluginInfo.ctype), []
    return lambda: from_c(RadPluginInfo, function())


EXPORTS = {
    "rad_plugin_abi_version": _plain(c_uint32),
    "rad_plugin_info": _info,
    "rad_kernel_schema_count": _plain(c_int),
    "rad_kernel_schema_at": _table_entry(RadOpSchema),
    "rad_kernel_count": _plain(c_int),
    "rad_kernel_at": _table_entry(RadKernelInfo, wrap_row),
    "rad_quant_count": _plain(c_int),
    "rad_quant_at": _table_entry(RadQuantizerInfo, wrap_quantizer),
    "rad_arch_count": _plain(c_int),
    "rad_arch_at": _table_entry(RadArchInfo, wrap_architecture),
    "rad_plugin_open": _plain(c_int),
    "rad_plugin_close": _plain(None),
    "rad_plugin_reference": _plain(c_int),
    "rad_kernel_reference": _plain(c_int, [c_int]),
    "rad_kernel_concurrent": _plain(c_int, [c_int]),
    "rad_kernel_collective": _plain(c_int, [c_int]),
    "rad_kernel_chain": _plain(c_int, [c_int]),
    "rad_kernel_tolerance": _plain(c_double, [c_int]),
}


class SharedObject:
    """The module-like face of a .so: `plugin.rad_kernel_at(3)` and so on; an absent export is an
    AttributeError, as it is on a module."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            helpers()
        except HelpersUnavailable as error:
            raise PluginRefused(self.path, str(error)) from None
        try:
            self._library = ctypes.CDLL(str(self.path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as error:
            raise PluginRefused(self.path, f"cannot be opened: {error}") from None
        self._exports: dict = {}

    def __getattr__(self, symbol: str):
        adapt = EXPORTS.get(symbol)
        library = self.__dict__.get("_library")
        if adapt is None or library is None:
            raise AttributeError(symbol)
        exported = self._exports.get(symbol)
        if exported is None:
            try:
                function = library[symbol]  # exactly this name, never a prefix or an alias
            except AttributeError:
                raise AttributeError(symbol) from None
            exported = adapt(self, function)
            exported.__name__ = symbol
            self._exports[symbol] = exported
        return exported

    def unload(self) -> None:
        """dlclose: the plugin's code and data leave the process."""
        library, self._library = self.__dict__.get("_library"), None
        self._exports.clear()
        if library is not None:
            _ctypes.dlclose(library._handle)

    def __repr__(self):
        return f"<C plugin {self.path}>"
