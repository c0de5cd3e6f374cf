"""Step latency of a decode step on host ranks at TP 1, 2 and 3, broken into plan delivery (the
coordinator's round trip less rank 0's step; split into `plan`, from the coordinator starting to
write the plan to rank 0 holding it, and `result`, from rank 0 writing its result to the coordinator
holding it, both on the machine's monotonic clock), compute and collective wait (rank 0's time
inside collective rows, which includes waiting for its peers).

    python bench/step_latency.py [--tp 1 2 3] [--tokens 64] [--layers 30] [--no-in-process]

The model is synthetic, SmolLM2-sized but with 6 heads and 6 KV heads so that 2 and 3 both divide
it (`--heads 8 --hidden 512` for TP 4), Q4_1 linear weights and a Q8_0 embedding, as SmolLM2's GGUF has."""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

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


def measure(model: Path, tp: int, tokens: int, launched: bool = True) -> dict:
    from radiance.generation.options import EngineOptions
    from radiance.generation.sequence import SamplingParams
    from radiance.launch.ranks import RankSettings, engine_over, open_ranks

    samples = []
    with open_ranks(EngineOptions(model=str(model), progress=False), RankSettings(tp=tp, launched=launched,
                                                                                  profile=True)) as ranks:
        engine = engine_over(ranks)
        execute = engine.execute

        def timed(arrays):
            start = time.perf_counter()
            result = execute(arrays)
            samples.append((time.perf_counter() - start, ranks.step_stats()))
            return result

        engine.execute = timed
        sequence = engine.add(list(range(300, 332)), SamplingParams(max_tokens=tokens + 1, temperature=0, ignore_eos=True))
        while not sequence.finished:
            engine.step()
    decode = samples[1:]  # the first step is the prompt's prefill
    step = statistics.median(total for total, _ in decode)
    compute = statistics.median(meta["compute"] for _, meta in decode)
    collectives = statistics.median(meta["collectives"] for _, meta in decode)
    plan = statistics.median(meta["plan_s"] for _, meta in decode) if launched else None
    result = statistics.median(meta["result_s"] for _, meta in decode) if launched else None
    return {"step": step, "delivery": step - compute, "compute": compute - collectives, "collectives": collectives,
            "plan": plan, "result": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--in-process", action=argparse.BooleanOptionalAction, default=True,
                        help="also TP 1 in this process (radiance's own way), against which TP 1 launched compares")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--heads", type=int, default=6, help="query heads (and KV heads): --tp must divide it")
    parser.add_argument("--hidden", type=int, default=576, help="--tp must leave whole Q4_1 blocks: 512 for TP 4")
    args = parser.parse_args()
    from radiance.convert.api import convert_synthetic
    from radiance.convert.synthetic import LlamaShape

    with tempfile.TemporaryDirectory() as folder:
        recipe = Path(folder) / "recipe.toml"
        recipe.write_text(RECIPE)
        model = Path(folder) / "model.rad"
        convert_synthetic(model, LlamaShape(hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.heads, ffn=1536,
                                            vocab=49152, context=2048), seed=1, recipe=recipe)
        print(f"decode step, median of {args.tokens} steps, host ranks (ms)")
        print(f"{'tp':>3}{'ranks':>12}{'step':>9}{'delivery':>10}{'plan':>8}{'result':>8}{'compute':>9}"
              f"{'collect.':>10}{'tok/s':>8}")
        runs = ([(1, False)] if args.in_process else []) + [(tp, True) for tp in args.tp]
        for tp, launched in runs:
            figures = measure(model, tp, args.tokens, launched)
            split = "".join(f"{'-' if figures[key] is None else f'{1e3 * figures[key]:.3f}':>8}" for key in ("plan", "result"))
            print(f"{tp:3}{'launched' if launched else 'in process':>12}{1e3 * figures['step']:9.2f}"
                  f"{1e3 * figures['delivery']:10.3f}{split}{1e3 * figures['compute']:9.2f}"
                  f"{1e3 * figures['collectives']:10.2f}{1 / figures['step']:8.1f}")


if __name__ == "__main__":
    sys.exit(main())
