"""The server in process (uvicorn on its thread, real HTTP on loopback, the engine loop on a thread
of the test) on the tiny synthetic model: /health before and after the engine is attached,
admission control through the KV cache, an engine that fails mid-request, a request that fails
inside (a 500 that shows no internals), a clean stop, and the
incremental detokeniser against a whole decode."""

import threading

import httpx
import pytest

from radiance.config import Config
from radiance.generation.text import Detokenizer, TextCodec
from radiance.launch import engine_over, open_ranks
from radiance.serving.options import ServeSettings
from radiance.serving.server import Server

from test_server_support import wait_for


def make_engine(model, **overrides):
    """An engine over one rank in this process, and those ranks."""
    config = Config(model=str(model), radiance_home="", accept_reference=True, progress=False, kernels="libref",
                    **overrides)
    ranks = open_ranks(config)
    return engine_over(ranks), ranks


class Running:
    """A Server with an engine attached and its loop on a thread."""

    def __init__(self, server: Server, engine, ranks):
        self.server, self.ranks = server, ranks
        self.loop = server.attach(engine, ranks)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.loop.run()
        except Exception:
            pass  # kept in loop.failure

    def stop(self):
        self.server.stop()
        self.thread.join(30)
        self.ranks.close()


@pytest.fixture
def server(tiny_model):
    server = Server(str(tiny_model), ServeSettings(port=0, defaults={"temperature": 0.0})).start()
    yield server
    server.stop()


def body(**extra):
    return {"model": "tiny", "prompt": "hello there", "max_tokens": 4, **extra}


def test_health_is_503_until_the_engine_is_attached(server, tiny_model):
    assert httpx.get(f"{server.url}/health").status_code == 503
    refused = httpx.post(f"{server.url}/v1/completions", json=body())
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_ready"
    running = Running(server, *make_engine(tiny_model))
    try:
        assert httpx.get(f"{server.url}/health").status_code == 200
        answer = httpx.post(f"{server.url}/v1/completions", json=body())
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
        refused = httpx.post(f"{server.url}/v1/chat/completions",
                             json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
        assert refused.status_code == 400 and "chat template" in refused.json()["error"]["message"]
    finally:
        running.stop()


def test_a_request_that_does_not_fit_yet_waits_for_blocks(server, tiny_model):
    # 4 blocks of 16 slots: one 40-token prompt with its 10 new tokens takes them all
    running = Running(server, *make_engine(tiny_model, num_blocks=4, block_size=16, max_seqs=4))
    try:
        results = {}

        def ask(i):
            results[i] = httpx.post(f"{server.url}/v1/completions", timeout=60,
                                    json=body(prompt="x" * 39 + str(i), max_tokens=10, ignore_eos=True)).json()

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert [results[i]["usage"]["completion_tokens"] for i in range(3)] == [10, 10, 10]
        too_big = httpx.post(f"{server.url}/v1/completions", json=body(prompt="y" * 70))
        assert too_big.status_code == 400 and "KV cache" in too_big.json()["error"]["message"]
        assert running.loop.engine.blocks.usage == 0
    finally:
        running.stop()


def test_a_step_s_events_reach_the_http_loop_with_one_wake_up(server, tiny_model, monkeypatch):
    """Four streams decoding together: each step's events go to the HTTP thread's loop in one
    hand-over (one self-pipe write, one GIL hand-off), not one a request: never more hand-overs
    than steps; every stream is whole."""
    from radiance.serving import loop as engine_loop

    handed = []
    original = engine_loop.hand_over
    monkeypatch.setattr(engine_loop, "hand_over", lambda loop, events: (handed.append(len(events)),
                                                                       original(loop, events)))
    running = Running(server, *make_engine(tiny_model, max_seqs=4))
    try:
        results, start = {}, threading.Barrier(4)

        def ask(i):
            start.wait()
            with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                              json=body(max_tokens=24, ignore_eos=True, stream=True, seed=i,
                                        stream_options={"include_usage": True, "continuous_usage_stats": True})) as reply:
                results[i] = [line for line in reply.iter_lines() if line.startswith("data:")]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        for i in range(4):  # 24 token chunks, the usage chunk, [DONE]
            assert len(results[i]) == 26 and results[i][-1] == "data: [DONE]", results[i]
        assert sum(handed) == 4 * 24, handed
        assert len(handed) <= running.loop.steps, (handed, running.loop.steps)  # one hand-over a step at most
        assert max(handed) >= 2, handed  # the streams shared steps (a request each would have been 96 hand-overs)
    finally:
        running.stop()


def test_an_engine_failure_ends_the_requests_in_flight_with_500(server, tiny_model):
    engine, ranks = make_engine(tiny_model)
    execute, calls = engine.execute, []

    def failing(arrays):
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("rank 1 died")
        return execute(arrays)

    engine.execute = failing
    running = Running(server, engine, ranks)
    try:
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body(max_tokens=50, ignore_eos=True,
                                                                         stream=True)) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line.startswith("data:")]
        assert "engine_failed" in lines[-2] and "rank 1 died" in lines[-2] and lines[-1] == "data: [DONE]"
        assert isinstance(running.loop.failure, RuntimeError)
        assert wait_for(lambda: httpx.get(f"{server.url}/health").status_code == 503)
        refused = httpx.post(f"{server.url}/v1/completions", json=body())
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "server_error"
    finally:
        running.stop()


def test_a_failure_inside_a_request_is_a_500_that_shows_no_internals(server, tiny_model, capfd):
    """An exception the server did not expect (here the tokenizer's, naming an internal path) is a 500
    saying the log has why; the text goes to the server's log, never to the client."""
    engine, ranks = make_engine(tiny_model)

    def broken(text):
        raise ValueError("/opt/internal/tokenizer.json: index 77 out of range")

    engine.text.encode = broken
    running = Running(server, engine, ranks)
    try:
        failed = httpx.post(f"{server.url}/v1/completions", json=body())
        assert failed.status_code == 500, failed.text
        error = failed.json()["error"]
        assert error["type"] == "server_error" and "its log says why" in error["message"]
        assert "internal" not in failed.text and "ValueError" not in failed.text
        assert "POST /v1/completions failed: ValueError: /opt/internal/tokenizer.json" in capfd.readouterr().err
        assert httpx.get(f"{server.url}/health").status_code == 200  # one request failed, not the server
    finally:
        running.stop()


def test_a_stop_answers_the_waiting_requests(server, tiny_model):
    running = Running(server, *make_engine(tiny_model))
    answers = []
    thread = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{server.url}/v1/completions", timeout=60, json=body(max_tokens=200, ignore_eos=True))))
    thread.start()
    assert wait_for(lambda: running.loop.engine.scheduler.running)
    running.loop.stop()
    thread.join(30)
    assert answers[0].status_code == 503 and answers[0].json()["error"]["code"] == "shutting_down"
    running.stop()


def test_the_detokenizer_s_stream_equals_the_whole_decode(smollm2):
    from radiance.weights.container_reader import Container

    with Container(str(smollm2)) as container:
        codec = TextCodec(container.tokenizer, container.chat_template, container.hyper)
    text = "Ünïcødé naïve café — 東京 🚀🚀 done.\n  indented\ttabs"
    ids = codec.encode(text)
    stream = Detokenizer(codec)
    pieces = [stream.push(token) for token in ids]
    assert "".join(pieces) == codec.decode(ids) == text
