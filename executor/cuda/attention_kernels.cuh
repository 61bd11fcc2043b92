// Device code of the flash-style blockwise attention (head_dim <= 256); launchers in
// attention.cu. Storage: each kernel is a template on the storage type of its inputs T (q, k, v,
// dout) and of its output (o; dq; dk and dv), each float or uint16_t (bf16 bits): tiles are
// widened into float shared memory on load, all arithmetic is float (as the fp32 kernel's), and a
// bf16 output is read, updated in float and rounded once per call (bf16_device.cuh), as the CPU
// reference does (backend.hpp). Inputs and outputs may differ: under context parallelism the
// merged output and dQ accumulate in fp32 buffers while q, k, v are bf16. lse and delta are f32. Also run by the CPU emulator in the tests (executor/cuda/tests/cuda_emulator.hpp).
//
// Rows and GQA. For KV head g the query rows are the (token i, query head h) pairs with
// h / group == g, flattened as R = i * group + (h - g * group). A thread block owns 16 such rows
// (4 warps x 4 rows) and streams the key block through shared memory 32 keys at a time, so the
// K/V tile of head g is loaded once and read by every query head of its group: repeated KV heads
// are never materialised.
//
// Warp layout. In the score step lane j owns key j of the tile (q.k over the head dimension, the
// key row padded by one float so the 32 lanes hit 32 banks); in the P.V step lane e owns head
// dimensions e, e+32, ... (up to 8 per lane) and the 32 probabilities are broadcast by shuffles.
//
// Masking. A key is visible to a query iff same document and key index <= query index
// (TokenRefs), evaluated per pair from the token ids, and only inside the query's hull
// kv_range[i] = [lo, hi) of key rows (the KeyBlock's, computed by the strategy code from the token
// layout): the forward and dq kernels loop over the union of their rows' hulls only (key tiles
// outside every row's hull are never visited), the dk/dv kernel skips query tiles none of whose
// hulls reach its keys, and the exact mask check stays inside. A tile no row of a warp can see is
// skipped by a warp vote. Keys past the end of the block get index INT64_MAX, i.e. invisible.
//
// Status: ran on one H200 on 2026-11-28 (docs/GPU_PROOF.md); this source also runs on the CPU emulator.
//
// Forward merges the block into the running (o, lse) exactly as cpu_backend.cpp does: a block with
// no visible key leaves the row untouched; otherwise the stable form new = hi + log1p(exp(lo-hi)).
// Backward is FlashAttention-2's: one kernel owns query rows and accumulates dq over key tiles,
// a second owns keys and accumulates dk, dv over query tiles; both recompute p from the saved lse,
// neither needs atomics, so results are deterministic.
#pragma once
#include <climits>
#include <cstddef>
#include <cmath>
#include <cstdint>

#include "executor/cuda/bf16_device.cuh"
#include "executor/cuda/kernels.hpp"
#include "executor/cuda/warp_common.cuh"

#ifndef CTX_DYNAMIC_SMEM  // the emulator supplies its own block-shared buffer
#define CTX_DYNAMIC_SMEM(name) extern __shared__ float name[]
#endif

