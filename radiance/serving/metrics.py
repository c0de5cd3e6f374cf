"""/metrics: the server's figures in Prometheus text format through prometheus-client. Written by
the engine thread (steps, tokens, latencies) and the HTTP side (requests); the gauges that describe
the engine's state (queue depth, running sequences, KV usage) are read when scraped."""

from prometheus_client import (
    CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest,
)

CONTENT_TYPE = CONTENT_TYPE_LATEST

LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SHORT = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self):
        disable_created_metrics()  # no `_created` series: a server process has no other metrics
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("radiance_requests", "HTTP requests by route and status", ["route", "status"],
                                registry=registry)
        self.finished = Counter("radiance_requests_finished", "Generations ended, by why", ["reason"],
                                registry=registry)
        self.prompt_tokens = Counter("radiance_prompt_tokens", "Prompt tokens admitted", registry=registry)
        self.generated_tokens = Counter("radiance_generation_tokens", "Tokens generated", registry=registry)
        self.ttft = Histogram("radiance_time_to_first_token_seconds", "From a request's arrival to its first token",
                              buckets=LATENCY, registry=registry)
        self.itl = Histogram("radiance_inter_token_latency_seconds", "Between two tokens of one request",
                             buckets=SHORT, registry=registry)
        self.e2e = Histogram("radiance_request_seconds", "From a request's arrival to its last token",
                             buckets=LATENCY, registry=registry)
        self.step = Histogram("radiance_step_seconds", "One engine step: schedule, run on every rank, sample",
                              buckets=SHORT, registry=registry)
        self.step_tokens = Histogram("radiance_step_tokens", "Tokens computed in one step (decode and prefill)",
                                     buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), registry=registry)
        self.step_seqs = Histogram("radiance_step_sequences", "Sequences batched in one step",
                                   buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=registry)
        self.waiting = Gauge("radiance_requests_waiting", "Queue depth: requests not yet admitted to a step",
                             registry=registry)
        self.running = Gauge("radiance_requests_running", "Sequences admitted and holding KV blocks",
                             registry=registry)
        self.kv_usage = Gauge("radiance_kv_cache_usage_ratio", "Share of the KV cache's blocks in use",
                              registry=registry)
        self.kv_blocks = Gauge("radiance_kv_cache_blocks", "KV cache blocks, in all", registry=registry)
        self.compute = Counter("radiance_rank_compute_seconds", "Seconds rank 0 spent running steps",
                               ["rank"], registry=registry)
        self.collectives = Counter("radiance_collective_seconds", "Seconds rank 0 spent in collective rows",
                                   ["rank"], registry=registry)
        self.gate_hold = Counter("radiance_link_gate_hold_seconds", "Seconds rank 0's link gate was held",
                                 ["rank"], registry=registry)
        self.gate_holds = Counter("radiance_link_gate_holds", "Link-gate holds on rank 0", ["rank"],
                                  registry=registry)
        self.ready = Gauge("radiance_ready", "1 once every rank is ready", registry=registry)
        self._gate_seen = (0, 0.0)
        for counter in (self.compute, self.collectives, self.gate_hold, self.gate_holds):
            counter.labels(rank="0")

    def watch(self, waiting, running, kv_usage, kv_blocks: int) -> None:
        """The engine's state, read at each scrape (plain reads of sizes: safe from another thread)."""
        self.waiting.set_function(waiting)
        self.running.set_function(running)
        self.kv_usage.set_function(kv_usage)
        self.kv_blocks.set(kv_blocks)
        self.ready.set(1)

    def ranks_report(self, stats: dict) -> None:
        """A step's figures from rank 0: compute and collective seconds of the step, and the link
        gate's cumulative holds (counted here by their increase)."""
        self.compute.labels(rank="0").inc(max(0.0, stats.get("compute", 0.0)))
        self.collectives.labels(rank="0").inc(max(0.0, stats.get("collectives", 0.0)))
        holds, seconds = int(stats.get("gate_holds", 0)), float(stats.get("gate_hold_s", 0.0))
        seen_holds, seen_seconds = self._gate_seen
        if holds >= seen_holds and seconds >= seen_seconds:
            self.gate_holds.labels(rank="0").inc(holds - seen_holds)
            self.gate_hold.labels(rank="0").inc(seconds - seen_seconds)
        self._gate_seen = (holds, seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
