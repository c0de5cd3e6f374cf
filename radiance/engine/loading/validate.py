"""Checks of one plugin's own tables, before it meets any other plugin. Each failure refuses the
plugin with one line naming the file and what is wrong."""

import math

from radiance.abi import (
    RAD_C_DIV, RAD_C_EQ, RAD_C_GE, RAD_C_IN, RAD_C_LE, RAD_DERIVED, RAD_DOMAIN_DEVICE, RAD_DOMAIN_HOST,
    RAD_OPD_IN, RAD_OPD_WTAB, RAD_OPTIONAL, RAD_P_F64, RAD_P_INT, RAD_P_STR, RAD_PROLE_CAPACITY,
    RAD_PROLE_NONE, RAD_REQUIRED, RadArchInfo, RadArchOption, RadConstraint, RadKernelInfo, RadOpSchema, RadQuantizerInfo,
)

from .records import PluginRefused

CONSTRAINT_OPS = {RAD_C_EQ: "EQ", RAD_C_LE: "LE", RAD_C_GE: "GE", RAD_C_DIV: "DIV", RAD_C_IN: "IN"}
PARAM_TYPES = {RAD_P_INT, RAD_P_F64, RAD_P_STR}
CHAIN_MARK = "r4dchain"


def validate_schemas(path, schemas) -> None:
    seen = set()
    for schema in schemas:
        if not isinstance(schema, RadOpSchema):
            raise PluginRefused(path, f"rad_kernel_schema_at returned {type(schema).__name__}, not RadOpSchema")
        where = f"schema '{schema.op}'"
        if not schema.op:
            raise PluginRefused(path, "a schema has no op name")
        if schema.op in seen:
            raise PluginRefused(path, f"{where} is declared twice")
        seen.add(schema.op)
        if not schema.params or schema.params[0].type != RAD_P_INT:
            raise PluginRefused(path, f"{where}: params[0] must be the ranged extent, an integer")
        names = set()
        for param in schema.params:
            if param.name in names:
                raise PluginRefused(path, f"{where}: parameter '{param.name}' twice")
            names.add(param.name)
            if param.type not in PARAM_TYPES:
                raise PluginRefused(path, f"{where}: parameter '{param.name}' has unknown type {param.type}")
            if param.req not in (RAD_REQUIRED, RAD_OPTIONAL, RAD_DERIVED):
                raise PluginRefused(path, f"{where}: parameter '{param.name}' has unknown requiredness {param.req}")
            if not RAD_PROLE_NONE <= param.role <= RAD_PROLE_CAPACITY:
                raise PluginRefused(path, f"{where}: parameter '{param.name}' has unknown role {param.role}")
        for operand in schema.operands:
            if not RAD_OPD_IN <= operand.role <= RAD_OPD_WTAB or operand.fixed not in (0, 1):
                raise PluginRefused(path, f"{where}: operand '{operand.name}' has role {operand.role}, "
                                          f"fixed {operand.fixed}")
            if operand.name in names:
                raise PluginRefused(path, f"{where}: '{operand.name}' is both a parameter and an operand")
            names.add(operand.name)


def _check_constraint(path, row_name, constraint) -> None:
    if not isinstance(constraint, RadConstraint):
        raise PluginRefused(path, f"row '{row_name}': a constraint is {type(constraint).__name__}")
    if constraint.op not in CONSTRAINT_OPS:
        raise PluginRefused(path, f"row '{row_name}': unknown constraint operator {constraint.op} "
                                  f"on '{constraint.key}'")
    if constraint.op == RAD_C_IN and not constraint.sval:
        raise PluginRefused(path, f"row '{row_name}': IN on '{constraint.key}' names no values")
    if constraint.op == RAD_C_DIV and constraint.ival <= 0:
        raise PluginRefused(path, f"row '{row_name}': DIV on '{constraint.key}' by {constraint.ival}")


