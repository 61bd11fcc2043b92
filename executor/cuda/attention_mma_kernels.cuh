// Device code of the tensor-core attention (FlashAttention-2 structure, bf16 inputs, fp32
// accumulation, mma.sync m16n8k16); launchers in attention_mma.cu, declarations in
// attention_mma.hpp. Also run by the CPU emulator in the tests (executor/cuda/tests/
// cuda_emulator.hpp, mma_emulator.hpp): test_attention_mma_emulated.
//
// Status: ran on one H200 on 2026-11-28 (docs/GPU_PROOF.md); docs/CUDA.md, "Tensor-core attention (attention_mma)".
//
// Semantics are those of the SIMT kernel (attention_kernels.cuh) and of the CPU reference
// (cpu_backend.cpp attention_forward_block / attention_backward_block): q [tq, hq*d], k and v
// [tk, hkv*d] as bf16 words, GQA without repeating K/V, a key visible to a query iff same document
// and key index <= query index and the key lies in the query's hull kv_range[i] = [lo, hi); the
// forward merges the block into the running (o, lse) in the stable log-sum-exp form; the backward
// adds this block's dq, dk, dv (fp32 sums within the call, rounded once when the output is bf16).
//
// Rows and GQA. For KV head g the query rows are the (token i, head h) pairs with h / group == g,
// flattened as R = i * group + (h - g * group). The forward and dq kernels own 64 such rows per
// block (4 warps x 16: one mma M tile per warp) and stream the key block through shared memory in
// tiles of kN keys, double-buffered (cp.async on the GPU); the dk/dv kernel owns 64 keys (4 warps x
// 16) and streams the query rows in tiles of kM rows. The K/V tile of head g is read by every query
// head of its group: repeated KV heads are never materialised.
//
// Fragments. mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32; every fragment is loaded with
// the PTX ISA's index formulas (mma_a_row/col, mma_b_row/col, mma_c_row/col below, the same
// formulas the emulator interprets fragments with). A is row-major in shared memory (Q, dO, K, V
// tiles: one 32-bit load per register, two adjacent columns); B is either stored transposed (K or V
// rows for Q K^T and dO V^T, Q or dO rows for K Q^T and V dO^T: one 32-bit load per register) or
// row-major (V for P V, K for dS K, dO and Q for P^T dO and dS^T Q: two 16-bit loads per register).
// P and dS go from the accumulator layout of one mma straight into the A operand of the next
// (frag_a_from_c), rounded to bf16: the only roundings besides fp32 accumulation.
//
// Masking and loop bounds. The forward and dq kernels visit the key tiles of the union of their
// rows' hulls only (key tiles outside every row's hull are never visited); a tile in that span no
// row sees (other documents, causal) is skipped after one __syncthreads_or before its K/V is
// loaded; a warp none of whose 16 rows sees a key of the tile skips its mma's (warp vote). The
// dk/dv kernel skips query tiles none of whose hulls and masks reach its 64 keys, the same way.
// The exact per-pair test is applied to every score.
//
// Softmax in base 2 (scores scaled by scale * log2 e, exp2f), lse stored in natural log.
#pragma once
#if !defined(__CUDACC__)
// the CPU emulator: the CUDA spellings and mma.sync on fibers
#include "executor/cuda/tests/cuda_emulator.hpp"
#include "executor/cuda/tests/mma_emulator.hpp"
#endif
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#if !defined(__CUDA_ARCH__)
#include <cstring>
#endif

#include "executor/cuda/bf16_device.cuh"
#include "executor/cuda/warp_common.cuh"

#ifndef CTX_DYNAMIC_SMEM  // the emulator supplies its own block-shared buffer
#define CTX_DYNAMIC_SMEM(name) extern __shared__ float name[]
#endif
// Test seam: called by thread 0 for every tile a block examines (kernel 0 fwd, 1 dq, 2 dkdv; t0 the
// tile's first key or query row; loaded: whether its K/V or Q/dO rows were fetched). Empty unless
// a test defines it before including this header (test_attention_mma_emulated proves with it that
// tiles outside the hulls are never examined and masked tiles never loaded).
#ifndef CTX_MMA_TILE_HOOK
#define CTX_MMA_TILE_HOOK(kernel, t0, loaded) ((void)0)
#endif

