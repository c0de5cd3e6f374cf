"""rad-kbench's fixture file (`kernels.rkb`) and its three measures of an output against libref's.

The file is JSON: a header (its format) and, per case, its op, parameters, cold-call keys, seed,
the sha256 of the libref sources that answered, the digest of the inputs they answered and, per output operand,
libref's answer summarised: max|ref|, the norm, SAMPLES values at seeded places and PROJECTIONS
projections onto seeded unit vectors. Sums are math.fsum (exactly rounded), so identical outputs
give identical figures whatever the memory layout.

What each measure is for (tolerance `tol` per op, relative to max|ref|; 0 means the same bits):
- samples: a wrong value where one was recorded, |y - ref| <= tol * max|ref| at each;
- norm: a small error anywhere (one ulp of one element of an exact op moves the f64 norm) and a
  bias every element shares (a scale off by less than the pointwise tolerance):
  |norm(y) - norm(ref)| <= tol / 4 * norm(ref), rounding errors of random sign cancel in it;
- projections: a region wrong where no sample looked and the norm cannot tell (rows swapped, a
  block permuted): |r.y - r.ref| <= 6 * tol * max|ref| for unit r, six standard deviations of
  per-element errors within the tolerance."""

import hashlib
import json
import math
from pathlib import Path

import numpy as np

FORMAT = "radiance-kbench 1"
SAMPLES = 16
PROJECTIONS = 4

# max|y - ref| / max|ref| an op's rows are held to: docs/OPS.md ("Agreement with libref") and
# docs/LIBR4D.md's tables, the loosest row in tree of each op at its default point
TOLERANCE = {
    "embedding": 0.0, "add": 0.0, "take_rows": 0.0, "scale": 0.0, "sample": 0.0,
    "rope": 1e-6, "silu_mul": 1e-6, "gelu_tanh_mul": 1e-6,
    "rmsnorm": 5e-6, "rmsnorm_heads": 5e-6,
    "gemm": 2e-4,  # the decode GEMV's int16 activations (aq=16); f32 paths are within 5e-6
    "attention": 2e-5, "sliding_attention": 2e-5,
    # fused ops: their links' loosest
    "add_rmsnorm": 5e-6, "gemm_add": 2e-4, "rmsnorm_gemm3": 2e-4, "rmsnorm_gemm2": 2e-4, "rmsnorm_gemm2_silu_mul": 2e-4, "rope_attention": 2e-5,
    "take_rows_rmsnorm_gemm_sample": 2e-4, "add_rmsnorm_gemm3": 2e-4, "add_rmsnorm_gemm2_silu_mul": 2e-4,
}


def row_tolerance(row, op: str) -> float:
    """What `row` is held to: the tolerance it states (rad_kernel_tolerance: a tensor-core row trades
    accuracy by design), else its op's."""
    return row.tolerance if row.tolerance is not None else TOLERANCE.get(op, 0.0)


NORM_SHARE = 0.25
PROJECTION_SIGMAS = 6.0


def _flat(values) -> np.ndarray:
    return np.asarray(values).astype(np.float64).reshape(-1)


def _places(n: int, seed: int) -> np.ndarray:
    return np.sort(np.random.default_rng([seed, 1]).choice(n, min(SAMPLES, n), replace=False))


def _directions(n: int, seed: int):
    rng = np.random.default_rng([seed, 2])
    for _ in range(PROJECTIONS):
        r = rng.standard_normal(n)
        yield r / math.sqrt(math.fsum(r * r))


def _norm(flat) -> float:
    return math.sqrt(math.fsum(flat * flat))


def summarize(values, seed: int) -> dict:
    """libref's answer for one output, as the fixture keeps it."""
    flat = _flat(values)
    places = _places(flat.size, seed)
    finite = flat[np.isfinite(flat)]
    return {"shape": list(np.shape(values)), "max": float(np.abs(finite).max()) if finite.size else 0.0,
            "norm": _norm(flat), "samples": [[int(i), float(flat[i])] for i in places],
            "projections": [math.fsum(flat * r) for r in _directions(flat.size, seed)]}


