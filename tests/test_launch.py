"""radiance-launch end to end on host ranks: real processes, real zmq, real shared memory. Tensor
parallel ranks agree with one rank; what a user meets on the way in and out."""

import copy
import json
import subprocess
import sys

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

    path = tmp_path_factory.mktemp("wide") / "wide.rad"
    convert_synthetic(path, "llama", WIDE_SHAPE, seed=3)
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


@pytest.fixture(scope="module")
def one_rank():
    """generate(model, 1, PROMPTS), launched once per model for the module (TP 2 and TP 4 compare
    against the same TP 1 run); each caller gets its own copy."""
    runs = {}

    def outputs(model):
        if model not in runs:
            runs[model] = generate(model, 1, PROMPTS)
        return copy.deepcopy(runs[model])
    return outputs


@pytest.mark.parametrize("tp", [2, 4])
def test_synthetic_tensor_parallel_agrees_with_one_rank(wide_model, one_rank, tp):
    one, one_logits = one_rank(wide_model)
    many, many_logits = generate(wide_model, tp, PROMPTS)
    assert many == one
    assert len(many_logits) == len(one_logits)
    for a, b in zip(one_logits, many_logits):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def one_kv_head(tmp_path_factory):
    """4 query heads and 1 KV head (Gemma 3 270M's layout): the KV head is on every rank at TP 2 and 4."""
    from radiance.convert.api import convert_synthetic

    path = tmp_path_factory.mktemp("mqa") / "mqa.rad"
    convert_synthetic(path, "llama", {**WIDE_SHAPE, "heads": 4, "kv_heads": 1}, seed=4)
    return path


@pytest.mark.parametrize("tp", [2, 4])
def test_replicated_kv_heads_agree_with_one_rank(one_kv_head, one_rank, tp):
    one, one_logits = one_rank(one_kv_head)
    many, many_logits = generate(one_kv_head, tp, PROMPTS)
    assert many == one
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
    # Found once, before any rank starts (each rank would print it, then the launch once more).
    (line,) = [line for line in stderr.splitlines() if "error" in line]
    assert line.startswith("radiance-launch: error: "), stderr
    assert "N is 3 parts, which the 2 ranks neither divide nor replicate evenly" in line  # 3 KV heads
    assert "[rank " not in stderr and "Traceback" not in stderr


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


PARENT = """
import atexit, json, sys
from radiance.tools.launch import main

def loaded():
    # a kernel plugin imported here (the loader's module names), or a native library mapped here:
    # libr4d's r4d-*.so, or a shared object of a home's kernels/ folder
    modules = sorted(name for name in sys.modules if name.startswith("_radiance_plugin_kernels_"))
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if line.rstrip().endswith(".so")}
    native = sorted(path for path in paths if path.rsplit("/", 1)[-1].startswith("r4d-") or "/kernels/" in path)
    print("parent loaded:", json.dumps(modules + native), file=sys.stderr)

atexit.register(loaded)
main()
"""


def test_the_launching_process_loads_no_kernel_library(tiny_model):
    """radiance-launch checks the model and its split over the ranks before spawning them from the
    architecture plugins alone: the kernel libraries (libr4d's native build among them) are loaded by
    the ranks, never by the parent."""
    result = subprocess.run([sys.executable, "-c", PARENT, "--tp", "2", "--model", str(tiny_model), "--prompt", "hi",
                             "--max-tokens", "2", "--temperature", "0"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), "no completion"
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("parent loaded: ")]
    assert json.loads(line.removeprefix("parent loaded: ")) == [], line
