"""A rank's share of a split extent (rad_arch.h): divided evenly, or as whole parts (heads), each
part replicated where the ranks outnumber the parts, as vLLM replicates KV heads."""

import pytest

from radiance.abi import RAD_SPLIT_COLS, RAD_SPLIT_ROWS
from radiance.engine.selection.shard import Shard, ShardError, split_keys, weight_cut


def shares(extent, world, parts=0):
    return [Shard(rank, world).part(extent, "x", parts) for rank in range(world)]


def test_even_division_with_or_without_parts():
    assert shares(12, 3) == [(0, 4), (4, 8), (8, 12)]
    assert shares(768, 3, parts=3) == [(0, 256), (256, 512), (512, 768)]
    assert shares(1024, 2, parts=4) == [(0, 512), (512, 1024)]


def test_fewer_parts_than_ranks_are_replicated():
    assert shares(256, 2, parts=1) == [(0, 256), (0, 256)]
    assert shares(256, 4, parts=1) == [(0, 256)] * 4
    assert shares(256, 4, parts=2) == [(0, 128), (0, 128), (128, 256), (128, 256)]


def test_parts_the_ranks_neither_divide_nor_replicate_are_refused():
    with pytest.raises(ShardError, match=r"^x is 3 parts, which the 2 ranks neither divide nor replicate evenly$"):
        Shard(0, 2).part(384, "x", parts=3)
    with pytest.raises(ShardError, match=r"^x is 9, not divisible by the 2 ranks$"):
        Shard(0, 2).part(9, "x")
    with pytest.raises(ShardError, match=r"^x is 100, not 3 equal parts$"):
        Shard(0, 3).part(100, "x", parts=3)


def test_split_keys_and_weight_cuts():
    assert split_keys("q_heads kv_heads/1") == [("q_heads", 0), ("kv_heads", 1)]
    with pytest.raises(ShardError, match="positive count"):
        split_keys("N/x")
    assert weight_cut(RAD_SPLIT_ROWS, 256, 640, Shard(1, 2), "k", parts=1) is None  # whole on every rank
    assert weight_cut(RAD_SPLIT_ROWS, 1024, 640, Shard(1, 2), "q", parts=4) == (0, 512, 1024)
    assert weight_cut(RAD_SPLIT_COLS, 640, 1024, Shard(3, 4), "o") == (1, 768, 1024)


def test_one_rank_elides_its_collectives_and_keeps_the_gathered_buffers_written():
    """At world 1: the all_reduce goes; a part gathered once is renamed to its gathered buffer
    everywhere (what reads `logits` after the step finds the step's logits); a part gathered into
    two buffers is read in their place after each gather."""
    from radiance.engine.selection.shard import RankNode, elide_collectives

    def node(index, op, *operands):
        return RankNode(index, op, f"n{index}", 0, {}, operands)

    nodes = [node(0, "gemm", "x", "w", "t"), node(1, "all_reduce", "t"), node(2, "add", "h", "t", "h"),
             node(3, "gemm", "h", "head", "logits.part"), node(4, "all_gather", "logits.part", "logits"),
             node(5, "sample", "logits", "tokens"), node(6, "all_gather", "p", "a"), node(7, "all_gather", "p", "b"),
             node(8, "add", "a", "b", "c")]
    kept = elide_collectives(nodes)
    assert [(n.op, n.operands) for n in kept] == [
        ("gemm", ("x", "w", "t")), ("add", ("h", "t", "h")), ("gemm", ("h", "head", "logits")),
        ("sample", ("logits", "tokens")), ("add", ("p", "p", "c"))]
