"""Run ahead (generation/engine.py, feed.py): the engine plans step n + 1 while the ranks run step
n, the token step n samples feeding step n + 1 on the ranks. Its tokens are the synchronous path's,
for greedy and seeded sampling, batched, with an EOS token, a stop string, max_tokens, a request
admitted mid-run, chunked prefill and preemption, in process and through a launch at TP 2 on host
ranks; a sequence that ends costs at most one discarded step (none for a length limit), and
nothing is left in flight or in the KV cache."""

import numpy as np
import pytest

from radiance.config import Config
from radiance.generation.engine import Engine
from radiance.generation.feed import Feed, FeedError
from radiance.generation.sequence import SamplingParams
from radiance.launch import engine_over, open_ranks

PROMPTS = [list(range(1, 40)), [5, 9, 200, 17], list(range(100, 123)), [7, 3, 250, 41, 8, 19]]
STREAMED = [60, 61, 62, 63, 64]


def params(eos: bool):
    """Greedy to max_tokens; seeded sampling to max_tokens; seeded, ending at the EOS token when
    `eos`; greedy, admitted after three steps."""
    return [SamplingParams(max_tokens=7, temperature=0, ignore_eos=True),
            SamplingParams(max_tokens=9, temperature=0.9, top_k=20, top_p=0.9, seed=11, ignore_eos=True),
            SamplingParams(max_tokens=12, temperature=1.1, seed=12, ignore_eos=not eos),
            SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)]


def drive(engine, eos=None, stop=None):
    """The workload through `engine`: three requests batched, one streamed to `stop` among them
    (its text pieces kept as a client gets them), one admitted mid-run. Returns what came out and
    how many samples the scheduler planned for each sequence."""
    engine.text.stop_ids = set() if eos is None else {eos}
    planned, schedule = {}, engine.scheduler.schedule

    def counted():
        plan = schedule()
        for chunk in plan.chunks:
            if chunk.samples:
                planned[chunk.sequence.id] = planned.get(chunk.sequence.id, 0) + 1
        return plan

    engine.scheduler.schedule = counted
    preempted, preempt = [], engine.scheduler._preempt
    engine.scheduler._preempt = lambda: (preempted.append(1), preempt())[1]
    sampling = params(eos is not None)
    sequences = [engine.add(prompt, sampling[i]) for i, prompt in enumerate(PROMPTS[:3])]
    streamed = SamplingParams(max_tokens=14, temperature=1.0, seed=21, ignore_eos=True, stop=(stop,) if stop else ())
    pieces = []
    for number, piece in enumerate(engine.stream(STREAMED, streamed)):
        pieces.append(piece)
        if number == 2:  # admitted while the others run
            sequences.append(engine.add(PROMPTS[3], sampling[3]))
    while engine.scheduler.has_work:
        engine.step()
    assert engine.in_flight is None, "a step was left on the ranks"
    assert len(engine.blocks.free_blocks) == engine.blocks.num_blocks, "a KV block was not given back"
    return {"outputs": [s.output_ids for s in sequences], "reasons": [s.finish_reason for s in sequences],
            "pieces": pieces, "planned": [planned[s.id] for s in sequences], "streamed": planned[sequences[2].id + 1],  # the next id: stream's
            "preempted": len(preempted)}


def compare(sync_engine, ahead_engine):
    """Choose the EOS token and the stop string from a first synchronous run, then run the workload
    both ways; the run-ahead results, checked against the synchronous ones."""
    first = drive(sync_engine)
    eos_output = first["outputs"][2]
    eos = next(token for i, token in enumerate(eos_output) if i >= 3 and token not in eos_output[:i])
    text = "".join(first["pieces"])
    start = next(i for i in range(3, len(text) - 1) if text[i:i + 2] not in text[:i + 1])
    stop = text[start:start + 2]
    sync = drive(sync_engine, eos, stop)
    ahead = drive(ahead_engine, eos, stop)
    assert sync["reasons"] == ["length", "length", "stop", "length"]
    assert len(sync["outputs"][2]) < 12, "the EOS token did not end its sequence"
    assert "".join(sync["pieces"]) == text[:text.index(stop)]
    assert ahead["outputs"] == sync["outputs"] and ahead["reasons"] == sync["reasons"]
    assert ahead["pieces"] == sync["pieces"]  # what a client is streamed, piece by piece
    # exactness: one sample planned per token synchronously; run ahead, a length limit costs no
    # discarded step, an EOS or a stop string at most one
    assert sync["planned"] == [len(output) for output in sync["outputs"]]
    lengths = [len(output) for output in ahead["outputs"]]
    assert [ahead["planned"][i] for i in (0, 1, 3)] == [lengths[i] for i in (0, 1, 3)]
    assert lengths[2] <= ahead["planned"][2] <= lengths[2] + 1
    assert sync["streamed"] <= ahead["streamed"] <= sync["streamed"] + 1
    return sync, ahead


