"""``CudaGraphRunner``: a decode step through the padded static buffers (a graph replay on CUDA,
the same buffers run eagerly on CPU) equals the model's eager forward on the unpadded batch,
hidden states and KV caches alike (padding rows write nothing); steps that do not fit fall
back to eager. A tiny random Llama (fp32) runs on the reference kernels on CPU; on a GPU the
test runs there with the Triton kernels and real graphs.

The CPU capture check (``test_capture_and_replay_are_free_of_host_syncs``) runs ``capture``
and replayed decode steps with ``torch.cuda``'s graph/stream API faked and the Triton
launchers stubbed, under ``host_sync_guard.HostSyncGuard``: any ``.item()``, ``.tolist()``,
``bool()``, ``int()`` or host tensor creation inside a captured region fails the test.
"""

from __future__ import annotations

import pytest
import torch

from localchat.engine.attention_metadata import AttentionMetadata
from localchat.engine.config import ModelConfig
from localchat.engine.cuda_graphs import CudaGraphRunner
from localchat.engine.models.llama import LlamaForCausalLM

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BLOCK_SIZE = 16
NUM_BLOCKS = 24
MAX_BLOCKS = 4  # static block-table width: 64-token context


@pytest.fixture(scope="module")
def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="module")
def model(device):
    return _make_model(device)


def _make_model(device, max_position: int = 256):
    config = ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=128, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=max_position,
    )
    torch.manual_seed(0)
    with torch.device(device):
        m = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    return m.eval()


def _meta(seqs, positions, device, width=None):
    """Metadata for one new token per sequence; ``seqs`` = list of block-id lists."""
    width = width or max(len(b) for b in seqs)
    slots = [b[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for b, p in zip(seqs, positions)]
    tables = [b + [0] * (width - len(b)) for b in seqs]
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=device)
    return AttentionMetadata(slot_mapping=t(slots), block_tables=t(tables),
                             seq_lens=t([p + 1 for p in positions]),
                             query_start_loc=t(list(range(len(seqs) + 1))), max_query_len=1)


def _prefill(model, kv_caches, blocks, lengths, device):
    gen = torch.Generator().manual_seed(1)
    ids, pos, slots, qsl = [], [], [], [0]
    for b, n in zip(blocks, lengths):
        ids += torch.randint(0, 128, (n,), generator=gen).tolist()
        pos += list(range(n))
        slots += [b[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(n)]
        qsl.append(qsl[-1] + n)
    width = max(len(b) for b in blocks)
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=device)
    meta = AttentionMetadata(slot_mapping=t(slots),
                             block_tables=t([b + [0] * (width - len(b)) for b in blocks]),
                             seq_lens=t(lengths), query_start_loc=t(qsl),
                             max_query_len=max(lengths))
    with torch.inference_mode():
        model(t(ids), t(pos), kv_caches, meta)


def _caches(device):
    torch.manual_seed(3)
    return [torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, 2, 16, device=device) for _ in range(2)]


def test_padded_decode_equals_eager(model, device):
    blocks = [[3, 7], [1], [10, 2, 5], [0, 12]]
    lengths = [20, 9, 40, 17]
    eager_kv = _caches(device)
    _prefill(model, eager_kv, blocks, lengths, device)
    graph_kv = [c.clone() for c in eager_kv]
    runner = CudaGraphRunner(model, graph_kv, MAX_BLOCKS, batch_sizes=(1, 2, 4, 8),
                             device=device)
    runner.capture()
    gen = torch.Generator().manual_seed(2)
    positions = list(lengths)
    # 3 sequences (padded to 4), then 1 (padded rows of the earlier step must be reset), then
    # all 4 (exactly a captured size); block tables narrower than the static width.
    for active in ([0, 2, 3], [1], [0, 1, 2, 3], [2, 0]):
        seqs = [blocks[i] for i in active]
        pos = [positions[i] for i in active]
        ids = torch.randint(0, 128, (len(active),), generator=gen).to(device)
        pos_t = torch.tensor(pos, dtype=torch.int64, device=device)
        meta = _meta(seqs, pos, device)
        assert runner.can_replay(ids, meta)
        before = [c.clone() for c in graph_kv]
        with torch.inference_mode():
            expected = model(ids, pos_t, eager_kv, meta)
        got = runner.forward(ids, pos_t, meta)
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        for a, b, old in zip(graph_kv, eager_kv, before):
            # the written slots agree (up to GEMM rounding at another batch shape) ...
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
            # ... and every slot the eager step left alone is bit-identical (padding wrote
            # nothing)
            untouched = (b == old).all(dim=-1)
            assert torch.equal(a[untouched], old[untouched])
        for i in active:
            positions[i] += 1


