"""Fused rows. A row whose `replaces` names a chain of ops computes that chain in one launch; where
the graph holds that chain, wired as the fused op's rule says, the engine runs the fused op in
its place. `replaces` is compared byte for byte: a row that is only close fuses nothing. The rules
(which operand of which link each fused operand is) live here and in docs/OPS.md."""

from dataclasses import dataclass

from .registry import Registry
from .shard import RankNode


@dataclass(frozen=True)
class FusionRule:
    op: str  # the fused op
    chain: tuple[str, ...]
    operands: tuple[tuple[int, int], ...]  # per fused operand: (link, operand index in that link)
    same: tuple[tuple[tuple[int, int], tuple[int, int]], ...]  # operands that must be one buffer
    params: dict  # fused parameter -> (link, parameter)

    @property
    def replaces(self) -> str:
        return "+".join(self.chain)


RULES = [
    # all_reduce(x); add(a=h, b=x, y=h); rmsnorm(x=h, w, y)  ->  all_reduce_add_rmsnorm(x, residual=h, w, y)
    FusionRule("all_reduce_add_rmsnorm", ("all_reduce", "add", "rmsnorm"),
               operands=((0, 0), (1, 0), (2, 1), (2, 2)),
               same=(((1, 1), (0, 0)), ((1, 2), (1, 0)), ((2, 0), (1, 0))),
               params={"n": (1, "n"), "eps": (2, "eps"), "dtype": (1, "dtype")}),
]


def available_rules(registry: Registry) -> list[FusionRule]:
    """The rules some loaded row offers, by its exact `replaces`."""
    offered = {row.info.replaces for library in registry.hierarchy for row in library.rows if row.info.replaces}
    return [rule for rule in RULES if rule.replaces in offered and rule.op in registry.ops]


def _matches(rule: FusionRule, links: list[RankNode]) -> bool:
    if tuple(link.op for link in links) != rule.chain or len({link.extent for link in links}) != 1:
        return False
    return all(links[a[0]].operands[a[1]] == links[b[0]].operands[b[1]] for a, b in rule.same)


def fuse(nodes: list[RankNode], rules: list[FusionRule]) -> list[RankNode]:
    """The graph with every chain a rule matches replaced by its fused node, which keeps the
    chain in `unfused` so the engine can fall back where no fused row serves a band."""
    fused, i = [], 0
    while i < len(nodes):
        for rule in rules:
            links = nodes[i:i + len(rule.chain)]
            if len(links) == len(rule.chain) and _matches(rule, links):
                node = RankNode(links[0].index, rule.op, "+".join(link.name for link in links), links[0].extent,
                                {key: links[link].params[param] for key, (link, param) in rule.params.items()},
                                tuple(links[link].operands[index] for link, index in rule.operands))
                node.unfused = links
                fused.append(node)
                i += len(rule.chain)
                break
        else:
            fused.append(nodes[i])
            i += 1
    return fused
