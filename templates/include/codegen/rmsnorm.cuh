// RMSNorm building blocks shared by the rmsnorm, rmsnorm_group_quant and dual_rmsnorm_group_quant
// kernels, so that each computes the same bits for the same row. Contract: docs/numerics.md,
// "RMSNorm family".
//
// Layout: a row of H elements is cut into chunks of 8 consecutive elements, for every dtype (one
// 16-byte load for bf16/fp16, two for fp32). TPR threads share a row, each holding ITEMS chunks
// (Items below: every 8 lanes read 128 consecutive bytes, so loads coalesce). Each thread's sum
// of squares is accumulated in item order, element by element with an explicit fma; the TPR
// partial sums are combined with an xor butterfly over min(TPR, WAVE) lanes (butterfly_sum,
// whose step order is the device's) and, when TPR > WAVE, the row's per-wave sums are added in
// wave order through shared memory. The rounding of the sum is thus a function of H, the device
// and the tier (TPR, ITEMS, WAVE) only: not of the
// dtype (the tiers are the same for every dtype but for the ITEMS of 1024-thread rows, whose
// layout does not depend on it), of vector or scalar loads, nor of whether the row is read once
// or twice. Hence fp32 rmsnorm on x.float() sums exactly like the bf16/fp16 kernels on x, and the
// fused and unfused kernels agree bit for bit.
#pragma once
#include "codegen/group_quant.cuh"

namespace cg {

constexpr int kChunk = 8;  // elements per chunk, every dtype

// Which chunk of a row (of a pass, for the two-pass kernels) item i of thread r holds:
// lane(r) + offset(i). Rows of at most 256 threads with an even ITEMS take items in pairs:
// pair k covers chunks [2 TPR k, 2 TPR (k + 1)), where lanes 8m .. 8m + 7 hold chunks
// 16m .. 16m + 7 (item 2k) and 16m + 8 .. 16m + 15 (item 2k + 1), so that a lane holds 16
// elements of each aligned 128-element group: a G=128 quant group is 8 lanes, not 16, with half
// the shuffles and scale divisions per element. Other rows: chunk i TPR + r. 1024-thread rows are
// not paired, as their ITEMS differs by dtype and their sum order must not (fp32 input sums like
// bf16); an odd ITEMS is not, as the pairs would cost its tier (H <= 1536 on wave32) registers.
template <int TPR, int ITEMS>
struct Items {
  static constexpr bool kPaired = TPR <= 256 && ITEMS % 2 == 0;
  static_assert(!kPaired || TPR % 8 == 0, "pairs take 8 lanes");
  CG_DEVICE static int lane(int r) { return kPaired ? (r & ~7) * 2 + (r & 7) : r; }
  CG_DEVICE static constexpr int offset(int i) {
    return kPaired ? i / 2 * 2 * TPR + i % 2 * 8 : i * TPR;
  }
  CG_DEVICE static int chunk(int r, int i) { return lane(r) + offset(i); }
  // The tier of TPR * SPLIT threads and ITEMS / SPLIT items gives item i of thread r to its
  // thread r + part(i) TPR (rmsnorm_row's SPLIT), in the same item order.
  template <int SPLIT>
  CG_DEVICE static constexpr int part(int i) { return (kPaired ? i / 2 : i) % SPLIT; }
};

// How a chunk is read: kCoherent, data this kernel also writes (the residual); kReadOnly, data
// no thread writes (the weight), which the compiler may load ahead of earlier stores; kStream,
// read-only and read once (x), kept out of L1.
enum class Src { kCoherent, kReadOnly, kStream };

// 1 / sqrt(sum / H + eps) with IEEE division and a correctly rounded sqrt (not rsqrtf, whose
// error differs between vendors): same bits on every target; well within the contract's 1 ulp of
// the output dtype.
CG_DEVICE float rms_scale(float sum, int h, float eps) {
  // For H = 2^k, sum * 2^-k is the IEEE quotient (one rounding of the same real): a multiply
  // in place of a division's dozen instructions.
  const uint32_t hb = float_to_bits(float(h));
  const float mean = (hb & 0x7fffffu) == 0 ? sum * bits_to_float((254u << 23) - hb)
                                           : div_rn(sum, float(h));
  return div_rn(1.0f, sqrt_rn(mean + eps));
}

// Eight consecutive elements of a row, as raw words of the dtype.
template <int KIND>  // 0 = bf16, 1 = fp16, 2 = fp32
struct Chunk {
  static constexpr int BYTES = KIND == 2 ? 4 : 2;  // per element
  static constexpr int PIECES = KIND == 2 ? 2 : 1;  // 16-byte pieces
  static constexpr int PER_PIECE = kChunk / PIECES;  // elements per piece
  uint32_t w[4 * PIECES];

