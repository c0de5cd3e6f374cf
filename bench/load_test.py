"""Load test of the server: N concurrent streaming clients for D seconds against `radiance --serve`
(--tp 1) or `radiance-launch --tp N --serve`, on loopback only, bounded in time and in requests.

Passes when no request failed, every response was complete (a finish_reason, usage, [DONE], no
more tokens than asked), and the server process's RSS and open file descriptors were steady from
the first to the last 10 s of the measured run (psutil on the server's pid, sampled every second;
the ranks' RSS is reported beside it), after a warm-up under the same load. Not part of the test run: it takes minutes.

    python bench/load_test.py --model smollm2.rad --tp 1
    python bench/load_test.py --model smollm2.rad --tp 3 --json tp3.json
"""

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import psutil

PROMPTS = [
    "Tell me about the history of the lighthouse.",
    "Write a short poem about the sea at night.",
    "Explain how a steam engine works, step by step.",
    "What should I pack for a week of hiking in the mountains?",
    "Describe the water cycle to a ten-year-old.",
    "List some good habits for writing clean code.",
    "Once upon a time, in a small village by the river,",
    "The three most important inventions of the last century are",
]


def start_server(model: str, tp: int, max_seqs: int, log_path: str) -> tuple[subprocess.Popen, str]:
    if tp == 1:
        command = [sys.executable, "-m", "radiance.tools.generate", "--model", model]
    else:
        command = [sys.executable, "-m", "radiance.tools.launch", "--tp", str(tp), "--model", model]
    command += ["--serve", "--host", "127.0.0.1", "--port", "0", "--max-seqs", str(max_seqs)]
    log = open(log_path, "w")
    environment = {name: value for name, value in os.environ.items() if name != "RADIANCE_API_KEY"}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, env=environment, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", open(log_path).read())
        if found:
            url = found.group(1)
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                        return process, url
                except httpx.HTTPError:
                    pass
                if process.poll() is not None:
                    break
                time.sleep(0.1)
        if process.poll() is not None:
            break
        time.sleep(0.05)
    process.kill()
    raise SystemExit(f"the server did not become ready:\n{open(log_path).read()}")


