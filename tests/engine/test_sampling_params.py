"""SamplingParams: every out-of-range value raises ValueError naming its field; the documented
edges are accepted; ``greedy`` follows the documented rule (temperature 0 or top_k 1)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from localchat.engine.sampling_params import SamplingParams


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -0.1), ("temperature", -1e-9), ("temperature", 100.5),
        ("temperature", math.inf), ("temperature", math.nan),
        ("top_p", 0.0), ("top_p", -0.5), ("top_p", 1.0001), ("top_p", math.nan),
        ("top_k", -1), ("top_k", -100), ("top_k", 2**31), ("top_k", 10**20),
        ("max_tokens", 0), ("max_tokens", -5),
        ("seed", -1), ("seed", 2**63),
    ],
)
def test_bad_values_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0.0}, {"temperature": 100.0}, {"temperature": 1e-30},
        {"top_p": 1.0}, {"top_p": 1e-6}, {"top_k": 0}, {"top_k": 1}, {"top_k": 10**6},
        {"top_k": 2**31 - 1},
        {"max_tokens": 1}, {"max_tokens": None}, {"seed": 0}, {"seed": 2**63 - 1},
        {"seed": None},
    ],
)
def test_edge_values_are_accepted(kwargs):
    p = SamplingParams(**kwargs)
    for k, v in kwargs.items():
        assert getattr(p, k) == v


def test_defaults():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.seed, p.max_tokens, p.stop_token_ids,
            p.ignore_eos) == (0.7, 1.0, 0, None, 512, (), False)
    assert not p.greedy


def test_stop_token_ids_become_a_tuple_of_ints():
    p = SamplingParams(stop_token_ids=[3, 5.0, True])
    assert p.stop_token_ids == (3, 5, 1)
    assert all(type(t) is int for t in p.stop_token_ids)
    assert SamplingParams(stop_token_ids={7}).stop_token_ids == (7,)


@pytest.mark.parametrize(
    "kwargs,greedy",
    [({"temperature": 0.0}, True), ({"temperature": 0.0, "top_k": 5}, True),
     ({"temperature": 2.0, "top_k": 1}, True), ({"temperature": 1e-30}, False),
     ({"temperature": 1.0, "top_k": 2}, False), ({"temperature": 1.0, "top_p": 0.01}, False)],
)
def test_greedy_rule(kwargs, greedy):
    assert SamplingParams(**kwargs).greedy is greedy


def test_frozen():
    p = SamplingParams()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 0.0  # type: ignore[misc]


def test_stop_strings_up_to_the_servers_bound():
    """At most ``MAX_STOP_STRINGS`` (the server's bound too: ``ask --stop`` x 17 worked
    in-process and was refused by a running server)."""
    from localchat.app.server.protocol import ChatCompletionRequest
    from localchat.engine.sampling_params import MAX_STOP_STRINGS

    ok = [f"s{i}" for i in range(MAX_STOP_STRINGS)]
    assert SamplingParams(stop=ok).stop == tuple(ok)
    ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], stop=ok)
    with pytest.raises(ValueError, match=r"stop: at most 16 stop strings, got 17"):
        SamplingParams(stop=[*ok, "one more"])
    with pytest.raises(ValueError):
        ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], stop=[*ok, "x"])
