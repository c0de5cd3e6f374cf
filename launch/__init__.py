"""radiance-launch's machinery, and the one place that chooses the ranks behind an engine:
`open_ranks(config)` gives one rank in this process (in_process.py) or launched rank processes
(launched.py), both behind launch/ranks.py's interface, and with a draft model, or a model whose own
MTP heads draft (mtp.py), those with the draft beside them (speculative.py); `engine_over(ranks)` is
the generation engine that runs its steps on them."""

from radiance.config import Config
from radiance.generation.engine import Engine
from radiance.log import get_logger

log = get_logger("radiance.speculative")


def open_ranks(config: Config):
    """The ranks `config` asks for: launched rank processes when TP x PP > 1 or config.launched, else
    one rank in this process (pinned to the first card it may use, when config.device is auto); with
    config.draft_model, those ranks and the draft model (speculative decoding); for a model that
    carries MTP heads (unless config.mtp is off), those ranks and its heads; where the heads cannot
    draft (no row may serve their ops here) and --mtp did not ask for them, the plain ranks, saying so."""
    from .mtp import mtp_heads

    heads = mtp_heads(config)
    if config.draft_model is not None or heads is not None:
        from .speculative import DraftOpsUnavailable, SpeculativeRanks

        try:
            return SpeculativeRanks(config, heads)
        except DraftOpsUnavailable as error:
            if config.draft_model is not None or config.mtp:  # asked for by name: loud
                raise
            log.warning("%s carries MTP heads, but they cannot draft here: %s; decoding without them", config.model,
                        error.reason)
    if config.world > 1 or config.launched:
        from .launched import LaunchedRanks

        return LaunchedRanks(config)
    from .in_process import InProcessRanks

    return InProcessRanks(config)


def engine_over(ranks) -> Engine:
    """The generation engine that runs its steps on `ranks`, ahead of them where ranks.run_ahead;
    over speculative ranks, the speculative decoder."""
    if getattr(ranks, "heads", None) is not None:
        from radiance.generation.mtp import MtpEngine

        return MtpEngine(ranks.target_config, ranks.execute, ranks.text, max_seqs=ranks.config.max_seqs,
                         heads=ranks.run_heads, hidden=ranks.target_hidden, logits=ranks.target_logits,
                         propose=ranks.propose_tokens, verify=ranks.verify_tokens)
    if getattr(ranks, "draft", None) is not None:
        from radiance.generation.speculative import SpeculativeEngine

        return SpeculativeEngine(ranks.target_config, ranks.execute, ranks.text, max_seqs=ranks.config.max_seqs,
                                 draft=ranks.run_draft, logits=ranks.target_logits, propose=ranks.propose_tokens,
                                 verify=ranks.verify_tokens)
    return Engine(ranks.config, ranks.execute, ranks.text, ahead=ranks if ranks.run_ahead else None,
                  limits=ranks.step_limits)
