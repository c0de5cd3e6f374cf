"""The error report: per weight, ||decoded - source|| / ||source||, the decoded weight read back
through the decoder and the source rows as the converter got them (f32), summed row block by row
block in f64. Printed as a compact table (one line per kind of weight, layers folded), stored in the
container's metadata whole."""

import json
import math
import re
from dataclasses import dataclass

import numpy as np

LAYER = re.compile(r"^layers\.\d+\.")
SIGNIFICANT = 3  # digits kept of each error in the metadata
CHUNK = 1 << 18  # elements summed in f64 at a time, so the sums add little to a row block's memory


@dataclass
class WeightError:
    name: str
    method: str
    nbytes: int
    source_squares: float = 0.0
    difference_squares: float = 0.0

    def add(self, decoded: np.ndarray, source: np.ndarray) -> None:
        decoded, source = decoded.reshape(-1), source.reshape(-1)
        for start in range(0, source.size, CHUNK):
            part = source[start:start + CHUNK].astype(np.float64)
            self.source_squares += float(np.square(part).sum())
            part -= decoded[start:start + CHUNK]
            self.difference_squares += float(np.square(part).sum())

    @property
    def relative(self) -> float:
        if self.source_squares == 0:
            return 0.0 if self.difference_squares == 0 else math.inf
        return math.sqrt(self.difference_squares / self.source_squares)


def _rounded(value: float):
    return float(f"{value:.{SIGNIFICANT}g}") if math.isfinite(value) else None


def summary(errors: list[WeightError]) -> dict:
    """The metadata entry: every weight's relative error (null when not finite), the worst one."""
    worst = max(errors, key=lambda error: error.relative if math.isfinite(error.relative) else math.inf)
    return {"relative_error": {"weights": {error.name: _rounded(error.relative) for error in errors},
                               "max": _rounded(worst.relative), "worst": worst.name}}


def summary_bytes(names: list[str]) -> int:
    """An upper bound on what summary() adds to the container header for these weights: its JSON
    with the widest number for every error, escaped once more as the header's metadata string."""
    widest = -1.23e-100  # the longest float SIGNIFICANT digits print as
    bound = {"relative_error": {"weights": {name: widest for name in names}, "max": widest,
                                "worst": max(names, key=len, default="")}}
    return len(json.dumps(json.dumps(bound))) + 16


def table(errors: list[WeightError], per_weight: bool = False) -> str:
    """Weights of the same kind in every layer folded into one line (`layers.*.attn.q`), unless per_weight."""
    groups = {}
    for error in errors:
        key = (error.name if per_weight else LAYER.sub("layers.*.", error.name), error.method)
        groups.setdefault(key, []).append(error)
    lines = [f"{'weight':<24} {'method':<22} {'count':>5} {'MiB':>9} {'rel.error':>9} {'max':>9}"]
    for (name, method), members in groups.items():
        relative = [member.relative for member in members]
        nbytes = sum(member.nbytes for member in members)
        lines.append(f"{name:<24} {method:<22} {len(members):>5} {nbytes / 2**20:>9.2f} "
                     f"{sum(relative) / len(relative):>9.2e} {max(relative):>9.2e}")
    return "\n".join(lines)