namespace ctx::exec::cuda::dev {

using k::kMaxHeadDim;
constexpr int kTile = 32;      // keys per tile (fwd, dq) = query rows per tile (dkdv)
constexpr int kPerWarp = 4;    // rows (fwd, dq) or keys (dkdv) per warp
constexpr int kWarps = 4;
constexpr int kOwn = kPerWarp * kWarps;   // rows or keys a block owns
constexpr int kMaxC = kMaxHeadDim / 32;   // head-dimension slots per lane

struct Geo {  // shapes shared by the three kernels
  int64_t hq, hkv, d, group;
  float scale;
};

// A flattened query row of KV head g: its token, its query head, and whether it exists.
__device__ inline bool row_of(int64_t R, int64_t rows, const Geo& G, int64_t g, int64_t& i, int64_t& h) {
  if (R >= rows) return false;
  i = R / G.group;
  h = g * G.group + R % G.group;
  return true;
}

// Loads `n` rows (of `d` values, float or bf16, widened to float, from row pointers computed by
// `at`) into shared memory with destination stride `stride`; rows past the end are zero.
template <typename At>
__device__ void load_rows(float* dst, int stride, int n, int64_t d, At at) {
  for (int t = threadIdx.x; t < n * d; t += blockDim.x) {
    const int r = t / static_cast<int>(d), e = t % static_cast<int>(d);
    const auto* src = at(r);
    dst[r * stride + e] = src ? ld(src, e) : 0.0f;
  }
}

// The indices, documents and key hulls of a block's query rows (invalid rows: index -1, empty
// hull, sees nothing).
__device__ inline void load_row_ids(int64_t* Qi, int32_t* Qd, int32_t* Qlo, int32_t* Qhi, int64_t R0, int64_t rows,
                                    const Geo& G, int64_t g, const int64_t* q_index, const int32_t* q_doc,
                                    const int32_t* kv_range) {
  if (threadIdx.x < kOwn) {
    int64_t i, h;
    const bool ok = row_of(R0 + threadIdx.x, rows, G, g, i, h);
    Qi[threadIdx.x] = ok ? q_index[i] : -1;
    Qd[threadIdx.x] = ok ? q_doc[i] : -2;
    Qlo[threadIdx.x] = ok ? kv_range[2 * i] : 0;
    Qhi[threadIdx.x] = ok ? kv_range[2 * i + 1] : 0;
  }
}

// The key rows [*t_begin, *t_end) a block of query rows must visit: the union of its rows' hulls,
// widened to whole tiles at the start. Called by every thread after load_row_ids and a barrier.
__device__ inline void block_key_span(const int32_t* Qlo, const int32_t* Qhi, int64_t tk, int64_t* t_begin,
                                      int64_t* t_end) {
  int64_t lo = tk, hi = 0;
  for (int r = 0; r < kOwn; ++r)
    if (Qlo[r] < Qhi[r]) {
      lo = Qlo[r] < lo ? Qlo[r] : lo;
      hi = Qhi[r] > hi ? Qhi[r] : hi;
    }
  if (lo < 0) lo = 0;
  if (hi > tk) hi = tk;
  *t_begin = lo / kTile * kTile;
  *t_end = hi;  // <= t_begin when no row sees anything: the loop does not run
}

// Loads the key tile's indices and documents (keys past tk: index INT64_MAX, never visible) and
// tells the whole block whether any of its query rows sees any key of the tile, so fully masked
// tiles (causal: keys after every query; other documents) cost two barriers and no K/V loads.
// Called by every thread; starts with a barrier (the previous tile may still be read).
__device__ inline bool key_tile_visible(int64_t* Ki, int32_t* Kd, const int64_t* Qi, const int32_t* Qd,
                                        const int32_t* Qlo, const int32_t* Qhi, int64_t t0, int64_t tk,
                                        const int64_t* k_index, const int32_t* k_doc) {
  __syncthreads();
  int see = 0;
  if (threadIdx.x < kTile) {
    const int64_t j = t0 + threadIdx.x;
    const int64_t ki = j < tk ? k_index[j] : LLONG_MAX;
    const int32_t kd = j < tk ? k_doc[j] : -1;
    Ki[threadIdx.x] = ki;
    Kd[threadIdx.x] = kd;
    for (int r = 0; r < kOwn; ++r) see |= j >= Qlo[r] && j < Qhi[r] && ki <= Qi[r] && kd == Qd[r];
  }
  return __syncthreads_or(see) != 0;
}

// ---------------------------------------------------------------- forward
// acc[r][.] += sum over the tile's keys j of w[r] (held by lane j) x tile row j: the P V product of
// the forward and the dS K product of dq, one warp's kPerWarp rows, head dimension spread over lanes.
__device__ inline void add_tile_product(float (&acc)[kPerWarp][kMaxC], const float (&w)[kPerWarp], const float* tile,
                                        int ld, int d, int nc, int lane) {
  for (int j = 0; j < kTile; ++j) {
    const float* row = tile + j * ld;
#pragma unroll
    for (int rr = 0; rr < kPerWarp; ++rr) {
      const float wj = __shfl_sync(kFull, w[rr], j);
#pragma unroll
      for (int c = 0; c < kMaxC; ++c) {
        const int e = c * 32 + lane;
        if (c < nc && e < d) acc[rr][c] += wj * row[e];
      }
    }
  }
}

template <typename T, typename TO>
__global__ void __launch_bounds__(kWarps * 32) attn_fwd_kernel(TO* o, float* lse, const T* q,
                                                               const int64_t* q_index, const int32_t* q_doc, int64_t tq,
                                                               const T* k, const T* v, const int64_t* k_index,
                                                               const int32_t* k_doc, int64_t tk,
                                                               const int32_t* kv_range, Geo G) {
  CTX_DYNAMIC_SMEM(smem);
  const int d = static_cast<int>(G.d), kld = d + 1;
  float* Ks = smem;                      // [kTile][d+1]
  float* Vs = Ks + kTile * kld;          // [kTile][d]
  float* Qs = Vs + kTile * d;            // [kOwn][d]
  int64_t* Ki = reinterpret_cast<int64_t*>(Qs + kOwn * d);  // [kTile] key indices of the tile
  int64_t* Qi = Ki + kTile;                                  // [kOwn]  query indices of the block's rows
  int32_t* Kd = reinterpret_cast<int32_t*>(Qi + kOwn);       // [kTile]
  int32_t* Qd = Kd + kTile;                                  // [kOwn]
  int32_t* Qlo = Qd + kOwn;                                  // [kOwn] hulls of the block's rows
  int32_t* Qhi = Qlo + kOwn;                                 // [kOwn]

  const int64_t g = blockIdx.y, rows = tq * G.group, R0 = static_cast<int64_t>(blockIdx.x) * kOwn;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nc = (d + 31) / 32;

  load_rows(Qs, d, kOwn, d, [&](int r) -> const T* {
    int64_t i, h;
    return row_of(R0 + r, rows, G, g, i, h) ? q + (i * G.hq + h) * G.d : nullptr;
  });
  load_row_ids(Qi, Qd, Qlo, Qhi, R0, rows, G, g, q_index, q_doc, kv_range);
  __syncthreads();
  int64_t t_begin, t_end;
  block_key_span(Qlo, Qhi, tk, &t_begin, &t_end);

  bool valid[kPerWarp];
  int64_t qi[kPerWarp], qh[kPerWarp], qidx[kPerWarp];
  int32_t qdoc[kPerWarp], qlo[kPerWarp], qhi[kPerWarp];
  float m[kPerWarp], l[kPerWarp], acc[kPerWarp][kMaxC];
#pragma unroll
  for (int rr = 0; rr < kPerWarp; ++rr) {
    valid[rr] = row_of(R0 + warp * kPerWarp + rr, rows, G, g, qi[rr], qh[rr]);
    qidx[rr] = valid[rr] ? q_index[qi[rr]] : -1;
    qdoc[rr] = valid[rr] ? q_doc[qi[rr]] : -1;
    qlo[rr] = valid[rr] ? kv_range[2 * qi[rr]] : 0;
    qhi[rr] = valid[rr] ? kv_range[2 * qi[rr] + 1] : 0;
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < kMaxC; ++c) acc[rr][c] = 0.0f;
  }

