"""A rank: bind one card (or none), probe facts, execute the resolved graph. `worker.py` is one
rank's share of the work, in any process; `main.py` and `session.py` are the rank process that
radiance-launch starts around it (launch/in_process.py runs a Worker in the caller's process)."""
