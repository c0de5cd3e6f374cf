"""What an engine is started with, checked when it is made."""

from dataclasses import dataclass


@dataclass
class EngineOptions:
    model: str
    radiance_home: str | None = None
    kernels: str | None = None
    accept_reference: bool = False
    activation_dtype: str = "f32"
    max_step_tokens: int = 256  # the token budget of one step: long prefills are cut into chunks of it
    max_seqs: int = 1
    max_context: int | None = None  # None: the model's own context length
    block_size: int = 16
    num_blocks: int = 0  # 0: enough for max_seqs sequences of max_context tokens
    progress: bool = True
    debug_selection: bool = False
    device: str = "auto"  # auto: the card this process was given, if any; host: host rows even on a card
    graphs: bool = True  # on a card, capture each decode shape into a graph (one launch per step)
    chain: bool = True  # on a card that has it (Hopper), launch r4dchain rows as programmatic dependent launches
    fusion: bool = True  # run fused rows (`replaces`) where their library serves the chain; False: every chain as declared

    def __post_init__(self):
        for name in ("max_step_tokens", "max_seqs", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.device not in ("auto", "host"):
            raise ValueError(f"device must be 'auto' or 'host', not {self.device!r}")
        if self.max_context is not None and self.max_context < 2:
            raise ValueError(f"max_context must be at least 2, not {self.max_context}")

    def fit(self, model_context: int) -> None:
        """Settle what depends on the model: the context and the KV cache's size."""
        self.max_context = min(self.max_context or model_context, model_context)
        if not self.num_blocks:
            self.num_blocks = self.max_blocks * self.max_seqs

    @property
    def max_blocks(self) -> int:
        """Blocks one sequence of max_context tokens needs."""
        return -(-self.max_context // self.block_size)
