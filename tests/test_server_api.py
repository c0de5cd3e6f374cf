"""`radiance --serve` on SmolLM2, spoken to with the real `openai` client over loopback HTTP:
completions, chat, streaming, stop strings, seeds, batching independence, cancellation on
disconnect, /v1/models, /graph, /metrics; and every kind of bad input refused with a 4xx and an
OpenAI-style body while the server goes on serving the others."""

import threading
import time

import httpx
import openai
import pytest

from test_server_support import ServerProcess, metrics, wait_for

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
CONTEXT = 512
MAX_STOP_CHARS = 1000


@pytest.fixture(scope="module")
def server(smollm2):
    process = ServerProcess("radiance.tools.generate", "--model", smollm2, "--api-key", KEY, "--max-seqs", 8,
                            "--max-context", CONTEXT, "--max-stop-chars", MAX_STOP_CHARS)
    try:
        process.wait_ready()
        yield process
        assert process.stop() == 0, process.output()
    finally:
        process.cleanup()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120) as client:
        yield client


def complete(client, prompt, **kwargs):
    return client.completions.create(model="smollm2", prompt=prompt, **kwargs)


def test_completion(client):
    result = complete(client, "The capital of France is", max_tokens=4, temperature=0)
    choice = result.choices[0]
    assert choice.text.startswith(" Paris") and choice.finish_reason == "length"
    assert result.usage.completion_tokens == 4 and result.usage.prompt_tokens == 5
    assert result.model == "smollm2" and result.object == "text_completion"


def test_chat_answers_paris(client):
    result = client.chat.completions.create(model="smollm2", temperature=0, max_tokens=40,
                                            messages=[{"role": "user", "content": "What is the capital of France?"}])
    message = result.choices[0].message
    assert message.role == "assistant" and "Paris" in message.content, message.content
    assert result.choices[0].finish_reason == "stop"


