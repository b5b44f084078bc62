// NVIDIA primitives (nvcc, sm_90a). Mirrors arch_hip.h function by function.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cuda_runtime.h>
#include <mutex>

#define CG_DEVICE __device__ __forceinline__
#define CG_HOST_DEVICE __host__ __device__ __forceinline__

namespace cg {

CG_DEVICE int thread_x() { return int(threadIdx.x); }
CG_DEVICE int block_x() { return int(blockIdx.x); }
CG_DEVICE int block_y() { return int(blockIdx.y); }
CG_DEVICE int grid_x() { return int(gridDim.x); }

// p, computed once here: nvcc otherwise re-derives a row pointer (64-bit multiply and add) inside
// every predicated load that uses it.
template <class T>
CG_DEVICE T* opaque(T* p) {
  asm("" : "+l"(p));
  return p;
}

CG_DEVICE float bits_to_float(uint32_t u) { return __uint_as_float(u); }
CG_DEVICE uint32_t float_to_bits(float f) { return __float_as_uint(f); }

// max(m, |v|) for m >= 0; a NaN in either gives NaN, as torch's amax (max.NaN, one FMNMX).
CG_DEVICE float max_abs(float m, float v) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(fabsf(v)));
  return r;
}

CG_DEVICE float bf16_to_float(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
CG_DEVICE float f16_to_float(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
CG_DEVICE uint16_t float_to_bf16(float f) {
  uint16_t r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}
CG_DEVICE uint16_t float_to_f16(float f) {
  uint16_t r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}

// a * b + c, one rounding.
CG_DEVICE float fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }

// IEEE division, correct to the last bit whatever fast-math flags are in force.
CG_DEVICE float div_rn(float a, float b) { return __fdiv_rn(a, b); }
CG_DEVICE float sqrt_rn(float a) { return __fsqrt_rn(a); }

// RN(1 / s) for 2^-126 <= s < 2^126 (biased exponent 1-252), NaN for NaN: rcp.rn's own fast
// path on sm_90a without its range test, which div_rn(1, s) pays on top (FCHK and a branch).
// Checked for every such s against IEEE division on the GPU (tests/test_gpu_quant.py).
CG_DEVICE float rcp_rn_mid(float s) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
  return __fmaf_rn(r, __fmaf_rn(-s, r, 1.0f), r);
}

// Per-16-bit-half unsigned max of two packed pairs.
CG_DEVICE uint32_t umax16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// Each v[k] reduced with op (commutative) over aligned segments of WIDTH lanes by an xor
// butterfly, largest step first (the N reductions' steps interleaved). Every lane gets its
// segment's result with the same bits: a step combines each pair in both orders.
template <int WIDTH, int N, class T, class Op>
CG_DEVICE void butterfly(T (&v)[N], Op op) {
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off >>= 1) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = op(v[k], __shfl_xor_sync(0xffffffffu, v[k], off, WIDTH));
  }
}

// Whether p holds on any lane of the warp (the same answer on every lane).
CG_DEVICE bool wave_any(bool p) { return __any_sync(0xffffffffu, p); }

// Streaming 16-byte load: read once, non-coherent, no L1 allocation.
CG_DEVICE uint4 load_stream16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// 16-byte load of data no thread of the kernel writes (ld.global.nc, cached in L1). Unlike a plain
// load, the compiler may issue it ahead of earlier stores: it cannot alias them.
CG_DEVICE uint4 load_ro16(const void* p) {
  uint4 v;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Asynchronous 16-byte copy global -> shared (cp.async, not through registers nor L1). Copies
// issued between two copy_commit() form a group; copy_wait<N>() returns once all but the N most
// recent groups have landed, visible to the issuing thread (other threads need a barrier).
CG_DEVICE void copy_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
               :: "r"(uint32_t(__cvta_generic_to_shared(smem))), "l"(gmem) : "memory");
}
CG_DEVICE void copy_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
CG_DEVICE void copy_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

// Starts reading `bytes` at p into L2 (a bulk prefetch: no registers, nothing to wait for).
// p 16-byte aligned, bytes a multiple of 16. kPrefetchL2: whether launchers should ask for it.
constexpr bool kPrefetchL2 = true;
CG_DEVICE void prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p), "r"(bytes));
}

// Four OCP e4m3 bytes (the lowest first) to floats, through f16 pairs (exact).
CG_DEVICE void fp8x4_to_float4(uint32_t v, float (&f)[4]) {
  uint32_t lo, hi;
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\n"
      "cvt.rn.f16x2.e4m3x2 %1, h;\n}" : "=r"(lo), "=r"(hi) : "r"(v));
  f[0] = f16_to_float(uint16_t(lo)), f[1] = f16_to_float(uint16_t(lo >> 16));
  f[2] = f16_to_float(uint16_t(hi)), f[3] = f16_to_float(uint16_t(hi >> 16));
}

