"""libr4d's chained host all_reduce (all_reduce_host_r4dchain) wins selection where the engine
launches chained rows with their chain records (device.chain == 1: host ranks by default), and
all_reduce_host serves where it does not (--no-chain, or a fact no rank measured); launched TP 2
gives the same tokens either way."""

import pytest

from radiance.abi import RAD_DOMAIN_HOST
from radiance.config import Config
from radiance.engine.loading.registry import Registry
from radiance.engine.selection.bands import resolve
from radiance.generation.sequence import SamplingParams
from radiance.launch import engine_over, open_ranks


@pytest.mark.parametrize("facts, winner", [
    ({"device.p2p": 0, "device.chain": 1}, "all_reduce_host_r4dchain"),
    ({"device.p2p": 0, "device.chain": 0}, "all_reduce_host"),
    ({"device.p2p": 0}, "all_reduce_host"),  # not measured: a constraint on it does not hold
])
def test_the_chained_twin_wins_where_the_engine_chains(facts, winner):
    registry = Registry(radiance_home="", kernels="libr4d")
    try:
        schema = registry.ops["all_reduce"].schema
        resolution = resolve("all_reduce", schema, registry.rows_for("all_reduce"), {"n": 64, "dtype": "f32"}, facts,
                             RAD_DOMAIN_HOST, 256)
    finally:
        registry.close()
    assert [band.row.name for band in resolution.bands] == [winner]
    if winner == "all_reduce_host":
        losers = dict((row.name, why) for row, why in resolution.bands[0].losers)
        assert losers["all_reduce_host_r4dchain"].startswith("device.chain == 1"), losers


def test_launched_host_ranks_run_the_chained_all_reduce_unless_told_not_to(tiny_model):
    results = {}
    for chain in (True, False):
        config = Config(model=str(tiny_model), radiance_home="", progress=False, tp=2, chain=chain)
        with open_ranks(config) as ranks:
            engine = engine_over(ranks)
            sequences = [engine.add(engine.text.encode(prompt), SamplingParams(max_tokens=4, temperature=0,
                                                                               ignore_eos=True))
                         for prompt in ("hello there", "1 2 3")]
            while engine.scheduler.has_work:
                engine.step()
            rows = {line.split("|")[3] for line in ranks.lines if line.split("|")[1] == "all_reduce"}
            results[chain] = [s.output_ids for s in sequences]
        assert rows == {"libr4d:all_reduce_host_r4dchain" if chain else "libr4d:all_reduce_host"}, rows
    assert results[True] == results[False]
