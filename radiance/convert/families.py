"""The architecture plugins as rad-convert asks them (rad_arch.h's import hooks): which one takes a
source, the hyper-parameters that source gives, the weights those call for and where each source
keeps them. Every answer is checked; a plugin that raises or answers out of contract is one line
naming it. The converter itself knows no family."""

import math

from radiance.abi import (
    RAD_FILL_IDENTITY, RAD_FILL_NORMAL, RAD_FILL_ONES, RAD_FILL_ZEROS, RAD_P_F64, RAD_P_INT, RAD_P_STR,
    RAD_SOURCE_GGUF, RAD_SOURCE_HF, RAD_SOURCE_SYNTHETIC, RadSourceInfo, RadWeightSpec,
)

SOURCE_NAMES = {RAD_SOURCE_GGUF: "GGUF files", RAD_SOURCE_HF: "Hugging Face folders",
                RAD_SOURCE_SYNTHETIC: "--synthetic"}
FILLS = (RAD_FILL_NORMAL, RAD_FILL_ONES, RAD_FILL_ZEROS, RAD_FILL_IDENTITY)
# What the converter adds to every family's hyper-parameters, from the source's tokenizer.
TOKENIZER_KEYS = ("bos_token_id", "eos_token_ids", "add_bos")


class Family:
    """One architecture's import hooks."""

    def __init__(self, info, plugin):
        self.info, self.plugin, self.name = info, plugin, info.name

    def _call(self, hook, *args):
        try:
            return getattr(self.info, hook)(*args)
        except Exception as error:  # a plugin may raise anything; it becomes one line
            raise ValueError(f"architecture '{self.name}' ({self.plugin.path}): {hook} raised "
                             f"{type(error).__name__}: {error}") from None

    def takes(self, kind: int, family: str) -> bool:
        return bool(self._call("takes", kind, family))

    def hyper(self, source: RadSourceInfo) -> dict:
        """The plugin's hyper-parameters for `source`, checked by its own check(); ValueError with
        the plugin's one-line reason."""
        hyper = self._call("hyper", source)
        if isinstance(hyper, str):
            raise ValueError(hyper)
        if not isinstance(hyper, dict):
            raise ValueError(f"architecture '{self.name}' ({self.plugin.path}): hyper returned "
                             f"{type(hyper).__name__}, not a dict or a reason")
        reason = self._call("check", hyper)
        if reason:
            raise ValueError(f"{self.name}: {reason}")
        return hyper

    def weights(self, hyper: dict) -> list[RadWeightSpec]:
        specs = self._call("weights", hyper)
        where = f"architecture '{self.name}' ({self.plugin.path}): weights"
        if not isinstance(specs, (list, tuple)) or not all(isinstance(spec, RadWeightSpec) for spec in specs):
            raise ValueError(f"{where} returned {type(specs).__name__}, not a list of RadWeightSpec")
        names = [spec.name for spec in specs if spec.name]
        if len(names) != len(set(names)):
            raise ValueError(f"{where} names a weight twice")
        for spec in specs:
            if spec.name and (spec.ndim not in (1, 2) or spec.cols < 1 or spec.rows < 1
                              or spec.ndim == 1 and spec.rows != 1 or spec.fill not in FILLS
                              or spec.fill == RAD_FILL_IDENTITY and spec.rows != spec.cols):
                raise ValueError(f"{where}: weight {spec.name!r} has shape {spec.ndim}-D {spec.rows}x{spec.cols} "
                                 f"and fill {spec.fill}, not a 1-D (rows 1) or 2-D shape and a RAD_FILL_* "
                                 f"(RAD_FILL_IDENTITY: a square one)")
        return list(specs)

    def options(self, given: dict) -> dict:
        """The synthetic shape options: every declared one typed, the given value or its default.
        ValueError for a key the family does not declare or a value of the wrong type."""
        declared = {option.key: option for option in self.info.synthetic}
        unknown = [key for key in given if key not in declared]
        if unknown:
            known = ", ".join(f"--{key.replace('_', '-')}" for key in declared) or "none"
            raise ValueError(f"no shape option --{unknown[0].replace('_', '-')} (its options: {known})")
        typed = {}
        for key, option in declared.items():
            text = given.get(key, option.deflt)
            value = _typed(text, option.type)
            if value is None:
                kind = {RAD_P_INT: "an integer", RAD_P_F64: "a number", RAD_P_STR: "a string"}[option.type]
                raise ValueError(f"--{key.replace('_', '-')} {text!r} is not {kind}")
            typed[key] = value
        return typed


def _typed(value, kind):
    if isinstance(value, bool):
        return int(value) if kind == RAD_P_INT else None
    try:
        if kind == RAD_P_INT:
            number = float(value)
            return int(number) if number.is_integer() else None
        if kind == RAD_P_F64:
            number = float(value)
            return number if math.isfinite(number) else None
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, str) else None


def taking(families: list[Family], kind: int, names: list[str]) -> tuple[Family, str]:
    """The first architecture (in search-path order) that takes a source of `kind` naming its family
    any of `names`, and that name; ValueError naming the family and the architectures loaded."""
    for family in families:
        for name in names:
            if family.takes(kind, name):
                return family, name
    loaded = ", ".join(family.name for family in families) or "none"
    asked = " or ".join(repr(name) for name in names) or "none given"
    raise ValueError(f"architecture {asked} is imported by no architecture plugin on the search path "
                     f"(loaded: {loaded}; none of them takes it from {SOURCE_NAMES[kind]})")


def matched(specs: list[RadWeightSpec], found: dict, field: str, family: str) -> list[tuple[RadWeightSpec, str]]:
    """(spec, the source's tensor name) of every weight to keep, in the container's order, after
    checking what the source holds against what the family calls for: `found` {source name: shape
    as the container would store it}; `field` 'gguf' or 'hf'. ValueError names the tensor at fault."""
    by_source = {getattr(spec, field): spec for spec in specs if getattr(spec, field)}
    for tensor in found:
        if tensor not in by_source:
            raise ValueError(f"tensor {tensor!r} is no {family} weight that rad-convert knows")
    kept = []
    for spec in specs:
        tensor = getattr(spec, field)
        if not tensor or tensor not in found:
            if spec.name and not spec.optional:
                raise ValueError(f"weight {spec.name!r} is missing" + (f" (tensor {tensor!r})" if tensor else ""))
            continue
        if spec.ndim and tuple(found[tensor]) != spec.shape:
            raise ValueError(f"tensor {tensor!r} ({spec.name or 'not kept'}) has shape {list(found[tensor])}, "
                             f"the hyper-parameters give {list(spec.shape)}")
        if spec.name:
            kept.append((spec, tensor))
    return kept
