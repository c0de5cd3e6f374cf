"""The engine's device path on the fake card: resolution on the device domain, weights, tables and
buffers on the card, the step inputs' single copy, launches in stream order, decode graphs captured
and replayed, and a library whose device code does not run on the card left out. The fake card's
'kernels' run libref's rows over its memory (tests/fixtures/fakedev.py), so the tokens must be the
host path's own, bit for bit."""

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from radiance.abi import NUMPY, RAD_OK, RadArgs, rad_tensor
from radiance.config import Config
from radiance.device.fake import FakeDevice
from radiance.engine.loading.registry import Registry
from radiance.engine.running.device import DeviceExecutor
from radiance.engine.running.executor import Executor
from radiance.engine.running.host import HostExecutor
from radiance.engine.selection.bands import SelectionError
from radiance.engine.selection.device_targets import runs_on
from radiance.generation.engine import Engine
from radiance.generation.sequence import SamplingParams
from radiance.generation.text import TextCodec
from radiance.ranks.worker import Worker

FIXTURE = Path(__file__).parent / "fixtures" / "fakedev.py"
PROMPTS = [list(range(1, 30)), [5, 9, 200, 17]]


def fused_chains() -> dict:
    """libref's fused ops and the chains they replace: the fake card offers each of them."""
    registry = Registry(radiance_home="", kernels="libref")
    try:
        return {row.op: row.info.replaces for library in registry.hierarchy if library.name == "libref"
                for row in library.rows if row.info.replaces}
    finally:
        registry.close()


def fake_home(tmp_path, build_target="fake", chain=False, fused=False) -> str:
    kernels = tmp_path / "home" / "kernels"
    kernels.mkdir(parents=True)
    source = FIXTURE.read_text().replace('BUILD_TARGET = "fake"', f'BUILD_TARGET = {build_target!r}')
    source = source.replace("CHAIN = False", f"CHAIN = {chain}")
    if fused:
        source = source.replace("REPLACES = {}", f"REPLACES = {fused_chains()!r}")
    (kernels / "fakedev.py").write_text(source)
    return str(tmp_path / "home")


def host_view(device, tensor):
    if tensor.data is None:
        return rad_tensor(None)
    shape = tuple(int(extent) for extent in tensor.shape[:tensor.ndim])
    return rad_tensor(device.view(tensor.data, int(np.prod(shape)), NUMPY[tensor.dtype]).reshape(shape))


def fake_card(registry) -> FakeDevice:
    """A FakeDevice whose one kernel runs the launching node's libref row on the card's memory."""
    fakedev = next(library for library in registry.hierarchy if library.name == "fakedev").module
    oracle = {row.op: row for library in registry.hierarchy if library.name == "libref" for row in library.rows}

    def body(device, launch):
        (launch_id,) = struct.unpack_from("<q", launch.args.data, 0)
        op, args = fakedev.LAUNCHES[launch_id]
        on_host = RadArgs(t=tuple(host_view(device, t) for t in args.t), params=args.params)
        assert oracle[op].info.launch(on_host) == RAD_OK

    return FakeDevice({"fakedev_launch": body}, device_bytes=1 << 30)


def generate(model, registry, device=None, **overrides):
    config = Config(model=str(model), accept_reference=True, progress=False, device="host", **overrides)
    worker = Worker(config, device=device, registry=registry).build()
    container = worker.model.container
    engine = Engine(config, worker.execute, TextCodec(container.tokenizer, container.chat_template, worker.model.hyper))
    sequences = [engine.add(prompt, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)) for prompt in PROMPTS]
    while engine.scheduler.has_work:
        engine.step()
    return [s.output_ids for s in sequences], worker


@pytest.fixture(scope="module")
def host_tokens(tiny_model):
    tokens, worker = generate(tiny_model, Registry(radiance_home="", kernels="libref"), max_seqs=2)
    assert isinstance(worker.executor, HostExecutor)  # no card: the host's, behind the one interface
    worker.close()
    return tokens


