"""One device read per decode step through ``ModelRunner.execute_model``, sampler included.

Issue 15's host-work defect: on CUDA the sampler's per-row settings (temperatures, top-k,
top-p, min-p, the greedy mask, the penalties and their token counts) went to the device as
``torch.tensor(list, device=...)``: a pageable copy and a stream sync each, several per sampled
step. Here decode steps of greedy, seeded top-p, unseeded top-k + min-p and penalized requests
run on CPU under ``HostSyncGuard(blocking_copies=True)`` (the kernels and the step's packed
staging copy paused: their host work is by design): the only event allowed is the sampled
tokens' ``.tolist()``. The guard itself is checked to catch what it claims to catch.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.model_runner import ModelRunner
from localchat.engine.request import Request
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.scheduler import SchedulerOutput

from .host_sync_guard import (HostSyncError, HostSyncGuard, pause_in_cpu_only, pause_in_kernels,
                              pause_in_staging)
from .test_cuda_defects import _caches, _tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _requests():
    params = [SamplingParams(temperature=0.0, max_tokens=8),
              SamplingParams(temperature=0.8, top_p=0.9, max_tokens=8, seed=3),
              SamplingParams(temperature=0.7, top_k=5, min_p=0.05, max_tokens=8),
              SamplingParams(temperature=0.9, repetition_penalty=1.3, presence_penalty=0.5,
                             frequency_penalty=0.2, max_tokens=8, seed=4)]
    prompts = ([1, 2, 3, 4, 5], [7, 8, 9], [11, 12, 13, 14], [20, 21, 20])
    reqs = []
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        r = Request(f"r{i}", prompt, p)
        r.block_ids = [2 * i + 1, 2 * i + 2]
        reqs.append(r)
    return reqs


def _step(runner, reqs):
    out = SchedulerOutput(list(reqs), {r.request_id: (r.num_tokens - r.num_computed_tokens)
                                       for r in reqs})
    result = runner.execute_model(out)
    for r in reqs:
        r.num_computed_tokens = r.num_tokens
        r.output_token_ids += result.sampled_token_ids[r.request_id]
    return result


@pytest.mark.parametrize("rows", [(0,), (1, 2), (0, 1, 2), (0, 3)],
                         ids=["greedy", "sampled", "mixed", "penalties"])
def test_decode_step_reads_the_device_once(monkeypatch, rows):
    runner = ModelRunner(_tiny_model(), _caches(), 16, torch.device("cpu"))
    reqs = [r for i, r in enumerate(_requests()) if i in rows]
    _step(runner, reqs)  # the first step's one-off finite-logits check
    guard = HostSyncGuard(strict=False, blocking_copies=True)
    pause_in_kernels(monkeypatch, guard)
    pause_in_staging(monkeypatch, guard)
    pause_in_cpu_only(monkeypatch, guard)
    for _ in range(2):
        with guard:
            result = _step(runner, reqs)
        assert sorted(result.sampled_token_ids) == [r.request_id for r in reqs]
    assert guard.events == ["tolist", "tolist"]  # the sampled token ids, once per step


def test_the_guard_catches_what_it_claims():
    x = torch.arange(4, device="cpu")
    strict = HostSyncGuard(strict=True)
    for bad in (lambda: x.sum().item(), lambda: bool(x.any()), lambda: int(x[0]),
                lambda: x.tolist(), lambda: torch.tensor([1, 2]), lambda: torch.zeros(3),
                lambda: x[[0, 1]]):
        with pytest.raises(HostSyncError), strict:
            bad()
    with strict:  # device-side work passes
        torch.zeros(3, device=x.device).add_(x[:3]).argmax()
    blocking = HostSyncGuard(strict=False, blocking_copies=True)
    with blocking:
        torch.tensor([1.0], device="cpu")
        torch.tensor([1.0]).to("cpu")
        torch.tensor([1.0]).to(device=torch.device("cpu"))
        torch.tensor([1.0]).to("cpu", non_blocking=True)  # staged: passes
        torch.tensor([1.0]).to(torch.float64)  # a dtype cast: passes
        x.tolist()
    assert blocking.events == ["tensor", "to", "to", "tolist"]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_verify_reads_the_device_once_per_request(temperature):
    """``RejectionSampler.verify`` (greedy or sampled): one read of the accepted count and
    the next token, the drafts staged without a blocking copy; the emitted tokens equal
    ``rejection_sample`` called directly with the same RNG state."""
    from localchat.engine.sampler import sampling_probs
    from localchat.engine.spec_decode.rejection_sampler import RejectionSampler, rejection_sample

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 32, generator=gen) * 2
    drafts = [5, 9, 2]
    params = SamplingParams(temperature=temperature, top_p=0.95, max_tokens=8)
    req = Request("r", [1, 2], params)
    q = None if temperature == 0 else torch.softmax(torch.randn(3, 32, generator=gen), -1)
    guard = HostSyncGuard(strict=False, blocking_copies=True)
    with guard:
        got = RejectionSampler().verify(logits, drafts, q, req, torch.Generator().manual_seed(7))
    assert guard.events == ["tolist"]
    if temperature == 0:
        target = logits.argmax(-1).tolist()
        n = next((i for i, d in enumerate(drafts) if d != target[i]), len(drafts))
        assert got == drafts[:n] + [target[n]]
    else:
        probs = sampling_probs(logits, [params] * 4)
        n, nxt = rejection_sample(probs[None], q[None], torch.tensor([drafts]),
                                  torch.Generator().manual_seed(7))
        assert got == drafts[: int(n[0])] + [int(nxt[0])]
