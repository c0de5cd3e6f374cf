"""rad-convert: SOURCE -o OUT.rad [--recipe FILE] | --synthetic llama -o OUT.rad [shape] | --verify FILE.rad.

Bad input is one line on stderr, `rad-convert: error: <file>: <what>`, and exit status 1; no
traceback unless --verbose, and no OUT (nor OUT.partial) left behind. SIGTERM and Ctrl-C stop it
the same way (the partial file removed); a partial file that a killed conversion left in OUT's
folder is removed by the next one (radiance/weights/partials.py tells a dead writer's)."""

import signal
import sys
import time
from pathlib import Path

import click

from radiance.engine.loading.homes import HomeError
from radiance.weights.container_format import ContainerError
from radiance.weights.partials import sweep

from .api import convert, convert_synthetic
from .errors import ConvertError
from .report import table
from .synthetic import LlamaShape
from .verify import verify

SHAPE = LlamaShape()


def _fail(message: str):
    click.echo(f"rad-convert: error: {message}", err=True)
    sys.exit(1)


class _Signalled(BaseException):
    """SIGTERM, raised where the main thread is, so the writer's `with` drops the partial file as
    it does for Ctrl-C (the weights being written stop at their next row block)."""


def _raise_signalled(signum, frame):
    signal.signal(signum, signal.SIG_IGN)  # one is enough: let the cleanup finish
    raise _Signalled(signum)


def _sweep_partials(output: Path) -> None:
    for path in sweep(output.parent):
        click.echo(f"rad-convert: removed {path}: a conversion that was killed left it", err=True)


def _shape_options(command):
    for flag, key, kind, help_text in reversed([
            ("--hidden", "hidden", int, "model width"), ("--layers", "layers", int, "transformer blocks"),
            ("--heads", "heads", int, "attention heads"), ("--kv-heads", "kv_heads", int, "key/value heads"),
            ("--head-dim", "head_dim", int, "per head (default hidden / heads)"),
            ("--ffn", "ffn", int, "feed-forward width"), ("--vocab", "vocab", int, "vocabulary size"),
            ("--context", "context", int, "context length"), ("--rope-theta", "rope_theta", float, "rope base"),
            ("--rms-eps", "rms_eps", float, "RMS norm epsilon")]):
        command = click.option(flag, key, type=kind, default=getattr(SHAPE, key), show_default=True,
                               help=f"--synthetic: {help_text}")(command)
    return command


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("source", required=False, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="the .rad file to write")
@click.option("--recipe", type=click.Path(path_type=Path), help="TOML or JSON rules: weight pattern -> quantiser")
@click.option("--verify", "verify_file", type=click.Path(path_type=Path), help="check a .rad file's planes")
@click.option("--synthetic", type=click.Choice(["llama"]), help="seeded random weights of the shape below")
@_shape_options
@click.option("--tie-embeddings/--no-tie-embeddings", default=SHAPE.tie_embeddings, show_default=True,
              help="--synthetic: output shares token_embd")
@click.option("--seed", type=int, default=0, show_default=True, help="--synthetic: the weights' seed")
@click.option("--radiance-home", help="plugin search path (default $RADIANCE_HOME, then the in-tree home)")
@click.option("--verbose", is_flag=True, help="one error line per weight; a traceback on failure")
def main(source, output, recipe, verify_file, synthetic, seed, radiance_home, verbose, **shape):
    """Convert a GGUF file or a Hugging Face folder to a .rad container, write a synthetic model, or
    verify a container."""
    signal.signal(signal.SIGTERM, _raise_signalled)
    try:
        if verify_file is not None:
            if source or output or synthetic:
                _fail("--verify FILE takes no SOURCE, -o or --synthetic")
            _verify(verify_file)
            return
        if output is None:
            _fail("-o OUT.rad is required")
        if (source is None) == (synthetic is None):
            _fail("give a SOURCE (a GGUF file or a Hugging Face folder) or --synthetic llama, not both")
        _sweep_partials(output)
        started = time.monotonic()
        if synthetic:
            errors = convert_synthetic(output, LlamaShape(**shape), seed, recipe, radiance_home)
        else:
            errors = convert(source, output, recipe, radiance_home)
        click.echo(table(errors, per_weight=verbose), err=True)
        click.echo(f"wrote {output}: {len(errors)} weights, {output.stat().st_size / 2**20:.1f} MiB "
                   f"in {time.monotonic() - started:.1f} s", err=True)
    except (_Signalled, KeyboardInterrupt) as stop:
        signum = stop.args[0] if isinstance(stop, _Signalled) else signal.SIGINT
        click.echo(f"rad-convert: stopped by {signal.Signals(signum).name}"
                   f"{f'; {output} not written' if output is not None and verify_file is None else ''}", err=True)
        sys.exit(128 + signum)
    except (ConvertError, ContainerError, HomeError) as error:
        if verbose:
            raise
        _fail(str(error))
    except OSError as error:
        if verbose:
            raise
        _fail(f"{error.filename}: {error.strerror}" if error.filename else str(error))
    except Exception as error:  # an input nothing above foresaw: still one line, the traceback on request
        if verbose:
            raise
        _fail(f"{source or verify_file or output}: {type(error).__name__}: {error} (--verbose shows where)")


def _verify(path: Path):
    problems = verify(path)
    for problem in problems:
        click.echo(f"rad-convert: error: {path}: {problem}", err=True)
    if problems:
        sys.exit(1)
    click.echo(f"OK {path}")


if __name__ == "__main__":
    main()
