// Device code of the reduction kernels (launchers: kernels_reduce.cu); also run by the CPU
// emulator in the tests (executor/cuda/tests/cuda_emulator.hpp).
//
// Storage types as in elementwise_kernels.cuh: the kernels that read activations (the non-finite
// flag, RMSNorm, attention delta) are templates on T in {float, uint16_t (bf16 bits)}, reading
// through dev::ld and writing through dev::st (rounded once); the float instantiations are the
// fp32 kernels unchanged. rstd, dw, the cross-entropy pieces, the statistics and sum_squares are
// f32 by the interface (backend.hpp) and stay float.
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "executor/cuda/bf16_device.cuh"
#include "executor/cuda/warp_common.cuh"

namespace ctx::exec::cuda::dev {

constexpr int kRowThreads = 256;  // block size of the reduction kernels (a multiple of 32)
// Block-wide sum/max; every thread gets the result. `scratch` holds blockDim/32 values.
template <typename T>
__device__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T t = lane < nw ? scratch[lane] : T(0);
  return warp_sum(t);
}
__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nw ? scratch[lane] : -INFINITY;
  return warp_max(t);
}

__global__ void sum_squares_partial(double* partials, const float* x, int64_t n) {
  __shared__ double sh[32];
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    s += static_cast<double>(x[i]) * x[i];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}
// One block: *stat += the sum of the partials (in double, added to the float once, as the CPU
// reference adds its double sum to the step statistics).
__global__ void sum_partials_into(float* stat, const double* partials, int count) {
  __shared__ double sh[32];
  double s = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) *stat += static_cast<float>(s);
}

template <typename T>
__global__ void nonfinite_kernel(int* flag, const T* x, int64_t n) {
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    bad |= !isfinite(ld(x, i));
  if (__any_sync(kFull, bad) && (threadIdx.x & 31) == 0) *flag = 1;
}
// After nonfinite_kernel: the step statistic keeps the largest code of a flagged tensor.
__global__ void flag_finish_kernel(float* stat, const int* flag, float code) {
  if (threadIdx.x == 0 && blockIdx.x == 0 && *flag != 0) *stat = fmaxf(*stat, code);
}

// The static shared scratch of the templated row reductions, declared in a plain function: GCC
// places a function template's static locals in their own COMDAT sections, outside the emulator's
// shared-memory section (cuda_emulator.hpp), where the race detector would not see them.
__device__ double* row_scratch_d() {
  __shared__ double sh[32];
  return sh;
}

template <typename T>
__global__ void rmsnorm_fwd_kernel(T* y, float* rstd, const T* x, const T* w, int64_t h, float eps) {
  double* sh = row_scratch_d();
  const int64_t r = blockIdx.x;
  const T* xr = x + r * h;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    const float xi = ld(xr, i);
    ss += static_cast<double>(xi) * xi;
  }
  ss = block_sum(ss, sh);
  const float s = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(h) + eps));
  if (threadIdx.x == 0) rstd[r] = s;
  if (y)
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) st(y, r * h + i, ld(xr, i) * s * ld(w, i));
}

// dx_i = s w_i dy_i - x_i s^3/h sum_j w_j dy_j x_j (the reference's formula and rounding order)
template <typename T>
__global__ void rmsnorm_bwd_dx_kernel(T* dx, const T* dy, const T* x, const float* rstd, const T* w, int64_t h) {
  double* sh = row_scratch_d();
  const int64_t r = blockIdx.x;
  const T* xr = x + r * h;
  const T* dyr = dy + r * h;
  const float s = rstd[r];
  double dot = 0;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x)
    dot += static_cast<double>(ld(w, i)) * ld(dyr, i) * ld(xr, i);
  dot = block_sum(dot, sh);
  const float c = static_cast<float>(dot) * s * s * s / static_cast<float>(h);
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) st(dx, r * h + i, s * ld(w, i) * ld(dyr, i) - ld(xr, i) * c);
}

