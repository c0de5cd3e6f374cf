"""radiance: one rank in process (`--tp N` launches N rank processes, as radiance-launch does).
`--prompt` streams a raw completion to stdout (logs and progress go to stderr); `--chat` is an
interactive chat through the model's template; `--serve` serves the OpenAI API. `--model` is a .rad
file or a GGUF file, converted once into a cache keyed by its content (radiance/convert/cache.py).
Which ranks run the steps is launch/__init__.py's open_ranks' choice, for this command and
radiance-launch alike."""

import os
import signal
import sys
import threading

import click

from radiance.config import Config
from radiance.convert.cache import model_file
from radiance.generation.engine import Engine
from radiance.generation.sequence import SamplingParams
from radiance.launch import engine_over, open_ranks
from radiance.launch.ranks import RANK_ERRORS
from radiance.serving.options import ServeSettings, check_mode, max_seqs_for, serve_options

from . import options
from .errors import user_errors


class ReplyInterrupt:
    """While a reply streams, Ctrl-C ends the reply, not the session: SIGINT only sets `asked`, and
    the reply stops at its next piece (its sequence cancelled by the engine between steps, never
    in the middle of one). At the prompt, Ctrl-C ends the session as before."""

    def __init__(self):
        self.asked, self.saved = False, None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.saved = signal.signal(signal.SIGINT, self._ask)
        return self

    def _ask(self, signum, frame):
        self.asked = True

    def __exit__(self, *exc):
        if self.saved is not None:
            signal.signal(signal.SIGINT, self.saved)


def chat_loop(engine: Engine, params: dict) -> None:
    messages = []
    click.echo("chat: an empty line or Ctrl-D ends it; Ctrl-C ends a reply", err=True)
    while True:
        try:
            line = click.prompt("you", prompt_suffix="> ", default="", show_default=False, err=True)
        except (EOFError, click.Abort):
            break
        if not line.strip():
            break
        messages.append({"role": "user", "content": line})
        reply = ""
        with ReplyInterrupt() as interrupt:
            stream = engine.stream(engine.text.chat(messages), SamplingParams(**params))
            try:
                for piece in stream:
                    reply += piece
                    click.echo(piece, nl=False)
                    sys.stdout.flush()
                    if interrupt.asked:
                        break
            finally:
                stream.close()  # the engine cancels the sequence and settles (generation/engine.py)
        click.echo()
        if interrupt.asked:
            click.echo("(reply interrupted)", err=True)
        messages.append({"role": "assistant", "content": reply})


def stream_prompt(engine: Engine, prompt: str, params: dict) -> None:
    for piece in engine.stream(engine.text.encode(prompt), SamplingParams(**params)):
        click.echo(piece, nl=False)
        sys.stdout.flush()
    click.echo()


def run(program: str, given: dict) -> None:
    """What both commands do with the options they were given, by name: check the mode and the
    sampling values before anything loads, make the one Config of the rest, then generate (--prompt,
    --chat) or serve (--serve) on the ranks it asks for."""
    verbose, prompt, chat, serve = (given.pop(name) for name in ("verbose", "prompt", "chat", "serve"))
    check_mode(serve, prompt, chat)
    sampling, serving = options.take(given, SamplingParams), options.take(given, ServeSettings)
    with user_errors(program, verbose, extra=RANK_ERRORS):
        SamplingParams(**sampling)
        given["model"] = model_file(given["model"], given.get("radiance_home"))
        tp, launched = given["tp"], given.get("launched", False)
        config = Config(**{**given, "max_seqs": max_seqs_for(serve, given["max_seqs"]),
                           "profile": serve and (tp > 1 or launched)})  # serving: rank 0's figures for /metrics
        if config.node_rank > 0:  # another node of a launch over several: its agent, node 0 runs the engine
            from radiance.launch.agent import serve_node

            return serve_node(config)
        if serve:
            from radiance.serving.server import serve as serve_over

            return serve_over(config, ServeSettings(**serving, defaults=sampling))
        with open_ranks(config) as ranks:
            if chat:
                chat_loop(engine_over(ranks), sampling)
            else:
                stream_prompt(engine_over(ranks), prompt, sampling)


@click.command()
@options.tp("Ranks: above 1, rank processes as radiance-launch starts.")
@options.model_and_mode
@serve_options
@options.radiance_home
@options.kernels
@options.accept_reference
@options.debug_selection
@options.run_ahead
@click.option("--threads", type=click.IntRange(1), default=None,
              help="Compute threads of the rank (of each rank with --tp; default: the cores, shared out among the ranks).")
@options.verbose
def main(**given):
    """Generate with a model (.rad, or .gguf converted once into a cache) on this machine's CPU (or the
    card it sees), or serve it (--serve)."""
    if given["threads"] is not None:
        os.environ["RADIANCE_THREADS"] = str(given["threads"])  # read by the host kernels of a rank in this process
    run("radiance", given)


if __name__ == "__main__":
    main()
