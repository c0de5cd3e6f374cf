"""Text in and out: the container's tokenizer through the `tokenizers` library, its chat template
through jinja2, and a detokeniser that streams only whole characters."""

from datetime import datetime

from tokenizers import Tokenizer


class TextError(ValueError):
    """The model's text side is unusable: names what is missing."""


def _raise(message):
    import jinja2

    raise jinja2.TemplateError(message)


def _load_tokenizer(tokenizer_json: str, path: str) -> Tokenizer:
    """The container's tokenizer, or TextError naming the file: a damaged tokenizer is the file's
    fault, and the library says only where in the JSON it stopped (as a bare Exception)."""
    try:
        return Tokenizer.from_str(tokenizer_json)
    except Exception as error:  # noqa: BLE001  (tokenizers raises Exception itself)
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise TextError(f"{path}: the tokenizer in the container does not load ({detail}): the file is "
                        "damaged or was written by a converter this tokenizers library cannot read") from None


class TextCodec:
    def __init__(self, tokenizer_json: str | None, chat_template: str | None, hyper: dict, path: str = "model"):
        if not tokenizer_json:
            raise TextError(f"{path}: the container carries no tokenizer")
        self.tokenizer = _load_tokenizer(tokenizer_json, path)
        self.path, self.hyper = path, hyper
        eos_ids = list(hyper.get("eos_token_ids") or [])
        self.bos_id, self.eos_id = hyper.get("bos_token_id"), (eos_ids[0] if eos_ids else None)
        self.template = None
        if chat_template:
            # jinja2 imported here, where a template is compiled: 0.2 s a process that has none
            # (`radiance --help`, a CLI error, the converter)
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            environment.globals.update(raise_exception=_raise, strftime_now=lambda f: datetime.now().strftime(f))
            self.template = environment.from_string(chat_template)
        self.stop_ids = set(eos_ids)

    def token_text(self, token: int | None) -> str:
        return "" if token is None else (self.tokenizer.id_to_token(token) or "")

    def _ids(self, text: str) -> list[int]:
        # encode_batch_fast releases the GIL while it works (encode holds it) and keeps no offsets:
        # a long prompt on a server's worker thread does not stop the others
        return self.tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """A raw completion prompt: a BOS only where the model's metadata asks for one."""
        ids = self._ids(text)
        if (self.hyper.get("add_bos", False) if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def chat(self, messages: list[dict]) -> list[int]:
        if self.template is None:
            raise TextError(f"{self.path}: the model has no chat template; use a raw prompt")
        text = self.template.render(messages=messages, add_generation_prompt=True,
                                    bos_token=self.token_text(self.bos_id), eos_token=self.token_text(self.eos_id))
        return self._ids(text)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class Detokenizer:
    """Streams the text of a growing list of ids at a cost per token that does not grow with the
    output: it decodes a short window (the tokens since the last whole character, after the few
    before them for context, as a byte-level or SentencePiece decoder needs), and holds back an
    incomplete UTF-8 character until its last byte arrives."""

    def __init__(self, codec: TextCodec):
        self.codec, self.ids, self.prefix, self.read = codec, [], 0, 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        before = self.codec.decode(self.ids[self.prefix:self.read])
        after = self.codec.decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""
