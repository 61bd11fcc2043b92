// Launchers for the CUDA backend's kernels (implemented in kernels_*.cu and attention.cu). Every
// pointer is device-reachable (device, managed or mapped pinned memory): since issue 12 strategy
// code holds opaque tensors and uploads its token data, so there is nothing to stage. Semantics
// are those of the CPU reference backend (executor/cpu_backend.cpp), row for row; numerics: float
// arithmetic, double accumulation where the reference sums a whole row in double.
//
// Storage: a launcher templated on T (TD, TS, ...) takes float or uint16_t (bf16 bits, rounded to
// nearest even) for that tensor, and is instantiated for exactly those types in its .cu file. A
// bf16 tensor is widened on load and rounded once on store, so a bf16 result is the CPU
// reference's (same rounding points; only the float summation order may differ). Tensors the
// interface keeps f32 (rstd, dw, lse, delta, dtable, the statistics, AdamW, the cross-entropy
// pieces, sum_squares) are float only.
//
// Status: ran on one H200 on 2026-11-28 (docs/GPU_PROOF.md): every kernel test and op case passes against the
// CPU backend and float64. The kernel source (*_kernels.cuh), both storage types, also runs on the CPU
// emulator in test_cuda_kernels_emulated.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ctx::exec::cuda::k {

using bf16_bits = uint16_t;  // bf16 storage (dev::bf16_bits)

// ---- elementwise (kernels_elementwise.cu); T, TD, TS, TY, TX in {float, bf16_bits}
template <typename T>
void fill(T* p, float value, int64_t n, cudaStream_t s);  // value rounded once for bf16
template <typename TY, typename TX>
void axpy(TY* y, float alpha, const TX* x, int64_t n, cudaStream_t s);
template <typename T>
void scale(T* x, float alpha, int64_t n, cudaStream_t s);
// dst[i] = src[i] converted: f32 -> bf16 rounds to nearest even, bf16 -> f32 is exact (TD != TS).
template <typename TD, typename TS>
void convert(TD* dst, const TS* src, int64_t n, cudaStream_t s);
// dst[r, dst_col0 + c] (=|+=) src[r, src_col0 + c] for c < ncols, row strides dst_ld / src_ld.
template <typename TD, typename TS>
void copy_cols(TD* dst, int64_t dst_ld, const TS* src, int64_t src_ld, int64_t rows, int64_t ncols, bool add,
               cudaStream_t s);
template <typename T>
void rope(T* x, int64_t rows, int64_t heads, int64_t d, const int32_t* pos, const float* inv_freq, int64_t rot,
          float attn_scale, bool inverse, cudaStream_t s);
template <typename T>
void swiglu_forward(T* a, const T* gate, const T* up, int64_t n, cudaStream_t s);
template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* da, const T* gate, const T* up, int64_t n, cudaStream_t s);
template <typename T>
void embedding_forward(T* out, const T* table, const int32_t* tok, int64_t tokens, int64_t h, int64_t v0,
                       int64_t vrows, cudaStream_t s);
// The embedding backward on the device, without a host read and without atomics: the tokens are
// keyed by vocabulary row (tokens of other shards get the key vrows), stably radix-sorted by key
// (CUB; ties keep token order), and each run of equal keys is summed in token order by one block
// into its row, so the sum runs in the reference's order. `scratch` holds
// embedding_backward_scratch_bytes(tokens, vrows) bytes.
size_t embedding_backward_scratch_bytes(int64_t tokens, int64_t vrows);
template <typename T>
void embedding_backward(float* dtable, const T* dout, const int32_t* tok, int64_t tokens, int64_t h, int64_t v0,
                        int64_t vrows, void* scratch, cudaStream_t s);
// AdamW reading the step statistics on the device: stats[1] (non-finite code) != 0 or a
// non-finite norm sqrt(stats[2]) skips the update; clip > 0 scales the gradient by
// min(1, clip / (norm + 1e-6)). P: the weights stepped (fp32 master, or the compute weights with
// master=none), S: the moments (fp32, or bf16 with moments=bf16); each in {float, bf16_bits}.
template <typename P, typename S>
void adamw(P* master, S* m, S* v, const float* grad, const float* stats, float decay, int64_t n, float lr, float beta1,
           float beta2, float eps, float weight_decay, float clip, double bias_corr1, double bias_corr2, cudaStream_t s);