def config(model, **overrides):
    return Config(model=str(model), radiance_home="", kernels="libref", accept_reference=True, progress=False,
                  **{"max_seqs": 4, **overrides})


CONFIGS = {"batched": {}, "chunked prefill": {"max_step_tokens": 7},
           "preempting": {"num_blocks": 6, "block_size": 8}}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_in_process_run_ahead_gives_the_synchronous_tokens(tiny_model, name):
    with open_ranks(config(tiny_model, **CONFIGS[name], run_ahead=False)) as sync_ranks, \
            open_ranks(config(tiny_model, **CONFIGS[name], run_ahead=True)) as ahead_ranks:
        sync_engine, ahead_engine = engine_over(sync_ranks), engine_over(ahead_ranks)
        assert not sync_engine.run_ahead and ahead_engine.run_ahead
        sync, ahead = compare(sync_engine, ahead_engine)
    if name == "preempting":
        assert sync["preempted"] and ahead["preempted"]


def test_an_ending_at_eos_or_a_stop_string_leaves_no_step_on_the_ranks(tiny_model):
    """The step planned past the end is collected (and dropped) once nothing else runs, so the next
    engine over the same ranks takes its own tokens, not that step's."""
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    sampled = SamplingParams(max_tokens=12, temperature=1.0, seed=21)
    with open_ranks(config(tiny_model, run_ahead=True)) as ranks:
        sync_engine = Engine(ranks.config, ranks.execute, ranks.text)
        sync_engine.text.stop_ids = set()
        whole = "".join(sync_engine.stream(STREAMED, sampled))
        expected = "".join(sync_engine.stream(PROMPTS[1], greedy))
        sequence = sync_engine.add(STREAMED, sampled)
        while sync_engine.scheduler.has_work:
            sync_engine.step()
        eos = next(token for i, token in enumerate(sequence.output_ids) if i >= 3 and token not in sequence.output_ids[:i])
        for ending in ("eos", "stop"):
            engine = engine_over(ranks)
            engine.text.stop_ids = {eos} if ending == "eos" else set()
            stop = () if ending == "eos" else (whole[4:6],)
            cut = "".join(engine.stream(STREAMED, SamplingParams(max_tokens=12, temperature=1.0, seed=21, stop=stop)))
            assert len(cut) < len(whole) and whole.startswith(cut)
            assert engine.in_flight is None
            engine.text.stop_ids = set()
            assert "".join(engine_over(ranks).stream(PROMPTS[1], greedy)) == expected


def test_the_context_limit_costs_no_discarded_step(tiny_model):
    with open_ranks(config(tiny_model, max_context=24, run_ahead=True)) as ranks:
        engine, steps = engine_over(ranks), []
        submit = engine.submit
        engine.submit = lambda arrays, feed: (steps.append(len(arrays["step.ids"])), submit(arrays, feed))[1]
        sequence = engine.add(list(range(20)), SamplingParams(max_tokens=100, temperature=0, ignore_eos=True))
        while engine.scheduler.has_work:
            engine.step()
    assert sequence.finish_reason == "length" and sequence.num_tokens == 24 and sequence.pending == 0
    assert steps == [20, 1, 1, 1]  # the prefill and three decodes: none past the context


def test_without_the_feed_the_tokens_differ(tiny_model, monkeypatch):
    """The workload is one a missing feed would fail: the placeholder ids change the tokens."""
    monkeypatch.setattr(Feed, "apply", lambda self, ids, tokens: None)
    with open_ranks(config(tiny_model, run_ahead=False)) as sync_ranks, \
            open_ranks(config(tiny_model, run_ahead=True)) as ahead_ranks:
        assert drive(engine_over(ahead_ranks))["outputs"] != drive(engine_over(sync_ranks))["outputs"]


