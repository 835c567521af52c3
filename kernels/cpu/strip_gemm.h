// The AMX prefill GEMM's checking launcher (strip_gemm.cpp), shared by the layouts' ops
// (ops.cpp int4, dequant_ops.cpp int8, plane_ops.h int5 / int6): each passes its row
// dequantization as a RowFill (amx.h). Torch headers allowed (launcher side).
#pragma once
#include <ATen/ATen.h>

#include "amx.h"

namespace localchat_cpu {

// x [M, K] bf16 (contiguous) @ w.T for the weight w [N, K] that `fill` dequantizes to bf16:
// [M, N] bf16 (fp32 accumulation, one rounding at the end). Raises (TORCH_CHECK, naming
// `op`) unless amx_bf16_ready(), x is a contiguous 2-D bf16 tensor of K columns and
// K % 32 == 0. Strip pairs (32 weight rows) split over the torch thread pool.
at::Tensor strip_gemm(const char* op, const at::Tensor& x, int64_t N, int64_t K, RowFillFn fill,
                      const void* ctx);

}  // namespace localchat_cpu
