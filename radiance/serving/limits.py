"""A request's body bounded before it is read (pure ASGI, inside the API key's guard): a body of more
than `--max-request-bytes` is a 413 naming the limit, whether its Content-Length says so at once or
a chunked body grows past it. Nothing of it is parsed, so a 10 MB prompt costs the server neither
the JSON parse nor the tokenizer nor the memory.

The 413 goes out first; then the rest of the body is read and dropped (up to DRAIN_LIMITS times the
limit), because a client still sending when the connection closes gets a reset, not the answer."""

from fastapi.responses import JSONResponse

from .protocol import error_body

DRAIN_LIMITS = 16  # a client sending more than this many limits' worth after its 413 is cut off


class BodyLimit:
    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        if declared is not None:
            if declared > self.limit:
                return await self._refuse(scope, receive, send, declared, 0)
            return await self.app(scope, receive, send)
        # No Content-Length (a chunked body, or none): read it here, up to the limit, and hand it on.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body ended
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._refuse(scope, receive, send, None, size)
            if not message.get("more_body", False):
                break
        whole = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay():
            return whole.pop() if whole else await receive()

        return await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send, declared: int | None, read: int) -> None:
        size = f"{declared} bytes" if declared is not None else f"more than {self.limit} bytes"
        response = JSONResponse(error_body(f"the request body is {size}, more than this server's limit of "
                                           f"{self.limit} bytes (--max-request-bytes)", code="request_too_large"),
                                status_code=413)
        await response(scope, receive, send)
        while read <= DRAIN_LIMITS * self.limit:  # drop the rest, so the client reads its answer
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return
            read += len(message.get("body", b""))


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP server refuses such a request before it gets here
    return None
