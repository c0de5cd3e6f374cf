"""Quantiser plugins as the converter uses them: found on the search path through the Registry (never
imported by name), their options typed from the recipe's values, every call's result checked.

Python quantisers see every weight as [rows, cols] (a vector is one row) and their options as
{key: value}, every declared option present, typed by RAD_P_INT / RAD_P_F64 / RAD_P_STR.
"""

import numpy as np

from radiance.abi import KIND_FOLDERS, RAD_E_UNSUPPORTED, RAD_P_F64, RAD_P_INT, RAD_P_STR, RAD_PLUGIN_QUANT, RadEncoding
from radiance.engine.loading.registry import Registry

from .job import WeightJob

TYPE_NAMES = {RAD_P_INT: "an integer", RAD_P_F64: "a number", RAD_P_STR: "a string"}


def _typed(value, kind):
    """The option value as its type, or None when it is not one."""
    if isinstance(value, bool):
        return None
    try:
        if kind == RAD_P_INT:
            number = float(value)
            return int(number) if number.is_integer() else None
        if kind == RAD_P_F64:
            return float(value)
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, str) else None


class Quantizer:
    def __init__(self, info, plugin):
        self.info, self.name, self.path = info, info.name, plugin.path

    def options(self, given: dict) -> dict:
        """Every declared option, typed: the given value or the default. ValueError for an unknown
        key or a value of the wrong type."""
        declared = {option.key: option for option in self.info.options}
        unknown = [key for key in given if key not in declared]
        if unknown:
            known = ", ".join(declared) or "none"
            raise ValueError(f"quantiser '{self.name}' has no option '{unknown[0]}' (its options: {known})")
        typed = {}
        for key, option in declared.items():
            value = _typed(given.get(key, option.deflt), option.type)
            if value is None:
                raise ValueError(f"quantiser '{self.name}': option '{key}' = {given.get(key, option.deflt)!r} "
                                 f"is not {TYPE_NAMES[option.type]}")
            typed[key] = value
        return typed

    def _call(self, hook, *args):
        try:
            return getattr(self.info, hook)(*args)
        except Exception as error:  # a plugin may raise anything; it becomes one line
            raise ValueError(f"quantiser '{self.name}' ({self.path}): {hook} raised "
                             f"{type(error).__name__}: {error}") from None

    def _refuse(self, hook, result):
        raise ValueError(f"quantiser '{self.name}' ({self.path}): {hook} returned {result!r:.80}")

    def job(self, name: str, shape: tuple, rows_of, options: dict) -> WeightJob:
        """A WeightJob quantising the f32 rows that rows_of(r0, r1) gives."""
        matrix = tuple(shape) if len(shape) == 2 else (1, shape[0])
        encoding = self._call("encoding", name, matrix, options)
        if not isinstance(encoding, RadEncoding):
            self._refuse("encoding", encoding)
        row_block = self._call("row_block", encoding, matrix) if self.info.row_block else 0
        if not isinstance(row_block, (int, np.integer)) or row_block < 0:
            self._refuse("row_block", row_block)

        def produce(r0, r1):
            rows = np.ascontiguousarray(rows_of(r0, r1), np.float32).reshape(r1 - r0, matrix[1])
            planes = self._call("quantize", encoding, rows, r0, options)
            if not isinstance(planes, dict):
                self._refuse("quantize", planes)
            return planes, rows

        method = " ".join([self.name] + [f"{key}={value}" for key, value in options.items()])
        return WeightJob(name, tuple(shape), encoding, int(row_block), method, produce)

    def decode(self, encoding, planes: dict, shape: tuple):
        """f32 [rows, cols] through the decode hook, or None when there is none or it declines."""
        if not self.info.decode:
            return None
        values = self._call("decode", encoding, planes, shape)
        if isinstance(values, int) and values == RAD_E_UNSUPPORTED:
            return None
        if not isinstance(values, np.ndarray) or values.shape != tuple(shape):
            self._refuse("decode", values)
        return values


class Quantizers:
    """Every quantiser on the search path: {name: Quantizer}; close() closes their plugins."""

    def __init__(self, radiance_home: str | None = None):
        self._registry = Registry(radiance_home)
        self.by_name = {name: Quantizer(info, plugin) for name, (info, plugin) in self._registry.quantizers.items()}
        self.refused = [str(refusal) for refusal in self._registry.refused
                        if KIND_FOLDERS[RAD_PLUGIN_QUANT] in refusal.path.parts]

    def close(self):
        self._registry.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