  for (int64_t t0 = t_begin; t0 < t_end; t0 += kTile) {
    if (!key_tile_visible(Ki, Kd, Qi, Qd, Qlo, Qhi, t0, tk, k_index, k_doc)) continue;  // e.g. causal: keys after every query
    const int64_t kv_ld = G.hkv * G.d;
    load_rows(Ks, kld, kTile, d, [&](int j) -> const T* { return t0 + j < tk ? k + (t0 + j) * kv_ld + g * G.d : nullptr; });
    load_rows(Vs, d, kTile, d, [&](int j) -> const T* { return t0 + j < tk ? v + (t0 + j) * kv_ld + g * G.d : nullptr; });
    __syncthreads();

    const int64_t kidx = Ki[lane], kj = t0 + lane;
    const int32_t kdoc = Kd[lane];
    bool vis[kPerWarp];
    bool any = false;
#pragma unroll
    for (int rr = 0; rr < kPerWarp; ++rr) {
      vis[rr] = valid[rr] && kj >= qlo[rr] && kj < qhi[rr] && kidx <= qidx[rr] && kdoc == qdoc[rr];
      any |= __any_sync(kFull, vis[rr]);
    }
    if (!any) continue;  // uniform across the warp

    float s[kPerWarp];
#pragma unroll
    for (int rr = 0; rr < kPerWarp; ++rr) s[rr] = 0.0f;
    const float* qrow = Qs + warp * kPerWarp * d;
    for (int e = 0; e < d; ++e) {
      const float kv = Ks[lane * kld + e];
#pragma unroll
      for (int rr = 0; rr < kPerWarp; ++rr) s[rr] += qrow[rr * d + e] * kv;
    }
    float p[kPerWarp];
#pragma unroll
    for (int rr = 0; rr < kPerWarp; ++rr) {
      s[rr] *= G.scale;
      const float tmax = warp_max(vis[rr] ? s[rr] : -INFINITY);
      if (tmax == -INFINITY) {  // nothing visible to this row in this tile
        p[rr] = 0.0f;
        continue;
      }
      const float mnew = fmaxf(m[rr], tmax);
      const float f = expf(m[rr] - mnew);  // 0 when m was -inf
      p[rr] = vis[rr] ? expf(s[rr] - mnew) : 0.0f;
      l[rr] = l[rr] * f + warp_sum(p[rr]);
#pragma unroll
      for (int c = 0; c < kMaxC; ++c) acc[rr][c] *= f;
      m[rr] = mnew;
    }
    add_tile_product(acc, p, Vs, d, d, nc, lane);  // acc += P V
  }

