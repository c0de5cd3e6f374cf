"""The OpenAI API's requests as pydantic models, checked strictly (a string where a number is due is
a 400, not a guess), and the OpenAI-style error every refusal carries:
{"error": {"message", "type", "param", "code"}}."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

INT64 = 1 << 63


class APIError(Exception):
    """A refusal with its HTTP status and OpenAI-style body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def not_ready(message: str = "the model is still loading: try again once /health answers 200") -> APIError:
    return APIError(503, message, type="server_error", code="not_ready")


class _Request(BaseModel):
    # Strict: JSON's types as the API documents them (an int is accepted for a float; NaN and
    # Infinity, which Python's JSON reads, are not numbers here). Fields this server does not know
    # are ignored, as OpenAI's own clients send some of their own.
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class StreamOptions(_Request):
    include_usage: bool = False
    # vLLM's extension: with include_usage, every chunk carries the usage so far, and a chunk goes out
    # for every step that generated a token of the request, even where the token added no text
    # (rad-bench times tokens by it: a model's tokens may decode to nothing yet)
    continuous_usage_stats: bool = False


class Sampling(_Request):
    """What completions and chat completions share."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, description="an extension: -1 or 0 keeps every token")
    n: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-INT64, lt=2 * INT64)
    ignore_eos: bool = False  # an extension (vLLM's): generate max_tokens whatever the model says
    user: str | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        """(field, why) for each asked-for feature this server does not have."""
        refused = []
        if self.n not in (None, 1):
            refused.append(("n", "n > 1 is not supported: send one request per completion"))
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                refused.append((name, f"{name} is not supported"))
        if self.logit_bias:
            refused.append(("logit_bias", "logit_bias is not supported"))
        return refused


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = None
    logprobs: int | None = None
    best_of: int | None = Field(None, ge=1)
    suffix: str | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        refused = super().unsupported()
        if self.echo:
            refused.append(("echo", "echo is not supported"))
        if self.logprobs is not None:
            refused.append(("logprobs", "logprobs are not supported"))
        if self.best_of not in (None, 1):
            refused.append(("best_of", "best_of > 1 is not supported"))
        if self.suffix:
            refused.append(("suffix", "suffix is not supported"))
        return refused


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseFormat(_Request):
    type: str


class ChatCompletionRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    response_format: ResponseFormat | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        refused = super().unsupported()
        if self.logprobs:
            refused.append(("logprobs", "logprobs are not supported"))
        if self.top_logprobs is not None:
            refused.append(("top_logprobs", "top_logprobs is not supported (it asks for logprobs, which are not)"))
        for index, message in enumerate(self.messages):
            if message.role == "tool":
                refused.append((f"messages.{index}.role", "role 'tool' is not supported: this server runs no tools"))
        if self.tools:
            refused.append(("tools", "tools are not supported"))
        if self.response_format is not None and self.response_format.type != "text":
            refused.append(("response_format", f"response_format '{self.response_format.type}' is not supported"))
        return refused
