// Reduction kernels of the CUDA backend: whole-array sums (sum of squares, non-finite check),
// per-row reductions (RMSNorm, the cross-entropy pieces, attention delta) with one block or one
// warp per row, and the column sum of RMSNorm's weight gradient in fixed row chunks. Every sum
// runs in a fixed order (block tree, then chunks in order): results are deterministic run to run.
#include <cfloat>
#include <cmath>

#include "executor/cuda/cuda_check.hpp"
#include "executor/cuda/kernels.hpp"

namespace ctx::exec::cuda::k {
namespace {

constexpr int kThreads = 256;  // block size of the block-per-row kernels (a multiple of 32)
constexpr unsigned kFull = 0xffffffffu;

template <typename T>
__device__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}
__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
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
__device__ float block_max(float v, float* scratch) {
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
__global__ void sum_partials(double* out, const double* partials, int count) {
  __shared__ double sh[32];
  double s = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) *out = s;
}

__global__ void nonfinite_kernel(int* flag, const float* x, int64_t n) {
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    bad |= !isfinite(x[i]);
  if (__any_sync(kFull, bad) && (threadIdx.x & 31) == 0) *flag = 1;
}

__global__ void rmsnorm_fwd_kernel(float* y, float* rstd, const float* x, const float* w, int64_t h, float eps) {
  __shared__ double sh[32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * h;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) ss += static_cast<double>(xr[i]) * xr[i];
  ss = block_sum(ss, sh);
  const float s = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(h) + eps));
  if (threadIdx.x == 0) rstd[r] = s;
  if (y)
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) y[r * h + i] = xr[i] * s * w[i];
}

// dx_i = s w_i dy_i - x_i s^3/h sum_j w_j dy_j x_j (the reference's formula and rounding order)
__global__ void rmsnorm_bwd_dx_kernel(float* dx, const float* dy, const float* x, const float* rstd, const float* w,
                                      int64_t h) {
  __shared__ double sh[32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * h;
  const float* dyr = dy + r * h;
  const float s = rstd[r];
  double dot = 0;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) dot += static_cast<double>(w[i]) * dyr[i] * xr[i];
  dot = block_sum(dot, sh);
  const float c = static_cast<float>(dot) * s * s * s / static_cast<float>(h);
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) dx[r * h + i] = s * w[i] * dyr[i] - xr[i] * c;
}

constexpr int64_t kDwChunks = 64;
__global__ void rmsnorm_dw_partial(float* scratch, const float* dy, const float* x, const float* rstd, int64_t rows,
                                   int64_t h, int64_t per) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, chunk = blockIdx.y;
  if (i >= h) return;
  const int64_t r0 = chunk * per, r1 = r0 + per < rows ? r0 + per : rows;
  float acc = 0;
  for (int64_t r = r0; r < r1; ++r) acc += dy[r * h + i] * x[r * h + i] * rstd[r];
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

__global__ void xent_grad_kernel(float* logits, const float* lse, const int32_t* target, const float* weight,
                                 int64_t rows, int64_t cols, int64_t valid, int64_t v0) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float w = weight[r];
    float g = c < valid ? w * expf(logits[i] - lse[r]) : 0.0f;
    const int64_t t = static_cast<int64_t>(target[r]) - v0;
    if (target[r] >= 0 && t == c && t < valid) g -= w;
    logits[i] = g;
  }
}

// One warp per (token, head) row: delta = sum_e dout*o.
__global__ void attention_delta_kernel(float* delta, const float* dout, const float* o, int64_t rows, int64_t d) {
  const int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;  // whole warps leave together (rows are warp-aligned)
  double acc = 0;
  for (int64_t e = lane; e < d; e += 32) acc += static_cast<double>(dout[r * d + e]) * o[r * d + e];
  acc = warp_sum(acc);
  if (lane == 0) delta[r] = static_cast<float>(acc);
}

