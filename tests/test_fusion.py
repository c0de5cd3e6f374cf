"""A row whose `replaces` names the exact chain is run in the chain's place; one that is only close
fuses nothing; where no fused row serves a band, the chain runs as declared."""

from radiance.abi import RAD_DOMAIN_HOST, RAD_EXTENT_TOKENS
from radiance.engine.fusion import available_rules, fuse
from radiance.engine.registry import Registry
from radiance.engine.resolve import resolve_graph
from radiance.engine.shard import RankNode


def chain(i=0):
    return [RankNode(i, "all_reduce", "ar", RAD_EXTENT_TOKENS, {"n": 8, "dtype": "f32"}, ("t",)),
            RankNode(i + 1, "add", "res", RAD_EXTENT_TOKENS, {"n": 8, "dtype": "f32"}, ("h", "t", "h")),
            RankNode(i + 2, "rmsnorm", "norm", RAD_EXTENT_TOKENS, {"n": 8, "eps": 1e-5, "dtype": "f32"},
                     ("h", "norm.w", "x"))]


FUSED = """
ROWS = [row("fused", "all_reduce_add_rmsnorm", {constraint}replaces={replaces!r}),
        row("reduce", "all_reduce"), row("plus", "add"), row("norm", "rmsnorm")]
SCHEMAS = []
"""


def registry_with(home, replaces, constraint=""):
    home.kernel("fuser", FUSED.format(replaces=replaces, constraint=constraint))
    return Registry(str(home.root), kernels="fuser,libref")


def test_exact_replaces_fuses_the_chain_binding_its_operands(home):
    registry = registry_with(home, "all_reduce+add+rmsnorm")
    (node,) = fuse(chain(), available_rules(registry))
    assert (node.op, node.operands, node.params) == (
        "all_reduce_add_rmsnorm", ("t", "h", "norm.w", "x"), {"n": 8, "eps": 1e-5, "dtype": "f32"})
    resolved = resolve_graph([node], registry, {}, RAD_DOMAIN_HOST, 16, 1, accept_reference=True)
    assert [r.resolution.bands[0].row.name for r in resolved] == ["fused"]


def test_a_row_that_is_only_close_fuses_nothing(home):
    registry = registry_with(home, "all_reduce+add")
    registry.hierarchy = [library for library in registry.hierarchy if library.name == "fuser"]
    assert [node.op for node in fuse(chain(), available_rules(registry))] == ["all_reduce", "add", "rmsnorm"]


def test_a_chain_wired_otherwise_is_not_fused(home):
    registry = registry_with(home, "all_reduce+add+rmsnorm")
    nodes = chain()
    nodes[1] = RankNode(1, "add", "res", RAD_EXTENT_TOKENS, {"n": 8, "dtype": "f32"}, ("h", "other", "h"))
    assert [node.op for node in fuse(nodes, available_rules(registry))] == ["all_reduce", "add", "rmsnorm"]


def test_without_a_fused_row_for_every_band_the_chain_runs(home):
    registry = registry_with(home, "all_reduce+add+rmsnorm", constraint='RAD_CLE("M", 4), ')
    fused = fuse(chain(), available_rules(registry))
    assert [node.op for node in fused] == ["all_reduce_add_rmsnorm"]
    resolved = resolve_graph(fused, registry, {}, RAD_DOMAIN_HOST, 16, 1, accept_reference=False)
    assert [(r.node.op, r.resolution.bands[0].row.name) for r in resolved] == [
        ("all_reduce", "reduce"), ("add", "plus"), ("rmsnorm", "norm")]
