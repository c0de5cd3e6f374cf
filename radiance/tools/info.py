"""rad-info: what the engine finds on the search path and how it would select rows."""

import sys

import click

from radiance.abi import KIND_FOLDERS, RAD_DOMAIN_DEVICE, RAD_DOMAIN_HOST, RAD_PLUGIN_ARCH, RAD_PLUGIN_QUANT
from radiance.engine.loading.registry import KernelsError, Registry
from radiance.engine.selection.bands import SelectionError, describe_resolution, resolve

from . import options


def _declarations(plugin) -> str:
    if plugin.candidate.kind == RAD_PLUGIN_QUANT:
        return f"{len(plugin.quantizers)} quantiser{'s' if len(plugin.quantizers) != 1 else ''}"
    if plugin.candidate.kind == RAD_PLUGIN_ARCH:
        return f"{len(plugin.architectures)} architecture{'s' if len(plugin.architectures) != 1 else ''}"
    return f"{len(plugin.schemas)} ops, {len(plugin.rows)} rows"


def _device_code(plugin) -> str:
    if not any(row.info.domain == RAD_DOMAIN_DEVICE for row in plugin.rows):
        return "host only"
    return "device rows: no card on this machine"


def print_plugins(registry: Registry) -> None:
    header = ("kind", "name", "version", "declarations", "reference", "device code", "file")
    table = [header]
    for kind, plugins in registry.plugins.items():
        for plugin in plugins:
            table.append((KIND_FOLDERS[kind], plugin.name, plugin.info.version, _declarations(plugin),
                          "yes" if plugin.reference else "no", _device_code(plugin), str(plugin.path)))
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    for row in table:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    click.echo(f"search path: {':'.join(str(home) for home in registry.homes)}")
    click.echo(f"kernel hierarchy: {', '.join(lib.name for lib in registry.hierarchy) or '(none)'}")
    for refusal in registry.refused:
        click.echo(f"refused: {refusal}")
    for path in registry.declined:
        click.echo(f"declined: {path}: rad_plugin_open returned RAD_E_UNSUPPORTED")
    for shadowed in registry.shadowed:
        click.echo(f"shadowed: {shadowed.candidate.path} (by {shadowed.by.path})")


@click.command()
@click.option("--plugins", "show_plugins", is_flag=True, help="List every plugin on the search path.")
@click.option("--select", "op", default=None, metavar="OP", help="Resolve one op and print its bands.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="A parameter of the op's geometry.")
@click.option("--fact", "facts", multiple=True, metavar="KEY=VALUE", help="A measured fact, e.g. device.p2p=0.")
@click.option("--max-extent", default=8192, show_default=True, help="Upper bound of the ranged extent.")
@click.option("--device", is_flag=True, help="Resolve for the device domain instead of the host.")
@options.radiance_home
@options.kernels
@options.accept_reference
@options.debug_selection
def main(show_plugins, op, params, facts, max_extent, device, radiance_home, kernels, accept_reference,
         debug_selection):
    """List plugins as the engine loads them, or resolve an op's rows band by band."""
    try:
        registry = Registry(radiance_home, kernels)
    except KernelsError as error:
        raise click.ClickException(str(error))
    try:
        if show_plugins or op is None:
            print_plugins(registry)
        if op is not None:
            if op not in registry.ops:
                raise click.ClickException(f"no loaded library declares op '{op}'")
            resolution = resolve(op, registry.ops[op].schema, registry.rows_for(op),
                                 options.parse_assignments(params, "--param"),
                                 {"device.p2p": 0, **options.parse_assignments(facts, "--fact")},
                                 RAD_DOMAIN_DEVICE if device else RAD_DOMAIN_HOST, max_extent, accept_reference)
            lines = describe_resolution(resolution)
            click.echo("\n".join(lines if debug_selection else [line for line in lines if not line.startswith(" ")]))
    except SelectionError as error:
        raise click.ClickException(str(error))
    finally:
        registry.close()


if __name__ == "__main__":
    sys.exit(main())
