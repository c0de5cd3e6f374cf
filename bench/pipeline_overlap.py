"""Pipeline stages with and without micro-batches, on host ranks: a batch of N sequences through
--pp 2 (TP 1 a stage), each step run `whole` (--micro-batches 1: stage 1 idles while stage 0
computes, and stage 0 while stage 1 does), in `parts`, as many as stages (the default: stage 0 runs
part 2 while stage 1 runs part 1), or in parts and run `ahead` (--run-ahead: stage 0 starts part 1
of step n + 1 once the last stage has sampled part 1 of step n, its tokens coming through the token
pipe, so in decode neither stage waits for the other's whole step). Prefill is the first step
(every prompt, one step); decode the mean of the steps after it. Tokens/s of each, and their
ratios against whole.

    python bench/foreground.py python bench/pipeline_overlap.py [--batch 4 16] [--prompt 64]
                                 [--tokens 16] [--layers 30] [--rounds 3] [--tp 1]
                                 [--modes whole parts ahead whole-ahead]

Every mode runs in each round, alternated, each in a fresh process (no measurement inherits
another's threads or caches), so they share the machine's state; the figures to read are the
ratios. The model is synthetic, SmolLM2's shape (hidden 576, ffn 1536, vocab 49152, 30 layers)
with 8 heads and 4 KV heads so that --tp 2 splits them, Q4_1 linear weights and a Q8_0 embedding,
as SmolLM2's GGUF has. Each round checks that every mode gave the first's tokens."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_latency import RECIPE  # noqa: E402  (the same synthetic model's recipe)


# --micro-batches, --run-ahead; "whole-ahead" (not run by default): whole steps run ahead, where the
# first stage waits for the whole step's tokens, to tell what the parts add to run ahead
MODES = {"whole": (1, False), "parts": (0, False), "ahead": (0, True), "whole-ahead": (1, True)}


def measure(model: str, tp: int, batch: int, prompt: int, tokens: int, mode: str) -> dict:
    from radiance.config import Config
    from radiance.generation.sequence import SamplingParams
    from radiance.launch import engine_over, open_ranks

    parts, ahead = MODES[mode]
    # the exact (f32) KV cache: the modes cut steps differently, and the host's default f16 cache can turn
    # the ~1e-7 a band switch moves a value into an f16 step (docs/RUNTIME.md), while this bench checks
    # that every mode gives the same tokens
    config = Config(model=model, progress=False, tp=tp, pp=2, micro_batches=parts, run_ahead=ahead, max_seqs=batch,
                    max_step_tokens=batch * prompt, max_context=prompt + tokens + 2, kv_cache_dtype="f32")
    times, counted = [], []
    with open_ranks(config) as ranks:
        engine = engine_over(ranks)
        params = SamplingParams(max_tokens=tokens + 1, temperature=0, ignore_eos=True)
        sequences = [engine.add([(7 * s + k) % 49000 + 100 for k in range(prompt)], params) for s in range(batch)]
        while engine.scheduler.has_work:
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - start)
            counted.append(ranks.step_stats()["parts"])
    decode = times[1:]
    return {"prefill": batch * prompt / times[0], "decode": batch * len(decode) / sum(decode),
            "step_ms": 1e3 * statistics.fmean(decode), "parts": counted[-1],
            "outputs": [sequence.output_ids for sequence in sequences]}


def measured(**one) -> dict:
    """measure() in a fresh process."""
    result = subprocess.run([sys.executable, __file__, "--one", json.dumps(one)], capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"a measurement failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(measure(**json.loads(sys.argv[2]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[4, 16], help="sequences decoding together")
    parser.add_argument("--prompt", type=int, default=64, help="tokens of each sequence's prompt")
    parser.add_argument("--tokens", type=int, default=16, help="decode steps measured")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--tp", type=int, default=1, help="ranks of each stage")
    parser.add_argument("--rounds", type=int, default=3, help="times over every (batch, mode), alternated")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=["whole", "parts", "ahead"],
                        help="the first is the peer")
    args = parser.parse_args()
    from radiance.convert.api import convert_synthetic

    with tempfile.TemporaryDirectory() as folder:
        recipe = Path(folder) / "recipe.toml"
        recipe.write_text(RECIPE)
        model = Path(folder) / "model.rad"
        convert_synthetic(model, "llama", dict(hidden=576, layers=args.layers, heads=8, kv_heads=4, ffn=1536,
                                               vocab=49152, context=2048), seed=1, recipe=recipe)
        ratios: dict = {}
        for round_number in range(args.rounds):
            load = " ".join(f"{value:.2f}" for value in os.getloadavg())
            print(f"== round {round_number + 1} (load: {load}); --tp {args.tp} --pp 2, host ranks, "
                  f"prompts of {args.prompt} tokens, {args.tokens} decode steps")
            print(f"{'batch':>6}{'mode':>12}{'parts':>7}{'prefill tok/s':>15}{'decode tok/s':>14}{'step ms':>9}")
            for batch in args.batch:
                figures = {}
                for mode in args.modes:
                    got = figures[mode] = measured(model=str(model), tp=args.tp, batch=batch, prompt=args.prompt,
                                                   tokens=args.tokens, mode=mode)
                    print(f"{batch:6}{mode:>12}{got['parts']:7}{got['prefill']:15.1f}{got['decode']:14.1f}"
                          f"{got['step_ms']:9.2f}", flush=True)
                peer = args.modes[0]
                for mode in args.modes[1:]:
                    if figures[mode]["outputs"] != figures[peer]["outputs"]:
                        raise SystemExit(f"batch {batch}: the tokens of {mode} differ from those of {peer}")
                    ratio = {key: figures[mode][key] / figures[peer][key] for key in ("prefill", "decode")}
                    ratios.setdefault((batch, mode), []).append(ratio)
                    print(f"{'':6}{mode + '/' + peer:>19}{ratio['prefill']:15.2f}{ratio['decode']:14.2f}   "
                          f"(same tokens)", flush=True)
        print(f"== medians of the rounds' ratios, against {args.modes[0]}")
        for (batch, mode), found in ratios.items():
            print(f"batch {batch:3}, {mode:>11}: prefill {statistics.median(r['prefill'] for r in found):.2f}x, "
                  f"decode {statistics.median(r['decode'] for r in found):.2f}x")


if __name__ == "__main__":
    sys.exit(main())
