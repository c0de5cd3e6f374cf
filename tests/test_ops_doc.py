"""docs/OPS.md is the vocabulary: every op the in-tree plugins declare, with the same schema, and
no op the plugins do not declare."""

import re
from pathlib import Path

from radiance.abi import (
    RAD_DERIVED, RAD_OPD_IN, RAD_OPD_INOUT, RAD_OPD_OUT, RAD_OPD_WEIGHT, RAD_OPD_WTAB, RAD_OPTIONAL, RAD_P_F64,
    RAD_P_INT, RAD_P_STR, RAD_PROLE_CAPACITY, RAD_PROLE_NONE, RAD_PROLE_SEQ_CHUNK, RAD_REQUIRED,
)
from radiance.engine.loading.registry import Registry

OPS_MD = Path(__file__).resolve().parent.parent / "docs" / "OPS.md"
TYPES = {"int": RAD_P_INT, "f64": RAD_P_F64, "str": RAD_P_STR}
REQUIREDNESS = {"required": RAD_REQUIRED, "optional": RAD_OPTIONAL, "derived": RAD_DERIVED}
ROLES = {"none": RAD_PROLE_NONE, "seq_chunk": RAD_PROLE_SEQ_CHUNK, "capacity": RAD_PROLE_CAPACITY}
OPERAND_ROLES = {"in": RAD_OPD_IN, "out": RAD_OPD_OUT, "inout": RAD_OPD_INOUT, "weight": RAD_OPD_WEIGHT,
                 "wtab": RAD_OPD_WTAB}


def documented_ops() -> dict:
    ops = {}
    sections = re.split(r"^## ", OPS_MD.read_text(), flags=re.M)[1:]
    for section in sections:
        name = section.split("\n", 1)[0].strip()
        rows = [[cell.strip() for cell in line.strip("|").split("|")]
                for line in section.splitlines() if line.startswith("|") and not line.startswith("|---")]
        params = [(r[0], TYPES[r[1]], REQUIREDNESS[r[2]], ROLES[r[3]]) for r in rows if len(r) == 4 and r[0] != "parameter"]
        operands = [(r[0], OPERAND_ROLES[r[1]], int(r[2])) for r in rows if len(r) == 3 and r[0] != "operand"]
        if params:
            ops[name] = (params, operands)
    return ops


def declared_ops() -> dict:
    registry = Registry(radiance_home="")
    try:
        return {op: ([(p.name, p.type, p.req, p.role) for p in entry.schema.params],
                     [(o.name, o.role, o.fixed) for o in entry.schema.operands])
                for op, entry in registry.ops.items()}
    finally:
        registry.close()


def test_ops_md_and_the_registries_agree():
    documented, declared = documented_ops(), declared_ops()
    assert documented, "docs/OPS.md documents no op"
    assert sorted(documented) == sorted(declared)
    for op in declared:
        assert documented[op] == declared[op], f"docs/OPS.md and the plugins disagree on '{op}'"


def test_every_in_tree_library_declares_only_documented_schemas():
    registry = Registry(radiance_home="")
    try:
        documented = documented_ops()
        for library in registry.hierarchy:
            for schema in library.schemas:
                params = [(p.name, p.type, p.req, p.role) for p in schema.params]
                operands = [(o.name, o.role, o.fixed) for o in schema.operands]
                assert documented.get(schema.op) == (params, operands), f"{library.path}: {schema.op}"
    finally:
        registry.close()