def test_steps_that_do_not_fit_run_eagerly(model, device):
    blocks = [[3], [1], [10]]
    eager_kv = _caches(device)
    _prefill(model, eager_kv, blocks, [4, 5, 6], device)
    graph_kv = [c.clone() for c in eager_kv]
    runner = CudaGraphRunner(model, graph_kv, MAX_BLOCKS, batch_sizes=(1, 2), device=device)
    runner.capture()
    ids = torch.tensor([5, 6, 7], device=device)
    pos = torch.tensor([4, 5, 6], device=device)
    meta = _meta(blocks, [4, 5, 6], device)
    assert not runner.can_replay(ids, meta)  # 3 sequences > largest captured size 2
    with pytest.raises(ValueError, match="decode step"):
        runner.replay(ids, pos, meta)
    with torch.inference_mode():
        expected = model(ids, pos, eager_kv, meta)
    torch.testing.assert_close(runner.forward(ids, pos, meta), expected, atol=1e-6, rtol=1e-6)
    wide = _meta([[3, 0, 0, 0, 0]], [4], device)  # wider than the static block table
    assert not runner.can_replay(ids[:1], wide)


def test_rejects_empty_batch_sizes(model, device):
    with pytest.raises(ValueError, match="batch_sizes"):
        CudaGraphRunner(model, _caches(device), MAX_BLOCKS, batch_sizes=(), device=device)


# -- the CPU capture check ---------------------------------------------------------------------


class _FakeGraph:
    """Stands in for ``torch.cuda.CUDAGraph``: ``replay`` re-runs the captured step over the
    static buffers (what a replay executes) under the strict host-sync guard."""

    runner = None
    guard = None

    def replay(self):
        runner = _FakeGraph.runner
        key = next(k for k, g in runner.graphs.items() if g is self)
        with _FakeGraph.guard:
            out = runner._run_static(*key)
        runner.outputs[key].copy_(out)


class _FakeStream:
    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other):
        pass


@pytest.fixture
def fake_cuda_graphs(monkeypatch):
    """``torch.cuda``'s graph and stream API faked; the Triton launchers stubbed by the
    reference kernels with the guard paused (the launchers read no device values: their
    arguments are shapes and strides); ``LOCALCHAT_KERNELS=triton`` so that the model's CPU
    tensors take the Triton dispatch. Yields the strict guard, active inside every captured
    region and every replay."""
    import contextlib
    import types

    from localchat import kernels
    from localchat.kernels import reference

    from .host_sync_guard import KERNEL_OPS, HostSyncGuard

    pytest.importorskip("triton")
    guard = HostSyncGuard(strict=True)
    captures = []

    @contextlib.contextmanager
    def graph(g, pool=None, stream=None):
        captures.append(g)
        with guard:
            yield

    def stub(name):
        def op(*args, max_seq_len=None, max_query_len=None, **kwargs):
            with guard.pause():
                return getattr(reference, name)(*args, **kwargs)
        return op

    stubs = types.SimpleNamespace(**{name: stub(name) for name in KERNEL_OPS})
    monkeypatch.setenv("LOCALCHAT_KERNELS", "triton")
    kernels.triton_available.cache_clear()
    monkeypatch.setattr(kernels, "_triton", lambda module: stubs)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    _FakeGraph.guard = guard
    yield guard, captures
    kernels.triton_available.cache_clear()
    _FakeGraph.runner = _FakeGraph.guard = None