namespace ctx::exec::cuda::dev {

constexpr int kMmaThreads = 128;        // 4 warps
constexpr int kMmaRows = 64;            // query rows per block (fwd, dq): 4 warps x 16
constexpr int kMmaKeys = 64;            // keys per block (dkdv): 4 warps x 16
constexpr int kMmaPad = 8;              // bf16 padding per shared row: rows 4 banks apart, fragment loads conflict-free
constexpr int kMmaMaxHeadDim = 128;
constexpr float kMmaLog2e = 1.4426950408889634f;
constexpr float kMmaLn2 = 0.6931471805599453f;

// Tile sizes by head-dimension bucket kD (32, 64, 128): keys per tile of the forward and dq
// kernels, query rows per tile of the dk/dv kernel. Smaller tiles at kD = 128 keep the
// accumulators in registers (no spills, checked with -Xptxas -v).
template <int kD>
struct MmaTiles {
  static constexpr int fwd_keys = 64;
  static constexpr int dq_keys = kD > 64 ? 32 : 64;
  static constexpr int dkdv_rows = kD > 64 ? 32 : 64;
};

struct MmaGeo {
  int64_t hq, hkv, group;
  int32_t d;      // head dim: a multiple of 16, at most the kernel's kD
  int32_t vec16;  // 1: q, k, v (and dout) are 16-byte aligned (16-byte copies), 0: 4-byte copies
  float scale;
};

// ---------------------------------------------------------------- mma.sync m16n8k16 fragments
// The PTX ISA's index formulas (groupID = lane >> 2, threadID_in_group = lane % 4), element i of
// the fragment; register j holds elements 2j (low 16 bits) and 2j + 1.
__device__ inline int mma_a_row(int lane, int i) { return (lane >> 2) + ((i & 2) ? 8 : 0); }
__device__ inline int mma_a_col(int lane, int i) { return (lane & 3) * 2 + (i & 1) + (i >= 4 ? 8 : 0); }
__device__ inline int mma_b_row(int lane, int i) { return (lane & 3) * 2 + (i & 1) + (i >= 2 ? 8 : 0); }  // k
__device__ inline int mma_b_col(int lane, int) { return lane >> 2; }                                   // n
__device__ inline int mma_c_row(int lane, int i) { return (lane >> 2) + (i >= 2 ? 8 : 0); }
__device__ inline int mma_c_col(int lane, int i) { return (lane & 3) * 2 + (i & 1); }

// Two adjacent bf16 of shared memory as one 32-bit word (p 4-byte aligned).
__device__ inline uint32_t ld_pair(const bf16_bits* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t u;
  std::memcpy(&u, p, 4);
  return u;
#endif
}
__device__ inline void st_pair(bf16_bits* p, uint32_t u) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint32_t*>(p) = u;
#else
  std::memcpy(p, &u, 4);
#endif
}

// A: 16x16 row-major, element (row, col) at A[row * ld + col]. Elements 2j and 2j + 1 are adjacent
// columns of one row: one 32-bit load per register.
__device__ inline void frag_load_a(uint32_t (&a)[4], const bf16_bits* A, int ld, int lane) {
#pragma unroll
  for (int j = 0; j < 4; ++j) a[j] = ld_pair(A + mma_a_row(lane, 2 * j) * ld + mma_a_col(lane, 2 * j));
}
// B: 16x8 (k, n) stored transposed, element (k, n) at Bt[n * ld + k] (rows of K, V, Q or dO):
// elements 2j and 2j + 1 are adjacent k of one n: one 32-bit load per register.
__device__ inline void frag_load_b_t(uint32_t (&b)[2], const bf16_bits* Bt, int ld, int lane) {
#pragma unroll
  for (int j = 0; j < 2; ++j) b[j] = ld_pair(Bt + mma_b_col(lane, 2 * j) * ld + mma_b_row(lane, 2 * j));
}
// B: 16x8 (k, n) stored row-major, element (k, n) at B[k * ld + n]: two 16-bit loads per register.
__device__ inline void frag_load_b(uint32_t (&b)[2], const bf16_bits* B, int ld, int lane) {
#pragma unroll
  for (int j = 0; j < 2; ++j)
    b[j] = static_cast<uint32_t>(B[mma_b_row(lane, 2 * j) * ld + mma_b_col(lane, 2 * j)]) |
           (static_cast<uint32_t>(B[mma_b_row(lane, 2 * j + 1) * ld + mma_b_col(lane, 2 * j + 1)]) << 16);
}
// The A operand (16 rows x 16 columns) from two accumulator tiles of 8 columns each, lo (columns
// 0..7) and hi (8..15), rounded to bf16. By the formulas: a0, a1 are (g, 2t), (g, 2t + 1) = c0, c1
// of lo; a2, a3 are (g + 8, 2t), (g + 8, 2t + 1) = c2, c3 of lo; a4..a7 the same of hi.
__device__ inline void frag_a_from_c(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_bf16x2(lo[0], lo[1]);
  a[1] = pack_bf16x2(lo[2], lo[3]);
  a[2] = pack_bf16x2(hi[0], hi[1]);
  a[3] = pack_bf16x2(hi[2], hi[3]);
}

// d += a * b, one warp-collective mma.sync m16n8k16 (bf16 in, fp32 accumulate).
__device__ inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif !defined(__CUDACC__)
  ::ctx_emu::mma::FragA fa;
  ::ctx_emu::mma::FragB fb;
  ::ctx_emu::mma::FragC fc;
  for (int j = 0; j < 4; ++j) fa.r[j] = a[j], fc.c[j] = d[j];
  for (int j = 0; j < 2; ++j) fb.r[j] = b[j];
  const ::ctx_emu::mma::FragC r = ::ctx_emu::mma::mma_sync(fa, fb, fc);
  for (int j = 0; j < 4; ++j) d[j] = r.c[j];
#endif
}

// ---------------------------------------------------------------- global -> shared copies
// cp.async on the GPU (16 bytes .cg, or 4 bytes .ca when a base pointer is only 4-byte aligned),
// completed by cp_async_wait and made visible by the __syncthreads after it; plain copies in the
// emulator (word by word, so the race detector sees every 4-byte word).
__device__ inline void cp_async_commit() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ inline void cp_async_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// Copies n rows of G.d bf16 into dst[n][ld] by the whole block; src(r) is the global row r
// (nullptr: the row is zero). Part of the caller's current cp.async group.
template <typename Src>
__device__ inline void mma_copy_rows(bf16_bits* dst, int ld, int n, const MmaGeo& G, Src src) {
  const int per = G.vec16 ? 8 : 2;  // bf16 per copy
  const int chunks = G.d / per;
  for (int c = threadIdx.x; c < n * chunks; c += blockDim.x) {
    const int r = c / chunks, e = (c - r * chunks) * per;
    const bf16_bits* s = src(r);
    bf16_bits* t = dst + r * ld + e;
#if defined(__CUDA_ARCH__)
    if (s == nullptr) {
      if (per == 8)
        *reinterpret_cast<uint4*>(t) = make_uint4(0u, 0u, 0u, 0u);
      else
        *reinterpret_cast<uint32_t*>(t) = 0u;
    } else {
      const unsigned sa = static_cast<unsigned>(__cvta_generic_to_shared(t));
      if (per == 8)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(s + e));
      else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(s + e));
    }
