"""A recipe: rules that pick each weight's quantiser, first match wins.

TOML (`[[rule]]` tables) or JSON (`{"rule": [...]}`), each rule
    match     = "layers.*.ffn.*"        fnmatch on our weight name, or "re:<regex>" (full match)
    quantizer = "q4_1"                  a quantiser's name on the search path
    options   = {group = 64}            optional; every key one the quantiser declares
A weight no rule matches is `plain` bf16, or `plain` f32 when it is a vector (norms).
Every rule is checked against the loaded quantisers when the recipe is read, before any weight.
"""

import fnmatch
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .errors import ConvertError

RULE_FIELDS = {"match", "quantizer", "options"}
DEFAULT = "plain"
DEFAULT_DTYPES = {1: "f32", 2: "bf16"}  # by the weight's dimensions


@dataclass(frozen=True)
class Rule:
    where: str          # how errors name it: "rule 2 (match 'layers.*')"
    pattern: str
    quantizer: object   # a quantizers.Quantizer
    options: dict       # typed, every declared option present

    def matches(self, name: str) -> bool:
        if self.pattern.startswith("re:"):
            return re.fullmatch(self.pattern[3:], name) is not None
        return fnmatch.fnmatchcase(name, self.pattern)


class Recipe:
    def __init__(self, rules: list[Rule], path, quantizers):
        self.rules, self.path, self._quantizers = rules, path, quantizers

    @classmethod
    def empty(cls, quantizers) -> "Recipe":
        """No rules: every weight takes the default."""
        return cls([], "(no recipe)", quantizers)

    @classmethod
    def load(cls, path, quantizers) -> "Recipe":
        """Read and check a recipe file; `quantizers` is a Quantizers (what the search path holds)."""
        path = Path(path)
        try:
            text = path.read_text()
            document = tomllib.loads(text) if path.suffix != ".json" else json.loads(text)
        except OSError as error:
            raise ConvertError(path, error.strerror or str(error)) from None
        except (tomllib.TOMLDecodeError, ValueError) as error:
            raise ConvertError(path, f"not a valid {'JSON' if path.suffix == '.json' else 'TOML'} recipe: {error}") from None
        entries = document.get("rule") if isinstance(document, dict) else None
        if not isinstance(entries, list) or set(document) != {"rule"}:
            raise ConvertError(path, "a recipe is a list of rules under 'rule' ([[rule]] in TOML) and nothing else")
        return cls([cls._rule(path, index, entry, quantizers) for index, entry in enumerate(entries, 1)],
                   path, quantizers)

    @staticmethod
    def _rule(path, index, entry, quantizers) -> Rule:
        if not isinstance(entry, dict) or not isinstance(entry.get("match"), str):
            raise ConvertError(path, f"rule {index} has no 'match' string")
        where = f"rule {index} (match {entry['match']!r})"
        unknown = sorted(set(entry) - RULE_FIELDS)
        if unknown:
            raise ConvertError(path, f"{where}: unknown field '{unknown[0]}' (fields: match, quantizer, options)")
        if entry["match"].startswith("re:"):
            try:
                re.compile(entry["match"][3:])
            except re.error as error:
                raise ConvertError(path, f"{where}: not a regular expression: {error}") from None
        name, options = entry.get("quantizer"), entry.get("options", {})
        if not isinstance(options, dict):
            raise ConvertError(path, f"{where}: options is not a table of key = value")
        try:
            quantizer = _quantizer(quantizers, name)
            return Rule(where, entry["match"], quantizer, quantizer.options(options))
        except ValueError as error:
            raise ConvertError(path, f"{where}: {error}") from None

    def choose(self, name: str, ndim: int) -> tuple:
        """(the Quantizer, its typed options) for a weight: the first rule that matches, else the default."""
        for rule in self.rules:
            if rule.matches(name):
                return rule.quantizer, rule.options
        try:
            quantizer = _quantizer(self._quantizers, DEFAULT)
            return quantizer, quantizer.options({"dtype": DEFAULT_DTYPES[ndim]})
        except ValueError as error:
            raise ConvertError(self.path, f"the default for weights no rule matches: {error}") from None


def _quantizer(quantizers, name):
    if not isinstance(name, str) or name not in quantizers.by_name:
        loaded = ", ".join(sorted(quantizers.by_name)) or "none"
        refused = f"; refused plugins: {'; '.join(quantizers.refused)}" if quantizers.refused else ""
        raise ValueError(f"no loaded quantiser is named {name!r} (loaded: {loaded}{refused})")
    return quantizers.by_name[name]
