"""radiance-launch end to end on host ranks: real processes, real zmq, real shared memory. Tensor
parallel ranks agree with one rank; what a user meets on the way in and out."""

import numpy as np
import pytest

from radiance.config import Config
from radiance.generation.sequence import SamplingParams
from radiance.launch import engine_over, open_ranks

from launch_support import Launch, wait_gone

WIDE_SHAPE = dict(hidden=64, layers=2, heads=8, kv_heads=4, ffn=128, vocab=320, context=256)


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """Heads and KV heads divisible by 4: a model for TP 2 and TP 4."""
    from radiance.convert.api import convert_synthetic
    from radiance.convert.synthetic import LlamaShape

    path = tmp_path_factory.mktemp("wide") / "wide.rad"
    convert_synthetic(path, LlamaShape(**WIDE_SHAPE), seed=3)
    return path


def generate(model, tp, prompts, max_tokens=8, launched=True, **options):
    """Greedy tokens of each prompt, and the logits of every step rank 0 saw."""
    outputs, logits = [], []
    config = Config(model=str(model), progress=False, tp=tp, launched=launched, return_buffer="logits", **options)
    with open_ranks(config) as ranks:
        engine = engine_over(ranks)
        for prompt in prompts:
            sequence = engine.add(engine.text.encode(prompt), SamplingParams(max_tokens=max_tokens, temperature=0,
                                                                           ignore_eos=True))
            while not sequence.finished:
                engine.step()
                logits.append(np.array(ranks.last_result["logits"]))
            outputs.append(sequence.output_ids)
    return outputs, logits


PROMPTS = ["hello there", "the quick brown fox", "1 2 3 4"]


@pytest.mark.parametrize("tp", [2, 4])
def test_synthetic_tensor_parallel_agrees_with_one_rank(wide_model, tp):
    one, one_logits = generate(wide_model, 1, PROMPTS)
    many, many_logits = generate(wide_model, tp, PROMPTS)
    assert many == one
    assert len(many_logits) == len(one_logits)
    for a, b in zip(one_logits, many_logits):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_smollm2_tp3_gives_tp1_greedy_tokens(smollm2):
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    one, _ = generate(smollm2, 1, prompts, max_tokens=16)
    three, _ = generate(smollm2, 3, prompts, max_tokens=16)
    assert three == one


def test_prompt_through_the_command_line_and_its_logs(smollm2):
    launch = Launch("--tp", 3, "--model", smollm2, "--prompt", "The capital of France is", "--max-tokens", 4,
                    "--temperature", 0)
    code, stdout, stderr = launch.finish()
    assert code == 0, stderr
    assert stdout.strip().startswith("Paris")
    assert stderr.count("collectives use the _host twins") == 1
    assert stderr.count("starting 3 host ranks") == 1
    assert all(line.startswith(("[radiance]", "[rank ")) for line in stderr.splitlines() if line.strip())


def test_tp_that_does_not_divide_the_heads_is_a_clear_error(smollm2):
    launch = Launch("--tp", 2, "--model", smollm2, "--prompt", "hi")
    code, _, stderr = launch.finish()
    assert code == 1
    assert "radiance-launch: error: rank " in stderr
    assert "q_heads is 9, not divisible by the 2 ranks" in stderr
    assert "Traceback" not in stderr


PICKY = """
import os

def silu_mul(a):
    gate, up, y = (t.data for t in a.t)
    m = a.params["M"]
    y[:m] = gate[:m] / (1 + __import__("numpy").exp(-gate[:m])) * up[:m]
    return RAD_OK

def rad_plugin_open():
    # A library for some machines only: it declines the one rank 1 runs on.
    return RAD_E_UNSUPPORTED if os.environ.get("RADIANCE_RANK") == "1" else RAD_OK

SCHEMAS = []
ROWS = [row("picky_silu_mul", "silu_mul", launch=silu_mul)]
"""


def test_ranks_that_resolve_differently_are_refused_before_the_first_step(wide_model, home):
    home.kernel("picky", PICKY)
    launch = Launch("--tp", 2, "--model", wide_model, "--prompt", "hi", "--radiance-home", home.root,
                    "--kernels", "picky,libr4d")
    code, stdout, stderr = launch.finish()
    assert code == 1 and stdout == ""
    assert ("rank 1 resolved a different graph from rank 0's: node layers.0.ffn.silu_mul, op 'silu_mul' band "
            "[1, 256]: libr4d:r4d_silu_mul where rank 0 has picky:picky_silu_mul") in stderr
    assert wait_gone(launch) == []
