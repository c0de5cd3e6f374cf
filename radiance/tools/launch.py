"""radiance-launch: one rank process per visible card, or N host ranks where there is none,
coordinated over zmq and shared memory; the same generation options as `radiance`. Rank processes
even at --tp 1 (`radiance` runs TP 1 in its own process)."""

import sys

import click

from radiance.launch.ranks import RankSettings
from radiance.serving.options import serve_options

from . import options
from .generate import run, split


@click.command()
@click.option("--tp", default=1, show_default=True, help="Ranks: one per card, or host ranks without a card.")
@options.model_and_mode
@click.option("--threads-per-rank", type=click.IntRange(1), default=None, help="Compute threads of each host rank "
              "(default: the cores divided among the ranks).")
@click.option("--disable-p2p", is_flag=True, help="Use the _host twins of the collectives even where P2P works.")
@click.option("--stage-timeout", default=60.0, show_default=True, help="Seconds every handshake stage may take.")
@click.option("--step-timeout", default=120.0, show_default=True, help="Seconds one step may take.")
@serve_options
@options.radiance_home
@options.kernels
@options.accept_reference
@options.run_ahead
@click.option("--verbose", is_flag=True, help="Tracebacks for errors.")
def main(tp, threads_per_rank, disable_p2p, stage_timeout, step_timeout, run_ahead, verbose, **params):
    """Generate with a .rad model over TP ranks, or serve it (--serve)."""
    if tp < 1:
        raise click.UsageError(f"--tp must be at least 1, not {tp}")
    settings = RankSettings(tp=tp, launched=True, threads=threads_per_rank, disable_p2p=disable_p2p,
                            stage_timeout=stage_timeout, step_timeout=step_timeout, run_ahead=run_ahead)
    run("radiance-launch", verbose, settings, *split(params))


if __name__ == "__main__":
    sys.exit(main())
