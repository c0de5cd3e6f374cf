"""A request's prompt made into token ids without holding up the server or keeping its memory.

- Text that is no text is refused: JSON's "\\ud800" reads as a lone surrogate, which no tokenizer
  (and no UTF-8) can take.
- A prompt that cannot fit is refused before it is tokenized: no token of the model's vocabulary is
  longer than `longest` characters, so a prompt of more than context × longest characters is more
  tokens than the context holds, whatever it says. (A normaliser that deletes characters could make
  such a prompt shorter; a prompt that is mostly deleted characters is refused, and that is fine.)
- Tokenizing runs on a worker thread, and the tokenizer's Rust code releases the GIL meanwhile
  (TextCodec.encode), so the event loop, /health and every stream go on while a long prompt is cut.
- Tokenizing a long text takes memory the allocator keeps afterwards (a 10 MB prompt left 1.3 GiB
  here for good); after a long prompt, glibc is asked to give back what is free (malloc_trim).
"""

import asyncio
import ctypes
import ctypes.util

from .protocol import APIError

TRIM_CHARS = 1 << 16  # a prompt this long is followed by malloc_trim
_libc = None


def check_text(text: str, param: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise APIError(400, f"{param}: character {error.start} is a lone surrogate "
                       f"(U+{ord(text[error.start]):04X}), which is not text", param=param) from None


def longest_token(tokenizer) -> int:
    """The most characters one token of `tokenizer` (a tokenizers.Tokenizer) can stand for: its
    longest vocabulary entry (a byte-level entry has a character per byte, a SentencePiece or
    WordPiece one at least one per character it covers, an added token is its own text)."""
    return max((len(token) for token in tokenizer.get_vocab(with_added_tokens=True)), default=1)


def check_length(chars: int, context: int, longest: int, param: str) -> None:
    limit = context * longest
    if chars > limit:
        raise APIError(400, f"the prompt is {chars} characters, more than the context of {context} tokens can hold: "
                       f"no token of this model is longer than {longest} characters, so at most {limit} fit",
                       param=param, code="context_length_exceeded")


def check_tokens(length: int, context: int, param: str) -> None:
    if length >= context:
        raise APIError(400, f"This model's maximum context length is {context} tokens; the prompt is {length} "
                       "tokens", param=param, code="context_length_exceeded")


def release_memory() -> None:
    """Hand the allocator's free memory back to the system (glibc; nothing elsewhere)."""
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        library = ctypes.CDLL(name) if name else None
        _libc = library if library is not None and hasattr(library, "malloc_trim") else False
    if _libc:
        _libc.malloc_trim(0)


async def tokenize(function, *args, chars: int) -> list[int]:
    """`function(*args)` (a TextCodec's encode or chat) on a worker thread; memory given back after
    a long prompt."""
    def run():
        try:
            return function(*args)
        finally:
            if chars >= TRIM_CHARS:
                release_memory()

    return await asyncio.to_thread(run)