  // merge this block's (acc / l, m + log l) into the running (o, lse)
#pragma unroll
  for (int rr = 0; rr < kPerWarp; ++rr) {
    if (!valid[rr] || l[rr] == 0.0f) continue;  // no visible key in this block
    const float blk = m[rr] + logf(l[rr]);
    const int64_t row = qi[rr] * G.hq + qh[rr];
    TO* orow = o + row * G.d;
    const float old = lse[row];
    float w_old, w_new, nl;
    if (old == -INFINITY) {
      w_old = 0.0f;
      w_new = 1.0f / l[rr];
      nl = blk;
    } else {
      const float hi = fmaxf(old, blk), lo = fminf(old, blk);
      nl = hi + log1pf(expf(lo - hi));
      w_old = expf(old - nl);
      w_new = expf(blk - nl) / l[rr];
    }
#pragma unroll
    for (int c = 0; c < kMaxC; ++c) {
      const int e = c * 32 + lane;
      if (c < nc && e < d)
        st(orow, e, old == -INFINITY ? acc[rr][c] / l[rr] : ld(orow, e) * w_old + acc[rr][c] * w_new);
    }
    __syncwarp();
    if (lane == 0) lse[row] = nl;
  }
}

// ---------------------------------------------------------------- backward: dq
template <typename T, typename TQ>
__global__ void __launch_bounds__(kWarps * 32) attn_dq_kernel(TQ* dq, const T* q, const int64_t* q_index,
                                                              const int32_t* q_doc, int64_t tq, const T* k,
                                                              const T* v, const int64_t* k_index,
                                                              const int32_t* k_doc, int64_t tk,
                                                              const int32_t* kv_range, const T* dout,
                                                              const float* lse, const float* delta, Geo G) {
  CTX_DYNAMIC_SMEM(smem);
  const int d = static_cast<int>(G.d), kld = d + 1;
  float* Ks = smem;                // [kTile][d+1]
  float* Vs = Ks + kTile * kld;    // [kTile][d+1]
  float* Qs = Vs + kTile * kld;    // [kOwn][d]
  float* Ds = Qs + kOwn * d;       // [kOwn][d]  (dout rows)
  int64_t* Ki = reinterpret_cast<int64_t*>(Ds + kOwn * d);  // [kTile]
  int64_t* Qi = Ki + kTile;                                  // [kOwn]
  int32_t* Kd = reinterpret_cast<int32_t*>(Qi + kOwn);       // [kTile]
  int32_t* Qd = Kd + kTile;                                  // [kOwn]
  int32_t* Qlo = Qd + kOwn;                                  // [kOwn]
  int32_t* Qhi = Qlo + kOwn;                                 // [kOwn]

  const int64_t g = blockIdx.y, rows = tq * G.group, R0 = static_cast<int64_t>(blockIdx.x) * kOwn;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nc = (d + 31) / 32;
  auto qrow_ptr = [&](int r, const T* base) -> const T* {
    int64_t i, h;
    return row_of(R0 + r, rows, G, g, i, h) ? base + (i * G.hq + h) * G.d : nullptr;
  };
  load_rows(Qs, d, kOwn, d, [&](int r) { return qrow_ptr(r, q); });
  load_rows(Ds, d, kOwn, d, [&](int r) { return qrow_ptr(r, dout); });
  load_row_ids(Qi, Qd, Qlo, Qhi, R0, rows, G, g, q_index, q_doc, kv_range);
  __syncthreads();
  int64_t t_begin, t_end;
  block_key_span(Qlo, Qhi, tk, &t_begin, &t_end);

  bool valid[kPerWarp];
  int64_t qi[kPerWarp], qh[kPerWarp], qidx[kPerWarp];
  int32_t qdoc[kPerWarp], qlo[kPerWarp], qhi[kPerWarp];
  float L[kPerWarp], D[kPerWarp], acc[kPerWarp][kMaxC];
#pragma unroll
  for (int rr = 0; rr < kPerWarp; ++rr) {
    valid[rr] = row_of(R0 + warp * kPerWarp + rr, rows, G, g, qi[rr], qh[rr]);
    const int64_t row = valid[rr] ? qi[rr] * G.hq + qh[rr] : 0;
    qidx[rr] = valid[rr] ? q_index[qi[rr]] : -1;
    qdoc[rr] = valid[rr] ? q_doc[qi[rr]] : -1;
    qlo[rr] = valid[rr] ? kv_range[2 * qi[rr]] : 0;
    qhi[rr] = valid[rr] ? kv_range[2 * qi[rr] + 1] : 0;
    L[rr] = valid[rr] ? lse[row] : 0.0f;
    D[rr] = valid[rr] ? delta[row] : 0.0f;
#pragma unroll
    for (int c = 0; c < kMaxC; ++c) acc[rr][c] = 0.0f;
  }

  for (int64_t t0 = t_begin; t0 < t_end; t0 += kTile) {
    if (!key_tile_visible(Ki, Kd, Qi, Qd, Qlo, Qhi, t0, tk, k_index, k_doc)) continue;
    const int64_t kv_ld = G.hkv * G.d;
    load_rows(Ks, kld, kTile, d, [&](int j) -> const T* { return t0 + j < tk ? k + (t0 + j) * kv_ld + g * G.d : nullptr; });
    load_rows(Vs, kld, kTile, d, [&](int j) -> const T* { return t0 + j < tk ? v + (t0 + j) * kv_ld + g * G.d : nullptr; });
    __syncthreads();

    const int64_t kidx = Ki[lane], kj = t0 + lane;
    const int32_t kdoc = Kd[lane];
    bool vis[kPerWarp];
    bool any = false;
#pragma unroll
    for (int rr = 0; rr < kPerWarp; ++rr) {
      vis[rr] = valid[rr] && kj >= qlo[rr] && kj < qhi[rr] && kidx <= qidx[rr] && kdoc == qdoc[rr];
      any |= __any_sync(kFull, vis[rr]);
    }
    if (!any) continue;

    float s[kPerWarp], dp[kPerWarp];
#pragma unroll
    for (int rr = 0; rr < kPerWarp; ++rr) s[rr] = dp[rr] = 0.0f;
    const float* qrow = Qs + warp * kPerWarp * d;
    const float* drow = Ds + warp * kPerWarp * d;
    for (int e = 0; e < d; ++e) {
      const float kk = Ks[lane * kld + e], vv = Vs[lane * kld + e];
#pragma unroll
      for (int rr = 0; rr < kPerWarp; ++rr) {
        s[rr] += qrow[rr * d + e] * kk;
        dp[rr] += drow[rr * d + e] * vv;
      }
    }
    float ds[kPerWarp];
#pragma unroll
    for (int rr = 0; rr < kPerWarp; ++rr) {
      const float p = vis[rr] ? expf(s[rr] * G.scale - L[rr]) : 0.0f;
      ds[rr] = p * (dp[rr] - D[rr]) * G.scale;
    }
    add_tile_product(acc, ds, Ks, kld, d, nc, lane);  // dq += dS K
  }
#pragma unroll
  for (int rr = 0; rr < kPerWarp; ++rr) {
    if (!valid[rr]) continue;
    TQ* dqrow = dq + (qi[rr] * G.hq + qh[rr]) * G.d;
#pragma unroll
    for (int c = 0; c < kMaxC; ++c) {
      const int e = c * 32 + lane;
      if (c < nc && e < d) st(dqrow, e, ld(dqrow, e) + acc[rr][c]);
    }
  }
}

