"""Watching the ranks: the first one to die, or to report an error, ends the launch. Teardown
asks politely, then SIGTERM, then SIGKILL after a grace period, and leaves no process behind."""

import signal
import time

from .spawn import RankProcess

GRACE_SECONDS = 2.0


class RankFailed(RuntimeError):
    """A rank ended the launch: which one, how, and its last lines."""

    def __init__(self, rank_process: RankProcess | None, how: str, rank: int | None = None,
                 node: int | None = None, tail: list | None = None):
        self.rank = rank_process.rank if rank_process else rank
        self.node = rank_process.node if rank_process else node
        self.tail = list(rank_process.tail)[-8:] if rank_process else list(tail or [])[-8:]
        detail = ("\n  last lines:\n    " + "\n    ".join(self.tail)) if self.tail else ""
        where = f" on node {self.node}" if self.node is not None else ""
        super().__init__(f"rank {self.rank}{where} failed first: {how}{detail}")
        self.how = how


def exit_description(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with code {returncode}"


class Supervisor:
    def __init__(self, ranks: list[RankProcess]):
        self.ranks = ranks
        self.stopping = False

    def check(self, settle: float = 0.0) -> None:
        """Raise RankFailed for the first rank that has ended unasked; `settle`: keep looking that long
        for one (a ring that found its peer gone can be a moment ahead of the exit status)."""
        if self.stopping:
            return
        deadline = time.monotonic() + settle
        while True:
            for rank_process in self.ranks:
                returncode = rank_process.process.poll()
                if returncode is not None:
                    time.sleep(0.05)  # let the stderr pump take the last lines
                    raise RankFailed(rank_process, exit_description(returncode))
            if time.monotonic() >= deadline:
                return
            time.sleep(0.02)

    def alive(self) -> list[RankProcess]:
        return [r for r in self.ranks if r.process.poll() is None]

    def wait_all(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self.alive()

    def teardown(self, polite_seconds: float = 0.0) -> None:
        """Let asked ranks end by themselves for `polite_seconds`, then SIGTERM, then SIGKILL."""
        self.stopping = True
        if self.wait_all(polite_seconds):
            return
        for rank_process in self.alive():
            rank_process.process.send_signal(signal.SIGTERM)
        if self.wait_all(GRACE_SECONDS):
            return
        for rank_process in self.alive():
            rank_process.process.kill()
        self.wait_all(GRACE_SECONDS)