@pytest.mark.parametrize("graphs", [True, False])
def test_the_fake_card_gives_the_host_paths_tokens(tmp_path, tiny_model, host_tokens, graphs):
    registry = Registry(radiance_home=fake_home(tmp_path), kernels="fakedev,libref")
    device = fake_card(registry)
    tokens, worker = generate(tiny_model, registry, device, max_seqs=2, graphs=graphs)
    try:
        assert tokens == host_tokens
        assert {launch.band.row.plugin.name for launch, _, _ in worker.graph.issued()} == {"fakedev"}
        executor = worker.executor
        assert isinstance(executor, DeviceExecutor) and isinstance(executor, Executor)
        assert bool(executor._graphs) == graphs
        if graphs:
            assert all(tokens == seqs for tokens, seqs in executor._graphs)
        assert device.budget.used > 0
    finally:
        worker.close()
    assert device.budget.used == 0, "the executor gave back every allocation"


def test_a_decode_step_replays_its_graph_without_building_launches(tmp_path, tiny_model):
    registry = Registry(radiance_home=fake_home(tmp_path), kernels="fakedev,libref")
    device = fake_card(registry)
    _, worker = generate(tiny_model, registry, device, max_seqs=2)
    try:
        fakedev = next(library for library in registry.hierarchy if library.name == "fakedev").module
        known = len(fakedev.LAUNCHES)
        executor, inputs = worker.executor, worker.executor.inputs
        before = len(device.launches)
        assert (2, 2) in executor._graphs
        inputs["step.ids"][:2] = 7  # the last step's inputs otherwise: its slots are simply written again
        executor.run(2, 2)  # a decode shape seen before: a graph launch, no row launch is called
        assert len(fakedev.LAUNCHES) == known
        assert len(device.launches) - before == len(worker.graph.launches(2, 2))
    finally:
        worker.close()


def test_a_library_whose_device_code_does_not_run_on_the_card_is_left_out(tmp_path, tiny_model, capfd):
    registry = Registry(radiance_home=fake_home(tmp_path, build_target="hip"), kernels="fakedev,libref")
    config = Config(model=str(tiny_model), accept_reference=True, progress=False, device="host")
    worker = Worker(config, device=FakeDevice(), registry=registry)
    with pytest.raises(SelectionError) as error:
        worker.build()
    assert "device domain" in str(error.value) and "embedding" in str(error.value)
    said = [line for line in capfd.readouterr().err.splitlines() if "fakedev" in line]
    assert len(said) == 1 and "built for 'hip'" in said[0] and "fake fake_90" in said[0], said
    assert not any(row.info.domain == 2 for library in registry.hierarchy for row in library.rows)


@pytest.mark.parametrize("build_target,vendor,target,runs", [
    ("host cuda hip", "cuda", "sm_90", True), ("host cuda hip", "hip", "gfx942:sramecc+:xnack-", True),
    ("host", "cuda", "sm_90", False), ("sm_80 sm_90", "cuda", "sm_90", True), ("sm_80", "cuda", "sm_90", False),
    ("gfx942", "hip", "gfx942:sramecc+:xnack-", True), ("host cuda", "fake", "fake_90", False),
    ("host,sm_90", "cuda", "sm_90", True), ("sm_80, gfx942", "hip", "gfx942:sramecc+:xnack-", True),
    ("gfx10-3-generic", "hip", "gfx1036", True), ("gfx10-3-generic", "hip", "gfx1100", False),
    ("gfx9-4-generic", "hip", "gfx942:sramecc+:xnack-", True), ("gfx11-generic", "hip", "gfx1151", True),
])
def test_build_targets(build_target, vendor, target, runs):
    assert runs_on(build_target, vendor, target) is runs


def test_an_unknown_device_choice_is_refused(tiny_model):
    with pytest.raises(ValueError, match="device must be 'auto' or 'host'"):
        Config(model=str(tiny_model), device="gpu")


