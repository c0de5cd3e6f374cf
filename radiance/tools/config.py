"""rad-config: where this radiance keeps what a C plugin builds against, for a build system to ask
(as pybind11-config answers for pybind11):

    cmake -S . -B build -Dradiance_DIR="$(rad-config --cmakedir)"
    cc -shared -fPIC -I"$(rad-config --includedir)" -o mylib.so mylib.c
"""

import click

from radiance.abi import HEADERS_DIR, RAD_ABI_VERSION
from radiance.plugins import HOME

CMAKE_DIR = HEADERS_DIR / "cmake"


@click.command()
@click.option("--cmakedir", "what", flag_value="cmakedir", help="The CMake package's folder (find_package(radiance)).")
@click.option("--includedir", "what", flag_value="includedir", help="The folder of the abi/ headers (rad_abi.h ...).")
@click.option("--home", "what", flag_value="home", help="The installed home: where cmake --install puts a plugin by default.")
@click.option("--abi", "what", flag_value="abi", help="The plugin ABI number (RAD_ABI_VERSION).")
def main(what):
    """Print where this radiance keeps what a plugin builds against (one line), or all of it."""
    answers = {"cmakedir": CMAKE_DIR, "includedir": HEADERS_DIR, "home": HOME, "abi": RAD_ABI_VERSION}
    if what is None:
        for key, value in answers.items():
            click.echo(f"{key}: {value}")
    else:
        click.echo(answers[what])


if __name__ == "__main__":
    main()
