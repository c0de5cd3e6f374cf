"""How every failure reaches a client: an OpenAI-style error body (protocol.py's) with the status
that fits, whether the route refused the request (APIError), FastAPI found its JSON or a field's
type wrong, no route matched, or something failed inside."""

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .protocol import APIError, error_body


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError):
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError):
        problems = error.errors()
        first = problems[0] if problems else {"loc": (), "msg": "invalid request", "type": ""}
        if first.get("type") == "json_invalid":
            return JSONResponse(error_body(f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}"),
                                status_code=400)
        location = [str(part) for part in first.get("loc", ()) if part != "body"]
        # a union's member name (e.g. 'str', 'list[int]') is the type tried, not a field
        fields = [part for part in location if not any(c in part for c in "[]") and part not in ("str", "int", "float", "bool")]
        param = ".".join(fields) or None
        message = f"{param}: {first['msg']}" if param else f"the request body: {first['msg']}"
        if len(problems) > 1:
            message += f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})"
        return JSONResponse(error_body(message, param=param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        message = {404: f"no route {request.method} {request.url.path}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(error.status_code, str(error.detail))
        return JSONResponse(error_body(message, code=None), status_code=error.status_code, headers=error.headers)

    @app.exception_handler(Exception)
    async def failure(request: Request, error: Exception):
        return JSONResponse(error_body(f"{type(error).__name__}: {error}", type="server_error"), status_code=500)
