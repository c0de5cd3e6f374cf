"""Micro-batches (generation/micro_batches.py): a step's plan cut into parts of near equal tokens,
a cut inside a sequence making it a chunked prefill; the tokens of a batch (greedy and seeded
sampling, prefills cut into chunks, decode) are the uncut step's, in process and over pipeline
stages of host ranks at TP 1 x PP 2 and TP 2 x PP 2, each step run in as many parts as stages,
synchronously and run ahead (the first stage fed through the token pipe)."""

import numpy as np
import pytest

from radiance import abi
from radiance.config import Config, ConfigError
from radiance.generation.micro_batches import MIN_PART_TOKENS, gather_tokens, split_plan
from radiance.generation.sequence import SamplingParams
from radiance.launch import engine_over, open_ranks

# The f32 cache: a part's GEMMs run another band than the uncut step's (M <= 16: the int16 GEMV), which
# moves a k or v value by ~1e-7, nothing a token sees; rounded into the host's default f16 cache, such a
# move is now and then a whole f16 step (~5e-4), enough to flip a seeded sample (2 of the 8 here).
# What these tests check is the cutting, not that rounding (tests/test_smollm2.py checks the f16 cache).
EXACT_CACHE = dict(kv_cache_dtype="f32")
PROMPTS = [list(range(40, 67)), [5, 9, 200, 17], list(range(100, 111)), [7, 3, 250, 41, 8, 19]] * 2
SEQUENCES = len(PROMPTS)  # 8: a decode step of them is cut into two parts of MIN_PART_TOKENS


def sampling():
    """Greedy, seeded sampling with top-k and top-p, seeded at temperature 1.1, greedy again; then
    the same with other seeds and lengths."""
    return [SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
            SamplingParams(max_tokens=8, temperature=0.9, top_k=20, top_p=0.9, seed=11, ignore_eos=True),
            SamplingParams(max_tokens=7, temperature=1.1, seed=12, ignore_eos=True),
            SamplingParams(max_tokens=5, temperature=0, ignore_eos=True),
            SamplingParams(max_tokens=7, temperature=0.8, seed=13, ignore_eos=True),
            SamplingParams(max_tokens=6, temperature=0.9, top_k=5, seed=14, ignore_eos=True),
            SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
            SamplingParams(max_tokens=6, temperature=1.0, top_p=0.8, seed=15, ignore_eos=True)]


def plan_of(lengths, starts):
    """A step's arrays over sequences of `lengths` tokens this step from positions `starts`."""
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens, seqs = int(bounds[-1]), len(lengths)
    arrays = {name: np.zeros(abi.STEP_INPUTS[name].shape(tokens, seqs, 4), abi.STEP_INPUTS[name].dtype)
              for name in abi.PLANNED}
    arrays[abi.RAD_STEP_IDS][:] = np.arange(tokens) + 1000
    arrays[abi.RAD_STEP_POSITIONS][:] = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)])
    arrays[abi.RAD_STEP_CU_SEQLENS][:] = bounds
    arrays[abi.RAD_STEP_CONTEXT_LENS][:] = np.add(starts, lengths)
    arrays[abi.RAD_STEP_LAST_INDEX][:] = bounds[1:] - 1
    arrays[abi.RAD_STEP_RNG][:, 0] = np.arange(seqs) + 7
    return arrays


