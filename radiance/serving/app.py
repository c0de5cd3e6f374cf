"""The HTTP side: FastAPI routes for the OpenAI API, /health, /metrics and /graph, and the checks
every request passes before it reaches the engine thread (model name, prompt and max_tokens against
the context; the API key is guard.py's, the JSON and field types errors.py's). Each refusal is a 4xx
with an OpenAI-style body; a refused request never touches the engine, so the others go on."""

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from radiance.generation.sequence import SamplingParams
from radiance.generation.text import TextError

from .errors import install_error_handlers
from .graph import graph_report, graph_text, open_declared
from .guard import Guard
from .limits import BodyLimit
from .loop import EngineLoop, Event, Job
from .metrics import CONTENT_TYPE, Metrics
from .prompts import check_length, check_text, check_tokens, longest_token, tokenize
from .options import DEFAULT_MAX_STOP_CHARS
from .protocol import APIError, ChatCompletionRequest, CompletionRequest, Sampling, not_ready

MAX_STOPS = 16
GONE = object()  # put on a job's queue when its client disconnects


class ServerState:
    """What the routes share: the model's name, the defaults, and, once every rank is ready, the
    engine loop (set by `attach`)."""

    def __init__(self, model_path: str, api_key: str | None, defaults: dict, metrics: Metrics):
        self.model_path, self.api_key, self.metrics = str(model_path), api_key or None, metrics
        self.model_name = Path(model_path).stem
        self.defaults = {k: v for k, v in defaults.items() if v is not None}
        self.created = int(time.time())
        self.loop: EngineLoop | None = None
        self.max_stop_chars = DEFAULT_MAX_STOP_CHARS  # the server sets its own (--max-stop-chars)
        self.ranks = None  # launch/ranks.py's Ranks, once attached
        self._declared = None
        self._declared_lock = threading.Lock()

    def attach(self, loop: EngineLoop, ranks) -> None:
        self.longest = longest_token(loop.engine.text.tokenizer)  # a prompt's characters are bounded by it
        self.ranks, self.loop = ranks, loop

    def declared(self) -> list[dict]:
        """The declared graph for /graph, read once from the model (no weight is read)."""
        with self._declared_lock:
            if self._declared is None:
                self._declared = open_declared(self.loop.engine.config)
            return self._declared

    @property
    def ready(self) -> bool:
        return self.loop is not None and not self.loop.stopping.is_set()

    def engine_loop(self) -> EngineLoop:
        if self.loop is None:
            raise not_ready()
        if self.loop.stopping.is_set():
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
        return self.loop

    def check_model(self, name: str) -> None:
        if name not in (self.model_name, self.model_path):
            raise APIError(404, f"The model '{name}' does not exist: this server serves '{self.model_name}'",
                           param="model", code="model_not_found")

    # ---- prompts and sampling -------------------------------------------------------------------

    async def completion_prompt(self, prompt) -> list[int]:
        engine = self.engine_loop().engine
        if isinstance(prompt, list):
            if len(prompt) == 0:
                raise APIError(400, "the prompt is empty", param="prompt")
            if isinstance(prompt[0], (str, list)):
                if len(prompt) != 1:
                    raise APIError(400, "one prompt per request: this server does not batch prompts in one "
                                   "request (send them as separate requests; they are batched anyway)", param="prompt")
                prompt = prompt[0]
        if isinstance(prompt, str):
            check_text(prompt, "prompt")
            check_length(len(prompt), engine.config.max_context, self.longest, "prompt")
            return await tokenize(engine.text.encode, prompt, chars=len(prompt))
        check_tokens(len(prompt), engine.config.max_context, "prompt")  # before the ids are read one by one
        vocab = self.vocab()
        if any(not 0 <= token < vocab for token in prompt):
            raise APIError(400, f"a prompt token id is outside the vocabulary [0, {vocab})", param="prompt")
        return list(prompt)

    async def chat_prompt(self, body: ChatCompletionRequest) -> list[int]:
        engine = self.engine_loop().engine
        messages = [{"role": message.role, "content": message.text()} for message in body.messages]
        for index, message in enumerate(messages):
            check_text(message["content"], f"messages.{index}.content")
        chars = sum(len(message["content"]) for message in messages)
        check_length(chars, engine.config.max_context, self.longest, "messages")
        try:
            return await tokenize(engine.text.chat, messages, chars=chars)
        except TextError as error:
            raise APIError(400, str(error), param="messages") from None
        except jinja2.TemplateError as error:
            raise APIError(400, f"the chat template refused the messages: {error}", param="messages") from None

    def vocab(self) -> int:
        text = self.engine_loop().engine.text
        return int(text.hyper.get("vocab") or text.tokenizer.get_vocab_size())

    def check_top_k(self, top_k: int | None) -> None:
        if top_k is not None and top_k > self.vocab():
            raise APIError(400, f"top_k is {top_k}, more than the vocabulary's {self.vocab()} tokens "
                           "(0 or -1 keeps every token)", param="top_k")

    def sampling(self, body: Sampling, prompt_ids: list[int], max_tokens: int | None, prompt_param: str) -> SamplingParams:
        engine = self.engine_loop().engine
        context, length = engine.config.max_context, len(prompt_ids)
        if length == 0:
            raise APIError(400, "the prompt is empty", param=prompt_param)
        check_tokens(length, context, prompt_param)
        if engine.blocks.blocks_for(length + 1) > engine.blocks.num_blocks:
            raise APIError(400, f"the prompt is {length} tokens, more than the KV cache holds",
                           param=prompt_param, code="context_length_exceeded")
        if max_tokens is not None:
            if max_tokens > context:
                raise APIError(400, f"max_tokens is {max_tokens}, more than the model's context of {context} tokens",
                               param="max_tokens", code="context_length_exceeded")
            if length + max_tokens > context:
                raise APIError(400, f"This model's maximum context length is {context} tokens; the prompt is "
                               f"{length} tokens and max_tokens asks for {max_tokens} more",
                               param="max_tokens", code="context_length_exceeded")
        else:
            max_tokens = min(int(self.defaults.get("max_tokens", 256)), context - length)
        stop = body.stop if body.stop is not None else self.defaults.get("stop", ())
        stop = tuple(s for s in ([stop] if isinstance(stop, str) else stop) if s)
        if len(stop) > MAX_STOPS:
            raise APIError(400, f"at most {MAX_STOPS} stop strings, not {len(stop)}", param="stop")
        if sum(map(len, stop)) > self.max_stop_chars:
            raise APIError(400, f"the stop strings hold {sum(map(len, stop))} characters, more than this server's "
                           f"limit of {self.max_stop_chars} (--max-stop-chars)", param="stop")
        top_k = body.top_k if body.top_k is not None else self.defaults.get("top_k", 0)
        seed = body.seed if body.seed is not None else self.defaults.get("seed")
        try:
            return SamplingParams(
                max_tokens=max_tokens, stop=stop, ignore_eos=body.ignore_eos, top_k=max(0, top_k),
                temperature=body.temperature if body.temperature is not None else self.defaults.get("temperature", 1.0),
                top_p=body.top_p if body.top_p is not None else self.defaults.get("top_p", 1.0),
                seed=None if seed is None else seed & ((1 << 64) - 1))
        except ValueError as error:
            raise APIError(400, str(error)) from None