  CG_DEVICE float get(int e) const {
    if constexpr (KIND == 2) {
      return bits_to_float(w[e]);
    } else {
      const uint16_t h = uint16_t((e & 1) ? (w[e / 2] >> 16) : (w[e / 2] & 0xffffu));
      return KIND == 0 ? bf16_to_float(h) : f16_to_float(h);
    }
  }

  // Round eight floats to the dtype (nearest even).
  CG_DEVICE void set(const float (&v)[kChunk]) {
#pragma unroll
    for (int i = 0; i < 4 * PIECES; ++i) {
      if constexpr (KIND == 2) {
        w[i] = float_to_bits(v[i]);
      } else {
        const uint32_t lo = KIND == 0 ? float_to_bf16(v[2 * i]) : float_to_f16(v[2 * i]);
        const uint32_t hi = KIND == 0 ? float_to_bf16(v[2 * i + 1]) : float_to_f16(v[2 * i + 1]);
        w[i] = lo | (hi << 16);
      }
    }
  }

  // Elements [first, first + 8) of `row`, of which n exist (n <= 0: none); missing ones read 0.
  // VECTOR: 16-byte loads (the row start and H * BYTES are multiples of 16, so a piece is all
  // there or all missing); else one load per element.
  template <bool VECTOR, Src SRC>
  CG_DEVICE void load(const uint8_t* row, int first, int n) {
    if constexpr (VECTOR) {
#pragma unroll
      for (int p = 0; p < PIECES; ++p) {
        uint4 v = make_uint4(0, 0, 0, 0);
        if (p * PER_PIECE < n) {
          const uint8_t* src = row + (first + p * PER_PIECE) * BYTES;
          v = SRC == Src::kStream     ? load_stream16(src)
              : SRC == Src::kReadOnly ? load_ro16(src)
                                      : *reinterpret_cast<const uint4*>(src);
        }
        w[4 * p] = v.x, w[4 * p + 1] = v.y, w[4 * p + 2] = v.z, w[4 * p + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 4 * PIECES; ++i) w[i] = 0;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        if (e < n) {
          const uint8_t* src = row + (first + e) * BYTES;
          if constexpr (KIND == 2) {
            w[e] = *reinterpret_cast<const uint32_t*>(src);
          } else {
            w[e / 2] |= uint32_t(*reinterpret_cast<const uint16_t*>(src)) << (16 * (e & 1));
          }
        }
      }
    }
  }

  template <bool VECTOR>
  CG_DEVICE void store(uint8_t* row, int first, int n) const {
    if constexpr (VECTOR) {
#pragma unroll
      for (int p = 0; p < PIECES; ++p) {
        if (p * PER_PIECE < n) {
          *reinterpret_cast<uint4*>(row + (first + p * PER_PIECE) * BYTES) =
              make_uint4(w[4 * p], w[4 * p + 1], w[4 * p + 2], w[4 * p + 3]);
        }
      }
    } else {
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        if (e < n) {
          uint8_t* dst = row + (first + e) * BYTES;
          if constexpr (KIND == 2) {
            *reinterpret_cast<uint32_t*>(dst) = w[e];
          } else {
            *reinterpret_cast<uint16_t*>(dst) = uint16_t(w[e / 2] >> (16 * (e & 1)));
          }
        }
      }
    }
  }
};

