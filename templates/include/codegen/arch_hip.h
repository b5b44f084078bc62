// AMD primitives (HIP, gfx9 / gfx11 / gfx12). Mirrors arch_cuda.cuh function by function, plus
// shfl_xor_u32, the lane exchange that butterfly is built on here.
// Only compiler builtins and clang's __bf16 / _Float16 are used: no hip_fp16.h / hip_fp8.h,
// so the kernels do not depend on which ROCm release's headers are installed.
#pragma once
#include <hip/hip_runtime.h>
#include <stdint.h>
#include <mutex>

#define CG_DEVICE __device__ __forceinline__
#define CG_HOST_DEVICE __host__ __device__ __forceinline__

namespace cg {

// threadIdx.x and blockIdx.x. HIP's threadIdx / blockIdx go through __ockl_get_local_id /
// __ockl_get_group_id, which stay calls when no device library is linked (the offline assembly
// toolchain) and then cost registers and spills around the call; the builtins read the hardware
// registers directly.
CG_DEVICE int thread_x() { return int(__builtin_amdgcn_workitem_id_x()); }
CG_DEVICE int block_x() { return int(__builtin_amdgcn_workgroup_id_x()); }
CG_DEVICE int block_y() { return int(__builtin_amdgcn_workgroup_id_y()); }
CG_DEVICE int grid_x() { return int(gridDim.x); }

// As arch_cuda.cuh's opaque, a no-op: the re-derived pointers were seen in nvcc's code only.
template <class T>
CG_DEVICE T* opaque(T* p) { return p; }

// As arch_cuda.cuh's prefetch_l2: a no-op on AMD, where whether a prefetch pays cannot be
// measured (the H200 figures are in rmsnorm.cuh); launchers then pass no distance at all.
constexpr bool kPrefetchL2 = false;
CG_DEVICE void prefetch_l2(const void*, uint32_t) {}

CG_DEVICE float bits_to_float(uint32_t u) { return __builtin_bit_cast(float, u); }
CG_DEVICE uint32_t float_to_bits(float f) { return __builtin_bit_cast(uint32_t, f); }

// max(m, |v|) for m >= 0; a NaN in either gives NaN, as torch's amax. As integers: the bits of
// non-negative floats order as the floats, and a NaN's lie above inf's (v_max3_u32 takes two
// values per instruction; v_max_f32 would drop a NaN).
CG_DEVICE float max_abs(float m, float v) {
  const uint32_t a = float_to_bits(m), b = float_to_bits(v) & 0x7fffffffu;
  return bits_to_float(a > b ? a : b);
}

CG_DEVICE float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }
CG_DEVICE float f16_to_float(uint16_t h) { return float(__builtin_bit_cast(_Float16, h)); }
CG_DEVICE uint16_t float_to_bf16(float f) { return __builtin_bit_cast(uint16_t, __bf16(f)); }
// The empty asm keeps f a finished float: otherwise the backend folds the multiply that made it
// into v_fma_mixlo_f16 with a +0 addend, which turns a -0 product into +0 (seen on gfx942 and
// gfx1201 in the emulator: rmsnorm of a -0 input gave +0, the fused kernels -0).
CG_DEVICE uint16_t float_to_f16(float f) {
  asm("" : "+v"(f));
  return __builtin_bit_cast(uint16_t, _Float16(f));
}

// Plain '/' and sqrt are IEEE-exact in HIP unless fast-math is on, which we never pass.
// a * b + c, one rounding (v_fma_f32 / v_fmac_f32).
CG_DEVICE float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
CG_DEVICE float div_rn(float a, float b) { return a / b; }
CG_DEVICE float sqrt_rn(float a) { return __builtin_sqrtf(a); }
// As arch_cuda.cuh's rcp_rn_mid: IEEE division here.
CG_DEVICE float rcp_rn_mid(float s) { return div_rn(1.0f, s); }

