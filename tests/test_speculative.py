"""Speculative decoding (--draft-model): the draft proposes through spechub's mtp_couple_propose, the
model verifies through mtp_couple_verify, both rows selected from the hierarchy like any other.
Greedy, the tokens are the model's own whatever the draft (itself: every draft kept, the KV caches
of both models right through admissions and catch-ups; another model: few kept); sampled, a draft
equal to the model is kept; what cannot be served is one line and a non-zero exit. The models are
small synthetic ones with an untied lm head (their greedy tokens vary); bench/speculative.py runs
SmolLM2."""

import subprocess

import pytest
from conftest import script

from radiance.config import Config, ConfigError
from radiance.convert.api import convert_synthetic
from radiance.generation.sequence import SamplingParams
from radiance.launch import engine_over, open_ranks

PROMPTS = ([1, 2, 3, 4, 5], [100, 50, 7], [9] * 12)
SHAPE = dict(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=320, context=256, tie_embeddings=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(the model, another of its vocabulary: a draft it mostly refuses, one of another vocabulary)."""
    folder = tmp_path_factory.mktemp("speculative")
    for name, seed, vocab in (("model", 7, 320), ("other", 9, 320), ("wide", 3, 400)):
        convert_synthetic(folder / f"{name}.rad", "llama", {**SHAPE, "vocab": vocab}, seed=seed)
    return folder / "model.rad", folder / "other.rad", folder / "wide.rad"


def generate(model, spechub_home, draft=None, params=None, k=4, max_seqs=2):
    config = Config(model=str(model), radiance_home=str(spechub_home), kernels="libr4d,spechub", accept_reference=True,
                    progress=False, draft_model=None if draft is None else str(draft), draft_tokens=k,
                    max_seqs=max_seqs)
    return decode(config, params, PROMPTS, lambda engine: draft is not None)


def decode(config, params, prompts, drafting):
    """Every prompt decoded to its end: (outputs, engine steps, (kept, drafted) where `drafting(engine)`)."""
    with open_ranks(config) as ranks:
        engine = engine_over(ranks)
        sequences = [engine.add(prompt, params(i)) for i, prompt in enumerate(prompts)]
        steps = 0
        while engine.scheduler.has_work:
            engine.step()
            steps += 1
        kept = (ranks.kept, ranks.drafted) if drafting(engine) else None
    return [sequence.output_ids for sequence in sequences], steps, kept


def greedy(i):
    return SamplingParams(max_tokens=(14, 10, 12)[i], temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def plain(models, spechub_home):
    return generate(models[0], spechub_home, params=greedy)


def test_greedy_with_the_model_as_its_own_draft_keeps_every_draft_and_gives_its_tokens(models, spechub_home, plain):
    """Three requests, two at a time: the third is admitted by a plain step while a round may have
    left the draft a position behind (it catches up first); a draft cache with a hole would lose
    the model's agreement from there on."""
    outputs, steps, (kept, drafted) = generate(models[0], spechub_home, draft=models[0], params=greedy)
    assert outputs == plain[0] and [len(o) for o in outputs] == [14, 10, 12] and len(set(outputs[0])) > 3
    assert kept >= 0.9 * drafted and drafted > 0
    assert steps < plain[1] / 2  # up to k + 1 tokens a round


def test_greedy_with_another_draft_still_gives_the_models_tokens(models, spechub_home, plain):
    outputs, _, (kept, drafted) = generate(models[0], spechub_home, draft=models[1], params=greedy, k=2)
    assert outputs == plain[0]
    assert kept < 0.5 * drafted


def test_sampled_with_the_model_as_its_own_draft(models, spechub_home):
    def sampled(i):
        return SamplingParams(max_tokens=10, temperature=0.8, seed=17 + i, ignore_eos=True)

    first = generate(models[0], spechub_home, draft=models[0], params=sampled, k=3)
    second = generate(models[0], spechub_home, draft=models[0], params=sampled, k=3)
    assert first[0] == second[0] and all(len(output) == 10 for output in first[0])  # reproducible from the seeds
    kept, drafted = first[2]
    assert kept >= 0.9 * drafted  # p and q agree: a draft is refused only where they differ


def test_top_k_and_top_p_are_refused_with_a_draft(models, spechub_home):
    config = Config(model=str(models[0]), radiance_home=str(spechub_home), kernels="libr4d,spechub",
                    accept_reference=True, progress=False, draft_model=str(models[0]))
    with open_ranks(config) as ranks:
        engine = engine_over(ranks)
        with pytest.raises(ValueError, match="top_k and top_p are not supported with it"):
            engine.add([1, 2, 3], SamplingParams(top_k=5))


def test_a_draft_of_another_vocabulary_is_refused(models, spechub_home):
    config = Config(model=str(models[0]), radiance_home=str(spechub_home), kernels="libr4d,spechub",
                    accept_reference=True, progress=False, draft_model=str(models[2]))
    with pytest.raises(ConfigError, match=f"--draft-model {models[2]}: a vocabulary of 400 tokens, the model's "
                                          "is 320"):
        open_ranks(config)


def test_a_draft_with_pipeline_stages_is_refused_naming_both_flags(models):
    # a verify step's logits come back from rank 0, and with stages only the last stage has them
    with pytest.raises(ConfigError, match="--draft-model: not with --pp 2"):
        Config(model=str(models[0]), pp=2, draft_model=str(models[1]))


def test_the_cli_speculates_and_says_what_is_missing_in_one_line(models, spechub_home, tmp_path):
    base = [script("radiance"), "--model", str(models[0]), "--draft-model", str(models[1]), "--prompt", "hi",
            "--max-tokens", "6", "--temperature", "0"]
    plain = subprocess.run(base[:3] + base[5:] + ["--radiance-home", str(spechub_home)], capture_output=True, text=True)
    done = subprocess.run(base + ["--radiance-home", str(spechub_home), "--kernels", "libr4d,spechub",
                                  "--debug-accept-reference-kernels"], capture_output=True, text=True)
    assert plain.returncode == 0 and done.returncode == 0, plain.stderr + done.stderr
    assert done.stdout == plain.stdout and len(done.stdout.strip()) > 0
    assert "speculative decoding:" in done.stderr and "mtp_couple_verify by spechub:spechub_ref_verify" in done.stderr
    missing = subprocess.run(base + ["--radiance-home", str(tmp_path)], capture_output=True, text=True)
    assert missing.returncode != 0
    (line,) = missing.stderr.strip().splitlines()
    assert line == ("radiance: error: --draft-model: no loaded kernel library declares op 'mtp_couple_propose' (the "
                    "speculative ops come from a kernel library such as plugins/spechub, built with cmake: docs/PLUGINS.md)")
