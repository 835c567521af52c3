"""Scheduler: FCFS admission, token and sequence budgets, chunked prefill, stops, drafts.

No model: ``scheduler_sim.Sim`` drives a real ``KVCacheManager`` and checks every step's cache
contents and invariants (see there). Preemption, aborts and random workloads:
``test_scheduler_preemption.py``.
"""

from __future__ import annotations

from localchat.engine.outputs import ModelRunnerOutput
from localchat.engine.request import FinishReason

from .scheduler_sim import Sim


def test_prefill_then_decode_one_token_each():
    sim = Sim(num_blocks=8, block_size=4, max_batched=100, max_seqs=4)
    a = sim.add("a", 5, max_tokens=3)
    sim.run()
    assert sim.steps == [{"a": 5}, {"a": 1}, {"a": 1}]
    assert a.output_token_ids == [100, 101, 102]
    assert a.finish_reason is FinishReason.LENGTH
    assert sim.kv.block_pool.num_free_blocks == 8


def test_long_prompt_is_chunked_over_several_steps():
    sim = Sim(num_blocks=8, block_size=4, max_batched=8, max_seqs=4)
    a = sim.add("a", 20, max_tokens=2)
    sim.step()
    assert a.num_computed_tokens == 8 and a.output_token_ids == [] and len(a.block_ids) == 2
    sim.step()
    assert a.num_computed_tokens == 16 and a.output_token_ids == []
    sim.step()
    assert a.num_computed_tokens == 20 and a.output_token_ids == [100]
    sim.run()
    assert sim.steps == [{"a": 8}, {"a": 8}, {"a": 4}, {"a": 1}]
    assert a.output_token_ids == [100, 101] and a.is_finished


def test_decodes_first_then_new_prompt_chunk_fills_the_budget():
    sim = Sim(num_blocks=16, block_size=4, max_batched=10, max_seqs=4)
    a = sim.add("a", 4, max_tokens=10)
    sim.step()
    b = sim.add("b", 20, max_tokens=1)
    sim.step()
    sim.step()
    sim.step()
    assert sim.steps == [{"a": 4}, {"a": 1, "b": 9}, {"a": 1, "b": 9}, {"a": 1, "b": 2}]
    assert [r.request_id for r in sim.sched.running] == ["a"]
    assert b.output_token_ids == [100] and b.finish_reason is FinishReason.LENGTH
    assert a.output_token_ids == [100, 101, 102, 103]


def test_separate_prompt_steps_never_mix_decode_rows_and_prompt_tokens():
    """The CPU engine's scheduler (LLMEngine: separate_prompt_steps on CPU): the case above,
    where b's prompt chunks shared steps with a's decode rows, runs as alternating steps,
    prompt first; each request's tokens are the same, and a waiting prompt that cannot be
    admitted (max_num_seqs) never stalls the decoding ones."""
    sim = Sim(num_blocks=16, block_size=4, max_batched=10, max_seqs=4,
              separate_prompt_steps=True)
    a = sim.add("a", 4, max_tokens=10)
    sim.step()
    b = sim.add("b", 20, max_tokens=1)
    for _ in range(6):
        sim.step()
    assert sim.steps == [{"a": 4}, {"b": 10}, {"a": 1}, {"b": 10}, {"a": 1}, {"a": 1},
                         {"a": 1}]
    assert b.output_token_ids == [100] and b.finish_reason is FinishReason.LENGTH
    assert a.output_token_ids == [100, 101, 102, 103, 104]
    # max_num_seqs reached: the waiting prompt cannot come in, the decode steps go on
    full = Sim(num_blocks=16, block_size=4, max_batched=10, max_seqs=1,
               separate_prompt_steps=True)
    x = full.add("x", 4, max_tokens=4)
    full.step()
    full.add("y", 4, max_tokens=1)
    full.step()
    full.step()
    assert full.steps == [{"x": 4}, {"x": 1}, {"x": 1}] and len(x.output_token_ids) == 3


def test_separate_prompt_steps_never_cut_a_chunk_for_another_request():
    """With separate_prompt_steps a prompt chunk is the one its request gets alone
    (min(remaining, max_num_batched_tokens)): where another prompt took part of the budget,
    it waits for the next prompt step instead of computing a shorter chunk, so its rows take
    the same kernels as alone (ModelRunner.step_groups)."""
    sim = Sim(num_blocks=32, block_size=4, max_batched=10, max_seqs=4,
              separate_prompt_steps=True)
    sim.add("a", 6, max_tokens=2)
    sim.add("b", 7, max_tokens=2)
    sim.add("c", 3, max_tokens=2)
    sim.step()
    assert sim.steps[-1] == {"a": 6}  # b alone gets 7; 4 were left: c waits behind it (FCFS)
    sim.run()
    assert sim.steps[:3] == [{"a": 6}, {"b": 7, "c": 3}, {"a": 1, "b": 1, "c": 1}]
    assert all(r.output_token_ids == [100, 101] for r in sim.reqs.values())
    # without the separation (the GPU engine) b's chunk is cut to fit, as before
    mixed = Sim(num_blocks=32, block_size=4, max_batched=10, max_seqs=4)
    mixed.add("a", 6, max_tokens=2)
    mixed.add("b", 7, max_tokens=2)
    mixed.step()
    assert mixed.steps[-1] == {"a": 6, "b": 4}


def test_max_num_seqs_limits_running_and_admission_is_fcfs():
    sim = Sim(num_blocks=16, block_size=4, max_batched=100, max_seqs=2)
    for rid in "abc":
        sim.add(rid, 3, max_tokens=2)
    sim.step()
    assert sim.steps[-1] == {"a": 3, "b": 3}
    assert [r.request_id for r in sim.sched.waiting] == ["c"]
    sim.run()
    assert sim.steps == [{"a": 3, "b": 3}, {"a": 1, "b": 1}, {"c": 3}, {"c": 1}]
    assert all(r.output_token_ids == [100, 101] for r in sim.reqs.values())


