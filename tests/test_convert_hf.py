"""A Hugging Face folder written here (config.json, two safetensors shards, tokenizer.json built with
the tokenizers library, tokenizer_config.json): converted with and without a recipe."""

import json

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from radiance.convert import convert
from radiance.convert.cli import main
from radiance.weights.container_reader import Container
from radiance.weights.decode import decode

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 300,
          "max_position_embeddings": 1024, "rope_theta": 50000.0, "rms_norm_eps": 1e-6,
          "tie_word_embeddings": False, "bos_token_id": 256, "eos_token_id": [257, 258],
          "rope_scaling": {"type": "linear", "factor": 2.0}}
TEMPLATE = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}"
LAYER = {"input_layernorm": (64,), "self_attn.q_proj": (64, 64), "self_attn.k_proj": (32, 64),
         "self_attn.v_proj": (32, 64), "self_attn.o_proj": (64, 64), "post_attention_layernorm": (64,),
         "mlp.gate_proj": (96, 64), "mlp.up_proj": (96, 64), "mlp.down_proj": (64, 96)}


def tokenizer_json():
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(alphabet)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in ("<s>", "</s>", "<|user|>")])
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 256)])
    return tokenizer.to_str()


def tensors(config):
    rng = np.random.default_rng(11)
    found = {"model.embed_tokens.weight": (300, 64), "model.norm.weight": (64,), "lm_head.weight": (300, 64)}
    for layer in range(config["num_hidden_layers"]):
        found |= {f"model.layers.{layer}.{name}.weight": shape for name, shape in LAYER.items()}
    values = {name: (rng.standard_normal(shape) * 0.05).astype(ml_dtypes.bfloat16) for name, shape in found.items()}
    values["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)  # derived: skipped
    return values


def write_folder(folder, config=CONFIG):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text(tokenizer_json())
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    values = tensors(config)
    names = sorted(values)
    save_file({name: values[name] for name in names[::2]}, folder / "model-00001-of-00002.safetensors")
    save_file({name: values[name] for name in names[1::2]}, folder / "model-00002-of-00002.safetensors")
    return folder, values


def weight(container, name):
    shape = container.shape(name)
    matrix = tuple(shape) if len(shape) == 2 else (1, shape[0])
    return decode(container.encoding(name), {p: container.plane(name, p) for p in container.planes(name)}, matrix)


def test_default_is_bf16_and_norms_f32_which_keep_bf16_sources_exact(tmp_path):
    folder, values = write_folder(tmp_path / "hf")
    errors = convert(folder, tmp_path / "model.rad")
    assert all(error.relative == 0 for error in errors)
    with Container(tmp_path / "model.rad") as container:
        assert container.metadata["methods"]["layers.1.attn.k"] == "plain dtype=bf16"
        assert container.metadata["methods"]["output_norm"] == "plain dtype=f32"
        source = values["model.layers.1.self_attn.k_proj.weight"].astype(np.float32)
        assert np.array_equal(weight(container, "layers.1.attn.k"), source)
        assert np.array_equal(weight(container, "output_norm")[0], values["model.norm.weight"].astype(np.float32))
        assert container.weights[0] == "token_embd" and container.weights[-1] == "output"


def test_hyper_tokenizer_and_chat_template(tmp_path):
    folder, _ = write_folder(tmp_path / "hf")
    convert(folder, tmp_path / "model.rad")
    with Container(tmp_path / "model.rad") as container:
        assert container.hyper == {
            "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 96, "vocab": 300,
            "context": 1024, "rope_theta": 50000.0, "rms_eps": 1e-6, "tie_embeddings": False,
            "rope_interleaved": 0, "bos_token_id": 256, "eos_token_ids": [257, 258], "add_bos": True,
            "rope_scaling": {"factor": 2.0, "rope_type": "linear"}}
        assert container.tokenizer == (folder / "tokenizer.json").read_text()
        assert container.chat_template == TEMPLATE


def test_a_recipe_picks_quantisers_first_match_wins(tmp_path):
    folder, values = write_folder(tmp_path / "hf")
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"rule": [
        {"match": "re:layers\\.[0-9]+\\.ffn\\.(gate|up)", "quantizer": "q4_1", "options": {"group": 16}},
        {"match": "layers.*.ffn.*", "quantizer": "q8_0"},
        {"match": "token_embd", "quantizer": "fp8"}]}))
    errors = {error.name: error for error in convert(folder, tmp_path / "model.rad", recipe)}
    assert errors["layers.0.ffn.up"].method == "q4_1 group=16" and errors["layers.1.ffn.down"].method == "q8_0 group=32"
    assert errors["token_embd"].method == "fp8" and errors["layers.0.attn.q"].method == "plain dtype=bf16"
    assert 0 < errors["layers.1.ffn.down"].relative < 0.01 < errors["layers.0.ffn.up"].relative < 0.1
    with Container(tmp_path / "model.rad") as container:
        source = values["model.layers.0.mlp.gate_proj.weight"].astype(np.float32)
        scale = container.plane("layers.0.ffn.gate", "scale").view(np.float16).reshape(96, 4).astype(np.float32)
        error = np.abs(weight(container, "layers.0.ffn.gate") - source)
        assert (error <= np.repeat(scale, 16, axis=1) / 2 * 1.0001).all()  # q4_1's documented bound
        assert container.metadata["relative_error"]["worst"].endswith(("ffn.gate", "ffn.up"))


