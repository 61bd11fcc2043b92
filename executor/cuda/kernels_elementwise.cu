// Elementwise and gather/scatter kernels of the CUDA backend: one thread per element (grid-stride
// loops), float arithmetic in the reference's order (cpu_backend.cpp). No fast-math: expf, sincos
// are the accurate versions so the comparison tests can hold tight tolerances.
#include <cmath>

#include "executor/cuda/cuda_check.hpp"
#include "executor/cuda/elementwise_kernels.cuh"
#include "executor/cuda/kernels.hpp"

namespace ctx::exec::cuda::k {
namespace {

constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));  // grid-stride covers the rest
}

}  // namespace
using namespace dev;

void fill(float* p, float value, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  fill_kernel<<<blocks_for(n), kThreads, 0, s>>>(p, value, n);
  CTX_CUDA_LAUNCHED("fill");
}
void axpy(float* y, float alpha, const float* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  axpy_kernel<<<blocks_for(n), kThreads, 0, s>>>(y, alpha, x, n);
  CTX_CUDA_LAUNCHED("axpy");
}
void scale(float* x, float alpha, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, alpha, n);
  CTX_CUDA_LAUNCHED("scale");
}
void add_block(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols,
               cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  add_block_kernel<<<blocks_for(rows * cols), kThreads, 0, s>>>(dst, dst_ld, src, src_ld, rows, cols);
  CTX_CUDA_LAUNCHED("add_block");
}
void rope(float* x, int64_t rows, int64_t heads, int64_t d, const int32_t* pos, const float* inv_freq, int64_t rot,
          float attn_scale, bool inverse, cudaStream_t s) {
  const int64_t half = rot / 2;
  if (rows <= 0 || half <= 0) return;
  rope_kernel<<<blocks_for(rows * half), kThreads, 0, s>>>(x, rows, heads, d, pos, inv_freq, half, attn_scale,
                                                           inverse ? -1.0f : 1.0f);
  CTX_CUDA_LAUNCHED("rope");
}
void swiglu_forward(float* a, const float* gate, const float* up, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  swiglu_fwd_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, gate, up, n);
  CTX_CUDA_LAUNCHED("swiglu_forward");
}
void swiglu_backward(float* dgate, float* dup, const float* da, const float* gate, const float* up, int64_t n,
                     cudaStream_t s) {
  if (n <= 0) return;
  swiglu_bwd_kernel<<<blocks_for(n), kThreads, 0, s>>>(dgate, dup, da, gate, up, n);
  CTX_CUDA_LAUNCHED("swiglu_backward");
}
void embedding_forward(float* out, const float* table, const int32_t* tok, int64_t tokens, int64_t h, int64_t v0,
                       int64_t vrows, cudaStream_t s) {
  if (tokens <= 0 || h <= 0) return;
  embedding_fwd_kernel<<<blocks_for(tokens * h), kThreads, 0, s>>>(out, table, tok, tokens, h, v0, vrows);
  CTX_CUDA_LAUNCHED("embedding_forward");
}
void embedding_backward(float* dtable, const float* dout, const int32_t* rows, const int64_t* offsets,
                        const int32_t* positions, int64_t nrows, int64_t h, cudaStream_t s) {
  if (nrows <= 0 || h <= 0) return;
  embedding_bwd_kernel<<<static_cast<unsigned>(nrows), 128, 0, s>>>(dtable, dout, rows, offsets, positions, h);
  CTX_CUDA_LAUNCHED("embedding_backward");
}
void adamw(float* master, float* m, float* v, const float* grad, float decay, int64_t n, float lr, float beta1,
           float beta2, float eps, float weight_decay, float grad_scale, double bc1, double bc2, cudaStream_t s) {
  if (n <= 0) return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, s>>>(master, m, v, grad, decay, n, lr, beta1, beta2, eps, weight_decay,
                                                  grad_scale, bc1, bc2);
  CTX_CUDA_LAUNCHED("adamw");
}

}  // namespace ctx::exec::cuda::k
