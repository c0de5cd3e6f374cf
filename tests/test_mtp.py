"""A model's own multi-token-prediction heads as the speculative draft (llama.mtp; launch/mtp.py,
generation/mtp.py): rad-convert --synthetic writes them (--mtp-layers 1), the family declares them
as an architecture of their own, and generation drafts with them through spechub's ops, unless
--no-mtp. Greedy, the tokens are the model's own; sampled, they are distributed as the model's; the
heads' KV cache and hidden state follow the model's step by step (their incremental logits are
those of one step over the whole sequence); TP 2 and radiance-launch alike. Small synthetic models
(an untied lm head, so greedy tokens vary)."""

import dataclasses
import subprocess
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import script
from test_speculative import decode

from radiance.abi import BY_NAME, NUMPY, RAD_HIDDEN, RAD_MTP_PREVIOUS, RAD_STEP_IDS
from radiance.config import Config, ConfigError
from radiance.convert.api import convert_synthetic
from radiance.convert.cli import main
from radiance.engine.loading.model import open_model
from radiance.engine.loading.registry import Registry
from radiance.generation.engine import Engine
from radiance.generation.kv_blocks import BlockManager
from radiance.generation.mtp import MtpEngine
from radiance.generation.sequence import SamplingParams, Sequence
from radiance.generation.speculative_plan import Entry, speculative_arrays
from radiance.launch import engine_over, open_ranks
from radiance.ranks.worker import Worker

