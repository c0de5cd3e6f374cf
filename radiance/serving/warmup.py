"""Before the server says it is ready: one short request run greedy and one sampled, to the end,
so the first client's request does not pay for what every engine's first steps do once (kernels
compiled or read from the cache, launch plans built for the prefill and decode shapes, a card's
step graphs captured, the sampler's kernels loaded). vLLM and llama.cpp's server warm up alike."""

import time

from radiance.generation.engine import Engine
from radiance.generation.sequence import SamplingParams

WARMUP_PROMPT = "Warming up."
WARMUP_TOKENS = 4


def warm_up(engine: Engine) -> tuple[int, float]:
    """Runs the two requests through `engine` (nothing of theirs is left: their KV blocks freed, no
    step in flight); the steps run and the seconds taken."""
    start, steps = time.perf_counter(), 0
    # within the smallest context a server may be given (a prompt and its tokens must fit it)
    room = max(1, engine.config.max_context - WARMUP_TOKENS)
    prompt = (engine.text.encode(WARMUP_PROMPT) or [0])[:room]
    for temperature in (0.0, 0.7):
        sequence = engine.add(prompt, SamplingParams(max_tokens=WARMUP_TOKENS, temperature=temperature, seed=0,
                                                     ignore_eos=True))
        while not sequence.finished:
            engine.step()
            steps += 1
    engine.settle()
    return steps, time.perf_counter() - start