def test_token_budget_admission_order_is_arrival_order():
    sim = Sim(num_blocks=32, block_size=4, max_batched=4, max_seqs=8)
    for rid in "abcd":
        sim.add(rid, 3, max_tokens=2)
    sim.run()
    assert sim.steps[0] == {"a": 3, "b": 1}
    order = sorted(sim.first_scheduled, key=lambda rid: (sim.first_scheduled[rid], rid))
    assert order == list("abcd")
    firsts = [sim.first_scheduled[rid] for rid in "abcd"]
    assert firsts == sorted(firsts)


def test_blocked_head_of_queue_is_not_overtaken():
    """Strict FCFS: when the oldest waiting request does not fit, a smaller later one waits."""
    sim = Sim(num_blocks=4, block_size=4, max_batched=100, max_seqs=8)
    sim.add("a", 10, max_tokens=2)  # 3 blocks
    sim.step()
    sim.add("b", 8, max_tokens=1)  # needs 2 blocks, 1 free
    sim.add("c", 2, max_tokens=1)  # would fit in 1 block
    sim.step()
    assert sim.steps[-1] == {"a": 1}
    assert [r.request_id for r in sim.sched.waiting] == ["b", "c"]
    sim.run()
    assert sim.steps[2] == {"b": 8, "c": 2}


def test_stop_token_finishes_with_stop():
    sim = Sim(num_blocks=8, block_size=4, max_batched=100, max_seqs=4)
    a = sim.add("a", 3, max_tokens=10, stop={101, 555})
    sim.run()
    assert a.output_token_ids == [100, 101]
    assert a.finish_reason is FinishReason.STOP
    assert sim.kv.block_pool.num_free_blocks == 8


def test_stop_token_as_first_token():
    sim = Sim(num_blocks=8, block_size=4, max_batched=100, max_seqs=4)
    a = sim.add("a", 3, max_tokens=10, stop={100})
    b = sim.add("b", 3, max_tokens=2)
    sim.run()
    assert a.output_token_ids == [100] and a.finish_reason is FinishReason.STOP
    assert b.output_token_ids == [100, 101] and b.finish_reason is FinishReason.LENGTH


def test_max_tokens_and_max_model_len_finish_with_length():
    sim = Sim(num_blocks=8, block_size=4, max_batched=100, max_seqs=4, max_model_len=6)
    a = sim.add("a", 4, max_tokens=100)
    b = sim.add("b", 2, max_tokens=1)
    sim.run()
    assert a.output_token_ids == [100, 101] and a.finish_reason is FinishReason.LENGTH
    assert b.output_token_ids == [100] and b.finish_reason is FinishReason.LENGTH


def test_update_from_output_only_touches_sampled_requests():
    sim = Sim(num_blocks=8, block_size=4, max_batched=5, max_seqs=4)
    sim.add("a", 3, max_tokens=5)
    b = sim.add("b", 6, max_tokens=5)
    out = sim.sched.schedule()
    assert out.num_scheduled_tokens == {"a": 3, "b": 2}
    touched = sim.sched.update_from_output(out, ModelRunnerOutput({"a": [7]}))
    assert [r.request_id for r in touched] == ["a"]
    assert b.output_token_ids == [] and b.num_computed_tokens == 2
    assert sim.reqs["a"].output_token_ids == [7] and sim.reqs["a"].num_computed_tokens == 3



def test_drafts_travel_in_the_scheduler_output_and_the_scheduler_applies_the_verification():
    """Drafts come in through ``schedule(spec_token_ids)``, are cut to the token budget and
    leave in ``scheduled_spec_decode_tokens``; ``update_from_output`` counts only the accepted
    drafts as computed, frees the blocks of rejected ones and counts drafted/accepted."""
    sim = Sim(num_blocks=8, block_size=2, max_batched=4, max_seqs=2)
    a = sim.add("a", 3, max_tokens=10)
    sim.sched.update_from_output(sim.sched.schedule(), ModelRunnerOutput({"a": [50]}))
    assert a.num_computed_tokens == 3 and a.num_tokens == 4 and len(a.block_ids) == 2
    out = sim.sched.schedule({"a": [51, 52, 53, 54], "gone": [1]})
    # budget 4 = the decode token + 3 drafts; an unknown id is ignored
    assert out.num_scheduled_tokens == {"a": 4}
    assert out.scheduled_spec_decode_tokens == {"a": [51, 52, 53]}
    assert len(a.block_ids) == 4  # slots for positions 3..6
    touched = sim.sched.update_from_output(
        out, ModelRunnerOutput({"a": [51, 60]}, num_accepted_tokens={"a": 1}))
    assert touched == [a] and a.num_new_tokens == 2
    assert a.output_token_ids == [50, 51, 60]
    # positions 3 (token 50) and 4 (draft 51, accepted) are computed; 60 is not yet
    assert a.num_computed_tokens == 5 == a.num_tokens - 1
    assert (a.num_draft_tokens, a.num_accepted_tokens) == (3, 1)
    # the rejected drafts' block (position 6) is released: 6 tokens need 3 blocks
    assert len(a.block_ids) == 3 and len(sim.kv.block_pool.free_block_ids) == 5
    # without drafts the next step is a plain decode step
    out = sim.sched.schedule()
    assert out.num_scheduled_tokens == {"a": 1} and out.scheduled_spec_decode_tokens == {}
