"""Pure ASGI around the app: the API key on every route but /health (401 before anything else is
read), and each response's status counted for /metrics by route."""

import hmac

from fastapi.responses import JSONResponse

from .protocol import error_body

ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/graph")


class Guard:
    """Pure ASGI around the app: the API key on every route but /health (401 before anything else
    is read), and each response's status counted for /metrics."""

    def __init__(self, app, state):
        """`state`: app.py's ServerState (its api_key and metrics)."""
        self.app, self.state = app, state
        self.key = state.api_key.encode() if state.api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        route = path if path in ROUTES else ("/v1/models" if path.startswith("/v1/models/") else "other")
        status = {"code": 500}

        async def counted_send(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if self.key is not None and path != "/health" and not self._authorised(scope):
                response = JSONResponse(error_body("Incorrect or missing API key: send 'Authorization: Bearer KEY'",
                                                   code="invalid_api_key"), status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, counted_send)
                return
            await self.app(scope, receive, counted_send)
        finally:
            self.state.metrics.requests.labels(route=route, status=str(status["code"])).inc()

    def _authorised(self, scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)
        return False
