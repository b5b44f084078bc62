// Per-vendor primitives: every kernel includes this and nothing vendor-specific besides.
#pragma once
#if defined(__HIPCC__) || defined(__HIP__)
#include "codegen/arch_hip.h"
#else
#include "codegen/arch_cuda.cuh"
#endif

namespace cg {

// Sums over aligned segments of WIDTH lanes, every lane getting its segment's (butterfly).
template <int WIDTH, int N>
CG_DEVICE void butterfly_sum(float (&v)[N]) {
  butterfly<WIDTH>(v, [](float a, float b) { return a + b; });
}
template <int WIDTH>
CG_DEVICE float butterfly_sum(float v) {
  float a[1] = {v};
  butterfly_sum<WIDTH>(a);
  return a[0];
}

}  // namespace cg
