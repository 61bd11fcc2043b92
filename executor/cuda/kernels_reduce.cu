// Reduction kernels of the CUDA backend (float or bf16 activations where the interface allows,
// instantiated at the end of this file): whole-array sums into the step statistics (sum of
// squares, non-finite flag; no host read),
// per-row reductions (RMSNorm, the cross-entropy pieces, attention delta) with one block or one
// warp per row, and the column sum of RMSNorm's weight gradient in fixed row chunks. Every sum
// runs in a fixed order (block tree, then chunks in order): results are deterministic run to run.
// Status: ran on one H200 on 2026-11-28 (docs/GPU_PROOF.md); the kernel source also runs on the CPU emulator.
#include <cfloat>
#include <cmath>

#include "executor/cuda/cuda_check.hpp"
#include "executor/cuda/launch.cuh"
#include "executor/cuda/kernels.hpp"
#include "executor/cuda/reduce_kernels.cuh"

namespace ctx::exec::cuda::k {
namespace {

using namespace dev;
unsigned grid_for(int64_t n, int64_t cap) {
  int64_t b = (n + kRowThreads - 1) / kRowThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > cap ? cap : b));
}

}  // namespace

void sum_squares(float* stat, double* partials, const float* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  CTX_LAUNCH(kReduceBlocks, kRowThreads, 0, s, sum_squares_partial)(partials, x, n);
  CTX_CUDA_LAUNCHED("sum_squares");
  CTX_LAUNCH(1, kRowThreads, 0, s, sum_partials_into)(stat, partials, kReduceBlocks);
  CTX_CUDA_LAUNCHED("sum_squares");
}
template <typename T>
void flag_nonfinite(float* stat, int* flag, const T* x, int64_t n, float code, cudaStream_t s) {
  if (n <= 0) return;
  CTX_CUDA(cudaMemsetAsync(flag, 0, sizeof(int), s));
  CTX_LAUNCH(grid_for(n, 4096), kRowThreads, 0, s, nonfinite_kernel<T>)(flag, x, n);
  CTX_CUDA_LAUNCHED("flag_nonfinite");
  CTX_LAUNCH(1, 32, 0, s, flag_finish_kernel)(stat, flag, code);
  CTX_CUDA_LAUNCHED("flag_nonfinite");
}
template <typename T>
void rmsnorm_forward(T* y, float* rstd, const T* x, const T* w, int64_t rows, int64_t h, float eps, cudaStream_t s) {
  if (rows <= 0) return;
  CTX_LAUNCH(static_cast<unsigned>(rows), kRowThreads, 0, s, rmsnorm_fwd_kernel<T>)(y, rstd, x, w, h, eps);
  CTX_CUDA_LAUNCHED("rmsnorm_forward");
}
template <typename T>
void rmsnorm_backward_dx(T* dx, const T* dy, const T* x, const float* rstd, const T* w, int64_t rows, int64_t h,
                         cudaStream_t s) {
  if (rows <= 0) return;
  CTX_LAUNCH(static_cast<unsigned>(rows), kRowThreads, 0, s, rmsnorm_bwd_dx_kernel<T>)(dx, dy, x, rstd, w, h);
  CTX_CUDA_LAUNCHED("rmsnorm_backward");
}
int64_t rmsnorm_dw_chunks(int64_t rows) { return rows < kDwChunks ? (rows < 1 ? 1 : rows) : kDwChunks; }
template <typename T>
void rmsnorm_backward_dw(float* dw, float* scratch, const T* dy, const T* x, const float* rstd, int64_t rows,
                         int64_t h, cudaStream_t s) {
  if (rows <= 0 || h <= 0) return;
  const int64_t chunks = rmsnorm_dw_chunks(rows), per = (rows + chunks - 1) / chunks;
  dim3 grid(static_cast<unsigned>((h + kRowThreads - 1) / kRowThreads), static_cast<unsigned>(chunks));
  CTX_LAUNCH(grid, kRowThreads, 0, s, rmsnorm_dw_partial<T>)(scratch, dy, x, rstd, rows, h, per);
  CTX_CUDA_LAUNCHED("rmsnorm_backward dw");
  CTX_LAUNCH(grid.x, kRowThreads, 0, s, rmsnorm_dw_finish)(dw, scratch, chunks, h);
  CTX_CUDA_LAUNCHED("rmsnorm_backward dw");
}
void row_max(float* out, const float* logits, int64_t rows, int64_t cols, int64_t valid, cudaStream_t s) {
  if (rows <= 0) return;
  CTX_LAUNCH(static_cast<unsigned>(rows), kRowThreads, 0, s, row_max_kernel)(out, logits, cols, valid);
  CTX_CUDA_LAUNCHED("row_max");
}
void sumexp_and_target(float* out, const float* logits, const float* mx, const int32_t* target, int64_t rows,
                       int64_t cols, int64_t valid, int64_t v0, cudaStream_t s) {
  if (rows <= 0) return;
  CTX_LAUNCH(static_cast<unsigned>(rows), kRowThreads, 0, s, sumexp_target_kernel)(out, logits, mx, target, cols, valid, v0);
  CTX_CUDA_LAUNCHED("sumexp_and_target");
}
void xent_finish(float* lse, float* loss_stat, const float* mx, const float* se, const int32_t* target, int64_t rows,
                 cudaStream_t s) {
  if (rows <= 0) return;
  CTX_LAUNCH(1, kRowThreads, 0, s, xent_finish_kernel)(lse, loss_stat, mx, se, target, rows);
  CTX_CUDA_LAUNCHED("xent_finish");
}
void xent_grad_inplace(float* logits, const float* lse, const int32_t* target, float weight, int64_t rows,
                       int64_t cols, int64_t valid, int64_t v0, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  CTX_LAUNCH(grid_for(rows * cols, 65535 * 16), kRowThreads, 0, s, xent_grad_kernel)(logits, lse, target, weight, rows, cols,
                                                                          valid, v0);
  CTX_CUDA_LAUNCHED("xent_grad_inplace");
}
template <typename TD, typename TO>
void attention_delta(float* delta, const TD* dout, const TO* o, int64_t rows, int64_t d, cudaStream_t s) {
  if (rows <= 0) return;
  const int64_t threads = rows * 32;
  CTX_LAUNCH(grid_for(threads, INT32_MAX), kRowThreads, 0, s, attention_delta_kernel<TD, TO>)(delta, dout, o, rows, d);
  CTX_CUDA_LAUNCHED("attention_delta");
}


