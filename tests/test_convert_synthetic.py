"""--synthetic llama: every shape parameter reaches the hyper-parameters and the weights; weights are
seeded per weight, independent of the row blocks a quantiser asks for; memory stays bounded by a
row block, not by the weight."""

import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from tokenizers import Tokenizer

from radiance.convert import convert_synthetic, pipeline
from radiance.convert.cli import main
from radiance.weights.container_reader import Container
from radiance.weights.decode import decode

SMALL = dict(hidden=96, layers=2, heads=6, kv_heads=2, ffn=160, vocab=400, context=512)


def weight(container, name):
    shape = container.shape(name)
    matrix = tuple(shape) if len(shape) == 2 else (1, shape[0])
    return decode(container.encoding(name), {p: container.plane(name, p) for p in container.planes(name)}, matrix)


def recipe(tmp_path, quantizer):
    path = tmp_path / f"{quantizer}.toml"
    path.write_text(f'[[rule]]\nmatch = "*"\nquantizer = "{quantizer}"\noptions = {{dtype = "f32"}}\n'
                    if quantizer == "plain" else f'[[rule]]\nmatch = "layers.*.attn.*"\nquantizer = "{quantizer}"\n')
    return path


def test_every_shape_parameter_on_the_command_line(tmp_path):
    output = tmp_path / "model.rad"
    result = CliRunner().invoke(main, [
        "--synthetic", "llama", "-o", str(output), "--hidden", "128", "--layers", "3", "--heads", "4",
        "--kv-heads", "1", "--ffn", "320", "--vocab", "1000", "--context", "4096", "--rope-theta", "500000",
        "--no-tie-embeddings", "--seed", "9", "--head-dim", "64", "--rms-eps", "1e-6"])
    assert result.exit_code == 0, result.stderr
    assert f"wrote {output}: 30 weights" in result.stderr
    with Container(output) as container:
        assert container.hyper == {
            "hidden": 128, "layers": 3, "heads": 4, "kv_heads": 1, "head_dim": 64, "ffn": 320, "vocab": 1000,
            "context": 4096, "rope_theta": 500000.0, "rms_eps": 1e-6, "tie_embeddings": False,
            "rope_interleaved": 0, "bos_token_id": 256, "eos_token_ids": [257], "add_bos": True}
        assert container.shape("layers.2.attn.q") == (256, 128) and container.shape("layers.2.attn.k") == (64, 128)
        assert container.shape("layers.0.attn.o") == (128, 256) and container.shape("output") == (1000, 128)
        assert container.metadata["seed"] == 9 and container.metadata["source_format"] == "synthetic"


def test_values_are_normal_with_unit_norms_and_the_tokenizer_round_trips(tmp_path):
    convert_synthetic(tmp_path / "model.rad", "llama", SMALL, 1, recipe(tmp_path, "plain"))
    with Container(tmp_path / "model.rad") as container:
        embedding = weight(container, "token_embd")
        assert abs(embedding.mean()) < 1e-3 and embedding.std() == pytest.approx(0.02, rel=0.02)
        assert (weight(container, "layers.1.ffn_norm") == 1).all()
        assert "output" not in container.weights  # tied by default
        tokenizer = Tokenizer.from_str(container.tokenizer)
        assert tokenizer.get_vocab_size() == 400
        text = "synthetic ✓ model"
        ids = tokenizer.encode(text).ids
        assert ids[0] == 256 and tokenizer.decode(ids) == text


def test_weights_do_not_depend_on_the_recipe_or_its_row_blocks(tmp_path):
    """fp8 takes each weight whole, plain f32 in row blocks: the same seed gives the same values."""
    plain, fp8 = tmp_path / "plain.rad", tmp_path / "fp8.rad"
    convert_synthetic(plain, "llama", SMALL, 4, recipe(tmp_path, "plain"))
    convert_synthetic(fp8, "llama", SMALL, 4, recipe(tmp_path, "fp8"))
    convert_synthetic(tmp_path / "other.rad", "llama", SMALL, 5, recipe(tmp_path, "plain"))
    with Container(plain) as exact, Container(fp8) as rounded, Container(tmp_path / "other.rad") as other:
        for name in ("layers.0.attn.q", "layers.1.attn.v"):
            source = weight(exact, name)
            error = np.abs(weight(rounded, name) - source)
            scale = rounded.plane(name, "scale").view(np.float32)[0]
            assert (error <= np.maximum(2.0**-4 * np.abs(source), 2.0**-10 * scale)).all()  # fp8's bound
            assert not np.array_equal(weight(other, name), source)
        bf16 = weight(exact, "layers.0.ffn.up").astype(ml_dtypes.bfloat16).astype(np.float32)
        assert np.array_equal(bf16, weight(rounded, "layers.0.ffn.up"))  # no rule: the default bf16


@pytest.mark.parametrize("threads", [1, 2])
def test_memory_is_bounded_by_a_row_block(tmp_path, monkeypatch, threads):
    """Three 64 MiB (f32) feed-forward weights convert with far less than one of them allocated:
    a row block's worth (about 14 MiB with its decoded copy and sums) per thread."""
    monkeypatch.setattr(pipeline, "default_threads", lambda: threads)
    shape = dict(hidden=2048, layers=1, heads=16, kv_heads=4, ffn=8192, vocab=300)
    tracemalloc.start()
    try:
        convert_synthetic(tmp_path / "model.rad", "llama", shape, 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < (8 + 16 * threads) << 20, f"peak {peak / 2**20:.1f} MiB"


def test_bad_shapes_are_one_line(tmp_path):
    for args, message in ((["--heads", "7"], "--hidden 576 is not a multiple of --heads 7"),
                          (["--kv-heads", "2"], "--heads 9 is not a multiple of --kv-heads 2"),
                          (["--layers", "0"], "--layers 0 is not a positive count")):
        result = CliRunner().invoke(main, ["--synthetic", "llama", "-o", str(tmp_path / "m.rad"), *args])
        assert result.exit_code == 1 and result.stderr == f"rad-convert: error: --synthetic llama: {message}\n"
    assert list(tmp_path.iterdir()) == []