#else
    for (int w = 0; w < per; w += 2) st_pair(t + w, s ? ld_pair(s + e + w) : 0u);
#endif
  }
}

// ---------------------------------------------------------------- rows, hulls, visibility
__device__ inline bool mma_row(int64_t R, int64_t rows, const MmaGeo& G, int64_t g, int64_t& i, int64_t& h) {
  if (R >= rows) return false;
  i = R / G.group;
  h = g * G.group + R % G.group;
  return true;
}

// Ids and hulls of the block's kMmaRows query rows (invalid rows: index -1, document -2, empty hull).
__device__ inline void mma_load_row_ids(int64_t* Qi, int32_t* Qd, int32_t* Qlo, int32_t* Qhi, int64_t R0,
                                        int64_t rows, const MmaGeo& G, int64_t g, const int64_t* q_index,
                                        const int32_t* q_doc, const int32_t* kv_range) {
  if (threadIdx.x < kMmaRows) {
    int64_t i = 0, h = 0;
    const bool ok = mma_row(R0 + threadIdx.x, rows, G, g, i, h);
    Qi[threadIdx.x] = ok ? q_index[i] : -1;
    Qd[threadIdx.x] = ok ? q_doc[i] : -2;
    Qlo[threadIdx.x] = ok ? kv_range[2 * i] : 0;
    Qhi[threadIdx.x] = ok ? kv_range[2 * i + 1] : 0;
  }
}

// The key rows [*t_begin, *t_end) the block visits: the union of its rows' hulls, the start
// rounded down to the tile grid (multiples of kN). Empty when no row has a key.
__device__ inline void mma_key_span(const int32_t* Qlo, const int32_t* Qhi, int64_t tk, int kN, int64_t* t_begin,
                                    int64_t* t_end) {
  int64_t lo = tk, hi = 0;
  for (int r = 0; r < kMmaRows; ++r)
    if (Qlo[r] < Qhi[r]) {
      lo = Qlo[r] < lo ? Qlo[r] : lo;
      hi = Qhi[r] > hi ? Qhi[r] : hi;
    }
  if (lo < 0) lo = 0;
  if (hi > tk) hi = tk;
  *t_begin = lo / kN * kN;
  *t_end = hi;
}

// Writes the ids of key tile [t0, t0 + kN) into Ki/Kd (keys past tk: index INT64_MAX, never
// visible) and tells the block whether any of its rows sees any key of the tile (every thread
// checks one key against a share of the rows). One barrier (__syncthreads_or).
template <int kN>
__device__ inline bool mma_key_tile_visible(int64_t* Ki, int32_t* Kd, const int64_t* Qi, const int32_t* Qd,
                                            const int32_t* Qlo, const int32_t* Qhi, int64_t t0, int64_t tk,
                                            const int64_t* k_index, const int32_t* k_doc) {
  static_assert(kMmaThreads % kN == 0, "threads must cover the tile's keys");
  constexpr int kParts = kMmaThreads / kN, kShare = kMmaRows / kParts;
  const int j = threadIdx.x % kN, part = threadIdx.x / kN;
  const int64_t kj = t0 + j;
  const int64_t ki = kj < tk ? k_index[kj] : LLONG_MAX;
  const int32_t kd = kj < tk ? k_doc[kj] : -1;
  if (part == 0) {
    Ki[j] = ki;
    Kd[j] = kd;
  }
  int see = 0;
  for (int r = part * kShare; r < (part + 1) * kShare; ++r)
    see |= kj >= Qlo[r] && kj < Qhi[r] && ki <= Qi[r] && kd == Qd[r];
  return __syncthreads_or(see) != 0;
}