def validate_rows(path, rows) -> None:
    names = {}
    for row in rows:
        info = row.info
        if not isinstance(info, RadKernelInfo):
            raise PluginRefused(path, f"rad_kernel_at({row.index}) returned {type(info).__name__}")
        if not info.name or not info.op:
            raise PluginRefused(path, f"row {row.index} has no name or no op")
        if info.name in names:
            raise PluginRefused(path, f"duplicate row name '{info.name}' (rows {names[info.name]} and {row.index})")
        names[info.name] = row.index
        if info.domain not in (RAD_DOMAIN_HOST, RAD_DOMAIN_DEVICE):
            raise PluginRefused(path, f"row '{info.name}': unknown domain {info.domain}")
        if not callable(info.launch):
            raise PluginRefused(path, f"row '{info.name}' has no launch")
        for constraint in info.constraints:
            _check_constraint(path, info.name, constraint)
        if (CHAIN_MARK in info.name) != row.chain:
            said = "true" if row.chain else "false"
            raise PluginRefused(path, f"row '{info.name}': rad_kernel_chain is {said} but the name "
                                      f"{'lacks' if row.chain else 'has'} '{CHAIN_MARK}'")
        if row.tolerance is not None and not math.isfinite(row.tolerance):
            raise PluginRefused(path, f"row '{info.name}': rad_kernel_tolerance is {row.tolerance}, not a finite number")
        if row.collective not in (0, 1, 2):
            raise PluginRefused(path, f"row '{info.name}': rad_kernel_collective is {row.collective}, not 0, 1 or 2")
        for tunable in info.tunables:
            if str(tunable.deflt) not in tunable.values.replace(",", " ").split():
                raise PluginRefused(path, f"row '{info.name}': tunable '{tunable.name}' default "
                                          f"{tunable.deflt} is not among its values '{tunable.values}'")


def _validate_named(path, items, struct, what: str, symbol: str, hooks: tuple[str, ...]):
    """Quantisers and architectures alike: the right struct, a unique non-empty name, its hooks."""
    names = set()
    for item in items:
        if not isinstance(item, struct):
            raise PluginRefused(path, f"{symbol} returned {type(item).__name__}")
        if not item.name or item.name in names:
            raise PluginRefused(path, f"{what} name '{item.name}' is empty or declared twice")
        names.add(item.name)
        missing = [hook for hook in hooks if not callable(getattr(item, hook))]
        if missing:
            raise PluginRefused(path, f"{what} '{item.name}' lacks {' and '.join(missing)}")


def validate_quantizers(path, quantizers) -> None:
    _validate_named(path, quantizers, RadQuantizerInfo, "quantiser", "rad_quant_at", ("encoding", "quantize"))
    for quantizer in quantizers:
        for option in quantizer.options:
            if option.type not in PARAM_TYPES:
                raise PluginRefused(path, f"quantiser '{quantizer.name}': option '{option.key}' has "
                                          f"unknown type {option.type}")


IMPORT_HOOKS = ("takes", "hyper", "weights")


def validate_architectures(path, architectures) -> None:
    _validate_named(path, architectures, RadArchInfo, "architecture", "rad_arch_at", ("check", "declare"))
    for architecture in architectures:
        given = [hook for hook in IMPORT_HOOKS if getattr(architecture, hook) is not None]
        if given and len(given) != len(IMPORT_HOOKS):
            missing = [hook for hook in IMPORT_HOOKS if hook not in given]
            raise PluginRefused(path, f"architecture '{architecture.name}' has the import hook "
                                      f"{given[0]} but not {' and '.join(missing)} (all three or none)")
        bad = [hook for hook in given if not callable(getattr(architecture, hook))]
        if bad:
            raise PluginRefused(path, f"architecture '{architecture.name}': {bad[0]} is not callable")
        for option in architecture.synthetic:
            if not isinstance(option, RadArchOption) or option.type not in PARAM_TYPES:
                raise PluginRefused(path, f"architecture '{architecture.name}': synthetic option "
                                          f"{getattr(option, 'key', option)!r} is not a RadArchOption of a known type")
