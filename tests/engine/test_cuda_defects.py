"""The CUDA path's defects, each caught on CPU: the dtype a GPU of a given compute capability
gets, fp8's ``_scaled_mm`` output dtype, CUDA graphs only when graph-safe, decode split-K sized
from the real length's bucket, one packed copy per step, and no per-token sync in the draft.
The GPU-only parts are faked (device capability, ``torch._scaled_mm``) and the faked
behaviour mirrors the real constraint the defect broke.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from localchat.engine.attention_metadata import seq_len_bucket
from localchat.engine.config import EngineConfig, ModelConfig
from localchat.engine.memory.budget import DeviceSpec
from localchat.engine.memory.planner import plan_memory, unquantized_format
from localchat.engine.model_runner import ModelRunner
from localchat.engine.models.llama import LlamaForCausalLM
from localchat.engine.quant import fp8 as fp8_mod
from localchat.engine.quant.schemes import default_float_dtype
from localchat.engine.request import Request
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.spec_decode.proposer import DraftModelProposer
from localchat.engine.step_inputs import BatchEntry, build_batch

from .host_sync_guard import HostSyncGuard, pause_in_cpu_only, pause_in_kernels, pause_in_staging

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ModelConfig(
    architecture="LlamaForCausalLM", vocab_size=128, hidden_size=64, intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=256,
)


def _fake_gpu(monkeypatch, capability):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "fake GPU")


@pytest.mark.parametrize("capability, dtype, fmt", [
    ((7, 0), torch.float16, "fp16"),   # V100
    ((7, 5), torch.float16, "fp16"),   # T4, RTX 20xx
    ((8, 0), torch.bfloat16, "bf16"),  # A100
    ((9, 0), torch.bfloat16, "bf16"),  # H100/H200
])
def test_pre_sm80_gpus_get_fp16(monkeypatch, capability, dtype, fmt):
    _fake_gpu(monkeypatch, capability)
    assert default_float_dtype("cuda") is dtype
    assert EngineConfig(device="cuda").resolved_dtype() is dtype
    spec = DeviceSpec.detect("cuda")
    assert unquantized_format(spec) == fmt
    assert spec.fp8 is (capability >= (8, 9))
    plan = plan_memory(TINY, 2**30, 256, device=spec)
    assert plan.rows[0].format == fmt


def test_fp8_fp16_activations_ask_scaled_mm_for_bf16(monkeypatch):
    """Row-wise scaled ``_scaled_mm`` only produces bf16: the fake raises for anything else
    (as PyTorch does on the GPU) and computes the scaled product otherwise."""
    calls = []

    def fake_scaled_mm(a, b, *, scale_a, scale_b, out_dtype):
        calls.append(out_dtype)
        if scale_a.numel() > 1 and out_dtype is not torch.bfloat16:
            raise RuntimeError("Only bf16 high precision output types are supported for "
                               "row-wise scaling.")
        return ((a.float() * scale_a) @ (b.float() * scale_b)).to(out_dtype)

    monkeypatch.setattr(torch, "_scaled_mm", fake_scaled_mm)
    torch.manual_seed(0)
    w = torch.randn(32, 64)
    qweight, scales = fp8_mod.quantize_fp8(w)
    x = torch.randn(3, 64)
    want = x @ fp8_mod.dequantize_fp8(qweight, scales).T
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        y = fp8_mod.fp8_linear(x.to(dtype), qweight, scales)
        assert y.dtype is dtype and y.shape == (3, 32)
        # e4m3 activations (2^-4 relative) + a bf16 output rounding
        assert ((y.float() - want).norm() / want.norm()).item() < 0.08
    assert calls == [torch.bfloat16] * 3


def _tiny_model():
    torch.manual_seed(0)
    m = LlamaForCausalLM(TINY)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    return m.eval()


def _caches(num_blocks=32, block_size=16):
    return [torch.zeros(2, num_blocks, block_size, 2, 16) for _ in range(2)]


@pytest.mark.parametrize("env, safe", [("reference", False), (None, True)])
def test_cuda_graphs_only_when_every_op_is_graph_safe(monkeypatch, env, safe):
    """Under the reference kernels (or without Triton) no graph is captured; with Triton the
    runner captures (the capture itself is faked here: its own test is the CPU capture check
    in test_cuda_graphs.py)."""
    from localchat import kernels
    from localchat.engine import cuda_graphs

    if env is None and importlib.util.find_spec("triton") is None:
        pytest.skip("needs triton")  # never on this project's machines: triton is a dependency
    if env:
        monkeypatch.setenv("LOCALCHAT_KERNELS", env)
    else:
        monkeypatch.delenv("LOCALCHAT_KERNELS", raising=False)
    kernels.triton_available.cache_clear()
    captured = []
    monkeypatch.setattr(cuda_graphs.CudaGraphRunner, "capture", lambda self: captured.append(1))
    try:
        runner = ModelRunner(_tiny_model(), _caches(), 16, torch.device("cpu"))
        runner.device = torch.device("cuda")  # only the device *type* is consulted before capture
        monkeypatch.setattr(cuda_graphs.CudaGraphRunner, "__init__",
                            lambda self, *a, **k: None)
        reason = runner.capture_cuda_graphs(256)
    finally:
        kernels.triton_available.cache_clear()
    if safe:
        assert reason is None and runner.graphs is not None and captured == [1]
    else:
        assert "reference" in reason and runner.graphs is None and captured == []


def test_split_k_sized_from_the_real_length_not_the_table():
    """A 4k context on a 128k-token table (Llama 3.1's max_model_len): the partitions that do
    work for it must fill the GPU, which sizing from the table width did not."""
    pytest.importorskip("triton")
    from localchat.kernels import triton_decode

    cpu = torch.device("cpu")  # sm_count: 128 off CUDA
    seq_len, kv_heads = 4096, 8
    for bound, busy_min in ((131072, 1), (seq_len_bucket(seq_len), 8)):
        splits, partition = triton_decode.partitioning(1, kv_heads, bound, cpu)
        busy = -(-seq_len // partition)  # partitions holding tokens of the 4k sequence
        assert splits * partition >= bound
        if bound == 131072:
            assert busy <= 2  # the defect: 8 heads x <= 2 programs on 128 SMs
        else:
            assert busy >= busy_min and busy * kv_heads >= 64
    assert seq_len_bucket(1) == 256 and seq_len_bucket(4096) == 4096
    assert seq_len_bucket(4097) == 8192


def test_build_batch_is_one_packed_copy_with_a_length_bucket():
    entries = [BatchEntry([3, 1], 20, [5, 6, 7], "all"), BatchEntry([2], 4, [9], "last")]
    ids, pos, meta, rows = build_batch(entries, 16, torch.device("cpu"))
    assert ids.tolist() == [5, 6, 7, 9] and pos.tolist() == [20, 21, 22, 4]
    assert meta.slot_mapping.tolist() == [16 + 4, 16 + 5, 16 + 6, 2 * 16 + 4]
    assert meta.block_tables.tolist() == [[3, 1], [2, 0]]
    assert meta.seq_lens.tolist() == [23, 5] and meta.query_start_loc.tolist() == [0, 3, 4]
    assert meta.max_query_len == 3 and meta.max_seq_len == 256
    assert rows == [[0, 1, 2], [3]]
    # every tensor is a view of one buffer (one host-to-device copy on CUDA)
    base = ids.untyped_storage().data_ptr()
    for t in (pos, meta.slot_mapping, meta.block_tables, meta.seq_lens, meta.query_start_loc):
        assert t.untyped_storage().data_ptr() == base


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_draft_loop_reads_the_device_once_per_step(monkeypatch, temperature):
    """k = 4 draft tokens for two requests: one device-to-host read in all (was one int()
    per token), and the drafts equal those of a token-by-token greedy/seeded loop."""
    model = _tiny_model()

    def make(seed):
        reqs = []
        for i, prompt in enumerate(([1, 2, 3, 4, 5], [7, 8, 9])):
            params = SamplingParams(temperature=temperature, max_tokens=16, seed=seed + i)
            r = Request(f"r{i}", prompt, params)
            r.num_computed_tokens = len(prompt) - 1
            reqs.append(r)
        return reqs

    proposer = DraftModelProposer(model, _caches(), 32, 16, torch.device("cpu"))
    reqs = make(10)
    gens = {r.request_id: torch.Generator().manual_seed(5 + i) for i, r in enumerate(reqs)}
    guard = HostSyncGuard(strict=False, reads_only=True)
    pause_in_kernels(monkeypatch, guard)
    pause_in_staging(monkeypatch, guard)
    pause_in_cpu_only(monkeypatch, guard)
    with guard:
        drafts = proposer.propose(reqs, {"r0": 4, "r1": 4}, gens)
    assert guard.events == ["tolist"]
    assert sorted(drafts) == ["r0", "r1"] and all(len(d) == 4 for d in drafts.values())
    # reference: feed each request's tokens one forward at a time, eager reference model
    with torch.inference_mode():
        for i, r in enumerate(reqs):
            gen = torch.Generator().manual_seed(5 + i)
            kv = _caches()
            tokens = list(r.prompt_token_ids)
            blocks = [0, 1]
            start, got = 0, []
            for _ in range(4):
                ids, pos, meta, rows = build_batch(
                    [BatchEntry(blocks, start, tokens[start:], "last")], 16, torch.device("cpu"))
                logits = model.compute_logits(model(ids, pos, kv, meta)[rows[0]]).float()
                start = len(tokens)
                if temperature == 0:
                    t = int(logits.argmax(-1))
                else:
                    from localchat.engine.sampler import exponential_race, sampling_probs

                    # the engine's one categorical draw, one row at a time with this
                    # request's generator
                    p = sampling_probs(logits, [r.sampling_params])
                    t = int(exponential_race(p, gen)[0])
                got.append(t)
                tokens.append(t)
            assert drafts[r.request_id] == got


def _llama_like(layers, kv_heads, head_dim, hidden, vocab=128256):
    return ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=vocab, hidden_size=hidden,
        intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // head_dim, num_key_value_heads=kv_heads,
        head_dim=head_dim, rms_norm_eps=1e-5, rope_theta=5e5, max_position_embeddings=131072)


def test_spec_decoding_plans_both_pools_and_activations_before_allocating(monkeypatch):
    """8B-like target + 1B-like draft on a GPU with 12 GiB free after both weights. The old
    sizing gave the target 90% of free memory, then the draft's pool of as many tokens did not
    fit; the plan fits target pool + draft pool + measured activations + graph pool +
    margin into the free bytes, with the same tokens in both pools."""
    from localchat.engine.config import CacheConfig, SchedulerConfig, SpeculativeConfig
    from localchat.engine.memory import kv_pools as kv_plan
    from localchat.engine.memory.footprint import kv_bytes

    GiB = 2**30
    free = 12 * GiB
    target = _llama_like(32, 8, 128, 4096)
    draft = _llama_like(16, 8, 64, 2048)
    measured = {"target": (900 * 2**20, 300 * 2**20), "draft": (1200 * 2**20, 0)}
    seen = []

    def fake_measure(model, model_config, *, decode_batch=0, **kw):
        seen.append((model, decode_batch, kw["num_tokens"], kw["logit_rows"]))
        return measured[model]

    monkeypatch.setattr(kv_plan, "measure_activation_bytes", fake_measure)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 141 * GiB))
    monkeypatch.delenv("LOCALCHAT_CUDA_GRAPHS", raising=False)
    monkeypatch.setattr("localchat.engine.cuda_graphs.graph_unsafe_reason", lambda m: None)
    config = EngineConfig(device="cuda", dtype=torch.bfloat16, cache=CacheConfig(),
                          scheduler=SchedulerConfig(max_num_seqs=4),
                          speculative=SpeculativeConfig(draft_model="d",
                                                        num_speculative_tokens=4))
    new_config, plan = kv_plan.plan_cuda_pools("target", target, "draft", draft, config, 131072)
    bpt = kv_bytes(target, 1, torch.bfloat16)
    draft_bpt = kv_bytes(draft, 1, torch.bfloat16)
    assert bpt == 2 * 32 * 8 * 128 * 2 and draft_bpt == 2 * 16 * 8 * 64 * 2
    assert new_config.cache.num_blocks == plan.num_blocks > 0
    assert plan.kv_bytes == plan.tokens * bpt and plan.draft_kv_bytes == plan.tokens * draft_bpt
    # the larger activation peak of the two models, plus the sampler's logits copies
    assert plan.activation_bytes == 1200 * 2**20 + 4 * 5 * 128256 * 4 * 3
    assert plan.graph_pool_bytes == 300 * 2**20
    assert plan.total_bytes <= free
    assert free - plan.total_bytes < plan.block_size * (bpt + draft_bpt)  # nothing wasted
    assert [s[1] for s in seen] == [32, 0] and seen[0][2] == 2048 and seen[0][3] == 20
    # the old sizing: 90% of free to the target, the draft's same-sized pool on top
    old_tokens = int(free * 0.9) // bpt
    assert int(free * 0.9) + old_tokens * draft_bpt > free


def test_kv_plan_error_names_the_numbers():
    from localchat.engine.memory.kv_pools import KVPlanError, plan_kv_pools

    with pytest.raises(KVPlanError, match="MiB free after the weights"):
        plan_kv_pools(600 * 2**20, bytes_per_token=2**17, activation_bytes=400 * 2**20,
                      wanted_tokens=8192, block_size=16)
    plan = plan_kv_pools(2**30, bytes_per_token=2**10, activation_bytes=0,
                         wanted_tokens=1000, block_size=16)
    assert plan.tokens == 1008  # what was asked, in whole blocks (1000 -> 63 x 16)
