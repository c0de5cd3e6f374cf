"""Load one plugin from its file: import a .py (or package folder), open a .so (shared_object.py),
check the ABI and kind, open, read its tables, and validate them. Both kinds give the same records;
from here on nothing knows which it was. Anything wrong refuses the plugin with one line naming the
file and the reason, and a .so that declines or is refused is unloaded."""

import hashlib
import importlib.util
import sys
import traceback

from radiance.abi import (
    RAD_ABI_VERSION, RAD_E_UNSUPPORTED, RAD_OK, RAD_PLUGIN_ARCH, RAD_PLUGIN_KERNEL, RAD_PLUGIN_QUANT,
    KIND_FOLDERS, RadPluginInfo, engine_defines_weight_decoder,
)
from radiance.weights.decode import decode
from radiance.weights.levels import CORE_SCHEMES

from .homes import Candidate
from .records import Plugin, PluginDeclined, PluginRefused, Row
from .shared_object import SharedObject
from .validate import validate_architectures, validate_quantizers, validate_rows, validate_schemas

REQUIRED = {
    RAD_PLUGIN_KERNEL: ("rad_kernel_schema_count", "rad_kernel_schema_at", "rad_kernel_count", "rad_kernel_at"),
    RAD_PLUGIN_ARCH: ("rad_arch_count", "rad_arch_at"),
    RAD_PLUGIN_QUANT: ("rad_quant_count", "rad_quant_at"),
}


_SCHEME_DECODERS: list = []  # the loaded quantisers' decode hooks (Registry), for schemes of their own


def engine_decode(encoding, planes: dict, shape: tuple):
    """rad_weight_f32's decoder: the core decoder for the `plain` and `affine` schemes, else the first
    loaded quantiser whose decode hook accepts the encoding (one returns RAD_E_UNSUPPORTED for an
    encoding it did not write), so an oracle row reads a quantiser's own scheme."""
    if encoding.scheme in CORE_SCHEMES:
        return decode(encoding, planes, shape)
    for hook in _SCHEME_DECODERS:
        values = hook(encoding, planes, shape)
        if not isinstance(values, int):
            return values
    raise ValueError(f"scheme {encoding.scheme!r} is decoded by no loaded quantiser")


def use_quantizer_decoders(hooks: list) -> None:
    _SCHEME_DECODERS[:] = hooks


def import_module(candidate: Candidate):
    """Import a plugin file or package folder under a private module name, the engine's side of
    the ABI (rad_weight_f32's decoder) defined first, as the engine links a plugin it loads."""
    engine_defines_weight_decoder(engine_decode)
    path = candidate.path
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    module_name = f"_radiance_plugin_{KIND_FOLDERS[candidate.kind]}_{candidate.name}_{digest}"
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(
            module_name, path / "__init__.py", submodule_search_locations=[str(path)])
    else:
        spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as error:  # a plugin's import may raise anything; none may stop the engine
        del sys.modules[module_name]
        where = traceback.extract_tb(error.__traceback__)[-1]
        raise PluginRefused(path, f"raised on import: {type(error).__name__}: {error} "
                                  f"(at {where.filename}:{where.lineno})") from None
    return module


def open_module(candidate: Candidate):
    """The plugin's exports: the imported module of a .py or folder, the opened library of a .so."""
    if candidate.path.suffix == ".so":
        return SharedObject(candidate.path)
    return import_module(candidate)


def _call(path, function, *args):
    try:
        return function(*args)
    except Exception as error:
        raise PluginRefused(path, f"{function.__name__}{args if args else '()'} raised "
                                  f"{type(error).__name__}: {error}") from None


def _table(path, module, count_symbol, at_symbol):
    count = _call(path, getattr(module, count_symbol))
    if not isinstance(count, int) or count < 0:
        raise PluginRefused(path, f"{count_symbol}() returned {count!r}, not a count")
    return [_call(path, getattr(module, at_symbol), i) for i in range(count)]


def _flag(plugin: Plugin, symbol: str, index: int, default):
    function = plugin.export(symbol)
    return default if function is None else _call(plugin.path, function, index)


