"""The tensor-parallel plan applied from outside: the architecture declared whole extents and
which of them split; here one rank's share of every node, buffer and weight is worked out."""

from dataclasses import dataclass, replace

from radiance.abi import RAD_SPLIT_COLS, RAD_SPLIT_NONE, RAD_SPLIT_ROWS, RadGraphDecl


class ShardError(ValueError):
    """The graph cannot be split over this many ranks: names the node or weight and the extent."""


@dataclass(frozen=True)
class Shard:
    rank: int
    world: int

    def part(self, extent: int, what: str) -> tuple[int, int]:
        """[start, stop) of this rank's share of `extent`."""
        if extent % self.world:
            raise ShardError(f"{what} is {extent}, not divisible by the {self.world} ranks")
        size = extent // self.world
        return self.rank * size, (self.rank + 1) * size


@dataclass
class RankNode:
    index: int
    op: str
    name: str
    extent: int
    params: dict  # this rank's extents, every parameter but the ranged one
    operands: tuple


@dataclass
class RankBuffer:
    name: str
    dtype: int
    extent: int
    cols: int


def shard_nodes(graph: RadGraphDecl, shard: Shard) -> list[RankNode]:
    nodes = []
    for index, node in enumerate(graph.nodes):
        params = dict(node.params)
        for key in node.split.split():
            start, stop = shard.part(params[key], f"node '{node.name}': {key}")
            params[key] = stop - start
        nodes.append(RankNode(index, node.op, node.name, node.extent, params, tuple(node.operands)))
    return nodes


def shard_buffers(graph: RadGraphDecl, shard: Shard) -> dict:
    buffers = {}
    for buffer in graph.buffers:
        cols = buffer.cols
        if buffer.split:
            start, stop = shard.part(cols, f"buffer '{buffer.name}' columns")
            cols = stop - start
        buffers[buffer.name] = RankBuffer(buffer.name, buffer.dtype, buffer.extent, cols)
    return buffers


def weight_cut(split: int, rows: int, cols: int, shard: Shard, name: str):
    """(axis, start, stop) of this rank's slice of a weight, or None when it is replicated."""
    if split == RAD_SPLIT_NONE or shard.world == 1:
        return None
    if split == RAD_SPLIT_ROWS:
        return (0, *shard.part(rows, f"weight '{name}' rows"))
    if split == RAD_SPLIT_COLS:
        return (1, *shard.part(cols, f"weight '{name}' columns"))
    raise ShardError(f"weight '{name}': unknown split {split}")


def elide_collectives(nodes: list[RankNode]) -> list[RankNode]:
    """At world 1 a collective moves nothing: an all_reduce goes, and an all_gather's output is its
    input, so the nodes after it read x where they read y. (The card path elides them, having no
    peers to hand a row; the host path keeps them, its fused all_reduce+add+rmsnorm row being faster
    than the add and rmsnorm apart.)"""
    alias, kept = {}, []
    for node in nodes:
        if node.op == "all_reduce":
            continue
        if node.op == "all_gather":
            alias[node.operands[1]] = alias.get(node.operands[0], node.operands[0])
            continue
        if alias:
            node = replace(node, operands=tuple(alias.get(name, name) for name in node.operands))
        kept.append(node)
    return kept
