"""A sequence's output text as its tokens arrive, for the CLI and the server alike: tokens through
the incremental detokenizer (text.py), the text through the incremental stop-string scan
(stops.py). Each token costs the same however long the output already is."""

from .sequence import SamplingParams
from .stops import StopScanner
from .text import Detokenizer, TextCodec


class OutputText:
    """`push(token)` gives the text that can be shown now; `stopped` turns true in the push that
    completes a stop string (the stop string itself is never given); `rest()` is the text still held
    back (an incomplete stop string) once the sequence ended for another reason."""

    def __init__(self, codec: TextCodec, params: SamplingParams):
        self.detokenizer, self.scanner = Detokenizer(codec), StopScanner(params.stop)
        # an end-of-sequence token is not text, unless the request generates past it
        self.silent = frozenset() if params.ignore_eos else frozenset(codec.stop_ids)

    @property
    def stopped(self) -> bool:
        return self.scanner.stopped

    def push(self, token: int) -> str:
        if token in self.silent or self.scanner.stopped:
            return ""
        return self.scanner.push(self.detokenizer.push(token))

    def rest(self) -> str:
        return self.scanner.rest()
