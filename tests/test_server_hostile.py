"""`radiance --serve` against what a hostile client sends, through a real HTTP client: a body too
large is a 413 naming the limit before it is read, a prompt the context cannot hold is a 400 before
it is tokenized, a long prompt is tokenized off the event loop (/health answers meanwhile) and its
memory is given back; text that is no text, a role, fields and values this server does not take are
a 400 naming the field, never a 500 showing internals."""

import json
import math
import threading
import time

import httpx
import psutil
import pytest

from test_server_support import ServerProcess

KEY = "hostile-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CONTEXT = 8192  # the model's: the longest prompt the bound lets through is 663k characters
LIMIT = 1 << 20  # --max-request-bytes


@pytest.fixture(scope="module")
def server(smollm2):
    process = ServerProcess("radiance.tools.generate", "--model", smollm2, "--api-key", KEY, "--max-seqs", 4,
                            "--max-context", CONTEXT, "--max-request-bytes", LIMIT)
    try:
        process.wait_ready()
        yield process
        assert process.stop() == 0, process.output()
    finally:
        process.cleanup()


def post(server, route, timeout=120, headers=AUTH, **kwargs):
    return httpx.post(f"{server.url}/v1/{route}", headers=headers, timeout=timeout, **kwargs)


def post_raw(server, route, body):
    """`body` as Python's JSON writes it (httpx's refuses NaN and writes surrogates as UTF-8, which
    they are not): a lone surrogate escaped as \\ud800, NaN and Infinity as such."""
    return post(server, route, content=json.dumps(body), headers={**AUTH, "Content-Type": "application/json"})


def refused(response, status, param=None, *fragments):
    assert response.status_code == status, response.text[:2000]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param, error
    for fragment in fragments:
        assert fragment in error["message"], error
    return error


def rss(server) -> int:
    return psutil.Process(server.process.pid).memory_info().rss


# ---- item 1: requests cannot stall the server --------------------------------------------------

def test_the_memory_of_a_long_prompt_is_given_back(server):
    """First in this module, so no long prompt ran before it: tokenizing 600k characters takes more
    than 100 MiB that the allocator would keep for good (a 10 MB prompt: 1.3 GiB); after four of them
    the server holds little more than before the first."""
    post(server, "completions", json={"model": "smollm2", "prompt": "Hello", "max_tokens": 1})
    before = rss(server)
    for _ in range(4):
        refused(post(server, "completions", json={"model": "smollm2", "prompt": "word " * 120_000, "max_tokens": 1}),
                400, "prompt", "This model's maximum context length is 8192 tokens")
    grown = rss(server) - before
    assert grown < 32 << 20, f"four long prompts left {grown >> 20} MiB more resident"


def test_token_ids_longer_than_the_context_are_refused_before_they_are_read(server):
    """The length first: 200k ids (an id outside the vocabulary last) are refused for the context,
    not scanned id by id for the vocabulary."""
    ids = [1] * 200_000 + [10 ** 7]
    refused(post(server, "completions", json={"model": "smollm2", "prompt": ids, "max_tokens": 1}),
            400, "prompt", "This model's maximum context length is 8192 tokens; the prompt is 200001 tokens")


def test_a_10_mb_prompt_is_a_413_before_it_is_read_and_costs_no_memory(server):
    before = rss(server)
    for _ in range(4):
        response = post(server, "completions", json={"model": "smollm2", "prompt": "word " * 2_000_000, "max_tokens": 1})
        error = refused(response, 413, None, f"more than this server's limit of {LIMIT} bytes (--max-request-bytes)")
        assert error["code"] == "request_too_large"
    grown = rss(server) - before
    assert grown < 64 << 20, f"four refused 10 MB prompts left {grown >> 20} MiB more resident"
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def test_two_million_token_ids_are_a_413(server):
    refused(post(server, "completions", json={"model": "smollm2", "prompt": list(range(2_000_000))}), 413)


