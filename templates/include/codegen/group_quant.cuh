// FP8 per-token-group quantization of values already in registers: the one implementation
// shared by the standalone quant kernel and the fused RMSNorm + quant kernels, so that both
// produce the same bytes. Contract: NUMERICS.md, "Per-token-group FP8 quant".
#pragma once
#include "codegen/arch.h"

#ifndef CG_FP8_CVT_CLAMPS
#define CG_FP8_CVT_CLAMPS 0   // 1: the fp8 convert itself saturates at CG_FP8_MAX
#endif

namespace cg {

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

// The quotient x / scale is taken as y = x * inv with inv ~ 1/scale (hardware reciprocal,
// within 1 ulp), so y is within 4 fp32 ulps of the IEEE quotient. Both round to the same fp8
// value unless an fp8 rounding boundary lies between them. Those boundaries (midpoints between
// fp8 values, and fp8 values at binade edges) have at most 5 significant bits: their low 19
// mantissa bits are zero. boundary_distance(y) is 0 when y is within 8 ulps of one; only then
// is the exact IEEE quotient computed.
CG_DEVICE uint32_t boundary_distance(float y) { return (float_to_bits(y) + 8u) & 0x7fff0u; }

// Largest |value| of a lane, as the bit pattern of a float: for non-negative floats the integer
// order is the float order, and a NaN (above +inf) propagates, like torch's amax.
template <int N>
CG_DEVICE uint32_t amax_bits(const float (&v)[N]) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) m = umax(m, float_to_bits(v[i]) & 0x7fffffffu);
  return m;
}

// The same from packed 16-bit inputs (KIND 0 bf16, 1 fp16), two values per instruction.
template <int KIND, int W>
CG_DEVICE uint32_t amax_bits_16(const uint32_t (&w)[W]) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < W; ++i) m = umax16x2(m, w[i] & 0x7fff7fffu);
  const uint16_t h = uint16_t(umax(m & 0xffffu, m >> 16));
  return KIND == 0 ? uint32_t(h) << 16 : float_to_bits(f16_to_float(h));
}

// The values of one lane, read on demand: src(i) for i < N. Reading them where they are used
// (rather than holding an array) lets the rare exact path re-read them instead of keeping
// them all live, which keeps register use and so occupancy where the fast path needs it.
template <int N>
struct FloatSource {
  const float (&v)[N];
  CG_DEVICE float operator()(int i) const { return v[i]; }
};

// 16-bit inputs (KIND 0 bf16, 1 fp16) straight from W packed words.
template <int KIND, int W>
struct PackedSource {
  const uint32_t (&w)[W];
  CG_DEVICE float operator()(int i) const {
    const uint16_t h = uint16_t(i & 1 ? w[i / 2] >> 16 : w[i / 2] & 0xffffu);
    return KIND == 0 ? bf16_to_float(h) : f16_to_float(h);
  }
};

// N values per lane (src), TPG lanes (an aligned segment of a wave) form one group; lane_amax
// is the lane's amax_bits. Writes N fp8 bytes as N/4 words; returns the group's scale.
template <int TPG, int N, bool UE8M0, typename Source>
CG_DEVICE float quantize_group_src(const Source& src, uint32_t lane_amax,
                                   uint32_t (&out)[N / 4]) {
  uint32_t m = lane_amax;
#pragma unroll
  for (int off = TPG / 2; off > 0; off >>= 1) m = umax(m, shfl_xor_u32<TPG>(m, off));
  m = umax(m, float_to_bits(1e-10f));
  float scale = div_rn(bits_to_float(m), CG_FP8_MAX);
  // Quotients are converted four at a time as they are made, so none stays live longer.
  auto convert = [&](float inv, bool exact) {
    uint32_t nearest = 0xffffffffu;
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      float q[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float d = exact ? div_rn(src(i + j), scale) : src(i + j) * inv;
        nearest = umin(nearest, boundary_distance(d));
        q[j] = CG_FP8_CVT_CLAMPS ? d : clamp_fp8(d);
      }
      out[i / 4] = cvt_pk4_fp8(q[0], q[1], q[2], q[3]);
    }
    return nearest;
  };
  if constexpr (UE8M0) {
    // A power-of-two scale: its reciprocal is exact (exponent negated), so is x * inv.
    // An inf / NaN scale (inf / NaN in the group) takes the IEEE path: 1/inf = 0.
    scale = pow2_ceil(scale);
    const uint32_t sb = float_to_bits(scale);
    convert((sb >> 23) >= 0xffu ? div_rn(1.0f, scale) : bits_to_float((254u << 23) - sb), false);
  } else if (convert(rcp_approx(scale), false) == 0) {
    convert(0.0f, true);  // rare (about one lane in 2000): a quotient is near an fp8 boundary
  }
  return scale;
}

template <int TPG, int N, bool UE8M0>
CG_DEVICE float quantize_group_amax(const float (&v)[N], uint32_t lane_amax,
                                    uint32_t (&out)[N / 4]) {
  return quantize_group_src<TPG, N, UE8M0>(FloatSource<N>{v}, lane_amax, out);
}

// quantize_group_amax with the lane's amax taken from v.
template <int TPG, int N, bool UE8M0>
CG_DEVICE float quantize_group(const float (&v)[N], uint32_t (&out)[N / 4]) {
  return quantize_group_amax<TPG, N, UE8M0>(v, amax_bits(v), out);
}
#endif

}  // namespace cg
