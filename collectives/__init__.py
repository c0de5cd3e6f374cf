"""Collectives: host transports (shared memory, zmq), device P2P buffers, link gate, chain records."""

from .chain import ChainWords, chain_record, set_chain  # noqa: F401
from .gate import (  # noqa: F401
    ChunkRecord, HoldRecord, LinkGate, LinkGateError, LinkScheduler, Transfer, launch_collective,
)
from .peers import HostPeers, run_shm_bytes, segment_bytes, slot_bytes  # noqa: F401
from .shm import (  # noqa: F401
    Segment, ShmSpaceError, check_space, list_run, new_run_id, shm_free_bytes, unlink_run,
)
