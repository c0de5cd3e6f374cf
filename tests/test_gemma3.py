"""Gemma 3 as an architecture plugin: its new ops in libref against plain numpy, its SentencePiece
vocabulary through the tokenizers library against llama.cpp's SPM algorithm (written out here) and
against llama.cpp's own ids (the fixture), its Hugging Face folders (norms of 1 + w), and tensor
parallel: a synthetic Gemma and the real Gemma 3 270M (4 query heads, one KV head, replicated on every
rank) give TP 1's tokens at TP 2 and 4."""

import copy
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file
from tokenizers import Tokenizer

from radiance.abi import RadArgs, rad_tensor
from radiance.config import Config
from radiance.convert import convert, convert_synthetic
from radiance.convert.gguf_tokenizer import gguf_tokenizer
from radiance.engine.loading.registry import Registry
from radiance.generation.sequence import SamplingParams
from radiance.launch import engine_over, open_ranks
from radiance.weights.container_reader import Container
from test_convert_hf import tokenizer_json, weight

FIXTURE = json.loads((Path(__file__).resolve().parent / "fixtures" / "llamacpp_greedy.json").read_text())
SMALL = dict(hidden=64, layers=4, heads=4, kv_heads=1, head_dim=16, ffn=96, vocab=320, context=256,
             sliding_window=4, sliding_window_pattern=2)


@pytest.fixture(scope="module")
def libref():
    registry = Registry("", kernels="libref")
    ops = ("scale", "rmsnorm_heads", "gelu_tanh_mul", "sliding_attention", "attention")
    yield {op: row.info for op in ops for row in registry.rows_for(op) if row.plugin.name == "libref"}
    registry.close()


def launch(row, operands, **params):
    return row.launch(RadArgs(t=tuple(rad_tensor(x) for x in operands), params=params))