// rms_scale of a row's sum of squares, s[k] being each thread's part, returned to all TPR
// threads of the row (threads [k TPR, (k+1) TPR) of the block). The parts are added with an xor
// butterfly over min(TPR, WAVE) lanes; rows of several waves then add the per-wave sums in wave
// order through smem. SPLIT > 1: thread r stands for threads r + k TPR (k < SPLIT) of a row of
// TPR * SPLIT threads, s[k] holding the part of each, and the sum is that row's, bit for bit:
// each part is reduced over the wave on its own (a wave of that row holds the same lanes), then
// all TPR * SPLIT / WAVE wave sums are added in that row's wave order. ONCE: the row's first
// thread alone adds them and computes the scale, which the others read after a second barrier
// (the divisions and square root once per row instead of once per wave); else every wave does.
// Both give the same bits. Every thread of the block must call it (it may synchronize the
// block); smem is not guarded for reuse by the next call (rmsnorm_rows_staged alternates two).
// tid: threadIdx.x (read once by the kernel); smem: SPLIT * blockDim.x / WAVE floats.
template <int TPR, int WAVE, bool ONCE, int SPLIT>
CG_DEVICE float row_scale(float (&s)[SPLIT], int tid, float* smem, int h, float eps) {
  constexpr int W = TPR < WAVE ? TPR : WAVE;
  static_assert(SPLIT == 1 || TPR % WAVE == 0, "a split row holds whole waves");
  butterfly_sum<W>(s);
  float sum = s[0];
  if constexpr (TPR * SPLIT > WAVE) {
    constexpr int NW = TPR / WAVE, VW = NW * SPLIT;  // waves per row, as held and as summed
    const int wave = tid / WAVE;
    float* part = smem + wave / NW * VW;
    if (tid % WAVE == 0) {
#pragma unroll
      for (int k = 0; k < SPLIT; ++k) part[wave % NW + k * NW] = s[k];
    }
    __syncthreads();
    if (!ONCE || tid % TPR == 0) {
      sum = part[0];
#pragma unroll
      for (int i = 1; i < VW; ++i) sum += part[i];
    }
    if constexpr (ONCE) {
      if (tid % TPR == 0) part[0] = rms_scale(sum, h, eps);
      __syncthreads();
      return part[0];
    }
  }
  return rms_scale(sum, h, eps);
}

template <int TPR, int WAVE, bool ONCE>
CG_DEVICE float row_scale(float s, int tid, float* smem, int h, float eps) {
  float parts[1] = {s};
  return row_scale<TPR, WAVE, ONCE, 1>(parts, tid, smem, h, eps);
}

// Whether rows of ITEMS chunks per thread take row_scale's ONCE. H200, 4096 x 7168, bf16, A/B:
// rmsnorm_group_quant 33.3 -> 32.0 us, rmsnorm 34.1 -> 33.5 (4 items). With 2 items the second
// barrier costs rmsnorm_group_quant a block per SM (46 -> 54 registers): 16384 x 4096 71.3 ->
// 71.6 us, kernel time 71.7 -> 75.4.
template <int ITEMS>
constexpr bool kScaleOnce = ITEMS >= 4;

// With RESIDUAL, chunk j of a row becomes c = dtype(x + a) (c holds x's chunk, a the residual's),
// which is also written to res_dst. n: elements of the chunk that exist (0 when !ok). The
// callers load every chunk of a thread before the first of these stores: a load after a store
// that may alias it waits for it in program order, one memory round trip per chunk.
template <int KIND, bool VECTOR, bool RESIDUAL>
CG_DEVICE void add_residual(Chunk<KIND>& c, const Chunk<KIND>& a, uint8_t* res_dst, int j, int n,
                            bool ok) {
  if constexpr (RESIDUAL) {
    float s[kChunk];
#pragma unroll
    for (int e = 0; e < kChunk; ++e) s[e] = c.get(e) + a.get(e);
    c.set(s);
    if (ok) c.template store<VECTOR>(res_dst, j * kChunk, n);
  }
}

