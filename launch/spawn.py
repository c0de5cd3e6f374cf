"""Starting the ranks: one process per card (or host ranks), each pinned and told who it is, its
stderr pumped through the launcher line by line and its last lines kept for a failure report."""

import os
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field

from .devices import Card, pin

TAIL_LINES = 20
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                    "RADIANCE_THREADS")


@dataclass
class RankProcess:
    rank: int
    process: subprocess.Popen
    card: Card | None
    node: int | None = None  # the node it runs on, in a launch over several
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    @property
    def pid(self) -> int:
        return self.process.pid


def rank_environment(rank: int, world: int, card: Card | None, threads: int, extra: dict) -> dict:
    environment = pin(card, os.environ)
    environment.update({"RADIANCE_RANK": str(rank), "RADIANCE_WORLD_SIZE": str(world), "RANK": str(rank),
                        "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "PYTHONUNBUFFERED": "1", **extra})
    for variable in THREAD_VARIABLES:
        environment[variable] = str(threads)
    return environment


def _pump(rank_process: RankProcess) -> None:
    for line in rank_process.process.stderr:
        text = line.decode(errors="replace").rstrip("\n")
        rank_process.tail.append(text)
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def spawn_rank(rank: int, world: int, card: Card | None, threads: int, extra: dict,
               node: int | None = None) -> RankProcess:
    process = subprocess.Popen([sys.executable, "-m", "radiance.ranks.main"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env=rank_environment(rank, world, card, threads, extra))
    rank_process = RankProcess(rank, process, card, node)
    threading.Thread(target=_pump, args=(rank_process,), daemon=True, name=f"rank{rank}-stderr").start()
    return rank_process