def test_a_launch_at_tp_2_runs_ahead_to_the_synchronous_tokens(tiny_model):
    """One launch of two host ranks: the same ranks driven synchronously and run ahead (each rank
    feeds its own sampled tokens: rank 1 never sees rank 0's)."""
    with open_ranks(Config(model=str(tiny_model), progress=False, max_seqs=4, tp=2, run_ahead=True)) as ranks:
        sync_engine = Engine(ranks.config, ranks.execute, ranks.text)
        sync, ahead = compare(sync_engine, engine_over(ranks))
    assert ahead["outputs"] == sync["outputs"]


def _smollm2_outputs(engine):
    """Greedy and seeded sampling batched, 16 tokens each."""
    sequences = [engine.add(engine.text.encode("The capital of France is"), SamplingParams(max_tokens=16, temperature=0)),
                 engine.add(engine.text.encode("Once upon a time"), SamplingParams(max_tokens=16, temperature=0.8,
                                                                                   seed=5))]
    while engine.scheduler.has_work:
        engine.step()
    assert all(len(s.output_ids) >= 4 for s in sequences)
    return [s.output_ids for s in sequences]


def test_smollm2_runs_ahead_to_the_synchronous_tokens(smollm2):
    """The real model, in process, and launched at TP 3 (one launch, driven both ways)."""
    results = {}
    for run_ahead in (False, True):
        with open_ranks(Config(model=str(smollm2), progress=False, max_seqs=2, run_ahead=run_ahead)) as ranks:
            results[run_ahead] = _smollm2_outputs(engine_over(ranks))
    assert results[True] == results[False]
    with open_ranks(Config(model=str(smollm2), progress=False, max_seqs=2, tp=3, run_ahead=True)) as ranks:
        assert _smollm2_outputs(engine_over(ranks)) == _smollm2_outputs(Engine(ranks.config, ranks.execute, ranks.text))


