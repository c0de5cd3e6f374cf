"""rad_stream.h's rad_code_object_for takes the code object of the card's target, then of the chip's
AMD generic family, then the source (the specification's chip-then-family order), and its family
table is selection's (device_targets.FAMILIES): a C program against the installed header says so."""

import os
import subprocess

from radiance.abi import HEADERS_DIR
from radiance.engine.selection.device_targets import FAMILY_OF, accepted_targets

PROGRAM = r"""
#include <stdio.h>
#include "rad_stream.h"
int main(int argc, char** argv) {
    RadCodeObject objects[] = {{"source", 0, 0}, {"gfx10-3-generic", 0, 0}, {"gfx1030", 0, 0},
                               {"gfx9-4-generic", 0, 0}};
    for (int i = 1; i < argc; ++i) {
        RadStreamTable s = {0};
        s.target = argv[i];
        const RadCodeObject* chosen = rad_code_object_for(&s, objects, 4);
        const char* family = rad_target_family(argv[i]);
        printf("%s %s %s\n", argv[i], chosen ? chosen->target : "NULL", family ? family : "-");
    }
    return 0;
}
"""


def test_the_chip_then_its_family_then_the_source(tmp_path):
    source, binary = tmp_path / "pick.c", tmp_path / "pick"
    source.write_text(PROGRAM)
    built = subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-Wall", "-Wextra", "-Werror",
                            f"-I{HEADERS_DIR}", str(source), "-o", str(binary)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    targets = ["gfx1036:xnack-", "gfx1030", "gfx942:sramecc+:xnack-", "gfx1100", "sm_90", "gfx90a", "gfx103"]
    chips = sorted(FAMILY_OF)
    out = subprocess.run([str(binary), *targets, *chips], capture_output=True, text=True, check=True).stdout
    picked = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    assert picked["gfx1036:xnack-"] == ["gfx10-3-generic", "gfx10-3-generic"]  # no gfx1036 object: its family's
    assert picked["gfx1030"] == ["gfx1030", "gfx10-3-generic"]  # the chip's own object first
    assert picked["gfx942:sramecc+:xnack-"] == ["gfx9-4-generic", "gfx9-4-generic"]
    assert picked["gfx1100"] == ["source", "gfx11-generic"]  # no gfx11 object carried
    assert picked["sm_90"] == ["source", "-"] and picked["gfx90a"] == ["source", "-"] and picked["gfx103"][1] == "-"
    for chip in chips:  # the header's table is selection's
        assert picked[chip][1] == FAMILY_OF[chip] == accepted_targets(chip)[-1], chip
