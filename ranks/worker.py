"""One rank's share of the work: its slice of the model, its resolved graph and the executor
that runs it. The same class serves TP 1 in process and every rank process of a launch, on the host
rows or, where the process was given a card, on the device rows (the device domain)."""

import time

import numpy as np

from radiance.abi import RAD_DOMAIN_DEVICE, RAD_DOMAIN_HOST, RAD_EXTENT_SEQS, RAD_EXTENT_TOKENS, RAD_STEP_CONTEXT_LENS, RAD_STEP_IDS, RAD_STEP_TOKENS
from radiance.collectives.gate import LinkGate, LinkScheduler
from radiance.config import Config
from radiance.engine.loading.model import open_model
from radiance.engine.loading.registry import Registry
from radiance.engine.running import open_executor
from radiance.engine.selection.device_targets import leave_out_foreign_device_code
from radiance.engine.selection.resolve import resolve_graph
from radiance.engine.selection.shard import Shard, elide_collectives, shard_buffers, shard_nodes
from radiance.engine.selection.stages import Stage, cut_stages, stage_nodes, used_buffers
from radiance.generation.feed import Feed
from radiance.generation.micro_batches import feed_part, gather_tokens, split_plan
from radiance.log import get_logger

from .facts import chain_fact
from .fed_tokens import FedTokens

log = get_logger("radiance.worker")


COLLECTIVE_OPS = ("all_reduce", "all_gather")


