"""Step latency of a decode step on host ranks at TP 1, 2 and 3, synchronous and run ahead.

A step is the time between one engine step's tokens and the next's (what a token costs), broken
into rank 0's compute, its collective wait (inside collective rows, waiting for its peers
included) and `host`: the rest, the step's time on the critical path outside rank 0's graph (the
plan's delivery, the engine's planning and bookkeeping, the result's way back). Run ahead, the
engine plans step n + 1 while the ranks run step n and the token feeds it on the ranks, so what
is left of `host` is rank 0's own turnaround. `waited`: what rank 0 itself reports waiting between
its answer and the next plan in hand. Synchronously, `plan` (the coordinator starting to write the
plan to rank 0 holding it) and `result` (rank 0 writing its result to the coordinator holding it),
both on the machine's monotonic clock, split the delivery. `deliv.` (launched, a median): the
plan's delivery as rank 0 counts it, from the later of the coordinator starting to write the plan
and rank 0 being ready for it, to the step's inputs written: synchronously the whole way out, run
ahead (the plan is in the ring before rank 0 is done with the step before) what the delivery
costs on the critical path: reading the record, checking its mac and copying it into the inputs.
`coord.` (launched): this process's CPU a decode step, the coordinator's, and `wakes` the times it
woke from a sleep a step (its voluntary context switches): with as many ranks as cores or more, what
the coordinator takes comes out of the ranks' cores.

    python bench/step_latency.py [--tp 1 2 3] [--tokens 64] [--layers 30] [--no-in-process]
                                 [--modes sync ahead] [--rounds 1] [--chains on off] [--busy N]

--chains on off: each launched TP also with --no-chain (`chain` off: host ranks then all-reduce with
all_reduce_host rather than the chained row, which needs device.chain), alternated.
--busy N: N processes spinning throughout (bench/generate_tp1.py's), the figures under load: with one
on these 2 cores the coordinator and the ranks share what it leaves.

Each measurement runs in a fresh process, so no measurement inherits another's threads or caches
(libr4d's OpenMP, before its own pool, kept a pool per calling thread: a process whose main thread ran
steps before its step thread did had two pools on 2 cores, slower by ~1.8x).

The model is synthetic, SmolLM2-sized but with 6 heads and 6 KV heads so that 2 and 3 both divide
it (`--heads 8 --hidden 512` for TP 4), Q4_1 linear weights and a Q8_0 embedding, as SmolLM2's GGUF has."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from generate_tp1 import start_busy, stop_busy  # noqa: E402

RECIPE = """
[[rule]]
match = "layers.*.attn.*"
quantizer = "q4_1"

[[rule]]
match = "layers.*.ffn.*"
quantizer = "q4_1"

