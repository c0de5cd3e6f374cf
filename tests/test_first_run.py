"""A first run works everywhere, and what goes wrong in it says so at once: every import of the
distribution is a dependency it declares; a launch checks what it can before it starts any rank;
the tuning aids reach launched ranks; rad-info names every missing parameter at once; a plugin home
that is not there is an error; Ctrl-C in a chat ends the reply, not the session; the README's
commands and sample outputs are what the code does, and the docs name no command or file that is
not there. Real processes and the real model."""

import ast
import importlib.metadata
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Import names of the optional extras' distributions that are not installed here (no card, no plot).
NOT_INSTALLED = {"cuda": "cuda-bindings", "hip": "hip-python", "matplotlib": "matplotlib"}


def run(module, *args, **kwargs):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=300, **kwargs)


def last_line(result) -> str:
    return [line for line in result.stderr.splitlines() if line.strip()][-1]


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")


def _runtime_closure() -> set[str]:
    """The declared dependencies and, installed here, what they need in turn (no extras of theirs)."""
    names, todo = set(), [_name(r) for r in PROJECT["dependencies"]]
    while todo:
        name = todo.pop()
        if name in names:
            continue
        names.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [_name(r) for r in requires if "extra ==" not in r]
    return names


def test_every_import_is_a_declared_dependency():
    """What `pip install -e .` installs is enough for every module (safetensors was only in [test],
    so rad-convert died of a ModuleNotFoundError); an optional extra's import is allowed (cuda, rocm,
    bench), the test extra's is not."""
    allowed = _runtime_closure()
    for extra, requirements in PROJECT["optional-dependencies"].items():
        if extra != "test":
            allowed |= {_name(r) for r in requirements}
    distributions = importlib.metadata.packages_distributions()
    undeclared = {}
    for folder in ("radiance", "abi", "collectives", "launch", "ranks", "plugins"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top in sys.stdlib_module_names or top == "radiance":
                        continue
                    names = distributions.get(top) or [NOT_INSTALLED.get(top, top)]
                    if not any(_name(name) in allowed for name in names):
                        undeclared.setdefault(top, str(path.relative_to(ROOT)))
    assert not undeclared, f"imported but not a runtime dependency: {undeclared}"


def test_a_launch_checks_the_split_before_it_starts_a_rank(smollm2):
    """SmolLM2's 3 KV heads do not split over 2 ranks: one line, once, before any rank starts."""
    result = run("radiance.tools.launch", "--tp", 2, "--model", smollm2, "--prompt", "hi")
    assert result.returncode == 1
    assert last_line(result) == (f"radiance-launch: error: {smollm2} does not split over --tp 2: node 'layers.0.attn.k': "
                                 "N is 3 parts, which the 2 ranks neither divide nor replicate evenly")  # 3 KV heads
    assert result.stderr.count("does not split") == 1 and "[rank" not in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_launch_checks_the_plugin_home_before_it_starts_a_rank(smollm2, tmp_path):
    missing = tmp_path / "nowhere"
    for module, program, extra in (("radiance.tools.launch", "radiance-launch", ()),
                                   ("radiance.tools.generate", "radiance", ("--tp", 3))):
        result = run(module, "--model", smollm2, "--prompt", "hi", "--radiance-home", missing, *extra)
        assert result.returncode == 1
        assert last_line(result) == f"{program}: error: --radiance-home: {missing} is not a folder"
        assert "[rank" not in result.stderr and "Traceback" not in result.stderr


def test_radiance_home_from_the_environment_that_is_not_there(tmp_path):
    missing = tmp_path / "gone"
    result = run("radiance.tools.info", "--plugins", env={**os.environ, "RADIANCE_HOME": str(missing)})
    assert result.returncode == 1 and last_line(result) == f"Error: $RADIANCE_HOME: {missing} is not a folder"


def test_debug_selection_reaches_launched_ranks(smollm2):
    """`radiance --tp 3 --debug-selection` dropped the flag; radiance-launch had none."""
    for module, extra in (("radiance.tools.generate", ("--tp", 3)), ("radiance.tools.launch", ("--tp", 1))):
        result = run(module, "--model", smollm2, "--prompt", "hi", "--max-tokens", 1, "--debug-selection", *extra)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "gemm M=[1, 16] host: libr4d:r4d_gemv_q4_1" in result.stderr, result.stderr[-3000:]
        assert result.stderr.count("embedding M=[1, 256] host: libr4d:r4d_embedding") == 1
        assert "lost: a reference row serves only with --debug-accept-reference-kernels" in result.stderr


def test_rad_info_select_names_every_missing_parameter_at_once():
    result = run("radiance.tools.info", "--select", "gemm")
    assert result.returncode == 1
    assert last_line(result) == ("Error: op 'gemm' needs 4 more parameters: N, K, wdtype, dtype "
                                 "(--param N=... --param K=... --param wdtype=... --param dtype=...)")
    given = run("radiance.tools.info", "--select", "gemm", "--param", "N=64", "--param", "K=64", "--param",
                "wdtype=q4_1", "--param", "dtype=f32", "--max-extent", 64)
    assert given.returncode == 0 and "gemm M=[1, 16] host: libr4d:r4d_gemv_q4_1" in given.stdout, given.stderr


def test_a_nan_sampling_value_is_refused_before_loading(tiny_model):
    result = run("radiance.tools.generate", "--model", tiny_model, "--prompt", "hi", "--temperature", "nan")
    assert result.returncode == 1 and last_line(result) == "radiance: error: temperature must be a finite number, not nan"


def test_ctrl_c_in_a_chat_ends_the_reply_not_the_session(smollm2):
    chat = subprocess.Popen([sys.executable, "-m", "radiance.tools.generate", "--model", str(smollm2), "--chat",
                             "--temperature", "0", "--max-tokens", "400"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        chat.stdin.write(b"Tell me a long story about a dragon.\n")
        chat.stdin.flush()
        os.set_blocking(chat.stdout.fileno(), False)
        seen, deadline = b"", time.monotonic() + 180
        while len(seen) < 40 and time.monotonic() < deadline:
            seen += chat.stdout.read() or b""
            time.sleep(0.05)
        assert len(seen) >= 40, "the reply did not start"
        chat.send_signal(signal.SIGINT)
        time.sleep(0.5)
        chat.stdin.write(b"What is the capital of France?\n\n")
        chat.stdin.flush()
        os.set_blocking(chat.stdout.fileno(), True)
        stdout, stderr = chat.communicate(timeout=180)
    finally:
        if chat.poll() is None:
            chat.kill()
            chat.communicate()
    stdout, stderr = (seen + stdout).decode(), stderr.decode()
    assert chat.returncode == 0, stderr[-3000:]
    assert "(reply interrupted)" in stderr and "interrupted" not in stderr.replace("(reply interrupted)", "")
    story, answer = stdout.split("\n", 1)
    assert story.startswith("There was") and "Paris" in answer, stdout


# ---- the README and the docs ----------------------------------------------------------------------

README = (ROOT / "README.md").read_text()
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_command_a_works_on_any_number_of_cards():
    """Command (a) runs one rank (the card this process sees, else the host): no --tp above 1,
    which needs that many cards where there are cards."""
    (command,) = [line for line in README.splitlines() if "rad-convert" in line and "smollm2.rad" in line and "&&" in line]
    run_part = command.split("&&")[-1]
    assert run_part.split()[0] in PROJECT["scripts"]
    tp = re.search(r"--tp (\d+)", run_part)
    assert tp is None or int(tp.group(1)) == 1, run_part


def _sample(command: str) -> str:
    """What the README shows a command printing (the lines after `$ command` up to the next `$` or fence)."""
    lines = README.splitlines()
    start = lines.index(f"$ {command}") + 1
    shown = []
    for line in lines[start:]:
        if line.startswith("$ ") or line.startswith("```"):
            break
        shown.append(line)
    return "\n".join(shown)


def test_readme_rad_info_table_is_what_rad_info_prints():
    result = run("radiance.tools.info", "--plugins", env={key: value for key, value in os.environ.items()
                                                           if key not in ("RADIANCE_HOME", "RADIANCE_KERNELS")})
    assert result.returncode == 0, result.stderr
    import radiance.plugins

    site = str(Path(radiance.plugins.__file__).resolve().parent.parent)
    printed = "\n".join(line.rstrip() for line in result.stdout.replace(site, "<site>/radiance").splitlines())
    shown = "\n".join(line.rstrip() for line in _sample("rad-info --plugins").splitlines())
    # The columns are as wide as their widest cell, and <site> is not the path's width: compare cells.
    assert [line.split() for line in printed.splitlines()] == [line.split() for line in shown.splitlines()]


def test_readme_sample_outputs_are_what_the_commands_print(smollm2, tmp_path):
    completion = "radiance --model smollm2.rad --prompt \"The capital of France is\" --temperature 0 --max-tokens 24"
    chat = "printf 'How many days are in a week?\\n\\n' | radiance --model smollm2.rad --chat --temperature 0"
    (tmp_path / "smollm2.rad").symlink_to(smollm2)
    got = run("radiance.tools.generate", "--model", "smollm2.rad", "--prompt", "The capital of France is",
              "--temperature", 0, "--max-tokens", 24, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    # The first line exactly; the rest of 24 greedy tokens may differ in its last ones on another CPU.
    assert got.stdout.splitlines()[0] == _sample(completion).splitlines()[0]
    answered = run("radiance.tools.generate", "--model", "smollm2.rad", "--chat", "--temperature", 0, cwd=tmp_path,
                   input="How many days are in a week?\n\n")
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout.strip() == _sample(chat).strip()


def _scripts_named(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w/.-])((?:rad|radiance)-[a-z]+(?:-[a-z]+)*)\b", text))


def test_the_docs_name_no_command_that_does_not_exist():
    """Every rad-*/radiance-* command the docs name is one of pyproject's scripts."""
    scripts = set(PROJECT["scripts"])
    missing = [f"{doc.name}:{number}: {name}" for doc in DOCS
               for number, line in enumerate(doc.read_text().splitlines(), 1)
               for name in _scripts_named(line) if name not in scripts]
    assert not missing, missing


def test_the_docs_name_no_file_that_does_not_exist():
    """Every `path/like/this.py` (or .md, .c, .cu, .h, .json, .txt, .toml) the docs name in backquotes
    is a file of the tree (from the root, or from radiance/ or radiance/engine/, as the docs write
    them), and every `Name.md` too."""
    missing = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for path in re.findall(r"`([\w./-]+/[\w.-]+\.(?:py|md|c|cu|h|json|txt|toml))[`:]", line):
                if not any((base / path).exists() for base in (ROOT, ROOT / "radiance", ROOT / "radiance/engine")):
                    missing.append(f"{doc.name}:{number}: {path}")
            for name in re.findall(r"`([^`/]+\.md)`", line):
                if not (ROOT / name).exists() and not (ROOT / "docs" / name).exists():
                    missing.append(f"{doc.name}:{number}: {name}")
    assert not missing, missing