def test_scale_rmsnorm_heads_and_gelu_tanh_mul(libref):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    y = np.empty_like(x)
    launch(libref["scale"], (x, y), M=3, n=8, scale=float(np.sqrt(np.float32(640))), dtype="f32")
    assert np.array_equal(y, x * np.float32(np.sqrt(np.float32(640))))
    q, w = rng.standard_normal((3, 2 * 16)).astype(np.float32), rng.standard_normal((1, 16)).astype(np.float32)
    out = q.copy()
    launch(libref["rmsnorm_heads"], (out, w, out), M=3, heads=2, head_dim=16, eps=1e-6, dtype="f32")
    heads = q.reshape(6, 16).astype(np.float64)
    expected = heads / np.sqrt((heads * heads).mean(axis=1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(out.reshape(6, 16), expected, rtol=2e-6, atol=1e-6)
    gate, up = rng.standard_normal((3, 8)).astype(np.float32) * 3, rng.standard_normal((3, 8)).astype(np.float32)
    launch(libref["gelu_tanh_mul"], (gate, up, y), M=3, n=8, dtype="f32")
    g = gate.astype(np.float64)
    gelu = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
    assert np.array_equal(y, gelu.astype(np.float32) * up)


def test_sliding_attention_sees_only_its_window(libref):
    """A sequence of 7 tokens, window 3: each token's output is plain attention over its last 3 keys."""
    rng = np.random.default_rng(2)
    heads, kv_heads, head_dim, length, window = 2, 1, 8, 7, 3
    q = rng.standard_normal((length, heads * head_dim)).astype(np.float32)
    k, v = (rng.standard_normal((length, kv_heads * head_dim)).astype(np.float32) for _ in range(2))

    def run(op, keys, values, queries, positions, **extra):
        """The queries are the last len(queries) positions of a sequence of len(keys): the earlier
        keys already cached, the queries' own stored by the op."""
        caches = [np.zeros((16, kv_heads * head_dim), np.float32) for _ in range(2)]
        caches[0][:len(keys)], caches[1][:len(keys)] = keys, values
        out = np.zeros_like(queries)
        slots = np.arange(len(keys) - len(queries), len(keys), dtype=np.int32)
        own = slice(len(keys) - len(queries), len(keys))
        launch(libref[op], (queries, keys[own], values[own], *caches, slots, np.asarray(positions, np.int32),
                            np.array([0, len(queries)], np.int32), np.array([len(keys)], np.int32),
                            np.zeros((1, 1), np.int32), out),
               M=len(queries), q_heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=16, scale=0.25,
               dtype="f32", **extra)
        return out

    windowed = run("sliding_attention", k, v, q, range(length), window=window)
    for p in range(length):
        first = max(0, p - window + 1)
        alone = run("attention", k[first:p + 1], v[first:p + 1], q[p:p + 1], [p - first])
        np.testing.assert_allclose(windowed[p], alone[0], rtol=1e-6, atol=1e-7)


def spm_reference(text: str, tokens: list[str], scores: list[float], add_space_prefix: bool) -> list[int]:
    """llama.cpp's llm_tokenizer_spm, written out: merge the adjacent pair whose joined text is the
    token of highest score (leftmost among equals) until none is; what no token covers, as bytes."""
    ids = {token: i for i, token in enumerate(tokens)}
    symbols = list(((" " if add_space_prefix else "") + text).replace(" ", "\u2581"))
    while True:
        best = None
        for i in range(len(symbols) - 1):
            joined = symbols[i] + symbols[i + 1]
            if joined in ids and (best is None or scores[ids[joined]] > best[0]):
                best = (scores[ids[joined]], i)
        if best is None:
            break
        symbols[best[1]:best[1] + 2] = [symbols[best[1]] + symbols[best[1] + 1]]
    out = []
    for symbol in symbols:
        out += [ids[symbol]] if symbol in ids else [ids[f"<0x{byte:02X}>"] for byte in symbol.encode()]
    return out


@pytest.mark.parametrize("add_space_prefix", [True, False], ids=["llama2-style", "gemma-style"])
def test_spm_vocabularies_merge_as_llama_cpp(add_space_prefix):
    rng = np.random.default_rng(3)
    pieces = ["\u2581", "a", "b", "c", "d", "e", "ab", "cd", "abc", "\u2581a", "\u2581ab", "bc", "de", "cde",
              "\u2581\u2581", "\u2581\u2581\u2581", "ea", "dea", "\u2581c", "aa", "aaa"]
    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{i:02X}>" for i in range(256)], *pieces]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * 259 + [float(s) for s in rng.permutation(len(pieces))]
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.unknown_token_id": 0,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.add_space_prefix": add_space_prefix}
    tokenizer = Tokenizer.from_str(gguf_tokenizer(lambda key, default=None: meta.get(key, default)))
    alphabet = "abcde  xé"
    for _ in range(300):
        text = "".join(rng.choice(list(alphabet), rng.integers(1, 14)))
        assert tokenizer.encode(text, add_special_tokens=False).ids == \
            spm_reference(text, tokens, scores, add_space_prefix), repr(text)
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False).ids) == \
            (" " if add_space_prefix else "") + text


def test_gemma3_texts_encode_to_llama_cpps_ids(gemma3):
    """The fixture's texts (code, accents, CJK, emoji, runs of spaces, tabs and newlines, control
    tokens, 200 random strings of Gemma's own tokens) and prompts, as llama.cpp encodes them."""
    model = FIXTURE["models"]["gemma3_270m_q4_k_m"]
    with Container(gemma3) as container:
        tokenizer = Tokenizer.from_str(container.tokenizer)
        assert container.hyper["add_bos"] and container.hyper["bos_token_id"] == 2
        assert 106 in container.hyper["eos_token_ids"]  # <end_of_turn>, as llama.cpp's end-of-generation set
    for run in model["runs"]:
        assert [2] + tokenizer.encode(run["prompt"], add_special_tokens=False).ids == run["prompt_ids"]
    assert len(model["tokenized"]) > 200
    for entry in model["tokenized"]:
        assert tokenizer.encode(entry["text"], add_special_tokens=False).ids == entry["ids"], repr(entry["text"])


