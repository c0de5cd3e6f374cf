"""Generation on the card path, against the host path in the same run (the lent H200s).

    PYTHONUNBUFFERED=1 python3 bench/card_generate.py [--gguf SmolLM2.gguf] [--eight-b] [--tp 1 2] [--tokens 16]

- SmolLM2-135M (from its GGUF): greedy tokens at TP 1 on the card (graphs on and off) and on host
  rows, and decode ms/token of each.
- A synthetic Llama-3-8B-shaped bf16 model (hidden 4096, 32 layers, 32/8 heads, ffn 14336, vocab
  128256): greedy tokens and decode ms/token at each --tp on cards (graphs on and off), against
  the memory bound (weight bytes a rank reads per token / 4.8 TB/s), and the host path's tokens at
  TP 1 (--host-8b, slow).

Run from anywhere with the checkout's bench/ on the path; radiance need not be installed (the
checkout shim maps it). Launches need pyzmq (carry its wheel). Writes $OUT/card_generate.json."""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from checkout_shim import ROOT  # noqa: F401  (first: maps the checkout under `radiance.`)

HBM_BYTES_PER_S = 4.8e12
USER_CARDS = os.environ.get("CUDA_VISIBLE_DEVICES")
EIGHT_B = dict(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256, context=4096,
               rope_theta=500000.0, tie_embeddings=False)


def timed_engine(engine, samples):
    execute = engine.execute

    def timed(arrays):
        start = time.perf_counter()
        result = execute(arrays)
        samples.append(time.perf_counter() - start)
        return result
    engine.execute = timed


def generate(engine, prompt_ids, tokens):
    from radiance.generation.sequence import SamplingParams

    samples = []
    timed_engine(engine, samples)
    sequence = engine.add(prompt_ids, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
    while not sequence.finished:
        engine.step()
    return list(sequence.output_ids), samples


def in_process(model, device, graphs, prompt_ids, tokens, chain=True):
    from radiance.generation.options import EngineOptions
    from radiance.launch.ranks import engine_over, open_ranks

    os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES") or "0"  # in process: one card
    options = EngineOptions(model=str(model), progress=False, device=device, graphs=graphs, chain=chain,
                            max_context=1024)
    start = time.perf_counter()
    with open_ranks(options) as ranks:
        loaded = time.perf_counter() - start
        ids, samples = generate(engine_over(ranks), prompt_ids, tokens)
    return summary(ids, samples, loaded)


def launched(model, tp, graphs, prompt_ids, tokens, chain=True, profile=False):
    from radiance.generation.options import EngineOptions
    from radiance.launch.ranks import RankSettings, engine_over, open_ranks

    result = {}
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)  # the launcher pins each rank to the card it is given
    if USER_CARDS is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = USER_CARDS
    start = time.perf_counter()
    options = EngineOptions(model=str(model), progress=False, graphs=graphs, chain=chain, max_context=1024)
    settings = RankSettings(tp=tp, launched=True, stage_timeout=600.0, step_timeout=600.0, profile=profile)
    with open_ranks(options, settings) as ranks:
        engine = engine_over(ranks)
        steps, execute = [], engine.execute

        def noted(arrays):  # rank 0's own time in each step (compute; collectives when profiled)
            answer = execute(arrays)
            steps.append(ranks.step_stats())
            return answer
        engine.execute = noted
        result["ids"], result["samples"] = generate(engine, prompt_ids, tokens)
        result["rank0"] = {key: 1e3 * statistics.median(step[key] for step in steps[2:]) for key in ("compute", "collectives")}
    figures = summary(result["ids"], result["samples"], time.perf_counter() - start)
    figures["rank0_ms"] = result["rank0"]
    print(f"    ... rank 0: {result['rank0']['compute']:.3f} ms in the step, "
          f"{result['rank0']['collectives']:.3f} ms in collectives (profiled runs only)", flush=True)
    return figures


def summary(ids, samples, seconds):
    decode = samples[2:]  # the prefill, then the first decode step (it warms, the second captures)
    result = {"tokens": ids, "prefill_ms": 1e3 * samples[0], "decode_ms": 1e3 * statistics.median(decode),
              "decode_min_ms": 1e3 * min(decode), "load_s": seconds}
    print(f"    ... decode {result['decode_ms']:.3f} ms/token, load {seconds:.1f} s, tokens {ids}", flush=True)
    return result


