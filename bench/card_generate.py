"""Generation on the card path, against the host path and the PyTorch peer in the same run (the lent H200s).

    PYTHONUNBUFFERED=1 python3 bench/card_generate.py [--gguf SmolLM2.gguf] [--eight-b] [--tp 1 2] [--tokens 32]
        [--context 512] [--peer] [--defaults-only]

- SmolLM2-135M (from its GGUF): greedy tokens at TP 1 on the card with fused rows and without
  (--no-fusion's path), graphs on and off, and on host rows; decode ms/token and kernel launches
  per step of each.
- A synthetic Llama-3-8B-shaped bf16 model (hidden 4096, 32 layers, 32/8 heads, ffn 14336, vocab
  128256): greedy tokens and decode ms/token at each --tp after a --context-token prompt, fused and
  unfused, against the memory bound (weight bytes a rank reads per token / 4.8 TB/s); --peer adds
  PyTorch on the same shape and context (bench/torch_peer.py: eager ops in one CUDA graph, and
  gpt-fast's recipe, inductor then one CUDA graph), measured after radiance has let the card go.
  --host-8b: the host path's first tokens (slow). --kernels: the captured step's card time alone
  and its kernels by name (bench/card_kernels.py). --launched: at TP 1 also through the launcher
  (one rank process, plans over the ring), the in-process path's time beside it (issue 13's
  "launched costs <= 3 % more"). --keep DIR: write the 8B model there once and reuse it. --stream-shape: the persistent GEMV
  (gemv_stream.cu, opt-in) instead of gemv.cu. --fused-only: the fused run alone (with --keep, one process a
  setting, as a card call A/Bs the environment's knobs).

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
from card_kernels import profile_step  # noqa: E402

import numpy as np  # noqa: E402

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


def launches_per_step(worker) -> int | None:
    """Kernels one decode step launches on the card: one profiled (uncaptured) step of the last
    step's shape, its driver launches counted."""
    executor = getattr(worker, "executor", None)
    if executor is None or not hasattr(executor, "device"):
        return None
    device, counted = executor.device, [0]
    launch = device.launch

    def counting(*args, **kwargs):
        counted[0] += 1
        return launch(*args, **kwargs)
    graphs = executor.graphs
    device.launch, executor.profile, executor.graphs = counting, True, False  # a profiled step is uncaptured
    executor.op_seconds.clear()
    try:
        executor.run(1, 1)
    finally:
        device.launch, executor.profile, executor.graphs = launch, False, graphs
    ops = sorted(executor.op_seconds.items(), key=lambda item: -item[1])
    print("    ... one profiled step (launched one by one, so slower than a graph): "
          + ", ".join(f"{op} {1e3 * seconds:.3f} ms" for op, seconds in ops)
          + f"; sum {1e3 * sum(seconds for _, seconds in ops):.3f} ms", flush=True)
    return counted[0]


def in_process(model, device, graphs, prompt_ids, tokens, chain=True, fusion=True, kernels=False):
    from radiance.config import Config
    from radiance.launch import engine_over, open_ranks

    os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES") or "0"  # in process: one card
    options = Config(model=str(model), progress=False, device=device, graphs=graphs, chain=chain,
                            fusion=fusion, max_context=max(1024, len(prompt_ids) + tokens + 16))
    start = time.perf_counter()
    with open_ranks(options) as ranks:
        loaded = time.perf_counter() - start
        ids, samples = generate(engine_over(ranks), prompt_ids, tokens)
        profiled = profile_step(ranks.worker) if kernels and graphs and device == "auto" else {}
        try:
            counted = launches_per_step(ranks.worker) if device == "auto" else None
        except Exception as error:  # the profile is a diagnosis: its failure must not lose the figures
            print(f"    ... the profiled step failed: {type(error).__name__}: {error}", flush=True)
            counted = None
    result = summary(ids, samples, loaded)
    result["launches_per_step"] = counted
    result.update(profiled)
    if counted is not None:
        print(f"    ... {counted} kernel launches per decode step", flush=True)
    return result


def launched(model, tp, graphs, prompt_ids, tokens, chain=True, profile=False):
    from radiance.config import Config
    from radiance.launch import engine_over, open_ranks

    result = {}
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)  # the launcher pins each rank to the card it is given
    if USER_CARDS is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = USER_CARDS
    start = time.perf_counter()
    options = Config(model=str(model), progress=False, graphs=graphs, chain=chain, max_context=1024, tp=tp,
                     launched=True, stage_timeout=600.0, step_timeout=600.0, profile=profile)
    with open_ranks(options) as ranks:
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


def peer(context, tokens) -> dict:
    """PyTorch on the 8B shape (bench/torch_peer.py), each mode in its own process so that the card
    is PyTorch's alone; its figures under the same labels the report prints."""
    import subprocess

    runs = {}
    for mode in ("eager-graph", "compiled-graph"):
        with tempfile.TemporaryDirectory() as folder:
            command = [sys.executable, str(Path(__file__).parent / "torch_peer.py"), "--eight-b", "--context",
                       str(context), "--tokens", str(tokens), "--modes", mode]
            done = subprocess.run(command, env={**os.environ, "OUT": folder}, timeout=540)
            path = Path(folder, "torch_peer.json")
            figures = json.loads(path.read_text()).get("llama8b", {}).get(mode, {}) if path.exists() else {}
        if done.returncode or "ms_per_token" not in figures:
            print(f"    ... PyTorch {mode} failed (exit {done.returncode}): {figures.get('error', 'no figures')}")
            continue
        runs[f"PyTorch, {mode}"] = {"tokens": [], "decode_ms": figures["ms_per_token"], "decode_min_ms": figures["min_ms"],
                                    "prefill_ms": float("nan"), "launches_per_step": figures.get("kernels_per_step"),
                                    "peer": figures}
    return runs


