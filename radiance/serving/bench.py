"""rad-bench: a load generator for a running Radiance (or any OpenAI-compatible) server.

At each concurrency level (1, 4, 16, 32 by default) that many clients send streaming requests
back to back; each request's time to first token, its gaps between tokens and its token count are
measured on the client. Per level: TTFT and inter-token latency (mean, p50, p90, p99), time per
output token, output tokens per second over the level's wall time, requests per second, errors.
The figures go to stdout as a table, to --json as JSON, and to --plot as a PNG (matplotlib, the
"bench" extra). Every level is bounded in requests and in time."""

import asyncio
import importlib.util
import json
import statistics
import sys
import time
from dataclasses import dataclass, field

import click

DEFAULT_PROMPT = ("You are a careful storyteller. Write a long, detailed story about a lighthouse keeper on a "
                  "remote island who finds a message in a bottle, and tell it in many short chapters.")


@dataclass
class Sample:
    ok: bool
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    latency: float = 0.0
    error: str | None = None
    counted_by: str = "text"  # what marked a token's arrival: "usage" (the chunks' usage so far) or "text"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {"mean": statistics.fmean(values), "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99)}


async def sse_lines(response):
    """The lines of a server-sent event stream: split at LF (a CR before it dropped) as the SSE format
    ends its lines, not at every Unicode line break as httpx's aiter_lines does, which cut a chunk
    whose text holds U+2028, U+2029 or U+0085 (JSON leaves them unescaped) in two."""
    pending = b""
    async for data in response.aiter_bytes():
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.removesuffix(b"\r").decode("utf-8")
    if pending:
        yield pending.removesuffix(b"\r").decode("utf-8")


async def one_request(client, url: str, headers: dict, body: dict, chat: bool, timeout: float) -> Sample:
    """One streamed request, timed on the client. A token arrives with the chunk whose usage
    (stream_options.continuous_usage_stats, which run_level asks for) counts more completion tokens
    than the chunk before it, whether or not its text is empty: a model's tokens may decode to
    nothing (a synthetic model's, or half a character). From a server that sends no usage before the
    end, a token arrives with each chunk of non-empty text, as the only sign there is. TTFT: to the
    first token's chunk; the gaps: between token chunks (a chunk of k tokens is one gap)."""
    start = time.perf_counter()
    first = last = None
    gaps, tokens, finished, counted_by = [], 0, False, "text"
    try:
        async with client.stream("POST", url, json=body, headers=headers, timeout=timeout) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return Sample(False, error=f"HTTP {response.status_code}: {text[:200]}")
            async for line in sse_lines(response):
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                chunk = json.loads(data)
                if "error" in chunk:
                    return Sample(False, error=chunk["error"].get("message", "an error event"))
                arrived = False
                choices = chunk.get("choices", [])
                if chunk.get("usage"):
                    count = chunk["usage"]["completion_tokens"]
                    if choices:  # a usage beside a choice: the server counts as it streams
                        counted_by = "usage"
                    arrived, tokens = count > tokens, max(tokens, count)
                for choice in choices:
                    text = choice["delta"].get("content") if chat else choice.get("text")
                    arrived = arrived or (counted_by == "text" and bool(text))
                    finished = finished or choice.get("finish_reason") is not None
                if arrived and choices:
                    if first is None:
                        first = now
                    else:
                        gaps.append(now - last)
                    last = now
    except Exception as error:  # a failed request is counted, never fatal to the run
        return Sample(False, error=f"{type(error).__name__}: {error}")
    if not finished:
        return Sample(False, error="the stream ended without a finish_reason")
    return Sample(True, ttft=None if first is None else first - start, gaps=gaps, tokens=tokens,
                  latency=time.perf_counter() - start, counted_by=counted_by)


