"""The host's executor: one rank's resolved graph run in this process's memory. Buffers are
allocated once at their largest; a step's launch plan (every launch's row and RadArgs, fused rows
where they serve, and which runs of concurrent rows overlap) is built once per (tokens, seqs) shape
and reused, so a decode step costs one dict lookup and then only launches."""

import time

import numpy as np

from radiance.abi import (
    NUMPY, RAD_EXTENT_SEQS, RAD_EXTENT_SLOTS, RAD_EXTENT_TOKENS, RAD_STEP_IDS, RAD_STEP_TOKENS, RadArgs, RadTensor,
    rad_tensor,
)
from radiance.collectives.chain import ChainWords
from radiance.collectives.gate import LinkScheduler
from radiance.engine.selection.resolve import Launch, ResolvedGraph

from .executor import Executor, ShapePlans, check_status
from .overlap import Overlap, runs
from .rank_weights import RankWeights
from .step_inputs import StepInputs


class HostExecutor(Executor):
    pipes: dict = {}  # op ("send", "recv") -> the RadPeers of this stage's boundary (the Worker sets it)
    def __init__(self, graph: ResolvedGraph, buffers: dict, tables: dict, weights: RankWeights,
                 max_tokens: int, max_seqs: int, num_slots: int, max_blocks: int, link: LinkScheduler, peers=None):
        """`weights` copied into this process (RankWeights with load=True), or None for a graph
        that reads none."""
        super().__init__()
        self.graph, self.weights, self.tables, self.peers, self.link = graph, weights, tables, peers, link
        # Word 0 counts the launches done this step: a chained row waits in its prologue for the
        # launch before it and bumps the count itself (RadChainRec).
        self.chain = ChainWords.local(1)
        self._done = self.chain.word(0)  # word 0's view, taken once: every launch stores into it
        self.max_tokens, self.max_seqs = max_tokens, max_seqs
        self.inputs = StepInputs(max_tokens, max_seqs, max_blocks)
        rows = {RAD_EXTENT_TOKENS: max_tokens, RAD_EXTENT_SEQS: max_seqs, RAD_EXTENT_SLOTS: num_slots}
        self.buffers = {b.name: np.zeros((rows[b.extent], b.cols), NUMPY[b.dtype]) for b in buffers.values()}
        self.extents = {b.name: b.extent for b in buffers.values()}
        self._scratch = {}
        for resolution in graph.resolutions():
            resolution.instantiate()
            for band in resolution.bands:
                if band.row.info.scratch:
                    self._scratch[id(band)] = np.zeros(int(band.row.info.scratch(dict(band.geometry))), np.uint8)
        self._plans = ShapePlans()  # (tokens, seqs) -> [(first index, [(launch, args), ...]), ...]
        self.overlap = Overlap()

    def weight(self, name: str, band) -> RadTensor:
        return self.weights.operand(name, band.row, band.geometry)

    def _operand(self, name: str, band, tokens: int, seqs: int):
        if name == "":
            return rad_tensor(None)
        if name in self.inputs:
            return rad_tensor(self.inputs.view(name, tokens, seqs))
        if name in self.buffers:
            extent = self.extents[name]
            rows = {RAD_EXTENT_TOKENS: tokens, RAD_EXTENT_SEQS: seqs}.get(extent)
            return rad_tensor(self.buffers[name] if rows is None else self.buffers[name][:rows])
        if name in self.tables:
            return self.tables[name]
        return self.weight(name, band)

    def _build(self, launch: Launch, tokens: int, seqs: int) -> tuple:
        extent = tokens if launch.node.extent == RAD_EXTENT_TOKENS else seqs
        band = launch.band
        tensors = tuple(self._operand(name, band, tokens, seqs) for name in launch.node.operands)
        params = {**band.geometry, launch.schema.params[0].name: extent}
        scratch = self._scratch.get(id(band))
        peers = self.pipes.get(launch.node.op, self.peers)  # a stage boundary's send or recv: its pipe
        args = RadArgs(t=tensors, params=params, scratch=scratch,
                       scratch_bytes=0 if scratch is None else scratch.size, instance=band.instance, peers=peers)
        return launch, args

    def run(self, tokens: int, seqs: int, feed=None) -> None:
        """The feed's ids are taken from the tokens the last step sampled, which the step inputs
        still hold (a plan never writes the sampled tokens)."""
        if feed is not None:
            feed.apply(self.inputs[RAD_STEP_IDS], self.inputs[RAD_STEP_TOKENS])
        plan = self._plans.get((tokens, seqs), lambda: self._plan(tokens, seqs))
        self._done[0] = 0
        for index, group in plan:
            if len(group) == 1:
                self._launch(index, *group[0])
                continue
            # concurrent rows on independent operands: all but the last on the pool
            futures = [self.overlap.pool.submit(self._launch, index + i, *launch) for i, launch in enumerate(group[:-1])]
            self._launch(index + len(group) - 1, *group[-1])
            for future in futures:
                future.result()

    def _plan(self, tokens: int, seqs: int) -> list:
        launches = self.graph.launches(tokens, seqs)
        built = [self._build(launch, tokens, seqs) for launch in launches]
        return [(index, built[index:index + count]) for index, count in runs(launches)]

    def _launch(self, index: int, launch: Launch, args) -> None:
        row = launch.band.row
        start = time.perf_counter() if self.profile else 0.0
        if row.chain:
            args.chain = self.chain.record(0, index, 0, index + 1)
        if row.collective:
            status = self.link.launch_collective(row.info.launch, args, row.collective, f"{row.plugin.name}:{row.name}")
        else:
            status = row.info.launch(args)
        if self.profile:
            self.op_seconds[launch.node.op] += time.perf_counter() - start
        check_status(launch, row, status)
        if not row.chain:
            self._done[0] = index + 1

    def read_buffer(self, name: str, rows: int) -> np.ndarray:
        return self.buffers[name][:rows].copy()

    def write_buffer(self, name: str, rows: np.ndarray) -> None:
        self.buffers[name][:len(rows)] = rows

    def release(self) -> None:
        self.overlap.close()
        for resolution in self.graph.resolutions():
            resolution.release()
