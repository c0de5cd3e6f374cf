"""An architecture plugin in C (tests/fixtures/c_arch/ctiny.c): its check and declare hooks through
the .so loader, and a model of its architecture generating through the engine."""

import subprocess
from pathlib import Path

import numpy as np
import pytest

from radiance.abi import HEADERS_DIR, RAD_EXTENT_SEQS, RAD_SPLIT_ROWS, RadWeightInfo
from radiance.config import Config
from radiance.engine.loading.registry import Registry
from radiance.generation.engine import Engine
from radiance.generation.sequence import SamplingParams
from radiance.ranks.worker import Worker
from radiance.weights.container_writer import ContainerWriter
from radiance.weights.formats import plain

SOURCE = Path(__file__).parent / "fixtures" / "c_arch" / "ctiny.c"
HIDDEN, VOCAB = 16, 40


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("c_arch")
    (home / "architectures").mkdir()
    subprocess.run(["gcc", "-std=gnu11", "-shared", "-fPIC", "-Wall", "-Werror", "-I", str(HEADERS_DIR), "-o",
                    str(home / "architectures" / "ctiny.so"), str(SOURCE)], check=True, capture_output=True)
    return home


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    rng = np.random.default_rng(4)
    embedding = rng.normal(0, 1, (VOCAB, HIDDEN)).astype(np.float32)
    norm = rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32)
    path = tmp_path_factory.mktemp("c_arch_model") / "ctiny.rad"
    with ContainerWriter(path, "ctiny", {"hidden": HIDDEN, "vocab": VOCAB, "rms_eps": 1e-5, "context": 64}) as writer:
        writer.declare("token_embd", (VOCAB, HIDDEN), plain("f32"), {"codes": embedding.nbytes})
        writer.declare("output_norm", (HIDDEN,), plain("f32"), {"codes": norm.nbytes})
        writer.write("token_embd", "codes", embedding.view(np.uint8))
        writer.write("output_norm", "codes", norm.view(np.uint8))
    return path, embedding, norm


def test_the_c_architecture_checks_and_declares(home):
    registry = Registry(str(home))
    try:
        architecture, plugin = registry.architectures["ctiny"]
        assert plugin.path == home / "architectures" / "ctiny.so"
        assert architecture.check({"hidden": 16, "vocab": 40}) == "no 'rms_eps' among the hyper-parameters"
        assert architecture.check({"hidden": 0, "vocab": 40, "rms_eps": 1e-5}) == "hidden is 0"
        assert architecture.check({"hidden": 16, "vocab": 40, "rms_eps": 1e-5, "name": "x", "flag": True}) == ""
        graph = architecture.declare({"hidden": 16, "vocab": 40, "rms_eps": 1e-5},
                                     {"token_embd": RadWeightInfo("token_embd", 40, 16, "f32")})
        assert [node.op for node in graph.nodes] == ["embedding", "take_rows", "rmsnorm", "gemm", "sample"]
        head = graph.nodes[3]
        assert head.params == {"N": 40, "K": 16, "wdtype": "f32", "dtype": "f32"} and head.split == "N"
        assert head.operands == ("xs", "lm_head", "logits") and head.extent == RAD_EXTENT_SEQS
        assert graph.nodes[2].params["eps"] == 1e-5
        assert [(w.name, w.source, w.split) for w in graph.weights][2] == ("lm_head", "token_embd", RAD_SPLIT_ROWS)
        assert graph.tables[0].name == "unused.scales" and graph.tables[0].table.data.tolist() == [1.0, 2.0]
        assert [(b.name, b.cols) for b in graph.buffers] == [("h", 16), ("hs", 16), ("xs", 16), ("logits", 40)]
    finally:
        registry.close()


class NoText:
    stop_ids = ()


def test_a_model_of_the_c_architecture_generates(home, model):
    path, embedding, norm = model
    config = Config(model=str(path), radiance_home=str(home), kernels="libref", accept_reference=True, progress=False)
    worker = Worker(config).build()
    try:
        engine = Engine(config, worker.execute, NoText())
        sequence = engine.add([3, 5], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
        while engine.scheduler.has_work:
            engine.step()
    finally:
        worker.close()
    expected, token = [], 5
    for _ in range(5):
        x = embedding[token]
        normed = (x / np.sqrt(np.mean(x * x) + 1e-5)) * norm
        token = int(np.argmax(embedding @ normed))
        expected.append(token)
    assert sequence.output_ids == expected