def test_streamed_completion_equals_the_whole_one(client):
    whole = complete(client, "Water boils at", max_tokens=16, temperature=0.8, seed=5).choices[0].text
    chunks = list(complete(client, "Water boils at", max_tokens=16, temperature=0.8, seed=5, stream=True,
                           stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 16 and len([c for c in chunks if c.choices]) > 4


def test_continuous_usage_gives_a_chunk_for_every_token(client):
    """stream_options.continuous_usage_stats (vLLM's extension): a chunk for every generated token,
    whether or not it added text, each with the usage so far; the text is the whole completion's."""
    answer = complete(client, "Water boils at", max_tokens=12, temperature=0.8, seed=6)
    whole = answer.choices[0].text
    chunks = list(complete(client, "Water boils at", max_tokens=12, temperature=0.8, seed=6, stream=True,
                           stream_options={"include_usage": True, "continuous_usage_stats": True}))
    streamed = [c for c in chunks if c.choices]
    assert [c.usage.completion_tokens for c in streamed] == list(range(1, 13))
    assert {c.usage.prompt_tokens for c in streamed} == {answer.usage.prompt_tokens}
    assert "".join(c.choices[0].text for c in streamed) == whole
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    plain = list(complete(client, "Water boils at", max_tokens=12, temperature=0.8, seed=6, stream=True,
                          stream_options={"include_usage": True}))  # without it: no usage before the end
    assert all(c.usage is None for c in plain[:-1]) and plain[-1].usage.completion_tokens == 12


def test_streamed_chat(client):
    stream = client.chat.completions.create(model="smollm2", temperature=0, max_tokens=40, stream=True,
                                            messages=[{"role": "user", "content": "What is the capital of France?"}])
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert "Paris" in text and chunks[-1].choices[0].finish_reason == "stop"


def test_stop_strings(client):
    result = complete(client, "The capital of France is", max_tokens=12, temperature=0, stop=["."])
    assert result.choices[0].text == " Paris" and result.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model="smollm2", temperature=0, max_tokens=40, stream=True,
                                            stop=[" France", "xyz"],
                                            messages=[{"role": "user", "content": "What is the capital of France?"}])
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "The capital of"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stop_strings_up_to_the_limit_are_scanned_as_the_text_grows(client):
    """Sixteen stop strings holding the limit's characters between them (issue 17: 16 of 100 kB
    cost 378 ms a token): the answer is the one the plain stop string gives."""
    long_ones = [chr(0x4e00 + i) * ((MAX_STOP_CHARS - 1) // 15) for i in range(15)]
    assert sum(map(len, long_ones)) + 1 <= MAX_STOP_CHARS
    result = complete(client, "The capital of France is", max_tokens=12, temperature=0, stop=[*long_ones, "."])
    assert result.choices[0].text == " Paris" and result.choices[0].finish_reason == "stop"


def test_stop_strings_over_the_limit_are_refused_naming_it(server):
    body = {**GOOD, "stop": ["x" * 600, "y" * (MAX_STOP_CHARS - 600 + 1)]}
    error = assert_openai_error(post(server.url, "completions", body), 400, "stop")
    assert f"limit of {MAX_STOP_CHARS}" in error["message"] and "--max-stop-chars" in error["message"], error


def test_seeds_are_reproducible(client):
    first, second, other = (complete(client, "Once upon a time", max_tokens=24, temperature=1.0, seed=seed).choices[0].text
                            for seed in (7, 7, 8))
    assert first == second and first != other


def test_output_does_not_depend_on_what_it_is_batched_with(client, server):
    target = dict(prompt="Once upon a time, in a land far away,", max_tokens=32, temperature=0.9, seed=42)
    alone = complete(client, **target).choices[0].text
    before = metrics(server.url, AUTH)
    results, others = {}, ["The history of Rome " * k for k in (1, 3, 8, 20)]

    def other(i, prompt):
        results[i] = complete(client, prompt, max_tokens=40, temperature=0.9, seed=100 + i).choices[0].text

    threads = [threading.Thread(target=other, args=item) for item in enumerate(others)]
    for thread in threads:
        thread.start()
    together = complete(client, **target).choices[0].text
    for thread in threads:
        thread.join()
    assert together == alone and len(results) == 4
    after = metrics(server.url, AUTH)  # and they were batched: several sequences a step on average
    batched = [after[name] - before[name] for name in ("radiance_step_sequences_sum", "radiance_step_sequences_count")]
    assert batched[0] / batched[1] > 2, batched


def kv_idle(url):
    samples = metrics(url, AUTH)
    return samples if samples["radiance_kv_cache_usage_ratio"] == 0 and samples["radiance_requests_running"] == 0 else None


def test_a_disconnected_stream_is_cancelled_and_frees_its_blocks(client, server):
    cancelled = metrics(server.url, AUTH).get('radiance_requests_finished_total{reason="cancelled"}', 0)
    stream = complete(client, "Tell me a long story.", max_tokens=400, stream=True, extra_body={"ignore_eos": True})
    for _ in zip(range(3), stream):
        pass
    busy = metrics(server.url, AUTH)
    assert busy["radiance_kv_cache_usage_ratio"] > 0 and busy["radiance_requests_running"] == 1
    stream.close()
    idle = wait_for(lambda: kv_idle(server.url), timeout=30)
    assert idle, metrics(server.url, AUTH)
    assert idle['radiance_requests_finished_total{reason="cancelled"}'] == cancelled + 1


def test_a_disconnected_plain_request_is_cancelled_too(server):
    cancelled = metrics(server.url, AUTH).get('radiance_requests_finished_total{reason="cancelled"}', 0)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server.url}/v1/completions", headers=AUTH, timeout=0.5,
                   json={"model": "smollm2", "prompt": "Tell me a long story.", "max_tokens": 400, "ignore_eos": True})
    idle = wait_for(lambda: kv_idle(server.url), timeout=30)
    assert idle and idle['radiance_requests_finished_total{reason="cancelled"}'] == cancelled + 1


def test_models_graph_and_metrics(client, server):
    (model,) = client.models.list().data
    assert model.id == "smollm2" and model.owned_by == "radiance"
    graph = httpx.get(f"{server.url}/graph", headers=AUTH).json()
    assert graph["world"] == 1 and graph["steps"] > 0 and len(graph["declared"]) > 100
    assert {entry["op"] for entry in graph["declared"]} >= {"embedding", "gemm", "attention", "sample"}
    gemm = [op for op in graph["ops"] if op["op"] == "gemm" and op["steps"] > 0]
    assert gemm and all(op["row"].count(":") == 1 for op in graph["ops"])
    assert sum(entry["steps"] for entry in graph["step_shapes"]) == graph["steps"]
    assert "issued:" in httpx.get(f"{server.url}/graph?format=text", headers=AUTH).text
    samples = metrics(server.url, AUTH)
    for name in ("radiance_prompt_tokens_total", "radiance_generation_tokens_total",
                 "radiance_time_to_first_token_seconds_count", "radiance_inter_token_latency_seconds_count",
                 "radiance_step_seconds_count", 'radiance_rank_compute_seconds_total{rank="0"}'):
        assert samples[name] > 0, name
    for name in ("radiance_requests_waiting", "radiance_kv_cache_usage_ratio",
                 'radiance_collective_seconds_total{rank="0"}', 'radiance_link_gate_hold_seconds_total{rank="0"}'):
        assert name in samples
    assert samples['radiance_requests_total{route="/v1/completions",status="200"}'] > 0


# ---- bad input -----------------------------------------------------------------------------------

GOOD = {"model": "smollm2", "prompt": "Hello", "max_tokens": 2}
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}

