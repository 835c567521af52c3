"""``localchat chat --jsonl`` in a subprocess on SmolLM2-135M: the reply lines, error lines that
keep the conversation going, and turn 2 reusing turn 1 from the prefix cache.

The reference for ``cached_tokens``: turn 1's prompt and reply tokens whose K/V was computed
(the last sampled token never is), rounded down to whole 16-token blocks.
"""

from __future__ import annotations

import json

import pytest

from .test_cli import assert_one_line_error, env, run  # noqa: F401 - env is a fixture

BLOCK_SIZE = 16  # CacheConfig's default


def lines(proc) -> list[dict]:
    assert proc.returncode == 0, proc.stderr.decode()
    return [json.loads(ln) for ln in proc.stdout.decode().splitlines()]


def test_two_turns_errors_reset_and_cached_tokens(env):  # noqa: F811
    script = "\n".join([
        json.dumps({"role": "system", "content": "You are terse."}),
        json.dumps({"role": "user", "content": "Name a fruit."}),
        "this is not json",
        json.dumps({"role": "user", "content": "Name a fruit.", "temprature": 2}),  # misspelt
        json.dumps({"role": "tool", "content": "x"}),
        json.dumps({"role": "user", "content": "What color is it?"}),
        json.dumps({"command": "reset"}),
        json.dumps({"role": "user", "content": "Name a fruit."}),
    ]) + "\n"
    # quant "none" (from the environment: chat has no --quant): the equality below needs a
    # cached tail (<= 16 rows, the decode kernels) to compute what a full prefill does. With
    # the CPU default on a GGUF (native) the tail takes the int kernels over the file's
    # weights and the full prefill a bf16 GEMM over those weights rounded to bf16, and
    # SmolLM2's greedy reply here flips at a near-tie; bf16 weights are the same numbers on
    # both paths (fp32 sums in another order).
    out = lines(run(dict(env, LOCALCHAT_QUANT="none"), "chat", "--jsonl", "--temperature", "0",
                    "--max-tokens", "12", stdin=script.encode()))
    assert [sorted(o) for o in out[:1]] == [["ok", "role"]]
    first, bad_json, bad_field, bad_role, second, reset, again = out[1:]
    assert "not JSON" in bad_json["error"] and "role" in bad_role["error"]
    assert bad_field == {"error": "unknown field 'temprature' (a line holds 'role' and "
                                  "'content')"}
    for reply in (first, second, again):
        assert reply["content"] and reply["finish_reason"] in ("stop", "length")
        assert set(reply["usage"]) == {"prompt_tokens", "cached_tokens", "completion_tokens"}
        assert set(reply["timings"]) == {"ttft_s", "prefill_tokens_per_s",
                                         "decode_tokens_per_s"}
        assert reply["timings"]["ttft_s"] > 0
    u1, u2 = first["usage"], second["usage"]
    assert u1["cached_tokens"] == 0
    computed_turn1 = u1["prompt_tokens"] + u1["completion_tokens"] - 1
    assert u2["cached_tokens"] >= computed_turn1 // BLOCK_SIZE * BLOCK_SIZE
    assert u2["prompt_tokens"] > computed_turn1
    assert reset == {"ok": True, "command": "reset"}
    # After the reset the same first turn is asked again: the same greedy reply, and its whole
    # prompt but the last block comes from the cache.
    assert again["content"] == first["content"]
    assert again["usage"]["prompt_tokens"] == u1["prompt_tokens"]
    assert again["usage"]["cached_tokens"] >= (u1["prompt_tokens"] - 1) // BLOCK_SIZE * BLOCK_SIZE


def test_bad_flag_is_one_line_usage_error(env):  # noqa: F811
    proc = run(env, "chat", "--jsonl", "--temperature", "-1", stdin=b"")
    assert_one_line_error(proc, 2, "--temperature")


@pytest.mark.parametrize(("line", "error"), [
    ('{"role": "user", "content": "hi", "extra": 1}', "unknown field 'extra'"),
    ('{"command": "reset", "role": "user"}', "unknown field 'role'"),
    ('{"role": "user", "content": ""}', "'content' is empty"),
])
def test_lines_with_unknown_fields_are_refused(line, error):
    from localchat.app.chat_jsonl import _parse

    with pytest.raises(ValueError, match=error):
        _parse(line)
    assert _parse('{"role": "user", "content": "hi"}') == {"role": "user", "content": "hi"}