def test_capture_and_replay_are_free_of_host_syncs(fake_cuda_graphs):
    """``CudaGraphRunner.capture`` and replayed decode steps (through the model runner's
    packed host batch) never read a device value or create a host tensor inside the captured
    region, and the replays equal the eager model; a step past the first length bucket is
    captured on first use (its own split-K launch parameters)."""
    from localchat.engine.step_inputs import BatchEntry, StagingBuffers, flatten_batch

    guard, captures = fake_cuda_graphs
    device = torch.device("cpu")
    model = _make_model(device, max_position=512)
    wide = 24  # static table of 24 blocks = 384 tokens: buckets 256 and 384
    blocks = [[3, 7], [1], list(range(4, 22))]
    lengths = [20, 9, 270]
    eager_kv = [torch.zeros(2, 32, BLOCK_SIZE, 2, 16) for _ in range(2)]
    _prefill(model, eager_kv, blocks, lengths, device)
    graph_kv = [c.clone() for c in eager_kv]
    runner = CudaGraphRunner(model, graph_kv, wide, batch_sizes=(1, 2, 4), device=device,
                             use_graphs=True)
    _FakeGraph.runner = runner
    runner.capture()
    assert sorted(runner.graphs) == [(1, 256), (2, 256), (4, 256)] and len(captures) == 3
    staging = StagingBuffers(device)
    gen = torch.Generator().manual_seed(2)
    positions = list(lengths)
    for active in ([0, 1], [1], [0, 1, 2], [2]):
        entries = [BatchEntry(blocks[i], positions[i],
                              [int(torch.randint(0, 128, (1,), generator=gen))], "last")
                   for i in active]
        hb = flatten_batch(entries, BLOCK_SIZE)
        assert runner.can_replay_batch(hb)
        ids, pos, meta, _ = staging.to_device(hb)
        with torch.inference_mode():
            expected = model(ids, pos, eager_kv, meta)
        got, index = runner.replay_batch(hb, staging, [0])
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        assert index.tolist() == [0]
        for a, b in zip(graph_kv, eager_kv):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        for i in active:
            positions[i] += 1
    assert (4, 384) in runner.graphs and (1, 384) in runner.graphs  # captured on first use
    assert len(captures) == 5 and guard.events == []


def test_capture_check_fails_on_a_host_read(fake_cuda_graphs):
    """The capture check can fail: a model that reads ``seq_lens`` on the host (what the
    PyTorch reference attention does) is refused inside the captured region."""
    from .host_sync_guard import HostSyncError

    class Reading(LlamaForCausalLM):
        def forward(self, input_ids, positions, kv_caches, attn_metadata):
            int(attn_metadata.seq_lens.max())
            return super().forward(input_ids, positions, kv_caches, attn_metadata)

    model = _make_model(torch.device("cpu"))
    model.__class__ = Reading
    runner = CudaGraphRunner(model, _caches(torch.device("cpu")), MAX_BLOCKS, batch_sizes=(1,),
                             device=torch.device("cpu"), use_graphs=True)
    _FakeGraph.runner = runner
    with pytest.raises(HostSyncError, match="__int__"):
        runner.capture()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU-only: real graphs at 8B shapes")
@pytest.mark.parametrize("scheme", ["none", "fp8", "int8", "int4"])
def test_graph_replay_equals_eager_at_8b_shapes(scheme):
    """Llama-3.1-8B layer shapes (2 layers), every weight format: a replayed decode step at
    batch 1 and 16 (Triton kernels, real CUDA graphs, a 300-token context) equals the eager
    step with the same length bucket."""
    from localchat.engine.attention_metadata import seq_len_bucket
    from localchat.engine.layers.linear import Linear
    from localchat.engine.quant.methods import make_linear_method
    from localchat.engine.quant.schemes import QuantScheme, fp8_supported

    if scheme == "fp8" and not fp8_supported("cuda"):
        pytest.skip("fp8 needs compute capability 8.9+")
    dev = torch.device("cuda")
    cfg = ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=32000, hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
        max_position_embeddings=4096)
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(dev):
            m = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(old)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.fill_(1.0) if "norm" in name else p.normal_(0, 0.02)
    if scheme != "none":
        for name, layer in m.named_modules():
            if isinstance(layer, Linear) and name.startswith("model.layers."):
                method = make_linear_method(QuantScheme(scheme), dev, layer.in_features, 128)
                method.quantize_weights(layer)
                layer.quant_method = method
                method.process_weights_after_loading(layer)
    ctx, nb = 300, 20
    num_blocks = 1 + 16 * nb
    kv = [torch.randn(2, num_blocks, BLOCK_SIZE, 8, 128, device=dev, dtype=torch.bfloat16)
          for _ in range(2)]
    eager_kv = [c.clone() for c in kv]
    runner = CudaGraphRunner(m, kv, 4096 // BLOCK_SIZE, batch_sizes=(1, 16), device=dev)
    runner.capture()
    for bs in (1, 16):
        blocks = [list(range(1 + i * nb, 1 + (i + 1) * nb)) for i in range(bs)]
        meta = _meta(blocks, [ctx] * bs, dev)
        meta.max_seq_len = seq_len_bucket(ctx + 1)
        ids = torch.randint(0, 32000, (bs,), device=dev)
        pos = torch.full((bs,), ctx, dtype=torch.int64, device=dev)
        with torch.inference_mode():
            want = m(ids, pos, eager_kv, meta).float()
        got = runner.forward(ids, pos, meta).float()
        assert runner.graphs  # really replayed
        err = (got - want).abs().max().item()
        assert err <= 1e-2 * want.abs().max().item(), err