// Per-16-bit-half unsigned max of two packed pairs (v_pk_max_u16).
CG_DEVICE uint32_t umax16x2(uint32_t a, uint32_t b) {
  typedef unsigned short u16x2 __attribute__((ext_vector_type(2)));
  return __builtin_bit_cast(uint32_t, __builtin_elementwise_max(__builtin_bit_cast(u16x2, a),
                                                                __builtin_bit_cast(u16x2, b)));
}

// v of lane (this lane ^ mask) within aligned groups of WIDTH lanes. Masks up to 8 stay inside a
// DPP row (16 lanes) and move as DPP operands, one or two VALU instructions; 16 on the wave32
// targets is v_permlanex16; 16 and 32 on gfx950 are v_permlane16_swap / v_permlane32_swap;
// the others take ds_bpermute (__shfl_xor): address math and an LDS round trip the next step
// waits for. Callers pass constant masks (unrolled loops), so the switch folds away.
template <int WIDTH>
CG_DEVICE uint32_t shfl_xor_u32(uint32_t v, int mask) {
  const int x = int(v);
  switch (mask) {
    case 1:  // quad_perm [1,0,3,2]
      return uint32_t(__builtin_amdgcn_mov_dpp(x, 0xB1, 0xF, 0xF, true));
    case 2:  // quad_perm [2,3,0,1]
      return uint32_t(__builtin_amdgcn_mov_dpp(x, 0x4E, 0xF, 0xF, true));
    case 4: {  // banks (4 lanes) 0 and 2 of a row read 4 lanes on (row_shl:4), 1 and 3 4 back
      const int up = __builtin_amdgcn_update_dpp(x, x, 0x104, 0xF, 0x5, false);
      return uint32_t(__builtin_amdgcn_update_dpp(up, x, 0x114, 0xF, 0xA, false));  // row_shr:4
    }
    case 8:  // row_ror:8
      return uint32_t(__builtin_amdgcn_mov_dpp(x, 0x128, 0xF, 0xF, true));
#if defined(__gfx1100__) || defined(__gfx1200__) || defined(__gfx1201__)
    case 16:  // wave32: the same lane of the other row
      return uint32_t(__builtin_amdgcn_permlanex16(x, x, 0x76543210, 0xfedcba98, false, false));
#endif
#if defined(__gfx950__)
    // Two copies of v swap half their lanes: rows 1 and 3 of one with rows 0 and 2 of the other
    // (16), or the upper 32 lanes of one with the lower 32 of the other (32). Each lane then
    // holds its own v in one copy and its partner's in the other: the xor of the three is the
    // partner's.
    case 16:
      if (WIDTH > 16) {
        const auto r = __builtin_amdgcn_permlane16_swap(v, v, false, false);
        return r[0] ^ r[1] ^ v;
      }
      break;
    case 32:
      if (WIDTH > 32) {
        const auto r = __builtin_amdgcn_permlane32_swap(v, v, false, false);
        return r[0] ^ r[1] ^ v;
      }
      break;
#endif
  }
  return uint32_t(__shfl_xor(x, mask, WIDTH));
}

// Each v[k] reduced with op (commutative) over aligned segments of WIDTH lanes by an xor
// butterfly (the N reductions' steps interleaved); every lane gets its segment's result with the
// same bits (a step combines each pair in both orders). Largest step first, as on CUDA, where
// steps 16 and 32 move in registers (shfl_xor_u32). gfx942 / gfx90a can move them only through
// LDS, so there the smallest step goes first: after the DPP steps every 16-lane row holds one
// value, and the last steps combine the rows' values read as scalars (v_readlane) as the
// butterfly combines them: (R0 op R1) op (R2 op R3) for a wave, R0 op R1 or R2 op R3 for a half.
template <int WIDTH, int N, class T, class Op>
CG_DEVICE void butterfly(T (&v)[N], Op op) {
  static_assert(sizeof(T) == 4, "32-bit values");
  auto exchange = [](T x, int off) {
    return __builtin_bit_cast(T, shfl_xor_u32<WIDTH>(__builtin_bit_cast(uint32_t, x), off));
  };
#if defined(__gfx942__) || defined(__gfx90a__)
#pragma unroll
  for (int off = 1; off < WIDTH && off < 16; off <<= 1) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = op(v[k], exchange(v[k], off));
  }
  if constexpr (WIDTH >= 32) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int bits = __builtin_bit_cast(int, v[k]);
      auto row = [&](int r) {
        return __builtin_bit_cast(T, __builtin_amdgcn_readlane(bits, 16 * r));
      };
      if constexpr (WIDTH == 64) {
        v[k] = op(op(row(0), row(1)), op(row(2), row(3)));
      } else {   // 32: this lane's half of the wave
        const uint32_t lane = __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
        v[k] = lane < 32 ? op(row(0), row(1)) : op(row(2), row(3));
      }
    }
  }