def _sse(payload) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


def _refuse_unsupported(body: Sampling) -> None:
    for name, why in body.unsupported():
        raise APIError(400, why, param=name)


async def _until_disconnect(request: Request, job: Job) -> None:
    """Put GONE on the job's queue when the client goes away (the body is read already, so the
    next ASGI message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.queue.put_nowait(GONE)
            return


def create_app(state: ServerState, max_request_bytes: int) -> Guard:
    """The routes over `state`, every failure an OpenAI-style body, behind the API key, and a body
    of more than `max_request_bytes` refused before it is read."""
    app = FastAPI(title="Radiance", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    _info_routes(app, state)
    _completion_routes(app, state)
    return Guard(BodyLimit(app, max_request_bytes), state)


def _info_routes(app: FastAPI, state: ServerState) -> None:
    """/health, /metrics, /graph and the models."""
    metrics = state.metrics

    @app.get("/health")
    async def health():
        if state.ready:
            return JSONResponse({"status": "ok", "model": state.model_name, "world": state.ranks.world})
        status = "stopping" if state.loop is not None else "starting"
        return JSONResponse({"status": status}, status_code=503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/graph")
    async def graph(format: str = "json"):
        if format not in ("json", "text"):
            raise APIError(400, f"format is 'json' (the default) or 'text', not {format!r}", param="format")
        loop = state.engine_loop()
        ranks = state.ranks
        declared = await asyncio.to_thread(state.declared)
        report = graph_report(ranks.lines, declared, loop.shapes.snapshot(), model=state.model_name,
                              world=ranks.world, digest=ranks.digest)
        if format == "text":
            return PlainTextResponse(graph_text(report))
        return JSONResponse(report)

    def model_card() -> dict:
        card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "radiance"}
        if state.loop is not None:
            card["max_model_len"] = state.loop.engine.config.max_context
        return card

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        state.check_model(name)
        return model_card()


def _completion_routes(app: FastAPI, state: ServerState) -> None:
    """/v1/completions and /v1/chat/completions, streamed or whole."""

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        arrival = time.perf_counter()
        state.check_model(body.model)
        state.engine_loop()
        _refuse_unsupported(body)
        state.check_top_k(body.top_k)
        prompt_ids = await state.completion_prompt(body.prompt)
        params = state.sampling(body, prompt_ids, body.max_tokens, "prompt")
        include_usage, continuous = _usage_options(body)
        job = Job(prompt_ids, params, asyncio.get_running_loop(), arrival, every_step=continuous)
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": state.model_name, "system_fingerprint": _fingerprint(state)}

        def choice(text: str, finish: str | None) -> dict:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

        if body.stream:
            return _stream(state, job, head, None, lambda text, finish: choice(text, finish), include_usage)
        text, last = await _collect(state, job, request)
        return {**head, "choices": [choice(text, last.finish)], "usage": last.usage}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        arrival = time.perf_counter()
        state.check_model(body.model)
        state.engine_loop()
        _refuse_unsupported(body)
        state.check_top_k(body.top_k)
        prompt_ids = await state.chat_prompt(body)
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        params = state.sampling(body, prompt_ids, max_tokens, "messages")
        include_usage, continuous = _usage_options(body)
        job = Job(prompt_ids, params, asyncio.get_running_loop(), arrival, every_step=continuous)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": state.model_name,
                "system_fingerprint": _fingerprint(state)}

        if body.stream:
            first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}

            def chunk_choice(text: str, finish: str | None) -> dict:
                return {"index": 0, "delta": {"content": text} if text or not finish else {}, "logprobs": None,
                        "finish_reason": finish}

            return _stream(state, job, {**head, "object": "chat.completion.chunk"}, first, chunk_choice, include_usage)
        text, last = await _collect(state, job, request)
        return {**head, "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                             "finish_reason": last.finish}], "usage": last.usage}


def _usage_options(body: Sampling) -> tuple[bool, bool]:
    """(include_usage: a last chunk with the usage, continuous: the usage so far in every chunk and a
    chunk for every step that generated a token, text or none), for a streamed request; continuous
    only with include_usage, as vLLM reads its continuous_usage_stats."""
    options = body.stream_options if body.stream else None
    include = bool(options and options.include_usage)
    return include, include and options.continuous_usage_stats


def _fingerprint(state: ServerState) -> str | None:
    digest = state.ranks.digest if state.ranks is not None else None
    return f"rad-{digest[:16]}" if digest else None


async def _collect(state: ServerState, job: Job, request: Request) -> tuple[str, Event]:
    """A whole completion; the sequence is cancelled the moment its client disconnects."""
    state.engine_loop().submit(job)
    watcher = asyncio.create_task(_until_disconnect(request, job))
    pieces = []
    try:
        while True:
            event = await job.queue.get()
            if event is GONE:  # nobody to answer: the finally below cancels the sequence
                raise APIError(499, "the client closed the request", code="client_closed_request")
            if event.error is not None:
                job.ended = True
                raise event.error
            pieces.append(event.text)
            if event.finish is not None:
                job.ended = True
                return "".join(pieces), event
    finally:
        watcher.cancel()
        if not job.ended:
            state.loop.cancel(job)


def _stream(state: ServerState, job: Job, head: dict, first_choice: dict | None, make_choice, include_usage: bool):
    """Server-sent events; when the client disconnects Starlette cancels this generator, and its
    finally cancels the sequence."""

    async def events():
        try:
            state.engine_loop().submit(job)
        except APIError as error:
            job.ended = True
            yield _sse(error.body())
            yield "data: [DONE]\n\n"
            return
        try:
            if first_choice is not None:
                yield _sse({**head, "choices": [first_choice]})
            while not job.ended:
                events = [await job.queue.get()]
                while not job.queue.empty():  # steps that came while the last write went out: one write
                    events.append(job.queue.get_nowait())
                out = []
                for event in events:
                    if event.error is not None:
                        job.ended = True
                        out.append(_sse(event.error.body()))
                        break
                    if event.text or event.finish is not None or job.every_step:
                        chunk = {**head, "choices": [make_choice(event.text, event.finish)]}
                        if job.every_step:  # the usage so far, as vLLM's continuous_usage_stats has it
                            chunk["usage"] = event.usage
                        out.append(_sse(chunk))
                    if event.finish is not None:
                        job.ended = True
                        if include_usage:
                            out.append(_sse({**head, "choices": [], "usage": event.usage}))
                        break
                if out:
                    yield "".join(out)
            yield "data: [DONE]\n\n"
        finally:
            if not job.ended:
                state.loop.cancel(job)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
