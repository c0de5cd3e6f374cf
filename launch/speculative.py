"""The ranks of speculative decoding: the model's ranks as open_ranks gives them (in process or
launched), opened to take a verify step (k + 1 sampled rows a sequence) and to hand back its logits
(and, for MTP heads, its hidden state RAD_HIDDEN); the draft in this process (TP 1, on the card the
model's in-process rank has, else on the host): the draft model (--draft-model), or the model's own
multi-token-prediction heads (`heads`: the architecture that declares them, launch/mtp.py); and
the two speculative ops, mtp_couple_propose and mtp_couple_verify, run by OpRunner with the rows the
engine selects for them from the kernel hierarchy (plugins/spechub's, or any library's that serves
them). engine_over gives a SpeculativeEngine over these (an MtpEngine over heads)."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np

from radiance.abi import RAD_HIDDEN, RAD_MTP_HIDDEN, RAD_MTP_PREVIOUS
from radiance.config import Config, ConfigError
from radiance.engine.loading.model import open_model
from radiance.engine.loading.registry import Registry
from radiance.engine.running.op_runner import OpRunner
from radiance.engine.selection.bands import SelectionError
from radiance.log import get_logger
from radiance.ranks.worker import Worker

from .ranks import Ranks

log = get_logger("radiance.speculative")
SAMPLE_OP = "sample"


def sampler(graph, path: str) -> tuple[str, int]:
    """(the buffer a model's sample node reads its logits from, the vocabulary), from its graph."""
    for node in graph.nodes:
        if node.op == SAMPLE_OP:
            return node.operands[0], int(node.params["vocab"])
    raise ConfigError(f"{path}: its graph has no '{SAMPLE_OP}' node, so no logits to speculate with")


class DraftOpsUnavailable(ConfigError):
    """No row may serve the draft's propose/verify ops here (none declared for this domain, or only
    reference rows without --debug-accept-reference-kernels); `reason`: the selection's own words."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


class SpeculativeRanks(Ranks):
    run_ahead = False

    def __init__(self, config: Config, heads: str | None = None):
        """`heads`: the architecture of the model's MTP heads, which draft; None: config.draft_model."""
        from . import open_ranks

        self.config, self.k, self.heads = config, config.draft_tokens, heads
        self.flag = "--draft-model" if heads is None else "MTP heads"  # how errors name the draft
        self.registry = Registry(config.radiance_home, config.kernels)
        self.target = self.draft = None
        self.runners: list[OpRunner] = []
        self.kept = self.drafted = 0
        try:
            self._open(config, open_ranks)
        except BaseException:
            self.close(failed=True)
            raise

    def _open(self, config: Config, open_ranks) -> None:
        model = open_model(config, self.registry)
        try:
            self.logits_name, vocab = sampler(model.graph, config.model)
        finally:
            model.close()
        rows = config.max_seqs * (self.k + 1)  # a verify step samples every token of every sequence
        returned = self.logits_name if self.heads is None else f"{self.logits_name},{RAD_HIDDEN}"
        self.target_config = dataclasses.replace(
            config, draft_model=None, mtp=False, max_seqs=rows, max_step_tokens=max(config.max_step_tokens, rows),
            num_blocks=config.num_blocks, return_buffer=returned, run_ahead=False)
        self.target = open_ranks(self.target_config)
        self.world, self.digest, self.lines, self.text = self.target.world, self.target.digest, self.target.lines, self.target.text
        self.step_limits = self.target.step_limits  # the verify steps' decoder does not cut on them yet
        worker = getattr(self.target, "worker", None)
        device = worker.device if worker is not None else None  # in process: the same card
        # the heads' steps: a plain step's tokens, or a verify step's kept ones (k + 1 a sequence at most)
        draft_config = dataclasses.replace(
            config, model=config.draft_model or config.model, draft_model=None, mtp=False, tp=1, launched=False,
            return_buffer=None, run_ahead=False, max_context=config.max_context, num_blocks=config.num_blocks,
            max_step_tokens=self.target_config.max_step_tokens,
            device=config.device if device is not None or worker is not None else "host")
        if draft_config.max_context < config.max_context:
            raise ConfigError(f"--draft-model {config.draft_model}: holds {draft_config.max_context} tokens of context, "
                              f"the model {config.max_context}; give --max-context {draft_config.max_context}")
        self.draft = Worker(draft_config, device=device, registry=self.registry, architecture=self.heads).build()
        self.draft_logits, draft_vocab = sampler(self.draft.model.graph, draft_config.model)
        if draft_vocab != vocab:
            raise ConfigError(f"--draft-model {config.draft_model}: a vocabulary of {draft_vocab} tokens, the model's "
                              f"is {vocab}: the draft must share the model's tokenizer")
        try:
            self.propose = OpRunner(self.registry, "mtp_couple_propose", {"vocab": vocab}, config.max_seqs,
                                    config.accept_reference, device)
            self.runners.append(self.propose)
            self.verify = OpRunner(self.registry, "mtp_couple_verify", {"vocab": vocab, "k": self.k}, config.max_seqs,
                                   config.accept_reference, device)
            self.runners.append(self.verify)
        except SelectionError as error:
            raise DraftOpsUnavailable(f"{self.flag}: {error} (the speculative ops come from a kernel library such as "
                              f"plugins/spechub, built with cmake: docs/PLUGINS.md)"
                              + ("" if self.heads is None else "; --no-mtp decodes without the heads"),
                                      str(error)) from None
        self.vocab = vocab
        rows_used = ", ".join(f"{r.op} by {r.row(1).plugin.name}:{r.row(1).name}" for r in self.runners)
        drafter = config.draft_model if self.heads is None else f"its own MTP heads ({self.heads})"
        log.info("speculative decoding: %s drafts %d tokens a round for %s; %s", drafter, self.k, config.model,
                 rows_used)

    # ---- what SpeculativeEngine calls ------------------------------------------------------------
    def run_draft(self, arrays: dict) -> np.ndarray:
        """One draft step; the logits of its sampled rows."""
        tokens = self.draft.execute(arrays)
        return self.draft.executor.read_buffer(self.draft_logits, len(tokens))

    def run_heads(self, arrays: dict, previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One step of the MTP heads, `previous` the hidden state of each row's position; the
        logits and the heads' hidden state of its sampled rows."""
        self.draft.executor.write_buffer(RAD_MTP_PREVIOUS, np.ascontiguousarray(previous, np.float32))
        tokens = self.draft.execute(arrays)
        executor = self.draft.executor
        return executor.read_buffer(self.draft_logits, len(tokens)), executor.read_buffer(RAD_MTP_HIDDEN, len(tokens))

    def target_hidden(self) -> np.ndarray:
        return self.target.last_result[RAD_HIDDEN]

    def target_logits(self) -> np.ndarray:
        return self.target.last_result[self.logits_name]

    def propose_tokens(self, logits, temperature, rng):
        rows = len(logits)
        tokens, probs = np.zeros(rows, np.int32), np.zeros((rows, self.vocab), np.float32)
        self.propose(rows, np.ascontiguousarray(logits, np.float32), temperature, rng, tokens, probs)
        return tokens, probs

    def verify_tokens(self, logits, drafts, probs, temperature, rng):
        rows = len(drafts)
        tokens, accepted = np.zeros((rows, self.k + 1), np.int32), np.zeros(rows, np.int32)
        self.verify(rows, np.ascontiguousarray(logits, np.float32), drafts, probs, temperature, rng, tokens, accepted)
        self.kept += int(accepted.sum()) - rows
        self.drafted += rows * self.k
        return tokens, accepted

    # ---- the Ranks interface: the model's ranks --------------------------------------------------
    def submit(self, arrays, feed=None) -> None:
        self.target.submit(arrays, feed)

    def collect(self):
        return self.target.collect()

    @property
    def last_result(self) -> dict:
        return self.target.last_result

    def idle(self, wake: threading.Event) -> None:
        self.target.idle(wake)

    def step_stats(self) -> dict:
        return self.target.step_stats()

    def close(self, failed: bool = False) -> None:
        if self.drafted:
            log.info("speculative decoding: the model kept %d of %d draft tokens (%.0f%%)", self.kept, self.drafted,
                     100.0 * self.kept / self.drafted)
            self.drafted = 0
        for runner in self.runners:
            runner.close()
        self.runners = []
        draft, self.draft = self.draft, None
        if draft is not None:
            draft.close()
        target, self.target = self.target, None
        if target is not None:
            target.close(failed)
        self.registry.close()