#else
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off >>= 1) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = op(v[k], exchange(v[k], off));
  }
#endif
}

// Global -> LDS copies: a plain 16-byte load and store here (the wave waits for the load), so
// the commit / wait calls that order asynchronous copies elsewhere have nothing to do.
CG_DEVICE void copy_async16(void* smem, const void* gmem) {
  *reinterpret_cast<uint4*>(smem) = *reinterpret_cast<const uint4*>(gmem);
}
CG_DEVICE void copy_commit() {}
template <int N>
CG_DEVICE void copy_wait() {}

// Whether p holds on any lane of the wave (the same answer on every lane).
// (The ballot builtin, not __any: with no device library linked that is a call, and a call
// costs registers.)
CG_DEVICE bool wave_any(bool p) { return __builtin_amdgcn_ballot_w64(p) != 0; }

CG_DEVICE uint4 load_stream16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
CG_DEVICE uint4 load_ro16(const void* p) { return *reinterpret_cast<const uint4*>(p); }

#if defined(CG_FP8_MAX)
// Four floats to four fp8 bytes (a in the lowest byte) with v_cvt_pk_fp8_f32: e4m3fnuz on
// gfx942, OCP e4m3 on gfx950 / gfx12. Inputs are already clamped to +-CG_FP8_MAX.
CG_DEVICE uint32_t cvt_pk4_fp8(float a, float b, float c, float d) {
  int w = __builtin_amdgcn_cvt_pk_fp8_f32(a, b, 0, false);
  w = __builtin_amdgcn_cvt_pk_fp8_f32(c, d, w, true);
  return uint32_t(w);
}
#endif

// Four fp8 bytes (the lowest first) to floats with v_cvt_pk_f32_fp8: e4m3fnuz on gfx942, OCP
// e4m3 on gfx950 / gfx12, the formats their matrix instructions read.
template <int = 0>
CG_DEVICE void fp8x4_to_float4(uint32_t v, float (&f)[4]) {
#if defined(__gfx942__) || defined(__gfx950__) || defined(__gfx1200__) || defined(__gfx1201__)
  typedef float f2 __attribute__((ext_vector_type(2)));
  const f2 lo = __builtin_amdgcn_cvt_pk_f32_fp8(int(v), false);
  // the high pair shifted down rather than word-selected: gfx942 encodes the word select as
  // SDWA, which the ISA emulator of the L4 tests does not run (same cost: memory-bound code)
  const f2 hi = __builtin_amdgcn_cvt_pk_f32_fp8(int(v >> 16), false);
  f[0] = lo[0], f[1] = lo[1], f[2] = hi[0], f[3] = hi[1];
#elif defined(__HIP_DEVICE_COMPILE__)
  static_assert(sizeof(f) == 0, "v_cvt_pk_f32_fp8 needs gfx942, gfx950 or gfx12");
#endif
}

