"""A card's executor: one card rank's resolved graph, every row a device row, launched in order on
the engine's stream. A step is one copy of its inputs to the card, the launches, one copy of the sampled tokens
back. A decode shape (as many tokens as sequences) is captured into a graph the second time it
runs (the first run compiles and warms every kernel), so from then on a decode step is one graph
launch per rank. Run ahead, a step's feed (generation/feed.py) copies the token buffer the last step's
sampler wrote into this step's ids, on the stream after the inputs' copy (which leaves the tokens
alone) and before the graph: the token never leaves the card to feed the next step.

Chained rows (`r4dchain`): on a card with programmatic dependent launch (NVIDIA Hopper) every kernel
such a row launches is a programmatic dependent launch, which the kernel's own prologue waits for
(`griddepcontrol.wait`): the next kernel is launched while the one before it drains, instead of
after it. Elsewhere, or with `--no-chain`, they launch in plain stream order.

Collective rows: the engine takes the link-gate hold by a store into the mapped gate word on the
stream just before the row's launch; a colour-2 kernel ends it itself once its peers' bytes have
landed, a colour-1 row has it ended by the engine's store after it. After the step the word must
read 0."""

from __future__ import annotations

import numpy as np

from radiance.abi import RAD_EXTENT_TOKENS, RAD_STEP_IDS, RAD_STEP_TOKENS, RadArgs, RadTensor, rad_tensor
from radiance.collectives.gate import LinkGateError
from radiance.engine.selection.resolve import Launch, ResolvedGraph

from .device_memory import DeviceMemory
from .device_stream import EngineStream
from .executor import MAX_CACHED_SHAPES, Executor, ShapePlans, check_status
from .rank_weights import RankWeights


