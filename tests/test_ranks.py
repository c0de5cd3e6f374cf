"""One interface for ranks (launch/ranks.py): one rank in process and launched rank processes give
the same tokens, graph digest and lines through the same calls; open_ranks alone chooses; the CLI,
the server and the benches reach ranks only through the interface."""

import ast
from pathlib import Path

import pytest

from radiance.config import Config
from radiance.generation.sequence import SamplingParams
from radiance.launch import engine_over, open_ranks
from radiance.launch.in_process import InProcessRanks
from radiance.launch.launched import LaunchedRanks

ROOT = Path(__file__).resolve().parent.parent


def _tokens(ranks, prompts):
    engine = engine_over(ranks)
    sequences = [engine.add(engine.text.encode(p), SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
                 for p in prompts]
    stats = []
    while engine.scheduler.has_work:
        engine.step()
        stats.append(ranks.step_stats())
    return [s.output_ids for s in sequences], stats


def test_in_process_and_launched_ranks_agree_through_one_interface(tiny_model):
    prompts = ["hello there", "1 2 3"]
    options = dict(model=str(tiny_model), radiance_home="", kernels="libref", accept_reference=True,
                   progress=False, max_seqs=2)
    results = {}
    for launched in (False, True):
        with open_ranks(Config(**options, launched=launched, profile=True)) as ranks:
            assert isinstance(ranks, LaunchedRanks if launched else InProcessRanks)
            assert ranks.world == 1 and ranks.digest and ranks.lines
            # by default: launched host ranks, however many cores; not in process
            assert ranks.run_ahead is launched
            tokens, stats = _tokens(ranks, prompts)
            assert {"compute", "collectives", "waited", "gate_holds", "gate_hold_s", "ops"} <= set(stats[-1])
            ops = stats[-1]["ops"]  # launched: through the results ring as one array named by the ops
            assert "embedding" in ops and all(isinstance(s, float) and s >= 0 for s in ops.values()), ops
            assert list(ranks.last_result["tokens"]) == [tokens[0][-1], tokens[1][-1]]
            results[launched] = (tokens, ranks.digest, ranks.lines, tuple(ranks.step_limits))
    assert results[True] == results[False]


def test_more_than_one_rank_is_always_launched(tiny_model):
    with pytest.raises(ValueError, match="--tp must be at least 1, not 0"):
        Config(model=str(tiny_model), tp=0)
    assert Config(model=str(tiny_model), tp=2).launched is False  # yet open_ranks launches: TP > 1 has no other way


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield ("." * node.level) + (node.module or "")


BEHIND_THE_INTERFACE = ("radiance.ranks.worker", "radiance.launch.coordinator", "radiance.launch.handshake",
                        "radiance.launch.in_process", "radiance.launch.launched")


@pytest.mark.parametrize("folder", ["radiance/tools", "radiance/serving", "bench"])
def test_the_cli_the_server_and_the_benches_reach_ranks_only_through_the_interface(folder):
    for path in sorted((ROOT / folder).glob("*.py")):
        bad = [name for name in _imports(path) if name in BEHIND_THE_INTERFACE]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}: use radiance.launch.open_ranks"


def test_the_plans_ring_holds_the_largest_plan_an_engine_makes(tiny_model):
    """A step with every sequence and the whole token budget: its record fits plan_bytes."""
    from types import SimpleNamespace

    import numpy as np

    from radiance.generation import plan_record
    from radiance.generation.engine import Engine
    from radiance.generation.feed import Feed
    from radiance.launch.step_rings import plan_bytes

    config = Config(model=str(tiny_model), max_seqs=4, max_step_tokens=16)
    plans = []

    def execute(arrays):
        plans.append(arrays)
        return np.zeros(len(arrays["step.context_lens"]), np.int32)

    engine = Engine(config, execute, SimpleNamespace(stop_ids=set()))
    for i in range(4):
        engine.add([1 + i] * 4, SamplingParams(max_tokens=1))
    engine.step()
    arrays = plans[0]
    assert (len(arrays["step.ids"]), len(arrays["step.context_lens"])) == (16, 4)  # the largest shape
    fed = Feed.of([(i, i) for i in range(4)])  # run ahead: a token of every sequence fed
    assert len(plan_record.encode(arrays, fed)) <= plan_bytes(config)