// ---------------------------------------------------------------- forward
// o (T: float or bf16 words) and lse [tq, hq] hold the running result: lse -inf means no visible
// key yet. This block's result is merged in; rows with no visible key in it are left untouched.
template <int kD, int kN, typename T>
__global__ void __launch_bounds__(kMmaThreads)
    attn_mma_fwd_kernel(T* o, float* lse, const bf16_bits* q, const int64_t* q_index, const int32_t* q_doc, int64_t tq,
                        const bf16_bits* k, const bf16_bits* v, const int64_t* k_index, const int32_t* k_doc,
                        int64_t tk, const int32_t* kv_range, MmaGeo G) {
  static_assert(kD % 16 == 0 && kD <= kMmaMaxHeadDim && kN % 16 == 0 && kN <= 64, "tile shapes");
  constexpr int kNT = kN / 8, kDT = kD / 8;
  CTX_DYNAMIC_SMEM(smem);
  const int d = G.d, ld = d + kMmaPad;
  bf16_bits* Qs = reinterpret_cast<bf16_bits*>(smem);     // [kMmaRows][ld]
  bf16_bits* Ks = Qs + kMmaRows * ld;                      // [2][kN][ld]
  bf16_bits* Vs = Ks + 2 * kN * ld;                        // [2][kN][ld]
  int64_t* Qi = reinterpret_cast<int64_t*>(Vs + 2 * kN * ld);  // [kMmaRows]
  int64_t* Ki = Qi + kMmaRows;                                 // [2][kN]
  int32_t* Qd = reinterpret_cast<int32_t*>(Ki + 2 * kN);       // [kMmaRows]
  int32_t* Qlo = Qd + kMmaRows;                                // [kMmaRows]
  int32_t* Qhi = Qlo + kMmaRows;                               // [kMmaRows]
  int32_t* Kd = Qhi + kMmaRows;                                // [2][kN]

  const int64_t g = blockIdx.y, rows = tq * G.group, R0 = static_cast<int64_t>(blockIdx.x) * kMmaRows;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t kv_ld = G.hkv * d;

  mma_copy_rows(Qs, ld, kMmaRows, G, [&](int r) -> const bf16_bits* {
    int64_t i, h;
    return mma_row(R0 + r, rows, G, g, i, h) ? q + (i * G.hq + h) * d : nullptr;
  });
  cp_async_commit();
  mma_load_row_ids(Qi, Qd, Qlo, Qhi, R0, rows, G, g, q_index, q_doc, kv_range);
  __syncthreads();
  int64_t t_begin, t_end;
  mma_key_span(Qlo, Qhi, tk, kN, &t_begin, &t_end);

  // this lane's two rows: warp * 16 + groupID (+ 8)
  int64_t qidx[2];
  int32_t qdoc[2], qlo[2], qhi[2];
  float m[2], l[2], acc[kDT][4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int rr = warp * 16 + (lane >> 2) + 8 * r;
    qidx[r] = Qi[rr];
    qdoc[r] = Qd[rr];
    qlo[r] = Qlo[rr];
    qhi[r] = Qhi[rr];
    m[r] = -INFINITY;  // running maximum, log2 units
    l[r] = 0.0f;       // this lane's part of the running sum
  }
#pragma unroll
  for (int dn = 0; dn < kDT; ++dn)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[dn][i] = 0.0f;
  const float sl2 = G.scale * kMmaLog2e;

  auto load_kv = [&](int b, int64_t t0) {
    mma_copy_rows(Ks + b * kN * ld, ld, kN, G,
                  [&](int j) -> const bf16_bits* { return t0 + j < tk ? k + (t0 + j) * kv_ld + g * d : nullptr; });
    mma_copy_rows(Vs + b * kN * ld, ld, kN, G,
                  [&](int j) -> const bf16_bits* { return t0 + j < tk ? v + (t0 + j) * kv_ld + g * d : nullptr; });
    cp_async_commit();
  };
  auto visible = [&](int b, int64_t t0) {
    const bool see = mma_key_tile_visible<kN>(Ki + b * kN, Kd + b * kN, Qi, Qd, Qlo, Qhi, t0, tk, k_index, k_doc);
    if (threadIdx.x == 0) CTX_MMA_TILE_HOOK(0, t0, see);
    return see;
  };

  int buf = 0;
  int64_t t = t_begin;
  while (t < t_end && !visible(buf, t)) t += kN;
  if (t < t_end) load_kv(buf, t);
  while (t < t_end) {
    // the next visible tile goes into the other buffer while this one is computed
    int64_t tn = t + kN;
    while (tn < t_end && !visible(buf ^ 1, tn)) tn += kN;
    if (tn < t_end) {
      load_kv(buf ^ 1, tn);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    const bf16_bits* Kb = Ks + buf * kN * ld;
    const bf16_bits* Vb = Vs + buf * kN * ld;
    const int64_t* Kib = Ki + buf * kN;
    const int32_t* Kdb = Kd + buf * kN;
    uint32_t vis = 0;  // bit nt * 4 + i: score element i of n-tile nt is visible
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = i >> 1, jj = nt * 8 + mma_c_col(lane, i);
        const int64_t kj = t + jj;
        if (kj >= qlo[r] && kj < qhi[r] && Kib[jj] <= qidx[r] && Kdb[jj] == qdoc[r]) vis |= 1u << (nt * 4 + i);
      }
    if (__any_sync(kFull, vis != 0)) {  // uniform across the warp
      float s[kNT][4];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[nt][i] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        if (kk * 16 >= d) break;
        uint32_t a[4];
        frag_load_a(a, Qs + warp * 16 * ld + kk * 16, ld, lane);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          uint32_t b[2];
          frag_load_b_t(b, Kb + nt * 8 * ld + kk * 16, ld, lane);
          mma_16816(s[nt], a, b);  // S = Q K^T
        }
      }
      // online softmax over this tile (rows g and g + 8 of the warp's 16; the quad's 4 lanes hold a row)
      float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[nt][i] = (vis >> (nt * 4 + i)) & 1u ? s[nt][i] * sl2 : -INFINITY;
          mt[i >> 1] = fmaxf(mt[i >> 1], s[nt][i]);
        }
      float f[2], psum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mt[r] = fmaxf(mt[r], __shfl_xor_sync(kFull, mt[r], 1));
        mt[r] = fmaxf(mt[r], __shfl_xor_sync(kFull, mt[r], 2));
        const float mn = fmaxf(m[r], mt[r]);
        f[r] = mn == -INFINITY ? 1.0f : exp2f(m[r] - mn);  // 0 when nothing was seen before
        m[r] = mn;
      }
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float p = s[nt][i] == -INFINITY ? 0.0f : exp2f(s[nt][i] - m[i >> 1]);
          s[nt][i] = p;
          psum[i >> 1] += p;
        }
