"""rad-convert's command line: --verify on good, corrupted, truncated and inconsistent files, and
every bad invocation a single `rad-convert: error: <file>: <what>` line with a non-zero exit."""

import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from radiance.convert import convert_synthetic
from radiance.convert.cli import main
from radiance.weights import formats
from radiance.weights.container_reader import Container
from radiance.weights.container_writer import ContainerWriter

TINY = dict(hidden=64, layers=1, heads=4, kv_heads=2, ffn=96, vocab=300)


def run(*args):
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    assert "Traceback" not in result.stderr
    return result


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.rad"
    convert_synthetic(path, "llama", TINY, 0)
    return path


def test_verify_a_good_file(model):
    result = run("--verify", model)
    assert result.exit_code == 0 and result.stdout == f"OK {model}\n"


def test_verify_names_the_weight_and_plane_of_a_flipped_byte(model):
    with Container(model) as container:
        offset = container._weights["layers.0.ffn.up"][2]["codes"][0]
    data = bytearray(model.read_bytes())
    data[offset + 100] ^= 0x10
    model.write_bytes(bytes(data))
    result = run("--verify", model)
    assert result.exit_code == 1
    assert result.stderr == f"rad-convert: error: {model}: weight 'layers.0.ffn.up' plane 'codes': checksum fails\n"


def test_verify_a_truncated_file(model):
    model.write_bytes(model.read_bytes()[:-1000])
    result = run("--verify", model)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"rad-convert: error: {model}: ") and "truncated" in result.stderr


def test_verify_a_plane_whose_size_disagrees_with_its_encoding(tmp_path):
    path = tmp_path / "odd.rad"
    with ContainerWriter(path, "llama", {}) as writer:
        writer.declare("w", (4, 64), formats.q8_0(), {"codes": 256, "scale": 7})
        writer.write("w", "codes", np.zeros(256, np.uint8))
        writer.write("w", "scale", np.zeros(7, np.uint8))
    result = run("--verify", path)
    assert result.exit_code == 1
    assert result.stderr == f"rad-convert: error: {path}: weight 'w' plane 'scale': 7 bytes, its encoding over [4, 64] gives 16\n"


def test_verify_a_file_that_is_no_container(tmp_path):
    path = tmp_path / "noise.rad"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    result = run("--verify", path)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"rad-convert: error: {path}: ")


@pytest.mark.parametrize("args, message", [
    (["{tmp}/missing.gguf", "-o", "{tmp}/out.rad"], "{tmp}/missing.gguf: does not exist"),
    (["{tmp}/missing.gguf"], "-o OUT.rad is required"),
    (["-o", "{tmp}/out.rad"], "give a SOURCE (a GGUF file or a Hugging Face folder) or --synthetic NAME, not both"),
    (["--synthetic", "llama", "-o", "{tmp}/no/such/folder/out.rad"], "{tmp}/no/such/folder/out.rad.partial: No such file or directory"),
    (["--verify", "{tmp}/missing.rad"], "{tmp}/missing.rad: No such file or directory"),
    (["--synthetic", "llama", "-o", "{tmp}/out.rad", "--recipe", "{tmp}/missing.toml"], "{tmp}/missing.toml: No such file or directory"),
])
def test_bad_invocations_are_one_line(tmp_path, args, message):
    result = run(*[arg.format(tmp=tmp_path) for arg in args])
    assert result.exit_code == 1
    assert result.stderr == f"rad-convert: error: {message.format(tmp=tmp_path)}\n"
    assert list(tmp_path.iterdir()) == []


def test_the_console_script_prints_no_traceback_unless_verbose(tmp_path):
    script = [sys.executable, "-c", "from radiance.convert.cli import main; main()"]
    quiet = subprocess.run(script + [str(tmp_path / "missing"), "-o", str(tmp_path / "out.rad")],
                           capture_output=True, text=True)
    assert quiet.returncode == 1 and quiet.stderr == f"rad-convert: error: {tmp_path / 'missing'}: does not exist\n"
    verbose = subprocess.run(script + [str(tmp_path / "missing"), "-o", str(tmp_path / "out.rad"), "--verbose"],
                             capture_output=True, text=True)
    assert verbose.returncode != 0 and "Traceback" in verbose.stderr and "does not exist" in verbose.stderr
