"""Quality probes for weight formats: teacher-forced logits, top-1 agreement, perplexity.

Used by the quantization tests and ``scripts/bench_quant.py`` to compare a quantized model with
the unquantized one on the same text (one teacher-forced forward pass each).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..attention_metadata import AttentionMetadata
from ..kv_cache import allocate_kv_caches

_BLOCK_SIZE = 16

# A fixed English text (about 290 SmolLM2 tokens) for agreement and perplexity probes.
EVAL_TEXT = (
    "The history of computing is a story of abstraction. Early machines were programmed by "
    "rewiring panels and flipping switches; each new problem meant a new physical arrangement "
    "of cables. Stored-program computers changed that: instructions became data, kept in the "
    "same memory as the numbers they worked on, and a machine could load a different program "
    "in seconds. Assembly languages gave names to opcodes and addresses, and compilers for "
    "languages such as Fortran and COBOL let scientists and clerks describe what they wanted "
    "rather than how the hardware should do it. Operating systems took over the scheduling of "
    "jobs, the sharing of memory and the handling of files, so that many people could use one "
    "computer at once without stepping on each other. Later, personal computers put a whole "
    "machine on a desk, networks joined them together, and the web turned the network into a "
    "library that anyone could read and write. Each layer hid the details of the one below, "
    "and each made it possible for more people to build more ambitious things. Today a small "
    "language model can run on a laptop, answering questions, summarising documents and "
    "writing code, while its user never sees the matrix products that make every token. "
    "Memory bandwidth, not arithmetic, decides how fast such a model speaks: every new token "
    "reads every weight once, so smaller weights mean faster answers."
)


@torch.inference_mode()
def teacher_forced_logits(model, token_ids: list[int], chunk: int | None = None) -> torch.Tensor:
    """Teacher-forced logits of ``token_ids`` (one sequence, a fresh paged KV cache) through
    ``model`` (a ``LlamaForCausalLM``): one prefill, or with ``chunk`` successive forwards of
    at most ``chunk`` tokens over the cached prefix (``chunk <= 16``: the rows take the
    decode / draft-verification kernels, as generation does). Returns fp32 logits
    ``[len(token_ids), vocab_size]`` on CPU: row ``i`` predicts token ``i + 1``."""
    config = model.config
    n = len(token_ids)
    num_blocks = max(1, -(-n // _BLOCK_SIZE))
    # the activation dtype: the final norm's (quantized layouts may keep fp16 scales)
    first = model.model.norm.weight
    device = first.device
    kv_caches = allocate_kv_caches(
        config.num_hidden_layers, num_blocks, _BLOCK_SIZE, config.num_kv_heads,
        config.head_dim, first.dtype, device,
    )
    step = chunk or n
    out = []
    for start in range(0, n, step):
        end = min(n, start + step)
        meta = AttentionMetadata(
            slot_mapping=torch.arange(start, end, device=device),
            block_tables=torch.arange(num_blocks, device=device)[None],
            seq_lens=torch.tensor([end], device=device),
            query_start_loc=torch.tensor([0, end - start], device=device),
            max_query_len=end - start,
        )
        ids = torch.tensor(token_ids[start:end], device=device)
        hidden = model(ids, torch.arange(start, end, device=device), kv_caches, meta)
        out.append(model.compute_logits(hidden).float().cpu())
    return torch.cat(out)


def top1_agreement(logits: torch.Tensor, reference: torch.Tensor) -> float:
    """Fraction of rows of ``logits [n, vocab]`` whose argmax equals ``reference``'s."""
    return (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()


def perplexity(logits: torch.Tensor, token_ids: list[int]) -> float:
    """``exp`` of the mean next-token cross entropy of ``logits [n, vocab]`` (row ``i``
    predicting ``token_ids[i + 1]``) over the ``n - 1`` predicted tokens."""
    target = torch.tensor(token_ids[1:])
    return math.exp(F.cross_entropy(logits[:-1].float(), target).item())