def test_a_hugging_face_gemma3_folder_gets_norms_of_one_plus_w(tmp_path):
    hidden, head_dim, ffn = 64, 16, 96
    config = {"architectures": ["Gemma3ForCausalLM"], "hidden_size": hidden, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": head_dim, "intermediate_size": ffn,
              "vocab_size": 300, "max_position_embeddings": 512, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
              "rms_norm_eps": 1e-6, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
              "query_pre_attn_scalar": 16, "final_logit_softcapping": None, "attn_logit_softcapping": None,
              "bos_token_id": 256, "eos_token_id": 257}
    shapes = {"model.embed_tokens.weight": (300, hidden), "model.norm.weight": (hidden,)}
    layer = {"input_layernorm": (hidden,), "self_attn.q_proj": (64, hidden), "self_attn.k_proj": (16, hidden),
             "self_attn.v_proj": (16, hidden), "self_attn.q_norm": (head_dim,), "self_attn.k_norm": (head_dim,),
             "self_attn.o_proj": (hidden, 64), "post_attention_layernorm": (hidden,),
             "pre_feedforward_layernorm": (hidden,), "mlp.gate_proj": (ffn, hidden), "mlp.up_proj": (ffn, hidden),
             "mlp.down_proj": (hidden, ffn), "post_feedforward_layernorm": (hidden,)}
    for i in range(2):
        shapes |= {f"model.layers.{i}.{name}.weight": shape for name, shape in layer.items()}
    rng = np.random.default_rng(4)
    values = {name: (rng.standard_normal(shape) * 0.1).astype(ml_dtypes.bfloat16) for name, shape in shapes.items()}
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text(tokenizer_json())
    save_file(values, folder / "model.safetensors")
    convert(folder, tmp_path / "gemma.rad")
    with Container(tmp_path / "gemma.rad") as container:
        assert container.architecture == "gemma3"
        assert container.hyper["layer_types"] == ["sliding", "full"] and container.hyper["tie_embeddings"]
        norm = values["model.layers.1.self_attn.k_norm.weight"].astype(np.float32)
        assert np.array_equal(weight(container, "layers.1.attn.k_norm")[0], norm + np.float32(1))
        proj = values["model.layers.0.mlp.up_proj.weight"].astype(np.float32)
        assert np.array_equal(weight(container, "layers.0.ffn.up"), proj)


def greedy(model, tp, prompts, max_tokens, **options):
    config = Config(model=str(model), radiance_home="", kernels="libr4d,libref", accept_reference=True,
                    max_context=128, progress=False, tp=tp, launched=tp > 1, **options)
    outputs = []
    with open_ranks(config) as ranks:
        engine = engine_over(ranks)
        for prompt in prompts:
            sequence = engine.add(engine.text.encode(prompt), SamplingParams(max_tokens=max_tokens, temperature=0,
                                                                           ignore_eos=True))
            while not sequence.finished:
                engine.step()
            outputs.append(sequence.output_ids)
    return outputs


@pytest.fixture(scope="module")
def small_gemma3(tmp_path_factory):
    """Two sliding layers of window 4 and two global ones, one KV head."""
    path = tmp_path_factory.mktemp("gemma3_small") / "gemma3.rad"
    convert_synthetic(path, "gemma3", SMALL, seed=5)
    return path


@pytest.fixture(scope="module")
def tp1():
    """greedy(model, 1, prompts, max_tokens), run once per module for each (TP 2 and TP 4 compare
    against the same TP 1 run); each caller gets its own copy."""
    runs = {}

    def tokens(model, prompts, max_tokens):
        key = (str(model), tuple(prompts), max_tokens)
        if key not in runs:
            runs[key] = greedy(model, 1, prompts, max_tokens)
        return copy.deepcopy(runs[key])
    return tokens


@pytest.mark.parametrize("tp", [2, 4])
def test_synthetic_gemma3_at_tp_gives_tp1_tokens(small_gemma3, tp1, tp):
    prompts = ["the quick brown fox jumps", "0123456789"]  # longer than the window
    assert greedy(small_gemma3, tp, prompts, 8) == tp1(small_gemma3, prompts, 8)


@pytest.mark.parametrize("tp", [2, 4])
def test_gemma3_270m_at_tp_gives_tp1_tokens(gemma3, tp1, tp):
    prompts = ["The capital of France is"]
    assert greedy(gemma3, tp, prompts, 6) == tp1(gemma3, prompts, 6)
