"""plugins/q4_0, a quantiser in C, built with cmake out of tree and loaded from a home: it writes
the core's q4_0 encoding, its rows decode to what gguf-py's Q4_0 gives bit for bit, and a model a
recipe quantises with it converts and serves a generation."""

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import quants

from radiance.config import Config
from radiance.convert.api import convert_synthetic
from radiance.convert.quantizers import Quantizers
from radiance.convert.synthetic import LlamaShape
from radiance.generation.engine import Engine
from radiance.generation.sequence import SamplingParams
from radiance.generation.text import TextCodec
from radiance.ranks.worker import Worker
from radiance.weights.container_reader import open_container
from radiance.weights.decode import decode
from radiance.weights.formats import q4_0
from radiance.weights.labels import format_label

SOURCE = Path(__file__).resolve().parent.parent / "plugins" / "q4_0"


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    folder = tmp_path_factory.mktemp("q4_0")
    cmake_dir = subprocess.run([sys.executable, "-m", "radiance.tools.config", "--cmakedir"], check=True,
                               capture_output=True, text=True).stdout.strip()
    for step in (["cmake", "-S", str(SOURCE), "-B", str(folder / "build"), f"-Dradiance_DIR={cmake_dir}",
                  f"-DRAD_PLUGIN_INSTALL_HOME={folder / 'home'}"],
                 ["cmake", "--build", str(folder / "build")], ["cmake", "--install", str(folder / "build")]):
        result = subprocess.run(step, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
    return folder / "home"


def test_the_c_quantiser_writes_the_q4_0_encoding_as_gguf_quantises(home):
    with Quantizers(str(home)) as found:
        quantizer = found.by_name["q4_0"]
        assert quantizer.path == home / "quantizers" / "q4_0.so"
        info = quantizer.info
        rows = np.random.default_rng(5).normal(0, 0.02, (6, 256)).astype(np.float32)
        rows[1, 3] = 0.5  # an outlier sets its group's scale
        rows[2, :64] = 0  # an all-zero group: scale 0
        for group in (32, 64):
            encoding = info.encoding("w", (6, 256), {"group": group})
            assert encoding == q4_0(group)
        encoding = info.encoding("w", (6, 256), {"group": 32})
        assert format_label(encoding) == "q4_0"
        assert info.row_block(encoding, (6, 256)) == 0
        planes = info.quantize(encoding, rows, 0, {"group": 32})
        assert sorted(planes) == ["codes", "scale", "zero"] and planes["zero"].tolist() == [[8]]
        ours = decode(encoding, planes, (6, 256))
        theirs = quants.dequantize(quants.quantize(rows, gguf.GGMLQuantizationType.Q4_0), gguf.GGMLQuantizationType.Q4_0)
        assert ours.tobytes() == theirs.astype(np.float32).tobytes()
        assert info.decode is None  # the core decodes affine itself


def test_a_model_quantised_by_the_c_quantiser_converts_and_serves(home, tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[rule]]\nmatch = "re:layers\\\\.[0-9]+\\\\.(attn|ffn)\\\\..*"\nquantizer = "q4_0"\n')
    path = tmp_path / "model.rad"
    errors = convert_synthetic(path, LlamaShape(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=320,
                                                context=256), seed=11, recipe=str(recipe), radiance_home=str(home))
    quantised = [error for error in errors if error.method.startswith("q4_0")]
    assert len(quantised) == 2 * 7 and all(error.relative < 0.2 for error in quantised)
    with open_container(path) as container:
        assert format_label(container.encoding("layers.0.attn.q")) == "q4_0"
    config = Config(model=str(path), radiance_home=str(home), kernels="libref", accept_reference=True, progress=False)
    worker = Worker(config).build()
    try:
        engine = Engine(config, worker.execute, TextCodec(worker.model.container.tokenizer, None, worker.model.hyper))
        sequence = engine.add([1, 2, 3], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
        while engine.scheduler.has_work:
            engine.step()
        assert len(sequence.output_ids) == 4
    finally:
        worker.close()