def report(name, runs, bound_ms=None):
    print(f"\n{name}")
    reference = None
    for label, run in runs.items():
        reference = reference or run["tokens"]
        common = min(len(reference), len(run["tokens"]))  # the host path of the 8B model runs fewer tokens
        same = f"= ({common})" if run["tokens"][:common] == reference[:common] else "DIFFER"
        extra = f"  bound {bound_ms:.3f} ms ({bound_ms / run['decode_ms']:.0%} of it)" if bound_ms else ""
        print(f"  {label:28} decode {run['decode_ms']:8.3f} ms/token (min {run['decode_min_ms']:.3f})  "
              f"prefill {run['prefill_ms']:8.1f} ms  tokens {same}{extra}")
    print(f"  tokens: {reference}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="first a small synthetic model: TP 1 and 2, card and host")
    parser.add_argument("--gguf", type=Path)
    parser.add_argument("--eight-b", action="store_true")
    parser.add_argument("--host-8b", action="store_true")
    parser.add_argument("--defaults-only", action="store_true", help="8B: graphs and chain on only (no on/off pairs)")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    results = {}
    from radiance.convert.api import convert, convert_synthetic
    from radiance.convert.synthetic import LlamaShape

    with tempfile.TemporaryDirectory() as folder:
        if args.small:
            model = Path(folder) / "small.rad"
            # hidden 1024 bf16: the GEMVs of K = 1024 split K in two (device_kernels.gemv_split)
            convert_synthetic(model, LlamaShape(hidden=1024, layers=4, heads=8, kv_heads=8, ffn=2048, vocab=49152), seed=5)
            ids = [1, 504, 1341, 3594, 5567, 314]
            runs = {"host rows TP 1": in_process(model, "host", True, ids, args.tokens),
                    "card TP 1, graphs, chain": in_process(model, "auto", True, ids, args.tokens),
                    "card TP 1, no graphs, no chain": in_process(model, "auto", False, ids, args.tokens, False),
                    "card TP 2, graphs, chain": launched(model, 2, True, ids, args.tokens)}
            report("small synthetic (1024 hidden, 4 layers, bf16)", runs)
            results["small"] = runs
        if args.gguf:
            model = Path(folder) / "smollm2.rad"
            convert(args.gguf, model)
            ids = [1, 504, 1341, 3594, 5567, 314]  # a fixed prompt: the same ids on every path
            runs = {"card, graphs, chain": in_process(model, "auto", True, ids, args.tokens),
                    "card, graphs, no chain": in_process(model, "auto", True, ids, args.tokens, chain=False),
                    "card, no graphs": in_process(model, "auto", False, ids, args.tokens),
                    "host rows": in_process(model, "host", True, ids, args.tokens)}
            report("SmolLM2-135M Q4_1, TP 1", runs)
            results["smollm2"] = runs
        if args.eight_b:
            model = Path(folder) / "llama8b.rad"
            start = time.perf_counter()
            convert_synthetic(model, LlamaShape(**EIGHT_B), seed=3)
            print(f"synthetic 8B-shaped model written in {time.perf_counter() - start:.0f} s")
            total = model.stat().st_size  # the weights, but for a few KB of header and tokenizer
            ids = [128000, 791, 2380, 6156, 27230, 527]
            for tp in args.tp:
                runs = {}
                combos = ((True, True),) if args.defaults_only else ((True, True), (True, False), (False, True), (False, False))
                for graphs, chain in combos:
                    label = f"card TP {tp}, {'graphs' if graphs else 'no graphs'}, {'chain' if chain else 'no chain'}"
                    runs[label] = in_process(model, "auto", graphs, ids, args.tokens, chain) if tp == 1 else \
                        launched(model, tp, graphs, ids, args.tokens, chain)
                if tp > 1:
                    runs[f"card TP {tp}, profiled (no graphs)"] = launched(model, tp, False, ids, args.tokens, True, True)
                if tp == 1 and args.host_8b:
                    runs["host rows TP 1"] = in_process(model, "host", True, ids, max(4, args.tokens // 4))
                bound = 1e3 * (total - EIGHT_B["vocab"] * EIGHT_B["hidden"] * 2) / tp / HBM_BYTES_PER_S
                report(f"Llama-3-8B-shaped bf16, TP {tp}", runs, bound)
                results[f"llama8b_tp{tp}"] = {"runs": runs, "bound_ms": bound, "weight_bytes": total}
    out = os.environ.get("OUT")
    if out:
        Path(out, "card_generate.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