[[rule]]
match = "token_embd"
quantizer = "q8_0"
"""


def measure(model: Path, tp: int, tokens: int, launched: bool = True, run_ahead: bool = False, chain: bool = True) -> dict:
    import psutil

    from radiance.config import Config
    from radiance.generation.sequence import SamplingParams
    from radiance.launch import engine_over, open_ranks

    samples, this = [], psutil.Process()
    config = Config(model=str(model), progress=False, tp=tp, launched=launched, profile=True, run_ahead=run_ahead,
                    chain=chain)
    with open_ranks(config) as ranks:
        engine = engine_over(ranks)
        sequence = engine.add(list(range(300, 332)), SamplingParams(max_tokens=tokens + 2, temperature=0, ignore_eos=True))
        last = None
        while not sequence.finished:
            engine.step()
            now = time.perf_counter()
            if last is not None:
                samples.append((now - last, ranks.step_stats()))
                if len(samples) == 1:  # from where `decode` (below) starts
                    cpu, switches = time.process_time(), this.num_ctx_switches().voluntary
            last = now
        # this process's CPU over the decode steps (its every thread): launched, the coordinator's
        # share of the cores, which on as many ranks as cores comes out of theirs; and its wakes
        # (voluntary context switches: each sleep it wakes from), each one a rank's core taken then
        cpu = (time.process_time() - cpu) / (len(samples) - 1)
        wakes = (this.num_ctx_switches().voluntary - switches) / (len(samples) - 1)
    # From the step after the prompt's prefill (the first whole decode step) on. Means, not medians:
    # run ahead, the engine may take two results back to back after falling a little behind, so
    # one interval is short and the one before it long; their mean is what a token costs.
    decode = samples[1:]
    mean = lambda key: statistics.fmean(meta[key] for _, meta in decode)  # noqa: E731
    step = statistics.fmean(total for total, _ in decode)
    compute, collectives = mean("compute"), mean("collectives")
    return {"step": step, "host": step - compute, "waited": mean("waited"), "compute": compute - collectives,
            "collectives": collectives, "plan": mean("plan_s") if launched and not run_ahead else None,
            "delivery": statistics.median(meta["delivery"] for _, meta in decode) if launched else None,
            "result": mean("result_s") if launched and not run_ahead else None, "coordinator": cpu if launched else None,
            "wakes": wakes if launched else None}


def measured(model: Path, tp: int, tokens: int, launched: bool, run_ahead: bool, chain: bool = True) -> dict:
    """measure() in a fresh process (see above)."""
    one = json.dumps({"model": str(model), "tp": tp, "tokens": tokens, "launched": launched, "run_ahead": run_ahead,
                      "chain": chain})
    result = subprocess.run([sys.executable, __file__, "--one", one], capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"a measurement failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        one = json.loads(sys.argv[2])
        print(json.dumps(measure(Path(one.pop("model")), **one)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--in-process", action=argparse.BooleanOptionalAction, default=True,
                        help="also TP 1 in this process (radiance's own way), against which TP 1 launched compares")
    parser.add_argument("--modes", nargs="+", choices=["sync", "ahead"], default=["sync", "ahead"],
                        help="synchronous steps, run ahead, or both (alternated)")
    parser.add_argument("--rounds", type=int, default=1, help="times over every (TP, mode), alternated")
    parser.add_argument("--chains", nargs="+", choices=["on", "off"], default=["on"],
                        help="launched TPs with chained launches (the chained all-reduce), without, or both")
    parser.add_argument("--busy", type=int, default=0, help="processes spinning throughout (the figures under load)")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--heads", type=int, default=6, help="query heads (and KV heads): --tp must divide it")
    parser.add_argument("--hidden", type=int, default=576, help="--tp must leave whole Q4_1 blocks: 512 for TP 4")
    args = parser.parse_args()
    if args.busy < 0:
        raise SystemExit(f"--busy must be 0 or more, not {args.busy}")
    from radiance.convert.api import convert_synthetic

    with tempfile.TemporaryDirectory() as folder:
        recipe = Path(folder) / "recipe.toml"
        recipe.write_text(RECIPE)
        model = Path(folder) / "model.rad"
        convert_synthetic(model, "llama", dict(hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.heads, ffn=1536,
                                            vocab=49152, context=2048), seed=1, recipe=recipe)
        runs = ([(1, False, True)] if args.in_process else []) + \
            [(tp, True, chain == "on") for tp in args.tp for chain in args.chains]
        spinners = start_busy(args.busy)
        try:
            rounds(args, model, runs)
        finally:
            stop_busy(spinners)


def rounds(args, model: Path, runs: list) -> None:
    """Every (TP, chain, mode) of `runs` once a round, `args.rounds` rounds, a line each."""
    busy = f", {args.busy} busy" if args.busy else ""
    for round_number in range(args.rounds):
        load = " ".join(f"{value:.2f}" for value in os.getloadavg())
        print(f"== round {round_number + 1} (load: {load}{busy}); decode step, mean of {args.tokens} steps, "
              f"host ranks (ms)")
        print(f"{'tp':>3}{'ranks':>12}{'chain':>6}{'mode':>7}{'step':>9}{'host':>8}{'waited':>8}{'deliv.':>8}{'plan':>8}{'result':>8}"
              f"{'coord.':>8}{'wakes':>7}{'compute':>9}{'collect.':>10}{'tok/s':>8}")
        for tp, launched, chain in runs:
            for mode in args.modes:
                figures = measured(model, tp, args.tokens, launched, run_ahead=mode == "ahead", chain=chain)
                split = "".join(f"{'-' if figures[key] is None else f'{1e3 * figures[key]:.3f}':>8}"
                                for key in ("delivery", "plan", "result", "coordinator"))
                wakes = figures.get("wakes")  # not from a bench without the column (a tree before it)
                split += f"{'-' if wakes is None else f'{wakes:.1f}':>7}"
                print(f"{tp:3}{'launched' if launched else 'in process':>12}{'on' if chain else 'off':>6}{mode:>7}{1e3 * figures['step']:9.2f}"
                      f"{1e3 * figures['host']:8.3f}{1e3 * figures['waited']:8.3f}{split}"
                      f"{1e3 * figures['compute']:9.2f}{1e3 * figures['collectives']:10.2f}"
                      f"{1 / figures['step']:8.1f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