class Worker:
    """Opened in two steps, so a rank can size its collective buffers from the graph before it
    resolves: Worker(config, shard) loads the plugins, opens and declares; build() resolves and loads."""

    def __init__(self, config: Config, shard: Shard = Shard(0, 1), device=None, registry: Registry | None = None,
                 stage: Stage = Stage(0, 1), architecture: str | None = None):
        """`device`: the card to run on (a radiance.device Device); None opens the card this
        process sees when config.device is 'auto', and runs on the host where it sees none.
        `registry`: the plugins, loaded already (a test's own); None loads them from config's homes.
        `stage`: this rank's pipeline stage (radiance/engine/selection/stages.py). `architecture`:
        the one that declares the graph, where not the container's (a model's MTP heads)."""
        self.config, self.shard, self.stage = config, shard, stage
        self.device, self._own_device = device, False
        self.last_seqs = 0  # tokens the last step sampled, which the next step's feed may read
        self.started = 0.0  # when the last step's inputs were written and it began to run
        if device is None and config.device == "auto":
            from radiance.device.selection import open_device

            self.device = open_device()
            self._own_device = self.device is not None
        self.registry = registry if registry is not None else Registry(config.radiance_home, config.kernels)
        self.model = open_model(config, self.registry, architecture, card=self.device is not None)
        schemas = {op: entry.schema for op, entry in self.registry.ops.items()}
        self.cut = cut_stages(self.model.graph, schemas, self.model.weights, stage.count)[stage.index]
        # the parts each step is cut into (generation/micro_batches.py): config's, else one a stage
        self.micro_batches = config.micro_batches or stage.count
        self.shown = None  # {buffer: rows} of config.return_buffer's buffers, where the last step ran in parts
        self.parts = 0  # the micro-batches the last step ran
        # Run ahead in parts or over stages: the last step's tokens (fed_tokens.py), and where this
        # rank sends its own (a rank of the last stage, to the first: collectives/token_pipe.py)
        self.fed, self.tokens_out = FedTokens(), None
        self.whole = self.takes_whole_plans  # read every plan (execute_record), so once

    def boundary_bytes(self) -> int:
        """The largest message of this stage's recv (the pipe it receives through)."""
        if self.cut.receives is None:
            return 0
        buffer = next(b for b in self.model.graph.buffers if b.name == self.cut.receives)
        rows = self.config.max_step_tokens if buffer.extent == RAD_EXTENT_TOKENS else self.config.max_seqs
        return rows * buffer.cols * 4

    def collective_bytes(self) -> int:
        """The largest message any collective of the graph moves, whole (before any split)."""
        largest = 0
        for node in self.model.graph.nodes:
            if node.op in COLLECTIVE_OPS:
                rows = self.config.max_step_tokens if node.extent == RAD_EXTENT_TOKENS else self.config.max_seqs
                largest = max(largest, rows * node.params["n"] * 4)
        return largest

    def collective_wire(self) -> str:
        """What the device all-reduces move: config.collective_wire, or for "auto" bf16 when every
        projection (gemm) weight the graph reads is bf16, as a bf16 model's activations would be in
        another engine's hands, else f32 (docs/COLLECTIVES.md, "The row family")."""
        if self.config.collective_wire != "auto":
            return self.config.collective_wire
        formats = {node.params.get("wdtype") for node in self.model.graph.nodes if node.op == "gemm"}
        return "bf16" if formats == {"bf16"} else "f32"

    def build(self, facts: dict | None = None, peers=None, link: LinkScheduler | None = None,
              pipes: dict | None = None) -> "Worker":
        """`pipes`: the RadPeers of this stage's boundaries, {"recv": ..., "send": ...}."""
        self.link = link or LinkScheduler(LinkGate())
        try:
            if facts is None:  # one rank in process: nothing to probe
                facts = {"device.p2p": 0, "device.chain": chain_fact(self.config.chain, self.device)}
            self._build(self.registry, facts, peers, pipes or {})
        except BaseException:
            self.model.close()
            self._close_device()
            raise
        return self

    def _build(self, registry: Registry, facts: dict, peers, pipes: dict) -> None:
        config, device = self.config, self.device
        nodes = shard_nodes(self.model.graph, self.shard)
        buffers = shard_buffers(self.model.graph, self.shard)
        if self.stage.count > 1:
            if device is not None:
                raise RuntimeError(f"--pp {self.stage.count}: pipeline stages run on host ranks only so far "
                                   "(--device host)")
            nodes = stage_nodes(nodes, buffers, self.cut, self.stage)  # the cut counts the whole graph's nodes
        if self.shard.world == 1:
            nodes = elide_collectives(nodes)
        if self.stage.count > 1:
            buffers = used_buffers(nodes, buffers)
        self.buffer_names = set(buffers)  # a stage holds only those its nodes touch
        self.returned_names = [name for name in self.config.returned_buffers if name in self.buffer_names]
        self.extents = {buffer.name: buffer.extent for buffer in self.model.graph.buffers}  # read every step
        if device is not None:
            leave_out_foreign_device_code(registry, device.vendor, device.target, log if self.shard.rank == 0 else None)
        domain = RAD_DOMAIN_HOST if device is None else RAD_DOMAIN_DEVICE
        self.graph = resolve_graph(nodes, registry, facts, domain, config.max_step_tokens, config.max_seqs,
                                   config.accept_reference, config.fusion)
        self.digest = self.graph.digest()
        self.step_limits = (self.graph.max_extent[RAD_EXTENT_TOKENS], self.graph.max_extent[RAD_EXTENT_SEQS])
        self.lines = self.graph.lines()
        tables = {table.name: table.table for table in self.model.graph.tables}
        self.executor = open_executor(self.graph, self.model, self.shard, buffers, tables, config, self.link, peers,
                                      device)
        self.executor.pipes = pipes
        self._load_weights()

    def _load_weights(self) -> None:
        """Every weight in the form its rows read, where they read it, now, so the first step does
        no loading."""
        planes = self.executor.weights.planes
        uses = list({(name, id(launch.band)): (name, launch.band) for launch, _, _ in self.graph.issued()
                     for name in launch.node.operands if name in planes}.values())
        if self.config.progress and self.shard.rank == 0:  # the bar: rank 0's, where stderr is a terminal
            from tqdm import tqdm  # here, not at import: it reads package metadata (0.1-0.2 s a process)

            uses = tqdm(uses, desc="loading weights", unit="weight", disable=None, leave=False)
        for name, band in uses:
            self.executor.weight(name, band)

    def execute(self, arrays: dict, feed: Feed | None = None) -> np.ndarray:
        """Run one step from its plan arrays; the sampled token of every sequence. `feed`: ids this
        step takes from the tokens of the step this worker ran last (generation/feed.py), which
        the executor copies where they are (the card's token buffer, or the host's). As a pipeline
        stage, or where asked, the step is cut into micro-batches, run one after another (so the
        stages overlap), and the feed is written on the host, part by part (ranks/fed_tokens.py)."""
        seqs = len(arrays[RAD_STEP_CONTEXT_LENS])
        self.shown, self.parts = None, 1
        if self.micro_batches == 1 and self.stage.count == 1:
            return self._run(arrays, feed)
        if feed is not None:
            feed.check(len(arrays[RAD_STEP_IDS]), len(self.fed))
            arrays = {**arrays, RAD_STEP_IDS: arrays[RAD_STEP_IDS].copy()}  # a plan read from a ring is read-only
        batches = split_plan(arrays, self.micro_batches)
        self.parts = len(batches)
        sampled, shown = [], []
        for batch in batches:
            if feed is not None:
                feed_part(batch, feed, self.fed)
            got = self._run(batch.arrays, None)
            sampled.append(got)
            if self.tokens_out is not None:  # the last stage: the part's tokens to the first stage
                self.tokens_out.send(np.stack([batch.sequences[batch.kept], got[batch.kept]], axis=1))
            shown.append({name: self._part_rows(batch, name) for name in self.config.returned_buffers
                          if name in self.buffer_names})
        tokens = gather_tokens(batches, sampled, seqs)
        self.fed.ran(tokens, len(batches))
        if shown and shown[0]:
            self.shown = {name: np.concatenate([part[name] for part in shown]) for name in shown[0]}
        return tokens

    @property
    def takes_whole_plans(self) -> bool:
        """Whether execute_record runs every plan whole from the step inputs (no micro-batches, no
        stages), so the plans' reader writes each there as it takes it (PlanReader's `whole`)."""
        return self.micro_batches == 1 and self.stage.count == 1

    @property
    def takes_fed_plans(self) -> bool:
        """Whether the plans' reader may apply a plan's feed as it takes it: whole plans, on the host
        executor (which takes a feed from the step inputs' sampled tokens; a card takes it on the card)."""
        return self.takes_whole_plans and self.device is None

    def execute_record(self, plan, reader) -> np.ndarray:
        """`execute` for a plan read from the plans ring (generation/plan_record.py's Plan, and the
        PlanReader over this worker's step inputs that decoded it): in one part, the reader has
        written its arrays into the step inputs (and applied its feed, where it takes fed plans)."""
        if self.whole:
            feed = plan.feed
            if feed is not None:
                feed.check(plan.tokens, self.last_seqs)
            self.shown, self.parts = None, 1
            return self._step(plan.tokens, plan.seqs, feed)
        return self.execute(reader.arrays(plan), plan.feed)

    def _run(self, arrays: dict, feed: Feed | None) -> np.ndarray:
        inputs = self.executor.inputs
        tokens, seqs = len(arrays[RAD_STEP_IDS]), len(arrays[RAD_STEP_CONTEXT_LENS])
        if feed is not None:
            feed.check(tokens, self.last_seqs)
        for name, array in arrays.items():
            target = inputs[name]
            target[tuple(slice(0, extent) for extent in array.shape)] = array
        return self._step(tokens, seqs, feed)

    def _step(self, tokens: int, seqs: int, feed: Feed | None) -> np.ndarray:
        """The step whose inputs are written; its sampled tokens."""
        self.started = time.perf_counter()  # its inputs written: where a plan's delivery ends
        inputs = self.executor.inputs
        self.last_seqs = 0  # a step that fails leaves nothing to feed from
        self.executor.run(tokens, seqs, feed)
        self.last_seqs = seqs
        return inputs[RAD_STEP_TOKENS][:seqs].copy()

    def returned(self, tokens: int, seqs: int) -> dict:
        """The rows of config.return_buffer's buffers after a step of `tokens` tokens and `seqs`
        sampled rows: a buffer's rows follow its extent (a step run in parts: the parts' rows put together)."""
        names = self.returned_names
        if not names:
            return {}
        rows = {name: tokens if self.extents.get(name) == RAD_EXTENT_TOKENS else seqs for name in names}
        if self.shown is not None:
            return {name: self.shown[name][:rows[name]].copy() for name in names}
        return {name: self.executor.read_buffer(name, rows[name]) for name in names}

    def returned_bytes(self) -> int:
        """The most bytes `returned` gives."""
        return sum(array.nbytes for array in self.returned(self.config.max_step_tokens, self.config.max_seqs).values())

    def _part_rows(self, batch, name: str) -> np.ndarray:
        """A returned buffer's rows of one part: a row a token, or the kept pieces' rows."""
        if self.extents.get(name) == RAD_EXTENT_TOKENS:
            return self.executor.read_buffer(name, len(batch.arrays[RAD_STEP_IDS]))
        return self.executor.read_buffer(name, len(batch.kept))[batch.kept]

    def close(self) -> None:
        self.executor.release()
        self.link.close()
        self.model.close()
        self._close_device()

    def _close_device(self) -> None:
        if self._own_device and self.device is not None:
            self.device.close()
            self.device = None
