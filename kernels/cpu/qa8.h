// Integer-dot (W4A8 / W8A8) CPU quantized matmuls: shared declarations (no torch headers).
//
// Activations are quantized per row and per 32-column block to int8, Q8_0-style (llama.cpp's
// ggml-quants design: d = amax / 127, q = round-to-nearest-even(x * (1 / d)) in -127..127),
// by a8_quantize_{scalar,avx2,avx512}: the same integers and block scales on every ISA (IEEE
// division and multiplication, round to nearest even), only faster on the vector ISAs.
// Each weight sub-block (the intersection of a weight group and an activation block: 16 or 32
// columns) gives an exact int32 dot product; the kernels then sum, in fp32 and in an order
// that depends only on (n, k) and the ISA,
//   out[m, n] = sum_j float(dot_j) * (w_scale[n, g(j)] * d[m, b(j)])
//             + sum_g w_min[n, g] * xs[m, g],    xs[m, g] = sum_{j in g} d[m, b(j)] * sum(xq_j)
// so row m of an M-row call equals the 1-row call bit for bit (batch invariance).
//
// Activation layout (xq [M, Kp] int8, Kp = K rounded up to 128, zero padded):
//   int4: per 128-column chunk c (four 32-column blocks 4c..4c+3), bytes 0..63 hold the even
//         columns and bytes 64..127 the odd columns, block b's 16 at offset 16 b of each half:
//         xq[128 c + 16 b + j] = q[128 c + 32 b + 2 j], xq[128 c + 64 + 16 b + j] = q[... + 1],
//         so the 64 weight bytes of a chunk meet them directly (low nibbles = even columns,
//         high nibbles = odd columns of the same four blocks); int8: natural order.
// Block scales, each repeated for the vector lanes its block covers:
//   d  [M, Kp / 32] (scalar), dv (int4) [M, Kp / 32, 4] (4 lanes per block), (int8)
//   [M, Kp / 64, 16] (per 64 columns: block 0's d x 8, block 1's d x 8).
#pragma once
#include <cstdint>

namespace localchat_cpu {

struct A8Args {
  const int8_t* xq;      // [M, Kp] quantized activations (layout above)
  const int32_t* ncorr;  // [M, Kp / 4]: -128 * sum of each 4 consecutive xq (int8 only)
  const float* d;        // [M, Kp / 32] activation block scales
  const float* dv;       // block scales repeated per lane (layout above)
  const float* xs;       // [M, ngroups] or nullptr (no mins)
  const int32_t* blk2grp;  // [Kp / 32] weight group of each activation block (padded: last)
  const void* qweight;   // int4: uint8 [N, K / 2]; int8: int8 [N, K]
  const void* scales;    // [N, ngroups] fp32 or fp16 (half == true)
  const void* mins;      // [N, ngroups] same dtype as scales, or nullptr
  bool half;
  void* out;             // [M, N] fp32, or bf16 when out_bf16
  bool out_bf16;
  int64_t M, N, K, Kp, group_size, ngroups;
  // int4 with two-level scales (kscales.h, GGUF Q4_K): fp16 bits [N, ngroups / 8, 2] = (d,
  // -dmin) per 256 columns, scales / mins then uint8 [N, ngroups] (sc, m; group_size 32,
  // K % 256 == 0). The kernels form d * sc and -dmin * m in fp32 (exact), the folded values.
  const uint16_t* super = nullptr;
  // the int6 / int5 panel layouts' top-bit plane (panel6.h, panel5.h), else nullptr
  const void* qhigh = nullptr;
};

// Writable views of the activation buffers a8_quantize_* fills (sizes as in A8Args).
struct A8Buffers {
  int8_t* xq;
  int32_t* ncorr;  // int8 only, else nullptr
  float* d;
  float* dv;
  float* xs;       // nullptr when the weights have no mins
  int32_t* blk2grp;  // [Kp / 32], see A8Args
};

// Quantize x [M, K] (fp32, or bf16 bits when x_bf16; rows `x_stride` elements apart,
// K % 32 == 0) into `b` for the int4 (`int4`) or int8 layout of `a` (M, K, Kp, group_size,
// ngroups read). Zero-fills the padding. The same integers and scales on every ISA.
void a8_quantize_scalar(const void* x, bool x_bf16, int64_t x_stride, const A8Args& a,
                        const A8Buffers& b, bool int4);
void a8_quantize_avx2(const void* x, bool x_bf16, int64_t x_stride, const A8Args& a,
                      const A8Buffers& b, bool int4);
void a8_quantize_avx512(const void* x, bool x_bf16, int64_t x_stride, const A8Args& a,
                        const A8Buffers& b, bool int4);

void int4_a8_scalar(const A8Args& a, int64_t n0, int64_t n1);
void int8_a8_scalar(const A8Args& a, int64_t n0, int64_t n1);
void int4_a8_avx2(const A8Args& a, int64_t n0, int64_t n1);
void int8_a8_avx2(const A8Args& a, int64_t n0, int64_t n1);
void int4_a8_vnni(const A8Args& a, int64_t n0, int64_t n1);
void int8_a8_vnni(const A8Args& a, int64_t n0, int64_t n1);
// AMX-INT8 int4 kernel (qa8_amx.cpp; its own summation order, batch invariant, M <= 16),
// for CPUs where amx_int8_ready(); asked for with ISA level kAmxInt8 (3).
void int4_a8_amx(const A8Args& a, int64_t n0, int64_t n1);
constexpr int64_t kAmxInt8 = 3;
// Whether qa8_amx.cpp was compiled with the AMX kernel; whether this CPU and OS run AMX-INT8
// tiles (CPUID AMX-TILE + AMX-INT8 + AVX512-VNNI, and the kernel grants the tile data
// state; decided once per process in strip_gemm.cpp).
bool amx_int8_built();
bool amx_int8_ready();

// One output value (fp32 or bf16, round to nearest even).
inline void a8_store(const A8Args& a, int64_t m, int64_t n, float v) {
  if (a.out_bf16) {
    uint32_t u;
    __builtin_memcpy(&u, &v, 4);
    uint16_t h = (u & 0x7fffffffu) > 0x7f800000u
        ? static_cast<uint16_t>((u >> 16) | 0x40)
        : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    static_cast<uint16_t*>(a.out)[m * a.N + n] = h;
  } else {
    static_cast<float*>(a.out)[m * a.N + n] = v;
  }
}

}  // namespace localchat_cpu
