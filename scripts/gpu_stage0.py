"""GPU check stage 0: versions, the device (SM count, L2 size, compute capability), and one
batch-1 eager decode step of a 2-layer Llama-3.1-8B-shaped model through the model runner's
host path (packed pinned copy, model, logits, greedy pick) under
``torch.cuda.set_sync_debug_mode("error")``: any hidden device-to-host sync raises. The one
intended read of the sampled token happens after the mode is reset.

Usage: ``python scripts/gpu_stage0.py --out DIR`` (writes ``stage0.json``); ``--device cpu``
runs the same step on CPU (to check the script; no sync check there).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small shapes (script check on CPU)")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    device = torch.device(args.device)
    info: dict = {"python": platform.python_version(), "torch": torch.__version__,
                  "cuda": torch.version.cuda}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(name=p.name, sm_count=p.multi_processor_count,
                    capability=list(torch.cuda.get_device_capability(device)),
                    l2_bytes=getattr(p, "L2_cache_size", None), memory_bytes=p.total_memory)
    from localchat.engine.config import ModelConfig
    from localchat.engine.kv_cache import allocate_kv_caches
    from localchat.engine.model_runner import ModelRunner
    from localchat.engine.models.llama import LlamaForCausalLM
    from localchat.engine.quant.schemes import default_float_dtype
    from localchat.engine.step_inputs import BatchEntry, flatten_batch

    dtype = default_float_dtype(device) if device.type == "cuda" else torch.float32
    if args.tiny:
        cfg = ModelConfig("LlamaForCausalLM", vocab_size=512, hidden_size=128,
                          intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5,
                          rope_theta=500000.0, max_position_embeddings=4096)
    else:
        cfg = ModelConfig("LlamaForCausalLM", vocab_size=128256, hidden_size=4096,
                          intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
                          num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
                          rope_theta=500000.0, max_position_embeddings=4096)
    torch.manual_seed(0)
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # as the loader builds it: the RoPE table stays fp32
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(old_dtype)
    for p_ in model.parameters():
        p_.data.normal_(0, 0.02)
    kv = allocate_kv_caches(cfg.num_hidden_layers, 64, 16, cfg.num_kv_heads, cfg.head_dim,
                            dtype, device)
    runner = ModelRunner(model, kv, 16, device)
    prompt = list(range(1, 200))
    with torch.inference_mode():
        hb = flatten_batch([BatchEntry(list(range(13)), 0, prompt, "last")], 16)
        runner._forward(hb, [len(prompt) - 1])  # prefill (and Triton compiles), syncs allowed
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step = flatten_batch([BatchEntry(list(range(13)), len(prompt), [7], "last")], 16)
        runner._forward(step, [0])  # warm the decode kernels
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.set_sync_debug_mode("error")
        try:
            hidden, _ = runner._forward(step, [0])
            token = model.compute_logits(hidden[:1]).argmax(dim=-1)
            info["decode_sync_free"] = True
        except RuntimeError as e:
            info["decode_sync_free"] = False
            info["sync_error"] = str(e).splitlines()[0]
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode(0)
        if info["decode_sync_free"]:
            info["token"] = int(token[0])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stage0.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1))
    return 0 if info["decode_sync_free"] else 1


if __name__ == "__main__":
    sys.exit(main())
