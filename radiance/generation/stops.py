"""Stop strings found as a sequence's text grows, at a cost per token that depends on the new text
only: an Aho-Corasick automaton over the request's stop strings, fed one character at a time.

Its state is the longest end of the text so far that begins some stop string, so that end (and no
more) is what has to be held back: it is never longer than the longest stop string less one. A stop
string is found in the push that completes it; where one push completes several, the one that
starts first wins (the whole text's earliest occurrence), and the text before it is the output.
"""

from functools import lru_cache


class StopStrings:
    """The automaton of one tuple of stop strings (build it with `stop_strings`, which keeps the
    last few). Node 0 is the root; a node is the prefix of some stop string."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(stop for stop in stops if stop)
        self.goto: list[dict[str, int]] = [{}]
        self.depth = [0]
        self.matched = [0]  # the longest stop string that ends the node's prefix (0: none)
        for stop in self.stops:
            node = 0
            for character in stop:
                child = self.goto[node].get(character)
                if child is None:
                    child = len(self.depth)
                    self.goto[node][character] = child
                    self.goto.append({})
                    self.depth.append(self.depth[node] + 1)
                    self.matched.append(0)
                node = child
            self.matched[node] = len(stop)
        self.fail = [0] * len(self.depth)
        order = list(self.goto[0].values())  # breadth first: a node's fail link is shallower
        for node in order:
            for character, child in self.goto[node].items():
                order.append(child)
                if node == 0:
                    continue
                back = self.fail[node]
                while back and character not in self.goto[back]:
                    back = self.fail[back]
                self.fail[child] = self.goto[back].get(character, 0)
                self.matched[child] = self.matched[child] or self.matched[self.fail[child]]

    def step(self, node: int, character: str) -> int:
        while node and character not in self.goto[node]:
            node = self.fail[node]
        return self.goto[node].get(character, 0)


@lru_cache(maxsize=64)
def stop_strings(stops: tuple[str, ...]) -> StopStrings:
    return StopStrings(stops)


class StopScanner:
    """One sequence's scan: `push(text)` gives the text that is safe to emit (it can no longer
    become part of a stop string) and whether a stop string ended the output; `rest()` the text
    still held back, for a sequence that ended otherwise."""

    def __init__(self, stops: tuple[str, ...]):
        self.automaton = stop_strings(tuple(stops))
        self.node, self.held, self.stopped = 0, "", False

    def push(self, text: str) -> str:
        if self.stopped or not text:
            return ""
        automaton, node = self.automaton, self.node
        if not automaton.stops:
            return text
        buffer, start = self.held + text, len(self.held)
        cut = None
        for index in range(len(text)):
            node = automaton.step(node, text[index])
            length = automaton.matched[node]
            if length:
                begin = start + index + 1 - length
                cut = begin if cut is None else min(cut, begin)
        if cut is not None:
            self.stopped, self.held = True, ""
            return buffer[:cut]
        self.node = node
        keep = automaton.depth[node]
        self.held = buffer[len(buffer) - keep:] if keep else ""
        return buffer[:len(buffer) - keep]

    def rest(self) -> str:
        held, self.held = self.held, ""
        return held
