// Elementwise and gather/scatter kernels of the CUDA backend: one thread per element (grid-stride
// loops), float arithmetic in the reference's order (cpu_backend.cpp), float or bf16 storage
// (templates instantiated at the end of this file; the f32 <-> bf16 conversion of Backend::copy). No fast-math: expf, sincos
// are the accurate versions so the comparison tests can hold tight tolerances.
//
// Status: ran on one H200 on 2026-11-28 (docs/GPU_PROOF.md); the kernel source also runs on the CPU emulator.
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cmath>
#include <stdexcept>

#include "executor/cuda/cuda_check.hpp"
#include "executor/cuda/launch.cuh"
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

template <typename T>
void fill(T* p, float value, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  CTX_LAUNCH(blocks_for(n), kThreads, 0, s, fill_kernel<T>)(p, value, n);
  CTX_CUDA_LAUNCHED("fill");
}
template <typename TY, typename TX>
void axpy(TY* y, float alpha, const TX* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  CTX_LAUNCH(blocks_for(n), kThreads, 0, s, axpy_kernel<TY, TX>)(y, alpha, x, n);
  CTX_CUDA_LAUNCHED("axpy");
}
template <typename T>
void scale(T* x, float alpha, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  CTX_LAUNCH(blocks_for(n), kThreads, 0, s, scale_kernel<T>)(x, alpha, n);
  CTX_CUDA_LAUNCHED("scale");
}
template <typename TD, typename TS>
void convert(TD* dst, const TS* src, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  CTX_LAUNCH(blocks_for(n), kThreads, 0, s, convert_kernel<TD, TS>)(dst, src, n);
  CTX_CUDA_LAUNCHED("copy (f32 <-> bf16)");
}
template <typename TD, typename TS>
void copy_cols(TD* dst, int64_t dst_ld, const TS* src, int64_t src_ld, int64_t rows, int64_t ncols, bool add,
               cudaStream_t s) {
  if (rows <= 0 || ncols <= 0) return;
  CTX_LAUNCH(blocks_for(rows * ncols), kThreads, 0, s, copy_cols_kernel<TD, TS>)(dst, dst_ld, src, src_ld, rows, ncols,
                                                                                 add);
  CTX_CUDA_LAUNCHED(add ? "add_cols" : "copy_cols");
}
template <typename T>
void rope(T* x, int64_t rows, int64_t heads, int64_t d, const int32_t* pos, const float* inv_freq, int64_t rot,
          float attn_scale, bool inverse, cudaStream_t s) {
  const int64_t half = rot / 2;
  if (rows <= 0 || half <= 0) return;
  CTX_LAUNCH(blocks_for(rows * half), kThreads, 0, s, rope_kernel<T>)(x, rows, heads, d, pos, inv_freq, half,
                                                                      attn_scale, inverse ? -1.0f : 1.0f);
  CTX_CUDA_LAUNCHED("rope");
}
template <typename T>
void swiglu_forward(T* a, const T* gate, const T* up, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  CTX_LAUNCH(blocks_for(n), kThreads, 0, s, swiglu_fwd_kernel<T>)(a, gate, up, n);
  CTX_CUDA_LAUNCHED("swiglu_forward");
}
template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* da, const T* gate, const T* up, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  CTX_LAUNCH(blocks_for(n), kThreads, 0, s, swiglu_bwd_kernel<T>)(dgate, dup, da, gate, up, n);
  CTX_CUDA_LAUNCHED("swiglu_backward");
}
template <typename T>
void embedding_forward(T* out, const T* table, const int32_t* tok, int64_t tokens, int64_t h, int64_t v0,
                       int64_t vrows, cudaStream_t s) {
  if (tokens <= 0 || h <= 0) return;
  CTX_LAUNCH(blocks_for(tokens * h), kThreads, 0, s, embedding_fwd_kernel<T>)(out, table, tok, tokens, h, v0, vrows);
  CTX_CUDA_LAUNCHED("embedding_forward");
}
// Scratch layout: keys, positions, sorted keys, sorted positions (tokens int32 each, 256-byte
// aligned), then CUB's temporary storage.
namespace {
size_t align256(size_t b) { return (b + 255) / 256 * 256; }
int key_bits(int64_t vrows) {  // keys are 0..vrows: sort only the bits they use
  int b = 1;
  while (b < 31 && (int64_t(1) << b) <= vrows) ++b;
  return b;
}
size_t cub_sort_bytes(int64_t tokens, int64_t vrows) {
  size_t bytes = 0;
  CTX_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                           static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                           static_cast<int32_t*>(nullptr), static_cast<int>(tokens), 0,
                                           key_bits(vrows)));
  return bytes;
}
}  // namespace

