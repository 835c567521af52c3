"""End-to-end decode on a random-weight Llama-3.1-8B-shaped model (no download).

The model is ``localchat.engine.models.llama.LlamaForCausalLM`` built from a ``ModelConfig``
with Llama-3.1-8B's shapes (32 layers, hidden 4096, 32/8 heads, MLP 14336, vocab 128256,
llama3 RoPE scaling), random weights, on the engine's own kernels (Triton on CUDA) and decode
CUDA graphs (``engine.cuda_graphs.CudaGraphRunner``). For each weight format (bf16, fp8, int8, int4:
the decoder projections get ``engine.quant`` linear methods holding random packed weights) it
measures decode tokens/s at each batch size over a ``--context``-token cached prefix, and the
achieved memory bandwidth, (weight bytes + KV bytes read) per step x steps/s, as a percentage
of the copy bandwidth measured in the same run. Also: the same decode without graphs (batch 1),
prefix-cached time to first token (a 64-token turn over a 1984-token cached prefix vs the cold
2048-token prefill), and the cost of a speculative verification step (k + 1 = 5 query rows)
relative to a decode step. Token acceptance, hence speculative speedup, is meaningless with
random weights and is not reported.

Usage: ``python scripts/gpu_bench_e2e.py --out DIR`` on a CUDA machine (writes ``e2e.json``
and ``e2e.md``); ``--tiny --device cpu`` runs a scaled-down model on CPU to check the script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from localchat.engine.attention_metadata import AttentionMetadata
from localchat.engine.config import ModelConfig
from localchat.engine.cuda_graphs import CudaGraphRunner
from localchat.engine.layers.linear import Linear
from localchat.engine.memory.footprint import kv_bytes
from localchat.engine.models.llama import LlamaForCausalLM
from localchat.engine.quant import QuantScheme
from localchat.engine.quant.methods import make_linear_method
from localchat.engine.quant.schemes import fp8_supported

BLOCK = 16
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def model_config(tiny: bool) -> ModelConfig:
    if tiny:
        return ModelConfig("LlamaForCausalLM", vocab_size=1024, hidden_size=256,
                           intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                           num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5,
                           rope_theta=500000.0, max_position_embeddings=8192,
                           rope_scaling=LLAMA3)
    return ModelConfig("LlamaForCausalLM", vocab_size=128256, hidden_size=4096,
                       intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
                       rope_theta=500000.0, max_position_embeddings=131072, rope_scaling=LLAMA3)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(cfg: ModelConfig, dtype, device, max_model_len: int) -> LlamaForCausalLM:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg, max_position=max_model_len)
    finally:
        torch.set_default_dtype(before)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    for m in model.modules():
        if isinstance(m, Linear):
            m.process_weights_after_loading()
    return model.eval()


def quantize_random(model: LlamaForCausalLM, scheme: QuantScheme, device) -> None:
    """Give every decoder projection ``scheme``'s linear method with random packed weights
    (the float weight is dropped); the LM head stays in the float format."""
    gen = torch.Generator(device=device).manual_seed(1)
    for name, m in model.named_modules():
        if not isinstance(m, Linear) or not name.startswith("model.layers."):
            continue
        method = make_linear_method(scheme, device, m.in_features)
        method.create_weights(m, device)
        if scheme is QuantScheme.INT8:
            m.qweight.copy_(torch.randint(-127, 128, m.qweight.shape, generator=gen,
                                          device=device, dtype=torch.int8))
            m.scales.fill_(0.02 / 64)
        elif scheme is QuantScheme.FP8:  # e4m3 values of a unit normal, scale 0.02
            m.qweight.copy_(torch.randn(m.qweight.shape, generator=gen, device=device)
                            .to(torch.float8_e4m3fn))
            m.scales.fill_(0.02)
        else:
            m.qweight.copy_(torch.randint(0, 256, m.qweight.shape, generator=gen,
                                          device=device, dtype=torch.uint8))
            m.scales.fill_(0.02 / 4)
            m.mins.fill_(-7.5 * 0.02 / 4)
        m.quant_method = method
        method.process_weights_after_loading(m)


def weight_bytes_per_step(model: LlamaForCausalLM) -> int:
    """Bytes a decode step reads: every tensor of the decoder layers, the final norm and the LM
    head (the embedding contributes one row per token: ignored; so is the RoPE table)."""
    total = 0
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t is None or "embed_tokens" in name or "cos_sin_cache" in name:
            continue
        total += t.numel() * t.element_size()
    if model.lm_head is None:  # tied: the embedding is read whole by the LM head
        total += model.model.embed_tokens.weight.numel() * \
            model.model.embed_tokens.weight.element_size()
    return total


def copy_peak(device) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second (median of 10)."""
    n = (2**30 if device.type == "cuda" else 2**26) // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(13):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return 2 * n * 4 / statistics.median(times)