template <int KIND>
CG_DEVICE void sum_squares(float& ss, const Chunk<KIND>& c) {
#pragma unroll
  for (int e = 0; e < kChunk; ++e) ss = fma_rn(c.get(e), c.get(e), ss);
}

// out(j, v, ok) with v = x * rstd * w in fp32 (not rounded). An Out that shuffles within a wave
// (Out::kShuffles) is called by all lanes of a wave or none: chunks that no lane holds (the row
// is shorter than the tier's capacity) are skipped by the whole wave. Others are called on every
// lane and store only where ok (branch-free here: a branch per chunk cost SGPRs on gfx90a).
template <int KIND, class Out>
CG_DEVICE void emit_chunk(const Chunk<KIND>& c, const Chunk<KIND>& wc, int j, bool ok,
                          float rstd, const Out& out) {
  if constexpr (Out::kShuffles) {
    if (!wave_any(ok)) return;
  }
  float v[kChunk];
#pragma unroll
  for (int e = 0; e < kChunk; ++e) v[e] = c.get(e) * rstd * wc.get(e);
  out(j, v, ok);
}

// Items i and i + 1 of a pair (chunks j and j + 8) as one call out.pair(j, v, ok) with 16 values,
// for an Out that takes them together (Out::kPairs: one quant group per 8 lanes); else one call
// per chunk. Both chunks of a pair exist or neither (rows of whole 128-element groups).
template <int KIND, class Out>
CG_DEVICE void emit_pair(const Chunk<KIND>& c0, const Chunk<KIND>& c1, const Chunk<KIND>& w0,
                         const Chunk<KIND>& w1, int j, bool ok0, bool ok1, float rstd,
                         const Out& out) {
  if constexpr (Out::kPairs) {
    if (!wave_any(ok0)) return;
    float v[2 * kChunk];
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      v[e] = c0.get(e) * rstd * w0.get(e);
      v[kChunk + e] = c1.get(e) * rstd * w1.get(e);
    }
    out.pair(j, v, ok0);
  } else {
    emit_chunk(c0, w0, j, ok0, rstd, out);
    emit_chunk(c1, w1, j + 8, ok1, rstd, out);
  }
}

// emit_chunk / emit_pair over a thread's ITEMS chunks c of a pass starting at chunk base;
// weight(i, j, ok): the weight's chunk j for item i.
template <int KIND, int TPR, int ITEMS, class Weight, class Out>
CG_DEVICE void emit_items(const Chunk<KIND> (&c)[ITEMS], const Weight& weight, int r, int base,
                          int nchunk, bool row_ok, float rstd, const Out& out) {
  using L = Items<TPR, ITEMS>;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int j = base + L::chunk(r, i);
    const bool ok = row_ok && j < nchunk;
    if (!L::kPaired) {
      emit_chunk(c[i], weight(i, j, ok), j, ok, rstd, out);
    } else if (i % 2 == 0) {
      const bool ok1 = row_ok && j + 8 < nchunk;
      emit_pair(c[i], c[i + 1], weight(i, j, ok), weight(i + 1, j + 8, ok1), j, ok, ok1, rstd,
                out);
    }
  }
}

// One row, seen from thread r = tid % TPR of its TPR threads (tid: threadIdx.x): optional
// residual add, sum of squares, scale, then out(j, v, ok) for every chunk j the thread owns
// (emit_chunk). out is called by every lane of a wave together, in the same order, valid or
// not (ok says), so that it may shuffle within a wave.
//   x, res: this row of x and of the residual (RESIDUAL: res is read, dtype(x + res) is written
//   to res_out, which may be res itself, and the row is that rounded sum); w: the weight.
//   ITEMS: chunks per thread held in registers. TWO_PASS: the row is longer than TPR * ITEMS
//   chunks: a first pass sums (and writes the residual), a second one reads the row again (from
//   L2) and writes the output. SPLIT (one pass only): the row sums as the tier of TPR * SPLIT
//   threads holding ITEMS / SPLIT chunks each would (row_scale, Items::part), bit for bit.
template <int KIND, int TPR, int ITEMS, bool TWO_PASS, int WAVE, bool VECTOR, bool RESIDUAL,
          int SPLIT = 1, class Out>