def test_a_chunked_body_past_the_limit_is_a_413(server):
    def chunks():
        for _ in range(3 * LIMIT // 65536):
            yield b" " * 65536
    refused(post(server, "completions", content=chunks(), headers={**AUTH, "Content-Type": "application/json"}),
            413, None, "more than 1048576 bytes")


@pytest.mark.parametrize("route, body, param", [
    ("completions", {"prompt": "x" * 700_000}, "prompt"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x" * 350_000}] * 2}, "messages"),
])
def test_a_prompt_longer_than_the_context_can_hold_is_refused_before_it_is_tokenized(server, route, body, param):
    error = refused(post(server, route, json={"model": "smollm2", **body}), 400, param,
                    "700000 characters, more than the context of 8192 tokens can hold",
                    "no token of this model is longer than")
    assert error["code"] == "context_length_exceeded"


def test_long_prompts_are_tokenized_off_the_event_loop(server):
    """Three prompts the bound lets through (600k characters, near the 663k it allows: half of that took
    0.1-1 s each to tokenize on one CPU, and under 0.2 s for all three on a faster one; then refused,
    being more tokens than the context) are cut while /health is asked again and again.
    On the event loop each would hold /health for all of its time; off it, /health waits for none of
    it. The peer is the same run's tokenizing time."""
    results, latencies = [], []

    def big():
        start = time.monotonic()
        response = post(server, "completions", json={"model": "smollm2", "prompt": "word " * 120_000, "max_tokens": 1})
        results.append((response.status_code, time.monotonic() - start))

    threads = [threading.Thread(target=big) for _ in range(3)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    with httpx.Client(timeout=30) as client:
        while any(thread.is_alive() for thread in threads):
            asked = time.monotonic()
            assert client.get(f"{server.url}/health").status_code == 200
            latencies.append(time.monotonic() - asked)
            time.sleep(0.01)
    busy = time.monotonic() - started
    assert [status for status, _ in results] == [400, 400, 400], results
    # the run means something: /health was asked often while the prompts were cut (on the loop, each
    # would hold it for a third of `busy` or more: three prompts, at most two cut at once)
    assert len(latencies) >= 5 and busy > 0.2, (busy, latencies)
    assert max(latencies) < busy / 4, f"/health waited {max(latencies):.2f} s of the prompts' {busy:.2f} s"


# ---- item 5: bad input, clear answer -----------------------------------------------------------

GOOD = {"model": "smollm2", "prompt": "Hello", "max_tokens": 2}
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.mark.parametrize("case, route, body, param, fragment", [
    ("a lone surrogate in a prompt", "completions", {**GOOD, "prompt": "a\ud800b"}, "prompt",
     "character 1 is a lone surrogate (U+D800)"),
    ("a lone surrogate in a message", "chat/completions",
     {**CHAT, "messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "\udfff"}]},
     "messages.1.content", "lone surrogate (U+DFFF)"),
    ("role tool", "chat/completions", {**CHAT, "messages": [{"role": "tool", "content": "42"}]}, "messages.0.role",
     "role 'tool' is not supported"),
    ("top_k of 10**9", "completions", {**GOOD, "top_k": 10 ** 9}, "top_k", "more than the vocabulary's 49152"),
    ("top_logprobs without logprobs", "chat/completions", {**CHAT, "top_logprobs": 3}, "top_logprobs",
     "top_logprobs is not supported"),
])
def test_bad_input_gets_a_400_naming_the_field(server, case, route, body, param, fragment):
    refused(post_raw(server, route, body), 400, param, fragment)


@pytest.mark.parametrize("field, value", [("temperature", math.nan), ("top_p", math.inf), ("temperature", -math.inf)])
def test_nan_and_infinity_are_not_numbers(server, field, value):
    refused(post_raw(server, "completions", {**GOOD, field: value}), 400, field, "finite number")


def test_an_unknown_graph_format_is_refused(server):
    refused(httpx.get(f"{server.url}/graph?format=bogus", headers=AUTH, timeout=60), 400, "format",
            "'json' (the default) or 'text', not 'bogus'")
    assert httpx.get(f"{server.url}/graph?format=text", headers=AUTH, timeout=60).status_code == 200


def test_the_server_still_answers(server):
    result = post(server, "completions", json={**GOOD, "prompt": "The capital of France is", "temperature": 0})
    assert result.status_code == 200 and result.json()["choices"][0]["text"].startswith(" Paris")
