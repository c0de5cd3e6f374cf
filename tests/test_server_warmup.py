"""The server's warm-up (radiance/serving/warmup.py) on the tiny synthetic model, one rank in this
process: it runs steps, leaves nothing behind (no sequence, no KV block, no step in flight), and the
first real request after it gets the tokens a fresh engine gives."""

from radiance.generation.sequence import SamplingParams
from radiance.serving.warmup import WARMUP_TOKENS, warm_up

from test_server_inprocess import make_engine


def greedy(engine, prompt: list[int]) -> list[int]:
    sequence = engine.add(prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    while not sequence.finished:
        engine.step()
    engine.settle()
    return sequence.output_ids


def test_warm_up_runs_both_requests_and_leaves_the_engine_as_it_found_it(tiny_model):
    engine, ranks = make_engine(tiny_model)
    try:
        free = sorted(engine.blocks.free_blocks)
        steps, seconds = warm_up(engine)
        # a prefill and WARMUP_TOKENS - 1 decodes each, at the least (run ahead may add a settling step)
        assert steps >= 2 * WARMUP_TOKENS and seconds > 0
        assert not engine.scheduler.has_work and engine.in_flight is None
        assert sorted(engine.blocks.free_blocks) == free
    finally:
        ranks.close()


def test_the_first_request_after_warm_up_gets_a_fresh_engines_tokens(tiny_model):
    prompt = [5, 17, 3, 99, 42]
    fresh, fresh_ranks = make_engine(tiny_model)
    try:
        expected = greedy(fresh, prompt)
    finally:
        fresh_ranks.close()
    warmed, warmed_ranks = make_engine(tiny_model)
    try:
        warm_up(warmed)
        assert greedy(warmed, prompt) == expected
    finally:
        warmed_ranks.close()


def test_warm_up_fits_a_context_smaller_than_its_prompt(tiny_model):
    engine, ranks = make_engine(tiny_model, max_context=5)
    try:
        steps, _ = warm_up(engine)
        assert steps >= 2 and not engine.scheduler.has_work
    finally:
        ranks.close()