@pytest.mark.parametrize("graphs", [False, True])
def test_a_profiled_step_times_every_op_with_card_events_only_without_graphs(tmp_path, tiny_model, graphs):
    """Profiled with graphs off, each op runs alone and is timed; with graphs on (a server profiles its
    ranks for /metrics) a decode step stays one graph launch and times nothing."""
    registry = Registry(radiance_home=fake_home(tmp_path), kernels="fakedev,libref")
    device = fake_card(registry)
    _, worker = generate(tiny_model, registry, device, max_seqs=2, graphs=graphs)
    try:
        executor = worker.executor
        executor.profile = True
        before, graphs_before = len(device.launches), len(executor._graphs)
        executor.run(2, 2)
        assert len(device.launches) - before == len(worker.graph.launches(2, 2))  # each op once, either way
        if graphs:
            assert executor._graphs and len(executor._graphs) == graphs_before and not executor.op_seconds
        else:
            assert not executor._graphs
            assert set(executor.op_seconds) == {launch.node.op for launch in worker.graph.launches(2, 2)}
            assert all(seconds >= 0 for seconds in executor.op_seconds.values())
    finally:
        worker.close()


@pytest.mark.parametrize("chain", [True, False])
def test_chained_rows_are_programmatic_dependent_launches_where_asked(tmp_path, tiny_model, host_tokens, chain):
    registry = Registry(radiance_home=fake_home(tmp_path, chain=True), kernels="fakedev,libref")
    device = fake_card(registry)
    tokens, worker = generate(tiny_model, registry, device, max_seqs=2, chain=chain)
    try:
        assert tokens == host_tokens
        assert all(launch.band.row.chain for launch, _, _ in worker.graph.issued())
        assert {launch.programmatic for launch in device.launches} == {chain}
    finally:
        worker.close()


def test_a_scratch_hook_that_asks_for_nothing_gets_nothing(tmp_path, tiny_model):
    """An unsplit GEMV's hook answers 0: no allocation (a 1-byte one made the card's memset fail)."""
    registry = Registry(radiance_home=fake_home(tmp_path), kernels="fakedev,libref")
    fakedev = next(library for library in registry.hierarchy if library.name == "fakedev")
    gemm = next(row for row in fakedev.rows if row.op == "gemm")
    gemm.info.scratch = lambda geometry: 0
    rmsnorm = next(row for row in fakedev.rows if row.op == "rmsnorm")
    rmsnorm.info.scratch = lambda geometry: 6  # not a whole number of words
    device = fake_card(registry)
    _, worker = generate(tiny_model, registry, device, max_seqs=2)
    try:
        scratch = worker.executor._scratch
        bands = [launch.band for launch, _, _ in worker.graph.issued()]
        assert not any(id(band) in scratch for band in bands if band.row.op == "gemm")
        sizes = {scratch[id(band)][1] for band in bands if band.row.op == "rmsnorm"}
        assert sizes == {6}
        assert all(a.nbytes % 4 == 0 for a in worker.executor.memory.allocations)
    finally:
        worker.close()


def test_a_device_row_that_returns_an_error_fails_the_step_naming_the_node(tmp_path, tiny_model):
    from radiance.abi import RAD_E_INVALID
    from radiance.engine.running.executor import StepError

    registry = Registry(radiance_home=fake_home(tmp_path), kernels="fakedev,libref")
    device = fake_card(registry)
    _, worker = generate(tiny_model, registry, device, max_seqs=2, graphs=False)
    try:
        silu = next(launch.band.row for launch, _, _ in worker.graph.issued() if launch.band.row.op == "silu_mul")
        silu.info.launch = lambda args: RAD_E_INVALID
        with pytest.raises(StepError, match=r"node 'layers\.0\.ffn\.silu_mul': row fakedev:fakedev_silu_mul returned"):
            worker.executor.run(2, 2)
    finally:
        worker.close()


