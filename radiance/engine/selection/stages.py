"""The pipeline cut (`--pp S`): the engine splits the architecture's declared graph into S stages,
the graph and its TP plan staying the architecture's data (it never names a stage).

A cut may stand between two nodes where exactly one activation buffer is live: written before the
cut and read after it before anything after it writes it (the residual stream between two layers,
say; a layer's KV cache is touched by one node only, so it never is). Of those places the S - 1
cuts are taken where the stages hold the nearest to equal shares of the weights (each stage holds
the weights its nodes read: pipeline parallelism is for a model too large for one node's memory).
At every cut the stage before ends with a `send` of that buffer and the stage after begins with a
`recv` of it (docs/OPS.md); each TP rank sends to the same TP rank of the next stage, its own share
of the buffer where the buffer is split."""

from dataclasses import dataclass

from radiance.abi import NAMES, RAD_OPD_IN, RAD_OPD_INOUT, RAD_OPD_OUT, RAD_OPD_WEIGHT, RadGraphDecl

from .shard import RankBuffer, RankNode, ShardError

READS, WRITES = (RAD_OPD_IN, RAD_OPD_INOUT), (RAD_OPD_OUT, RAD_OPD_INOUT)


@dataclass(frozen=True)
class Stage:
    index: int  # 0 takes the step's ids, count - 1 samples
    count: int

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1


@dataclass(frozen=True)
class Cut:
    """One stage's nodes, [start, stop) of the declared graph, and the buffers at its ends."""
    start: int
    stop: int
    receives: str | None  # the buffer the stage before sends (None for the first stage)
    sends: str | None  # the buffer this stage sends on (None for the last)


def _roles(graph: RadGraphDecl, schemas: dict) -> list[list[tuple[str, int]]]:
    """(operand name, role) of every node, the roles from the op's schema."""
    return [list(zip(node.operands, (spec.role for spec in schemas[node.op].operands))) for node in graph.nodes]


def live_buffers(graph: RadGraphDecl, schemas: dict) -> list[set]:
    """live[k]: the buffers live between node k - 1 and node k (written before, read after before
    any write); len(nodes) + 1 entries."""
    buffers = {buffer.name for buffer in graph.buffers}
    roles = _roles(graph, schemas)
    written, live = set(), [set()]
    # After k: the buffers whose next touch at or after k is a read.
    read_next: list[set] = [set() for _ in range(len(roles) + 1)]
    pending: set = set()
    for k in range(len(roles) - 1, -1, -1):
        reads = {name for name, role in roles[k] if name in buffers and role in READS}
        writes = {name for name, role in roles[k] if name in buffers and role in WRITES}
        pending = (pending - writes) | reads  # a node reads its operands before it writes any
        read_next[k] = set(pending)
    for k in range(1, len(roles) + 1):
        written |= {name for name, role in roles[k - 1] if name in buffers and role in WRITES}
        live.append(written & read_next[k] if k < len(roles) else set())
    return live


def node_costs(graph: RadGraphDecl, schemas: dict, weights: dict) -> list[int]:
    """The weight elements each node reads (RadWeightInfo rows x cols, a tied weight counted at
    each of its uses)."""
    sources = {decl.name: decl.source or decl.name for decl in graph.weights}
    costs = []
    for operands in _roles(graph, schemas):
        cost = 0
        for name, role in operands:
            info = weights.get(sources.get(name, name))
            if role == RAD_OPD_WEIGHT and info is not None:
                cost += int(info.rows) * int(info.cols)
        costs.append(cost)
    return costs


def cut_stages(graph: RadGraphDecl, schemas: dict, weights: dict, count: int) -> list[Cut]:
    """The `count` stages' cuts, or ShardError naming how many places the graph has to cut."""
    nodes = len(graph.nodes)
    if count == 1:
        return [Cut(0, nodes, None, None)]
    live = live_buffers(graph, schemas)
    places = [k for k in range(1, nodes) if len(live[k]) == 1]
    if len(places) < count - 1:
        raise ShardError(f"--pp {count}: the graph has {len(places)} places where one buffer alone is live "
                         f"between two nodes, and {count} stages need {count - 1}")
    prefix = [0]
    for cost in node_costs(graph, schemas, weights):
        prefix.append(prefix[-1] + cost)
    total, chosen = prefix[-1], []
    for j in range(1, count):
        left = count - 1 - j  # cuts still to place after this one
        usable = [k for k in places if (not chosen or k > chosen[-1]) and
                  sum(1 for later in places if later > k) >= left]
        chosen.append(min(usable, key=lambda k: (abs(prefix[k] - total * j / count), k)))
    edges = [0, *chosen, nodes]
    cuts = []
    for index in range(count):
        start, stop = edges[index], edges[index + 1]
        receives = next(iter(live[start])) if index > 0 else None
        sends = next(iter(live[stop])) if index < count - 1 else None
        cuts.append(Cut(start, stop, receives, sends))
    return cuts


def stage_nodes(nodes: list[RankNode], buffers: dict[str, RankBuffer], cut: Cut, stage: Stage) -> list[RankNode]:
    """One rank's nodes of its stage (`nodes`: the rank's share of the whole graph, shard_nodes),
    a recv before them and a send after them where the stage has a neighbour."""
    def boundary(op: str, name: str) -> RankNode:
        buffer = buffers[name]
        params = {"n": buffer.cols, "dtype": NAMES[buffer.dtype]}
        return RankNode(-1, op, f"stage{stage.index}.{op}", buffer.extent, params, (name,))

    kept = nodes[cut.start:cut.stop]
    if cut.receives is not None:
        kept = [boundary("recv", cut.receives), *kept]
    if cut.sends is not None:
        kept = [*kept, boundary("send", cut.sends)]
    return kept


def used_buffers(nodes: list[RankNode], buffers: dict) -> dict:
    """The buffers a stage's nodes touch: a stage allocates only those (its layers' KV caches)."""
    names = {name for node in nodes for name in node.operands}
    return {name: buffer for name, buffer in buffers.items() if name in names}
