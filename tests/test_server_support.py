"""Running `radiance --serve` / `radiance-launch --serve` as a user does, on a free loopback port
(--port 0: the server prints the port it got), and reading its /metrics."""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import psutil

LISTENING = re.compile(r"listening on (http://[^\s]+)")


class ServerProcess:
    def __init__(self, module: str, *args, env: dict | None = None):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="radiance-serve-", suffix=".log", delete=False)
        environment = {name: value for name, value in os.environ.items() if name != "RADIANCE_API_KEY"}
        environment.update(env or {})
        self.process = subprocess.Popen([sys.executable, "-m", module, "--serve", "--port", "0", *map(str, args)],
                                        stdout=subprocess.DEVNULL, stderr=self.log, env=environment,
                                        start_new_session=True)
        self.url = None

    def output(self) -> str:
        with open(self.log.name) as handle:
            return handle.read()

    def wait_listening(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = LISTENING.search(self.output())
            if found:
                self.url = found.group(1)
                return self.url
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited ({self.process.returncode}):\n{self.output()}")
            time.sleep(0.01)
        raise AssertionError(f"the server did not listen within {timeout} s:\n{self.output()}")

    def wait_ready(self, timeout: float = 120.0) -> list[int]:
        """Poll /health until 200; the statuses seen on the way."""
        self.wait_listening()
        seen, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = httpx.get(f"{self.url}/health", timeout=5).status_code
            seen.append(status)
            if status == 200:
                return seen
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited ({self.process.returncode}):\n{self.output()}")
            time.sleep(0.05)
        raise AssertionError(f"/health never said 200: {seen[-5:]}\n{self.output()}")

    def children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, signum=signal.SIGINT, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"the server did not stop within {timeout} s:\n{self.output()}")
        finally:
            self.log.close()

    def cleanup(self) -> None:
        """A launch still running is asked to stop (SIGTERM: it tears its ranks and segments down), and
        killed with its whole group only if it has not within 20 s: a SIGKILL first left every
        shared-memory segment of the run behind."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        os.unlink(self.log.name)


def metrics(url: str, headers: dict | None = None) -> dict:
    """Every sample of /metrics: {'name{labels}': value}."""
    text = httpx.get(f"{url}/metrics", headers=headers or {}, timeout=10).text
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
