"""radiance-launch: one rank process per visible card, or N host ranks where there is none,
coordinated over zmq and shared memory; the same generation options as `radiance`. Rank processes
even at --tp 1 (`radiance` runs TP 1 in its own process)."""

import sys

import click

from radiance.serving.options import serve_options

from . import options
from .generate import run


@click.command()
@options.tp("Ranks: one per card, or host ranks without a card.")
@options.model_and_mode
@click.option("--threads-per-rank", "threads", type=int, default=None, help="Compute threads of each host rank "
              "(default: the cores divided among the ranks).")
@click.option("--disable-p2p", is_flag=True, help="Use the _host twins of the collectives even where P2P works.")
@click.option("--stage-timeout", default=60.0, show_default=True, help="Seconds every handshake stage may take.")
@click.option("--step-timeout", default=120.0, show_default=True, help="Seconds one step may take.")
@serve_options
@options.radiance_home
@options.kernels
@options.accept_reference
@options.run_ahead
@options.verbose
def main(**given):
    """Generate with a model (.rad, or .gguf converted once into a cache) over TP ranks, or serve it (--serve)."""
    run("radiance-launch", {**given, "launched": True})


if __name__ == "__main__":
    sys.exit(main())