class Decoder:
    """Sequences with a random cached prefix in a private block range each."""

    def __init__(self, model, cfg, dtype, device, max_bs, context, steps, max_model_len):
        self.model, self.device = model, device
        self.context, self.steps = context, steps
        self.nb = -(-(context + steps) // BLOCK)
        num_blocks = 1 + max_bs * self.nb  # block 0: padding rows of the graphs
        gen = torch.Generator(device=device).manual_seed(2)
        self.kv_caches = [
            torch.randn(2, num_blocks, BLOCK, cfg.num_kv_heads, cfg.head_dim, generator=gen,
                        device=device).to(dtype) for _ in range(cfg.num_hidden_layers)]
        self.kv_bytes_per_token = kv_bytes(cfg, 1, dtype)
        self.max_blocks = max_model_len // BLOCK

    def blocks(self, i: int) -> list[int]:
        return list(range(1 + i * self.nb, 1 + (i + 1) * self.nb))

    def step_meta(self, bs: int, pos: int) -> AttentionMetadata:
        t = lambda x: torch.tensor(x, dtype=torch.int64, device=self.device)
        tables = [self.blocks(i) for i in range(bs)]
        return AttentionMetadata(
            slot_mapping=t([b[pos // BLOCK] * BLOCK + pos % BLOCK for b in tables]),
            block_tables=t(tables), seq_lens=t([pos + 1] * bs),
            query_start_loc=t(list(range(bs + 1))), max_query_len=1)

    @torch.inference_mode()
    def decode(self, bs: int, runner: CudaGraphRunner | None) -> tuple[float, float]:
        """``(seconds, host seconds)`` for ``steps`` greedy decode steps of ``bs`` sequences
        (metadata prebuilt; the tokens stay on the device): the wall time to the last
        step's end, and the time the host took to issue the steps (the loop before the final
        sync: where it is close to the wall time, the host is the bottleneck)."""
        metas = [self.step_meta(bs, self.context + s) for s in range(self.steps)]
        positions = [torch.full((bs,), self.context + s, dtype=torch.int64, device=self.device)
                     for s in range(self.steps)]
        ids = torch.zeros(bs, dtype=torch.int64, device=self.device)

        def one(s, ids):
            if runner is not None:
                hidden = runner.forward(ids, positions[s], metas[s])
            else:
                hidden = self.model(ids, positions[s], self.kv_caches, metas[s])
            return self.model.compute_logits(hidden).argmax(dim=-1)

        for s in range(min(3, self.steps)):  # warm-up (compiles, caches)
            ids = one(s, ids)
        sync(self.device)
        t0 = time.perf_counter()
        for s in range(self.steps):
            ids = one(s, ids)
        host = time.perf_counter() - t0
        sync(self.device)
        return time.perf_counter() - t0, host

    @torch.inference_mode()
    def prefill_time(self, ctx: int, q_len: int, repeats: int = 3) -> float:
        """Median seconds to run a ``q_len``-token chunk over ``ctx`` cached tokens (sequence
        0's blocks) and sample its last row."""
        total = ctx + q_len
        nb = -(-total // BLOCK)
        table = list(range(1, 1 + nb))
        if nb > len(self.kv_caches[0][0]) - 1:
            raise ValueError("KV pool too small for the TTFT case")
        t = lambda x: torch.tensor(x, dtype=torch.int64, device=self.device)
        meta = AttentionMetadata(
            slot_mapping=t([table[p // BLOCK] * BLOCK + p % BLOCK for p in range(ctx, total)]),
            block_tables=t([table]), seq_lens=t([total]), query_start_loc=t([0, q_len]),
            max_query_len=q_len)
        ids = torch.randint(0, 1000, (q_len,), device=self.device)
        pos = torch.arange(ctx, total, device=self.device)
        times = []
        for i in range(repeats + 1):
            sync(self.device)
            t0 = time.perf_counter()
            hidden = self.model(ids, pos, self.kv_caches, meta)
            self.model.compute_logits(hidden[-1:]).argmax(dim=-1)
            sync(self.device)
            if i:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="scaled-down model (script check)")
    ap.add_argument("--schemes", default="bf16,fp8,int8,int4",
                    help="fp8 is skipped on a GPU below compute capability 8.9 (on CPU it "
                         "runs the dequantizing fallback, to check the script)")
    ap.add_argument("--batch-sizes", default="1,16")
    ap.add_argument("--context", type=int, default=512, help="cached tokens per sequence")
    ap.add_argument("--steps", type=int, default=64, help="timed decode steps")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_bench_e2e: error: CUDA is not available", file=sys.stderr)
        return 2
    dtype = torch.bfloat16
    cfg = model_config(args.tiny)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"workload: random-weight {'tiny' if args.tiny else 'Llama-3.1-8B'}-shaped model, "
          f"bf16 activations, decode of {args.steps} tokens after {args.context} cached, batch "
          f"{batch_sizes}, device {name}, torch {torch.__version__}", flush=True)
    peak = copy_peak(device)
    print(f"copy peak: {peak / 1e9:.1f} GB/s (read + write)", flush=True)
    model = build_model(cfg, dtype, device, args.max_model_len)
    dec = Decoder(model, cfg, dtype, device, max(batch_sizes), args.context, args.steps,
                  args.max_model_len)
    rows: list[dict] = []
    extra: dict[str, object] = {}

    def write(final: bool) -> None:
        """(Re)write e2e.json/.md from the rows so far: a stage cut short keeps the formats
        it finished."""
        md = [("| weights | batch | CUDA graphs | tok/s | ms/step | host ms/step | weight GB "
               "| GB/s | % of copy peak |"), "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            md.append(f"| {r['weights']} | {r['batch']} | {'yes' if r['graphs'] else 'no'} | "
                      f"{r['tok_per_s']:.1f} | {r['ms_per_step']:.2f} | "
                      f"{r['host_ms_per_step']:.2f} | {r['weight_GB']:.2f} | "
                      f"{r['GB_per_s']:.0f} | {r['pct_of_copy_peak']:.0f} |")
        md.append("")
        md.append(f"Copy peak {peak / 1e9:.0f} GB/s. " + (
            f"TTFT ({extra['ttft_prompt_tokens']} tokens): cold {extra['ttft_cold_ms']:.1f} "
            f"ms, "
            f"64-token turn over a cached prefix {extra['ttft_prefix_cached_ms']:.1f} ms. "
            f"Speculative verification (k=4) costs {extra['verify_k4_over_decode_step']:.2f} "
            f"decode steps; speculative speedup: not available (random weights)."
            if extra else ""))
        result = {"device": name, "torch": torch.__version__, "copy_peak_GBps": peak / 1e9,
                  "model": "tiny" if args.tiny else "Llama-3.1-8B shapes", "rows": rows,
                  **extra}
        if final:
            print("\n".join(md))
            print(json.dumps(result))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "e2e.json").write_text(json.dumps(result, indent=1))
            (args.out / "e2e.md").write_text("\n".join(md) + "\n")

    for scheme_name in args.schemes.split(","):
        scheme = {"bf16": QuantScheme.NONE, "fp8": QuantScheme.FP8, "int8": QuantScheme.INT8,
                  "int4": QuantScheme.INT4}[scheme_name]
        if scheme is QuantScheme.FP8 and device.type == "cuda" and not fp8_supported(device):
            print("  fp8   skipped: needs compute capability 8.9+", flush=True)
            continue
        if scheme is not QuantScheme.NONE:
            quantize_random(model, scheme, device)
        wbytes = weight_bytes_per_step(model)
        runner = CudaGraphRunner(model, dec.kv_caches, dec.max_blocks, batch_sizes, device)
        t0 = time.perf_counter()
        runner.capture()
        capture_s = time.perf_counter() - t0
        modes = [(bs, runner) for bs in batch_sizes]
        if scheme is QuantScheme.NONE:
            modes.append((batch_sizes[0], None))
        for bs, r in modes:
            sec, host_sec = dec.decode(bs, r)
            avg_len = args.context + args.steps / 2
            step_bytes = wbytes + bs * avg_len * dec.kv_bytes_per_token
            bw = step_bytes * args.steps / sec
            graphs = r is not None and r.use_graphs  # CPU: padded buffers, no graphs
            row = {"weights": scheme_name, "batch": bs, "graphs": graphs,
                   "tok_per_s": bs * args.steps / sec, "ms_per_step": 1e3 * sec / args.steps,
                   "host_ms_per_step": 1e3 * host_sec / args.steps,
                   "weight_GB": wbytes / 1e9, "GB_per_s": bw / 1e9,
                   "pct_of_copy_peak": 100 * bw / peak, "capture_s": capture_s}
            rows.append(row)
            print(f"  {scheme_name:5s} batch {bs:3d} graphs {graphs!s:5s} "
                  f"{row['tok_per_s']:9.1f} tok/s {row['ms_per_step']:8.2f} ms/step "
                  f"(host {row['host_ms_per_step']:.2f}) "
                  f"{row['GB_per_s']:8.1f} GB/s {row['pct_of_copy_peak']:5.1f}% of copy peak",
                  flush=True)
        if scheme is QuantScheme.NONE:
            ctx_total = min(2048, (dec.nb * max(batch_sizes)) * BLOCK - BLOCK)
            cold = dec.prefill_time(0, ctx_total)
            cached = dec.prefill_time(ctx_total - 64, 64)
            decode_step = rows[0]["ms_per_step"] / 1e3
            verify = dec.prefill_time(args.context, 5)
            extra = {"ttft_cold_ms": 1e3 * cold, "ttft_prefix_cached_ms": 1e3 * cached,
                     "ttft_prompt_tokens": ctx_total, "ttft_speedup": cold / cached,
                     "verify_k4_ms": 1e3 * verify,
                     "verify_k4_over_decode_step": verify / decode_step,
                     "speculative_speedup": "not available (random weights: acceptance is "
                                            "meaningless)"}
            print(f"  TTFT {ctx_total} tokens: cold {extra['ttft_cold_ms']:.1f} ms, 64-token "
                  f"turn over a cached prefix {extra['ttft_prefix_cached_ms']:.1f} ms "
                  f"({extra['ttft_speedup']:.1f}x); verify k=4 costs "
                  f"{extra['verify_k4_over_decode_step']:.2f} graph decode steps (eager)",
                  flush=True)
        del runner
        write(final=False)
    write(final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