#pragma unroll
      for (int r = 0; r < 2; ++r) l[r] = l[r] * f[r] + psum[r];
#pragma unroll
      for (int dn = 0; dn < kDT; ++dn)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[dn][i] *= f[i >> 1];
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
        uint32_t a[4];
        frag_a_from_c(a, s[2 * kk], s[2 * kk + 1]);  // P, bf16
#pragma unroll
        for (int dn = 0; dn < kDT; ++dn) {
          if (dn * 8 >= d) break;
          uint32_t b[2];
          frag_load_b(b, Vb + kk * 16 * ld + dn * 8, ld, lane);
          mma_16816(acc[dn], a, b);  // O += P V
        }
      }
    }
    __syncthreads();  // the buffer is read; the next round overwrites it
    buf ^= 1;
    t = tn;
  }
  cp_async_wait<0>();  // the Q copy when no tile was visited

  // merge this block's (acc / l, m ln 2 + log l) into the running (o, lse), as cpu_backend.cpp
  bool ok[2];
  int64_t orow[2];
  float old[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(kFull, l[r], 1);
    l[r] += __shfl_xor_sync(kFull, l[r], 2);
    int64_t i = 0, h = 0;
    ok[r] = mma_row(R0 + warp * 16 + (lane >> 2) + 8 * r, rows, G, g, i, h) && l[r] > 0.0f;
    orow[r] = ok[r] ? i * G.hq + h : 0;
    old[r] = ok[r] ? lse[orow[r]] : 0.0f;
  }
  __syncwarp();  // every lane of the quad has read lse before its first lane writes it
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!ok[r]) continue;  // no visible key in this block: the row is untouched
    const float blk = m[r] * kMmaLn2 + logf(l[r]);
    float w_old = 0.0f, w_new = 1.0f / l[r], nl = blk;
    const bool first = old[r] == -INFINITY;
    if (!first) {
      const float hi = fmaxf(old[r], blk), lo = fminf(old[r], blk);
      nl = hi + log1pf(expf(lo - hi));
      w_old = expf(old[r] - nl);
      w_new = expf(blk - nl) / l[r];
    }
    T* op = o + orow[r] * d;
#pragma unroll
    for (int dn = 0; dn < kDT; ++dn) {
      if (dn * 8 >= d) break;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int e = dn * 8 + mma_c_col(lane, 2 * r + c);
        const float a = acc[dn][2 * r + c];
        st(op, e, first ? a * w_new : dev::ld(op, e) * w_old + a * w_new);
      }
    }
    if ((lane & 3) == 0) lse[orow[r]] = nl;
  }
}

