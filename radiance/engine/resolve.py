"""Every node of a rank's graph resolved to a row per band: resolved once per distinct (op,
geometry), so the thirty identical q projections of a model share one resolution and one init."""

import hashlib
from dataclasses import dataclass

from radiance.abi import RAD_EXTENT_TOKENS, RadOpSchema

from .registry import Registry
from .selection import Resolution, SelectionError, describe_resolution, resolve
from .shard import RankNode


@dataclass
class ResolvedNode:
    node: RankNode
    schema: RadOpSchema
    resolution: Resolution


def resolve_graph(nodes: list[RankNode], registry: Registry, facts: dict, domain: int, max_tokens: int,
                  max_seqs: int, accept_reference: bool = False) -> list[ResolvedNode]:
    resolutions: dict = {}  # (op, extent, geometry) -> Resolution, shared by every node alike

    def resolve_node(node: RankNode) -> ResolvedNode:
        entry = registry.ops.get(node.op)
        if entry is None:
            raise SelectionError(f"node '{node.name}': no loaded library declares op '{node.op}'")
        key = (node.op, node.extent, tuple(sorted(node.params.items())))
        if key not in resolutions:
            max_extent = max_tokens if node.extent == RAD_EXTENT_TOKENS else max_seqs
            try:
                resolutions[key] = resolve(node.op, entry.schema, registry.rows_for(node.op), node.params, facts,
                                           domain, max_extent, accept_reference)
            except SelectionError as error:
                raise SelectionError(f"node '{node.name}': {error}") from None
        return ResolvedNode(node, entry.schema, resolutions[key])

    resolved = []
    for node in nodes:
        if node.unfused:
            try:
                resolved.append(resolve_node(node))
            except SelectionError:  # no fused row serves every band: run the chain it stands for
                resolved += [resolve_node(link) for link in node.unfused]
        else:
            resolved.append(resolve_node(node))
    return resolved


def unique_resolutions(resolved: list[ResolvedNode]) -> list[Resolution]:
    return list({id(r.resolution): r.resolution for r in resolved}.values())


def selection_report(resolved: list[ResolvedNode]) -> list[str]:
    """--debug-selection: each distinct resolution once, with the nodes it serves."""
    lines = []
    for resolution in unique_resolutions(resolved):
        users = [r.node.name for r in resolved if r.resolution is resolution]
        shown = ", ".join(users[:3]) + (f" and {len(users) - 3} more" if len(users) > 3 else "")
        lines.append(f"[{shown}]")
        lines += ["  " + line for line in describe_resolution(resolution)]
    return lines


def graph_lines(resolved: list[ResolvedNode]) -> list[str]:
    """What every rank must agree on before a step runs: each node's op, bands and winners."""
    return [f"{item.node.name}|{item.node.op}|[{band.lo}, {band.hi}]|{band.row.plugin.name}:{band.row.name}"
            for item in resolved for band in item.resolution.bands]


def graph_digest(resolved: list[ResolvedNode]) -> str:
    return hashlib.sha256("\n".join(graph_lines(resolved)).encode()).hexdigest()