CG_DEVICE void rmsnorm_row(const uint8_t* x, const uint8_t* res, uint8_t* res_out,
                           const uint8_t* w, int h, float eps, bool row_ok, int tid, float* smem,
                           const Out& out) {
  using C = Chunk<KIND>;
  using L = Items<TPR, ITEMS>;
  static_assert(SPLIT == 1 || (!TWO_PASS && ITEMS % SPLIT == 0), "a split row is one pass");
  const int r = int(uint32_t(tid) % TPR);
  const int nchunk = (h + kChunk - 1) / kChunk;
  auto count = [&](int j, bool ok) { return ok ? h - j * kChunk : 0; };
  if constexpr (!TWO_PASS) {
    float parts[SPLIT] = {};
    C c[ITEMS], wc[ITEMS], a[RESIDUAL ? ITEMS : 1];
    // This thread's first chunk in each array; item i lies L::offset(i) chunks further.
    const int lane = L::lane(r) * (kChunk * C::BYTES);
    const uint8_t* xr = opaque(x + lane);
    const uint8_t* wr = opaque(w + lane);
    const uint8_t* ar = RESIDUAL ? opaque(res + lane) : nullptr;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int j = L::chunk(r, i), off = L::offset(i) * kChunk;
      const int n = count(j, row_ok && j < nchunk);
      c[i].template load<VECTOR, Src::kStream>(xr, off, n);
      if constexpr (RESIDUAL) a[i].template load<VECTOR, Src::kCoherent>(ar, off, n);
      wc[i].template load<VECTOR, Src::kReadOnly>(wr, off, n);
    }
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int j = L::chunk(r, i);
      const bool ok = row_ok && j < nchunk;
      add_residual<KIND, VECTOR, RESIDUAL>(c[i], a[RESIDUAL ? i : 0], res_out, j, count(j, ok),
                                           ok);
      sum_squares(parts[L::template part<SPLIT>(i)], c[i]);
    }
    const float rstd = row_scale<TPR, WAVE, kScaleOnce<ITEMS>>(parts, tid, smem, h, eps);
    emit_items<KIND, TPR, ITEMS>(c, [&](int i, int, bool) { return wc[i]; }, r, 0, nchunk,
                                 row_ok, rstd, out);
  } else {
    float ss = 0.0f;
    for (int base = 0; base < nchunk; base += TPR * ITEMS) {
      C c[ITEMS], a[RESIDUAL ? ITEMS : 1];
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        const int j = base + L::chunk(r, i);
        const int n = count(j, row_ok && j < nchunk);
        c[i].template load<VECTOR, Src::kStream>(x, j * kChunk, n);
        if constexpr (RESIDUAL) a[i].template load<VECTOR, Src::kCoherent>(res, j * kChunk, n);
      }
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        const int j = base + L::chunk(r, i);
        const bool ok = row_ok && j < nchunk;
        add_residual<KIND, VECTOR, RESIDUAL>(c[i], a[RESIDUAL ? i : 0], res_out, j, count(j, ok),
                                             ok);
        sum_squares(ss, c[i]);
      }
    }
    const float rstd = row_scale<TPR, WAVE, kScaleOnce<ITEMS>>(ss, tid, smem, h, eps);
    // The second read sees what this same thread wrote to the residual in the first pass.
    const uint8_t* src = RESIDUAL ? res_out : x;
    for (int base = 0; base < nchunk; base += TPR * ITEMS) {
      C c[ITEMS], wc[ITEMS];
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        const int j = base + L::chunk(r, i);
        const int n = count(j, row_ok && j < nchunk);
        c[i].template load<VECTOR, RESIDUAL ? Src::kCoherent : Src::kStream>(src, j * kChunk, n);
        wc[i].template load<VECTOR, Src::kReadOnly>(w, j * kChunk, n);
      }
      emit_items<KIND, TPR, ITEMS>(c, [&](int i, int, bool) { return wc[i]; }, r, base, nchunk,
                                   row_ok, rstd, out);
    }
  }
}