def test_a_plan_cut_in_parts_of_near_equal_tokens():
    arrays = plan_of([5, 1, 4], [0, 9, 3])  # a prefill, a decode, a prefill's second chunk: 10 tokens
    parts = split_plan(arrays, 3, least=1)
    assert [len(p.arrays[abi.RAD_STEP_IDS]) for p in parts] == [3, 3, 4]
    first, second, third = parts
    assert first.sequences.tolist() == [0] and first.kept.tolist() == [False]  # positions 0-2 of sequence 0
    assert first.arrays[abi.RAD_STEP_CONTEXT_LENS].tolist() == [3]
    assert second.sequences.tolist() == [0, 1] and second.kept.tolist() == [True, True]
    assert second.arrays[abi.RAD_STEP_CU_SEQLENS].tolist() == [0, 2, 3]
    assert second.arrays[abi.RAD_STEP_POSITIONS].tolist() == [3, 4, 9]
    assert second.arrays[abi.RAD_STEP_CONTEXT_LENS].tolist() == [5, 10]
    assert second.arrays[abi.RAD_STEP_LAST_INDEX].tolist() == [1, 2]
    assert third.sequences.tolist() == [2] and third.kept.tolist() == [True]
    assert third.arrays[abi.RAD_STEP_CONTEXT_LENS].tolist() == [7] and third.arrays[abi.RAD_STEP_RNG][0, 0] == 9
    assert np.concatenate([p.arrays[abi.RAD_STEP_IDS] for p in parts]).tolist() == arrays[abi.RAD_STEP_IDS].tolist()
    got = gather_tokens(parts, [np.array([1]), np.array([2, 3]), np.array([4])], 3)
    assert got.tolist() == [2, 3, 4]
    assert len(split_plan(plan_of([1, 1], [4, 6]), 5, least=1)) == 2  # never more parts than tokens
    assert MIN_PART_TOKENS == 4  # by default, none of fewer tokens than that (a part streams the weights again)
    assert [len(split_plan(plan_of([1] * seqs, [3] * seqs), 2)) for seqs in (4, 7, 8, 16)] == [1, 1, 2, 2]


def generate(config: Config) -> tuple[list, list]:
    """The batch's tokens, and the parts each step was cut into."""
    parts = []
    with open_ranks(config) as ranks:
        engine = engine_over(ranks)
        sequences = [engine.add(prompt, params) for prompt, params in zip(PROMPTS, sampling())]
        while engine.scheduler.has_work:
            engine.step()
            parts.append(ranks.step_stats()["parts"])
    return [sequence.output_ids for sequence in sequences], parts


@pytest.mark.parametrize("run_ahead", [False, True])
def test_parts_in_process_give_the_uncut_tokens(tiny_model, run_ahead):
    """Prefills cut in three (max_step_tokens 24: chunks of the scheduler's too), decode steps of
    eight in two; run ahead, each part's ids fed from the step before's tokens on the host."""
    fields = dict(model=str(tiny_model), progress=False, max_seqs=SEQUENCES, max_step_tokens=24, **EXACT_CACHE)
    expected, uncut = generate(Config(**fields))
    got, parts = generate(Config(**fields, micro_batches=3, run_ahead=run_ahead))
    assert got == expected
    assert set(uncut) == {1} and parts[0] == 3 and 2 in parts, parts  # a decode step of 8 in two


@pytest.fixture(scope="module")
def smollm2_shape(tmp_path_factory):
    """SmolLM2's widths (hidden 576, ffn 1536, vocab 49152) with 8 heads and 4 KV heads so TP 2
    splits them (its own 9 and 3 do not), 4 layers, seeded random weights."""
    from radiance.convert.api import convert_synthetic

    path = tmp_path_factory.mktemp("smollm2_shape") / "model.rad"
    convert_synthetic(path, "llama", dict(hidden=576, layers=4, heads=8, kv_heads=4, ffn=1536, vocab=49152,
                                          context=512), seed=5)
    return path


@pytest.mark.parametrize("tp, run_ahead, micro_batches", [(1, False, 0), (2, False, 0), (1, True, 0), (2, True, 3)])
def test_pipeline_stages_in_parts_give_the_unpipelined_tokens(smollm2_shape, tp, run_ahead, micro_batches):
    """Run ahead, the first stage's ids come from the last stage's token pipe, part by part (three
    parts: more messages in flight than the activations' pipe has slots)."""
    fields = dict(model=str(smollm2_shape), progress=False, max_seqs=SEQUENCES, max_step_tokens=32, **EXACT_CACHE)
    expected, _ = generate(Config(**fields))
    got, parts = generate(Config(**fields, tp=tp, pp=2, run_ahead=run_ahead, micro_batches=micro_batches))
    assert got == expected
    count = micro_batches or 2  # as many parts as stages by default; a decode step of 8 in two
    assert parts[0] == count and 2 in parts, parts


def test_parts_refuse_what_cannot_be_cut(tiny_model):
    with pytest.raises(ConfigError, match="--micro-batches must be at least 0, not -1"):
        Config(model=str(tiny_model), micro_batches=-1)
    with pytest.raises(ConfigError, match="--draft-model: not with --micro-batches 2"):
        Config(model=str(tiny_model), micro_batches=2, draft_model=str(tiny_model))
