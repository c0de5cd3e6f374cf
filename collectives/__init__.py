"""Collectives: host transports (shared memory, zmq), device P2P buffers, link gate, chain records."""
