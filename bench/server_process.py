"""`radiance --serve` as a child process of a bench: started with its log in a file, its URL read
from the log's "listening on" line, and stopped by SIGINT (its own orderly exit) on the way out,
killed only where that takes over a minute."""

import contextlib
import re
import subprocess
import time
from pathlib import Path


@contextlib.contextmanager
def running_server(command: list[str], log_path: Path, seconds: float = 600.0):
    """Yields (process, url) once the server listens; url is None where it exited or did not listen
    within `seconds` (the log says why). The model may still be loading: rad-bench and
    radiance.serving.bench.wait_until_ready wait for /health."""
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        url, deadline = None, time.monotonic() + seconds
        while url is None and time.monotonic() < deadline and server.poll() is None:
            found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", log_path.read_text())
            url = found.group(1) if found else None
            if url is None:
                time.sleep(0.1)
        yield server, url
    finally:
        server.send_signal(2)  # SIGINT
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
