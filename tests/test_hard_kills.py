"""A hard kill leaves nothing: `kill -9` of radiance-launch while its ranks are still starting takes
the ranks with it and the run folder (the socket and the secret) too; SIGTERM of rad-convert removes
its .partial file, and a .partial whose writer was killed outright is swept by the next rad-convert
into that folder. Real processes throughout, looked at with psutil and the filesystem."""

import os
import signal
import subprocess
import sys
import time

import psutil

from launch_support import Launch, wait_gone


def test_a_coordinator_killed_while_its_ranks_start_leaves_nothing(smollm2):
    """The ranks set the parent-death signal before their imports (seconds here), and a rank that
    ends on it removes the run folder, which the coordinator killed with SIGKILL cannot. (A rank
    inside one extension module's initialisation, C code that runs no Python, ends when it returns:
    ml_dtypes' takes 2-3 s on this shared VM, hence 5 s, as for every supervision test.)"""
    launch = Launch("--tp", 3, "--model", smollm2, "--prompt", "hi", "--max-tokens", 4)
    ranks = launch.wait_for_ranks(3)
    folder = os.path.dirname(ranks[0].environ()["RADIANCE_SECRET_FILE"])
    assert os.path.isdir(folder)
    launch.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    launch.process.wait(10)
    gone, alive = psutil.wait_procs(ranks, timeout=10)
    took = time.monotonic() - killed_at
    assert not alive, f"ranks outlived their coordinator: {alive}"
    assert took < 5.0, f"the ranks took {took:.1f} s to die with their coordinator"
    assert wait_gone(launch) == [], "the run folder or segments outlived the launch"
    assert not os.path.exists(folder)


TINY = ["--synthetic", "llama", "--hidden", 64, "--layers", 1, "--heads", 4, "--kv-heads", 2, "--ffn", 96,
        "--vocab", 300]


def rad_convert(*args, **popen):
    return subprocess.Popen([sys.executable, "-m", "radiance.convert.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def wait_writing(process, partial, timeout=120.0):
    """Until `partial` holds the header and the first weights (the conversion is under way)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if partial.exists() and partial.stat().st_size > 1 << 20:
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{partial} was not being written within {timeout} s")


def test_sigterm_of_rad_convert_removes_its_partial_file(smollm2_gguf, tmp_path):
    output = tmp_path / "out.rad"
    process = rad_convert(smollm2_gguf, "-o", output)
    wait_writing(process, tmp_path / "out.rad.partial")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert stderr.splitlines()[-1] == f"rad-convert: stopped by SIGTERM; {output} not written"
    assert "Traceback" not in stderr
    assert list(tmp_path.iterdir()) == []


def test_a_killed_writers_partial_file_is_swept_by_the_next_rad_convert(smollm2_gguf, tmp_path):
    """A live writer's partial file is left alone; once its writer is killed outright (nothing of
    it can clean up), the next conversion into the folder removes it and says so."""
    partial = tmp_path / "big.rad.partial"
    writer = rad_convert(smollm2_gguf, "-o", tmp_path / "big.rad")
    try:
        wait_writing(writer, partial)
        writer.send_signal(signal.SIGSTOP)  # alive and writing (its lock held), but it cannot finish meanwhile
        beside = subprocess.run([sys.executable, "-m", "radiance.convert.cli", *map(str, TINY), "-o",
                                 tmp_path / "small.rad"], capture_output=True, text=True, timeout=120)
        assert beside.returncode == 0, beside.stderr
        assert partial.exists() and "removed" not in beside.stderr
        writer.kill()
        writer.communicate(timeout=30)
        assert partial.exists()  # SIGKILL: nothing of the writer ran
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.communicate()
    after = subprocess.run([sys.executable, "-m", "radiance.convert.cli", *map(str, TINY), "-o", tmp_path / "next.rad"],
                           capture_output=True, text=True, timeout=120)
    assert after.returncode == 0, after.stderr
    assert f"rad-convert: removed {partial}: a conversion that was killed left it" in after.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["next.rad", "small.rad"]
