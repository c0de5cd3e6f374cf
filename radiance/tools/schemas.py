"""rad-schemas A B ...: every schema disagreement between plugins, at once. Works on a plugin the
engine would refuse (an ABI mismatch, say): it only imports the file (or opens the .so) and reads
its schemas."""

import sys
from pathlib import Path

import click

from radiance.abi import RAD_PLUGIN_KERNEL
from radiance.engine.loading.hierarchy import entry_matches
from radiance.engine.loading.homes import Candidate, discover, search_path
from radiance.engine.loading.loader import open_module
from radiance.engine.loading.records import PluginRefused
from radiance.engine.loading.registry import schema_difference

from . import options


def find(entry: str, homes) -> Candidate:
    path = Path(entry).expanduser()
    if path.exists():
        return Candidate(path.resolve(), path.resolve().parent.parent, RAD_PLUGIN_KERNEL)
    candidates, _ = discover(homes, RAD_PLUGIN_KERNEL)
    for candidate in candidates:
        if entry_matches(entry, candidate.path, candidate.name):
            return candidate
    raise click.ClickException(f"'{entry}' is neither a file nor a kernel library on {':'.join(map(str, homes))}")


def read_schemas(candidate: Candidate) -> list:
    module = open_module(candidate)
    count = module.rad_kernel_schema_count()
    return [module.rad_kernel_schema_at(i) for i in range(count)]


@click.command()
@click.argument("plugins", nargs=-1, required=True)
@options.radiance_home
def main(plugins, radiance_home):
    """Print every schema disagreement between PLUGINS (names or paths); exit 1 on any."""
    homes = search_path(radiance_home)
    first_declared = {}  # op -> (schema, path)
    disagreements = 0
    for entry in plugins:
        candidate = find(entry, homes)
        try:
            schemas = read_schemas(candidate)
        except (PluginRefused, AttributeError, TypeError, ValueError) as error:
            raise click.ClickException(f"{candidate.path}: cannot read its schemas: {error}")
        for schema in schemas:
            if schema.op not in first_declared:
                first_declared[schema.op] = (schema, candidate.path)
                continue
            fixed, where = first_declared[schema.op]
            difference = schema_difference(fixed, schema)
            if difference:
                disagreements += 1
                click.echo(f"op '{schema.op}': {candidate.path} disagrees with {where}: {difference}")
    click.echo(f"{disagreements} disagreement{'s' if disagreements != 1 else ''} "
               f"across {len(plugins)} plugins, {len(first_declared)} ops")
    sys.exit(1 if disagreements else 0)


if __name__ == "__main__":
    main()
