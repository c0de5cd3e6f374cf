"""Two nodes on this machine: network namespaces joined by a veth pair, each with its own /dev/shm
and temporary folder (a private mount namespace binds a folder of the test's over /dev/shm), so a
node's ranks share memory with each other and not with the other node's, as on two machines.
Made and removed by the test; a test that cannot make them is skipped, saying why."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

# RFC 2544's benchmarking range: no route leads out of the namespaces anyway.
ADDRESSES = ("198.18.0.1", "198.18.0.2")


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


def why_not() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) on this machine"
    if shutil.which("unshare") is None:
        return "no `unshare` command (util-linux) on this machine"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    name = f"radprobe{os.getpid()}"
    made = _ip("netns", "add", name)
    if made.returncode:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", name)
    return None


@dataclass
class Node:
    index: int
    namespace: str
    address: str
    shm: Path
    tmp: Path

    def command(self, *args) -> list[str]:
        """`args` run inside this node: its network namespace, its own /dev/shm and temporary folder."""
        inner = f'mount --bind {self.shm} /dev/shm && exec "$@"'
        return ["ip", "netns", "exec", self.namespace, "unshare", "--mount", "--propagation", "private",
                "sh", "-c", inner, "sh", *map(str, args)]

    def environment(self) -> dict:
        return {**os.environ, "TMPDIR": str(self.tmp), "XDG_RUNTIME_DIR": str(self.tmp)}

    def launch(self, *args) -> subprocess.Popen:
        command = self.command(sys.executable, "-m", "radiance.tools.launch", *args)
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.environment(),
                                start_new_session=True)

    def left(self) -> list[str]:
        """What the launch left on this node: files in its /dev/shm and temporary folder."""
        return sorted(str(p) for folder in (self.shm, self.tmp) for p in folder.iterdir())

    def sockets(self) -> list[tuple[str, str, str]]:
        """(state, local address:port, peer address:port) of every TCP socket in the namespace."""
        shown = subprocess.run(["ip", "netns", "exec", self.namespace, "ss", "-Htan"], capture_output=True, text=True)
        rows = [line.split() for line in shown.stdout.splitlines() if line.strip()]
        return [(row[0], row[3], row[4]) for row in rows]


class Nodes:
    """Two namespaces and the veth pair between them; `close` removes them (and so the pair)."""

    def __init__(self, root: Path):
        tag = secrets.token_hex(3)
        self.nodes = []
        self.namespaces = [f"rad{tag}{i}" for i in range(2)]
        for namespace in self.namespaces:
            self._check(_ip("netns", "add", namespace))
        ends = [f"rv{tag}{i}" for i in range(2)]
        self._check(_ip("link", "add", ends[0], "netns", self.namespaces[0], "type", "veth", "peer", "name",
                        ends[1], "netns", self.namespaces[1]))
        for i, (namespace, end, address) in enumerate(zip(self.namespaces, ends, ADDRESSES)):
            self._check(_ip("-n", namespace, "addr", "add", f"{address}/24", "dev", end))
            self._check(_ip("-n", namespace, "link", "set", end, "up"))
            self._check(_ip("-n", namespace, "link", "set", "lo", "up"))
            shm, tmp = root / f"node{i}" / "shm", root / f"node{i}" / "tmp"
            shm.mkdir(parents=True)
            tmp.mkdir(parents=True)
            self.nodes.append(Node(i, namespace, address, shm, tmp))

    def _check(self, done: subprocess.CompletedProcess) -> None:
        if done.returncode:
            self.close()
            raise RuntimeError(f"ip {' '.join(done.args[1:])}: {done.stderr.strip()}")

    def close(self) -> None:
        for namespace in self.namespaces:
            _ip("netns", "del", namespace)


def python_processes(launched: subprocess.Popen) -> list[psutil.Process]:
    """The launch process and everything under it (ip and unshare exec into it)."""
    try:
        top = psutil.Process(launched.pid)
        return [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def ranks_of(launched: subprocess.Popen) -> list[psutil.Process]:
    return [p for p in python_processes(launched) if "radiance.ranks.main" in " ".join(_cmdline(p))]


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def alive(processes: list[psutil.Process]) -> list[int]:
    return [p.pid for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def generate_command(fields: dict, prompt: str, max_tokens: int) -> list[str]:
    """This file run as a script: greedy token ids of `prompt` over the ranks Config(**fields) asks
    for, and each step's eight largest logits (ids, values), printed as JSON (a synthetic model's
    byte-level text may print nothing, and its random weights may repeat one token)."""
    import json

    return [sys.executable, __file__, json.dumps(fields), prompt, str(max_tokens)]


def _generate(fields: str, prompt: str, max_tokens: str) -> None:
    import json

    from radiance.config import Config
    from radiance.generation.sequence import SamplingParams
    from radiance.launch import engine_over, open_ranks

    import numpy as np

    top = []
    with open_ranks(Config(**json.loads(fields), progress=False, return_buffer="logits")) as ranks:
        engine = engine_over(ranks)
        sequence = engine.add(engine.text.encode(prompt), SamplingParams(max_tokens=int(max_tokens), temperature=0,
                                                                       ignore_eos=True))
        while not sequence.finished:
            engine.step()
            logits = np.asarray(ranks.last_result["logits"])[0]
            ids = np.argsort(-logits, kind="stable")[:8]
            top.append([ids.tolist(), logits[ids].tolist()])
    print(json.dumps({"ids": sequence.output_ids, "top": top}))


if __name__ == "__main__":
    _generate(*sys.argv[1:])
