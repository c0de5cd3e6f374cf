"""What a user sees when something is wrong: one line naming the file, field or rank and what is
wrong, and a non-zero exit; a traceback only with --verbose."""

import contextlib
import sys

import click

from radiance.engine.loading.model import ModelError
from radiance.engine.loading.registry import KernelsError
from radiance.engine.selection.bands import SelectionError
from radiance.engine.selection.shard import ShardError
from radiance.generation.text import TextError
from radiance.weights.container_format import ContainerError

USER_ERRORS = (ModelError, KernelsError, SelectionError, ShardError, TextError, ContainerError, ValueError,
               MemoryError, OSError)


@contextlib.contextmanager
def user_errors(program: str, verbose: bool, extra: tuple = ()):
    try:
        yield
    except KeyboardInterrupt:
        click.echo(f"{program}: interrupted", err=True)
        sys.exit(130)
    except (*USER_ERRORS, *extra) as error:
        if verbose:
            raise
        click.echo(f"{program}: error: {error}", err=True)
        sys.exit(1)
