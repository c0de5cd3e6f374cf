"""rad-convert: SOURCE -o OUT.rad [--recipe FILE] | --synthetic NAME -o OUT.rad [--KEY VALUE ...] |
--verify FILE.rad. A synthetic model's shape options are its architecture plugin's (--shape-help).

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

from radiance.abi import RAD_P_F64, RAD_P_INT

from .api import convert, convert_synthetic, synthetic_options
from .errors import ConvertError
from .report import table
from .verify import verify


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


def split_arguments(arguments, synthetic: str | None) -> tuple:
    """(SOURCE or None, {shape option: text}) from what click left: `--KEY VALUE`, `--KEY` (1) and
    `--no-KEY` (0) are a synthetic model's shape options, anything else the source."""
    sources, shape, index = [], {}, 0
    while index < len(arguments):
        token = arguments[index]
        index += 1
        if not token.startswith("--"):
            sources.append(token)
            continue
        if synthetic is None:
            _fail(f"no such option: {token} (shape options go with --synthetic NAME)")
        key = token[2:].replace("-", "_")
        if key.startswith("no_"):
            shape[key[3:]] = "0"
        elif index < len(arguments) and not arguments[index].startswith("--"):
            shape[key], index = arguments[index], index + 1
        else:
            shape[key] = "1"
    if len(sources) > 1:
        _fail(f"one SOURCE, not {len(sources)}: {' '.join(sources)}")
    return (Path(sources[0]) if sources else None), shape


def _shape_help(family: str, radiance_home) -> None:
    click.echo(f"--synthetic {family}: shape options, from its architecture plugin (an integer option "
               f"also takes --KEY for 1 and --no-KEY for 0)")
    for option in synthetic_options(family, radiance_home):
        kind = {RAD_P_INT: "INT", RAD_P_F64: "NUMBER"}.get(option.type, "TEXT")
        click.echo(f"  --{option.key.replace('_', '-') + ' ' + kind:<28} {option.doc} (default {option.deflt})")


@click.command(context_settings={"help_option_names": ["-h", "--help"], "ignore_unknown_options": True})
@click.argument("arguments", nargs=-1, type=click.UNPROCESSED)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="the .rad file to write")
@click.option("--recipe", type=click.Path(path_type=Path), help="TOML or JSON rules: weight pattern -> quantiser")
@click.option("--verify", "verify_file", type=click.Path(path_type=Path), help="check a .rad file's planes")
@click.option("--synthetic", metavar="NAME", help="seeded random weights of a family an architecture plugin takes "
              "(llama, gemma3, ...), shaped by --KEY VALUE options")
@click.option("--shape-help", is_flag=True, help="list --synthetic NAME's shape options and their defaults")
@click.option("--seed", type=int, default=0, show_default=True, help="--synthetic: the weights' seed")
@click.option("--radiance-home", help="plugin search path (default $RADIANCE_HOME, then the in-tree home)")
@click.option("--verbose", is_flag=True, help="one error line per weight; a traceback on failure")
def main(arguments, output, recipe, verify_file, synthetic, shape_help, seed, radiance_home, verbose):
    """Convert a GGUF file or a Hugging Face folder to a .rad container, write a synthetic model
    (--synthetic NAME --KEY VALUE ...: the shape options are its architecture plugin's), or verify a
    container."""
    signal.signal(signal.SIGTERM, _raise_signalled)
    source, shape = split_arguments(arguments, synthetic)
    try:
        if shape_help:
            if not synthetic:
                _fail("--shape-help goes with --synthetic NAME")
            _shape_help(synthetic, radiance_home)
            return
        if verify_file is not None:
            if source or output or synthetic:
                _fail("--verify FILE takes no SOURCE, -o or --synthetic")
            _verify(verify_file)
            return
        if output is None:
            _fail("-o OUT.rad is required")
        if (source is None) == (synthetic is None):
            _fail("give a SOURCE (a GGUF file or a Hugging Face folder) or --synthetic NAME, not both")
        _sweep_partials(output)
        started = time.monotonic()
        if synthetic:
            errors = convert_synthetic(output, synthetic, shape, seed, recipe, radiance_home)
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
