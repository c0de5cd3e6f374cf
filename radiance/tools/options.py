"""Options every command shares: where plugins come from and which kernel libraries lead, the
model and what to do with it, how to sample. Each option's name is the field it fills (of
radiance.config.Config, generation.sequence.SamplingParams or serving.options.ServeSettings), so a
command hands on what it was given by name (`take`), never by position."""

import dataclasses

import click

radiance_home = click.option(
    "--radiance-home", default=None, metavar="PATHS",
    help="Plugin homes separated by ':', overriding $RADIANCE_HOME; the installed home comes last.")
kernels = click.option(
    "--kernels", default=None, metavar="LIBS",
    help="Kernel hierarchy, e.g. 'mykernels,libr4d' (overrides $RADIANCE_KERNELS).")
accept_reference = click.option(
    "--debug-accept-reference-kernels", "accept_reference", is_flag=True,
    help="Let reference (oracle) rows serve.")
run_ahead = click.option(
    "--run-ahead/--no-run-ahead", default=None,
    help="Plan step n+1 while the ranks run step n, the sampled token feeding it where it was sampled "
         "(default: on for launched host ranks, and for pipeline stages on one host, "
         "where it was measured to help; off in process and on cards).")
verbose = click.option("--verbose", is_flag=True, help="Tracebacks for errors.")
debug_selection = click.option(
    "--debug-selection", is_flag=True,
    help="Print the winner of every band and, for each loser, the constraint that refused it.")


def tp(help_text: str):
    return click.option("--tp", default=1, show_default=True, help=help_text)


def take(given: dict, kind) -> dict:
    """The options of `given` that are fields of the dataclass `kind`, taken out of it."""
    return {field.name: given.pop(field.name) for field in dataclasses.fields(kind) if field.name in given}


def parse_assignments(pairs, what: str) -> dict:
    """KEY=VALUE pairs; integers and floats become numbers."""
    values = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint=what)
        for convert in (int, float):
            try:
                values[key] = convert(text)
                break
            except ValueError:
                continue
        else:
            values[key] = text
    return values


def _stack(*decorators):
    def apply(function):
        for decorator in reversed(decorators):
            function = decorator(function)
        return function
    return apply


sampling = _stack(
    click.option("--max-tokens", default=256, show_default=True, help="Tokens to generate at most."),
    click.option("--temperature", default=0.7, show_default=True, help="0 is greedy."),
    click.option("--top-p", default=1.0, show_default=True),
    click.option("--top-k", default=0, show_default=True, help="0 keeps every token."),
    click.option("--seed", type=int, default=None, help="Make sampling reproducible."),
    click.option("--stop", multiple=True, help="Stop before this text (repeatable)."),
)

# What `radiance` and `radiance-launch` both take: the model, what to do with it, how to sample.
model_and_mode = _stack(
    click.option("--model", required=True, type=click.Path(dir_okay=False),
                 help="A .rad model, or a GGUF file (converted once into $RADIANCE_CACHE, ~/.cache/radiance)."),
    click.option("--prompt", default=None, help="Complete this text (no chat template)."),
    click.option("--chat", is_flag=True, help="Talk to the model through its chat template."),
    sampling,
    click.option("--max-context", type=int, default=None, help="Tokens of context (default: the model's)."),
    click.option("--max-step-tokens", default=256, show_default=True, help="Prefill chunk: tokens in one step."),
    click.option("--device", type=click.Choice(["auto", "host"]), default="auto", show_default=True,
                 help="auto: the card this process sees (CUDA_/ROCR_VISIBLE_DEVICES), if any; host: host rows."),
    click.option("--graphs/--no-graphs", default=True, show_default=True,
                 help="On a card, capture each decode step into a graph."),
    click.option("--chain/--no-chain", default=True, show_default=True,
                 help="Launch r4dchain rows chained (device.chain): on a Hopper card as programmatic dependent "
                      "launches; on host ranks the chained all_reduce serves."),
    click.option("--fusion/--no-fusion", default=True, show_default=True,
                 help="Run fused rows (replaces) where their library serves the chain; off: every chain as declared."),
    click.option("--kv-cache-dtype", type=click.Choice(["auto", "f16", "f32"]), default="auto", show_default=True,
                 help="The KV cache's type: auto is f16 on host rows (as llama.cpp keeps it), f32 on a card; f32 "
                      "keeps the exact cache."),
    click.option("--collective-wire", type=click.Choice(["auto", "f32", "bf16"]), default="auto", show_default=True,
                 help="Cards at TP > 1: what an all-reduce moves (activations stay f32); auto: bf16 for a bf16 model."),
    click.option("--draft-model", type=click.Path(dir_okay=False), default=None,
                 help="Speculative decoding: a .rad model of the same vocabulary drafts tokens the model verifies "
                      "(the ops mtp_couple_propose/verify come from a kernel library such as plugins/spechub)."),
    click.option("--draft-tokens", default=4, show_default=True,
                 help="With --draft-model or MTP heads: tokens drafted a round."),
    click.option("--mtp/--no-mtp", default=None,
                 help="A model that carries multi-token-prediction heads drafts with them (speculative decoding "
                      "through the same ops as --draft-model). Default: where the ops can serve them, else plain "
                      "decoding with a warning; --mtp: they must draft; --no-mtp: plain decoding."),
)