def report(name, runs, bound_ms=None):
    print(f"\n{name}")
    reference = None
    for label, run in runs.items():
        reference = reference or run["tokens"] or None
        common = min(len(reference), len(run["tokens"]))  # the host path of the 8B model runs fewer tokens
        same = "" if not run["tokens"] else f"= ({common})" if run["tokens"][:common] == reference[:common] else "DIFFER"
        extra = f"  bound {bound_ms:.3f} ms ({bound_ms / run['decode_ms']:.0%} of it)" if bound_ms else ""
        launches = run.get("launches_per_step")
        print(f"  {label:40} decode {run['decode_ms']:8.3f} ms/token (min {run['decode_min_ms']:.3f})  "
              f"prefill {run['prefill_ms']:8.1f} ms  launches {launches if launches is not None else '-':>5}  "
              f"tokens {same}{extra}")
    print(f"  tokens: {reference}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="first a small synthetic model: TP 1 and 2, card and host")
    parser.add_argument("--gguf", type=Path)
    parser.add_argument("--eight-b", action="store_true")
    parser.add_argument("--host-8b", action="store_true")
    parser.add_argument("--defaults-only", action="store_true", help="8B: graphs and chain on only (no on/off pairs)")
    parser.add_argument("--fused-only", action="store_true", help="8B: the fused run of --defaults-only alone (no "
                                                                  "unfused run): how a card call A/Bs a knob "
                                                                  "process by process")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--context", type=int, default=512, help="8B: tokens of the prompt decoding starts after")
    parser.add_argument("--peer", action="store_true", help="8B: PyTorch on the same shape (bench/torch_peer.py)")
    parser.add_argument("--kernels", action="store_true", help="TP 1 in process: the captured step's card time "
                                                             "alone and its kernels by name (bench/card_kernels.py)")
    parser.add_argument("--launched", action="store_true", help="8B TP 1: also through the launcher (one rank process)")
    parser.add_argument("--keep", type=Path, help="8B: keep the synthetic model in this folder and reuse it")
    parser.add_argument("--stream-shape", help="run the decode GEMVs on gemv_stream.cu (opt-in): '1' for its default "
                                               "cut, or 'warps,blocks,unit,depth,ahead' as bench/device_ops.py "
                                               "--sweep prints it")
    args = parser.parse_args()
    if args.stream_shape:
        os.environ["R4D_GEMV_STREAM"] = args.stream_shape  # read when libr4d loads (device_kernels.STREAM)
    results = {}
    from radiance.convert.api import convert, convert_synthetic

    with tempfile.TemporaryDirectory() as folder:
        if args.small:
            model = Path(folder) / "small.rad"
            # hidden 1024 bf16: the GEMVs of K = 1024 split K in two (device_kernels.gemv_split)
            convert_synthetic(model, "llama", dict(hidden=1024, layers=4, heads=8, kv_heads=8, ffn=2048, vocab=49152), seed=5)
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
            runs = {"card, fused, graphs, chain": in_process(model, "auto", True, ids, args.tokens),
                    "card, unfused, graphs, chain": in_process(model, "auto", True, ids, args.tokens, fusion=False),
                    "card, fused, no graphs": in_process(model, "auto", False, ids, args.tokens),
                    "host rows": in_process(model, "host", True, ids, args.tokens)}
            report("SmolLM2-135M Q4_1, TP 1", runs)
            results["smollm2"] = runs
        if args.eight_b:
            model = (args.keep or Path(folder)) / "llama8b.rad"
            if not model.exists():
                start = time.perf_counter()
                model.parent.mkdir(parents=True, exist_ok=True)
                convert_synthetic(model, "llama", EIGHT_B, seed=3)
                print(f"synthetic 8B-shaped model written in {time.perf_counter() - start:.0f} s")
            total = model.stat().st_size  # the weights, but for a few KB of header and tokenizer
            ids = [128000] + [int(i) for i in np.random.default_rng(3).integers(300, 120000, args.context - 1)]
            for tp in args.tp:
                runs = {}
                combos = ((True, True, True),) if args.fused_only else \
                    ((True, True, True), (True, True, False)) if args.defaults_only else \
                    ((True, True, True), (True, True, False), (True, False, True), (False, True, True))
                for graphs, chain, fusion in combos:
                    label = (f"card TP {tp}, {'fused' if fusion else 'unfused'}, {'graphs' if graphs else 'no graphs'}, "
                             f"{'chain' if chain else 'no chain'}")
                    runs[label] = in_process(model, "auto", graphs, ids, args.tokens, chain, fusion, args.kernels) if tp == 1 else \
                        launched(model, tp, graphs, ids, args.tokens, chain)
                if tp == 1 and args.launched:
                    runs["card TP 1 launched, fused, graphs, chain"] = launched(model, 1, True, ids, args.tokens)
                if tp > 1:
                    runs[f"card TP {tp}, profiled (no graphs)"] = launched(model, tp, False, ids, args.tokens, True, True)
                if tp == 1 and args.host_8b:
                    runs["host rows TP 1"] = in_process(model, "host", True, ids, max(4, args.tokens // 4))
                bound = 1e3 * (total - EIGHT_B["vocab"] * EIGHT_B["hidden"] * 2) / tp / HBM_BYTES_PER_S
                if tp == 1 and args.peer:
                    runs.update(peer(args.context, args.tokens))
                report(f"Llama-3-8B-shaped bf16, TP {tp}, after a {args.context}-token prompt", runs, bound)
                results[f"llama8b_tp{tp}"] = {"runs": runs, "bound_ms": bound, "weight_bytes": total}
    out = os.environ.get("OUT")
    if out:
        Path(out, "card_generate.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