// The storage types each launcher is built for (kernels.hpp): float and bf16 bits.
#define CTX_T1(T)                                                                                            \
  template void flag_nonfinite<T>(float*, int*, const T*, int64_t, float, cudaStream_t);                    \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, int64_t, int64_t, float, cudaStream_t);  \
  template void rmsnorm_backward_dx<T>(T*, const T*, const T*, const float*, const T*, int64_t, int64_t,    \
                                       cudaStream_t);                                                       \
  template void rmsnorm_backward_dw<T>(float*, float*, const T*, const T*, const float*, int64_t, int64_t,  \
                                       cudaStream_t);
CTX_T1(float)
CTX_T1(bf16_bits)
template void attention_delta<float, float>(float*, const float*, const float*, int64_t, int64_t, cudaStream_t);
template void attention_delta<float, bf16_bits>(float*, const float*, const bf16_bits*, int64_t, int64_t, cudaStream_t);
template void attention_delta<bf16_bits, float>(float*, const bf16_bits*, const float*, int64_t, int64_t, cudaStream_t);
template void attention_delta<bf16_bits, bf16_bits>(float*, const bf16_bits*, const bf16_bits*, int64_t, int64_t,
                                                    cudaStream_t);
#undef CTX_T1

}  // namespace ctx::exec::cuda::k
