"""Errors a user meets: one clear line, a non-zero exit, no traceback unless --verbose."""

import subprocess
import sys

import pytest

from radiance.weights import formats
from radiance.weights.container_writer import ContainerWriter


def radiance(*args):
    return subprocess.run([sys.executable, "-m", "radiance.tools.generate", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def one_line_error(result, fragment):
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("radiance: error: ") and fragment in lines[-1], result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_a_file_that_is_not_a_rad(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello, not a model")
    one_line_error(radiance("--model", path, "--prompt", "hi"), f"not a .rad model: {path}")


def test_a_missing_file(tmp_path):
    one_line_error(radiance("--model", tmp_path / "nope.rad", "--prompt", "hi"), "No such file or directory")


def mamba(path, hyper):
    with ContainerWriter(path, "mamba", hyper) as writer:
        writer.declare("w", (1, 4), formats.plain("f32"), {"codes": 16})
        writer.write("w", "codes", bytes(16))
    return path


def test_an_architecture_no_plugin_serves(tmp_path):
    path = mamba(tmp_path / "mamba.rad", {"hidden": 8, "context": 64})
    one_line_error(radiance("--model", path, "--prompt", "hi"),
                   "architecture 'mamba' is served by no plugin on the search path (served: llama)")


def test_a_model_that_gives_no_context_length(tmp_path):
    path = mamba(tmp_path / "mamba.rad", {"hidden": 8})
    one_line_error(radiance("--model", path, "--prompt", "hi"),
                   f"{path}: the mamba model's hyper-parameters give no context length ('context' is None)")


def test_a_bad_option_names_its_flag(tiny_model):
    one_line_error(radiance("--model", tiny_model, "--prompt", "hi", "--max-step-tokens", "0"),
                   "--max-step-tokens must be at least 1, not 0")


def test_a_prompt_longer_than_the_context(tiny_model):
    one_line_error(radiance("--model", tiny_model, "--prompt", "x" * 100, "--max-context", 32),
                   "the prompt is 101 tokens, the context holds 32")


def test_an_op_no_library_serves_names_op_band_and_flag(tiny_model, home):
    home.kernel("libr4d", "SCHEMAS = []\nROWS = []\n")  # shadows the in-tree libr4d with nothing
    one_line_error(radiance("--model", tiny_model, "--prompt", "hi", "--radiance-home", home.root),
                   "op 'embedding' for M in [1, 256] on the host domain: only the reference row "
                   "libref:ref_embedding matches; serving from it needs --debug-accept-reference-kernels")


def test_bad_sampling_values_before_loading(tiny_model):
    one_line_error(radiance("--model", tiny_model, "--prompt", "hi", "--top-p", "1.5"), "top_p must be in (0, 1]")


def test_verbose_shows_the_traceback(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    result = radiance("--model", path, "--prompt", "hi", "--verbose")
    assert result.returncode != 0 and "Traceback" in result.stderr
