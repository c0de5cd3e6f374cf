"""The C headers and radiance.abi cannot drift: gcc prints every constant, struct size and field
offset, and each must equal the mirror's."""

import ctypes
import re
import subprocess

import numpy as np
import pytest

import radiance.abi as abi
from radiance.abi import constants

GUARDS = {"RAD_ABI_H", "RAD_TYPES_H", "RAD_ENCODING_H", "RAD_PLUGIN_H", "RAD_QUANT_H", "RAD_ARCH_H", "RAD_STREAM_H"}


def header_constants():
    names = set()
    for header in abi.HEADERS:
        text = (abi.HEADERS_DIR / header).read_text()
        names |= set(re.findall(r"^#define\s+(RAD_[A-Z0-9_]+)[ \t]+\S", text, re.M))
    return names - GUARDS


def mirror_constants():
    return {name: value for name, value in vars(constants).items() if name.startswith("RAD_")}


def build_probe(tmp_path):
    lines = [*(f"#include \"{h}\"" for h in abi.HEADERS),
             "#include <stdio.h>", "#include <stddef.h>", "int main(void) {"]
    for name, value in mirror_constants().items():
        if isinstance(value, str):
            lines.append(f'  printf("const {name} %s\\n", {name});')
        else:
            lines.append(f'  printf("const {name} %lld\\n", (long long)({name}));')
    for struct in abi.STRUCTS:
        cname = struct.__name__
        lines.append(f'  printf("size {cname} %zu\\n", sizeof({cname}));')
        for field, _ in struct.ctype._fields_:
            lines.append(f'  printf("offset {cname}.{field} %zu\\n", offsetof({cname}, {field}));')
    lines += ["  return 0;", "}"]
    source = tmp_path / "probe.c"
    source.write_text("\n".join(lines))
    binary = tmp_path / "probe"
    subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", "-I", str(abi.HEADERS_DIR), str(source),
                    "-o", str(binary)], check=True, capture_output=True, text=True)
    return subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout


def test_every_header_constant_is_mirrored():
    missing = header_constants() - set(mirror_constants())
    extra = set(mirror_constants()) - header_constants()
    assert not missing, f"in the headers but not in radiance.abi: {sorted(missing)}"
    assert not extra, f"in radiance.abi but not in the headers: {sorted(extra)}"


def test_constants_sizes_and_offsets_match_gcc(tmp_path):
    printed = build_probe(tmp_path)
    mismatches = []
    for line in printed.splitlines():
        what, name, value = line.split(" ", 2)
        if what == "const":
            mirror = mirror_constants()[name]
            if str(mirror) != value:
                mismatches.append(f"{name}: C {value}, Python {mirror}")
        elif what == "size":
            python = ctypes.sizeof(getattr(abi, name).ctype)
            if python != int(value):
                mismatches.append(f"sizeof {name}: C {value}, Python {python}")
        else:
            struct, field = name.split(".")
            python = getattr(getattr(abi, struct).ctype, field).offset
            if python != int(value):
                mismatches.append(f"offsetof {name}: C {value}, Python {python}")
    assert not mismatches, "\n".join(mismatches)
    assert sum(line.startswith("size ") for line in printed.splitlines()) == len(abi.STRUCTS)


@pytest.mark.parametrize("compiler,flags", [("gcc", ["-std=c11", "-x", "c"]), ("g++", ["-std=c++17", "-x", "c++"])])
def test_headers_compile_cleanly(tmp_path, compiler, flags):
    source = tmp_path / "all.src"
    source.write_text("".join(f'#include "{h}"\n' for h in abi.HEADERS) + "int main(void){return 0;}\n")
    result = subprocess.run([compiler, *flags, "-Wall", "-Wextra", "-Werror", "-I", str(abi.HEADERS_DIR),
                             str(source), "-o", str(tmp_path / "a.out")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_mirror_fills_counts_and_keeps_c_field_names():
    row = abi.RadKernelInfo(name="k", op="gemm", constraints=[abi.RAD_CLE("M", 64), abi.RAD_CIN("dtype", "bf16")])
    assert row.n_constraints == 2 and isinstance(row.constraints, tuple)
    for struct in abi.STRUCTS:
        python_fields = [f for f in struct.__dataclass_fields__]
        c_fields = [f for f, _ in struct.ctype._fields_]
        assert python_fields == c_fields, struct.__name__


def test_the_step_inputs_are_the_headers_word_for_word():
    """radiance.abi's STEP_INPUTS says what rad_arch.h's comments say: each step buffer's element
    type and shape, and no other buffer."""
    types = {"i32": np.int32, "f32": np.float32, "u64": np.uint64}
    text = (abi.HEADERS_DIR / "rad_arch.h").read_text()
    stated = {}
    for name, kind, extents in re.findall(r'^#define\s+(RAD_STEP_\w+)\s+"[^"]+"\s+/\*\s*(\w+)\s+\[([^\]]*)\]', text, re.M):
        rows, *cols = [extent.strip() for extent in extents.split(",")]
        col = (int(cols[0]) if cols[0].isdigit() else cols[0]) if cols else None
        stated[getattr(constants, name)] = abi.StepInput(types[kind], rows, col)
    assert len(stated) == 12 and abi.STEP_INPUTS == stated
