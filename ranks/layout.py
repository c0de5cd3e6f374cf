"""Where every rank of a launch stands: TP inside a pipeline stage, stages one after another, nodes
holding consecutive ranks. Global rank r is TP rank r % tp of stage r // tp; node n holds ranks
[n * per_node, (n + 1) * per_node), so with one stage a node (TP 2 x PP 2 on two nodes) a stage
boundary is the one link that leaves a node. The last stage's TP rank 0 samples and answers."""

from dataclasses import dataclass

from radiance.engine.selection.shard import Shard
from radiance.engine.selection.stages import Stage


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int = 1
    nnodes: int = 1

    @classmethod
    def of(cls, config) -> "Layout":
        """The layout a Config asks for (it checked that the nodes share the ranks equally)."""
        return cls(config.tp, config.pp, config.nnodes)

    @property
    def world(self) -> int:
        return self.tp * self.pp

    @property
    def per_node(self) -> int:
        return self.world // self.nnodes

    @property
    def answering(self) -> int:
        """The rank that writes each step's tokens: TP rank 0 of the last stage."""
        return (self.pp - 1) * self.tp

    def shard(self, rank: int) -> Shard:
        return Shard(rank % self.tp, self.tp)

    def stage(self, rank: int) -> Stage:
        return Stage(rank // self.tp, self.pp)

    def node(self, rank: int) -> int:
        return rank // self.per_node

    def ranks_of(self, node: int) -> range:
        return range(node * self.per_node, (node + 1) * self.per_node)

    def stage_ranks(self, stage: int) -> range:
        return range(stage * self.tp, (stage + 1) * self.tp)

    def previous(self, rank: int) -> int | None:
        """The rank this one receives from (the same TP rank of the stage before), if any."""
        return rank - self.tp if rank >= self.tp else None

    def next(self, rank: int) -> int | None:
        """The rank this one sends to (the same TP rank of the stage after), if any."""
        return rank + self.tp if rank + self.tp < self.world else None