class Sampler(threading.Thread):
    """Every second: the server's RSS and open fds, and its ranks' RSS."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.process, self.samples, self.stopping = psutil.Process(pid), [], threading.Event()
        self.start_time = time.monotonic()

    def run(self):
        while not self.stopping.is_set():
            try:
                ranks = [c for c in self.process.children(recursive=True)]
                self.samples.append({"t": time.monotonic() - self.start_time, "rss": self.process.memory_info().rss,
                                     "fds": self.process.num_fds(),
                                     "ranks_rss": sum(c.memory_info().rss for c in ranks if c.is_running())})
            except psutil.Error:
                pass
            self.stopping.wait(1.0)


async def client(index: int, url: str, deadline: float, stats: dict, max_requests: int, rng_seed: int):
    import random

    rng = random.Random(rng_seed + index)
    async with httpx.AsyncClient(timeout=httpx.Timeout(180.0)) as http:
        while time.monotonic() < deadline and stats["sent"] < max_requests:
            stats["sent"] += 1
            chat = rng.random() < 0.5
            max_tokens = rng.randint(16, 64)
            prompt = rng.choice(PROMPTS)
            body = {"model": stats["model"], "max_tokens": max_tokens, "temperature": 0.8,
                    "seed": rng.randrange(1 << 31), "stream": True, "stream_options": {"include_usage": True}}
            if chat:
                body["messages"] = [{"role": "user", "content": prompt}]
            else:
                body["prompt"] = prompt
            route = "chat/completions" if chat else "completions"
            start = time.monotonic()
            try:
                problem = await one(http, f"{url}/v1/{route}", body, chat, max_tokens, stats)
            except Exception as error:  # counted, never fatal
                problem = f"{type(error).__name__}: {error}"
            if problem:
                stats["errors"].append(problem)
            else:
                stats["ok"] += 1
                stats["latency"].append(time.monotonic() - start)


async def one(http, url, body, chat, max_tokens, stats) -> str | None:
    finish = usage = None
    done, text = False, []
    async with http.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            return f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                return f"error event: {chunk['error']}"
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                text.append((choice["delta"].get("content") if chat else choice["text"]) or "")
                finish = choice["finish_reason"] or finish
    if not done or finish not in ("stop", "length") or usage is None:
        return f"incomplete: done={done} finish={finish} usage={usage}"
    if not 0 < usage["completion_tokens"] <= max_tokens or (finish == "length" and usage["completion_tokens"] != max_tokens):
        return f"bad usage {usage} for max_tokens {max_tokens} ({finish})"
    stats["tokens"] += usage["completion_tokens"]
    return None


def window(samples: list[dict], key: str, start: float, end: float) -> list[float]:
    return [s[key] for s in samples if start <= s["t"] < end]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=float, default=60.0, help="Seconds of load that are measured.")
    parser.add_argument("--warmup", type=float, default=15.0,
                        help="Seconds of the same load before them (the KV cache's pages and the argument caches "
                             "fill up), not measured.")
    parser.add_argument("--max-requests", type=int, default=20000, help="A bound on requests in all.")
    parser.add_argument("--rss-tolerance-mib", type=float, default=16.0,
                        help="The last 10 s's mean RSS may exceed the first 10 s's by this much.")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    log_path = tempfile.mktemp(prefix="radiance-load-", suffix=".log")
    process, url = start_server(args.model, args.tp, args.clients, log_path)
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    sampler = Sampler(process.pid)
    stats = {"model": model, "sent": 0, "ok": 0, "errors": [], "tokens": 0, "latency": [], "incomplete": 0}
    try:
        sampler.start()
        started = time.monotonic()
        deadline = started + args.warmup + args.duration

        async def run_all():
            await asyncio.gather(*(client(i, url, deadline, stats, args.max_requests, 1234)
                                   for i in range(args.clients)))

        asyncio.run(run_all())
        elapsed = time.monotonic() - started
        time.sleep(1.5)
        sampler.stopping.set()
        sampler.join()
        metrics = httpx.get(f"{url}/metrics").text
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            code = "killed"
    samples, span = sampler.samples, args.warmup + args.duration
    first, last = (args.warmup, args.warmup + 10), (span - 10, span)
    first_rss, last_rss = window(samples, "rss", *first), window(samples, "rss", *last)
    first_fds, last_fds = window(samples, "fds", *first), window(samples, "fds", *last)
    first_ranks, last_ranks = window(samples, "ranks_rss", *first), window(samples, "ranks_rss", *last)
    mib = 1 << 20
    kv = re.search(r"^radiance_kv_cache_usage_ratio (\S+)", metrics, re.M)
    report = {
        "tp": args.tp, "clients": args.clients, "warmup_s": args.warmup, "duration_s": args.duration,
        "elapsed_s": elapsed,
        "requests": stats["sent"], "ok": stats["ok"], "errors": len(stats["errors"]), "first_errors": stats["errors"][:5],
        "tokens": stats["tokens"], "tokens_per_s": stats["tokens"] / elapsed,
        "latency_p50_s": statistics.median(stats["latency"]) if stats["latency"] else None,
        "server_rss_mib_first10": statistics.fmean(first_rss) / mib, "server_rss_mib_last10": statistics.fmean(last_rss) / mib,
        "server_fds_first10": [min(first_fds), max(first_fds)], "server_fds_last10": [min(last_fds), max(last_fds)],
        "ranks_rss_mib_first10": statistics.fmean(first_ranks) / mib if first_ranks else 0.0,
        "ranks_rss_mib_last10": statistics.fmean(last_ranks) / mib if last_ranks else 0.0,
        "kv_usage_after": float(kv.group(1)) if kv else None, "server_exit": code,
        "server_rss_mib_every_5s": [round(s["rss"] / mib, 1) for s in samples[::5]],
        "server_fds_every_5s": [s["fds"] for s in samples[::5]],
    }
    growth = report["server_rss_mib_last10"] - report["server_rss_mib_first10"]
    checks = {
        "no error": report["errors"] == 0,
        "every response complete": report["ok"] == report["requests"],
        f"RSS steady (+{growth:.1f} MiB <= {args.rss_tolerance_mib} MiB)": growth <= args.rss_tolerance_mib,
        "fds steady": max(last_fds) <= max(first_fds),
        "KV cache empty after": report["kv_usage_after"] == 0.0,
        "clean exit": code == 0,
    }
    report["checks"] = checks
    report["passed"] = all(checks.values())
    text = json.dumps(report, indent=2)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text + "\n")
    print(text)
    os.unlink(log_path)
    sys.exit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
