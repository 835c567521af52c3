// Shared declarations of the CPU attention / norm / rope / SiLU kernels (no torch headers:
// the ISA translation units attn_{scalar,avx2,avx512}.cpp include only this file, their
// intrinsics and attn_kernels.h).
//
// Contracts: localchat.kernels.reference (paged_attention_decode, rms_norm,
// fused_add_rms_norm, apply_rope, silu_and_mul). Element types: 0 fp32, 1 bf16, 2 fp16 (16-bit
// types passed as raw uint16_t bits). All arithmetic is fp32; every output element is computed
// by one thread in an order fixed by its own row, so results depend neither on the thread
// count nor on the other rows / sequences of the batch (batch invariance).
#pragma once
#include <cstdint>

namespace localchat_cpu {

enum ElemType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Paged decode attention, one task per (sequence, kv head). Strides in elements; the last dim
// of query / caches / out is contiguous.
struct DecodeArgs {
  const void* query;  // [S, H, D]
  int64_t q_s0, q_s1;
  const void* key_cache;  // [num_blocks, block_size, H_kv, D]
  const void* value_cache;
  int64_t k_s0, k_s1, k_s2, v_s0, v_s1, v_s2;
  const int64_t* block_tables;  // [rows, max_blocks] int64, row stride bt_s0
  int64_t bt_s0;
  const int64_t* bt_row;    // [S]: block-table row of each query row; nullptr = the row itself
  const int64_t* seq_lens;  // [S] tokens each query row attends to
  void* out;                // [S, H, D] contiguous
  int64_t num_heads, num_kv_heads, head_dim, block_size;
  float scale;
  int dtype;        // of query and out
  int cache_dtype;  // of the caches: dtype, or 16-bit under an fp32 query
  // Partitioned tasks (see decode_task_t): tasks [n_tasks, 3] = (seq, kv head, partition),
  // ordered by seq, then kv head, then partition; seq_task0 [S] = index of each sequence's
  // first task; partials [n_tasks, G, D + 2] fp32 scratch (accumulators, max, denominator).
  const int64_t* tasks;
  const int64_t* seq_task0;
  float* partials;
};

// Columns per SiLU task.
constexpr int64_t kSiluBlock = 1024;

// Tokens per decode-attention partition (fixed: results depend only on each sequence).
constexpr int64_t kDecodePart = 128;

// RMSNorm over rows (optionally after a residual add). x, residual, out, res_out: [rows, hidden]
// contiguous, weight [hidden] of the same element type.
struct NormArgs {
  const void* x;
  const void* residual;  // nullptr: plain rms_norm
  const void* weight;
  void* out;
  void* res_out;  // x + residual (rounded to the element type); nullptr when residual is
  int64_t hidden;
  float eps;
  int dtype;
};

// Neox-style rotary embedding, one task per token. q/k: [T, H, D] with row strides; outputs
// contiguous [T, H, D]; cos_sin_cache [max_pos, D] fp32 (cos | sin halves).
struct RopeArgs {
  const int64_t* positions;
  const void* q;
  int64_t q_s0, q_s1;
  const void* k;
  int64_t k_s0, k_s1;
  void* q_out;
  void* k_out;
  const float* cos_sin;
  int64_t num_heads, num_kv_heads, head_dim;
  int dtype;
};

// out[t, i] = silu(x[t, i]) * x[t, I + i]; x [T, 2I] (row stride x_s0), out [T, I] contiguous.
struct SiluArgs {
  const void* x;
  int64_t x_s0;
  void* out;
  int64_t inter;
  int dtype;
};

struct AttnKernels {
  void (*decode)(const DecodeArgs&, int64_t task0, int64_t task1);
  void (*decode_combine)(const DecodeArgs&, int64_t pair0, int64_t pair1);
  void (*norm)(const NormArgs&, int64_t row0, int64_t row1);
  void (*rope)(const RopeArgs&, int64_t tok0, int64_t tok1);
  void (*silu_mul)(const SiluArgs&, int64_t task0, int64_t task1);  // (row, column block)
};

const AttnKernels& attn_kernels_scalar();
const AttnKernels& attn_kernels_avx2();
const AttnKernels& attn_kernels_avx512();
// The AVX-512 decode tasks with vdpbf16ps scores (attn_dot.cpp; bf16 only, CPUs with
// AVX512_BF16).
void attn_decode_dot(const DecodeArgs& a, int64_t task0, int64_t task1);

// Largest supported head_dim and query heads per kv head (stack buffers of the decode task).
constexpr int64_t kMaxHeadDim = 256;
constexpr int64_t kMaxGroup = 16;

}  // namespace localchat_cpu
