"""radiance-launch: one rank process per visible card, or N host ranks where there is none,
coordinated over zmq and shared memory; the same generation options as `radiance`. Rank processes
even at --tp 1 (`radiance` runs TP 1 in its own process)."""

import sys

import click

from radiance.launch.placement import settle
from radiance.serving.options import serve_options

from . import options
from .errors import user_errors
from .generate import run


@click.command()
@options.tp("Ranks of each pipeline stage: one per card, or host ranks without a card.")
@click.option("--pp", default=1, show_default=True, help="Pipeline stages: the model's layers cut into this many, "
              "--tp ranks each (host ranks).")
@click.option("--micro-batches", type=int, default=0, show_default=True, help="Parts each step is cut into, "
              "which flow through the stages one after another so they overlap (0: one a stage; 1: none).")
@click.option("--nnodes", type=int, default=None, help="Machines the ranks are spread over (torchrun's name; "
              "under Slurm SLURM_NNODES).")
@click.option("--node-rank", type=int, default=0, help="This machine's place (0 runs the coordinator; "
              "under Slurm SLURM_NODEID).")
@click.option("--master-addr", default=None, help="Node 0's address, where its coordinator binds and the "
              "others reach it (under Slurm the first host of SLURM_STEP_NODELIST).")
@click.option("--master-port", type=int, default=None, help="Node 0's coordinator port (default: $MASTER_PORT, "
              "else 29500, as torchrun's).")
@click.option("--keys", type=click.Path(dir_okay=False), default=None, help="The launch's CURVE keys: node 0 "
              "writes this file, every other node reads it (copy it, or give a shared folder's path).")
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
@options.debug_selection
@options.run_ahead
@options.verbose
def main(**given):
    """Generate with a model (.rad, or .gguf converted once into a cache) over TP ranks, or serve it (--serve)."""
    with user_errors("radiance-launch", given["verbose"]):
        given = settle(given)
    run("radiance-launch", {**given, "launched": True})


if __name__ == "__main__":
    sys.exit(main())