class DeviceExecutor(Executor):
    def __init__(self, graph: ResolvedGraph, buffers: dict, tables: dict, weights: RankWeights, max_tokens: int,
                 max_seqs: int, num_slots: int, max_blocks: int, link, peers, device, graphs: bool = True,
                 chain: bool = True):
        """`weights` as the container maps them (RankWeights with load=False): each goes from the
        mapped file to the card on first use."""
        super().__init__()
        self.graph, self.weights, self.link, self.peers, self.device = graph, weights, link, peers, device
        self.graphs = graphs
        self.chain = chain and device.programmatic_launch
        self.stream = EngineStream(device)
        self.memory = DeviceMemory(device, link, buffers, tables, max_tokens,
                                   max_seqs, num_slots, max_blocks)
        self.inputs = self.memory.inputs
        self._gate = None  # (host word, device address) once a collective row needs it
        self._scratch = {}
        for resolution in graph.resolutions():
            resolution.instantiate()
            for band in resolution.bands:
                nbytes = int(band.row.info.scratch(dict(band.geometry))) if band.row.info.scratch else 0
                if nbytes > 0:  # a hook may say a band needs none (an unsplit GEMV)
                    self._scratch[id(band)] = (self.memory.zeros(nbytes, f"scratch {band.row.name}").ptr, nbytes)
        device.synchronize()  # scratch zeroed on the device's own stream
        self._plans = ShapePlans()  # (tokens, seqs) -> [(launch, args)]
        self._graphs: dict = {}  # (tokens, seqs) -> instantiated graph
        self._seen: set = set()
        self._events = []  # card events of a profiled step, one after each launch

    # ---- building a step's launches --------------------------------------------------------------
    def weight(self, name: str, band) -> RadTensor:
        return self.memory.weight(self.weights.operand(name, band.row, band.geometry), f"weight {name}")

    def _operand(self, name: str, band, tokens: int, seqs: int):
        if name == "":
            return rad_tensor(None)
        if name in self.inputs:
            return self.inputs.tensor(name, tokens, seqs)
        if name in self.memory.buffers:
            return self.memory.buffer(name, tokens, seqs)
        if name in self.memory.tables:
            return self.memory.tables[name]
        return self.weight(name, band)

    def _gate_address(self) -> int:
        if self._gate is None:
            word = self.link.gate.word
            self._gate = (word, self.device.map_host(word))
        return self._gate[1]

    def _build(self, launch: Launch, tokens: int, seqs: int):
        extent = tokens if launch.node.extent == RAD_EXTENT_TOKENS else seqs
        band = launch.band
        tensors = tuple(self._operand(name, band, tokens, seqs) for name in launch.node.operands)
        scratch, scratch_bytes = self._scratch.get(id(band), (None, 0))
        args = RadArgs(t=tensors, params={**band.geometry, launch.schema.params[0].name: extent}, scratch=scratch,
                       scratch_bytes=scratch_bytes, instance=band.instance, stream=self.stream, peers=self.peers,
                       link_gate=self._gate_address() if band.row.collective else None)
        return launch, args

    def _plan(self, tokens: int, seqs: int) -> list:
        """[(launch, args)] of one step shape, built once."""
        return self._plans.get((tokens, seqs), lambda: [self._build(launch, tokens, seqs)
                                                        for launch in self.graph.launches(tokens, seqs)])

    # ---- running a step -------------------------------------------------------------------------
    def _issue(self, plan: list, events=None) -> None:
        stream = self.stream
        for index, (launch, args) in enumerate(plan):
            row = launch.band.row
            if row.collective:
                stream.memset32(args.link_gate, 1, 1)  # the hold, taken where the stream reaches the row
            stream.programmatic = self.chain and row.chain
            status = row.info.launch(args)
            stream.programmatic = False
            if row.collective == 1:
                stream.memset32(args.link_gate, 0, 1)
            check_status(launch, row, status)
            if events is not None:
                self.device.record(events[index + 1], stream.handle)

    def run(self, tokens: int, seqs: int, feed=None) -> None:
        """The feed's ids are taken from the card's token buffer, where the last step's sampler left
        them. Profiled with graphs off, each op is timed by card events; with graphs on a step stays
        one graph launch (a server profiles its ranks for /metrics: that must not cost it its graphs),
        and no op is timed."""
        device, handle, key = self.device, self.stream.handle, (tokens, seqs)
        inputs = self.inputs
        device.copy_to_device(inputs.device, inputs.block[:inputs.sent], handle)
        if feed is not None:
            ids, sampled = inputs.device + inputs.offsets[RAD_STEP_IDS], inputs.device + inputs.offsets[RAD_STEP_TOKENS]
            for target, source, count in feed.runs():  # 4-byte ids and tokens (int32)
                self.stream.copy(ids + 4 * target, sampled + 4 * source, 4 * count)
        if self.profile and not self.graphs:
            self._run_profiled(self._plan(tokens, seqs))
        elif key in self._graphs:
            device.launch_graph(self._graphs[key], handle)
        elif self.graphs and tokens == seqs and key in self._seen and len(self._graphs) < MAX_CACHED_SHAPES:
            device.begin_capture(handle)
            try:
                self._issue(self._plan(tokens, seqs))
            finally:
                graph = device.end_capture(handle)
            self._graphs[key] = device.instantiate(graph)
            device.launch_graph(self._graphs[key], handle)
        else:
            self._issue(self._plan(tokens, seqs))
            self._seen.add(key)
        tokens_out = self.inputs[RAD_STEP_TOKENS][:seqs]
        device.copy_to_host(tokens_out, self.inputs.device + self.inputs.offsets[RAD_STEP_TOKENS], handle)
        device.synchronize(handle)
        if self._gate is not None and self._gate[0][0] != 0:
            held = [f"{launch.band.row.plugin.name}:{launch.band.row.name}" for launch, _ in self._plan(tokens, seqs)
                    if launch.band.row.collective]
            raise LinkGateError(f"the link gate is still held after the step: a colour-2 device row ({', '.join(held)}) "
                                f"must store 0 into RadArgs.link_gate once its peers' bytes have landed")

    def _run_profiled(self, plan: list) -> None:
        while len(self._events) < len(plan) + 1:
            self._events.append(self.device.event())
        events = self._events
        self.device.record(events[0], self.stream.handle)
        self._issue(plan, events)
        self.device.synchronize(self.stream.handle)
        for index, (launch, _) in enumerate(plan):
            self.op_seconds[launch.node.op] += self.device.elapsed_ms(events[index], events[index + 1]) / 1e3

    def read_buffer(self, name: str, rows: int) -> np.ndarray:
        return self.memory.read_buffer(name, rows)

    def write_buffer(self, name: str, rows: np.ndarray) -> None:
        self.memory.write_buffer(name, rows)

    def release(self) -> None:
        self.device.synchronize(self.stream.handle)
        for resolution in self.graph.resolutions():
            resolution.release()
        if self._gate is not None:
            try:
                self.device.unmap_host(self._gate[0])
            except Exception:  # the rank closed its shared memory first (ranks/session.py): nothing to undo
                pass
            self._gate = None
        self.memory.release()
