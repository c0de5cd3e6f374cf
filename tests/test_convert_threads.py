"""Weights streamed by several threads: the same bytes and the same error report as one thread; a
failing weight fails the whole conversion with its one line, leaves nothing behind, and stops the
weights after it at their next row block."""

import threading
import time

import pytest

from radiance.convert import ConvertError
from radiance.convert.pipeline import write_model
from radiance.convert.plugins import Plugins
from radiance.convert.recipe import Recipe
from radiance.convert.synthetic import synthetic_model

SMALL = dict(hidden=96, layers=3, heads=6, kv_heads=2, ffn=160, vocab=400, tie_embeddings=False)
RECIPE = """
[[rule]]
match = "layers.*.attn.*"
quantizer = "q4_1"

[[rule]]
match = "layers.1.ffn.*"
quantizer = "fp8"

[[rule]]
match = "token_embd"
quantizer = "q8_0"
"""


def convert(tmp_path, name, threads, breaking=None):
    """The SMALL model through write_model; `breaking(job)` may replace a job's produce."""
    (tmp_path / "recipe.toml").write_text(RECIPE)
    with Plugins() as plugins:
        model = synthetic_model("llama", SMALL, 3, Recipe.load(tmp_path / "recipe.toml", plugins), plugins.families)
        for job in model.jobs:
            job.row_block = job.row_block and 8  # many row blocks per weight, so threads interleave
            if breaking:
                breaking(job)
        return write_model(tmp_path / name, model, plugins.by_name, threads=threads)


def test_threads_write_the_same_bytes_and_report_as_one(tmp_path):
    one = convert(tmp_path, "one.rad", 1)
    many = convert(tmp_path, "many.rad", 4)
    assert (tmp_path / "one.rad").read_bytes() == (tmp_path / "many.rad").read_bytes()
    assert [(e.name, e.source_squares, e.difference_squares) for e in one] == \
        [(e.name, e.source_squares, e.difference_squares) for e in many]


@pytest.mark.parametrize("threads", [1, 4])
def test_a_failing_weight_is_one_line_and_leaves_nothing(tmp_path, threads):
    def breaking(job):
        produce = job.produce

        def failing(r0, r1):
            if r0 >= 16:
                raise ValueError("no more rows")
            return produce(r0, r1)
        if job.name in ("layers.1.attn.v", "layers.2.attn.k"):  # the first of them is named
            job.produce = failing

    with pytest.raises(ConvertError) as raised:
        convert(tmp_path, "model.rad", threads, breaking)
    assert str(raised.value) == "--synthetic llama: weight 'layers.1.attn.v': no more rows"
    assert list(tmp_path.glob("model.rad*")) == []


def test_a_failure_stops_the_weights_after_it_and_lets_those_before_it_end(tmp_path):
    blocks, begun = {}, threading.Event()  # weight -> row blocks produced; attn.o is under way
    names = []  # every weight, in order

    def breaking(job):
        produce, name = job.produce, job.name
        names.append(name)

        def counted(r0, r1):
            blocks[name] = blocks.get(name, 0) + 1
            if name == "layers.1.attn.o" and blocks[name] == 2:
                begun.set()
            if name == "layers.1.attn.v" and r0 >= 16:
                begun.wait(10)  # fails while the weight after it is mid-way
                raise ValueError("no more rows")
            if names.index(name) >= names.index("layers.1.attn.o") or name == "layers.1.attn.q":
                time.sleep(0.005)
            return produce(r0, r1)
        job.produce = counted

    with pytest.raises(ConvertError, match="weight 'layers.1.attn.v': no more rows"):
        convert(tmp_path, "model.rad", 4, breaking)
    assert list(tmp_path.glob("model.rad*")) == []
    assert 2 <= blocks["layers.1.attn.o"] < 96 // 8  # stopped at a row block
    assert blocks["layers.1.attn.q"] == 96 // 8  # an earlier weight runs to its end
    assert "layers.2.ffn.down" not in blocks and "output" not in blocks  # never begun