def _tolerance(plugin: Plugin, index: int) -> float | None:
    """rad_kernel_tolerance(i): the row's own agreement with libref; None where it states none (no
    export, or a negative answer: its op's tolerance). validate_rows refuses one that is no number."""
    value = _flag(plugin, "rad_kernel_tolerance", index, -1.0)
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise PluginRefused(plugin.path, f"rad_kernel_tolerance({index}) returned {value!r}, not a number") from None
    return None if value < 0 else value


def read_identity(candidate: Candidate):
    """Import (or open) and check what every plugin must export: the ABI version and its info."""
    module = open_module(candidate)
    try:
        return module, _identity(candidate, module)
    except PluginRefused:
        if isinstance(module, SharedObject):
            module.unload()
        raise


def _identity(candidate: Candidate, module) -> RadPluginInfo:
    path = candidate.path
    for symbol in ("rad_plugin_abi_version", "rad_plugin_info") + REQUIRED[candidate.kind]:
        if not callable(getattr(module, symbol, None)):
            raise PluginRefused(path, f"exports no {symbol}()")
    version = _call(path, module.rad_plugin_abi_version)
    if version != RAD_ABI_VERSION:
        raise PluginRefused(path, f"built for ABI {version}, this engine is ABI {RAD_ABI_VERSION}")
    info = _call(path, module.rad_plugin_info)
    if not isinstance(info, RadPluginInfo):
        raise PluginRefused(path, f"rad_plugin_info() returned {type(info).__name__}, not RadPluginInfo")
    if not info.name:
        raise PluginRefused(path, "rad_plugin_info() gives no name")
    if info.kind != candidate.kind:
        found = KIND_FOLDERS.get(info.kind, f"unknown kind {info.kind}")
        raise PluginRefused(path, f"declares kind {info.kind} ({found}) but was found in "
                                  f"{KIND_FOLDERS[candidate.kind]}/")
    return info


def load_plugin(candidate: Candidate) -> Plugin:
    module, info = read_identity(candidate)
    plugin = Plugin(candidate, info, module)
    path = candidate.path
    open_ = plugin.export("rad_plugin_open")
    if open_ is not None:
        try:
            status = _call(path, open_)
        except PluginRefused:
            plugin.unload()
            raise
        if status == RAD_E_UNSUPPORTED:
            plugin.unload()
            raise PluginDeclined(path)
        if status != RAD_OK:
            plugin.unload()
            raise PluginRefused(path, f"rad_plugin_open() returned {status}")
    try:
        _read_tables(plugin)
    except PluginRefused:
        plugin.close()
        plugin.unload()
        raise
    return plugin


def _read_tables(plugin: Plugin) -> None:
    path, module = plugin.path, plugin.module
    reference = plugin.export("rad_plugin_reference")
    plugin.reference = bool(_call(path, reference)) if reference else False
    if plugin.candidate.kind == RAD_PLUGIN_KERNEL:
        plugin.schemas = _table(path, module, "rad_kernel_schema_count", "rad_kernel_schema_at")
        validate_schemas(path, plugin.schemas)
        infos = _table(path, module, "rad_kernel_count", "rad_kernel_at")
        plugin.rows = [
            Row(plugin, i, row,
                reference=bool(_flag(plugin, "rad_kernel_reference", i, plugin.reference)),
                concurrent=bool(_flag(plugin, "rad_kernel_concurrent", i, 0)),
                collective=int(_flag(plugin, "rad_kernel_collective", i, 0)),
                chain=bool(_flag(plugin, "rad_kernel_chain", i, 0)),
                tolerance=_tolerance(plugin, i))
            for i, row in enumerate(infos)]
        validate_rows(path, plugin.rows)
    elif plugin.candidate.kind == RAD_PLUGIN_ARCH:
        plugin.architectures = _table(path, module, "rad_arch_count", "rad_arch_at")
        validate_architectures(path, plugin.architectures)
    elif plugin.candidate.kind == RAD_PLUGIN_QUANT:
        plugin.quantizers = _table(path, module, "rad_quant_count", "rad_quant_at")
        validate_quantizers(path, plugin.quantizers)

