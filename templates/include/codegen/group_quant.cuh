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
// value unless a rounding boundary lies between them. Above the smallest normal fp8 value
// (2^-6 for e4m3fn, 2^-7 for e4m3fnuz), the boundaries are the midpoints between neighbouring
// fp8 values, 1.abc1 x 2^e: bit 19 of the fp32 set and the bits below it clear (values past the
// clamp give fp_max on both sides). midpoint_distance(y) is 0 when y is within 8 ulps of one.
// Below 2^-6 the midpoints have fewer bits and the test would miss them: a lane holding such a
// quotient takes the exact path whole (kSmallQuotient). Exact fp8 values are not boundaries;
// a group's largest quotient is one (about fp_max), so testing them would send every group down
// the exact path.
// (Written as one add and one mask: (b + 8) & 0xffff0 == 0x80000 exactly when the 20 low bits
// of b + 8 - 0x80000 are below 16.)
CG_DEVICE uint32_t midpoint_distance(float y) {
  return (float_to_bits(y) + (8u - 0x80000u)) & 0xffff0u;
}
constexpr float kSmallQuotient = 0x1p-6f;

// Largest and smallest |value| of a lane, as bit patterns of floats: for non-negative floats the
// integer order is the float order, and a NaN (above +inf) propagates into the max, like
// torch's amax.
struct AbsRange {
  uint32_t max, min;
};

template <int N>
CG_DEVICE AbsRange abs_range(const float (&v)[N]) {
  AbsRange r{0u, 0xffffffffu};
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const uint32_t a = float_to_bits(v[i]) & 0x7fffffffu;
    r.max = umax(r.max, a), r.min = umin(r.min, a);
  }
  return r;
}

// The same from packed 16-bit inputs (KIND 0 bf16, 1 fp16), two values per instruction.
template <int KIND, int W>
CG_DEVICE AbsRange abs_range_16(const uint32_t (&w)[W]) {
  uint32_t hi = 0, lo = 0xffffffffu;
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const uint32_t a = w[i] & 0x7fff7fffu;
    hi = umax16x2(hi, a), lo = umin16x2(lo, a);
  }
  auto widen = [](uint32_t h) {
    return KIND == 0 ? h << 16 : float_to_bits(f16_to_float(uint16_t(h)));
  };
  return {widen(umax(hi & 0xffffu, hi >> 16)), widen(umin(lo & 0xffffu, lo >> 16))};
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

// N values per lane (src), TPG lanes (an aligned segment of a wave) form one group; lane is the
// lane's abs_range. Writes N fp8 bytes as N/4 words; returns the group's scale.
template <int TPG, int N, bool UE8M0, typename Source>
CG_DEVICE float quantize_group_src(const Source& src, AbsRange lane, uint32_t (&out)[N / 4]) {
  uint32_t m = lane.max;
#pragma unroll
  for (int off = TPG / 2; off > 0; off >>= 1) m = umax(m, shfl_xor_u32<TPG>(m, off));
  const bool all_zero = m == 0;  // every quotient is +-0 on both paths
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
        nearest = umin(nearest, midpoint_distance(d));
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
  } else {
    const float inv = rcp_approx(scale);
    const bool near = convert(inv, false) == 0;
    // All-zero groups (such as the padding items of the RMSNorm kernels) need no check:
    // 0 * inv and 0 / scale are the same signed zero.
    const bool small = bits_to_float(lane.min) * inv < kSmallQuotient && !all_zero;
    // Rare: a product lands within 8 ulps of a midpoint for about one value in 65536.
    if (near || small) convert(0.0f, true);
  }
  return scale;
}

// quantize_group_src over the floats v.
template <int TPG, int N, bool UE8M0>
CG_DEVICE float quantize_group(const float (&v)[N], uint32_t (&out)[N / 4]) {
  return quantize_group_src<TPG, N, UE8M0>(FloatSource<N>{v}, abs_range(v), out);
}
#endif

}  // namespace cg
