"""A rank ends with its coordinator even where the parent-death signal's SIGTERM came to nothing
(ranks/lifecycle.py's watch_parent): seen once, a rank whose SystemExit was swallowed during its
imports lived on with SIGTERM ignored, waiting for a coordinator that had died 37 minutes before.
Real processes: a parent that starts such a child and is then SIGKILLed."""

import os
import signal
import subprocess
import sys
import time

import psutil

CHILD = """
import os, signal, sys, time
from pathlib import Path
from radiance.ranks.lifecycle import watch_parent
marker = Path(sys.argv[1])
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as after a swallowed SystemExit: SIGTERM ignored
watch_parent(os.getppid(), lambda: marker.write_text("cleaned"), interval=0.1, grace=0.2)
print(os.getpid(), flush=True)
time.sleep(60)
"""

PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
import time
time.sleep(60)
"""


def test_a_child_whose_sigterm_came_to_nothing_ends_with_its_parent(tmp_path):
    marker = tmp_path / "marker"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(marker)], stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        assert child.is_running() and not marker.exists()
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        killed_at = time.monotonic()
        gone, alive = psutil.wait_procs([child], timeout=10)
        assert not alive, "the child outlived its parent"
        assert time.monotonic() - killed_at < 5.0
        assert marker.read_text() == "cleaned"
    finally:
        if parent.poll() is None:
            parent.kill()
