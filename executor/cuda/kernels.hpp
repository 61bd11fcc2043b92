// Launchers for the CUDA backend's kernels (implemented in kernels_*.cu and attention.cu). Every
// pointer is device-reachable (device, managed or mapped pinned memory): since issue 12 strategy
// code holds opaque tensors and uploads its token data, so there is nothing to stage. Semantics
// are those of the CPU reference backend (executor/cpu_backend.cpp), row for row; numerics: float
// storage, float arithmetic, double accumulation where the reference sums a whole row in double.
// bf16 storage is issue 13 (the backend refuses bf16 views before calling these).
//
// Status: compiles, untested on GPU (docs/CUDA.md). The kernel source (*_kernels.cuh) runs on the
// CPU emulator in test_cuda_kernels_emulated; the launchers themselves have never run.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ctx::exec::cuda::k {

// ---- elementwise (kernels_elementwise.cu)
void fill(float* p, float value, int64_t n, cudaStream_t s);
void axpy(float* y, float alpha, const float* x, int64_t n, cudaStream_t s);
void scale(float* x, float alpha, int64_t n, cudaStream_t s);
// dst[r, dst_col0 + c] (=|+=) src[r, src_col0 + c] for c < ncols, row strides dst_ld / src_ld.
void copy_cols(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t ncols, bool add,
               cudaStream_t s);
void rope(float* x, int64_t rows, int64_t heads, int64_t d, const int32_t* pos, const float* inv_freq, int64_t rot,
          float attn_scale, bool inverse, cudaStream_t s);
void swiglu_forward(float* a, const float* gate, const float* up, int64_t n, cudaStream_t s);
void swiglu_backward(float* dgate, float* dup, const float* da, const float* gate, const float* up, int64_t n,
                     cudaStream_t s);
void embedding_forward(float* out, const float* table, const int32_t* tok, int64_t tokens, int64_t h, int64_t v0,
                       int64_t vrows, cudaStream_t s);
// The embedding backward on the device, without a host read and without atomics: the tokens are
// keyed by vocabulary row (tokens of other shards get the key vrows), stably radix-sorted by key
// (CUB; ties keep token order), and each run of equal keys is summed in token order by one block
// into its row, so the sum runs in the reference's order. `scratch` holds
// embedding_backward_scratch_bytes(tokens, vrows) bytes.
size_t embedding_backward_scratch_bytes(int64_t tokens, int64_t vrows);
void embedding_backward(float* dtable, const float* dout, const int32_t* tok, int64_t tokens, int64_t h, int64_t v0,
                        int64_t vrows, void* scratch, cudaStream_t s);
// AdamW reading the step statistics on the device: stats[1] (non-finite code) != 0 or a
// non-finite norm sqrt(stats[2]) skips the update; clip > 0 scales the gradient by
// min(1, clip / (norm + 1e-6)).
void adamw(float* master, float* m, float* v, const float* grad, const float* stats, float decay, int64_t n, float lr,
           float beta1, float beta2, float eps, float weight_decay, float clip, double bias_corr1, double bias_corr2,
           cudaStream_t s);

// ---- reductions (kernels_reduce.cu). `partials` holds kReduceBlocks doubles of scratch.
constexpr int kReduceBlocks = 256;
// *stat += sum of squares of x (double partial sums in a fixed tree, added to the float once)
void sum_squares(float* stat, double* partials, const float* x, int64_t n, cudaStream_t s);
// *stat = max(*stat, code) when x holds a NaN or an infinity; `flag` is one int of scratch.
void flag_nonfinite(float* stat, int* flag, const float* x, int64_t n, float code, cudaStream_t s);
void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t rows, int64_t h, float eps,
                     cudaStream_t s);
void rmsnorm_backward_dx(float* dx, const float* dy, const float* x, const float* rstd, const float* w, int64_t rows,
                         int64_t h, cudaStream_t s);
// dw += sum over rows of dy*x*rstd: per-chunk partial sums into scratch[chunks*h], then in order.
int64_t rmsnorm_dw_chunks(int64_t rows);
void rmsnorm_backward_dw(float* dw, float* scratch, const float* dy, const float* x, const float* rstd, int64_t rows,
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
void attention_delta(float* delta, const float* dout, const float* o, int64_t rows, int64_t d, cudaStream_t s);

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
void attention_forward(float* o, float* lse, const float* q, const float* k, const float* v, const AttnTokens& t,
                       const AttnDims& sh, cudaStream_t s);
void attention_backward(float* dq, float* dk, float* dv, const float* q, const float* k, const float* v,
                        const AttnTokens& t, const float* dout, const float* lse, const float* delta,
                        const AttnDims& sh, cudaStream_t s);

}  // namespace ctx::exec::cuda::k
