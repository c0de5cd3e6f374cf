"""`radiance-launch --tp 3 --serve` on SmolLM2 (three host ranks): /health is 503 until every rank
is ready, then the API answers; /graph is rank 0's resolved graph with its collective rows; /metrics
carries rank 0's collective and link-gate figures; SIGTERM is a clean stop that leaves nothing; a
rank killed mid-stream ends the stream with an error event and the launch with a non-zero exit."""

import signal
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from test_server_support import ServerProcess, metrics


@pytest.fixture(scope="module")
def launch(smollm2):
    process = ServerProcess("radiance.tools.launch", "--tp", 3, "--model", smollm2, "--max-seqs", 8,
                            "--max-context", 512)
    try:
        process.statuses = process.wait_ready()
        yield process
    finally:
        process.cleanup()


def test_health_is_503_until_every_rank_is_ready(launch):
    assert launch.statuses[0] == 503 and launch.statuses[-1] == 200
    assert set(launch.statuses) == {503, 200}, launch.statuses
    assert httpx.get(f"{launch.url}/health").json() == {"status": "ok", "model": "smollm2", "world": 3}
    assert "warmed up in" in launch.output()  # before /health said 200 (radiance/serving/warmup.py)


def test_chat_and_streaming_over_three_ranks(launch):
    with openai.OpenAI(base_url=f"{launch.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        answer = client.chat.completions.create(model="smollm2", temperature=0, max_tokens=40,
                                                messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in answer.choices[0].message.content
        whole = client.completions.create(model="smollm2", prompt="Water boils at", max_tokens=12, temperature=0.8,
                                          seed=11).choices[0].text
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="smollm2", prompt="Water boils at", max_tokens=12, temperature=0.8, seed=11, stream=True))
        assert streamed == whole


def test_graph_and_metrics_come_from_rank_0(launch):
    graph = httpx.get(f"{launch.url}/graph").json()
    assert graph["world"] == 3 and graph["steps"] > 0 and graph["digest"]
    assert len(graph["declared"]) > 100
    collectives = [entry for entry in graph["issued"] if entry["op"].startswith("all_")]
    assert collectives and all("_host" in entry["row"] for entry in collectives)  # host ranks: no P2P (the _host twins, chained or not)
    assert any("replaces" in entry for entry in graph["issued"])  # a fused row in its chain's place
    samples = metrics(launch.url)
    assert samples['radiance_collective_seconds_total{rank="0"}'] > 0
    assert samples['radiance_link_gate_holds_total{rank="0"}'] > 0
    assert samples['radiance_link_gate_hold_seconds_total{rank="0"}'] > 0
    assert samples['radiance_rank_compute_seconds_total{rank="0"}'] > 0


def test_sigterm_stops_the_launch_cleanly(launch):
    ranks = [child for child in launch.children() if "radiance.ranks.main" in " ".join(child.cmdline())]
    assert len(ranks) == 3
    run_id = ranks[0].environ()["RADIANCE_RUN_ID"]
    assert launch.stop(signal.SIGTERM) == 0, launch.output()
    assert "stopped" in launch.output()
    assert not [rank.pid for rank in ranks if rank.is_running() and rank.status() != psutil.STATUS_ZOMBIE]
    assert not list(Path("/dev/shm").glob(f"rad.{run_id}.*"))


def test_a_rank_dying_mid_stream_ends_the_stream_and_the_launch(smollm2):
    process = ServerProcess("radiance.tools.launch", "--tp", 3, "--model", smollm2, "--max-seqs", 4,
                            "--max-context", 512)
    try:
        process.wait_ready()
        ranks = {int(child.environ()["RADIANCE_RANK"]): child for child in process.children()
                 if "radiance.ranks.main" in " ".join(child.cmdline())}
        run_id = ranks[0].environ()["RADIANCE_RUN_ID"]
        body = {"model": "smollm2", "prompt": "Tell me a long story.", "max_tokens": 400, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", f"{process.url}/v1/completions", json=body, timeout=60) as response:
            events = []
            for line in response.iter_lines():
                if line.startswith("data:"):
                    events.append(line)
                    if len(events) == 3:
                        ranks[1].kill()
        assert events[-1] == "data: [DONE]" and "engine_failed" in events[-2], events[-3:]
        assert process.process.wait(60) == 1
        output = process.output()
        assert "rank 1" in output and "error" in output, output
        assert not [rank.pid for rank in ranks.values() if rank.is_running() and rank.status() != psutil.STATUS_ZOMBIE]
        assert not list(Path("/dev/shm").glob(f"rad.{run_id}.*"))
    finally:
        process.cleanup()
