"""Running radiance-launch as a user does, and checking what it leaves behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

SHM = Path("/dev/shm")


def as_a_foreground_job() -> None:
    """In the child, before exec: SIGINT at its default, as a shell starts a foreground job. A test
    run in the background of a shell without job control (`pytest ... &`, as load runs are) inherits
    SIGINT ignored, and so would the launch, where Python then installs no KeyboardInterrupt: the
    Ctrl-C the test sends would be ignored and the launch would stream on. A user's Ctrl-C reaches
    a foreground job, whose SIGINT is always at its default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Launch:
    def __init__(self, *args, env=None):
        environment = {**os.environ, **(env or {})}
        self.process = subprocess.Popen([sys.executable, "-m", "radiance.tools.launch", *map(str, args)],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment,
                                        start_new_session=True, preexec_fn=as_a_foreground_job)
        self.ranks: list[psutil.Process] = []
        self.run_id = None

    def wait_for_ranks(self, count: int, timeout: float = 60.0) -> list[psutil.Process]:
        """The launch's rank processes, once `count` are up (60 s: the launcher's imports and checks take
        tens of seconds on a 2-core machine at load 10)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            children = [c for c in psutil.Process(self.process.pid).children()
                        if "radiance.ranks.main" in " ".join(self._cmdline(c))]
            if len(children) == count:
                self.ranks = sorted(children, key=lambda c: int(c.environ().get("RADIANCE_RANK", 0)))
                self.run_id = self.ranks[0].environ()["RADIANCE_RUN_ID"]
                return self.ranks
            time.sleep(0.01)
        raise AssertionError(f"{count} ranks did not start")

    @staticmethod
    def _cmdline(process):
        try:
            return process.cmdline()
        except psutil.Error:
            return []

    def rank(self, index: int) -> psutil.Process:
        return self.ranks[index]

    def read_until(self, text: str, timeout: float = 60.0) -> str:
        """stdout until `text` has appeared (the generation is under way)."""
        seen, deadline = b"", time.monotonic() + timeout
        os.set_blocking(self.process.stdout.fileno(), False)
        while text.encode() not in seen and time.monotonic() < deadline:
            chunk = self.process.stdout.read(4096)
            seen += chunk or b""
            time.sleep(0.01)
        return seen.decode(errors="replace")

    def finish(self, timeout: float = 60.0):
        stdout, stderr = self.process.communicate(timeout=timeout)
        return self.process.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace")

    def signal(self, signum) -> None:
        self.process.send_signal(signum)

    def leftovers(self) -> list[str]:
        """Processes, shared-memory segments and run folders of this launch still present."""
        left = [f"process {r.pid}" for r in self.ranks if r.is_running() and r.status() != psutil.STATUS_ZOMBIE]
        if self.run_id:
            left += [str(p) for p in SHM.glob(f"rad.{self.run_id}.*")]
            left += [str(p) for p in Path(self._run_folder_base()).glob(self.run_id)]
        return left

    def _run_folder_base(self) -> str:
        import tempfile

        runtime = os.environ.get("XDG_RUNTIME_DIR")
        return runtime if runtime and os.access(runtime, os.W_OK) else tempfile.gettempdir()


def wait_gone(launch: Launch, timeout: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not launch.leftovers():
            return []
        time.sleep(0.05)
    return launch.leftovers()


def kill(process: psutil.Process, signum=signal.SIGKILL) -> None:
    os.kill(process.pid, signum)
