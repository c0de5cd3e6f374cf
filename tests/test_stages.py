"""The pipeline cut and the placement, without launching: stages cut where one buffer alone is
live, the weights shared out, a recv and a send at every boundary; a single-process pair of
stages over a shared-memory pipe gives one stage's logits; Slurm's environment places a node."""

import threading

import numpy as np
import pytest

from radiance.config import Config, ConfigError
from radiance.engine.loading.model import open_model
from radiance.engine.loading.registry import Registry
from radiance.engine.selection.shard import ShardError
from radiance.engine.selection.stages import cut_stages, live_buffers, node_costs
from radiance.launch.placement import PlacementError, first_host, settle


def opened(model):
    registry = Registry(None, None)
    model = open_model(Config(model=str(model)), registry)
    return model, {op: entry.schema for op, entry in registry.ops.items()}


def test_cuts_stand_where_one_buffer_is_live_and_share_the_weights(smollm2):
    model, schemas = opened(smollm2)
    try:
        graph, live = model.graph, live_buffers(model.graph, schemas)
        costs = node_costs(graph, schemas, model.weights)
        for count in (2, 3, 4):
            cuts = cut_stages(graph, schemas, model.weights, count)
            assert cuts[0].start == 0 and cuts[-1].stop == len(graph.nodes)
            assert [c.stop for c in cuts[:-1]] == [c.start for c in cuts[1:]]
            for before, after in zip(cuts, cuts[1:]):
                assert live[after.start] == {before.sends} == {after.receives}
            shares = [sum(costs[c.start:c.stop]) for c in cuts]
            assert max(shares) < 1.25 * sum(shares) / count, shares  # near equal shares of the weights
        assert cuts[0].receives is None and cuts[-1].sends is None
    finally:
        model.close()


def test_more_stages_than_places_is_refused(tiny_model):
    model, schemas = opened(tiny_model)
    try:
        with pytest.raises(ShardError, match=r"--pp 200: the graph has \d+ places"):
            cut_stages(model.graph, schemas, model.weights, 200)
    finally:
        model.close()


def test_two_stages_in_one_process_give_one_stages_logits(tiny_model):
    """Stage 0 and stage 1 as two Workers over a real shared-memory pipe, stage 0 on a thread."""
    from radiance.collectives.pipe import ShmPipe
    from radiance.collectives.shm import new_run_id, unlink_run
    from radiance.engine.selection.shard import Shard
    from radiance.engine.selection.stages import Stage
    from radiance.ranks.worker import Worker

    config = Config(model=str(tiny_model), progress=False, return_buffer="logits")
    whole = Worker(config).build()
    run = new_run_id()
    receiving = ShmPipe.create(run, 1, 1 << 20)
    sending = ShmPipe.attach(run, 1)
    facts = {"device.p2p": 0, "device.same_host": 1}
    first = Worker(config, Shard(0, 1), stage=Stage(0, 2)).build(facts, pipes={"send": sending.peers})
    last = Worker(config, Shard(0, 1), stage=Stage(1, 2)).build(facts, pipes={"recv": receiving.peers})
    try:
        ids = np.array([72, 101, 108, 108, 111], np.int32)
        arrays = plan(whole, ids)
        thread = threading.Thread(target=first.execute, args=(plan(first, ids),))
        thread.start()
        got = last.execute(plan(last, ids))
        thread.join(60)
        expected = whole.execute(arrays)
        assert got.tolist() == expected.tolist()
        np.testing.assert_array_equal(last.executor.read_buffer("logits", 1), whole.executor.read_buffer("logits", 1))
        assert "send" in {launch.node.op for launch, _, _ in first.graph.issued()}
        assert "recv" in {launch.node.op for launch, _, _ in last.graph.issued()}
    finally:
        for worker in (whole, first, last):
            worker.close()
        sending.close()
        receiving.close()
        unlink_run(run)


def plan(worker, ids):
    """One prefill step of one sequence over `ids`, as generation/step_plan.py writes it."""
    from radiance import abi

    tokens, config = len(ids), worker.config
    arrays = {name: np.zeros(abi.STEP_INPUTS[name].shape(tokens, 1, config.max_blocks), abi.STEP_INPUTS[name].dtype)
              for name in abi.PLANNED}
    arrays[abi.RAD_STEP_IDS][:] = ids
    arrays[abi.RAD_STEP_POSITIONS][:] = np.arange(tokens)
    arrays[abi.RAD_STEP_SLOTS][:] = np.arange(tokens)
    arrays[abi.RAD_STEP_CU_SEQLENS][:] = [0, tokens]
    arrays[abi.RAD_STEP_CONTEXT_LENS][:] = [tokens]
    arrays[abi.RAD_STEP_LAST_INDEX][:] = [tokens - 1]
    arrays[abi.RAD_STEP_BLOCK_TABLES][0, :] = np.arange(config.max_blocks)
    arrays[abi.RAD_STEP_TOP_P][:] = 1.0
    return arrays


def test_slurm_places_the_node():
    environment = {"SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_STEP_NODELIST": "gpu[07-08],login3"}
    settled = settle({"nnodes": None, "node_rank": 0, "master_addr": None, "master_port": None}, environment)
    assert (settled["nnodes"], settled["node_rank"], settled["master_addr"], settled["master_port"]) == \
        (2, 1, "gpu07", 29500)
    given = settle({"nnodes": 3, "node_rank": 2, "master_addr": "a", "master_port": 4000}, environment)
    assert (given["nnodes"], given["node_rank"], given["master_addr"], given["master_port"]) == (3, 2, "a", 4000)
    assert first_host("node12") == "node12" and first_host("n[3,5-6]x") == "n3x"
    with pytest.raises(PlacementError, match="SLURM_NODEID is not set"):
        settle({"nnodes": None}, {"SLURM_NNODES": "2", "SLURM_STEP_NODELIST": "a"})


def test_bad_placements_name_their_flag(tiny_model):
    with pytest.raises(ConfigError, match="--keys is needed with --nnodes 2"):
        Config(model=str(tiny_model), tp=2, nnodes=2, master_addr="a")
    with pytest.raises(ConfigError, match="--nnodes 3: --tp 2 x --pp 1 = 2 ranks"):
        Config(model=str(tiny_model), tp=2, nnodes=3, master_addr="a", keys="k")
    with pytest.raises(ConfigError, match="--node-rank must be from 0 to 1, not 2"):
        Config(model=str(tiny_model), tp=2, nnodes=2, node_rank=2, master_addr="a", keys="k")
    with pytest.raises(ConfigError, match="--run-ahead: not with --pp 2 over --nnodes 2"):
        Config(model=str(tiny_model), pp=2, nnodes=2, master_addr="a", keys="k", run_ahead=True)