// Rows streamed through shared memory: the BLOCK / TPR row groups of a block take rows
// first + g, first + g + stride, ... (first = block * BLOCK / TPR, stride = grid * BLOCK / TPR),
// and while a row is normalized the next STAGES - 1 are being copied in (asynchronously where
// the target can), so the loads keep going during the arithmetic of the fused kernels. Thread r
// copies exactly the chunks it reads later, so the data needs no barrier. The arithmetic per row
// is rmsnorm_row's, in the same order: the same bits. Rows must be 16-byte aligned with
// h * bytes a multiple of 16 (the VECTOR case); at most ITEMS * TPR chunks per row.
//   stage: dynamic shared memory of stage_bytes<KIND, RESIDUAL>(h) * STAGES * BLOCK / TPR;
//   red: 2 * BLOCK / WAVE floats; out_for(t): the output functor of row t.
template <int KIND, bool RESIDUAL>
CG_HOST_DEVICE int stage_bytes(int64_t h) {
  return int(h * (KIND == 2 ? 4 : 2)) * (RESIDUAL ? 2 : 1);
}

template <int KIND, int TPR, int ITEMS, int WAVE, bool RESIDUAL, int STAGES, int BLOCK,
          class OutFor>
CG_DEVICE void rmsnorm_rows_staged(const uint8_t* x, int64_t x_stride, const uint8_t* res,
                                   int64_t res_stride, uint8_t* res_out, int64_t res_out_stride,
                                   const uint8_t* w, int h, float eps, int64_t rows, int tid,
                                   float* red, uint8_t* stage, const OutFor& out_for) {
  static_assert(STAGES >= 2, "one row in flight at least");
  using C = Chunk<KIND>;
  using L = Items<TPR, ITEMS>;
  constexpr int RPB = BLOCK / TPR;
  const int r = tid % TPR, g = tid / TPR;
  const int nchunk = h / kChunk;
  const int row_bytes = h * C::BYTES;
  const int64_t first = int64_t(block_x()) * RPB, stride = int64_t(grid_x()) * RPB;
  // Row group g's buffers for the k-th row: x, then the residual.
  auto slot = [&](int k) {
    return stage + int64_t((k % STAGES) * RPB + g) * stage_bytes<KIND, RESIDUAL>(h);
  };
  auto fetch = [&](int k) {
    const int64_t t = first + g + k * stride;
    if (t < rows) {
      uint8_t* dst = slot(k);
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        const int j = L::chunk(r, i);
        if (j < nchunk) {
#pragma unroll
          for (int p = 0; p < C::PIECES; ++p) {
            const int off = j * kChunk * C::BYTES + p * 16;
            copy_async16(dst + off, x + t * x_stride + off);
            if constexpr (RESIDUAL) copy_async16(dst + row_bytes + off, res + t * res_stride + off);
          }
        }
      }
    }
    copy_commit();  // possibly empty: one group per row keeps the wait counts right
  };
