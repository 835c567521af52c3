"""StopStringMatcher: scenarios from issue 4 and a hypothesis property against a reference."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localchat.engine.stop_strings import StopStringMatcher


def _run(stops, deltas):
    """Feed ``deltas``; return (emitted pieces incl. flush, matched, max held length)."""
    m = StopStringMatcher(stops)
    pieces, max_held = [], 0
    for d in deltas:
        out, matched = m.feed(d)
        pieces.append(out)
        max_held = max(max_held, len(m.held))
        if matched is not None:
            break
    pieces.append(m.flush())
    return pieces, m.matched, max_held


def _reference(text, stops):
    found = [text.find(s) for s in stops if s in text]
    return text[:min(found)] if found else text


def test_stop_inside_a_single_delta():
    pieces, matched, _ = _run(["STOP"], ["Hello wor", "ld STOP trailing", "never seen"])
    assert "".join(pieces) == "Hello world "
    assert matched == "STOP"


def test_stop_spanning_three_deltas():
    m = StopStringMatcher(["<end>"])
    assert m.feed("answer <e") == ("answer ", None)
    assert m.feed("nd") == ("", None)
    assert m.held == "<end"
    assert m.feed("> tail") == ("", "<end>")
    assert m.finished and m.matched == "<end>"
    assert m.flush() == ""
    assert m.feed("more") == ("", "<end>")


def test_partial_match_that_fails_releases_held_text():
    m = StopStringMatcher(["\n\nUser:"])
    assert m.feed("one\n") == ("one", None)
    assert m.feed("\nUs") == ("", None)
    assert m.held == "\n\nUs"
    # "\n\nUsa" cannot start a stop: released at once, nothing held
    assert m.feed("a is big") == ("\n\nUsa is big", None)
    assert m.held == ""
    assert m.flush() == ""
    assert m.matched is None


def test_partial_match_at_the_end_is_flushed():
    m = StopStringMatcher(["###"])
    assert m.feed("total: 5 #") == ("total: 5 ", None)
    assert m.feed("#") == ("", None)
    assert m.flush() == "##"  # generation ended (max_tokens) before the stop completed
    assert m.matched is None and m.finished


def test_later_listed_stop_that_occurs_first_wins():
    pieces, matched, _ = _run(["zeta", "beta"], ["alpha be", "ta gamma ze", "ta"])
    assert "".join(pieces) == "alpha "
    assert matched == "beta"


def test_earliest_in_text_wins_over_first_completed():
    # "bc" completes first, but "abcd" starts earlier: it wins once it completes ...
    pieces, matched, _ = _run(["bc", "abcd"], ["x", "a", "b", "c", "d", "e"])
    assert ("".join(pieces), matched) == ("x", "abcd")
    # ... and "bc" wins as soon as "abcd" can no longer complete, or at the end.
    assert _run(["bc", "abcd"], ["xab", "ce"])[:2] == (["x", "a", ""], "bc")
    assert _run(["bc", "abcd"], ["xabc"])[:2] == (["x", "a"], "bc")


def test_same_start_shortest_wins():
    assert _run(["abc", "ab"], ["xabc"])[:2] == (["x", ""], "ab")


@pytest.mark.parametrize("stops", [["STOP"], ["aaaa"], ["ab", "abcdef"], ["\n\n", "END"]])
def test_hold_back_never_exceeds_len_stop_minus_one(stops):
    m = StopStringMatcher(stops)
    for ch in "aaab abcdeab STOSTOP aaaaa\n END ab":
        m.feed(ch)
        held = m.held
        assert any(s.startswith(held) and len(held) <= len(s) - 1 for s in stops)


def test_no_stops_passes_text_through():
    m = StopStringMatcher([])
    assert m.feed("abc") == ("abc", None)
    assert m.flush() == ""


@pytest.mark.parametrize("bad", [[""], ["ok", ""], [3]])
def test_invalid_stops_raise(bad):
    with pytest.raises(ValueError):
        StopStringMatcher(bad)


# --------------------------------------------------------------------------- property
_ALPHABET = "ab c\n"
_text = st.text(alphabet=_ALPHABET, max_size=60)
_stops = st.lists(st.text(alphabet=_ALPHABET, min_size=1, max_size=5), min_size=1, max_size=4)


@st.composite
def _split(draw):
    text = draw(_text)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return text, [text[i:j] for i, j in itertools.pairwise(bounds)]


@settings(max_examples=400, deadline=None)
@given(split=_split(), stops=_stops)
def test_emitted_text_equals_reference_for_any_split(split, stops):
    text, deltas = split
    want = _reference(text, stops)
    m = StopStringMatcher(stops)
    emitted = ""
    for d in deltas:
        out, matched = m.feed(d)
        emitted += out
        assert not any(s in emitted for s in stops)  # no emitted prefix ever has a stop
        assert want.startswith(emitted)
        assert len(m.held) <= max(len(s) for s in stops) - 1
        if matched is not None:
            break
    emitted += m.flush()
    assert emitted == want
    if want == text and not any(s in text for s in stops):
        assert m.matched is None
    else:
        assert m.matched is not None and m.matched in stops
        assert text.find(m.matched) == len(want) or text[len(want):].startswith(m.matched)


@settings(max_examples=100, deadline=None)
@given(split=_split(), stops=_stops)
def test_split_does_not_change_result(split, stops):
    text, deltas = split
    whole = _run(stops, [text])
    parts = _run(stops, deltas)
    assert "".join(whole[0]) == "".join(parts[0])
    assert whole[1] == parts[1]


# --------------------------------------------------------------------------- detokenizer seam
@pytest.mark.parametrize("stop", [" world", "lo w", "!", "d! Bye", "ld. ", "xyz"])
@pytest.mark.parametrize("use_decode_stream", [True, False])
def test_detokenizer_token_by_token_cuts_at_stop(smollm2_tokenizer_cold, stop,
                                                 use_decode_stream):
    from localchat.engine.detokenizer import IncrementalDetokenizer

    tok, _ = smollm2_tokenizer_cold
    ids = tok.encode("Hello world! Bye world. \u65e5\u672c")
    full = tok.decode(ids)
    detok = IncrementalDetokenizer(tok, stop=(stop,), use_decode_stream=use_decode_stream)
    streamed = ""
    for t in ids:
        streamed += detok.step([t])
        assert stop not in streamed
        if detok.stop_matched is not None:
            assert detok.step([t]) == ""  # nothing after a match
            break
    streamed += detok.flush()
    assert streamed == _reference(full, [stop]) == detok.text
    assert detok.stop_matched == (stop if stop in full else None)
