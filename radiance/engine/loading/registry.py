"""Every plugin on the search path, loaded and checked against each other: the op vocabulary
(the first library in hierarchy order to declare an op fixes its schema), rows against their
schemas, quantiser names. A plugin that fails is refused with one line; the rest go on."""

from dataclasses import dataclass
from pathlib import Path

from radiance.abi import RAD_FACT_PREFIX, RAD_PLUGIN_ARCH, RAD_PLUGIN_KERNEL, RAD_PLUGIN_QUANT, RadOpSchema
from radiance.log import get_logger

from .hierarchy import entry_matches, order_libraries, parse_kernels
from .homes import discover, search_path
from .loader import load_plugin, use_quantizer_decoders
from .records import Plugin, PluginDeclined, PluginRefused, Row
from .replaces import declaration_problem

log = get_logger("radiance.registry")


@dataclass(frozen=True)
class Refusal:
    path: Path
    reason: str

    def __str__(self):
        return f"{self.path}: {self.reason}"


@dataclass(frozen=True)
class OpEntry:
    schema: RadOpSchema
    plugin: Plugin


class KernelsError(ValueError):
    """A library the user named (--kernels) cannot be used."""


TYPE_NAMES = {1: "int", 2: "f64", 3: "str"}
REQUIREDNESS_NAMES = {0: "required", 1: "optional", 2: "derived"}
PARAM_ROLE_NAMES = {0: "none", 1: "seq_chunk", 2: "capacity"}
OPERAND_ROLE_NAMES = {1: "in", 2: "out", 3: "inout", 4: "weight", 5: "wtab"}


def _param_text(p) -> str:
    return (f"'{p.name}' ({TYPE_NAMES.get(p.type, p.type)}, {REQUIREDNESS_NAMES.get(p.req, p.req)}, "
            f"{PARAM_ROLE_NAMES.get(p.role, p.role)})")


def _operand_text(o) -> str:
    return f"'{o.name}' ({OPERAND_ROLE_NAMES.get(o.role, o.role)}, fixed {o.fixed})"


def schema_difference(fixed: RadOpSchema, other: RadOpSchema) -> str | None:
    """How `other` differs from the schema that fixed the op, or None when it does not."""
    for what, left, right in (("parameter", [_param_text(p) for p in fixed.params], [_param_text(p) for p in other.params]),
                              ("operand", [_operand_text(o) for o in fixed.operands],
                               [_operand_text(o) for o in other.operands])):
        for i in range(max(len(left), len(right))):
            there = left[i] if i < len(left) else "nothing"
            here = right[i] if i < len(right) else "nothing"
            if there != here:
                return f"{what} {i} is {there} there, {here} here"
    return None