constexpr int64_t kDwChunks = 64;
template <typename T>
__global__ void rmsnorm_dw_partial(float* scratch, const T* dy, const T* x, const float* rstd, int64_t rows,
                                   int64_t h, int64_t per) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, chunk = blockIdx.y;
  if (i >= h) return;
  const int64_t r0 = chunk * per, r1 = r0 + per < rows ? r0 + per : rows;
  float acc = 0;
  for (int64_t r = r0; r < r1; ++r) acc += ld(dy, r * h + i) * ld(x, r * h + i) * rstd[r];
  scratch[chunk * h + i] = acc;
}
__global__ void rmsnorm_dw_finish(float* dw, const float* scratch, int64_t chunks, int64_t h) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= h) return;
  float acc = 0;
  for (int64_t c = 0; c < chunks; ++c) acc += scratch[c * h + i];
  dw[i] += acc;
}

__global__ void row_max_kernel(float* out, const float* logits, int64_t cols, int64_t valid) {
  __shared__ float sh[32];
  const int64_t r = blockIdx.x;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < valid; c += blockDim.x) m = fmaxf(m, logits[r * cols + c]);
  m = block_max(m, sh);
  if (threadIdx.x == 0) out[r] = m;
}

__global__ void sumexp_target_kernel(float* out, const float* logits, const float* mx, const int32_t* target,
                                     int64_t cols, int64_t valid, int64_t v0) {
  __shared__ double sh[32];
  const int64_t r = blockIdx.x;
  const double m = mx[r];
  double s = 0;
  for (int64_t c = threadIdx.x; c < valid; c += blockDim.x) s += exp(static_cast<double>(logits[r * cols + c]) - m);
  s = block_sum(s, sh);
  if (threadIdx.x == 0) {
    out[2 * r] = static_cast<float>(s);
    const int64_t t = static_cast<int64_t>(target[r]) - v0;
    out[2 * r + 1] = (target[r] >= 0 && t >= 0 && t < valid) ? logits[r * cols + t] : 0.0f;
  }
}

// One block: lse[r] = max[r] + log(sumexp[r]), and the loss of the rows with a target (lse minus
// the target's logit) summed in double over a fixed tree, added to the loss statistic once.
__global__ void xent_finish_kernel(float* lse, float* loss_stat, const float* mx, const float* se,
                                   const int32_t* target, int64_t rows) {
  __shared__ double sh[32];
  double acc = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const float l = mx[r] + logf(se[2 * r]);
    lse[r] = l;
    if (target[r] >= 0) acc += static_cast<double>(l) - se[2 * r + 1];
  }
  acc = block_sum(acc, sh);
  if (threadIdx.x == 0) *loss_stat += static_cast<float>(acc);
}

// logits <- w (softmax - onehot(target)), w = weight for rows with a target and 0 for ignored rows.
__global__ void xent_grad_kernel(float* logits, const float* lse, const int32_t* target, float weight, int64_t rows,
                                 int64_t cols, int64_t valid, int64_t v0) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float w = target[r] >= 0 ? weight : 0.0f;
    float g = c < valid ? w * expf(logits[i] - lse[r]) : 0.0f;
    const int64_t t = static_cast<int64_t>(target[r]) - v0;
    if (target[r] >= 0 && t == c && t < valid) g -= w;
    logits[i] = g;
  }
}

// One warp per (token, head) row: delta = sum_e dout*o.
// dout and o may differ in storage (o can be a merged fp32 accumulator under bf16).
template <typename TD, typename TO>
__global__ void attention_delta_kernel(float* delta, const TD* dout, const TO* o, int64_t rows, int64_t d) {
  const int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;  // whole warps leave together (rows are warp-aligned)
  double acc = 0;
  for (int64_t e = lane; e < d; e += 32) acc += static_cast<double>(ld(dout, r * d + e)) * ld(o, r * d + e);
  acc = warp_sum(acc);
  if (lane == 0) delta[r] = static_cast<float>(acc);
}

}  // namespace ctx::exec::cuda::dev
