"""Generation at TP 1 in process: scheduling, chunked prefill, batching independence, preemption,
stop conditions. The oracle library serves, so the numbers are the reference's."""

import pytest

from radiance.config import Config
from radiance.generation.engine import Engine
from radiance.generation.sequence import SamplingParams
from radiance.generation.text import TextCodec
from radiance.ranks.worker import Worker


def make_engine(model, **overrides):
    config = Config(model=str(model), radiance_home="", kernels="libref", accept_reference=True, progress=False,
                    **overrides)
    worker = Worker(config).build()
    container = worker.model.container
    text = TextCodec(container.tokenizer, container.chat_template, worker.model.hyper)
    return Engine(config, worker.execute, text), worker


def run_all(engine, prompts, params):
    sequences = [engine.add(prompt, params(i)) for i, prompt in enumerate(prompts)]
    while engine.scheduler.has_work:
        engine.step()
    return [sequence.output_ids for sequence in sequences]


PROMPTS = [list(range(1, 40)), [5, 9, 200, 17], list(range(100, 123))]


def greedy(i):
    return SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def sampled(i):
    return SamplingParams(max_tokens=6, temperature=0.9, top_k=20, top_p=0.9, seed=1000 + i, ignore_eos=True)


@pytest.fixture(scope="module")
def alone(tiny_model):
    """Each prompt run by itself, whole prefill in one step: the outputs to match."""
    results = {}
    for kind, params in (("greedy", greedy), ("sampled", sampled)):
        outputs = []
        for i, prompt in enumerate(PROMPTS):
            engine, worker = make_engine(tiny_model)
            outputs.append(run_all(engine, [prompt], lambda _, i=i: params(i))[0])
            worker.close()
        results[kind] = outputs
    return results


@pytest.mark.parametrize("kind,params", [("greedy", greedy), ("sampled", sampled)])
def test_batched_outputs_equal_each_request_alone(tiny_model, alone, kind, params):
    engine, worker = make_engine(tiny_model, max_seqs=3)
    assert run_all(engine, PROMPTS, params) == alone[kind]
    assert all(len(output) == 6 for output in alone[kind])
    worker.close()


def test_chunked_prefill_equals_one_step_prefill(tiny_model, alone):
    engine, worker = make_engine(tiny_model, max_seqs=3, max_step_tokens=7)
    assert run_all(engine, PROMPTS, greedy) == alone["greedy"]
    worker.close()


def test_preemption_when_the_cache_is_full_keeps_outputs(tiny_model, alone):
    engine, worker = make_engine(tiny_model, max_seqs=3, num_blocks=4, block_size=16)
    assert run_all(engine, PROMPTS, sampled) == alone["sampled"]
    assert len(engine.blocks.free_blocks) == 4
    worker.close()


def test_sampling_depends_on_the_seed(tiny_model):
    engine, worker = make_engine(tiny_model)
    first = run_all(engine, [PROMPTS[0]], lambda i: SamplingParams(max_tokens=8, temperature=1.5, seed=1, ignore_eos=True))
    second = run_all(engine, [PROMPTS[0]], lambda i: SamplingParams(max_tokens=8, temperature=1.5, seed=2, ignore_eos=True))
    again = run_all(engine, [PROMPTS[0]], lambda i: SamplingParams(max_tokens=8, temperature=1.5, seed=1, ignore_eos=True))
    assert first == again and first != second
    worker.close()


def test_stream_stops_before_a_stop_string_and_frees_blocks(tiny_model):
    engine, worker = make_engine(tiny_model)
    prompt = engine.text.encode("hello")
    full = "".join(engine.stream(prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)))
    assert len(full) >= 4
    stop = full[2:4]
    cut = "".join(engine.stream(prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=(stop,))))
    assert cut == full[:full.index(stop)]
    assert len(engine.blocks.free_blocks) == engine.blocks.num_blocks
    worker.close()


def test_prompt_longer_than_the_context_is_refused(tiny_model):
    engine, worker = make_engine(tiny_model, max_context=32)
    with pytest.raises(ValueError, match="the prompt is 40 tokens, the context holds 32"):
        engine.add(list(range(40)), SamplingParams(max_tokens=1))
    worker.close()


def test_length_limit_at_the_context(tiny_model):
    engine, worker = make_engine(tiny_model, max_context=24)
    sequence = engine.add(list(range(20)), SamplingParams(max_tokens=100, temperature=0, ignore_eos=True))
    while engine.scheduler.has_work:
        engine.step()
    assert sequence.finish_reason == "length" and sequence.num_tokens == 24
    worker.close()
