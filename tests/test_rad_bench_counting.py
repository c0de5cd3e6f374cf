"""rad-bench's token timing (radiance/serving/bench.py one_request) against a real HTTP server on a
loopback port that streams a completion the way a model whose tokens decode to no text does: every
token's chunk has empty text. With the usage so far in each chunk (continuous_usage_stats) the
tokens are timed all the same; from a server that sends usage only at the end, only chunks of text
count, as before."""

import asyncio
import http.server
import json
import threading
import time

import httpx
import pytest

from radiance.serving.bench import one_request

TOKENS = 6
GAP = 0.02  # seconds between the server's token chunks


class _Streamer:
    """Streams TOKENS token chunks GAP apart: text `texts[i]` (empty for most), the usage so far in
    each one when `continuous`, then a usage-only chunk and [DONE]."""

    def __init__(self, texts: list[str], continuous: bool):
        outer = self
        self.bodies = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                outer.bodies.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                for index, text in enumerate(texts):
                    time.sleep(GAP)
                    chunk = {"choices": [{"index": 0, "text": text,
                                          "finish_reason": "length" if index == len(texts) - 1 else None}]}
                    if continuous:
                        chunk["usage"] = {"prompt_tokens": 3, "completion_tokens": index + 1,
                                          "total_tokens": 4 + index}
                    # non-ASCII text unescaped, as the server writes it (app.py's _sse)
                    self.wfile.write(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())
                    self.wfile.flush()
                usage = {"prompt_tokens": 3, "completion_tokens": len(texts), "total_tokens": 3 + len(texts)}
                self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/completions"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _request(streamer: _Streamer):
    async def run():
        async with httpx.AsyncClient() as client:
            return await one_request(client, streamer.url, {}, {"model": "m", "prompt": "p", "stream": True}, False, 30)

    return asyncio.run(run())


def test_tokens_without_text_are_timed_by_the_usage_each_chunk_carries():
    streamer = _Streamer([""] * TOKENS, continuous=True)
    try:
        sample = _request(streamer)
    finally:
        streamer.close()
    assert sample.ok and sample.counted_by == "usage" and sample.tokens == TOKENS
    assert sample.ttft is not None and sample.ttft >= GAP * 0.9
    assert len(sample.gaps) == TOKENS - 1 and min(sample.gaps) >= GAP * 0.5
    assert sample.latency >= sample.ttft + sum(sample.gaps) - 1e-9


@pytest.mark.parametrize("texts,timed", [([""] * TOKENS, 0), (["", "a", "", "b", "c", ""], 3)])
def test_without_usage_in_the_chunks_only_text_marks_a_token(texts, timed):
    streamer = _Streamer(texts, continuous=False)
    try:
        sample = _request(streamer)
    finally:
        streamer.close()
    assert sample.ok and sample.counted_by == "text" and sample.tokens == TOKENS  # the count from the last usage
    assert (sample.ttft is not None) == (timed > 0) and len(sample.gaps) == max(0, timed - 1)


def test_a_chunk_whose_text_holds_a_unicode_line_break_stays_one_line():
    """SSE ends a line at LF; U+2028, U+2029 and U+0085, which JSON leaves unescaped, are text (a
    synthetic model's byte-level tokens decode to them; httpx's aiter_lines cut the chunk there)."""
    streamer = _Streamer(["a\u2028b", "", "c\x85d\u2029", "", "", "e"], continuous=True)
    try:
        sample = _request(streamer)
    finally:
        streamer.close()
    assert sample.ok, sample.error
    assert sample.tokens == TOKENS and len(sample.gaps) == TOKENS - 1
