"""Batches on one card (issue 20): the Llama-3-8B-shaped synthetic model in bf16 and its fp8
conversion (bench/fp8_channel.toml: e4m3 with a scale per output channel), each measured as below.

    PYTHONUNBUFFERED=1 python3 bench/card_batches.py [--formats bf16 fp8] [--prefill 2048]
        [--batches 8 32 64] [--context 1024] [--mixed] [--steps 32] [--clients 1,8,32,64]
        [--max-tokens 64] [--temperature 0.7] [--skip-serving] [--peer [all|prefill|decode]]
        [--run-ahead auto|on|off ...] [--keep DIR] [--prefill-fused [--repeats N]] [--prefill-only]
    python3 bench/card_batches.py --small --device host ...   # the script's smoke run on host rows

- **Prefill**: one --prefill-token prompt as one step (max_step_tokens = the prompt), the step's
  seconds and tokens/s; the first run compiles, so the figure is the second prompt's (with
  --repeats N: the median of the N prompts after the first). --prefill-fused: the same timed with
  libr4d's fused prefill rows' grouped launches and with the chain's own (R4D_PREFILL_FUSED=1, then
  0; an engine each, over the model written once), both printed with their ratio. --prefill-only:
  nothing after the prefill (no decode, no serving).
- **Batched decode**: at each --batches B, B sequences of a --context-token prompt (--mixed: contexts
  spread evenly from 64 to --context, so the batch reads a mix of lengths) prefilled, then decode
  steps of all B timed by the wall clock: output tokens per second and ms per step; --run-ahead on off
  times each B twice, the engine planning the next step while the card runs one, and not.
- **Decode at batch 1** (the fp8 Show item): ms/token against the bound (the bytes of every weight
  but the embedding table / 4.8 TB/s, as card_generate.py counts it); greedy, and, unless
  --skip-serving, again sampled at --temperature (what the served requests ask for; 0: not), so the
  served time per token has the engine's own at the same sampling beside it.
- **Serving**: `radiance --serve` on the card (--max-seqs the largest level, max_context the
  prompt plus --max-tokens), driven by `rad-bench --concurrency --clients --temperature --json`:
  tokens/s, TTFT, inter-token latency and time per output token percentiles at each client count;
  then the server's own step figures (/metrics: steps, mean seconds, sequences a step).

--peer (bf16, the 8B shape) adds PyTorch on the same shapes in the same run, after radiance has let
the card go: bench/torch_peer.py's compiled-graph mode (gpt-fast's recipe) for the prefill
(`--prefill`) and for decode at each batch (`--batch B --context C`: every sequence at --context, so
compare it with a run without --mixed); `--peer prefill` or `--peer decode` runs that half alone (each
compiled shape costs the peer 100-200 s on an H200, so a call may afford only one half); each figure is printed with radiance's / PyTorch's ratio.
Radiance's figures are wall time through the engine (planning and sampling included); the peer's
are CUDA events around a graph replay (decode, its token read back each step) or a forward (prefill).
`--kernels`: one more prefill step, untimed (and one launched without chained launches, each kernel's own
time), and each batch's captured decode step, replayed alone,
under torch.profiler: their card kernels by name (bench/card_kernels.py). `--keep DIR`: write each format's
model there once and reuse it (several processes of one call, each with its own environment, pay the
~40 s of writing the 8B model once).

Run from anywhere with the checkout's bench/ on the path; radiance need not be installed (the
checkout shim maps it). Writes $OUT/card_batches.json, and rad-bench's JSON per format beside it."""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from checkout_shim import ROOT, SHIM_PATH  # noqa: F401  (first: maps the checkout under `radiance.`)

import numpy as np  # noqa: E402
from card_kernels import profile_step, step_kernels  # noqa: E402
from server_process import running_server  # noqa: E402

HBM_BYTES_PER_S = 4.8e12
EIGHT_B = dict(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256, context=8192,
               rope_theta=500000.0, tie_embeddings=False)
SMALL = dict(hidden=256, layers=2, heads=4, kv_heads=2, ffn=512, vocab=1024, context=4096)
VOCAB = EIGHT_B["vocab"]
DEVICE = "auto"  # --device: host runs the script's smoke test on host rows
KERNELS = False  # --kernels: one prefill step and each batch's captured decode step profiled by kernel name
RECIPE = Path(__file__).resolve().parent / "fp8_channel.toml"


