"""radiance-launch's machinery, and the one place that chooses the ranks behind an engine:
`open_ranks(config)` gives one rank in this process (in_process.py) or launched rank processes
(launched.py), both behind launch/ranks.py's interface; `engine_over(ranks)` is the generation
engine that runs its steps on them."""

from radiance.config import Config
from radiance.generation.engine import Engine


def open_ranks(config: Config):
    """The ranks `config` asks for: launched rank processes when TP x PP > 1 or config.launched, else
    one rank in this process (pinned to the first card it may use, when config.device is auto)."""
    if config.world > 1 or config.launched:
        from .launched import LaunchedRanks

        return LaunchedRanks(config)
    from .in_process import InProcessRanks

    return InProcessRanks(config)


def engine_over(ranks) -> Engine:
    """The generation engine that runs its steps on `ranks`, ahead of them where ranks.run_ahead."""
    return Engine(ranks.config, ranks.execute, ranks.text, ahead=ranks if ranks.run_ahead else None)
