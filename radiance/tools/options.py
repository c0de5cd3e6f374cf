"""Options every command shares: where plugins come from and which kernel libraries lead."""

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
debug_selection = click.option(
    "--debug-selection", is_flag=True,
    help="Print the winner of every band and, for each loser, the constraint that refused it.")


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
