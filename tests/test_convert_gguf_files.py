"""Small GGUF files written here with gguf.GGUFWriter: every imported type comes across as its
encoding without requantising (decoding to gguf's own dequantisation, bit for bit), and each bad
input is one clear line naming the file and the fault, leaving no output behind."""

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q, GGUFReader, GGUFWriter, RopeScalingType
from gguf.quants import dequantize

from conftest import gguf_names
from radiance.convert import convert
from radiance.convert.cli import main
from radiance.weights.container_reader import Container
from radiance.weights.decode import decode
from radiance.weights.gguf_blocks import gguf_encoding

HIDDEN, FFN, VOCAB, HEAD_DIM = 256, 256, 64, 128  # K-quants need rows of whole 256-blocks
# tensor -> (GGUF type, logical [rows, cols]): two layers, between them every type that is imported
TENSORS = {
    "token_embd.weight": (Q.Q8_0, (VOCAB, HIDDEN)), "blk.0.attn_norm.weight": (Q.F32, (HIDDEN,)),
    "blk.0.attn_q.weight": (Q.Q4_0, (2 * HEAD_DIM, HIDDEN)), "blk.0.attn_k.weight": (Q.Q4_1, (HEAD_DIM, HIDDEN)),
    "blk.0.attn_v.weight": (Q.Q4_K, (HEAD_DIM, HIDDEN)), "blk.0.attn_output.weight": (Q.Q6_K, (HIDDEN, 2 * HEAD_DIM)),
    "blk.0.ffn_norm.weight": (Q.F32, (HIDDEN,)), "blk.0.ffn_gate.weight": (Q.F16, (FFN, HIDDEN)),
    "blk.0.ffn_up.weight": (Q.BF16, (FFN, HIDDEN)), "blk.0.ffn_down.weight": (Q.Q4_K, (HIDDEN, FFN)),
    "blk.1.attn_norm.weight": (Q.F32, (HIDDEN,)), "blk.1.attn_q.weight": (Q.Q5_0, (2 * HEAD_DIM, HIDDEN)),
    "blk.1.attn_k.weight": (Q.Q5_1, (HEAD_DIM, HIDDEN)), "blk.1.attn_v.weight": (Q.Q2_K, (HEAD_DIM, HIDDEN)),
    "blk.1.attn_output.weight": (Q.Q3_K, (HIDDEN, 2 * HEAD_DIM)), "blk.1.ffn_norm.weight": (Q.F32, (HIDDEN,)),
    "blk.1.ffn_gate.weight": (Q.Q5_K, (FFN, HIDDEN)), "blk.1.ffn_up.weight": (Q.Q8_0, (FFN, HIDDEN)),
    "blk.1.ffn_down.weight": (Q.Q6_K, (HIDDEN, FFN)),
    "output_norm.weight": (Q.F32, (HIDDEN,)), "output.weight": (Q.Q6_K, (VOCAB, HIDDEN)),
}
F16_FIELDS = {Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q2_K: (80, 82),
              Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.IQ4_NL: (0,)}



