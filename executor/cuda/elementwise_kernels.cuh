// Device code of the elementwise and gather/scatter kernels (launchers: kernels_elementwise.cu).
// Kept apart from the launchers so the same source also runs under the CPU emulator of the CUDA
// execution model in the tests (executor/cuda/tests/cuda_emulator.hpp).
//
// Storage types: every kernel that touches a floating-point tensor is a template on its storage
// type(s) T in {float, uint16_t (bf16 bits)}; it reads through dev::ld (bf16 widened to float),
// computes in float exactly as the float instantiation does, and writes through dev::st (rounded
// once, to nearest even: bf16_device.cuh, bit for bit executor/bf16.hpp). So the float
// instantiation is the fp32 kernel unchanged, and the bf16 one is the CPU reference's bf16
// procedure (widen inputs, compute in fp32, round outputs once). Tensors that are f32 by the
// interface (backend.hpp: dtable, AdamW's ranges, the statistics) stay float.
#pragma once
#include <cmath>
#include <cstdint>

#include "executor/cuda/bf16_device.cuh"

namespace ctx::exec::cuda::dev {

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

template <typename T>
__global__ void fill_kernel(T* p, float v, int64_t n) { GRID_STRIDE(i, n) st(p, i, v); }
template <typename TY, typename TX>
__global__ void axpy_kernel(TY* y, float a, const TX* x, int64_t n) { GRID_STRIDE(i, n) st(y, i, ld(y, i) + a * ld(x, i)); }
template <typename T>
__global__ void scale_kernel(T* x, float a, int64_t n) { GRID_STRIDE(i, n) st(x, i, ld(x, i) * a); }
// f32 <-> bf16 conversion (Backend::copy between dtypes): widen, or round once to nearest even.
template <typename TD, typename TS>
__global__ void convert_kernel(TD* dst, const TS* src, int64_t n) { GRID_STRIDE(i, n) st(dst, i, ld(src, i)); }

// Column ranges of two row-major matrices (the pointers already offset to the first column):
// dst[r * dld + c] = (or +=) src[r * sld + c]. Backs copy_cols and add_cols (whose dst and src
// may differ in dtype: the sum in float, rounded once into a bf16 dst).
template <typename TD, typename TS>
__global__ void copy_cols_kernel(TD* dst, int64_t dld, const TS* src, int64_t sld, int64_t rows, int64_t cols,
                                 bool add) {
  GRID_STRIDE(i, rows * cols) {
    int64_t r = i / cols, c = i % cols;
    st(dst, r * dld + c, add ? ld(dst, r * dld + c) + ld(src, r * sld + c) : ld(src, r * sld + c));
  }
}

// One thread per (row, rotated pair i): the angle in double (positions reach millions; a float
// angle would lose whole radians), then the same rotation for every head of the row.
template <typename T>
__global__ void rope_kernel(T* x, int64_t rows, int64_t heads, int64_t d, const int32_t* pos, const float* inv_freq,
                            int64_t half, float attn_scale, float sign) {
  GRID_STRIDE(t, rows * half) {
    int64_t r = t / half, i = t % half;
    double ang = static_cast<double>(pos[r]) * inv_freq[i];
    double sd, cd;
    sincos(ang, &sd, &cd);
    float c = static_cast<float>(cd) * attn_scale;
    float s = static_cast<float>(sd) * attn_scale * sign;
    for (int64_t hh = 0; hh < heads; ++hh) {
      T* xh = x + (r * heads + hh) * d;
      float x1 = ld(xh, i), x2 = ld(xh, i + half);
      st(xh, i, x1 * c - x2 * s);
      st(xh, i + half, x2 * c + x1 * s);
    }
  }
}

template <typename T>
__global__ void swiglu_fwd_kernel(T* a, const T* gate, const T* up, int64_t n) {
  GRID_STRIDE(i, n) {
    float g = ld(gate, i);
    float sig = 1.0f / (1.0f + expf(-g));
    st(a, i, g * sig * ld(up, i));
  }
}

template <typename T>
__global__ void swiglu_bwd_kernel(T* dgate, T* dup, const T* da, const T* gate, const T* up, int64_t n) {
  GRID_STRIDE(i, n) {
    float g = ld(gate, i);
    float sig = 1.0f / (1.0f + expf(-g));
    float silu = g * sig;
    float u = ld(up, i), d = ld(da, i);  // read before writing: dgate/dup may alias gate/up
    st(dup, i, d * silu);
    st(dgate, i, d * u * sig * (1.0f + g * (1.0f - sig)));
  }
}

// out and table share the storage type: rows are copied as stored (bit for bit, as the reference's
// memcpy), zero bits for tokens of other shards.
template <typename T>
__global__ void embedding_fwd_kernel(T* out, const T* table, const int32_t* tok, int64_t tokens, int64_t h,
                                     int64_t v0, int64_t vrows) {
  GRID_STRIDE(i, tokens * h) {
    int64_t t = i / h, e = i % h;
    int64_t r = static_cast<int64_t>(tok[t]) - v0;
    out[i] = (r >= 0 && r < vrows) ? table[r * h + e] : T(0);
  }
}

// Embedding backward without atomics and without a host read, in three steps (launcher:
// kernels_elementwise.cu): (1) key every token by its vocabulary row (tokens of other shards get
// the key vrows, past every row), (2) a stable radix sort of (key, token position) pairs, so the
// tokens of one row are adjacent and in token order, (3) one block per run start adds the run's
// gradient rows, in token order, to its row: the reference's summation order, bit for bit.
__global__ void embedding_keys_kernel(int32_t* keys, int32_t* positions, const int32_t* tok, int64_t tokens,
                                      int64_t v0, int64_t vrows) {
  GRID_STRIDE(t, tokens) {
    const int64_t r = static_cast<int64_t>(tok[t]) - v0;
    keys[t] = static_cast<int32_t>(r >= 0 && r < vrows ? r : vrows);
    positions[t] = static_cast<int32_t>(t);
  }
}
// Blocks stride over the sorted tokens; a block acts only on the first token of a run of equal
// keys (the branch is uniform over the block: every thread reads the same two keys).
// dtable is f32 (the interface's); dout f32 or bf16, widened.
template <typename T>
__global__ void embedding_bwd_sorted_kernel(float* dtable, const T* dout, const int32_t* keys,
                                            const int32_t* positions, int64_t tokens, int64_t h, int64_t vrows) {
  for (int64_t u = blockIdx.x; u < tokens; u += gridDim.x) {
    const int32_t row = keys[u];
    if (row >= vrows || (u > 0 && keys[u - 1] == row)) continue;
    for (int64_t e = threadIdx.x; e < h; e += blockDim.x) {
      float acc = dtable[static_cast<int64_t>(row) * h + e];
      for (int64_t p = u; p < tokens && keys[p] == row; ++p) acc += ld(dout, static_cast<int64_t>(positions[p]) * h + e);
      dtable[static_cast<int64_t>(row) * h + e] = acc;
    }
  }
}

// Slots of the step statistics tensor (executor/backend.hpp's StepStat; cuda_backend.cpp asserts
// that they agree).
constexpr int kStatLossSum = 0, kStatNonFinite = 1, kStatGradNorm2 = 2;

// AdamW with the skip and clip decisions on the device, as the CPU reference takes them: every
// thread reads the two statistics (the branch is uniform), skips when a tensor was flagged
// non-finite or the norm is not finite, scales the gradient by clip / (norm + 1e-6) when
// clip > 0 and the norm exceeds it. The weights stepped (P: the fp32 master, or the compute weights
// with master=none) and the moments (S: fp32, or bf16 with moments=bf16) are read as float and
// rounded once on store (ld/st, bf16_device.cuh), as the CPU reference does.
template <typename P, typename S>
__global__ void adamw_kernel(P* master, S* m, S* v, const float* grad, const float* stats, float decay, int64_t n,
                             float lr, float beta1, float beta2, float eps, float wd, float clip, double bc1, double bc2) {
  const double norm = sqrt(static_cast<double>(stats[kStatGradNorm2]));
  if (stats[kStatNonFinite] != 0.0f || !isfinite(norm)) return;  // the step is skipped
  const float grad_scale = (clip > 0 && norm > clip) ? static_cast<float>(clip / (norm + 1e-6)) : 1.0f;
  GRID_STRIDE(i, n) {
    float g = grad[i] * grad_scale;
    float mi = beta1 * ld(m, i) + (1.0f - beta1) * g;
    float vi = beta2 * ld(v, i) + (1.0f - beta2) * g * g;
    st(m, i, mi);
    st(v, i, vi);
    float mhat = static_cast<float>(mi / bc1), vhat = static_cast<float>(vi / bc2);
    float w = ld(master, i);
    st(master, i, w - lr * (mhat / (sqrtf(vhat) + eps) + wd * decay * w));
  }
}

}  // namespace ctx::exec::cuda::dev
