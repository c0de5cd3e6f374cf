"""Fused rows in a rank's graph. A row whose `replaces` spells a chain of conventional ops
(radiance/engine/loading/replaces.py, checked at load) computes that chain in one launch, leaving
every operand as the chain would. A run of consecutive graph nodes is that chain when, with its
buffers renamed to the fused op's operands in the order they first appear, it reads byte for byte
as the text: same ops, same wiring. A chain that is only close (another op, another wiring) fuses
nothing. The fused op's parameters after the ranged extent are taken from the links by name: `p`
is the value every link declaring `p` agrees on, `p.i` is link i's own (links counted from 0).

Which fusions run is decided after every node is resolved (resolve.py), so the hierarchy stays
absolute: a fused row serves a band only where its own library serves every link of the chain."""

from dataclasses import dataclass

from radiance.abi import RAD_DERIVED, RadOpSchema
from radiance.engine.loading.records import Plugin, Row
from radiance.engine.loading.replaces import link_parameter, parse_chain, spell

from .shard import RankNode


@dataclass
class Candidate:
    """A run of graph nodes that a library's fused rows replace, bound to the fused op."""
    start: int  # position of the first link in the rank's node list
    links: list[RankNode]
    node: RankNode
    schema: RadOpSchema
    library: Plugin
    rows: list[Row]


def _rename(links: list[RankNode], names: list[str]) -> tuple[str | None, dict]:
    """The chain as the row would spell it (graph buffers renamed to `names` in first-use order),
    or (None, reason) when the chain touches another number of operands."""
    distinct = list(dict.fromkeys(name for link in links for name in link.operands if name))
    if len(distinct) != len(names):
        return None, {"why": f"touches {len(distinct)} operands, the fused op has {len(names)}"}
    mapping = dict(zip(distinct, names))
    text = spell([link.op for link in links], [[mapping.get(name, "") for name in link.operands] for link in links])
    return text, {"distinct": distinct}


def _parameters(schema: RadOpSchema, links: list[RankNode]) -> tuple[dict | None, str]:
    params = {}
    for param in schema.params[1:]:
        if param.req == RAD_DERIVED:
            continue
        key, index = link_parameter(param.name, len(links))
        if index is not None:
            if key in links[index].params:
                params[param.name] = links[index].params[key]
            continue
        values = {repr(link.params[param.name]): (link.name, link.params[param.name])
                  for link in links if param.name in link.params}
        if len(values) > 1:
            shown = ", ".join(f"{value!r} at {name}" for name, value in values.values())
            return None, f"parameter '{param.name}' differs between links ({shown})"
        if values:
            params[param.name] = next(iter(values.values()))[1]
    return params, ""


def find_candidates(nodes: list[RankNode], registry, domain: int) -> tuple[list[Candidate], list[str]]:
    """Every run of nodes some library's fused rows replace, and, for --debug-selection, why each
    fused row that matches nowhere does not (its chain absent, or wired otherwise)."""
    offered: dict = {}  # (library, fused op, replaces) -> rows, in hierarchy then declaration order
    for library in registry.hierarchy:
        for row in library.rows:
            if row.info.replaces and row.info.domain == domain and row.op in registry.ops:
                offered.setdefault((library, row.op, row.info.replaces), []).append(row)
    candidates, notes = [], []
    for (library, op, text), rows in offered.items():
        chain, schema = parse_chain(text), registry.ops[op].schema
        found, near = 0, None
        for start in range(len(nodes) - len(chain.ops) + 1):
            links = nodes[start:start + len(chain.ops)]
            if tuple(link.op for link in links) != chain.ops:
                continue
            spelled, extra = _rename(links, chain.names())
            why = extra.get("why")
            if why is None and len({link.extent for link in links}) != 1:
                why = "its links run over different extents"
            if why is None and spelled != text:
                why = f"wired otherwise: the graph's chain reads {spelled}"
            params, problem = _parameters(schema, links) if why is None else (None, "")
            why = why or problem or None
            if why is not None:
                near = near or f"at {links[0].name}: {why}"
                continue
            node = RankNode(links[0].index, op, "+".join(link.name for link in links), links[0].extent, params,
                            tuple(extra["distinct"]))
            candidates.append(Candidate(start, list(links), node, schema, library, rows))
            found += 1
        if not found:
            names = ", ".join(f"{library.name}:{row.name}" for row in rows)
            notes.append(f"fusion not taken: {names} (replaces {text}): "
                         + (near or "its chain occurs nowhere in this graph"))
    return candidates, notes
