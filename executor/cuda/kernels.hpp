// Launchers for the CUDA backend's kernels (implemented in kernels_*.cu and attention.cu). Every
// pointer is device-reachable (device, managed or mapped pinned memory): cuda_backend.cu stages
// host-only inputs (token ids, positions, masks) before calling these. Semantics are those of the
// CPU reference backend (executor/cpu_backend.cpp), row for row; numerics: float storage, float
// arithmetic, double accumulation where the reference sums a whole row in double.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>


namespace ctx::exec::cuda::k {

// ---- elementwise (kernels_elementwise.cu)
void fill(float* p, float value, int64_t n, cudaStream_t s);
void axpy(float* y, float alpha, const float* x, int64_t n, cudaStream_t s);
void scale(float* x, float alpha, int64_t n, cudaStream_t s);
void add_block(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols, cudaStream_t s);
void rope(float* x, int64_t rows, int64_t heads, int64_t d, const int32_t* pos, const float* inv_freq, int64_t rot,
          float attn_scale, bool inverse, cudaStream_t s);
void swiglu_forward(float* a, const float* gate, const float* up, int64_t n, cudaStream_t s);
void swiglu_backward(float* dgate, float* dup, const float* da, const float* gate, const float* up, int64_t n,
                     cudaStream_t s);
void embedding_forward(float* out, const float* table, const int32_t* tok, int64_t tokens, int64_t h, int64_t v0,
                       int64_t vrows, cudaStream_t s);
// Rows grouped on the host (CSR): vocab row rows[u] receives dout rows at positions[offsets[u] ..
// offsets[u+1]) in token order, so the sum runs in the reference's order (deterministic, no atomics).
void embedding_backward(float* dtable, const float* dout, const int32_t* rows, const int64_t* offsets,
                        const int32_t* positions, int64_t nrows, int64_t h, cudaStream_t s);
void adamw(float* master, float* m, float* v, const float* grad, float decay, int64_t n, float lr, float beta1,
           float beta2, float eps, float weight_decay, float grad_scale, double bias_corr1, double bias_corr2,
           cudaStream_t s);

// ---- reductions (kernels_reduce.cu). `partials` holds kReduceBlocks doubles of scratch.
constexpr int kReduceBlocks = 256;
void sum_squares(double* out, double* partials, const float* x, int64_t n, cudaStream_t s);
void count_nonfinite(int* flag, const float* x, int64_t n, cudaStream_t s);  // *flag set to 1 if any; caller zeroes
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
void xent_grad_inplace(float* logits, const float* lse, const int32_t* target, const float* weight, int64_t rows,
                       int64_t cols, int64_t valid, int64_t v0, cudaStream_t s);
void attention_delta(float* delta, const float* dout, const float* o, int64_t rows, int64_t d, cudaStream_t s);

// ---- attention (attention.cu): flash-style, key tiles through shared memory, GQA by indexing
// the shared KV head (never materialised per query head), masking by token identity.
constexpr int64_t kMaxHeadDim = 256;
void attention_init();  // raises the dynamic shared-memory limit (once per device)
struct AttnDims {  // the Backend's AttnShape, without the executor headers (this file is nvcc's)
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 0;
};
void attention_forward(float* o, float* lse, const float* q, const int64_t* q_index, const int32_t* q_doc, int64_t tq,
                       const float* k, const float* v, const int64_t* k_index, const int32_t* k_doc, int64_t tk,
                       const AttnDims& sh, cudaStream_t s);
void attention_backward(float* dq, float* dk, float* dv, const float* q, const int64_t* q_index, const int32_t* q_doc,
                        int64_t tq, const float* k, const float* v, const int64_t* k_index, const int32_t* k_doc,
                        int64_t tk, const float* dout, const float* lse, const float* delta, const AttnDims& sh,
                        cudaStream_t s);

}  // namespace ctx::exec::cuda::k