#pragma unroll
  for (int k = 0; k < STAGES - 1; ++k) fetch(k);
  for (int k = 0; first + k * stride < rows; ++k) {
    const int64_t t = first + g + k * stride;
    const bool row_ok = t < rows;
    copy_wait<STAGES - 2>();
    const uint8_t* src = slot(k);
    uint8_t* res_row = RESIDUAL ? res_out + (row_ok ? t : 0) * res_out_stride : nullptr;
    C c[ITEMS], a[RESIDUAL ? ITEMS : 1];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int j = L::chunk(r, i);
      const int n = row_ok && j < nchunk ? kChunk : 0;
      c[i].template load<true, Src::kCoherent>(src, j * kChunk, n);
      if constexpr (RESIDUAL) {
        a[i].template load<true, Src::kCoherent>(src + row_bytes, j * kChunk, n);
      }
    }
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int j = L::chunk(r, i);
      const bool ok = row_ok && j < nchunk;
      add_residual<KIND, true, RESIDUAL>(c[i], a[RESIDUAL ? i : 0], res_row, j, ok ? kChunk : 0,
                                         ok);
      sum_squares(ss, c[i]);
    }
    // The slot of row k - 1 is refilled only now: this thread's reads of it are complete.
    fetch(k + STAGES - 1);
    // Two sets of partial sums, alternating: a row's barrier orders the reads of the set used
    // two rows before against its next writes.
    const float rstd = row_scale<TPR, WAVE, kScaleOnce<ITEMS>>(
        ss, tid, red + (k & 1) * (BLOCK / WAVE), h, eps);
    // The weight from L1 / L2 as it is used: held across rows it would cost occupancy.
    auto weight = [&](int, int j, bool ok) {
      C wc;
      wc.template load<true, Src::kReadOnly>(w, j * kChunk, ok ? kChunk : 0);
      return wc;
    };
    emit_items<KIND, TPR, ITEMS>(c, weight, r, 0, nchunk, row_ok, rstd, out_for(row_ok ? t : 0));
  }
}

// Output of rmsnorm: y = dtype(v), one rounding.
template <int KIND, bool VECTOR>
struct StoreRow {
  static constexpr bool kShuffles = false, kPairs = false;
  uint8_t* y;  // this row of y
  int h;
  CG_DEVICE void operator()(int j, const float (&v)[kChunk], bool ok) const {
    if (!ok) return;
    Chunk<KIND> c;
    c.set(v);
    c.template store<VECTOR>(y, j * kChunk, h - j * kChunk);
  }
};

#if defined(CG_FP8_MAX)
// Output of the fused kernels: v (fp32) group-quantized with quantize_group, the code the quant
// kernel runs; a group of G = 8 TPG values lies in TPG consecutive lanes (TPG divides TPR) at
// the same item, or, for G = 128 with paired items (Items), in 8 lanes holding 16 each (pair).
// Optionally also y = dtype(v).
template <int KIND, int TPG, bool UE8M0>
struct QuantRow {
  static constexpr bool kShuffles = true, kPairs = TPG == 16;
  uint8_t* q;          // this row of q (fp8, contiguous)
  float* scales;       // this row's first scale
  int64_t scale_col;   // element stride between the row's scales
  uint8_t* y;          // this row of y, or null

  // Chunk j, v its 8 values.
  CG_DEVICE void operator()(int j, const float (&v)[kChunk], bool ok) const {
    uint32_t bytes[kChunk / 4];
    const float scale = quantize_group<TPG, kChunk, UE8M0>(v, bytes);
    if (ok) write(j, bytes, v, scale);
  }

  // Chunks j and j + 8 (j % 16 < 8), v their 16 values: half of a group each.
  CG_DEVICE void pair(int j, const float (&v)[2 * kChunk], bool ok) const {
    uint32_t bytes[2 * kChunk / 4];
    const float scale = quantize_group<TPG / 2, 2 * kChunk, UE8M0>(v, bytes);
    if (ok) write(j, bytes, v, scale), write(j + 8, bytes + 2, v + kChunk, scale);
  }

 private:
  // Chunk j's bytes, its y values, and its group's scale if it is the group's first chunk.
  CG_DEVICE void write(int j, const uint32_t* bytes, const float* v, float scale) const {
    const uint32_t u = uint32_t(j);  // unsigned: / and % by TPG are a shift and a mask
    *reinterpret_cast<uint2*>(q + u * kChunk) = make_uint2(bytes[0], bytes[1]);
    float* s = scales + int64_t(u / TPG) * scale_col;  // outside the branch: a predicated store
    if (u % TPG == 0) *s = scale;
    if (y != nullptr) {
      float e[kChunk];
#pragma unroll
      for (int i = 0; i < kChunk; ++i) e[i] = v[i];
      Chunk<KIND> c;
      c.set(e);
      c.template store<true>(y, j * kChunk, kChunk);
    }
  }
};
#endif