def sampled_places(summary: dict) -> list[int]:
    return [i for i, _ in summary["samples"]]


def compare(summary: dict, values, seed: int, tol: float) -> list[tuple[str, str]]:
    """(measure, what) for every measure `values` fails against libref's `summary`."""
    if list(np.shape(values)) != summary["shape"]:
        return [("shape", f"{list(np.shape(values))}, libref's {summary['shape']}")]
    flat = _flat(values)
    failed = []
    bound = tol * summary["max"]
    for i, want in summary["samples"]:
        got = flat[i]
        same = got == want or (math.isnan(got) and math.isnan(want))
        if not same and not abs(got - want) <= bound:
            index = np.unravel_index(i, summary["shape"]) if summary["shape"] else (i,)
            failed.append(("samples", f"element {tuple(int(v) for v in index)}: {float(got)!r}, libref {want!r} "
                                      f"(|d| {abs(got - want):.3g} > {bound:.3g})"))
            break
    norm = _norm(flat)
    if not norm == summary["norm"] and not abs(norm - summary["norm"]) <= tol * NORM_SHARE * summary["norm"]:
        failed.append(("norm", f"{float(norm)!r}, libref {summary['norm']!r} (relative {_relative(norm, summary['norm'])})"))
    for j, (r, want) in enumerate(zip(_directions(flat.size, seed), summary["projections"])):
        got = math.fsum(flat * r)
        if not got == want and not abs(got - want) <= PROJECTION_SIGMAS * bound:
            failed.append(("projections", f"projection {j}: {got!r}, libref {want!r} "
                                          f"(|d| {abs(got - want):.3g} > {PROJECTION_SIGMAS * bound:.3g})"))
            break
    return failed


def _relative(got: float, want: float) -> str:
    return f"{abs(got - want) / want:.3g}" if want else "inf"


def output_seed(case_seed: int, operand: int) -> int:
    return (case_seed * 31 + operand) & 0xFFFFFFFF


# ------------------------------------------------------------------------------------------------
# the file

def source_hash(path: Path) -> str:
    """sha256 of a plugin's sources (a package folder: every .py in it, sorted), 16 hex digits."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts) if path.is_dir() else [path]
    h = hashlib.sha256()
    for file in files:
        h.update(file.name.encode())
        h.update(file.read_bytes())
    return h.hexdigest()[:16]


class FixtureError(ValueError):
    """A fixture file that cannot be read: one line naming it."""


class Fixture:
    def __init__(self, path: Path, cases: dict | None = None):
        self.path, self.cases = Path(path), cases or {}

    @classmethod
    def read(cls, path: Path) -> "Fixture":
        path = Path(path)
        if not path.exists():
            return cls(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise FixtureError(f"{path}: not a rad-kbench fixture ({error})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise FixtureError(f"{path}: format {data.get('format') if isinstance(data, dict) else None!r}, "
                               f"not {FORMAT!r}")
        return cls(path, data.get("cases", {}))

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(json.dumps({"format": FORMAT, "cases": self.cases}, indent=0))
        temporary.replace(self.path)

    def staleness(self, case, inputs: str, libref: str) -> str | None:
        """Why the recorded answer for `case` cannot be used, or None when it can."""
        entry = self.cases.get(case.name)
        if entry is None:
            return "not recorded"
        for key, now in (("op", case.op), ("params", case.params), ("cold", case.cold), ("seed", case.seed),
                         ("inputs", inputs), ("libref", libref)):
            if entry.get(key) != now:
                return f"its {key} changed ({entry.get(key)!r} recorded, {now!r} now)"
        return None

    def record(self, case, inputs: str, libref: str, row: str, outputs: dict) -> None:
        self.cases[case.name] = {"op": case.op, "params": case.params, "cold": case.cold, "seed": case.seed,
                                 "inputs": inputs, "libref": libref, "row": row,
                                 "outputs": {str(i): {"name": name, **summarize(values, output_seed(case.seed, i))}
                                             for i, (name, values) in outputs.items()}}
