// The optional source-row permutation of the GGUF repack ops (repack_ops.cpp, qa6_ops.cpp):
// output row r takes source row rows[r] (e.g. llama's Q/K unpermute).
#pragma once
#include <ATen/ATen.h>

namespace localchat_cpu {

// Checks `rows` (int64 [N], each in [0, S), S the source rows `raw_bytes` hold) and returns
// its data, kept alive in `keep`; without it S must equal N and the result is nullptr.
// Raises (TORCH_CHECK, naming `op`) otherwise.
inline const int64_t* checked_source_rows(const char* op, const c10::optional<at::Tensor>& rows,
                                          int64_t N, int64_t S, int64_t raw_bytes,
                                          at::Tensor& keep) {
  if (!(rows.has_value() && rows->defined())) {
    TORCH_CHECK(S == N, op, ": ", raw_bytes, " bytes hold ", S, " rows, the output ", N);
    return nullptr;
  }
  TORCH_CHECK(rows->scalar_type() == at::kLong && rows->dim() == 1 && rows->numel() == N, op,
              ": rows must be int64 [", N, "], got ", rows->sizes(), " ", rows->scalar_type());
  keep = rows->contiguous();
  const int64_t* rp = keep.data_ptr<int64_t>();
  for (int64_t r = 0; r < N; ++r)
    TORCH_CHECK(rp[r] >= 0 && rp[r] < S, op, ": rows[", r, "]=", rp[r], " outside the ", S,
                " source rows");
  return rp;
}

}  // namespace localchat_cpu