// ---------------------------------------------------------------- backward: dk, dv
template <typename T, typename TKV>
__global__ void __launch_bounds__(kWarps * 32) attn_dkdv_kernel(TKV* dk, TKV* dv, const T* q,
                                                                const int64_t* q_index, const int32_t* q_doc,
                                                                int64_t tq, const T* k, const T* v,
                                                                const int64_t* k_index, const int32_t* k_doc,
                                                                int64_t tk, const int32_t* kv_range,
                                                                const T* dout, const float* lse,
                                                                const float* delta, Geo G) {
  CTX_DYNAMIC_SMEM(smem);
  const int d = static_cast<int>(G.d), qld = d + 1;
  float* Qs = smem;                 // [kTile][d+1]  query rows of the tile
  float* Ds = Qs + kTile * qld;     // [kTile][d+1]  their dout rows
  float* Ks = Ds + kTile * qld;     // [kOwn][d]     this block's keys
  float* Vs = Ks + kOwn * d;        // [kOwn][d]
  float* Ls = Vs + kOwn * d;        // [kTile] lse
  float* Dl = Ls + kTile;           // [kTile] delta
  int64_t* Qi = reinterpret_cast<int64_t*>(Dl + kTile);  // [kTile] query indices of the tile (8-byte aligned:
  int64_t* Ki = Qi + kTile;                              // [kOwn]  the float count before is even)
  int32_t* Qd = reinterpret_cast<int32_t*>(Ki + kOwn);   // [kTile]
  int32_t* Kd = Qd + kTile;                              // [kOwn]
  int32_t* Qlo = Kd + kOwn;                              // [kTile] hulls of the tile's query rows
  int32_t* Qhi = Qlo + kTile;                            // [kTile]

  const int64_t g = blockIdx.y, rows = tq * G.group, J0 = static_cast<int64_t>(blockIdx.x) * kOwn;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nc = (d + 31) / 32;
  const int64_t kv_ld = G.hkv * G.d;
  load_rows(Ks, d, kOwn, d, [&](int j) -> const T* { return J0 + j < tk ? k + (J0 + j) * kv_ld + g * G.d : nullptr; });
  load_rows(Vs, d, kOwn, d, [&](int j) -> const T* { return J0 + j < tk ? v + (J0 + j) * kv_ld + g * G.d : nullptr; });

  bool kvalid[kPerWarp];
  int64_t kidx[kPerWarp];
  int32_t kdoc[kPerWarp];
  float dka[kPerWarp][kMaxC], dva[kPerWarp][kMaxC];
#pragma unroll
  for (int kk = 0; kk < kPerWarp; ++kk) {
    const int64_t j = J0 + warp * kPerWarp + kk;
    kvalid[kk] = j < tk;
    kidx[kk] = kvalid[kk] ? k_index[j] : LLONG_MAX;
    kdoc[kk] = kvalid[kk] ? k_doc[j] : -1;
#pragma unroll
    for (int c = 0; c < kMaxC; ++c) dka[kk][c] = dva[kk][c] = 0.0f;
  }
  if (threadIdx.x < kOwn) {
    const int64_t j = J0 + threadIdx.x;
    Ki[threadIdx.x] = j < tk ? k_index[j] : LLONG_MAX;
    Kd[threadIdx.x] = j < tk ? k_doc[j] : -1;
  }

  for (int64_t R0 = 0; R0 < rows; R0 += kTile) {
    __syncthreads();  // the previous tile is no longer read (and Ki/Kd are written, first time)
    int see = 0;
    if (threadIdx.x < kTile) {
      int64_t i, h;
      if (row_of(R0 + threadIdx.x, rows, G, g, i, h)) {
        Qi[threadIdx.x] = q_index[i];
        Qd[threadIdx.x] = q_doc[i];
        Qlo[threadIdx.x] = kv_range[2 * i];
        Qhi[threadIdx.x] = kv_range[2 * i + 1];
        Ls[threadIdx.x] = lse[i * G.hq + h];
        Dl[threadIdx.x] = delta[i * G.hq + h];
        // only the hull's keys, and of those the visible ones (a tile whose hulls miss this
        // block's keys costs no loads)
        for (int j = 0; j < kOwn; ++j)
          see |= J0 + j >= Qlo[threadIdx.x] && J0 + j < Qhi[threadIdx.x] && Ki[j] <= Qi[threadIdx.x] &&
                 Kd[j] == Qd[threadIdx.x];
      } else {
        Qi[threadIdx.x] = -1;  // sees no key (key indices are >= 0)
        Qd[threadIdx.x] = -2;
        Qlo[threadIdx.x] = 0;
        Qhi[threadIdx.x] = 0;
        Ls[threadIdx.x] = 0.0f;
        Dl[threadIdx.x] = 0.0f;
      }
    }
    if (!__syncthreads_or(see)) continue;  // no query of this tile sees a key of this block
    auto qrow_ptr = [&](int r, const T* base) -> const T* {
      int64_t i, h;
      return row_of(R0 + r, rows, G, g, i, h) ? base + (i * G.hq + h) * G.d : nullptr;
    };
    load_rows(Qs, qld, kTile, d, [&](int r) { return qrow_ptr(r, q); });
    load_rows(Ds, qld, kTile, d, [&](int r) { return qrow_ptr(r, dout); });
    __syncthreads();

    const int64_t qidx = Qi[lane];
    const int32_t qdoc = Qd[lane], qlo = Qlo[lane], qhi = Qhi[lane];
    bool vis[kPerWarp];
    bool any = false;
#pragma unroll
    for (int kk = 0; kk < kPerWarp; ++kk) {
      const int64_t j = J0 + warp * kPerWarp + kk;
      vis[kk] = kvalid[kk] && qidx >= 0 && j >= qlo && j < qhi && kidx[kk] <= qidx && kdoc[kk] == qdoc;
      any |= __any_sync(kFull, vis[kk]);
    }
    if (!any) continue;

    float s[kPerWarp], dp[kPerWarp];
#pragma unroll
    for (int kk = 0; kk < kPerWarp; ++kk) s[kk] = dp[kk] = 0.0f;
    const float* krow = Ks + warp * kPerWarp * d;
    const float* vrow = Vs + warp * kPerWarp * d;
    for (int e = 0; e < d; ++e) {
      const float qq = Qs[lane * qld + e], dd = Ds[lane * qld + e];
#pragma unroll
      for (int kk = 0; kk < kPerWarp; ++kk) {
        s[kk] += qq * krow[kk * d + e];
        dp[kk] += dd * vrow[kk * d + e];
      }
    }
    const float Lr = Ls[lane], Dr = Dl[lane];
    float p[kPerWarp], ds[kPerWarp];
#pragma unroll
    for (int kk = 0; kk < kPerWarp; ++kk) {
      p[kk] = vis[kk] ? expf(s[kk] * G.scale - Lr) : 0.0f;
      ds[kk] = p[kk] * (dp[kk] - Dr) * G.scale;
    }
    for (int r = 0; r < kTile; ++r) {
      const float* qr = Qs + r * qld;
      const float* dr = Ds + r * qld;
#pragma unroll
      for (int kk = 0; kk < kPerWarp; ++kk) {
        const float pr = __shfl_sync(kFull, p[kk], r), dsr = __shfl_sync(kFull, ds[kk], r);
#pragma unroll
        for (int c = 0; c < kMaxC; ++c) {
          const int e = c * 32 + lane;
          if (c < nc && e < d) {
            dva[kk][c] += pr * dr[e];
            dka[kk][c] += dsr * qr[e];
          }
        }
      }
    }
  }
#pragma unroll
  for (int kk = 0; kk < kPerWarp; ++kk) {
    if (!kvalid[kk]) continue;
    const int64_t j = J0 + warp * kPerWarp + kk;
    TKV* dkrow = dk + j * kv_ld + g * G.d;
    TKV* dvrow = dv + j * kv_ld + g * G.d;
#pragma unroll
    for (int c = 0; c < kMaxC; ++c) {
      const int e = c * 32 + lane;
      if (c < nc && e < d) {
        st(dkrow, e, ld(dkrow, e) + dka[kk][c]);
        st(dvrow, e, ld(dvrow, e) + dva[kk][c]);
      }
    }
  }
}