def test_tied_embeddings_drop_a_stored_lm_head(tmp_path):
    folder, _ = write_folder(tmp_path / "hf", {**CONFIG, "tie_word_embeddings": True})
    convert(folder, tmp_path / "model.rad")
    with Container(tmp_path / "model.rad") as container:
        assert "output" not in container.weights and container.hyper["tie_embeddings"] is True


def test_a_recipe_naming_a_missing_quantiser_names_file_rule_and_quantiser(tmp_path):
    folder, _ = write_folder(tmp_path / "hf")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('[[rule]]\nmatch = "token_embd"\nquantizer = "q8_0"\n\n'
                      '[[rule]]\nmatch = "layers.*"\nquantizer = "iq2_xxs"\n')
    result = CliRunner().invoke(main, [str(folder), "-o", str(tmp_path / "model.rad"), "--recipe", str(recipe)])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"rad-convert: error: {recipe}: rule 2 (match 'layers.*'): "
                                    f"no loaded quantiser is named 'iq2_xxs' (loaded: ")
    assert result.stderr.count("\n") == 1 and list(tmp_path.glob("model.rad*")) == []


@pytest.mark.parametrize("text, message", [
    ('[[rule]]\nmatch = "*"\nquantizer = "q8_0"\noptions = {grp = 3}\n', "rule 1 (match '*'): quantiser 'q8_0' has no option 'grp' (its options: group)"),
    ('[[rule]]\nmatch = "*"\nquantizer = "q8_0"\noptions = {group = 1.5}\n', "option 'group' = 1.5 is not an integer"),
    ('[[rule]]\nmatch = "re:(("\nquantizer = "q8_0"\n', "rule 1 (match 're:(('): not a regular expression"),
    ('[[rule]]\nmatch = "*"\nquantiser = "q8_0"\n', "rule 1 (match '*'): unknown field 'quantiser'"),
    ('[rule]\nmatch = "*"\n', "a recipe is a list of rules under 'rule'"),
    ('[[rule]\n', "not a valid TOML recipe"),
])
def test_bad_recipes_are_one_line(tmp_path, text, message):
    folder, _ = write_folder(tmp_path / "hf")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(text)
    result = CliRunner().invoke(main, [str(folder), "-o", str(tmp_path / "model.rad"), "--recipe", str(recipe)])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"rad-convert: error: {recipe}: ") and message in result.stderr


def test_folders_that_are_not_llama_are_refused(tmp_path):
    folder, _ = write_folder(tmp_path / "hf", {**CONFIG, "architectures": ["GPT2LMHeadModel"]})
    result = CliRunner().invoke(main, [str(folder), "-o", str(tmp_path / "model.rad")])
    assert result.exit_code == 1
    assert result.stderr == (f"rad-convert: error: {folder / 'config.json'}: architecture 'GPT2LMHeadModel' "
                             f"is imported by no architecture plugin on the search path (loaded: gemma3, llama; none of "
                             f"them takes it from Hugging Face folders)\n")
    (folder / "config.json").unlink()
    result = CliRunner().invoke(main, [str(folder), "-o", str(tmp_path / "model.rad")])
    assert result.stderr == f"rad-convert: error: {folder / 'config.json'}: is missing\n"