async def run_level(base: str, headers: dict, model: str, concurrency: int, requests: int, max_seconds: float,
                    max_tokens: int, prompt: str, chat: bool, ignore_eos: bool, timeout: float,
                    temperature: float = 0.7, continuous_usage: bool = True) -> dict:
    import httpx

    url = f"{base}/v1/chat/completions" if chat else f"{base}/v1/completions"
    body = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "stream": True,
            "stream_options": {"include_usage": True, **({"continuous_usage_stats": True} if continuous_usage else {})},
            "ignore_eos": ignore_eos}
    body.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    samples: list[Sample] = []
    issued = 0
    deadline = time.perf_counter() + max_seconds
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:

        async def worker(index: int):
            nonlocal issued
            while issued < requests and time.perf_counter() < deadline:
                issued += 1
                samples.append(await one_request(client, url, headers, {**body, "seed": 1000 * concurrency + issued},
                                                 chat, timeout))

        start = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        wall = time.perf_counter() - start
    good = [s for s in samples if s.ok]
    tokens = sum(s.tokens for s in good)
    tpot = [(s.latency - s.ttft) / (s.tokens - 1) for s in good if s.ttft is not None and s.tokens > 1]
    return {"concurrency": concurrency, "requests": len(samples), "errors": len(samples) - len(good),
            "first_errors": [s.error for s in samples if not s.ok][:3], "wall_s": wall,
            "output_tokens": tokens, "output_tokens_per_s": tokens / wall if wall else 0.0,
            "requests_per_s": len(good) / wall if wall else 0.0,
            "ttft_s": summary([s.ttft for s in good if s.ttft is not None]),
            "itl_s": summary([gap for s in good for gap in s.gaps]), "tpot_s": summary(tpot),
            "latency_s": summary([s.latency for s in good]),
            "tokens_counted_by": sorted({s.counted_by for s in good})}


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = report["levels"]
    x = [level["concurrency"] for level in levels]
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))

    def series(ax, key, title, scale=1000.0, unit="ms"):
        for q, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
            ax.plot(x, [None if level[key][q] is None else level[key][q] * scale for level in levels], style, label=q)
        ax.set_title(title)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(unit)
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(v) for v in x])
        ax.grid(alpha=0.3)
        ax.legend()

    series(axes[0], "ttft_s", "time to first token")
    series(axes[1], "itl_s", "inter-token latency")
    axes[2].plot(x, [level["output_tokens_per_s"] for level in levels], "o-", color="tab:green")
    axes[2].set_title("output throughput")
    axes[2].set_xlabel("concurrent clients")
    axes[2].set_ylabel("tokens/s")
    axes[2].set_xscale("log", base=2)
    axes[2].set_xticks(x, [str(v) for v in x])
    axes[2].grid(alpha=0.3)
    figure.suptitle(f"rad-bench: {report['model']} at {report['url']} (max_tokens {report['max_tokens']}, "
                    f"{report['prompt_tokens'] or '?'} prompt tokens)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def _ms(value) -> str:
    return "-" if value is None else f"{1000 * value:.1f}"


def wait_until_ready(base: str, seconds: float) -> None:
    """Return once `base`/health stops answering 503 (a Radiance server answers 503 while it loads its
    model and 200 once it serves; a server without /health answers something else and is taken as
    ready); a ClickException past `seconds`. A level measured against a loading server would be all
    errors."""
    import httpx  # main has said what to install where it is missing

    deadline, said = time.monotonic() + seconds, False
    while True:
        try:
            answer = httpx.get(f"{base}/health", timeout=10)
            if answer.status_code != 503:
                return
            status = answer.json().get("status", "503") if answer.headers.get("content-type", "").startswith(
                "application/json") else "503"
        except httpx.TransportError as error:
            raise click.ClickException(f"{base}: no server answers ({error})") from None
        if time.monotonic() >= deadline:
            raise click.ClickException(f"{base}: /health still says {status!r} after {seconds:.0f} s (--wait-ready)")
        if not said:
            click.echo(f"rad-bench: {base} is {status}; waiting up to {seconds:.0f} s for /health to answer 200", err=True)
            said = True
        time.sleep(0.5)


@click.command()
@click.option("--url", default="http://127.0.0.1:8000", show_default=True, help="The server's base URL.")
@click.option("--api-key", default=None, envvar="RADIANCE_API_KEY", help="Sent as 'Authorization: Bearer KEY'.")
@click.option("--model", default=None, help="Model name (default: the first /v1/models lists).")
@click.option("--concurrency", default="1,4,16,32", show_default=True, help="Levels: concurrent clients.")
@click.option("--requests", "requests_per_client", default=4, show_default=True,
              help="Requests per client at each level (a level sends concurrency x this many).")
@click.option("--max-seconds", default=300.0, show_default=True, help="No new request after this long in a level.")
@click.option("--max-tokens", default=64, show_default=True, help="Tokens per completion.")
@click.option("--prompt", default=DEFAULT_PROMPT, help="The prompt every request sends.")
@click.option("--chat", is_flag=True, help="Use /v1/chat/completions (default: /v1/completions).")
@click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
              help="Ask for exactly --max-tokens tokens (the server's ignore_eos extension).")