// ---- reductions (kernels_reduce.cu). `partials` holds kReduceBlocks doubles of scratch.
constexpr int kReduceBlocks = 256;
// *stat += sum of squares of x (double partial sums in a fixed tree, added to the float once)
void sum_squares(float* stat, double* partials, const float* x, int64_t n, cudaStream_t s);
// *stat = max(*stat, code) when x holds a NaN or an infinity; `flag` is one int of scratch.
template <typename T>
void flag_nonfinite(float* stat, int* flag, const T* x, int64_t n, float code, cudaStream_t s);
// y, x, w (and dx, dy) share T; rstd and dw are f32.
template <typename T>
void rmsnorm_forward(T* y, float* rstd, const T* x, const T* w, int64_t rows, int64_t h, float eps, cudaStream_t s);
template <typename T>
void rmsnorm_backward_dx(T* dx, const T* dy, const T* x, const float* rstd, const T* w, int64_t rows, int64_t h,
                         cudaStream_t s);
// dw += sum over rows of dy*x*rstd: per-chunk partial sums into scratch[chunks*h], then in order.
int64_t rmsnorm_dw_chunks(int64_t rows);
template <typename T>
void rmsnorm_backward_dw(float* dw, float* scratch, const T* dy, const T* x, const float* rstd, int64_t rows,
                         int64_t h, cudaStream_t s);
void row_max(float* out, const float* logits, int64_t rows, int64_t cols, int64_t valid, cudaStream_t s);
void sumexp_and_target(float* out, const float* logits, const float* mx, const int32_t* target, int64_t rows,
                       int64_t cols, int64_t valid, int64_t v0, cudaStream_t s);
// lse[r] = max[r] + log(se[2r]); *loss_stat += sum over rows with target >= 0 of lse[r] - se[2r+1]
// (one block: double sum in a fixed order, added to the float once).
void xent_finish(float* lse, float* loss_stat, const float* mx, const float* se, const int32_t* target, int64_t rows,
                 cudaStream_t s);
void xent_grad_inplace(float* logits, const float* lse, const int32_t* target, float weight, int64_t rows, int64_t cols,
                       int64_t valid, int64_t v0, cudaStream_t s);
template <typename TD, typename TO>
void attention_delta(float* delta, const TD* dout, const TO* o, int64_t rows, int64_t d, cudaStream_t s);

// ---- attention (attention.cu): flash-style, key tiles through shared memory, GQA by indexing
// the shared KV head (never materialised per query head), masking by token identity, key loops
// bounded by the per-query hulls kv_range [tq][2] (lo, hi).
constexpr int64_t kMaxHeadDim = 256;
void attention_init();  // raises the dynamic shared-memory limit (once per device)
struct AttnDims {  // the Backend's AttnShape, without the executor headers (this file is nvcc's)
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 0;
};
struct AttnTokens {  // query ids, key ids and the hulls, all device pointers
  const int64_t* q_index = nullptr;
  const int32_t* q_doc = nullptr;
  int64_t tq = 0;
  const int64_t* k_index = nullptr;
  const int32_t* k_doc = nullptr;
  int64_t tk = 0;
  const int32_t* kv_range = nullptr;
};
// T: q, k, v, dout; TO: o; TQ: dq; TKV: dk, dv (each float or bf16_bits; lse, delta f32).
template <typename T, typename TO>
void attention_forward(TO* o, float* lse, const T* q, const T* k, const T* v, const AttnTokens& t, const AttnDims& sh,
                       cudaStream_t s);
template <typename T, typename TQ, typename TKV>
void attention_backward(TQ* dq, TKV* dk, TKV* dv, const T* q, const T* k, const T* v, const AttnTokens& t,
                        const T* dout, const float* lse, const float* delta, const AttnDims& sh, cudaStream_t s);

}  // namespace ctx::exec::cuda::k
