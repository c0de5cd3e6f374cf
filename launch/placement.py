"""Where this node stands in a launch over several: torchrun's names given on the command line
(--nnodes, --node-rank, --master-addr, --master-port), or, under Slurm (`srun radiance-launch …`,
one task a node), the same read from the step's environment where the command line leaves them:
SLURM_NNODES, SLURM_NODEID, and node 0's host name, the first of SLURM_STEP_NODELIST (MASTER_ADDR
and MASTER_PORT, where set, as torchrun takes them)."""

import os
import re
import shutil
import socket
import subprocess

SLURM = ("SLURM_NNODES", "SLURM_NODEID", "SLURM_STEP_NODELIST")
DEFAULT_PORT = 29500  # torchrun's


class PlacementError(ValueError):
    """The node cannot be placed: one line naming the variable or flag."""


def first_host(nodelist: str) -> str:
    """The first host name of a Slurm host list: `node[07-09,12],gpu3` gives node07 (scontrol's
    answer where scontrol is on the path)."""
    if shutil.which("scontrol"):
        shown = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
        if shown.returncode == 0 and shown.stdout.split():
            return shown.stdout.split()[0]
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?([^,]*)", nodelist.strip())
    if not match or not match.group(1):
        raise PlacementError(f"SLURM_STEP_NODELIST={nodelist!r}: no host name in it")
    prefix, ranges, suffix = match.groups()
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return f"{prefix}{first}{suffix}"


def settle(given: dict, environment=os.environ) -> dict:
    """`given` (the command line's options by Config field) with the placement Slurm's environment
    gives where the command line gave none. Nothing changes outside Slurm or where --nnodes was given."""
    port = given.get("master_port") or int(environment.get("MASTER_PORT", DEFAULT_PORT))
    if given.get("nnodes") is not None or "SLURM_NNODES" not in environment:
        return {**given, "nnodes": given.get("nnodes") or 1, "master_port": port,
                "master_addr": given.get("master_addr") or environment.get("MASTER_ADDR")}
    missing = [name for name in SLURM if not environment.get(name)]
    if missing:
        raise PlacementError(f"under Slurm, {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set "
                             "(run radiance-launch through srun, one task a node)")
    try:
        nnodes, node_rank = int(environment["SLURM_NNODES"]), int(environment["SLURM_NODEID"])
    except ValueError:
        raise PlacementError(f"SLURM_NNODES={environment['SLURM_NNODES']!r}, SLURM_NODEID="
                             f"{environment['SLURM_NODEID']!r}: not numbers") from None
    settled = {**given, "nnodes": nnodes, "node_rank": given.get("node_rank") or node_rank, "master_port": port}
    if not given.get("master_addr"):
        settled["master_addr"] = environment.get("MASTER_ADDR") or first_host(environment["SLURM_STEP_NODELIST"])
    return settled


def resolve_address(name: str) -> str:
    """An IPv4 address for a host name or address (zmq binds and connects to addresses)."""
    try:
        return socket.gethostbyname(name)
    except OSError as error:
        raise PlacementError(f"--master-addr {name}: cannot be resolved ({error})") from None


def address_towards(master: str, port: int) -> str:
    """This node's address on the way to node 0: where its ranks bind a stage boundary's link."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((master, port))  # UDP: no packet is sent, the kernel only picks the route
        return probe.getsockname()[0]
    finally:
        probe.close()
