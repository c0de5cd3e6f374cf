"""radiance-launch: one rank process per visible card, or N host ranks where there is none,
coordinated over zmq; the same generation options as `radiance`."""

import dataclasses
import os
import sys

import click

from radiance.generation.engine import Engine
from radiance.generation.options import EngineOptions
from radiance.generation.sequence import SamplingParams
from radiance.generation.text import TextCodec
from radiance.log import get_logger
from radiance.serving.options import check_mode, max_seqs_for, serve_options
from radiance.tools import options
from radiance.tools.errors import user_errors
from radiance.tools.generate import chat_loop, stream_prompt
from radiance.weights.container_reader import Container

from .coordinator import Coordinator, LaunchError
from .devices import visible_cards
from .handshake import handshake
from .supervisor import RankFailed

log = get_logger("radiance.launch")


def choose_cards(tp: int) -> list:
    cards = visible_cards()
    if not cards:
        log.info("no card visible: starting %d host rank%s", tp, "" if tp == 1 else "s")
        return []
    if tp > len(cards):
        raise click.UsageError(f"--tp {tp} needs {tp} cards, {len(cards)} visible "
                               f"({', '.join(f'{c.vendor} {c.index}' for c in cards)})")
    return cards[:tp]


def run_launch(engine_options: EngineOptions, tp: int, threads: int | None, disable_p2p: bool, stage_timeout: float,
               step_timeout: float, profile: bool, work, return_buffer: str | None = None) -> None:
    """Start the ranks, shake hands, hand `work` an Engine, and always tear everything down."""
    cards = choose_cards(tp)
    threads = threads or max(1, (os.cpu_count() or 1) // tp)
    with Container(engine_options.model) as container:
        engine_options.fit(container.hyper["context"])
        text = TextCodec(container.tokenizer, container.chat_template, container.hyper, engine_options.model)
    rank_options = {"engine": dataclasses.asdict(engine_options), "profile": profile, "return_buffer": return_buffer}
    coordinator = Coordinator(tp, cards, threads, rank_options, stage_timeout, step_timeout)
    failed = True
    try:
        handshake(coordinator, disable_p2p, load_timeout=max(stage_timeout, 600.0))
        work(Engine(engine_options, coordinator.execute, text), coordinator)
        failed = False
    finally:
        coordinator.stop(failed)


@click.command()
@click.option("--tp", default=1, show_default=True, help="Ranks: one per card, or host ranks without a card.")
@options.model_and_mode
@click.option("--threads-per-rank", type=int, default=None, help="Compute threads of each host rank "
              "(default: the cores divided among the ranks).")
@click.option("--disable-p2p", is_flag=True, help="Use the _host twins of the collectives even where P2P works.")
@click.option("--stage-timeout", default=60.0, show_default=True, help="Seconds every handshake stage may take.")
@click.option("--step-timeout", default=120.0, show_default=True, help="Seconds one step may take.")
@serve_options
@options.radiance_home
@options.kernels
@options.accept_reference
@click.option("--verbose", is_flag=True, help="Tracebacks for errors.")
def main(tp, model, prompt, chat, max_tokens, temperature, top_p, top_k, seed, stop, max_context, max_step_tokens,
         device, graphs, chain,
         threads_per_rank, disable_p2p, stage_timeout, step_timeout, serve, host, port, api_key, max_seqs, radiance_home,
         kernels, accept_reference, verbose):
    """Generate with a .rad model over TP ranks, or serve it (--serve)."""
    check_mode(serve, prompt, chat)
    if tp < 1:
        raise click.UsageError(f"--tp must be at least 1, not {tp}")
    with user_errors("radiance-launch", verbose, extra=(RankFailed, LaunchError)):
        params = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=stop)
        SamplingParams(**params)
        engine_options = EngineOptions(model=model, radiance_home=radiance_home, kernels=kernels,
                                       accept_reference=accept_reference, max_context=max_context,
                                       max_step_tokens=max_step_tokens, max_seqs=max_seqs_for(serve, max_seqs),
                                       device=device, graphs=graphs, chain=chain)
        if serve:
            from radiance.serving.server import ServeSettings, serve_launch

            return serve_launch(engine_options, ServeSettings(host, port, api_key, params), lambda work: run_launch(
                engine_options, tp, threads_per_rank, disable_p2p, stage_timeout, step_timeout, True, work))

        def work(engine, coordinator):
            if chat:
                chat_loop(engine, params)
            else:
                stream_prompt(engine, prompt, params)

        run_launch(engine_options, tp, threads_per_rank, disable_p2p, stage_timeout, step_timeout, False, work)


if __name__ == "__main__":
    sys.exit(main())
