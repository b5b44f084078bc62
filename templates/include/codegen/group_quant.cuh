// FP8 per-token-group quantization of values already in registers: the one implementation
// shared by the standalone quant kernel and the fused RMSNorm + quant kernels, so that both
// produce the same bytes. Contract: NUMERICS.md, "Per-token-group FP8 quant".
#pragma once
#include "codegen/arch.h"

#ifndef CG_FP8_CVT_CLAMPS
#define CG_FP8_CVT_CLAMPS 0   // 1: the fp8 convert itself saturates at CG_FP8_MAX
#endif
#ifndef CG_EXACT_DIV_PER_LANE
#define CG_EXACT_DIV_PER_LANE 1   // 1: one fp8-boundary test per lane, 0: one per value
#endif

namespace cg {

// 32-bit index math where the problem allows it, 64-bit where it does not.
template <bool WIDE> struct IndexType { using type = uint32_t; };
template <> struct IndexType<true> { using type = int64_t; };

// 16 bytes of input as floats.
template <int KIND>  // 0 = bf16, 1 = fp16, 2 = fp32
struct Vec16 {
  static constexpr int N = KIND == 2 ? 4 : 8;
  float v[N];
  CG_DEVICE void unpack(uint4 raw) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (KIND == 2) {
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = bits_to_float(w[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint16_t lo = uint16_t(w[i] & 0xffffu), hi = uint16_t(w[i] >> 16);
        v[2 * i] = KIND == 0 ? bf16_to_float(lo) : f16_to_float(lo);
        v[2 * i + 1] = KIND == 0 ? bf16_to_float(hi) : f16_to_float(hi);
      }
    }
  }
};

CG_DEVICE uint32_t umax(uint32_t a, uint32_t b) { return a > b ? a : b; }
CG_DEVICE uint32_t umin(uint32_t a, uint32_t b) { return a < b ? a : b; }

#if defined(CG_FP8_MAX)
// Smallest power of two >= s, for positive normal s (inf and NaN pass through).
CG_DEVICE float pow2_ceil(float s) {
  const uint32_t b = float_to_bits(s);
  const uint32_t exp = b >> 23, mant = b & 0x7fffffu;
  if (exp >= 0xffu || mant == 0) return s;
  return bits_to_float((exp + 1) << 23);
}

// Clamp to +-max; NaN stays NaN (comparisons with NaN are false), as torch.clamp does.
CG_DEVICE float clamp_fp8(float v) {
  return v > CG_FP8_MAX ? CG_FP8_MAX : (v < -CG_FP8_MAX ? -CG_FP8_MAX : v);
}

// y = x * (1/scale) is within two fp32 ulps of the IEEE quotient x / scale; the two can only
// round to different fp8 values when a rounding boundary of fp8 lies between them. Those
// boundaries (midpoints between fp8 values, and fp8 values at binade edges) have at most 5
// significant bits, so their low 19 mantissa bits are zero. near_fp8_boundary(y) says y is
// within 4 ulps of such a number; only then does the exact quotient need computing.
CG_DEVICE bool near_fp8_boundary(float y) {
  return ((float_to_bits(y) + 4u) & 0x7ffffu) < 8u;
}

// N values per lane, TPG lanes (an aligned segment of a wave) form one group.
// Writes N fp8 bytes as N/4 words and returns the group's scale (same in every lane).
template <int TPG, int N, bool UE8M0>
CG_DEVICE float quantize_group(const float (&v)[N], uint32_t (&out)[N / 4]) {
  // amax as the largest bit pattern of |v|: for non-negative floats the integer order is the
  // float order, and a NaN (above +inf) propagates, like torch's amax.
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) m = umax(m, float_to_bits(v[i]) & 0x7fffffffu);
#pragma unroll
  for (int off = TPG / 2; off > 0; off >>= 1) m = umax(m, shfl_xor_u32<TPG>(m, off));
  m = umax(m, float_to_bits(1e-10f));
  float scale = div_rn(bits_to_float(m), CG_FP8_MAX);
  if constexpr (UE8M0) scale = pow2_ceil(scale);
  // 1/scale is exact for a power-of-two scale, so x * inv is then exactly x / scale.
  const float inv = div_rn(1.0f, scale);
  float d[N];
#if CG_EXACT_DIV_PER_LANE
  // One test per lane: the smallest masked distance to a boundary, then one branch.
  uint32_t nearest = 0xffffffffu;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    d[i] = v[i] * inv;
    nearest = umin(nearest, (float_to_bits(d[i]) + 4u) & 0x7fff8u);
  }
  if (!UE8M0 && nearest == 0) {  // rare (about 1 lane in 10^3)
#pragma unroll
    for (int i = 0; i < N; ++i) d[i] = div_rn(v[i], scale);
  }
#else
#pragma unroll
  for (int i = 0; i < N; ++i) {
    d[i] = v[i] * inv;
    if (!UE8M0 && near_fp8_boundary(d[i])) d[i] = div_rn(v[i], scale);   // rare
  }
#endif
#pragma unroll
  for (int i = 0; i < N; i += 4) {
    float q[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) q[j] = CG_FP8_CVT_CLAMPS ? d[i + j] : clamp_fp8(d[i + j]);
    out[i / 4] = cvt_pk4_fp8(q[0], q[1], q[2], q[3]);
  }
  return scale;
}
#endif

}  // namespace cg