def test_a_step_that_fails_running_ahead_raises_where_its_tokens_were_due(tiny_model):
    with open_ranks(config(tiny_model, run_ahead=True)) as ranks:
        engine = engine_over(ranks)
        run, calls = ranks.worker.executor.run, []

        def failing(*args):
            calls.append(1)
            if len(calls) == 4:
                raise RuntimeError("the fourth step failed")
            return run(*args)

        ranks.worker.executor.run = failing
        engine.add(PROMPTS[0], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
        with pytest.raises(RuntimeError, match="the fourth step failed"):
            for _ in range(10):
                engine.step()
        with pytest.raises(RuntimeError, match="the fourth step failed"):
            ranks.collect()  # and every call after it


def test_a_feed_that_does_not_fit_is_one_line(tiny_model):
    with open_ranks(config(tiny_model, run_ahead=False)) as ranks:
        engine, plans = Engine(ranks.config, ranks.execute, ranks.text), []
        submit = engine.submit
        engine.submit = lambda arrays, feed: (plans.append(arrays), submit(arrays, feed))[1]
        engine.add(PROMPTS[1], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
        while engine.scheduler.has_work:
            engine.step()
        prefill = plans[-1]  # 4 tokens of 1 sequence, after a step that sampled 1 token
        for feed, message in [(Feed.of([(4, 0)]), "a feed writes id 4 of a step of 4 tokens"),
                              (Feed.of([(3, 1)]), "a feed reads token 1 of a step that sampled 1")]:
            ranks.submit(prefill, feed)
            with pytest.raises(FeedError) as error:
                ranks.collect()
            assert str(error.value) == message


def test_plan_arrays_leave_a_placeholder_where_the_feed_writes():
    from radiance.generation.kv_blocks import BlockManager
    from radiance.generation.scheduler import Chunk, StepPlan
    from radiance.generation.sequence import Sequence
    from radiance.generation.step_plan import plan_arrays

    blocks = BlockManager(8, 4)
    first, second = (Sequence(i, [3, 4, 5], SamplingParams(max_tokens=8, seed=i)) for i in (1, 2))
    for sequence in (first, second):
        sequence.output_ids, sequence.pending, sequence.num_computed = [9], 1, 4
        blocks.allocate(sequence, 5)
    arrays, feed = plan_arrays(StepPlan([Chunk(first, 4, 1), Chunk(second, 4, 1)]), blocks, 2, {first: 1, second: 0})
    assert list(arrays["step.ids"]) == [0, 0]
    assert list(feed.targets) == [0, 1] and list(feed.sources) == [1, 0]
    assert feed.runs() == [(0, 1, 1), (1, 0, 1)]
    assert [list(row) for row in arrays["step.rng"]] == [[1, 2], [2, 2]]  # the pending sample counted
    assert Feed.of([(0, 0), (1, 1), (2, 2), (4, 3)]).runs() == [(0, 0, 3), (4, 3, 1)]
    with pytest.raises(RuntimeError, match="sequence 1: 1 ids planned that no step in flight samples"):
        plan_arrays(StepPlan([Chunk(first, 4, 1)]), blocks, 2, None)
    ids, tokens = np.zeros(3, np.int32), np.array([7, 8], np.int32)
    Feed.of([(2, 0), (0, 1)]).apply(ids, tokens)
    assert list(ids) == [8, 0, 7]


def _streamed(model, run_ahead: bool, request: dict) -> list:
    """What a client is streamed by the in-process server (real HTTP): each chunk's text and finish."""
    import json

    import httpx

    from radiance.serving.options import ServeSettings
    from radiance.serving.server import Server
    from test_server_inprocess import Running
    from test_server_support import wait_for

    server = Server(str(model), ServeSettings(port=0)).start()
    ranks = open_ranks(config(model, run_ahead=run_ahead))
    running = Running(server, engine_over(ranks), ranks)
    try:
        body = {"model": "tiny", "prompt": "hello there", "max_tokens": 16, "temperature": 1.0, "seed": 3,
                "stream": True, **request}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            lines = [line[5:].strip() for line in response.iter_lines() if line.startswith("data:")]
        assert lines[-1] == "[DONE]"
        chunks = [json.loads(line)["choices"][0] for line in lines[:-1]]
        # the last chunk goes out from inside the engine thread's step; the step still in flight is
        # collected on its next turn (Engine.settle), so the client may be answered a moment before
        engine = running.loop.engine
        assert wait_for(lambda: engine.in_flight is None, timeout=10) and engine.blocks.usage == 0
        return [(chunk["text"], chunk["finish_reason"]) for chunk in chunks]
    finally:
        running.stop()


def test_the_server_streams_the_same_chunks_running_ahead(tiny_model):
    whole = _streamed(tiny_model, False, {})
    text = "".join(piece for piece, _ in whole)
    start = next(i for i in range(3, len(text) - 1) if text[i:i + 2] not in text[:i + 1])
    for request in ({}, {"stop": [text[start:start + 2]]}):
        synchronous = _streamed(tiny_model, False, request)
        assert _streamed(tiny_model, True, request) == synchronous
    assert synchronous[-1][1] == "stop" and "".join(piece for piece, _ in synchronous) == text[:start]


def test_the_command_line_runs_ahead_to_the_same_completion(tiny_model):
    import subprocess
    import sys

    outputs = {}
    for flag in ("--run-ahead", "--no-run-ahead"):
        result = subprocess.run([sys.executable, "-m", "radiance.tools.generate", "--model", str(tiny_model), "--prompt",
                                 "hello", "--temperature", "0.9", "--seed", "4", "--max-tokens", "12", flag],
                                capture_output=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        outputs[flag] = result.stdout
    assert outputs["--run-ahead"] == outputs["--no-run-ahead"] and len(outputs["--run-ahead"]) > 4


def test_run_ahead_by_default_only_where_it_was_measured_to_help(tiny_model):
    from radiance.launch import ranks as module

    def default(card, **given):
        return module.run_ahead_default(Config(model=str(tiny_model), **given), card=card)

    assert default(tp=1, launched=True, card=False)
    # launched host ranks however many cores (no slower with as many ranks as cores, measured)
    assert default(tp=2, card=False) and default(tp=3, card=False) and default(tp=8, card=False)
    assert not default(tp=1, card=False)  # in process
    assert not default(tp=2, card=True)  # not measured on a card yet
    assert default(tp=3, run_ahead=True, card=True)
    assert not default(tp=2, run_ahead=False, card=False)
    assert default(tp=1, pp=2, card=False)  # stages on one host: in parts, both stages busy (measured)
    assert not module.run_ahead_default(Config(model=str(tiny_model), pp=2), card=False, same_host=False)
    assert not default(tp=1, micro_batches=2, launched=True, card=False)  # parts without stages: not measured