// ---------------------------------------------------------------- backward: dq
// dq (T) += this block's dS K for the block's 64 query rows; lse, delta [tq, hq] f32 are final.
template <int kD, int kN, typename T>
__global__ void __launch_bounds__(kMmaThreads)
    attn_mma_dq_kernel(T* dq, const bf16_bits* q, const int64_t* q_index, const int32_t* q_doc, int64_t tq,
                       const bf16_bits* k, const bf16_bits* v, const int64_t* k_index, const int32_t* k_doc,
                       int64_t tk, const int32_t* kv_range, const bf16_bits* dout, const float* lse,
                       const float* delta, MmaGeo G) {
  static_assert(kD % 16 == 0 && kD <= kMmaMaxHeadDim && kN % 16 == 0 && kN <= 64, "tile shapes");
  constexpr int kNT = kN / 8, kDT = kD / 8;
  CTX_DYNAMIC_SMEM(smem);
  const int d = G.d, ld = d + kMmaPad;
  bf16_bits* Qs = reinterpret_cast<bf16_bits*>(smem);     // [kMmaRows][ld]
  bf16_bits* Os = Qs + kMmaRows * ld;                      // [kMmaRows][ld] dout rows
  bf16_bits* Ks = Os + kMmaRows * ld;                      // [2][kN][ld]
  bf16_bits* Vs = Ks + 2 * kN * ld;                        // [2][kN][ld]
  int64_t* Qi = reinterpret_cast<int64_t*>(Vs + 2 * kN * ld);
  int64_t* Ki = Qi + kMmaRows;
  int32_t* Qd = reinterpret_cast<int32_t*>(Ki + 2 * kN);
  int32_t* Qlo = Qd + kMmaRows;
  int32_t* Qhi = Qlo + kMmaRows;
  int32_t* Kd = Qhi + kMmaRows;

  const int64_t g = blockIdx.y, rows = tq * G.group, R0 = static_cast<int64_t>(blockIdx.x) * kMmaRows;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t kv_ld = G.hkv * d;

  auto qrow = [&](const bf16_bits* base) {
    return [=, &G](int r) -> const bf16_bits* {
      int64_t i, h;
      return mma_row(R0 + r, rows, G, g, i, h) ? base + (i * G.hq + h) * d : nullptr;
    };
  };
  mma_copy_rows(Qs, ld, kMmaRows, G, qrow(q));
  mma_copy_rows(Os, ld, kMmaRows, G, qrow(dout));
  cp_async_commit();
  mma_load_row_ids(Qi, Qd, Qlo, Qhi, R0, rows, G, g, q_index, q_doc, kv_range);
  __syncthreads();
  int64_t t_begin, t_end;
  mma_key_span(Qlo, Qhi, tk, kN, &t_begin, &t_end);

  int64_t qidx[2], grow[2];
  int32_t qdoc[2], qlo[2], qhi[2];
  bool valid[2];
  float L2[2], Dr[2], acc[kDT][4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int rr = warp * 16 + (lane >> 2) + 8 * r;
    qidx[r] = Qi[rr];
    qdoc[r] = Qd[rr];
    qlo[r] = Qlo[rr];
    qhi[r] = Qhi[rr];
    int64_t i = 0, h = 0;
    valid[r] = mma_row(R0 + rr, rows, G, g, i, h);
    grow[r] = valid[r] ? i * G.hq + h : 0;
    L2[r] = valid[r] ? lse[grow[r]] * kMmaLog2e : 0.0f;
    Dr[r] = valid[r] ? delta[grow[r]] : 0.0f;
  }
#pragma unroll
  for (int dn = 0; dn < kDT; ++dn)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[dn][i] = 0.0f;
  const float sl2 = G.scale * kMmaLog2e;

  auto load_kv = [&](int b, int64_t t0) {
    mma_copy_rows(Ks + b * kN * ld, ld, kN, G,
                  [&](int j) -> const bf16_bits* { return t0 + j < tk ? k + (t0 + j) * kv_ld + g * d : nullptr; });
    mma_copy_rows(Vs + b * kN * ld, ld, kN, G,
                  [&](int j) -> const bf16_bits* { return t0 + j < tk ? v + (t0 + j) * kv_ld + g * d : nullptr; });
    cp_async_commit();
  };
  auto visible = [&](int b, int64_t t0) {
    const bool see = mma_key_tile_visible<kN>(Ki + b * kN, Kd + b * kN, Qi, Qd, Qlo, Qhi, t0, tk, k_index, k_doc);
    if (threadIdx.x == 0) CTX_MMA_TILE_HOOK(1, t0, see);
    return see;
  };

  int buf = 0;
  int64_t t = t_begin;
  while (t < t_end && !visible(buf, t)) t += kN;
  if (t < t_end) load_kv(buf, t);
  while (t < t_end) {
    int64_t tn = t + kN;
    while (tn < t_end && !visible(buf ^ 1, tn)) tn += kN;
    if (tn < t_end) {
      load_kv(buf ^ 1, tn);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    const bf16_bits* Kb = Ks + buf * kN * ld;
    const bf16_bits* Vb = Vs + buf * kN * ld;
    const int64_t* Kib = Ki + buf * kN;
    const int32_t* Kdb = Kd + buf * kN;
    uint32_t vis = 0;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = i >> 1, jj = nt * 8 + mma_c_col(lane, i);
        const int64_t kj = t + jj;
        if (kj >= qlo[r] && kj < qhi[r] && Kib[jj] <= qidx[r] && Kdb[jj] == qdoc[r]) vis |= 1u << (nt * 4 + i);
      }
    if (__any_sync(kFull, vis != 0)) {
      float s[kNT][4], dp[kNT][4];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[nt][i] = dp[nt][i] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        if (kk * 16 >= d) break;
        uint32_t aq[4], ao[4];
        frag_load_a(aq, Qs + warp * 16 * ld + kk * 16, ld, lane);
        frag_load_a(ao, Os + warp * 16 * ld + kk * 16, ld, lane);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          uint32_t b[2];
          frag_load_b_t(b, Kb + nt * 8 * ld + kk * 16, ld, lane);
          mma_16816(s[nt], aq, b);  // S = Q K^T
          frag_load_b_t(b, Vb + nt * 8 * ld + kk * 16, ld, lane);
          mma_16816(dp[nt], ao, b);  // dP = dO V^T
        }
      }
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = i >> 1;
          const float p = (vis >> (nt * 4 + i)) & 1u ? exp2f(s[nt][i] * sl2 - L2[r]) : 0.0f;
          s[nt][i] = p * (dp[nt][i] - Dr[r]) * G.scale;  // dS
        }
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
        uint32_t a[4];
        frag_a_from_c(a, s[2 * kk], s[2 * kk + 1]);  // dS, bf16
#pragma unroll
        for (int dn = 0; dn < kDT; ++dn) {
          if (dn * 8 >= d) break;
          uint32_t b[2];
          frag_load_b(b, Kb + kk * 16 * ld + dn * 8, ld, lane);
          mma_16816(acc[dn], a, b);  // dQ += dS K
        }
      }
    }
    __syncthreads();
    buf ^= 1;
    t = tn;
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!valid[r]) continue;
    T* qp = dq + grow[r] * d;
#pragma unroll
    for (int dn = 0; dn < kDT; ++dn) {
      if (dn * 8 >= d) break;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int e = dn * 8 + mma_c_col(lane, 2 * r + c);
        st(qp, e, dev::ld(qp, e) + acc[dn][2 * r + c]);
      }
    }
  }
}