unsigned grid_for(int64_t n, int64_t cap) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > cap ? cap : b));
}

}  // namespace

void sum_squares(double* out, double* partials, const float* x, int64_t n, cudaStream_t s) {
  sum_squares_partial<<<kReduceBlocks, kThreads, 0, s>>>(partials, x, n);
  CTX_CUDA_LAUNCHED("sum_squares");
  sum_partials<<<1, kThreads, 0, s>>>(out, partials, kReduceBlocks);
  CTX_CUDA_LAUNCHED("sum_squares");
}
void count_nonfinite(int* flag, const float* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  nonfinite_kernel<<<grid_for(n, 4096), kThreads, 0, s>>>(flag, x, n);
  CTX_CUDA_LAUNCHED("all_finite");
}
void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t rows, int64_t h, float eps,
                     cudaStream_t s) {
  if (rows <= 0) return;
  rmsnorm_fwd_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(y, rstd, x, w, h, eps);
  CTX_CUDA_LAUNCHED("rmsnorm_forward");
}
void rmsnorm_backward_dx(float* dx, const float* dy, const float* x, const float* rstd, const float* w, int64_t rows,
                         int64_t h, cudaStream_t s) {
  if (rows <= 0) return;
  rmsnorm_bwd_dx_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(dx, dy, x, rstd, w, h);
  CTX_CUDA_LAUNCHED("rmsnorm_backward");
}
int64_t rmsnorm_dw_chunks(int64_t rows) { return rows < kDwChunks ? (rows < 1 ? 1 : rows) : kDwChunks; }
void rmsnorm_backward_dw(float* dw, float* scratch, const float* dy, const float* x, const float* rstd, int64_t rows,
                         int64_t h, cudaStream_t s) {
  if (rows <= 0 || h <= 0) return;
  const int64_t chunks = rmsnorm_dw_chunks(rows), per = (rows + chunks - 1) / chunks;
  dim3 grid(static_cast<unsigned>((h + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
  rmsnorm_dw_partial<<<grid, kThreads, 0, s>>>(scratch, dy, x, rstd, rows, h, per);
  CTX_CUDA_LAUNCHED("rmsnorm_backward dw");
  rmsnorm_dw_finish<<<grid.x, kThreads, 0, s>>>(dw, scratch, chunks, h);
  CTX_CUDA_LAUNCHED("rmsnorm_backward dw");
}
void row_max(float* out, const float* logits, int64_t rows, int64_t cols, int64_t valid, cudaStream_t s) {
  if (rows <= 0) return;
  row_max_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(out, logits, cols, valid);
  CTX_CUDA_LAUNCHED("row_max");
}
void sumexp_and_target(float* out, const float* logits, const float* mx, const int32_t* target, int64_t rows,
                       int64_t cols, int64_t valid, int64_t v0, cudaStream_t s) {
  if (rows <= 0) return;
  sumexp_target_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(out, logits, mx, target, cols, valid, v0);
  CTX_CUDA_LAUNCHED("sumexp_and_target");
}
void xent_grad_inplace(float* logits, const float* lse, const int32_t* target, const float* weight, int64_t rows,
                       int64_t cols, int64_t valid, int64_t v0, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  xent_grad_kernel<<<grid_for(rows * cols, 65535 * 16), kThreads, 0, s>>>(logits, lse, target, weight, rows, cols,
                                                                          valid, v0);
  CTX_CUDA_LAUNCHED("xent_grad_inplace");
}
void attention_delta(float* delta, const float* dout, const float* o, int64_t rows, int64_t d, cudaStream_t s) {
  if (rows <= 0) return;
  const int64_t threads = rows * 32;
  attention_delta_kernel<<<grid_for(threads, INT32_MAX), kThreads, 0, s>>>(delta, dout, o, rows, d);
  CTX_CUDA_LAUNCHED("attention_delta");
}

}  // namespace ctx::exec::cuda::k