// ---------------------------------------------------------------- launch geometry (host)
// Shared memory per block: the float arrays, then the index arrays (kTile + kOwn of each kind),
// then the query hulls (lo, hi; at most kTile rows).
constexpr size_t kIdBytes = (kTile + kOwn) * (sizeof(int64_t) + sizeof(int32_t)) + 2 * kTile * sizeof(int32_t);
inline size_t fwd_smem(int64_t d) { return (kTile * (d + 1) + kTile * d + kOwn * d) * sizeof(float) + kIdBytes; }
inline size_t dq_smem(int64_t d) { return (2 * kTile * (d + 1) + 2 * kOwn * d) * sizeof(float) + kIdBytes; }
inline size_t dkdv_smem(int64_t d) { return (2 * kTile * (d + 1) + 2 * kOwn * d + 2 * kTile) * sizeof(float) + kIdBytes; }

// Blocks of the forward and dq kernels (query rows of one KV head) and of the dkdv kernel (keys).
inline unsigned row_blocks(int64_t tq, int64_t group) { return static_cast<unsigned>((tq * group + kOwn - 1) / kOwn); }
inline unsigned key_blocks(int64_t tk) { return static_cast<unsigned>((tk + kOwn - 1) / kOwn); }
constexpr int kBlockThreads = kWarps * 32;

}  // namespace ctx::exec::cuda::dev
