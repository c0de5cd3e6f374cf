"""The one options object, as nano-vllm's Config: what the command line (or a caller) asked for, from
the CLI through the ranks to every Worker. Checked once, when it is made, and settled there from
the model's own header (the context it holds, so the KV cache's size); frozen after, so nothing
changes it on the way. A launched rank is handed its fields and makes the same object from them."""

import os
from dataclasses import dataclass

from radiance.weights.container_reader import open_container

# The options whose command-line flag is not their name with dashes, and those no command takes.
FLAGS = {"threads": "--threads-per-rank", "accept_reference": "--debug-accept-reference-kernels"}
KV_CACHE_DTYPES = ("auto", "f16", "f32")
NO_FLAG = {"activation_dtype", "block_size", "num_blocks", "progress", "launched", "profile", "return_buffer"}


class ConfigError(ValueError):
    """An option that cannot be: one line naming its flag (or the model file) and what is wrong."""


def flag(name: str) -> str:
    """How an error names option `name`: its command-line flag, or the field where no command takes it."""
    return name if name in NO_FLAG else FLAGS.get(name, "--" + name.replace("_", "-"))


@dataclass(frozen=True)
class Config:
    model: str  # the .rad file
    # plugins
    radiance_home: str | None = None  # None: $RADIANCE_HOME
    kernels: str | None = None  # the kernel hierarchy; None: $RADIANCE_KERNELS
    accept_reference: bool = False  # reference rows may serve
    # the engine
    activation_dtype: str = "f32"
    # the KV cache's type (vLLM's --kv-cache-dtype): auto = f16 on the host rows (as llama.cpp keeps
    # it: half the bytes attention reads), f32 on a card (its attention rows read f32 only); f32 the
    # exact cache, for checks against f32 arithmetic end to end
    kv_cache_dtype: str = "auto"
    max_step_tokens: int = 256  # the token budget of one step: long prefills are cut into chunks of it
    max_seqs: int = 1  # sequences batched in one step
    max_context: int | None = None  # asked; settled to at most the model's context (None: the model's)
    block_size: int = 16  # KV cache slots a block
    num_blocks: int = 0  # asked; settled from 0 to enough for max_seqs sequences of max_context tokens
    device: str = "auto"  # auto: the card this process was given, if any; host: host rows even on a card
    graphs: bool = True  # on a card, capture each decode shape into a graph (one launch per step)
    chain: bool = True  # launch r4dchain rows chained (device.chain): on Hopper as programmatic dependent launches
    fusion: bool = True  # run fused rows (`replaces`) where their library serves the chain; False: every chain as declared
    progress: bool = True  # a progress bar while rank 0 loads its weights
    # the ranks
    tp: int = 1  # ranks of a pipeline stage; above 1 always launched
    pp: int = 1  # pipeline stages, the engine's cut of the graph (selection/stages.py); above 1 always launched
    # the parts each step is cut into, run one after another by every rank so the stages overlap
    # (generation/micro_batches.py); 0: one a stage (--pp), 1: none
    micro_batches: int = 0
    # the nodes (torchrun's names; under Slurm from SLURM_NNODES, SLURM_NODEID, SLURM_STEP_NODELIST)
    nnodes: int = 1  # machines the ranks are spread over, an equal share each
    node_rank: int = 0  # this machine's place: 0 holds the coordinator, the others run an agent
    master_addr: str | None = None  # node 0's address: where its coordinator binds, and the others reach it
    master_port: int = 29500
    keys: str | None = None  # the launch's CURVE keys and signing secret: node 0 writes it, the others read it
    launched: bool = False  # rank processes even at TP 1 (radiance-launch)
    threads: int | None = None  # compute threads of each host rank (None: the cores shared out)
    disable_p2p: bool = False  # launched: the _host twins of the collectives even where P2P holds
    # cards at TP > 1: what a device all-reduce moves, f32 or bf16 (activations stay f32); auto: bf16
    # when every projection weight of the model is bf16 (ranks/worker.py, collective_wire)
    collective_wire: str = "auto"
    stage_timeout: float = 60.0  # launched: seconds every handshake stage may take
    step_timeout: float = 120.0  # launched: seconds one step may take
    profile: bool = False  # rank 0 times every op; the ranks' step_stats() then have the collective seconds
    # rank 0 returns these buffers' rows each step (names, comma-separated): a debugging aid, and
    # speculative decoding's logits (and the model's hidden state for MTP heads)
    return_buffer: str | None = None
    debug_selection: bool = False  # print the winner of every band (stderr): in process, or rank 0 of a launch
    # Plan step n + 1 while the ranks run step n, the token step n samples feeding step n + 1 on the
    # ranks (generation/feed.py). None: where it was measured to help (launch/ranks.py, run_ahead_default).
    run_ahead: bool | None = None
    # speculative decoding (generation/speculative.py): a draft model of the same vocabulary proposes
    # draft_tokens a round, which the model verifies in one step
    draft_model: str | None = None
    draft_tokens: int = 4
    # without a draft model, a model that carries multi-token-prediction heads drafts with them
    # (rad_arch.h's RAD_MTP_SUFFIX; launch/mtp.py). None: where the ops can serve them, else plain
    # decoding with a warning; True (--mtp): they must draft, or the launch stops saying why; False: plain
    mtp: bool | None = None

    def __post_init__(self):
        object.__setattr__(self, "model", os.fspath(self.model))
        for name in ("tp", "pp", "nnodes", "max_step_tokens", "max_seqs", "block_size", "draft_tokens"):
            self._at_least(name, 1)
        if self.draft_model is not None:
            object.__setattr__(self, "draft_model", os.fspath(self.draft_model))
        self._at_least("num_blocks", 0)
        self._at_least("micro_batches", 0)
        if self.max_context is not None:
            self._at_least("max_context", 2)
        if self.threads is not None:
            self._at_least("threads", 1)
        for name in ("stage_timeout", "step_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{flag(name)} must be more than 0 seconds, not {getattr(self, name)}")
        self._check_nodes()
        if self.device not in ("auto", "host"):
            raise ConfigError(f"{flag('device')} must be 'auto' or 'host', not {self.device!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"{flag('kv_cache_dtype')} must be 'auto', 'f16' or 'f32', not {self.kv_cache_dtype!r}")
        if self.collective_wire not in ("auto", "f32", "bf16"):
            raise ConfigError(f"{flag('collective_wire')} must be 'auto', 'f32' or 'bf16', not {self.collective_wire!r}")
        context = self._model_context()
        object.__setattr__(self, "max_context", min(self.max_context or context, context))
        if not self.num_blocks:
            object.__setattr__(self, "num_blocks", self.max_blocks * self.max_seqs)

    def _check_nodes(self) -> None:
        if self.pp > 1 and self.nnodes > 1 and self.run_ahead:
            raise ConfigError(f"{flag('run_ahead')}: not with {flag('pp')} {self.pp} over {flag('nnodes')} "
                              f"{self.nnodes} (the last stage's tokens reach the first through shared memory)")
        if self.micro_batches > 1 and self.draft_model is not None:
            raise ConfigError(f"{flag('draft_model')}: not with {flag('micro_batches')} {self.micro_batches} (a "
                              "verify step reads every token's logits, of one part only)")
        if self.pp > 1 and self.draft_model is not None:
            raise ConfigError(f"{flag('draft_model')}: not with {flag('pp')} {self.pp} (a verify step's logits are "
                              "handed back by rank 0, and with stages only the last one has them)")
        if (self.tp * self.pp) % self.nnodes:
            raise ConfigError(f"{flag('nnodes')} {self.nnodes}: --tp {self.tp} x --pp {self.pp} = "
                              f"{self.tp * self.pp} ranks cannot be shared out equally")
        if not isinstance(self.node_rank, int) or not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"{flag('node_rank')} must be from 0 to {self.nnodes - 1}, not {self.node_rank}")
        if not isinstance(self.master_port, int) or not 0 < self.master_port < 65536:
            raise ConfigError(f"{flag('master_port')} must be a TCP port (1 to 65535), not {self.master_port}")
        if self.nnodes > 1:
            for name in ("master_addr", "keys"):
                if not getattr(self, name):
                    raise ConfigError(f"{flag(name)} is needed with {flag('nnodes')} {self.nnodes}")

    def kv_cache_type(self, card: bool) -> str:
        """The KV cache's type on a rank of the host rows (card False) or of a card's: auto settled."""
        if self.kv_cache_dtype == "auto":
            return "f32" if card else "f16"
        if card and self.kv_cache_dtype != "f32":
            raise ConfigError(f"{flag('kv_cache_dtype')} {self.kv_cache_dtype}: a card's attention rows read an f32 "
                              "cache only (give auto or f32, or --device host)")
        return self.kv_cache_dtype

    @property
    def returned_buffers(self) -> tuple[str, ...]:
        """The buffers return_buffer names, in its order."""
        return tuple(name for name in (self.return_buffer or "").split(",") if name)

    @property
    def world(self) -> int:
        """Every rank of the launch, on every node."""
        return self.tp * self.pp

    def _at_least(self, name: str, least: int) -> None:
        value = getattr(self, name)
        if not isinstance(value, int) or value < least:
            raise ConfigError(f"{flag(name)} must be at least {least}, not {value}")

    def _model_context(self) -> int:
        """The context the model holds, from its container's header (no weight is read)."""
        with open_container(self.model) as container:
            context = container.hyper.get("context")
            if type(context) is not int or context < 2:
                raise ConfigError(f"{self.model}: the {container.architecture} model's hyper-parameters give no "
                                  f"context length ('context' is {context!r})")
        return context

    @property
    def max_blocks(self) -> int:
        """Blocks one sequence of max_context tokens needs."""
        return -(-self.max_context // self.block_size)
