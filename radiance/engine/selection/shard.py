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

    def part(self, extent: int, what: str, parts: int = 0) -> tuple[int, int]:
        """[start, stop) of this rank's share of `extent`: divided evenly, or, as `parts` equal parts
        (rad_arch.h), never cut inside a part, each part replicated where the ranks outnumber them."""
        if parts:
            if extent % parts:
                raise ShardError(f"{what} is {extent}, not {parts} equal parts")
            size = extent // parts
            if parts < self.world and self.world % parts == 0:  # replicated: rank r takes part r * parts / world
                part = self.rank * parts // self.world
                return part * size, (part + 1) * size
            if parts % self.world:
                raise ShardError(f"{what} is {parts} parts, which the {self.world} ranks neither divide nor "
                                 f"replicate evenly")
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


def split_keys(split: str) -> list[tuple[str, int]]:
    """A node's split: (parameter, parts) for each of its names, "N/4" being N in 4 parts (0: none)."""
    keys = []
    for entry in split.split():
        key, _, parts = entry.partition("/")
        if parts and not (parts.isdigit() and int(parts) > 0):
            raise ShardError(f"split '{entry}': the parts after '/' must be a positive count")
        keys.append((key, int(parts or 0)))
    return keys


def shard_nodes(graph: RadGraphDecl, shard: Shard) -> list[RankNode]:
    nodes = []
    for index, node in enumerate(graph.nodes):
        params = dict(node.params)
        for key, parts in split_keys(node.split):
            start, stop = shard.part(params[key], f"node '{node.name}': {key}", parts)
            params[key] = stop - start
        nodes.append(RankNode(index, node.op, node.name, node.extent, params, tuple(node.operands)))
    return nodes


def shard_buffers(graph: RadGraphDecl, shard: Shard) -> dict:
    buffers = {}
    for buffer in graph.buffers:
        cols = buffer.cols
        if buffer.split:
            start, stop = shard.part(cols, f"buffer '{buffer.name}' columns", buffer.parts)
            cols = stop - start
        buffers[buffer.name] = RankBuffer(buffer.name, buffer.dtype, buffer.extent, cols)
    return buffers


def weight_cut(split: int, rows: int, cols: int, shard: Shard, name: str, parts: int = 0):
    """(axis, start, stop) of this rank's slice of a weight, or None when it is whole on every rank."""
    if split == RAD_SPLIT_NONE or shard.world == 1:
        return None
    if split == RAD_SPLIT_ROWS:
        cut = (0, *shard.part(rows, f"weight '{name}' rows", parts))
        return None if cut[1:] == (0, rows) else cut
    if split == RAD_SPLIT_COLS:
        cut = (1, *shard.part(cols, f"weight '{name}' columns", parts))
        return None if cut[1:] == (0, cols) else cut
    raise ShardError(f"weight '{name}': unknown split {split}")


def check_split(graph: RadGraphDecl, weights: dict, world: int) -> None:
    """ShardError naming the first node, buffer or weight that `world` ranks cannot split: what
    every rank would find, found once (a launcher checks it before it starts any). `weights`: the
    model's RadWeightInfo by name."""
    shard = Shard(0, world)
    shard_nodes(graph, shard)
    shard_buffers(graph, shard)
    for decl in graph.weights:
        info = weights[decl.source or decl.name]
        weight_cut(decl.split, info.rows, info.cols, shard, decl.name)


def elide_collectives(nodes: list[RankNode]) -> list[RankNode]:
    """At world 1 a collective moves nothing: an all_reduce goes, and an all_gather's output is its
    input: the part x is renamed y throughout (so y holds the step's values for whoever reads it
    after the step), or, where one part feeds two gathers, the nodes after each read x where they
    read y. Every rank of one does it (ranks/worker.py), on a card and on the host: the residual
    add and the next norm then meet, and a library's fused add_rmsnorm row serves them in one
    launch where it has one (libr4d's host row does)."""
    gathered = [node.operands[0] for node in nodes if node.op == "all_gather"]
    # a part gathered once is renamed to its gathered buffer throughout, so what reads the gathered
    # buffer after the step (a draft's logits, read_buffer) finds it written; one gathered twice
    # (two outputs of one part) is read where the outputs were, after each gather
    renamed = {node.operands[0]: node.operands[1] for node in nodes
               if node.op == "all_gather" and gathered.count(node.operands[0]) == 1}
    alias, kept = dict(renamed), []
    for node in nodes:
        if node.op == "all_reduce":
            continue
        if node.op == "all_gather":
            if node.operands[0] not in renamed:
                alias[node.operands[1]] = alias.get(node.operands[0], node.operands[0])
            continue
        if alias:
            node = replace(node, operands=tuple(alias.get(name, name) for name in node.operands))
        kept.append(node)
    return kept
