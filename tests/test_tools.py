"""rad-info and rad-schemas, run as a user runs them."""

import subprocess

from conftest import PREAMBLE, script
from radiance.abi import RAD_ABI_VERSION

ALPHA = 'SCHEMAS = [schema("t_gemm", ("M", "N")), schema("t_add", ("M", "n"))]\nROWS = [row("a", "t_gemm")]\n'
BETA = 'SCHEMAS = [schema("t_gemm", ("M", "K")), schema("t_add", ("M",))]\nROWS = [row("b", "t_gemm")]\n'


def run(command, *args, env=None):
    """The console script `command` of the Python running the tests (beside it, else on PATH: a stale
    one earlier on PATH, from another install, is not the one under test)."""
    return subprocess.run([script(command), *args], capture_output=True, text=True, env=env)


def test_rad_info_lists_loaded_refused_and_shadowed(home, second_home):
    home.kernel("alpha", ALPHA)
    home.kernel("stale", ALPHA.replace('"a"', '"s"'), abi="12")
    home.kernel("mine", ALPHA.replace('"a"', '"m"').replace("t_", "u_"), filename="dup.py")
    shadowed = second_home.kernel("theirs", ALPHA.replace("t_", "v_"), filename="dup.py")
    result = run("rad-info", "--plugins", "--radiance-home", f"{home.root}:{second_home.root}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    alpha = next(line for line in lines if line.startswith("kernels") and " alpha " in line)
    assert "2 ops, 1 rows" in alpha and "host only" in alpha and str(home.root / "kernels" / "alpha.py") in alpha
    assert any(line.startswith("kernels") and " libref " in line and " yes " in line for line in lines)
    assert f"refused: {home.root / 'kernels' / 'stale.py'}: built for ABI 12, this engine is ABI {RAD_ABI_VERSION}" in lines
    assert f"shadowed: {shadowed} (by {home.root / 'kernels' / 'dup.py'})" in lines


def test_rad_info_select_prints_bands_and_losers(home):
    home.kernel("lib", 'SCHEMAS = [schema("t_gemm")]\nROWS = [row("small", "t_gemm", RAD_CLE("M", 64)), '
                       'row("large", "t_gemm", RAD_CGE("M", 65))]\n')
    result = run("rad-info", "--radiance-home", str(home.root), "--select", "t_gemm", "--max-extent", "512",
                 "--debug-selection")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "t_gemm M=[1, 64] host: lib:small", "    lib:large lost: M >= 65 does not hold for M in [1, 64]",
        "t_gemm M=[65, 512] host: lib:large", "    lib:small lost: M <= 64 does not hold for M in [65, 512]"]


def test_rad_schemas_prints_every_disagreement_even_for_an_unloadable_plugin(home):
    alpha = home.kernel("alpha", ALPHA)
    beta = home.kernel("beta", BETA, abi="3")  # the engine would refuse it; rad-schemas still reads it
    result = run("rad-schemas", str(alpha), str(beta))
    assert result.returncode == 1
    assert f"op 't_gemm': {beta} disagrees with {alpha}: parameter 1 is 'N' (int, required, none) there, 'K' (int, required, none) here" in result.stdout
    assert f"op 't_add': {beta} disagrees with {alpha}: parameter 1 is 'n' (str, required, none) there, nothing here" in result.stdout
    assert "2 disagreements across 2 plugins, 2 ops" in result.stdout


def test_rad_schemas_agreeing_plugins_exit_zero(home):
    home.kernel("alpha", ALPHA)
    home.kernel("gamma", ALPHA.replace('"a"', '"g"'))
    result = run("rad-schemas", "alpha", "gamma", "--radiance-home", str(home.root))
    assert result.returncode == 0 and "0 disagreements across 2 plugins, 2 ops" in result.stdout


def test_preamble_is_the_fixture_plugins_source():
    assert "rad_plugin_abi_version" in PREAMBLE