// L2 prefetch of row t of x (and of the residual) by the row's first thread; none for t >= rows.
// Rows must be 16-byte aligned and h * BYTES a multiple of 16. A prefetch moves nothing into the
// SM and changes nothing a load sees (L2 is where every SM's writes land), so the kernels issue
// one for their own row before pdl_begin: the row streams in while the grid before drains.
template <int TPR, bool RESIDUAL>
CG_DEVICE void prefetch_row(const uint8_t* x, const uint8_t* res, int64_t x_stride,
                            int64_t res_stride, int bytes, int64_t t, int64_t rows, int tid) {
  if (uint32_t(tid) % TPR == 0 && t < rows) {
    prefetch_l2(x + t * x_stride, uint32_t(bytes));
    if constexpr (RESIDUAL) prefetch_l2(res + t * res_stride, uint32_t(bytes));
  }
}

// L2 prefetch for the register kernels, whose blocks hold one row group each: row `row + ahead`
// (ahead > 0). The block that takes that row later finds it there, and memory keeps streaming
// while this block does arithmetic rather than loads.
template <int TPR, bool RESIDUAL>
CG_DEVICE void prefetch_rows(const uint8_t* x, const uint8_t* res, int64_t x_stride,
                             int64_t res_stride, int bytes, int64_t row, int64_t rows,
                             int64_t ahead, int tid) {
  if (ahead > 0) {
    prefetch_row<TPR, RESIDUAL>(x, res, x_stride, res_stride, bytes, row + ahead, rows, tid);
  }
}

// rmsnorm_rows_staged's first STAGES - 1 rows of this thread's row group, into L2 (prefetch_row):
// what its kernels ask for before pdl_begin.
template <int TPR, bool RESIDUAL, int STAGES, int BLOCK>
CG_DEVICE void prefetch_staged_rows(const uint8_t* x, const uint8_t* res, int64_t x_stride,
                                    int64_t res_stride, int bytes, int64_t rows, int tid) {
  constexpr int RPB = BLOCK / TPR;
  const int64_t row = int64_t(block_x()) * RPB + tid / TPR, stride = int64_t(grid_x()) * RPB;
#pragma unroll
  for (int k = 0; k < STAGES - 1; ++k) {
    prefetch_row<TPR, RESIDUAL>(x, res, x_stride, res_stride, bytes, row + k * stride, rows, tid);
  }
}

// The register kernels' L2 prefetches: `ahead`, prefetch_rows' distance, the rows of half the
// blocks resident at once, 0 if the grid fits on the device at once or the target does not
// prefetch; `early`, the blocks that prefetch their own row before pdl_begin (prefetch_row):
// those resident at once, the only ones that can start while the grid before drains. H200,
// bf16, kernel time against no `ahead` (us): rmsnorm 16384 x 8192 140 -> 130,
// fused_add_rmsnorm 16384 x 4096 141 -> 130, rmsnorm_group_quant 16384 x 4096 72 -> 65 and
// 4096 x 7168 30.3 -> 29.7. The rows of all resident blocks ahead gained less and lost at some
// shapes (fused_add_rmsnorm 16384 x 7168 236 -> 242); a quarter of them about the same as half.
struct RowPrefetch {
  int64_t ahead, early;
};

// Added to resident_blocks' KEY by the kernels that write the residual to a tensor apart: their
// own kernels, with their own occupancy.
constexpr int kSeparateKey = 1 << 20;

template <int KEY, class Kernel>
static RowPrefetch row_prefetch(Kernel kernel, int block, int rows_per_block, int64_t blocks) {
  if (!kPrefetchL2) return {0, 0};
  const int64_t resident = resident_blocks<KEY>(kernel, block);
  return {resident > 0 && blocks > resident ? resident / 2 * rows_per_block : 0, resident};
}

}  // namespace cg