@click.option("--temperature", default=0.7, show_default=True, help="Every request's temperature (0: greedy).")
@click.option("--continuous-usage/--no-continuous-usage", default=True, show_default=True,
              help="Ask for the usage in every chunk (stream_options.continuous_usage_stats, vLLM's extension) to time "
                   "tokens that add no text; off for a server that refuses the field (then only text marks a token).")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds one request may take.")
@click.option("--wait-ready", default=600.0, show_default=True,
              help="Seconds to wait for a server still loading its model (/health answering 503) before measuring.")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), help="Write the report here.")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False), help="Write a PNG plot here.")
def main(url, api_key, model, concurrency, requests_per_client, max_seconds, max_tokens, prompt, chat, ignore_eos,
         temperature, continuous_usage, timeout, wait_ready, json_path, plot_path):
    """Measure a running server: time to first token, inter-token latency and throughput at each
    concurrency level."""
    try:
        import httpx
    except ImportError:
        raise click.ClickException("rad-bench needs httpx: pip install 'radiance[bench]'") from None
    if plot_path and importlib.util.find_spec("matplotlib") is None:
        raise click.ClickException("--plot needs matplotlib: pip install 'radiance[bench]'")
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        levels = [int(level) for level in concurrency.split(",") if level.strip()]
    except ValueError:
        raise click.BadParameter(f"{concurrency!r} is not a list of integers", param_hint="--concurrency") from None
    if not levels or min(levels) < 1:
        raise click.BadParameter("every level must be at least 1", param_hint="--concurrency")
    wait_until_ready(base, wait_ready)
    try:
        listed = httpx.get(f"{base}/v1/models", headers=headers, timeout=10).json()
        model = model or listed["data"][0]["id"]
        probe = httpx.post(f"{base}/v1/completions", headers=headers, timeout=timeout,
                           json={"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0})
        prompt_tokens = probe.json().get("usage", {}).get("prompt_tokens") if probe.status_code == 200 else None
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as error:
        raise click.ClickException(f"{base}: not an OpenAI-compatible server that answers ({error})") from None
    report = {"url": base, "model": model, "max_tokens": max_tokens, "prompt_tokens": prompt_tokens,
              "chat": chat, "ignore_eos": ignore_eos, "temperature": temperature, "levels": []}
    click.echo(f"{'clients':>7}{'reqs':>6}{'errs':>6}{'ttft p50':>10}{'ttft p90':>10}{'itl p50':>9}{'itl p90':>9}"
               f"{'tpot':>8}{'tok/s':>9}{'req/s':>7}   (ms)", err=True)
    for level in levels:
        result = asyncio.run(run_level(base, headers, model, level, level * requests_per_client, max_seconds,
                                       max_tokens, prompt, chat, ignore_eos, timeout, temperature, continuous_usage))
        report["levels"].append(result)
        click.echo(f"{level:>7}{result['requests']:>6}{result['errors']:>6}{_ms(result['ttft_s']['p50']):>10}"
                   f"{_ms(result['ttft_s']['p90']):>10}{_ms(result['itl_s']['p50']):>9}{_ms(result['itl_s']['p90']):>9}"
                   f"{_ms(result['tpot_s']['mean']):>8}{result['output_tokens_per_s']:>9.1f}"
                   f"{result['requests_per_s']:>7.2f}", err=True)
        for error in result["first_errors"]:
            click.echo(f"  error: {error}", err=True)
    text = json.dumps(report, indent=2)
    if json_path:
        with open(json_path, "w") as handle:
            handle.write(text + "\n")
    else:
        click.echo(text)
    if plot_path:
        plot(report, plot_path)
        click.echo(f"plot: {plot_path}", err=True)
    if any(level["errors"] for level in report["levels"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