// ---------------------------------------------------------------- backward: dk, dv
// dk, dv (T) += this block's dS^T Q and P^T dO for the block's 64 keys of KV head blockIdx.y,
// over every query row of the group (query tiles of kM rows no hull or mask lets see these keys
// are skipped before their rows are loaded).
template <int kD, int kM, typename T>
__global__ void __launch_bounds__(kMmaThreads)
    attn_mma_dkdv_kernel(T* dk, T* dv, const bf16_bits* q, const int64_t* q_index, const int32_t* q_doc, int64_t tq,
                         const bf16_bits* k, const bf16_bits* v, const int64_t* k_index, const int32_t* k_doc,
                         int64_t tk, const int32_t* kv_range, const bf16_bits* dout, const float* lse,
                         const float* delta, MmaGeo G) {
  static_assert(kD % 16 == 0 && kD <= kMmaMaxHeadDim && kM % 16 == 0 && kM <= 64, "tile shapes");
  static_assert(kMmaThreads % kM == 0, "threads must cover the query tile");
  constexpr int kMT = kM / 8, kDT = kD / 8;
  CTX_DYNAMIC_SMEM(smem);
  const int d = G.d, ld = d + kMmaPad;
  bf16_bits* Ks = reinterpret_cast<bf16_bits*>(smem);     // [kMmaKeys][ld]
  bf16_bits* Vs = Ks + kMmaKeys * ld;                      // [kMmaKeys][ld]
  bf16_bits* Qs = Vs + kMmaKeys * ld;                      // [2][kM][ld]
  bf16_bits* Os = Qs + 2 * kM * ld;                        // [2][kM][ld] dout rows
  int64_t* Ki = reinterpret_cast<int64_t*>(Os + 2 * kM * ld);  // [kMmaKeys]
  int64_t* Qi = Ki + kMmaKeys;                                 // [2][kM]
  int32_t* Kd = reinterpret_cast<int32_t*>(Qi + 2 * kM);       // [kMmaKeys]
  int32_t* Qd = Kd + kMmaKeys;                                 // [2][kM]
  int32_t* Qlo = Qd + 2 * kM;                                  // [2][kM]
  int32_t* Qhi = Qlo + 2 * kM;                                 // [2][kM]
  float* Ls = reinterpret_cast<float*>(Qhi + 2 * kM);          // [2][kM] lse, log2 units
  float* Dl = Ls + 2 * kM;                                     // [2][kM] delta

  const int64_t g = blockIdx.y, rows = tq * G.group, J0 = static_cast<int64_t>(blockIdx.x) * kMmaKeys;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t kv_ld = G.hkv * d;

  auto krow = [&](const bf16_bits* base) {
    return [=](int j) -> const bf16_bits* { return J0 + j < tk ? base + (J0 + j) * kv_ld + g * d : nullptr; };
  };
  mma_copy_rows(Ks, ld, kMmaKeys, G, krow(k));
  mma_copy_rows(Vs, ld, kMmaKeys, G, krow(v));
  cp_async_commit();
  if (threadIdx.x < kMmaKeys) {
    const int64_t j = J0 + threadIdx.x;
    Ki[threadIdx.x] = j < tk ? k_index[j] : LLONG_MAX;
    Kd[threadIdx.x] = j < tk ? k_doc[j] : -1;
  }
  __syncthreads();

  // this lane's two keys: warp * 16 + groupID (+ 8)
  int64_t kpos[2], kidx[2];
  int32_t kdoc[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int jj = warp * 16 + (lane >> 2) + 8 * r;
    kpos[r] = J0 + jj;
    kidx[r] = Ki[jj];
    kdoc[r] = Kd[jj];
  }
  float dka[kDT][4], dva[kDT][4];
#pragma unroll
  for (int dn = 0; dn < kDT; ++dn)
#pragma unroll
    for (int i = 0; i < 4; ++i) dka[dn][i] = dva[dn][i] = 0.0f;
  const float sl2 = G.scale * kMmaLog2e;

  // ids, hulls, lse and delta of query tile [R0, R0 + kM) into buffer b, and whether any of its
  // rows sees any of the block's keys (every thread checks one row against a share of the keys)
  auto visible = [&](int b, int64_t R0) {
    constexpr int kParts = kMmaThreads / kM, kShare = kMmaKeys / kParts;
    const int r = threadIdx.x % kM, part = threadIdx.x / kM;
    int64_t i = 0, h = 0;
    const bool ok = mma_row(R0 + r, rows, G, g, i, h);
    const int64_t qi = ok ? q_index[i] : -1;
    const int32_t qd = ok ? q_doc[i] : -2, lo = ok ? kv_range[2 * i] : 0, hi = ok ? kv_range[2 * i + 1] : 0;
    if (part == 0) {
      Qi[b * kM + r] = qi;
      Qd[b * kM + r] = qd;
      Qlo[b * kM + r] = lo;
      Qhi[b * kM + r] = hi;
      Ls[b * kM + r] = ok ? lse[i * G.hq + h] * kMmaLog2e : 0.0f;
      Dl[b * kM + r] = ok ? delta[i * G.hq + h] : 0.0f;
    }
    int see = 0;
    if (lo < J0 + kMmaKeys && hi > J0)  // the row's hull reaches the block's keys
      for (int jj = part * kShare; jj < (part + 1) * kShare; ++jj)
        see |= J0 + jj >= lo && J0 + jj < hi && Ki[jj] <= qi && Kd[jj] == qd;
    const bool any = __syncthreads_or(see) != 0;
    if (threadIdx.x == 0) CTX_MMA_TILE_HOOK(2, R0, any);
    return any;
  };
  auto load_q = [&](int b, int64_t R0) {
    auto qrow = [&](const bf16_bits* base) {
      return [=, &G](int r) -> const bf16_bits* {
        int64_t i, h;
        return mma_row(R0 + r, rows, G, g, i, h) ? base + (i * G.hq + h) * d : nullptr;
      };
    };
    mma_copy_rows(Qs + b * kM * ld, ld, kM, G, qrow(q));
    mma_copy_rows(Os + b * kM * ld, ld, kM, G, qrow(dout));
    cp_async_commit();
  };

  int buf = 0;
  int64_t t = 0;
  while (t < rows && !visible(buf, t)) t += kM;
  if (t < rows) load_q(buf, t);
  while (t < rows) {
    int64_t tn = t + kM;
    while (tn < rows && !visible(buf ^ 1, tn)) tn += kM;
    if (tn < rows) {
      load_q(buf ^ 1, tn);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    const bf16_bits* Qb = Qs + buf * kM * ld;
    const bf16_bits* Ob = Os + buf * kM * ld;
    const int64_t* Qib = Qi + buf * kM;
    const int32_t* Qdb = Qd + buf * kM;
    const int32_t* Qlob = Qlo + buf * kM;
    const int32_t* Qhib = Qhi + buf * kM;
    const float* Lb = Ls + buf * kM;
    const float* Db = Dl + buf * kM;
    uint32_t vis = 0;  // bit nt * 4 + i: element i (key row, query column) of n-tile nt
#pragma unroll
    for (int nt = 0; nt < kMT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = i >> 1, c = nt * 8 + mma_c_col(lane, i);
        if (kpos[r] >= Qlob[c] && kpos[r] < Qhib[c] && kidx[r] <= Qib[c] && kdoc[r] == Qdb[c])
          vis |= 1u << (nt * 4 + i);
      }
    if (__any_sync(kFull, vis != 0)) {
      float s[kMT][4], dp[kMT][4];
#pragma unroll
      for (int nt = 0; nt < kMT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[nt][i] = dp[nt][i] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        if (kk * 16 >= d) break;
        uint32_t ak[4], av[4];
        frag_load_a(ak, Ks + warp * 16 * ld + kk * 16, ld, lane);
        frag_load_a(av, Vs + warp * 16 * ld + kk * 16, ld, lane);
#pragma unroll
        for (int nt = 0; nt < kMT; ++nt) {
          uint32_t b[2];
          frag_load_b_t(b, Qb + nt * 8 * ld + kk * 16, ld, lane);
          mma_16816(s[nt], ak, b);  // S^T = K Q^T
          frag_load_b_t(b, Ob + nt * 8 * ld + kk * 16, ld, lane);
          mma_16816(dp[nt], av, b);  // dP^T = V dO^T
        }
      }
#pragma unroll
      for (int nt = 0; nt < kMT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = nt * 8 + mma_c_col(lane, i);
          const float p = (vis >> (nt * 4 + i)) & 1u ? exp2f(s[nt][i] * sl2 - Lb[c]) : 0.0f;
          s[nt][i] = p;                                  // P^T
          dp[nt][i] = p * (dp[nt][i] - Db[c]) * G.scale;  // dS^T
        }
#pragma unroll
      for (int kk = 0; kk < kM / 16; ++kk) {
        uint32_t ap[4], as[4];
        frag_a_from_c(ap, s[2 * kk], s[2 * kk + 1]);
        frag_a_from_c(as, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
        for (int dn = 0; dn < kDT; ++dn) {
          if (dn * 8 >= d) break;
          uint32_t b[2];
          frag_load_b(b, Ob + kk * 16 * ld + dn * 8, ld, lane);
          mma_16816(dva[dn], ap, b);  // dV += P^T dO
          frag_load_b(b, Qb + kk * 16 * ld + dn * 8, ld, lane);
          mma_16816(dka[dn], as, b);  // dK += dS^T Q
        }
      }
    }
    __syncthreads();
    buf ^= 1;
    t = tn;
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (kpos[r] >= tk) continue;
    T* kp = dk + kpos[r] * kv_ld + g * d;
    T* vp = dv + kpos[r] * kv_ld + g * d;
#pragma unroll
    for (int dn = 0; dn < kDT; ++dn) {
      if (dn * 8 >= d) break;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int e = dn * 8 + mma_c_col(lane, 2 * r + c);
        st(kp, e, dev::ld(kp, e) + dka[dn][2 * r + c]);
        st(vp, e, dev::ld(vp, e) + dva[dn][2 * r + c]);
      }
    }
  }
}

// ---------------------------------------------------------------- launch geometry (host)
// Dynamic shared memory per block for head dim d (bf16 tiles with rows of d + kMmaPad, then ids).
inline size_t mma_fwd_smem(int64_t d, int kN) {
  const size_t ld = static_cast<size_t>(d + kMmaPad);
  return (kMmaRows + 4 * kN) * ld * 2 + (kMmaRows + 2 * kN) * 8 + (3 * kMmaRows + 2 * kN) * 4;
}
inline size_t mma_dq_smem(int64_t d, int kN) {
  const size_t ld = static_cast<size_t>(d + kMmaPad);
  return (2 * kMmaRows + 4 * kN) * ld * 2 + (kMmaRows + 2 * kN) * 8 + (3 * kMmaRows + 2 * kN) * 4;
}
inline size_t mma_dkdv_smem(int64_t d, int kM) {
  const size_t ld = static_cast<size_t>(d + kMmaPad);
  return (2 * kMmaKeys + 4 * kM) * ld * 2 + (kMmaKeys + 2 * kM) * 8 + (kMmaKeys + 6 * kM) * 4 + 4 * kM * 4;
}
// The head-dimension bucket (template kD) a head dim runs in; 0 when unsupported.
inline int mma_bucket(int64_t d) {
  if (d < 16 || d > kMmaMaxHeadDim || d % 16 != 0) return 0;
  return d <= 32 ? 32 : d <= 64 ? 64 : 128;
}
inline unsigned mma_row_blocks(int64_t tq, int64_t group) {
  return static_cast<unsigned>((tq * group + kMmaRows - 1) / kMmaRows);
}
inline unsigned mma_key_blocks(int64_t tk) { return static_cast<unsigned>((tk + kMmaKeys - 1) / kMmaKeys); }

}  // namespace ctx::exec::cuda::dev
