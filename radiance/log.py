"""Logging to stderr, every line prefixed by who speaks: `[rank N]` in a rank, `[radiance]` else."""

import logging
import os
import sys

_configured = False


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time of the record, not at configuration."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _):
        pass


def prefix() -> str:
    rank = os.environ.get("RADIANCE_RANK")
    return f"[rank {rank}]" if rank is not None else "[radiance]"


def get_logger(name: str = "radiance") -> logging.Logger:
    global _configured
    if not _configured:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(f"{prefix()} %(message)s"))
        root = logging.getLogger("radiance")
        root.addHandler(handler)
        root.setLevel(os.environ.get("RADIANCE_LOG", "INFO").upper())
        root.propagate = False
        _configured = True
    return logging.getLogger(name)