size_t embedding_backward_scratch_bytes(int64_t tokens, int64_t vrows) {
  if (tokens <= 0) return 0;
  return 4 * align256(sizeof(int32_t) * static_cast<size_t>(tokens)) + align256(cub_sort_bytes(tokens, vrows));
}

template <typename T>
void embedding_backward(float* dtable, const T* dout, const int32_t* tok, int64_t tokens, int64_t h, int64_t v0,
                        int64_t vrows, void* scratch, cudaStream_t s) {
  if (tokens <= 0 || h <= 0 || vrows <= 0) return;
  if (tokens > INT32_MAX) throw std::invalid_argument("CUDA embedding_backward: more than 2^31 tokens");
  const size_t col = align256(sizeof(int32_t) * static_cast<size_t>(tokens));
  char* base = static_cast<char*>(scratch);
  auto* keys = reinterpret_cast<int32_t*>(base);
  auto* pos = reinterpret_cast<int32_t*>(base + col);
  auto* skeys = reinterpret_cast<int32_t*>(base + 2 * col);
  auto* spos = reinterpret_cast<int32_t*>(base + 3 * col);
  void* tmp = base + 4 * col;
  size_t tmp_bytes = cub_sort_bytes(tokens, vrows);
  CTX_LAUNCH(blocks_for(tokens), kThreads, 0, s, embedding_keys_kernel)(keys, pos, tok, tokens, v0, vrows);
  CTX_CUDA_LAUNCHED("embedding_backward keys");
  // LSD radix sort: stable, so the positions of one row stay in token order
  CTX_CUDA(cub::DeviceRadixSort::SortPairs(tmp, tmp_bytes, keys, skeys, pos, spos, static_cast<int>(tokens), 0,
                                           key_bits(vrows), s));
  const int64_t grid = tokens < 65535 * 16 ? tokens : 65535 * 16;  // blocks stride over the rest
  CTX_LAUNCH(static_cast<unsigned>(grid), 128, 0, s, embedding_bwd_sorted_kernel<T>)(dtable, dout, skeys, spos, tokens, h,
                                                                                    vrows);
  CTX_CUDA_LAUNCHED("embedding_backward");
}
template <typename P, typename S>
void adamw(P* master, S* m, S* v, const float* grad, const float* stats, float decay, int64_t n, float lr, float beta1,
           float beta2, float eps, float weight_decay, float clip, double bc1, double bc2, cudaStream_t s) {
  if (n <= 0) return;
  CTX_LAUNCH(blocks_for(n), kThreads, 0, s, adamw_kernel<P, S>)(master, m, v, grad, stats, decay, n, lr, beta1, beta2, eps,
                                                        weight_decay, clip, bc1, bc2);
  CTX_CUDA_LAUNCHED("adamw");
}


// The storage types each launcher is built for (kernels.hpp): float and bf16 bits.
#define CTX_T1(T)                                                                                                    \
  template void fill<T>(T*, float, int64_t, cudaStream_t);                                                          \
  template void scale<T>(T*, float, int64_t, cudaStream_t);                                                         \
  template void rope<T>(T*, int64_t, int64_t, int64_t, const int32_t*, const float*, int64_t, float, bool,          \
                        cudaStream_t);                                                                              \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t, cudaStream_t);                                   \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, cudaStream_t);                    \
  template void embedding_forward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, cudaStream_t); \
  template void embedding_backward<T>(float*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, void*,   \
                                      cudaStream_t);
#define CTX_T2(TD, TS)                                                                                          \
  template void axpy<TD, TS>(TD*, float, const TS*, int64_t, cudaStream_t);                                    \
  template void copy_cols<TD, TS>(TD*, int64_t, const TS*, int64_t, int64_t, int64_t, bool, cudaStream_t);      \
  template void adamw<TD, TS>(TD*, TS*, TS*, const float*, const float*, float, int64_t, float, float, float, float, \
                              float, float, double, double, cudaStream_t);
CTX_T1(float)
CTX_T1(bf16_bits)
CTX_T2(float, float)
CTX_T2(float, bf16_bits)
CTX_T2(bf16_bits, float)
CTX_T2(bf16_bits, bf16_bits)
template void convert<float, bf16_bits>(float*, const bf16_bits*, int64_t, cudaStream_t);
template void convert<bf16_bits, float>(bf16_bits*, const float*, int64_t, cudaStream_t);
#undef CTX_T1
#undef CTX_T2

}  // namespace ctx::exec::cuda::k
