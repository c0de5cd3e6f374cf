"""The incremental stop-string scan (generation/stops.py) against the whole-text search it replaces:
the same output, cut at the earliest stop string present, however the text is split into pushes;
a hold-back never longer than the longest stop string less one; and work per push that follows the
new text only."""

import random

import pytest

from radiance.generation.stops import StopScanner, StopStrings


def whole_text(pieces, stops):
    """What the old search gave: after each push, the earliest occurrence of any stop string in the
    whole text so far ends it."""
    text = ""
    for piece in pieces:
        text += piece
        found = [text.find(stop) for stop in stops if stop and stop in text]
        if found:
            return text[:min(found)], True
    return text, False


def scanned(pieces, stops):
    scanner, out, longest = StopScanner(tuple(stops)), [], max((len(s) for s in stops), default=0)
    for piece in pieces:
        out.append(scanner.push(piece))
        assert len(scanner.held) <= max(longest - 1, 0)
        if scanner.stopped:
            return "".join(out), True
    return "".join(out) + scanner.rest(), False


@pytest.mark.parametrize("seed", range(300))
def test_random_texts_and_stops_match_the_whole_text_search(seed):
    rng = random.Random(seed)
    alphabet = "ab c" if seed % 2 else "abcdé"
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 4))]
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
    cuts = sorted(rng.sample(range(len(text) + 1), rng.randint(0, min(8, len(text) + 1))))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert scanned(pieces, stops) == whole_text(pieces, stops), (stops, pieces)


def test_the_earliest_stop_wins_inside_one_push():
    assert scanned(["xabcd"], ["abcd", "c"]) == ("x", True)
    assert scanned(["xab", "cd"], ["abcd", "c"]) == ("x", True)  # the push holds both: "abcd" starts first
    assert scanned(["xabc", "d"], ["abcd", "c"]) == ("xab", True)  # "c" ended the output a push earlier


def test_text_that_cannot_begin_a_stop_string_is_given_at_once():
    scanner = StopScanner(("END",))
    assert scanner.push("hello E") == "hello "
    assert scanner.push("N") == ""
    assert scanner.push("x") == "ENx"
    assert scanner.push("EN") == ""
    assert scanner.push("D tail") == "" and scanner.stopped
    assert scanner.push("more") == ""


def test_no_stop_strings_hold_nothing_back():
    scanner = StopScanner(())
    assert scanner.push("abc") == "abc" and scanner.rest() == "" and not scanner.stopped
    assert StopScanner(("",)).push("abc") == "abc"


def test_failure_links_find_a_stop_inside_a_partial_match():
    automaton = StopStrings(("abcabd", "cab"))
    assert automaton.matched[0] == 0
    assert scanned(["abcab"], ["abcabd", "cab"]) == ("ab", True)


def test_a_push_looks_at_its_new_characters_only(monkeypatch):
    """Each new character takes one automaton step, however long the output and the stop strings
    (the whole-text search re-read everything: 45 ms a token at 6k characters, issue 17)."""
    stops = ("x" * 300 + "y", "z" * 200)
    steps = []
    original = StopStrings.step
    monkeypatch.setattr(StopStrings, "step", lambda self, node, c: steps.append(c) or original(self, node, c))
    scanner = StopScanner(stops)
    for number in range(2000):
        before = len(steps)
        scanner.push("x" * 3)
        assert len(steps) - before == 3
        assert len(scanner.held) == min(3 * (number + 1), 300)
    assert not scanner.stopped and scanner.push("y") == "" and scanner.stopped