// c plus the four products a[i] * b[i] of fp8 bytes, added one at a time in byte order (each
// product is exact in f32, so this equals four FMAs). gfx12 has it as one instruction,
// v_dot4_f32_fp8_fp8 (kFp8Dot4); elsewhere it decodes and multiplies.
#if defined(__gfx1200__) || defined(__gfx1201__)
constexpr bool kFp8Dot4 = true;
#else
constexpr bool kFp8Dot4 = false;
#endif
template <int = 0>
CG_DEVICE float fp8_dot4(uint32_t a, uint32_t b, float c) {
#if defined(__gfx1200__) || defined(__gfx1201__)
  return __builtin_amdgcn_dot4_f32_fp8_fp8(int(a), int(b), c);
#else
  float fa[4], fb[4];
  fp8x4_to_float4(a, fa);
  fp8x4_to_float4(b, fb);
  for (int i = 0; i < 4; ++i) c = fma(fa[i], fb[i], c);
  return c;
#endif
}

// FP8 matrix instructions, c += a * b on one wave's fragments (codegen/matrix.py has their
// lane layouts). Templates, so that a target without the instruction fails to compile only
// a kernel that uses it; the host pass never runs them.
template <int = 0>
CG_DEVICE void mfma_f32_16x16x32_fp8(float (&c)[4], const uint2 (&a)[1], uint2 b) {
#if defined(__gfx942__) || defined(__gfx950__)
  typedef float f4 __attribute__((ext_vector_type(4)));
  f4 acc = {c[0], c[1], c[2], c[3]};
  acc = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(__builtin_bit_cast(long, a[0]),
                                                   __builtin_bit_cast(long, b), acc, 0, 0, 0);
  for (int i = 0; i < 4; ++i) c[i] = acc[i];
#elif defined(__HIP_DEVICE_COMPILE__)
  static_assert(sizeof(c) == 0, "v_mfma_f32_16x16x32_fp8_fp8 needs gfx942 or gfx950");
#endif
}

template <int = 0>
CG_DEVICE void mfma_f32_32x32x16_fp8(float (&c)[16], const uint2 (&a)[1], uint2 b) {
#if defined(__gfx942__) || defined(__gfx950__)
  typedef float f16x __attribute__((ext_vector_type(16)));
  f16x acc;
  for (int i = 0; i < 16; ++i) acc[i] = c[i];
  acc = __builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8(__builtin_bit_cast(long, a[0]),
                                                   __builtin_bit_cast(long, b), acc, 0, 0, 0);
  for (int i = 0; i < 16; ++i) c[i] = acc[i];
#elif defined(__HIP_DEVICE_COMPILE__)
  static_assert(sizeof(c) == 0, "v_mfma_f32_32x32x16_fp8_fp8 needs gfx942 or gfx950");
#endif
}

// 32 fp8 bytes of a row: the f8f6f4 MFMA's operand
struct u32x8 {
  uint4 lo, hi;
};

// CDNA4's FP8 x FP8 MFMAs, unscaled: format 0 (E4M3) for A and B, scale operands 0 (the backend
// then emits v_mfma_f32_16x16x128_f8f6f4 / v_mfma_f32_32x32x64_f8f6f4, not the scaled form).
template <int = 0>
CG_DEVICE void mfma_f32_16x16x128_f8f6f4(float (&c)[4], const u32x8 (&a)[1], u32x8 b) {
#if defined(__gfx950__)
  typedef float f4 __attribute__((ext_vector_type(4)));
  typedef int i8 __attribute__((ext_vector_type(8)));
  f4 acc = {c[0], c[1], c[2], c[3]};
  acc = __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(__builtin_bit_cast(i8, a[0]),
                                                         __builtin_bit_cast(i8, b), acc, 0, 0,
                                                         0, 0, 0, 0);
  for (int i = 0; i < 4; ++i) c[i] = acc[i];
#elif defined(__HIP_DEVICE_COMPILE__)
  static_assert(sizeof(c) == 0, "v_mfma_f32_16x16x128_f8f6f4 needs gfx950");
#endif
}