// c plus the four products a[i] * b[i] of fp8 bytes, added one at a time in byte order (each
// product is exact in f32, so this equals four FMAs). kFp8Dot4: one instruction does it (no).
constexpr bool kFp8Dot4 = false;
CG_DEVICE float fp8_dot4(uint32_t a, uint32_t b, float c) {
  float fa[4], fb[4];
  fp8x4_to_float4(a, fa);
  fp8x4_to_float4(b, fb);
  for (int i = 0; i < 4; ++i) c = fma(fa[i], fb[i], c);
  return c;
}

#if defined(CG_FP8_MAX)
// Four floats to four OCP e4m3 bytes (a in the lowest byte), round to nearest even.
// Inputs are already clamped to +-CG_FP8_MAX; NaN stays NaN.
CG_DEVICE uint32_t cvt_pk4_fp8(float a, float b, float c, float d) {
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(b), "f"(a));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(d), "f"(c));
  return uint32_t(lo) | (uint32_t(hi) << 16);
}
#endif

// FP8 matrix instruction, c += a * b on one warp's fragments (codegen/matrix.py has the lane
// layout): a[0] holds row lane/4 (registers a0, a2), a[1] row lane/4 + 8 (a1, a3).
template <int = 0>
CG_DEVICE void mma_m16n8k32_e4m3(float (&c)[4], const uint2 (&a)[2], uint2 b) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0].x), "r"(a[1].x), "r"(a[0].y), "r"(a[1].y), "r"(b.x), "r"(b.y));
}

// Blocks of `kernel` (block threads, smem bytes of dynamic shared memory each) resident on the
// current device at once, 0 if smem exceeds what a block may have; raises the kernel's dynamic
// shared memory limit to at least smem first. Cached per (device, smem), one cache per KEY:
// each kernel of a module needs its own KEY. `static`: with external linkage the static locals
// of an inline function are unique across the process, so the first module loaded would answer
// for all (and skip the attribute call for the others' kernels).
template <int KEY, typename Kernel>
static int64_t resident_blocks(Kernel kernel, int block, int smem = 0) {
  static std::mutex lock;
  static int64_t cache[64][4] = {};  // per device: (smem, blocks), two recent sizes
  static int raised[64] = {};         // per device: the kernel's dynamic shared memory limit
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
  std::lock_guard<std::mutex> guard(lock);
  int64_t* c = cache[dev];
  for (int i = 0; i < 4; i += 2)
    if (c[i + 1] && c[i] == smem) return c[i + 1];
  // Over the limit: 0, and no failing call (its error would be the next cudaGetLastError's,
  // that of the launch that follows).
  int sms = 0, per_sm = 0, limit = 0;
  (void)cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (smem > limit) return 0;
  // Only ever raised: a launch with a cached smem must stay within it.
  if (smem > raised[dev]) {
    (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    raised[dev] = smem;
  }
  (void)cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  (void)cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, smem);
  c[2] = c[0], c[3] = c[1], c[0] = smem, c[1] = int64_t(sms) * per_sm;
  return c[1];
}

// Programmatic dependent launch: launch() lets a kernel start while the grid before it in the
// stream drains, and every kernel calls pdl_wait() (mostly through pdl_begin()) before its first
// global memory access: it returns once the grid before has completed with its writes visible
// (at once when there is none). CODEGEN_PDL=0 (read once per module) launches plainly.
CG_DEVICE void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the grid after this one start launching, so that its launch and block setup overlap this
// grid's run (it still waits in pdl_wait() for this grid's end); a block that never calls it
// does so when it exits.
CG_DEVICE void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
CG_DEVICE void pdl_begin() {
  pdl_wait();
  pdl_trigger();
}
// Every thread of the thread-block cluster (not .aligned: lanes may arrive apart); shared memory
// written before it is visible to the cluster's other blocks after it (sm_90).
CG_DEVICE void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
// The float at p's offset in the shared memory of block `rank` of this cluster (sm_90).
CG_DEVICE float load_cluster_f32(const float* p, int rank) {
  const uint32_t local = uint32_t(__cvta_generic_to_shared(p));
  uint32_t remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}
template <typename... Params, typename... Args>
static cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  static const bool pdl = [] {
    const char* v = getenv("CODEGEN_PDL");
    return v == nullptr || v[0] != '0';
  }();
  cudaLaunchConfig_t config = {};
  config.gridDim = grid, config.blockDim = block, config.dynamicSmemBytes = smem;
  config.stream = stream, config.attrs = &attr, config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Args&&>(args)...);
}

}  // namespace cg