PROMPTS = ([1, 2, 3, 4, 5], [100, 50, 7], [9] * 12)
SHAPE = dict(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=320, context=256, tie_embeddings=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(heads that draft what the model predicts from a token alone, random heads, no heads)."""
    folder = tmp_path_factory.mktemp("mtp")
    for name, extra in (("copied", {"mtp_layers": 1}), ("random", {"mtp_layers": 1, "mtp_random": 1}), ("none", {})):
        convert_synthetic(folder / f"{name}.rad", "llama", {**SHAPE, **extra}, seed=7)
    return {name: folder / f"{name}.rad" for name in ("copied", "random", "none")}


def config_of(model, home, **options):
    options = {"max_seqs": 2, **options}
    return Config(model=str(model), radiance_home=str(home), kernels="libr4d,spechub", accept_reference=True,
                  progress=False, **options)


def generate(config, params, prompts=PROMPTS):
    return decode(config, params, prompts, lambda engine: isinstance(engine, MtpEngine))


def greedy(i):
    return SamplingParams(max_tokens=(14, 10, 12)[i], temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def plain(models, spechub_home):
    return generate(config_of(models["copied"], spechub_home, mtp=False), greedy)


def test_the_synthetic_heads_and_their_architecture(models, spechub_home):
    registry = Registry(str(spechub_home), "libr4d")
    try:
        config = config_of(models["copied"], spechub_home)
        heads = open_model(config, registry, "llama.mtp")
        try:
            assert {"mtp.enorm", "mtp.hnorm", "mtp.e_proj", "mtp.h_proj", "mtp.norm", "layers.2.attn.q"} <= set(
                heads.weights)
            assert heads.container.encoding("mtp.e_proj").scheme == "plain"  # the copied head reads the token's
            e_proj = np.frombuffer(heads.container.plane("mtp.e_proj", "codes"), NUMPY[BY_NAME["bf16"]])
            np.testing.assert_array_equal(e_proj.astype(np.float32).reshape(SHAPE["hidden"], -1),  # embedding
                                          np.eye(SHAPE["hidden"], dtype=np.float32))
            assert [b.name for b in heads.graph.buffers if b.name == RAD_MTP_PREVIOUS] == [RAD_MTP_PREVIOUS]
            assert sum(node.op == "attention" for node in heads.graph.nodes) == 1  # one block, layer 2
            gathered = [node.operands[0] for node in heads.graph.nodes if node.op == "all_gather"]
            assert len(set(gathered)) == len(gathered)  # at TP 1 on a card, each all_gather's output is its input
            assert not {b.name for b in heads.graph.buffers} & set(heads.weights)  # no buffer hides a weight
        finally:
            heads.close()
        with pytest.raises(ValueError, match="llama.mtp: the model has no multi-token-prediction head"):
            open_model(config_of(models["none"], spechub_home), registry, "llama.mtp")
    finally:
        registry.close()


def test_greedy_with_the_heads_gives_the_models_tokens_and_keeps_drafts(models, spechub_home, plain):
    """Three requests, two at a time: the third is admitted by a plain step, after which the heads
    catch up over its prompt."""
    outputs, steps, (kept, drafted) = generate(config_of(models["copied"], spechub_home, draft_tokens=2), greedy)
    assert outputs == plain[0] and [len(o) for o in outputs] == [14, 10, 12] and len(set(outputs[0])) > 3
    assert drafted > 0 and kept >= 0.15 * drafted  # the copied head: measured 25% at k = 2
    assert steps < plain[1]


def test_random_heads_are_rarely_kept_and_change_no_token(models, spechub_home, plain):
    outputs, _, (kept, drafted) = generate(config_of(models["random"], spechub_home, draft_tokens=2), greedy)
    assert outputs == plain[0] and drafted > 0 and kept < 0.1 * drafted


def test_no_mtp_and_a_model_without_heads_decode_plainly(models, spechub_home):
    for config in (config_of(models["copied"], spechub_home, mtp=False), config_of(models["none"], spechub_home)):
        with open_ranks(config) as ranks:
            assert type(engine_over(ranks)) is Engine


def test_without_the_ops_the_heads_are_left_out_saying_so(models, tmp_path, capfd):
    config = Config(model=str(models["copied"]), radiance_home=str(tmp_path), progress=False)
    with open_ranks(config) as ranks:
        assert type(engine_over(ranks)) is Engine
    assert "carries MTP heads, but no loaded kernel library declares op 'mtp_couple_propose'" in capfd.readouterr().err


def test_heads_only_reference_rows_could_serve_decode_plainly_unless_mtp_asks(models, spechub_home, capfd):
    # on the host spechub's propose/verify rows are reference rows: without the debug flag they may
    # not serve, so the discovered heads are left out saying why, and a --mtp that named them stops
    config = Config(model=str(models["copied"]), radiance_home=str(spechub_home), kernels="libr4d,spechub",
                    progress=False, device="host")
    with open_ranks(config) as ranks:
        assert type(engine_over(ranks)) is Engine
    assert "carries MTP heads, but they cannot draft here: op 'mtp_couple_propose'" in capfd.readouterr().err
    with pytest.raises(ConfigError, match="--debug-accept-reference-kernels"):
        open_ranks(dataclasses.replace(config, mtp=True))


def test_the_heads_incremental_logits_are_one_step_over_the_whole_sequence(models, spechub_home):
    """Random heads (h_proj, the block: everything reads): after rounds and plain steps, the logits a
    running sequence's next round starts from are those of the heads run once over its whole
    sequence with the model's hidden states of one step over it."""
    config = config_of(models["random"], spechub_home, draft_tokens=3)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    with open_ranks(config) as ranks:
        engine = engine_over(ranks)
        sequence = engine.add(PROMPTS[0], params)
        engine.add(PROMPTS[2], params)
        while engine.rounds < 3 or sequence not in engine.ready:
            assert not sequence.finished
            engine.step()
        incremental = engine.ready[sequence][0]
        tokens = list(sequence.token_ids)
    whole = dataclasses.replace(config, mtp=False, return_buffer=RAD_HIDDEN, max_step_tokens=len(tokens))
    arrays = _one_sequence(tokens, whole)
    model = Worker(whole).build()
    try:
        model.execute(arrays)
        hidden = model.returned(len(tokens), 1)[RAD_HIDDEN]
    finally:
        model.close()
    heads = Worker(dataclasses.replace(whole, return_buffer="logits"), architecture="llama.mtp").build()
    try:  # position i: the model's hidden state there and the token after it
        heads.executor.write_buffer(RAD_MTP_PREVIOUS, hidden[:-1])
        heads.execute({**_one_sequence(tokens[:-1], whole), RAD_STEP_IDS: np.asarray(tokens[1:], np.int32)})
        logits = heads.returned(len(tokens) - 1, 1)["logits"][0]
    finally:
        heads.close()
    np.testing.assert_allclose(incremental, logits, rtol=1e-4, atol=1e-5)


def _one_sequence(tokens: list[int], config: Config) -> dict:
    blocks = BlockManager(config.num_blocks, config.block_size)
    sequence = Sequence(0, tokens, SamplingParams(temperature=0))
    blocks.allocate(sequence, len(tokens))
    return speculative_arrays([Entry(sequence, 0, tokens)], blocks, config.max_blocks, every=False)


def test_sampled_tokens_are_distributed_as_the_models(models, spechub_home):
    """The second and third tokens of 240 seeded requests come from rounds (drafts kept or
    refused): their distribution is plain sampling's (at a low temperature, a few tokens carry it)."""
    count = 240

    def sampled(i):
        return SamplingParams(max_tokens=3, temperature=0.02, seed=1000 + i, ignore_eos=True)

    prompts = [PROMPTS[0]] * count
    runs = {}
    for mtp in (False, True):
        config = config_of(models["copied"], spechub_home, mtp=mtp, draft_tokens=2, max_seqs=16)
        runs[mtp] = generate(config, sampled, prompts)
    assert runs[True][2][1] > 0  # rounds ran
    assert runs[True][0] != runs[False][0]  # other draws than plain sampling's
    for position in (1, 2):
        plain, drafted = (Counter(output[position] for output in runs[mtp][0]) for mtp in (False, True))
        assert len(plain) > 1  # a distribution, not one token
        distance = sum(abs(plain[t] - drafted[t]) for t in plain.keys() | drafted.keys()) / (2 * count)
        assert distance < 0.15, (position, plain.most_common(5), drafted.most_common(5))


def test_launched_tp_2_host_ranks_give_the_models_tokens(models, spechub_home, plain):
    """The model's RAD_HIDDEN and logits come back from rank 0; the heads run in this process."""
    outputs, _, (kept, drafted) = generate(config_of(models["copied"], spechub_home, draft_tokens=2, tp=2,
                                                     device="host"), greedy)
    assert outputs == plain[0] and kept > 0


def test_radiance_launch_drafts_with_the_heads_and_no_mtp_turns_them_off(models, spechub_home):
    """radiance-launch (a launched TP 1 rank) with the heads; radiance (in process) --no-mtp without."""
    options = ["--model", str(models["copied"]), "--prompt", "hi", "--max-tokens", "8", "--temperature", "0",
               "--radiance-home", str(spechub_home), "--kernels", "libr4d,spechub", "--debug-accept-reference-kernels",
               "--device", "host"]
    done = subprocess.run([script("radiance-launch"), *options], capture_output=True, text=True)
    off = subprocess.run([script("radiance"), *options, "--no-mtp"], capture_output=True, text=True)
    assert done.returncode == 0 and off.returncode == 0, done.stderr + off.stderr
    assert done.stdout == off.stdout and len(done.stdout.strip()) > 0
    assert "its own MTP heads (llama.mtp) drafts 4 tokens a round" in done.stderr
    assert "speculative decoding" not in off.stderr


def test_a_cards_buffer_takes_the_hidden_state_written_before_a_step():
    """DeviceMemory.write_buffer (how the heads get RAD_MTP_PREVIOUS on a card), on the fake card:
    the rows written are the rows read back, the rest of the buffer untouched."""
    from radiance.abi import RAD_DT_F32, RAD_EXTENT_TOKENS, RadBufferDecl
    from radiance.device.fake import FakeDevice
    from radiance.engine.running.device_memory import DeviceMemory

    device = FakeDevice(device_bytes=1 << 24)
    buffer = RadBufferDecl(name=RAD_MTP_PREVIOUS, dtype=RAD_DT_F32, extent=RAD_EXTENT_TOKENS, cols=4, split=0, parts=0)
    memory = DeviceMemory(device, None, {RAD_MTP_PREVIOUS: buffer}, {}, max_tokens=8, max_seqs=2, num_slots=16,
                          max_blocks=2)
    try:
        rows = np.arange(12, dtype=np.float32).reshape(3, 4) + 0.5
        memory.write_buffer(RAD_MTP_PREVIOUS, rows)
        back = memory.read_buffer(RAD_MTP_PREVIOUS, 8)
        np.testing.assert_array_equal(back[:3], rows)
        np.testing.assert_array_equal(back[3:], 0)
    finally:
        memory.release()
        device.close()


@pytest.mark.parametrize("args, message", [
    (["--mtp-layers", "2"], "llama: hyper-parameter 'mtp_layers' must be 0 or 1 (one multi-token-prediction head), "
                            "not 2"),
    (["--mtp-random", "1"], "--mtp-random 1 is about a head: give --mtp-layers 1 with it")])
def test_a_head_rad_convert_cannot_write_is_one_line(tmp_path, args, message):
    result = CliRunner().invoke(main, ["--synthetic", "llama", "--layers", "1", "-o", str(tmp_path / "m.rad"), *args])
    assert result.exit_code == 1 and result.stderr == f"rad-convert: error: --synthetic llama: {message}\n"
    assert not (tmp_path / "m.rad").exists()


def test_the_server_drafts_with_the_heads_and_answers_as_without(models, spechub_home):
    """Three concurrent completions through the OpenAI API, one of them with top_k (its batch decodes
    with plain steps): the same texts with the heads as without."""
    import threading

    import httpx

    from radiance.serving.options import ServeSettings
    from radiance.serving.server import Server

    asks = [{"prompt": "hello there", "max_tokens": 8}, {"prompt": "the sea", "max_tokens": 6},
            {"prompt": "one two", "max_tokens": 5, "top_k": 3}]
    texts = {}
    for mtp in (True, False):
        server = Server(str(models["copied"]), ServeSettings(port=0, defaults={"temperature": 0.0})).start()
        ranks = open_ranks(config_of(models["copied"], spechub_home, mtp=mtp, draft_tokens=2))
        engine = engine_over(ranks)
        assert isinstance(engine, MtpEngine) == mtp
        loop = server.attach(engine, ranks)
        thread = threading.Thread(target=loop.run, daemon=True)
        thread.start()
        try:
            answers = {}

            def ask(i):
                answers[i] = httpx.post(f"{server.url}/v1/completions", timeout=120,
                                        json={"model": "copied", "ignore_eos": True, **asks[i]}).json()

            threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(asks))]
            for each in threads:
                each.start()
            for each in threads:
                each.join(120)
            assert all("choices" in answers[i] for i in range(len(asks))), answers
            texts[mtp] = [answers[i]["choices"][0]["text"] for i in range(len(asks))]
            assert [answers[i]["usage"]["completion_tokens"] for i in range(len(asks))] == [8, 6, 5]
            assert not mtp or engine.rounds > 0
        finally:
            server.stop()
            thread.join(30)
            ranks.close()
    assert texts[True] == texts[False]