def test_fused_rows_on_the_fake_card_give_the_unfused_tokens_in_fewer_launches(tmp_path, tiny_model, host_tokens):
    registry = Registry(radiance_home=fake_home(tmp_path, fused=True), kernels="fakedev,libref")
    device = fake_card(registry)
    results = {}
    for fusion in (True, False):
        tokens, worker = generate(tiny_model, registry, device, max_seqs=2, fusion=fusion)
        try:
            launches = worker.graph.launches(2, 2)
            results[fusion] = (tokens, [launch.node.op for launch in launches])
        finally:
            worker.close()
    assert results[True][0] == results[False][0] == host_tokens
    fused_ops, plain_ops = results[True][1], results[False][1]
    # per layer: rmsnorm_gemm3, rope_attention, gemm_add, rmsnorm_gemm2_silu_mul, gemm_add; then the lm head
    assert fused_ops == ["embedding"] + ["rmsnorm_gemm3", "rope_attention", "gemm_add", "rmsnorm_gemm2_silu_mul",
                                         "gemm_add"] * 2 + ["take_rows_rmsnorm_gemm_sample"]
    assert len(plain_ops) == 1 + 14 * 2 + 4  # 14 plain ops a layer


class OnTheCard:
    """Run ahead over one worker on the fake card (submit/collect, each step run when collected, in
    order, as InProcessRanks runs them synchronously), noting for every step the ids the plan
    carried, the ids the card ran (its step inputs after the step) and the device copies the step
    made. Before each step the host's mirror of the card's token buffer is poisoned: a feed that
    read it, or an inputs copy that carried it over, would run wrong ids."""

    def __init__(self, worker, device):
        self.worker, self.device, self.held, self.steps = worker, device, [], []
        self.copies = 0
        copy = device._copy_device

        def counted(*args):
            self.copies += 1
            return copy(*args)

        device._copy_device = counted

    def submit(self, arrays, feed=None):
        self.held.append((arrays, feed))

    def collect(self):
        arrays, feed = self.held.pop(0)
        inputs = self.worker.executor.inputs
        inputs["step.tokens"][:] = -5
        before = self.copies
        tokens = self.worker.execute(arrays, feed)
        ran = self.device.view(inputs.device + inputs.offsets["step.ids"], len(arrays["step.ids"]), np.int32).copy()
        self.steps.append({"planned": arrays["step.ids"].copy(), "ran": ran, "feed": feed,
                           "copies": self.copies - before})
        return tokens


def generate_ahead(model, registry, device, **overrides):
    """generate()'s workload run ahead on the card; the tokens, the steps noted, the worker."""
    config = Config(model=str(model), accept_reference=True, progress=False, device="host", **overrides)
    worker = Worker(config, device=device, registry=registry).build()
    container = worker.model.container
    card = OnTheCard(worker, device)
    engine = Engine(config, worker.execute, TextCodec(container.tokenizer, container.chat_template, worker.model.hyper),
                    ahead=card)
    sequences = [engine.add(prompt, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)) for prompt in PROMPTS]
    while engine.scheduler.has_work:
        engine.step()
    return [s.output_ids for s in sequences], card.steps, worker


@pytest.mark.parametrize("graphs", [True, False])
def test_run_ahead_feeds_the_token_on_the_card(tmp_path, tiny_model, host_tokens, graphs):
    """The id each step runs is the synchronous path's, taken from the card's token buffer by a
    copy on the stream (one per run of consecutive sequences), while the plan carries placeholders."""
    registry = Registry(radiance_home=fake_home(tmp_path), kernels="fakedev,libref")
    device = fake_card(registry)
    tokens, steps, worker = generate_ahead(tiny_model, registry, device, max_seqs=2, graphs=graphs)
    try:
        assert tokens == host_tokens
        fed = [step for step in steps if step["feed"] is not None]
        assert len(fed) == len(steps) - 1  # every step after the prefill is fed
        # the synchronous path's ids: the prompts, then each step the tokens the step before sampled
        sync_ids = [PROMPTS[0] + PROMPTS[1]] + [[first, second] for first, second in zip(*host_tokens)][:7]
        assert [list(step["ran"]) for step in steps] == sync_ids
        for step in fed:
            assert list(step["planned"]) == [0, 0] and step["copies"] == len(step["feed"].runs()) == 1
        assert bool(worker.executor._graphs) == graphs
    finally:
        worker.close()
    assert device.budget.used == 0
