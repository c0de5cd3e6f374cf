"""The handshake's decisions: the combined facts (P2P holds only if it holds for every pair, or
the ranks would deadlock on different collective rows) and the agreement of every rank's graph.
`handshake` returns what was agreed; the caller keeps it (nothing is written onto the coordinator)."""

import hashlib
from dataclasses import dataclass

from radiance.config import Config
from radiance.device.probe import probe_rounds
from radiance.log import get_logger

from .coordinator import Coordinator, LaunchError

log = get_logger("radiance.launch")


def combine_facts(facts: dict, disable_p2p: bool) -> tuple[dict, str]:
    """(the facts every rank resolves with, why P2P does not hold where it does not)."""
    ranks = sorted(facts)
    p2p = all(facts[rank].get("device.p2p", 0) == 1 for rank in ranks)
    if disable_p2p:
        why = "--disable-p2p"
    elif all(not facts[rank].get("card") for rank in ranks):
        why = "host ranks: no card"
    else:
        lacking = [rank for rank in ranks if facts[rank].get("device.p2p", 0) != 1]
        why = f"no P2P from rank {lacking[0]}: {facts[lacking[0]].get('p2p_detail', 'probe failed')}" if lacking else ""
    combined = {"device.p2p": int(p2p and not disable_p2p),
                # every rank chained, or none: their graphs must resolve alike
                "device.chain": int(all(facts[rank].get("device.chain", 0) == 1 for rank in ranks))}
    if any("device.same_host" in facts[rank] for rank in ranks):  # pipeline stages: every boundary alike
        combined["device.same_host"] = int(all(facts[rank].get("device.same_host", 0) == 1 for rank in ranks))
    return combined, why


@dataclass(frozen=True)
class Agreement:
    """What the ranks agreed on: the combined facts and the resolved graph (rank 0's lines)."""
    facts: dict
    digest: str
    lines: list
    step_limits: tuple  # (tokens, sequences): the largest step every stage's rows serve


def relay_probe(coordinator: Coordinator) -> None:
    """The P2P probe's all-gathers: each round, every rank's payload to every rank; as many rounds as
    radiance/device/probe.py exchanges, whatever fails (none for one card rank: it has no peer)."""
    for round_number in range(probe_rounds(coordinator.world)):
        payloads = coordinator.gather("probe", f"P2P probe, round {round_number + 1}")
        coordinator.broadcast("probed", arrays={f"rank{rank}": arrays["payload"] for rank, (_, arrays) in payloads.items()})


def first_difference(reference: list, other: list, first: int = 0) -> str:
    for mine, theirs in zip(reference, other):
        if mine != theirs:
            node, op, band, row = theirs.split("|")
            return f"node {node}, op '{op}' band {band}: {row} where rank {first} has {mine.split('|')[3]}"
    return f"{len(other)} resolved bands where rank {first} has {len(reference)}"


def agree(coordinator: Coordinator, resolved: dict) -> tuple[str, list]:
    """Every rank's graph the same as its stage's first rank's (a rank whose differs is refused,
    named); the launch's digest and lines: rank 0's, or with pipeline stages every stage's in order
    (their node names differ, and the stage boundaries' send and recv among them)."""
    layout, digests, lines = coordinator.layout, [], []
    for stage in range(layout.pp):
        ranks = layout.stage_ranks(stage)
        reference = resolved[ranks[0]][0]
        for rank in ranks[1:]:
            meta = resolved[rank][0]
            if meta["digest"] != reference["digest"]:
                raise LaunchError(f"rank {rank} resolved a different graph from rank {ranks[0]}'s: "
                                  f"{first_difference(reference['lines'], meta['lines'], ranks[0])}")
        digests.append(reference["digest"])
        lines += reference["lines"]
    if layout.pp == 1:
        return digests[0], lines
    return hashlib.sha256("\n".join(digests).encode()).hexdigest(), lines


def handshake(coordinator: Coordinator, config: Config, load_timeout: float) -> Agreement:
    """Every stage in order (docs/RUNTIME.md); `config` sizes the plans ring and may disable P2P."""
    hellos = coordinator.gather("hello", "hello")
    if any(meta.get("card") for meta, _ in hellos.values()):
        relay_probe(coordinator)
    if config.pp > 1:  # where each rank's same-host probe is (ranks/boundaries.py), to every rank
        coordinator.broadcast("hosts", {"hosts": {str(rank): meta["host"] for rank, (meta, _) in hellos.items()}})
    facts = {rank: meta for rank, (meta, _) in coordinator.gather("facts", "facts").items()}
    for rank, fact in sorted(facts.items()):
        if fact.get("card"):
            where = f" at PCI {fact['bus_id']}" if fact.get("bus_id") else ""
            log.info("rank %d: %s%s (%s)", rank, fact.get("name", "card"), where, fact.get("device.arch"))
    combined, why = combine_facts(facts, config.disable_p2p)
    if not combined["device.p2p"] and config.tp > 1:
        log.info("collectives use the _host twins (device.p2p = 0): %s", why)
    if "device.same_host" in combined:
        apart = [rank for rank in sorted(facts) if not facts[rank].get("device.same_host")]
        log.info("%d pipeline stages; their boundaries go %s", config.pp,
                 "through shared memory (device.same_host = 1)" if combined["device.same_host"] else
                 f"over the CURVE link (device.same_host = 0: rank {apart[0]} cannot map its neighbours' memory)")
    coordinator.broadcast("combined", {"facts": combined})
    created = coordinator.gather("created", "shared memory")
    coordinator.broadcast("attach", {"pipes": {str(rank): meta.get("pipe", {}) for rank, (meta, _) in created.items()}})
    resolved = coordinator.gather("resolved", "load and resolve", timeout=load_timeout)
    digest, lines = agree(coordinator, resolved)
    limits = [meta["step_limits"] for meta, _ in resolved.values()]
    step_limits = (min(tokens for tokens, _ in limits), min(seqs for _, seqs in limits))
    coordinator.open_rings(config)  # the answering rank made its results ring before 'resolved'
    coordinator.broadcast("go")
    coordinator.gather("ready", "ready")
    return Agreement(combined, digest, lines, step_limits)
