"""The serving options both CLIs take (`radiance` and `radiance-launch`). Light on purpose: the
CLIs import this on every run, the server's own dependencies only with --serve."""

from dataclasses import dataclass, field

import click

DEFAULT_SERVE_SEQS = 32
# A request's body: refused with a 413 before it is read when larger (limits.py). Room for a prompt
# of a 128k-token context in plain text; a longer one than the context holds is refused anyway.
DEFAULT_MAX_REQUEST_BYTES = 4 << 20
# The characters of a request's stop strings, all together: what the stop scan's automaton holds per
# request (one node a character), so what a request may make the engine thread keep and walk.
DEFAULT_MAX_STOP_CHARS = 4096


@dataclass
class ServeSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    defaults: dict = field(default_factory=dict)  # sampling defaults a request may override
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_stop_chars: int = DEFAULT_MAX_STOP_CHARS  # a request's stop strings, all together


def serve_options(function):
    for option in reversed([
        click.option("--serve", is_flag=True, help="Serve the OpenAI API over HTTP instead of --prompt/--chat."),
        click.option("--host", default="127.0.0.1", show_default=True, help="Address the server listens on."),
        click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
                     help="Port the server listens on (0: any free port, printed)."),
        click.option("--api-key", default=None, envvar="RADIANCE_API_KEY", show_envvar=True,
                     help="Require 'Authorization: Bearer KEY' on every route but /health."),
        click.option("--max-seqs", type=click.IntRange(1), default=None,
                     help=f"Sequences batched in one step (default: {DEFAULT_SERVE_SEQS} with --serve, else 1)."),
        click.option("--max-request-bytes", type=click.IntRange(1), default=DEFAULT_MAX_REQUEST_BYTES,
                     show_default=True, help="A request body larger than this is refused (413) before it is read."),
        click.option("--max-stop-chars", type=click.IntRange(1), default=DEFAULT_MAX_STOP_CHARS, show_default=True,
                     help="Characters a request's stop strings may hold, all together (more: a 400)."),
    ]):
        function = option(function)
    return function


def check_mode(serve: bool, prompt, chat: bool) -> None:
    """Exactly one of --prompt, --chat and --serve."""
    if sum((prompt is not None, bool(chat), bool(serve))) != 1:
        raise click.UsageError("give exactly one of --prompt TEXT, --chat and --serve")


def max_seqs_for(serve: bool, max_seqs: int | None) -> int:
    return max_seqs or (DEFAULT_SERVE_SEQS if serve else 1)
