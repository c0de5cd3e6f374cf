"""A damaged model never loads: `radiance` and `radiance-launch` refuse it in one line naming the
file, exit 1 and leave nothing behind, where before they loaded it and answered from the wrong
bytes. The damage is what a disk, a copy or a hand does: a header length off, a norm's bytes
flipped, a byte of the tokenizer flipped, a GGUF file given where a .rad is due."""

import shutil
import subprocess
import sys

import pytest

from container_samples import read_header


def run(module, *args):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def one_line_error(result, program, *fragments):
    assert result.returncode == 1, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith(f"{program}: error: "), result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]
    assert "Traceback" not in result.stderr and result.stdout == ""


def copy(model, tmp_path):
    path = tmp_path / "copy.rad"
    shutil.copyfile(model, path)
    return path


def data_start(path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


@pytest.mark.parametrize("module, program, extra", [
    ("radiance.tools.generate", "radiance", ()),
    ("radiance.tools.launch", "radiance-launch", ("--tp", 1)),
])
def test_a_header_length_lowered_by_1000_never_loads(smollm2, tmp_path, module, program, extra):
    """The converter leaves room in the header for its report, so the JSON still parses with 1000
    bytes less of it: every weight would be read 1000 bytes off."""
    path = copy(smollm2, tmp_path)
    with open(path, "r+b") as file:
        length = int.from_bytes(file.read(8), "little")
        file.seek(0)
        file.write((length - 1000).to_bytes(8, "little"))
    result = run(module, "--model", path, "--prompt", "The capital of France is", "--max-tokens", 4,
                 "--temperature", 0, *extra)
    one_line_error(result, program, str(path), "header length")


def test_a_flipped_byte_in_a_norm_never_loads(tiny_model, tmp_path):
    path = copy(tiny_model, tmp_path)
    header, _, _ = read_header(path)
    start = data_start(path) + header["output_norm.codes"]["data_offsets"][0]
    blob = bytearray(path.read_bytes())
    blob[start + 5] ^= 0x40
    path.write_bytes(bytes(blob))
    result = run("radiance.tools.generate", "--model", path, "--prompt", "hi", "--max-tokens", 2)
    one_line_error(result, "radiance", str(path), "weight 'output_norm' plane 'codes' fails its checksum",
                   f"rad-convert --verify {path}")


def test_a_flipped_byte_in_the_tokenizer_names_the_file(tiny_model, tmp_path):
    path = copy(tiny_model, tmp_path)
    blob = bytearray(path.read_bytes())
    at = blob.index(b'\\"tokenizer\\":\\"{') + len(b'\\"tokenizer\\":\\"')
    blob[at] = ord("[")  # one byte: the header is still JSON, the tokenizer's JSON no longer
    path.write_bytes(bytes(blob))
    result = run("radiance.tools.generate", "--model", path, "--prompt", "hi", "--max-tokens", 2)
    one_line_error(result, "radiance", str(path), "the tokenizer in the container does not load")
