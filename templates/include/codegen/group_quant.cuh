// FP8 per-token-group quantization of values already in registers: the one implementation
// shared by the standalone quant kernel and the fused RMSNorm + quant kernels, so that both
// produce the same bytes. Contract: docs/numerics.md, "Per-token-group FP8 quant".
#pragma once
#include "codegen/arch.h"

#ifndef CG_FP8_CVT_CLAMPS
#define CG_FP8_CVT_CLAMPS 0   // 1: the fp8 convert itself saturates at CG_FP8_MAX
#endif

namespace cg {

CG_DEVICE uint32_t umax(uint32_t a, uint32_t b) { return a > b ? a : b; }

// One rounding, spelled out so that no compiler contracts a*b+c differently in two kernels.
CG_DEVICE float fma_rn(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

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

// RN(a / CG_FP8_MAX), the group's scale, for a >= 1e-10, inf or NaN: q = RN(a c) with
// c = RN(1 / CG_FP8_MAX), then one correction with the exact residual a - q CG_FP8_MAX. Equal to
// IEEE division for every float32 significand and each fp8 max the project uses (448, 240, 224:
// checked exhaustively, tests/test_quant_rounding.py); exponents only scale every step exactly,
// as nothing under- or overflows from 1e-10 up. q is capped at the largest float so that a = inf
// gives the residual inf, not inf - inf, and so the quotient inf (the cap binds for no finite a).
CG_DEVICE float div_by_fp8_max(float a) {
  constexpr float c = 1.0f / CG_FP8_MAX;
  const float q = __builtin_fminf(a * c, 3.40282347e38f);
  return fma_rn(fma_rn(-q, CG_FP8_MAX, a), c, q);
}

// The quotient x / scale as far as its fp8 byte goes: that of IEEE division, from
// y = RN(1 / scale) by multiplication and one correction with an exact residual (fma):
//   q0 = RN(x y): within 2 ulps of x / scale (y and the product each within half an ulp), so
//   r0 = q0 scale - x is exact;
//   q1 = RN(q0 - r0 y) = RN(x / scale + e), |e| <= 2 ulps * |1 - scale y| <= 2^-23 ulp: faithful,
//   and RN(x / scale) unless x / scale lies within 2^-23 ulp of a float32 midpoint.
// Only a float32 midpoint next to an fp8 rounding boundary could then change the fp8 byte, and
// there q1 is RN(x / scale) for every float32 significand of the scale (checked exhaustively in
// exact arithmetic, tests/test_quant_rounding.py; a second correction costs 2 instructions per
// value). Exponents scale every step exactly: |x / scale| >= 2^-11 keeps every term normal
// (scale >= 1e-10 / fp8_max), and smaller quotients round to a zero of the right sign whatever
// the error; the residual is taken as q scale - x, not x - q scale, so that x = -0 gives -0. No
// branch, and the same on every target: fma is IEEE on all of them.
// scale = inf (inf in the group): y = 0 and the residual's scale 0 give x * 0 = +-0, as IEEE
// x / inf, or NaN for x = inf; scale = NaN gives NaN. Also checked on the GPU
// (tests/test_gpu_quant.py).
struct Divisor {
  float y;      // RN(1 / scale), or 0 for scale = inf
  float scale;  // the scale, or 0 for scale = inf
};

// scale lies in [1e-10 / fp8_max, FLT_MAX / fp8_max] (div_by_fp8_max of amax >= 1e-10), where
// rcp_rn_mid is RN(1 / scale), or is inf or NaN.
CG_DEVICE Divisor divisor(float scale) {
  const bool inf = (float_to_bits(scale) & 0x7fffffffu) == 0x7f800000u;
  return {inf ? 0.0f : rcp_rn_mid(scale), inf ? 0.0f : scale};
}

CG_DEVICE float quotient(float x, Divisor d) {
  const float q = x * d.y;
  return fma_rn(-fma_rn(q, d.scale, -x), d.y, q);
}

// Largest |value| of a lane (NaN if any is NaN, like torch's amax), as the bit pattern of a
// float: for non-negative floats the integer order is the float order (the lanes' maxima are
// combined as integers), and a NaN lies above +inf.
template <int N>
CG_DEVICE uint32_t abs_max(const float (&v)[N]) {
  float m = __builtin_fabsf(v[0]);
#pragma unroll
  for (int i = 1; i < N; ++i) m = max_abs(m, v[i]);
  return float_to_bits(m);
}

// The same from packed 16-bit inputs (KIND 0 bf16, 1 fp16), two values per instruction.
template <int KIND, int W>
CG_DEVICE uint32_t abs_max_16(const uint32_t (&w)[W]) {
  uint32_t hi = 0;
#pragma unroll
  for (int i = 0; i < W; ++i) hi = umax16x2(hi, w[i] & 0x7fff7fffu);
  const uint32_t h = umax(hi & 0xffffu, hi >> 16);
  return KIND == 0 ? h << 16 : float_to_bits(f16_to_float(uint16_t(h)));
}

// The values of one lane, read on demand: src(i) for i < N (a float array, or packed 16-bit
// words unpacked where used).
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

// N values per lane (src), TPG lanes (an aligned segment of a wave) form one group; lane_max is
// the lane's abs_max. Writes N fp8 bytes as N/4 words; returns the group's scale.
template <int TPG, int N, bool UE8M0, typename Source>
CG_DEVICE float quantize_group_src(const Source& src, uint32_t lane_max, uint32_t (&out)[N / 4]) {
  uint32_t m[1] = {lane_max};
  butterfly<TPG>(m, [](uint32_t a, uint32_t b) { return umax(a, b); });
  float scale = div_by_fp8_max(bits_to_float(umax(m[0], float_to_bits(1e-10f))));
  Divisor d;
  if constexpr (UE8M0) {
    // A power-of-two scale: its reciprocal is exact (exponent negated), so is x * d.y. An inf /
    // NaN scale (inf / NaN in the group) takes RN(1 / scale): x * 0 = +-0 is IEEE x / inf.
    scale = pow2_ceil(scale);
    const uint32_t sb = float_to_bits(scale);
    d.y = (sb >> 23) >= 0xffu ? div_rn(1.0f, scale) : bits_to_float((254u << 23) - sb);
  } else {
    d = divisor(scale);
  }
  // Quotients are converted four at a time as they are made, so none stays live longer.
#pragma unroll
  for (int i = 0; i < N; i += 4) {
    float q[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float v = UE8M0 ? src(i + j) * d.y : quotient(src(i + j), d);
      q[j] = CG_FP8_CVT_CLAMPS ? v : clamp_fp8(v);
    }
    out[i / 4] = cvt_pk4_fp8(q[0], q[1], q[2], q[3]);
  }
  return scale;
}

// quantize_group_src over the floats v.
template <int TPG, int N, bool UE8M0>
CG_DEVICE float quantize_group(const float (&v)[N], uint32_t (&out)[N / 4]) {
  return quantize_group_src<TPG, N, UE8M0>(FloatSource<N>{v}, abs_max(v), out);
}
#endif

}  // namespace cg
