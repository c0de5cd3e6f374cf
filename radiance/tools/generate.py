"""radiance: one rank in process. `--prompt` streams a raw completion to stdout (logs and progress
go to stderr); `--chat` is an interactive chat through the model's template."""

import sys

import click

from radiance.engine.registry import Registry
from radiance.generation.engine import Engine
from radiance.generation.options import EngineOptions
from radiance.generation.sequence import SamplingParams
from radiance.generation.text import TextCodec
from radiance.generation.worker import Worker
from radiance.log import get_logger
from radiance.serving.options import check_mode, max_seqs_for, serve_options

from . import options
from .errors import user_errors

log = get_logger("radiance.cli")


def build_engine(model, radiance_home, kernels, accept_reference, debug_selection, max_context, max_step_tokens,
                 max_seqs=1, device="auto", graphs=True, chain=True) -> tuple[Engine, Worker]:
    if device == "auto":  # one rank in process: the first card this process may use, if any
        from radiance.launch.devices import pin_this_process

        card = pin_this_process()
        if card is not None:
            log.info("running on %s card %d%s", card.vendor, card.index, f" (PCI {card.bus_id})" if card.bus_id else "")
    registry = Registry(radiance_home, kernels)
    engine_options = EngineOptions(model=model, radiance_home=radiance_home, kernels=kernels,
                                   accept_reference=accept_reference, max_context=max_context,
                                   max_step_tokens=max_step_tokens, max_seqs=max_seqs, device=device, graphs=graphs,
                                   chain=chain)
    worker = Worker(engine_options, registry).build()
    if debug_selection:
        click.echo("\n".join(worker.graph.report()), err=True)
    container = worker.model.container
    text = TextCodec(container.tokenizer, container.chat_template, worker.model.hyper, model)
    return Engine(engine_options, worker.execute, text), worker


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


@click.command()
@click.option("--tp", default=1, show_default=True, help="Ranks: above 1, this is radiance-launch --tp N.")
@options.model_and_mode
@serve_options
@options.radiance_home
@options.kernels
@options.accept_reference
@options.debug_selection
@click.option("--verbose", is_flag=True, help="Tracebacks for errors.")
def main(tp, model, prompt, chat, max_tokens, temperature, top_p, top_k, seed, stop, max_context, max_step_tokens,
         device, graphs, chain,
         serve, host, port, api_key, max_seqs, radiance_home, kernels, accept_reference, debug_selection, verbose):
    """Generate with a .rad model on this machine's CPU, or serve it (--serve)."""
    check_mode(serve, prompt, chat)
    if tp != 1:
        from radiance.launch.cli import main as launch

        context = click.get_current_context()
        accepted = {param.name for param in launch.params}
        return context.invoke(launch, **{k: v for k, v in context.params.items() if k in accepted})
    with user_errors("radiance", verbose):
        params = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=stop)
        SamplingParams(**params)  # checks them before the model loads
        if serve:
            from radiance.serving.server import ServeSettings, serve_single

            return serve_single(model, ServeSettings(host, port, api_key, params), lambda: build_engine(
                model, radiance_home, kernels, accept_reference, debug_selection, max_context, max_step_tokens,
                max_seqs_for(serve, max_seqs), device, graphs, chain))
        engine, worker = build_engine(model, radiance_home, kernels, accept_reference, debug_selection,
                                      max_context, max_step_tokens, max_seqs_for(serve, max_seqs), device, graphs, chain)
        try:
            if chat:
                chat_loop(engine, params)
            else:
                stream_prompt(engine, prompt, params)
        finally:
            worker.close()


if __name__ == "__main__":
    main()
