"""A fused row's `replaces`, as the specification spells it: each link of the chain it computes,
with its operands named by the fused op's own operands,

    rmsnorm(x,norm,normed)+gemm(normed,wq,q)+gemm(normed,wk,k)+gemm(normed,wv,v)

parsed and spelled here, and checked at load against the op the row serves and the schemas of the
links (`declaration_problem`): the fused op's operands are the chain's distinct operands in the
order they first appear, each one's role following from the links', and its parameters after the
ranged extent are the links' by name (`p` every link's, `p.i` link i's). Where a chain occurs in a
rank's graph is selection's business (radiance/engine/selection/fusion.py)."""

import re
from dataclasses import dataclass

from radiance.abi import RAD_DERIVED, RAD_OPD_IN, RAD_OPD_INOUT, RAD_OPD_OUT, RAD_OPD_WEIGHT, RAD_OPD_WTAB, RadOpSchema

from .records import Row

LINK = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\(([^()]*)\)")
QUALIFIED = re.compile(r"^(.+)\.(\d+)$")
ROLE_NAMES = {RAD_OPD_IN: "in", RAD_OPD_OUT: "out", RAD_OPD_INOUT: "inout", RAD_OPD_WEIGHT: "weight",
              RAD_OPD_WTAB: "wtab"}


@dataclass(frozen=True)
class Chain:
    ops: tuple[str, ...]
    slots: tuple[tuple[str, ...], ...]  # per link, the fused operand each of its operands is

    @property
    def text(self) -> str:
        return spell(self.ops, self.slots)

    def names(self) -> list[str]:
        """The fused operands, in the order they first appear."""
        return list(dict.fromkeys(name for link in self.slots for name in link if name))


def spell(ops, slots) -> str:
    return "+".join(f"{op}({','.join(names)})" for op, names in zip(ops, slots))


def parse_chain(text: str) -> Chain:
    """`op(a,b)+op(b,c)` -> Chain; ValueError naming what does not parse."""
    links = text.split("+")
    ops, slots = [], []
    for link in links:
        match = LINK.fullmatch(link.strip())
        if match is None or link != link.strip():
            raise ValueError(f"link {link!r} is not op(operand,...)")
        ops.append(match.group(1))
        slots.append(tuple(match.group(2).split(",")) if match.group(2) else ())
    if len(ops) < 2:
        raise ValueError("a chain has at least two links")
    return Chain(tuple(ops), tuple(slots))


def link_parameter(name: str, links: int) -> tuple[str, int | None]:
    """A fused op's parameter as (the links' name for it, the one link it is taken from or None
    for every link that declares it): `N.1` is link 1's N, `eps` every link's eps."""
    qualified = QUALIFIED.match(name)
    if qualified and int(qualified.group(2)) < links:
        return qualified.group(1), int(qualified.group(2))
    return name, None


def _role(accesses: list[int]) -> int:
    """A fused operand's role from its links' roles, in chain order."""
    kinds = set(accesses)
    if kinds & {RAD_OPD_WEIGHT, RAD_OPD_WTAB}:
        return accesses[0] if len(kinds) == 1 else -1
    if accesses[0] == RAD_OPD_OUT:
        return RAD_OPD_OUT  # written first: an output, or an intermediate the chain reads back
    written = kinds & {RAD_OPD_OUT, RAD_OPD_INOUT}
    return RAD_OPD_INOUT if written else RAD_OPD_IN


def declaration_problem(row: Row, schema: RadOpSchema, vocabulary: dict) -> str | None:
    """Why a row's `replaces` cannot be what its op computes, or None. Checked at load."""
    try:
        chain = parse_chain(row.info.replaces)
    except ValueError as error:
        return f"replaces {row.info.replaces!r}: {error}"
    where = f"replaces {row.info.replaces!r}"
    links = []
    for i, (op, slots) in enumerate(zip(chain.ops, chain.slots)):
        entry = vocabulary.get(op)
        if entry is None:
            return f"{where}: link {i} is op '{op}', which no loaded library declares"
        if len(slots) != len(entry.schema.operands):
            return f"{where}: link {i} ({op}) names {len(slots)} operands, its schema has {len(entry.schema.operands)}"
        links.append(entry.schema)
    names, declared = chain.names(), [operand.name for operand in schema.operands]
    if names != declared:
        return f"{where}: names operands {names} in first use, op '{schema.op}' declares {declared}"
    accesses: dict = {}
    fixed: dict = {}
    for link, slots in zip(links, chain.slots):
        for spec, name in zip(link.operands, slots):
            if name:
                accesses.setdefault(name, []).append(spec.role)
                fixed.setdefault(name, spec.fixed)
    for operand in schema.operands:
        role = _role(accesses[operand.name])
        if role != operand.role:
            found = ROLE_NAMES.get(role, "both a weight and an activation")
            return f"{where}: operand '{operand.name}' is {found} in the chain, op '{schema.op}' declares it " \
                   f"{ROLE_NAMES.get(operand.role, operand.role)}"
        if operand.fixed != fixed[operand.name]:
            return f"{where}: operand '{operand.name}' has fixed {fixed[operand.name]} in the chain, " \
                   f"{operand.fixed} in op '{schema.op}'"
    ranged = {link.params[0].name for link in links}
    if ranged != {schema.params[0].name}:
        return f"{where}: the links' ranged extents {sorted(ranged)} are not op '{schema.op}''s " \
               f"'{schema.params[0].name}'"
    for param in schema.params[1:]:
        if param.req == RAD_DERIVED:
            continue
        key, index = link_parameter(param.name, len(links))
        if index is not None:
            if key not in {p.name for p in links[index].params}:
                return f"{where}: parameter '{param.name}': link {index} ({chain.ops[index]}) has no '{key}'"
        elif not any(param.name in {p.name for p in link.params} for link in links):
            return f"{where}: parameter '{param.name}' is no link's (name it p or p.i, link i counted from 0)"
    return None
