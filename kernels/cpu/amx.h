// AMX (Advanced Matrix Extensions) bf16 GEMM for the prefill of quantized layers: shared
// declarations (no torch headers; the AMX translation unit amx_bf16.cpp includes only this
// file and <immintrin.h>; the checking launcher is strip_gemm.cpp).
//
// out[m, n] = sum_k x[m, k] * w[n, k] for bf16 activations x [M, K] and a quantized weight
// w [N, K] that a RowFill dequantizes (to bf16) 32 rows at a time into a strip buffer that
// stays in the core's cache: the weight is read from memory once, in its quantized form, and
// never written back as floats (the oneDNN route dequantizes whole layers into a scratch in
// memory and reads them again). The strip's two 16-row halves are the A operands of
// `tdpbf16ps` (16 weight rows x 32 k each), the activations, packed once per call in bf16
// pairs, its B operands (32 k x 16 activation rows), so each C tile (16 weight rows x 16
// activation rows, fp32) accumulates over all of K before it is stored, transposed, into
// out. Products of bf16 pairs summed in fp32 (the hardware's order: pairs, then k-steps of 32
// in order), so the values are those of any fp32-accumulating bf16 GEMM within fp32 rounding;
// no batch invariance is claimed (decode rows take the integer-dot kernels, qa8.h).
// Design after Intel's AMX programming reference (Intel 64 and IA-32 Architectures
// Optimization Reference Manual, ch. 20) and oneDNN's brgemm; own code.
#pragma once
#include <cstdint>

namespace localchat_cpu {

// Rows [r0, r1) of the weight (r1 - r0 <= 32) dequantized to bf16 bits into rows 0..r1-r0-1
// of `rows` (row stride K elements). A plain function pointer and context, not a
// std::function: the AMX translation unit must not emit inline library code that a
// translation unit for an older ISA could link against.
using RowFillFn = void (*)(const void* ctx, int64_t r0, int64_t r1, uint16_t* rows);

struct AmxGemmArgs {
  // packed activations, bf16 pairs: xp[((s * Mt + t) * 16 + p) * 16 + i] = (x[16 t + i, 32 s
  // + 2 p], x[16 t + i, 32 s + 2 p + 1]) for k-step s, row tile t, pair p, row i (zero past M)
  const uint32_t* xp;
  int64_t M, N, K;     // K % 32 == 0
  void* out;           // [M, N] fp32, or bf16 bits when out_bf16
  bool out_bf16;
  RowFillFn fill;
  const void* fill_ctx;
};

// Whether this CPU and OS run AMX bf16 tiles (CPUID AMX-TILE + AMX-BF16 + AVX512-BF16, and
// the kernel grants this process the tile data state: arch_prctl ARCH_REQ_XCOMP_PERM).
// Decided once per process (strip_gemm.cpp, compiled for the baseline ISA); false where the
// compiler had no AMX support (amx_bf16_built()).
bool amx_bf16_ready();

// Whether amx_bf16.cpp was compiled with the AMX kernel (a compiler with AMX intrinsics, x86-64).
bool amx_bf16_built();

// Rows of an int4 weight with groups of 32 (q uint8 [rows, K / 2], low nibble = even k; s, m
// [rows, K / 32], the group's scale and min, fp32 or fp16 bits when half) dequantized to bf16
// into out [rows, K]: per group a 16-entry table fma(v, s, m) rounded to bf16
// (vcvtne2ps2bf16: nearest even, as int4_dequantize's bf16 output, denormals flushed as the
// tile unit flushes them anyway), then one vpermw per 32 weights. For the AMX fill only
// (needs AVX512-BF16).
void int4_rows_bf16_amx(const uint8_t* q, const void* s, const void* m, bool half, int64_t K,
                        int64_t rows, uint16_t* out);

// The same for two-level (GGUF Q4_K) scales (kscales.h): sc / mn uint8 [rows, K / 32], sup fp16
// bits [rows, K / 256, 2] = (d, -dmin); each group's scale d * sc and min -dmin * mn formed
// in fp32 (exact products, the values reference.fold_kscales gives). K % 256 == 0 and
// K / 32 <= kAmxMaxGroups (a row's scales sit on the stack).
constexpr int64_t kAmxMaxGroups = 4096;
void int4k_rows_bf16_amx(const uint8_t* q, const uint8_t* sc, const uint8_t* mn,
                         const uint16_t* sup, int64_t K, int64_t rows, uint16_t* out);

// Rows of a group-wise int8 weight (q int8 [rows, K]; scales / mins [rows, K / G] fp32, or
// fp16 bits when half; mins may be null; G % 16 == 0, K % 32 == 0) as bf16 into out [rows, K]:
// q * s (+ m), product then sum each rounded once in fp32 (int8_dequantize's values), rounded
// to nearest even by vcvtne2ps2bf16.
void int8_rows_bf16_amx(const int8_t* q, const void* scales, const void* mins, bool half,
                        int64_t K, int64_t G, int64_t rows, uint16_t* out);

// The bit-plane layouts' rows [r0, r1) (qa5.h / qa6.h, Args N and K set) as bf16 into rows
// 0..r1-r0-1 of `rows` (stride K): the values int5/int6_dequantize write, rounded by
// vcvtne2ps2bf16 (amx_fill_planes.cpp; AVX512-BF16, so AMX CPUs only).
struct Int5Args;
struct Int6Args;
void int5_rows_bf16_amx(const Int5Args& a, int64_t r0, int64_t r1, uint16_t* rows);
void int6_rows_bf16_amx(const Int6Args& a, int64_t r0, int64_t r1, uint16_t* rows);

// Strips [s0, s1) (weight rows 16 s0 .. min(16 s1, N)) of out, on the calling thread;
// `strip` is the caller's scratch of 16 * K bf16 (the dequantized rows).
void amx_bf16_strips(const AmxGemmArgs& a, int64_t s0, int64_t s1, uint16_t* strip);

}  // namespace localchat_cpu
