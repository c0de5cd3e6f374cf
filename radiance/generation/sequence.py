"""A request's sampling parameters and its sequence's state."""

import math
import os
from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.7  # 0 means greedy
    top_k: int = 0  # 0 keeps every token
    top_p: float = 1.0
    seed: int | None = None  # None: a fresh random seed
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        for name in ("temperature", "top_p"):  # NaN passes every comparison below: refused first
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, not {getattr(self, name)}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, not {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be 0 (greedy) or more, not {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 (all) or more, not {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p}")
        if self.seed is None:
            self.seed = int.from_bytes(os.urandom(8), "little") >> 1
        self.stop = tuple(self.stop)


@dataclass(eq=False)
class Sequence:
    id: int
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose k/v are in the cache (or on their way: a step in flight)
    # Tokens the ranks sampled in steps in flight, not known here yet (run ahead; at most 2: one
    # step collected while the next is submitted). A finished sequence has none: its are dropped.
    pending: int = 0
    blocks: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop", "length", "cancelled"

    @property
    def token_ids(self) -> list[int]:
        """The tokens known here (the pending ones not among them)."""
        return self.prompt_ids + self.output_ids

    def known_ids(self, start: int, stop: int) -> list[int]:
        """token_ids[start:stop] without building token_ids (a decode step asks for one of a long prompt's)."""
        prompt = len(self.prompt_ids)
        if stop <= prompt:
            return self.prompt_ids[start:stop]
        if start >= prompt:
            return self.output_ids[start - prompt:stop - prompt]
        return self.prompt_ids[start:] + self.output_ids[:stop - prompt]

    @property
    def num_tokens(self) -> int:
        """Every token, the pending ones too: what the scheduler plans and the KV cache holds."""
        return len(self.prompt_ids) + len(self.output_ids) + self.pending

    @property
    def num_outputs(self) -> int:
        """Outputs sampled so far, the pending ones too (the sampler's counter of the next)."""
        return len(self.output_ids) + self.pending

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