def tensor_bytes(qtype, shape, rng):
    """Random data of that type: block bytes with sane f16 scales, or values."""
    rows, cols = shape if len(shape) == 2 else (1, shape[0])
    if qtype == Q.F32:
        return rng.uniform(0.5, 1.5, shape).astype(np.float32), None
    if qtype == Q.F16:
        return rng.standard_normal(shape).astype(np.float16), None
    if qtype == Q.BF16:
        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16).view(np.uint8), Q.BF16
    block, size = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        scales = rng.uniform(-0.02, 0.02, (rows, cols // block)).astype(np.float16)
        data[..., offset:offset + 2] = scales.view(np.uint8).reshape(rows, -1, 2)
    return data.reshape(rows, -1), qtype


def write_gguf(path, architecture="llama", tensors=TENSORS, metadata=True, values=None):
    """A GGUF file of `tensors` (random data; `values` {name: f32 array} for some of them)."""
    rng = np.random.default_rng(5)
    writer = GGUFWriter(path, architecture)
    if metadata:
        writer.add_block_count(1 + any(name.startswith("blk.1.") for name in tensors))
        writer.add_embedding_length(HIDDEN)
        writer.add_feed_forward_length(FFN)
        writer.add_head_count(2)
        writer.add_head_count_kv(1)
        writer.add_context_length(4096)
        writer.add_layer_norm_rms_eps(1e-6)
        writer.add_rope_freq_base(500000.0)
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(4.0)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_chat_template("{{ messages }}")
    for name, (qtype, shape) in tensors.items():
        data, raw_dtype = tensor_bytes(qtype, shape, rng)
        if values and name in values:
            data, raw_dtype = values[name], None
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def run(*args):
    """rad-convert in-process: (exit code, stderr)."""
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    assert "Traceback" not in result.stderr
    return result.exit_code, result.stderr


def test_every_type_imports_without_requantising(tmp_path):
    source, output = write_gguf(tmp_path / "tiny.gguf"), tmp_path / "tiny.rad"
    errors = convert(source, output)
    assert len(errors) == len(TENSORS) and all(error.relative == 0 for error in errors)
    with Container(output) as container:
        names = gguf_names(container)
        for tensor in GGUFReader(source).tensors:
            name, (qtype, shape) = names[tensor.name], TENSORS[tensor.name]
            assert container.shape(name) == shape and container.encoding(name) == gguf_encoding(qtype)
            matrix = shape if len(shape) == 2 else (1, shape[0])
            planes = {plane: container.plane(name, plane) for plane in container.planes(name)}
            expected = dequantize(tensor.data, qtype).reshape(matrix).astype(np.float32)
            decoded = decode(container.encoding(name), planes, matrix)
            assert np.array_equal(decoded.view(np.uint32), expected.view(np.uint32)), tensor.name


def test_hyper_parameters_of_an_untied_model_with_rope_scaling(tmp_path):
    output = tmp_path / "tiny.rad"
    convert(write_gguf(tmp_path / "tiny.gguf"), output)
    with Container(output) as container:
        assert container.hyper == {
            "hidden": HIDDEN, "layers": 2, "heads": 2, "kv_heads": 1, "head_dim": HEAD_DIM, "ffn": FFN,
            "vocab": VOCAB, "context": 4096, "rope_theta": 500000.0, "rms_eps": 1e-6, "tie_embeddings": False,
            "rope_interleaved": 1, "bos_token_id": 1, "eos_token_ids": [2], "add_bos": False,
            "rope_scaling": {"rope_type": "linear", "factor": 4.0}}
        assert container.weights[-1] == "output" and container.chat_template == "{{ messages }}"
        assert container.tokenizer is None  # this file has no tokenizer.ggml.*


def test_unsupported_architecture_names_it(tmp_path):
    source = write_gguf(tmp_path / "gpt2.gguf", "gpt2", {"token_embd.weight": (Q.F32, (4, 8))}, metadata=False)
    code, stderr = run(source, "-o", tmp_path / "out.rad")
    assert code == 1
    assert stderr == (f"rad-convert: error: {source}: architecture 'gpt2' is imported by no architecture plugin "
                      f"on the search path (loaded: gemma3, llama; none of them takes it from GGUF files)\n")
    assert list(tmp_path.glob("out.rad*")) == []


def test_unsupported_tensor_type_names_tensor_and_type(tmp_path):
    tensors = {**TENSORS, "blk.0.ffn_up.weight": (Q.IQ4_NL, (FFN, HIDDEN))}
    source = write_gguf(tmp_path / "iq4.gguf", tensors=tensors)
    code, stderr = run(source, "-o", tmp_path / "out.rad")
    assert code == 1 and stderr.count("\n") == 1
    assert ("tensor 'blk.0.ffn_up.weight' has GGUF type IQ4_NL, which is not imported (supported: F32, F16, BF16, "
            "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)") in stderr
    assert stderr.startswith(f"rad-convert: error: {source}: ")
    assert list(tmp_path.glob("out.rad*")) == []


@pytest.mark.parametrize("fault, tensors, message", [
    ("a tensor that is no llama weight", {**TENSORS, "blk.0.attn_q.bias": (Q.F32, (HIDDEN,))},
     "tensor 'blk.0.attn_q.bias' is no llama weight that rad-convert knows"),
    ("a missing weight", {name: kind for name, kind in TENSORS.items() if name != "blk.0.ffn_up.weight"},
     "weight 'layers.0.ffn.up' is missing (tensor 'blk.0.ffn_up.weight')"),
    ("a weight of the wrong shape", {**TENSORS, "blk.0.attn_k.weight": (Q.Q4_1, (2 * HEAD_DIM, HIDDEN))},
     "tensor 'blk.0.attn_k.weight' (layers.0.attn.k) has shape [256, 256], the hyper-parameters give [128, 256]"),
])
def test_a_model_that_is_not_llama_shaped_is_refused(tmp_path, fault, tensors, message):
    source = write_gguf(tmp_path / "odd.gguf", tensors=tensors)
    code, stderr = run(source, "-o", tmp_path / "out.rad")
    assert code == 1 and stderr == f"rad-convert: error: {source}: {message}\n"
    assert list(tmp_path.glob("out.rad*")) == []


def test_damaged_gguf_files_are_one_line(tmp_path):
    source = write_gguf(tmp_path / "tiny.gguf")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(source.read_bytes()[:5000])
    code, stderr = run(truncated, "-o", tmp_path / "out.rad")
    assert code == 1 and stderr.startswith(f"rad-convert: error: {truncated}: not a readable GGUF file (truncated or damaged): ")
    assert stderr.count("\n") == 1
    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    code, stderr = run(text, "-o", tmp_path / "out.rad")
    assert code == 1 and "is neither a GGUF file nor a Hugging Face folder" in stderr
    assert list(tmp_path.glob("out.rad*")) == []


def test_a_recipe_does_not_apply_to_a_gguf_file(tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('[[rule]]\nmatch = "*"\nquantizer = "q8_0"\n')
    code, stderr = run(write_gguf(tmp_path / "tiny.gguf"), "-o", tmp_path / "out.rad", "--recipe", recipe)
    assert code == 1 and stderr.startswith(f"rad-convert: error: {recipe}: a GGUF file is imported as it is")
