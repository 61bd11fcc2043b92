// The backend interface: allocation (through the memory ledger) and every kernel the model and
// the parallel strategies need. Strategy code calls only these, so the same TP/SP/CP/Ulysses/ZeRO
// code runs on the CPU reference backend (cpu_backend.cpp, Eigen) and on a CUDA backend.
// Matrices are row-major; Linear weights use the Hugging Face layout W[out, in], so y = x W^T.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "executor/memory_accounting.hpp"
#include "executor/tensor.hpp"

namespace ctx::exec {

// One query or key token's identity for masking: visible iff same document and key index <= query index.
struct TokenRefs {
  const int64_t* index = nullptr;  // global position in the packed sequence
  const int32_t* doc = nullptr;    // document id inside the packed sequence
};

struct AttnShape {
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 0;  // 1/sqrt(head_dim)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  MemoryLedger& ledger() { return ledger_; }

  // ---- memory: zero-filled, accounted
  Tensor alloc(int64_t rows, int64_t cols, Mem cat);
  Tensor alloc_host(int64_t rows, int64_t cols, HostMem cat);
  void free_tensor(Tensor& t);
  void retag(Tensor& t, Mem to);

  // ---- data movement (pointers may be device or host memory of this backend)
  virtual void copy(float* dst, const float* src, int64_t n) = 0;
  virtual void fill(float* dst, float value, int64_t n) = 0;
  virtual void axpy(float* y, float alpha, const float* x, int64_t n) = 0;  // y += alpha x
  virtual void scale(float* x, float alpha, int64_t n) = 0;
  virtual double sum_squares(const float* x, int64_t n) = 0;
  virtual bool all_finite(const float* x, int64_t n) = 0;
  // Copies a [rows, cols] block with source/destination row strides (columns of a wider matrix).
  virtual void copy_block(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols) = 0;
  virtual void add_block(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols) = 0;

  // ---- GEMM: C[m,n] = alpha op(A) op(B) + beta C, contiguous row-major operands
  virtual void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    const float* b, float beta, float* c) = 0;

  // ---- model kernels
  virtual void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t rows, int64_t h,
                               float eps) = 0;
  // dx = d(norm)/dx^T dy (written), dw += sum over rows (accumulated)
  virtual void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* rstd,
                                const float* w, int64_t rows, int64_t h) = 0;
  // Rotates pairs (i, i + rot/2) of each head by pos * inv_freq[i], times attn_scale (YaRN); inverse
  // applies the transpose (the backward of the rotation).
  virtual void rope(float* x, int64_t rows, int64_t heads, int64_t head_dim, const int32_t* pos,
                    const float* inv_freq, int64_t rot_dim, float attn_scale, bool inverse) = 0;
  virtual void swiglu_forward(float* a, const float* gate, const float* up, int64_t n) = 0;
  virtual void swiglu_backward(float* dgate, float* dup, const float* da, const float* gate, const float* up,
                               int64_t n) = 0;
  // out[t] = table[tok[t] - v0] when v0 <= tok < v0 + rows, else 0.
  virtual void embedding_forward(float* out, const float* table, const int32_t* tok, int64_t tokens, int64_t h,
                                 int64_t v0, int64_t vrows) = 0;
  virtual void embedding_backward(float* dtable, const float* dout, const int32_t* tok, int64_t tokens, int64_t h,
                                  int64_t v0, int64_t vrows) = 0;

  // ---- attention (blockwise, online softmax). o [Tq, q_heads*d] and lse [Tq, q_heads] are the
  // running result: a new key block is merged in the stable log-sum-exp form; lse = -inf means
  // "no visible key yet".
  virtual void attention_forward_block(float* o, float* lse, const float* q, TokenRefs qt, int64_t tq,
                                       const float* k, const float* v, TokenRefs kt, int64_t tk,
                                       const AttnShape& s) = 0;
  // Accumulates dq, dk, dv for one key block given the final lse and delta = rowsum(dO * O) per head.
  virtual void attention_backward_block(float* dq, float* dk, float* dv, const float* q, TokenRefs qt, int64_t tq,
                                        const float* k, const float* v, TokenRefs kt, int64_t tk, const float* dout,
                                        const float* lse, const float* delta, const AttnShape& s) = 0;
  virtual void attention_delta(float* delta, const float* dout, const float* o, int64_t tq, const AttnShape& s) = 0;

  // ---- vocab-parallel cross-entropy pieces over a [rows, cols] logits shard whose first `valid`
  // columns are real vocabulary entries v0..v0+valid.
  virtual void row_max(float* out, const float* logits, int64_t rows, int64_t cols, int64_t valid) = 0;
  // out[2r] = sum exp(l - max[r]); out[2r+1] = logit of the target when it lies in this shard, else 0.
  virtual void sumexp_and_target(float* out, const float* logits, const float* max, const int32_t* target,
                                 int64_t rows, int64_t cols, int64_t valid, int64_t v0) = 0;
  // logits <- weight[r] * (softmax - onehot(target)) in place (weight 0 for ignored rows).
  virtual void xent_grad_inplace(float* logits, const float* lse, const int32_t* target, const float* weight,
                                 int64_t rows, int64_t cols, int64_t valid, int64_t v0) = 0;

  // ---- AdamW on one contiguous range (fp32 master, m, v); decay is 0 or 1 for the whole range
  virtual void adamw(float* master, float* m, float* v, const float* grad, float decay, int64_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, float grad_scale, int64_t step) = 0;

 protected:
  virtual float* raw_alloc(int64_t bytes, bool host) = 0;
  virtual void raw_free(float* p, bool host) = 0;

 private:
  MemoryLedger ledger_;
};

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace ctx::exec
