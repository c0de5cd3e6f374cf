"""radiance: one rank in process (`--tp N` launches N rank processes, as radiance-launch does).
`--prompt` streams a raw completion to stdout (logs and progress go to stderr); `--chat` is an
interactive chat through the model's template; `--serve` serves the OpenAI API. Which ranks run
the steps is launch/ranks.py's open_ranks' choice, for this command and radiance-launch alike."""

import os
import sys

import click

from radiance.generation.engine import Engine
from radiance.generation.options import EngineOptions
from radiance.generation.sequence import SamplingParams
from radiance.launch.ranks import RANK_ERRORS, RankSettings, engine_over, open_ranks
from radiance.serving.options import check_mode, max_seqs_for, serve_options

from . import options
from .errors import user_errors


def chat_loop(engine: Engine, params: dict) -> None:
    messages = []
    click.echo("chat: an empty line or Ctrl-D ends it", err=True)
    while True:
        try:
            line = click.prompt("you", prompt_suffix="> ", default="", show_default=False, err=True)
        except (EOFError, click.Abort):
            break
        if not line.strip():
            break
        messages.append({"role": "user", "content": line})
        reply = ""
        for piece in engine.stream(engine.text.chat(messages), SamplingParams(**params)):
            reply += piece
            click.echo(piece, nl=False)
            sys.stdout.flush()
        click.echo()
        messages.append({"role": "assistant", "content": reply})


def stream_prompt(engine: Engine, prompt: str, params: dict) -> None:
    for piece in engine.stream(engine.text.encode(prompt), SamplingParams(**params)):
        click.echo(piece, nl=False)
        sys.stdout.flush()
    click.echo()


def run(program: str, verbose: bool, settings: RankSettings, mode: dict, sampling: dict, engine: dict,
        serving: dict) -> None:
    """What both commands do once their options are read: check the sampling values before anything
    loads, then generate (`mode`: prompt, chat) or serve, on the ranks `settings` ask for."""
    check_mode(serving["serve"], mode["prompt"], mode["chat"])
    with user_errors(program, verbose, extra=RANK_ERRORS):
        SamplingParams(**sampling)
        engine_options = EngineOptions(**engine, max_seqs=max_seqs_for(serving["serve"], serving["max_seqs"]))
        if serving["serve"]:
            from radiance.serving.server import ServeSettings, serve

            settings.profile = settings.profile or settings.tp > 1 or settings.launched  # rank 0's figures for /metrics
            return serve(engine_options, ServeSettings(serving["host"], serving["port"], serving["api_key"], sampling,
                                                       serving["max_stop_chars"]),
                         lambda: open_ranks(engine_options, settings))
        with open_ranks(engine_options, settings) as ranks:
            if mode["chat"]:
                chat_loop(engine_over(ranks), sampling)
            else:
                stream_prompt(engine_over(ranks), mode["prompt"], sampling)


def split(params: dict) -> tuple[dict, dict, dict, dict]:
    """The options both commands share, by what they are for: (mode, sampling, engine, serving)."""
    mode = {name: params.pop(name) for name in ("prompt", "chat")}
    sampling = {name: params.pop(name) for name in ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")}
    serving = {name: params.pop(name) for name in ("serve", "host", "port", "api_key", "max_seqs", "max_stop_chars")}
    engine = {"model": params.pop("model"), "radiance_home": params.pop("radiance_home"),
              "kernels": params.pop("kernels"), "accept_reference": params.pop("accept_reference"),
              **{name: params.pop(name) for name in ("max_context", "max_step_tokens", "device", "graphs", "chain",
                                                      "fusion")}}
    return mode, sampling, engine, serving


@click.command()
@click.option("--tp", default=1, show_default=True, help="Ranks: above 1, rank processes as radiance-launch starts.")
@options.model_and_mode
@serve_options
@options.radiance_home
@options.kernels
@options.accept_reference
@options.debug_selection
@options.run_ahead
@click.option("--threads", type=click.IntRange(1), default=None,
              help="Compute threads of the rank (of each rank with --tp; default: the cores, shared out among the ranks).")
@click.option("--verbose", is_flag=True, help="Tracebacks for errors.")
def main(tp, debug_selection, run_ahead, threads, verbose, **params):
    """Generate with a .rad model on this machine's CPU (or the card it sees), or serve it (--serve)."""
    if tp < 1:
        raise click.UsageError(f"--tp must be at least 1, not {tp}")
    if threads is not None:
        os.environ["RADIANCE_THREADS"] = str(threads)  # read by the host kernels of the rank in this process
    run("radiance", verbose, RankSettings(tp=tp, debug_selection=debug_selection, run_ahead=run_ahead, threads=threads),
        *split(params))


if __name__ == "__main__":
    main()