def prompt(length: int, seed: int) -> list[int]:
    """A seeded prompt of random ids of the model's vocabulary (VOCAB, set by main)."""
    return [int(i) for i in np.random.default_rng(seed).integers(3, min(VOCAB - 1, 120000), length)]


def engine_for(model: Path, max_seqs: int, max_step_tokens: int, max_context: int, tokens: int | None = None,
               run_ahead: bool | None = None):
    """Ranks over one card (the host's rows where there is none) and the engine maker; `tokens`: the
    KV cache holds that many slots in all (default: max_seqs sequences of max_context); `run_ahead`:
    Config.run_ahead (None: the runtime's default)."""
    from radiance.config import Config
    from radiance.launch import engine_over, open_ranks

    if DEVICE == "auto":  # in process: one card
        os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES") or "0"
    blocks = -(-tokens // 16) + max_seqs if tokens else 0
    options = Config(model=str(model), progress=False, device=DEVICE, max_seqs=max_seqs,
                     max_step_tokens=max_step_tokens, max_context=max_context, num_blocks=blocks,
                     run_ahead=run_ahead, accept_reference=DEVICE == "host")  # host rows read fp8 only through libref
    return open_ranks(options), engine_over


def run_all(engine, sequences) -> None:
    while not all(sequence.finished for sequence in sequences):
        engine.step()


def prefill(model: Path, length: int, repeats: int = 1) -> dict:
    """Seconds of the step that prefills a `length`-token prompt: the median of `repeats` prompts after
    a first (which compiles)."""
    from radiance.generation.sequence import SamplingParams

    ranks_context, engine_over = engine_for(model, 1, length, length + 8)
    with ranks_context as ranks:
        engine = engine_over(ranks)
        seconds = []
        for seed in range(1, 2 + repeats):
            sequence = engine.add(prompt(length, seed), SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
            start = time.perf_counter()
            engine.step()  # the whole prompt in one step, its first token sampled
            seconds.append(time.perf_counter() - start)
            run_all(engine, [sequence])
        if KERNELS:  # a third prompt, its prefill step under the profiler (the timed ones stay unprofiled)
            sequence = engine.add(prompt(length, 3), SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
            print(f"    prefill {length} tokens, its step's kernels:")
            step_kernels(engine.step)
            run_all(engine, [sequence])
            executor = getattr(ranks.worker, "executor", None)
            if getattr(executor, "chain", False):  # chained kernels overlap: each one's own time, launched plainly
                executor.chain = False
                try:
                    sequence = engine.add(prompt(length, 4), SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
                    print(f"    prefill {length} tokens without chained launches, its step's kernels:")
                    step_kernels(engine.step)
                    run_all(engine, [sequence])
                finally:
                    executor.chain = True
    median = float(np.median(seconds[1:]))
    result = {"tokens": length, "first_s": seconds[0], "seconds": median, "tokens_per_s": length / median,
              "timed_s": seconds[1:]}
    print(f"    prefill {length} tokens: {1e3 * median:.1f} ms, {result['tokens_per_s']:.0f} tokens/s "
          f"(first, compiling: {seconds[0]:.1f} s)", flush=True)
    return result


def prefill_fused_and_not(model: Path, length: int, repeats: int) -> dict:
    """--prefill-fused: the prefill with the fused prefill rows' grouped launches (R4D_PREFILL_FUSED=1)
    and with the chain's own (0), an engine each (the rows read the variable when they plan, and a
    plan lasts as long as its engine); the variable as it was afterwards."""
    before = os.environ.get("R4D_PREFILL_FUSED")
    figures = {}
    try:
        for label, value in (("fused", "1"), ("unfused", "0")):
            os.environ["R4D_PREFILL_FUSED"] = value
            print(f"    R4D_PREFILL_FUSED={value} ({label} prefill rows):", flush=True)
            figures[label] = prefill(model, length, repeats)
    finally:
        if before is None:
            os.environ.pop("R4D_PREFILL_FUSED", None)
        else:
            os.environ["R4D_PREFILL_FUSED"] = before
    fused, unfused = figures["fused"]["seconds"], figures["unfused"]["seconds"]
    figures["speedup"] = unfused / fused
    print(f"    prefill {length} tokens: fused {1e3 * fused:.1f} ms, unfused {1e3 * unfused:.1f} ms: "
          f"{figures['speedup']:.3f}x", flush=True)
    return figures


def batched_decode(model: Path, batch: int, context: int, mixed: bool, steps: int, temperature: float = 0.0,
                   run_ahead: bool | None = None) -> dict:
    """Output tokens per second over `steps` decode steps of all `batch` sequences, after their prefills;
    greedy, or sampled at `temperature` (seeded); `run_ahead` as engine_for takes it."""
    from radiance.generation.sequence import SamplingParams

    lengths = [int(x) for x in np.linspace(64, context, batch)] if mixed and batch > 1 else [context] * batch
    # The prompts are prefilled a few at a time (2048 tokens a step), so the first sequences have
    # sampled up to one token a prefill step before the last one starts: every sequence asks for
    # that many more than the timed steps, so none finishes inside the window (a finished one
    # would shrink the batch and capture a new graph there).
    prefill_steps = -(-sum(lengths) // 2048)
    outputs = steps + prefill_steps + 8
    ranks_context, engine_over = engine_for(model, batch, 2048, context + outputs,
                                            sum(length + outputs for length in lengths), run_ahead)
    with ranks_context as ranks:
        engine = engine_over(ranks)
        ahead = engine.run_ahead
        params = SamplingParams(max_tokens=outputs, temperature=temperature, seed=7, ignore_eos=True)
        sequences = [engine.add(prompt(length, 10 + i), params) for i, length in enumerate(lengths)]
        while not all(len(sequence.output_ids) >= 2 for sequence in sequences):  # prefilled, a decode step run
            engine.step()
        engine.step()  # the second decode step of this shape captures its graph: not in the timed window
        before = sum(len(sequence.output_ids) for sequence in sequences)
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        seconds = time.perf_counter() - start
        produced = sum(len(sequence.output_ids) for sequence in sequences) - before
        if produced != batch * steps:  # the window must time `batch` sequences every step
            raise RuntimeError(f"batch {batch}: {produced} tokens in {steps} steps, not {batch * steps}")
        if KERNELS:
            print(f"    decode batch {batch}, its captured step:")
            profile_step(ranks.worker, batch)
        run_all(engine, sequences)
    result = {"batch": batch, "contexts": [min(lengths), max(lengths)], "steps": steps, "tokens": produced,
              "tokens_per_s": produced / seconds, "ms_per_step": 1e3 * seconds / steps, "temperature": temperature,
              "run_ahead": ahead}
    how = (f", sampled at temperature {temperature}" if temperature else "") + (", run ahead" if ahead else "")
    print(f"    decode batch {batch} (contexts {min(lengths)}..{max(lengths)}{how}): {result['tokens_per_s']:.0f} tokens/s, "
          f"{result['ms_per_step']:.2f} ms a step", flush=True)
    return result


def step_metrics(url: str) -> dict:
    """The server's own step figures from /metrics: steps, their seconds, and the sequences in them."""
    import urllib.request

    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    found = {name: float(value) for name, value in re.findall(
        r"^(radiance_step_(?:seconds|sequences)_(?:sum|count)) (\S+)$", text, re.M)}
    steps = int(found.get("radiance_step_seconds_count", 0))
    return {"steps": steps, "seconds": found.get("radiance_step_seconds_sum", 0.0),
            "sequences": found.get("radiance_step_sequences_sum", 0.0)}


def serving(model: Path, clients: str, max_tokens: int, folder: Path, label: str, temperature: float) -> dict:
    """rad-bench against `radiance --serve` on the card; its report (with the server's own step
    figures over the whole run, /metrics), or the failure's words."""
    most = max(int(level) for level in clients.split(","))
    log_path = folder / f"serve_{label}.log"
    # -P: run from the checkout, its own radiance/ folder must not shadow the shim's mapping (a card machine)
    command = [sys.executable, "-P", "-m", "radiance.tools.generate", "--model", str(model), "--serve", "--host", "127.0.0.1",
               "--port", "0", "--device", DEVICE, "--max-seqs", str(most), "--max-context", str(512 + max_tokens)]
    command += ["--debug-accept-reference-kernels"] if DEVICE == "host" else []
    with running_server(command, log_path) as (_, url):
        if url is None:
            return {"error": f"the server did not start: {log_path.read_text()[-2000:]}"}
        report_path = folder / f"rad_bench_{label}.json"
        done = subprocess.run([sys.executable, "-P", "-m", "radiance.serving.bench", "--url", url, "--concurrency", clients,
                               "--max-tokens", str(max_tokens), "--temperature", str(temperature),
                               "--json", str(report_path)], timeout=1800)
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
        report["returncode"] = done.returncode
        steps = report["server_steps"] = step_metrics(url)
        if steps["steps"]:
            print(f"    served: {steps['steps']} steps, {1e3 * steps['seconds'] / steps['steps']:.2f} ms a step on "
                  f"average ({steps['sequences'] / steps['steps']:.1f} sequences), the server's own /metrics", flush=True)
        return report


def peer(arguments: list[str]) -> dict:
    """bench/torch_peer.py's compiled-graph figures for the 8B shape with `arguments`, in its own
    process (the card PyTorch's alone); {"error": ...} where it failed."""
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, str(Path(__file__).resolve().parent / "torch_peer.py"), "--eight-b",
                   "--modes", "compiled-graph", *arguments]
        done = subprocess.run(command, env={**os.environ, "OUT": folder}, timeout=1200)
        path = Path(folder, "torch_peer.json")
        figures = json.loads(path.read_text()).get("llama8b", {}).get("compiled-graph", {}) if path.exists() else {}
    if done.returncode or "tokens_per_s" not in figures:
        why = figures.get("error", "no figures")
        return {"error": f"torch_peer.py {' '.join(arguments)} exited {done.returncode}: {why}"}
    return figures


def compared(label: str, ours: dict, theirs: dict) -> dict:
    """The peer's figures beside ours, with the ratio of tokens/s (ours / PyTorch's)."""
    if "error" in theirs:
        print(f"    {label}: PyTorch failed: {theirs['error']}", flush=True)
        return theirs
    ratio = ours["tokens_per_s"] / theirs["tokens_per_s"]
    print(f"    {label}: radiance {ours['tokens_per_s']:.0f} tokens/s, PyTorch compiled {theirs['tokens_per_s']:.0f} "
          f"tokens/s: {ratio:.2f}x", flush=True)
    return {**theirs, "ratio": ratio}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", nargs="+", default=["bf16", "fp8"], choices=["bf16", "fp8"])
    parser.add_argument("--prefill", type=int, default=2048, help="tokens of the prompt prefilled in one step")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--context", type=int, default=1024, help="tokens of each batched sequence's prompt")
    parser.add_argument("--mixed", action="store_true", help="contexts spread from 64 to --context")
    parser.add_argument("--steps", type=int, default=32, help="decode steps timed at each batch")
    parser.add_argument("--clients", default="1,8,32,64", help="rad-bench's concurrency levels")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens each rad-bench request asks for")
    parser.add_argument("--temperature", type=float, default=0.7,
                        help="rad-bench's requests sample at it; with serving, batch 1 is also timed sampled at it (0: not)")
    parser.add_argument("--run-ahead", nargs="+", default=["auto"], choices=["auto", "on", "off"],
                        help="decode with the engine planning step n + 1 while the card runs step n (Config.run_ahead), "
                             "or not, or as the runtime decides (auto); several: each batch timed under each, in turn")
    parser.add_argument("--skip-serving", action="store_true")
    parser.add_argument("--peer", nargs="?", const="all", choices=["all", "prefill", "decode"],
                        help="bf16: PyTorch (bench/torch_peer.py) on the same shapes: all (the default), or the prefill "
                             "or the decode batches alone")
    parser.add_argument("--small", action="store_true", help="a small synthetic model: the script's own smoke run")
    parser.add_argument("--device", default="auto", choices=["auto", "host"], help="host: host rows (a smoke run)")
    parser.add_argument("--kernels", action="store_true", help="also a prefill step's and each batch's captured decode step's kernels by "
                                                             "name (torch.profiler's CUPTI; untimed steps)")
    parser.add_argument("--keep", type=Path, help="keep each format's model in this folder and reuse it")
    parser.add_argument("--prefill-fused", action="store_true",
                        help="time the prefill with R4D_PREFILL_FUSED=1 and 0 (an engine each) and print their ratio")
    parser.add_argument("--repeats", type=int, default=1, help="prefill prompts timed after the first (the median)")
    parser.add_argument("--prefill-only", action="store_true", help="the prefill alone: no decode, no serving")
    args = parser.parse_args()
    if args.peer and (args.small or args.mixed):
        parser.error("--peer measures the 8B shape at one context: not with --small or --mixed")
    global DEVICE, VOCAB, KERNELS
    DEVICE, KERNELS = args.device, args.kernels
    shape = SMALL if args.small else EIGHT_B
    VOCAB = shape["vocab"]
    from radiance.convert.api import convert_synthetic

    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="card_batches_"))
    results = {"command": "python3 bench/card_batches.py " + " ".join(sys.argv[1:]), "formats": {}}
    with tempfile.TemporaryDirectory() as folder:
        for fmt in args.formats:
            model = (args.keep or Path(folder)) / f"{'small' if args.small else 'llama8b'}_{fmt}.rad"
            if not model.exists():
                start = time.perf_counter()
                model.parent.mkdir(parents=True, exist_ok=True)
                convert_synthetic(model, "llama", shape, seed=3, recipe=RECIPE if fmt == "fp8" else None)
                print(f"{fmt}: the {'small' if args.small else '8B-shaped'} model written in "
                      f"{time.perf_counter() - start:.0f} s", flush=True)
            weight_bytes = model.stat().st_size - shape["vocab"] * shape["hidden"] * 2  # the bf16 table is not read
            figures = {"bound_ms": 1e3 * weight_bytes / HBM_BYTES_PER_S}
            if args.prefill_fused:
                figures["prefill_fused"] = prefill_fused_and_not(model, args.prefill, args.repeats)
                figures["prefill"] = figures["prefill_fused"]["fused"]
            else:
                figures["prefill"] = prefill(model, args.prefill, args.repeats)
            if args.prefill_only:
                results["formats"][fmt] = figures
                if not args.keep:
                    model.unlink()
                continue
            one = batched_decode(model, 1, args.context, False, args.steps)
            figures["decode_batch1"] = {**one, "ms_per_token": one["ms_per_step"],
                                        "of_bound": figures["bound_ms"] / one["ms_per_step"]}
            if args.temperature > 0 and not args.skip_serving:  # the engine's own figure beside the served one
                figures["decode_batch1_sampled"] = batched_decode(model, 1, args.context, False, args.steps,
                                                                  args.temperature)
            print(f"    batch 1: {one['ms_per_step']:.3f} ms/token, bound {figures['bound_ms']:.3f} ms "
                  f"({figures['decode_batch1']['of_bound']:.0%} of it)", flush=True)
            modes = [{"auto": None, "on": True, "off": False}[mode] for mode in args.run_ahead]
            figures["decode"] = [batched_decode(model, batch, args.context, args.mixed, args.steps, run_ahead=mode)
                                 for batch in args.batches for mode in modes]
            if args.peer in ("all", "prefill") and fmt == "bf16":
                figures["peer_prefill"] = compared(f"prefill {args.prefill}", figures["prefill"],
                                                   peer(["--prefill", str(args.prefill)]))
            if args.peer in ("all", "decode") and fmt == "bf16":
                theirs = {}  # a batch's peer runs once, however many --run-ahead modes ours ran in
                for ours in figures["decode"]:
                    if ours["batch"] not in theirs:
                        theirs[ours["batch"]] = peer(["--batch", str(ours["batch"]), "--context", str(args.context),
                                                      "--tokens", str(args.steps)])
                    label = f"decode batch {ours['batch']}" + (" run ahead" if ours["run_ahead"] else "")
                    ours["peer"] = compared(label, ours, theirs[ours["batch"]])
            if not args.skip_serving:
                figures["serving"] = serving(model, args.clients, args.max_tokens, out, fmt, args.temperature)
            results["formats"][fmt] = figures
            if not args.keep:
                model.unlink()
    Path(out, "card_batches.json").write_text(json.dumps(results, indent=1))
    print(f"written: {out / 'card_batches.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