BAD = [  # (case, route, body or raw bytes, status, param)
    ("malformed JSON", "completions", b'{"model": "smollm2", "prompt": ', 400, None),
    ("not an object", "completions", b"[1, 2, 3]", 400, None),
    ("unknown model", "completions", {**GOOD, "model": "gpt-17"}, 404, "model"),
    ("unknown model (chat)", "chat/completions", {**CHAT, "model": "gpt-17"}, 404, "model"),
    ("max_tokens 0", "completions", {**GOOD, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens negative", "chat/completions", {**CHAT, "max_tokens": -3}, 400, "max_tokens"),
    ("max_tokens beyond the context", "completions", {**GOOD, "max_tokens": 10 ** 9}, 400, "max_tokens"),
    ("prompt + max_tokens beyond the context", "completions", {**GOOD, "max_tokens": CONTEXT}, 400, "max_tokens"),
    ("prompt longer than the context", "completions", {**GOOD, "prompt": "word " * (CONTEXT + 10)}, 400, "prompt"),
    ("chat longer than the context", "chat/completions",
     {**CHAT, "messages": [{"role": "user", "content": "word " * (CONTEXT + 10)}]}, 400, "messages"),
    ("empty prompt", "completions", {**GOOD, "prompt": ""}, 400, "prompt"),
    ("missing prompt", "completions", {"model": "smollm2"}, 400, "prompt"),
    ("prompt a number", "completions", {**GOOD, "prompt": 5}, 400, "prompt"),
    ("token id outside the vocabulary", "completions", {**GOOD, "prompt": [1, 2, 10 ** 7]}, 400, "prompt"),
    ("max_tokens a string", "completions", {**GOOD, "max_tokens": "5"}, 400, "max_tokens"),
    ("max_tokens a float", "completions", {**GOOD, "max_tokens": 2.5}, 400, "max_tokens"),
    ("temperature a string", "completions", {**GOOD, "temperature": "hot"}, 400, "temperature"),
    ("temperature negative", "completions", {**GOOD, "temperature": -1}, 400, "temperature"),
    ("top_p a string", "completions", {**GOOD, "top_p": "all"}, 400, "top_p"),
    ("top_p zero", "completions", {**GOOD, "top_p": 0}, 400, "top_p"),
    ("top_k a float", "completions", {**GOOD, "top_k": 1.5}, 400, "top_k"),
    ("seed a string", "completions", {**GOOD, "seed": "abc"}, 400, "seed"),
    ("stream a string", "completions", {**GOOD, "stream": "yes"}, 400, "stream"),
    ("stop a number", "completions", {**GOOD, "stop": 7}, 400, "stop"),
    ("n a string", "completions", {**GOOD, "n": "2"}, 400, "n"),
    ("n above 1", "completions", {**GOOD, "n": 2}, 400, "n"),
    ("model a number", "completions", {**GOOD, "model": 3}, 400, "model"),
    ("messages a string", "chat/completions", {**CHAT, "messages": "hi"}, 400, "messages"),
    ("no messages", "chat/completions", {**CHAT, "messages": []}, 400, "messages"),
    ("content a number", "chat/completions", {**CHAT, "messages": [{"role": "user", "content": 5}]}, 400,
     "messages.0.content"),
    ("unknown role", "chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, 400,
     "messages.0.role"),
    ("stream_options a list", "chat/completions", {**CHAT, "stream_options": [1]}, 400, "stream_options"),
]


def post(url, route, body, headers=AUTH):
    if isinstance(body, bytes):
        return httpx.post(f"{url}/v1/{route}", content=body, headers={**headers, "Content-Type": "application/json"})
    return httpx.post(f"{url}/v1/{route}", json=body, headers=headers)


def assert_openai_error(response, status, param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] in ("invalid_request_error", "server_error")
    if param is not None:
        assert error["param"] == param, error
    return error


@pytest.mark.parametrize("case,route,body,status,param", BAD, ids=[case[0] for case in BAD])
def test_bad_input_is_refused_with_an_openai_error(server, case, route, body, status, param):
    assert_openai_error(post(server.url, route, body), status, param)


def test_api_key(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        error = assert_openai_error(post(server.url, "completions", GOOD, headers), 401)
        assert error["code"] == "invalid_api_key"
        assert_openai_error(httpx.get(f"{server.url}/metrics", headers=headers), 401)
        assert_openai_error(httpx.get(f"{server.url}/v1/models", headers=headers), 401)
    assert_openai_error(post(server.url, "completions", b"{not json", {}), 401)  # the key is checked first
    assert httpx.get(f"{server.url}/health").status_code == 200
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()


def test_the_openai_client_sees_the_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError) as refused:
        complete(client, "Hello", max_tokens=0)
    assert refused.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        complete(client, "Hello", n=3)


def test_unknown_routes_and_methods(server):
    assert_openai_error(httpx.get(f"{server.url}/v1/nothing", headers=AUTH), 404)
    assert_openai_error(httpx.delete(f"{server.url}/v1/completions", headers=AUTH), 405)


def test_bad_requests_do_not_disturb_the_others(client, server):
    """A long streamed completion runs while every bad request is refused; it ends complete, and
    a good request after them is answered."""
    outcome = {}

    def long_stream():
        chunks = list(complete(client, "Once upon a time", max_tokens=48, temperature=0.7, seed=3, stream=True,
                               stream_options={"include_usage": True}))
        outcome["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        outcome["tokens"] = chunks[-1].usage.completion_tokens

    thread = threading.Thread(target=long_stream)
    thread.start()
    time.sleep(0.1)
    for _, route, body, status, param in BAD:
        assert_openai_error(post(server.url, route, body), status, param)
    thread.join(60)
    assert outcome == {"finish": "length", "tokens": 48}
    assert complete(client, "The capital of France is", max_tokens=2, temperature=0).choices[0].text.startswith(" Paris")


def test_rad_bench_measures_the_server(server, tmp_path):
    import importlib.util
    import json
    import subprocess
    import sys

    plot = importlib.util.find_spec("matplotlib") is not None  # the "bench" extra
    command = [sys.executable, "-m", "radiance.serving.bench", "--url", server.url, "--api-key", KEY,
               "--concurrency", "1,2", "--requests", "1", "--max-tokens", "4", "--json", str(tmp_path / "b.json")]
    result = subprocess.run(command + (["--plot", str(tmp_path / "b.png")] if plot else []), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["model"] == "smollm2" and [level["concurrency"] for level in report["levels"]] == [1, 2]
    for level in report["levels"]:
        assert level["errors"] == 0 and level["output_tokens"] == 4 * level["concurrency"]
        assert level["ttft_s"]["p50"] > 0 and level["itl_s"]["p50"] > 0 and level["output_tokens_per_s"] > 0
    if plot:
        assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _Loading:
    """A real HTTP server on a loopback port whose /health says 503 ("starting") `loading` times, then
    200: a model server's load, held open long enough to be seen (SmolLM2 loads in ~0.5 s)."""

    def __init__(self, loading: int):
        import http.server
        import threading

        outer = self
        self.asked = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.asked += 1
                ready = outer.asked > loading
                body = b'{"status": "ok"}' if ready else b'{"status": "starting"}'
                self.send_response(200 if ready else 503)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_rad_bench_waits_for_a_server_still_loading_its_model(capsys):
    import click

    from radiance.serving.bench import wait_until_ready

    loading = _Loading(3)
    try:
        wait_until_ready(loading.url, 30)
        assert loading.asked == 4
        assert "is starting; waiting up to 30 s" in capsys.readouterr().err
    finally:
        loading.close()
    loading = _Loading(10**6)
    try:
        with pytest.raises(click.ClickException, match=r"/health still says 'starting' after 1 s \(--wait-ready\)"):
            wait_until_ready(loading.url, 1)
    finally:
        loading.close()