template <int = 0>
CG_DEVICE void mfma_f32_32x32x64_f8f6f4(float (&c)[16], const u32x8 (&a)[1], u32x8 b) {
#if defined(__gfx950__)
  typedef float f16x __attribute__((ext_vector_type(16)));
  typedef int i8 __attribute__((ext_vector_type(8)));
  f16x acc;
  for (int i = 0; i < 16; ++i) acc[i] = c[i];
  acc = __builtin_amdgcn_mfma_scale_f32_32x32x64_f8f6f4(__builtin_bit_cast(i8, a[0]),
                                                        __builtin_bit_cast(i8, b), acc, 0, 0,
                                                        0, 0, 0, 0);
  for (int i = 0; i < 16; ++i) c[i] = acc[i];
#elif defined(__HIP_DEVICE_COMPILE__)
  static_assert(sizeof(c) == 0, "v_mfma_f32_32x32x64_f8f6f4 needs gfx950");
#endif
}

template <int = 0>
CG_DEVICE void wmma_f32_16x16x16_fp8(float (&c)[8], const uint2 (&a)[1], uint2 b) {
#if defined(__gfx1200__) || defined(__gfx1201__)
  typedef float f8 __attribute__((ext_vector_type(8)));
  typedef int i2 __attribute__((ext_vector_type(2)));
  f8 acc = {c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]};
  acc = __builtin_amdgcn_wmma_f32_16x16x16_fp8_fp8_w32_gfx12(__builtin_bit_cast(i2, a[0]),
                                                             __builtin_bit_cast(i2, b), acc);
  for (int i = 0; i < 8; ++i) c[i] = acc[i];
#elif defined(__HIP_DEVICE_COMPILE__)
  static_assert(sizeof(c) == 0, "v_wmma_f32_16x16x16_fp8_fp8 needs gfx12");
#endif
}

// Blocks of `kernel` (block threads, smem bytes of dynamic LDS each) resident on the current
// device at once, 0 if smem exceeds what a block may have; raises the kernel's dynamic LDS
// limit to at least smem first. Cached per (device, smem), one cache per KEY: each kernel of a
// module needs its own KEY. `static`: with external linkage the static locals of an inline
// function are unique across the process, so the first module loaded would answer for all.
template <int KEY, typename Kernel>
static int64_t resident_blocks(Kernel kernel, int block, int smem = 0) {
  static std::mutex lock;
  static int64_t cache[64][4] = {};  // per device: (smem, blocks), two recent sizes
  static int raised[64] = {};         // per device: the kernel's dynamic shared memory limit
  int dev = 0;
  if (hipGetDevice(&dev) != hipSuccess || dev < 0 || dev >= 64) return 0;
  std::lock_guard<std::mutex> guard(lock);
  int64_t* c = cache[dev];
  for (int i = 0; i < 4; i += 2)
    if (c[i + 1] && c[i] == smem) return c[i + 1];
  // Over the limit: 0, and no failing call (its error would be the next hipGetLastError's,
  // that of the launch that follows).
  int cus = 0, per_cu = 0, limit = 0;
  (void)hipDeviceGetAttribute(&limit, hipDeviceAttributeSharedMemPerBlockOptin, dev);
  if (smem > limit) return 0;
  // Only ever raised: a launch with a cached smem must stay within it.
  if (smem > raised[dev]) {
    (void)hipFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                              hipFuncAttributeMaxDynamicSharedMemorySize, smem);
    raised[dev] = smem;
  }
  (void)hipDeviceGetAttribute(&cus, hipDeviceAttributeMultiprocessorCount, dev);
  (void)hipOccupancyMaxActiveBlocksPerMultiprocessor(&per_cu, kernel, block, smem);
  c[2] = c[0], c[3] = c[1], c[0] = smem, c[1] = int64_t(cus) * per_cu;
  return c[1];
}

// No programmatic dependent launch on AMD: kernels follow each other in the stream as usual.
CG_DEVICE void pdl_begin() {}
template <typename... Params, typename... Args>
static hipError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                         hipStream_t stream, Args&&... args) {
  kernel<<<grid, block, smem, stream>>>(static_cast<Args&&>(args)...);
  return hipGetLastError();
}

}  // namespace cg