class Registry:
    def __init__(self, radiance_home: str | None = None, kernels: str | None = None,
                 kinds: tuple = (RAD_PLUGIN_KERNEL, RAD_PLUGIN_ARCH, RAD_PLUGIN_QUANT)):
        """Every plugin of the `kinds` asked for (rad-convert needs no kernel library)."""
        self.homes = search_path(radiance_home)
        self.kernel_entries = parse_kernels(kernels)
        self.refused: list[Refusal] = []
        self.declined: list[Path] = []
        self.shadowed = []
        self.plugins: dict[int, list[Plugin]] = {}
        for kind in (RAD_PLUGIN_KERNEL, RAD_PLUGIN_ARCH, RAD_PLUGIN_QUANT):
            self.plugins[kind] = self._load_kind(kind) if kind in kinds else []
        self.hierarchy, self.unmatched = order_libraries(self.plugins[RAD_PLUGIN_KERNEL], self.kernel_entries)
        self._check_named()
        self.ops: dict[str, OpEntry] = {}
        self._fix_vocabulary()
        self.plugins[RAD_PLUGIN_KERNEL] = [lib for lib in self.plugins[RAD_PLUGIN_KERNEL] if lib in self.hierarchy]
        self.quantizers = {}
        self.plugins[RAD_PLUGIN_QUANT] = [q for q in self.plugins[RAD_PLUGIN_QUANT]
                                          if self._admit_named(q, q.quantizers, self.quantizers, "quantiser")]
        if RAD_PLUGIN_QUANT in kinds:  # one that loads none (the launcher's check, /graph) leaves them be
            use_quantizer_decoders([quantizer.decode for plugin in self.plugins[RAD_PLUGIN_QUANT]
                                    for quantizer in plugin.quantizers if quantizer.decode])
        self.architectures = {}
        self.plugins[RAD_PLUGIN_ARCH] = [a for a in self.plugins[RAD_PLUGIN_ARCH]
                                         if self._admit_named(a, a.architectures, self.architectures, "architecture")]

    def _load_kind(self, kind: int) -> list[Plugin]:
        candidates, shadowed = discover(self.homes, kind)
        self.shadowed += shadowed
        loaded = []
        for candidate in candidates:
            try:
                loaded.append(load_plugin(candidate))
            except PluginDeclined as declined:
                self.declined.append(declined.path)
                log.info("%s", declined)
            except PluginRefused as refused:
                self._refuse(refused.path, refused.reason)
        return loaded

    def _refuse(self, path, reason: str) -> None:
        self.refused.append(Refusal(Path(path), reason))
        log.warning("plugin refused: %s: %s", path, reason)

    def _check_named(self) -> None:
        for entry in self.unmatched:
            for refusal in self.refused:
                if entry_matches(entry, refusal.path, refusal.path.stem):
                    raise KernelsError(f"--kernels names '{entry}', which was refused: {refusal}")
            log.warning("--kernels entry '%s' matches no kernel library on the search path", entry)

    def _fix_vocabulary(self) -> None:
        """The first library in hierarchy order to declare an op fixes its schema; a library that
        declares one differently, or whose rows do not fit the vocabulary, is refused whole. A
        row may implement an op another library declares (libref describes every op)."""
        while True:
            ops, conflicts = {}, []
            for library in self.hierarchy:
                try:
                    ops.update(self._schemas_of(library, ops))
                except PluginRefused as refused:
                    conflicts.append((library, refused))
            bad_rows = []
            for library in self.hierarchy:
                try:
                    for row in library.rows:
                        self._check_row(row, ops)
                except PluginRefused as refused:
                    if library not in [conflicting for conflicting, _ in conflicts]:
                        bad_rows.append((library, refused))
            # A library with bad rows may have fixed a schema that refused another: drop it first.
            for library, refused in bad_rows or conflicts:
                self._drop(library, refused)
            if not bad_rows:
                self.ops = ops
                return

    @staticmethod
    def _schemas_of(library: Plugin, ops: dict) -> dict:
        fixed_here = {}
        for schema in library.schemas:
            entry = ops.get(schema.op)
            if entry is None:
                fixed_here[schema.op] = OpEntry(schema, library)
                continue
            difference = schema_difference(entry.schema, schema)
            if difference:
                raise PluginRefused(library.path, f"declares op '{schema.op}' differently from "
                                                  f"{entry.plugin.name} ({entry.plugin.path}), which fixed it: {difference}")
        return fixed_here

    def _drop(self, library: Plugin, refused: PluginRefused) -> None:
        library.close()
        library.unload()
        self.hierarchy.remove(library)
        self._refuse(refused.path, refused.reason)

    @staticmethod
    def _check_row(row: Row, vocabulary: dict) -> None:
        entry = vocabulary.get(row.op)
        if entry is None:
            raise PluginRefused(row.plugin.path, f"row '{row.name}' implements op '{row.op}', which no "
                                                 f"loaded library declares")
        if row.info.replaces:
            problem = declaration_problem(row, entry.schema, vocabulary)
            if problem:
                raise PluginRefused(row.plugin.path, f"row '{row.name}': {problem}")
        keys = {param.name for param in entry.schema.params}
        for constraint in row.info.constraints:
            if constraint.key not in keys and not constraint.key.startswith(RAD_FACT_PREFIX):
                raise PluginRefused(row.plugin.path, f"row '{row.name}': constraint on '{constraint.key}', "
                                                     f"which op '{row.op}' does not declare and is no "
                                                     f"{RAD_FACT_PREFIX}* fact")

    def _admit_named(self, plugin: Plugin, declared, taken: dict, what: str) -> bool:
        """Two plugins declaring one quantiser (or architecture) name: the later is refused."""
        for item in declared:
            if item.name in taken:
                other = taken[item.name][1]
                plugin.close()
                plugin.unload()
                self._refuse(plugin.path, f"declares {what} '{item.name}', already declared by "
                                          f"{other.name} ({other.path})")
                return False
        for item in declared:
            taken[item.name] = (item, plugin)
        return True

    def rows_for(self, op: str) -> list[Row]:
        """Every row of an op, in hierarchy order then declaration order."""
        return [row for library in self.hierarchy for row in library.rows if row.op == op]

    def close(self) -> None:
        """rad_plugin_close for every plugin, last loaded first."""
        for kind in reversed(list(self.plugins)):
            for plugin in reversed(self.plugins[kind]):
                plugin.close()
        self.plugins = {kind: [] for kind in self.plugins}
        self.hierarchy = []
