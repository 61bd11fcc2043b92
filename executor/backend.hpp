// The backend interface: allocation (through the memory ledger) and every kernel the model and the
// parallel strategies need, on opaque tensor views that carry a dtype. Strategy code calls only
// these, so the same TP/SP/CP/Ulysses/ZeRO code runs on the CPU reference backend (cpu_backend.cpp,
// Eigen), its guarded and deferred variants, and the CUDA backend.
//
// Every op is stream-ordered: it may run later, on another thread or device, in the order issued.
// Host data crosses at three points only: upload (a micro-batch's token data, initial weights),
// download (blocking: checkpoints, tests) and the one scalar read per optimizer step (the step
// statistics tensor, downloaded by the trainer). Loss, the non-finite flag, the gradient norm,
// clipping and the skip-on-non-finite decision are ops below, computed on the device.
//
// Matrices are row-major; Linear weights use the Hugging Face layout W[out, in], so y = x W^T.
// Floating-point ops accept f32 or bf16 tensors (bf16: stored round-to-nearest-even, computed in
// fp32) unless a comment names the dtype; i32/i64 tensors carry token data.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor/memory_accounting.hpp"
#include "executor/tensor.hpp"

namespace ctx::exec {

class Comm;
class HostComm;

// Thrown by a device backend when an allocation cannot be met even after its cache was given
// back; the message names the category, the ledger's total and the plan's predicted peak.
// ctxrun maps it to kExitDoesNotFit.
class DeviceOutOfMemory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Identity of query or key tokens for masking: a key is visible to a query iff same document and
// key index <= query index.
struct TokenRefs {
  View index;  // i64 [t]: global position in the packed micro-batch
  View doc;    // i32 [t]: document id (documents of different sequences never share an id)
};

// One key block as attention sees it: its tokens, and for every query row of the local block the
// hull [lo, hi) of the key rows it can see (lo == hi: none). Kernels loop over the hull only (tiles
// outside every row's hull are never visited) and still apply the exact mask inside it.
struct KeyBlock {
  TokenRefs keys;
  View kv_range;  // i32 [tq, 2]
};

struct AttnShape {
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 0;  // 1/sqrt(head_dim)
};

// The step statistics tensor (f32 [1, kStepStats]), the one scalar read per optimizer step.
enum StepStat : int {
  kStatLossSum = 0,    // sum of token losses on this rank (then over the data/context ranks)
  kStatNonFinite = 1,  // 0, or the largest code of a non-finite tensor (the trainer encodes layers)
  kStatGradNorm2 = 2,  // global gradient norm squared, before clipping
  kStepStats = 3
};

struct AdamWArgs {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  float decay = 1;  // 0 or 1 for the whole range (no decay on norms)
  float clip = 0;   // max global gradient norm (0 = off): the scale is computed on the device
  int64_t step = 1;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  MemoryLedger& ledger() { return ledger_; }
  // The plan's predicted peak per rank (the memory model's), named in an out-of-memory error.
  void set_predicted_peak_bytes(int64_t b) { predicted_peak_bytes_ = b; }

  // ---- memory: accounted, NOT zero-filled (zero() is an explicit op where needed)
  Tensor alloc(int64_t rows, int64_t cols, DType dt, Mem cat);
  Tensor alloc_host(int64_t rows, int64_t cols, DType dt, HostMem cat);  // pinned host memory on GPUs
  void free_tensor(Tensor& t);
  void retag(Tensor& t, Mem to);

  // ---- the host boundary
  // src holds dst.numel() values; float sources are converted to dst's dtype (f32 or bf16).
  virtual void upload(View dst, const float* src) = 0;
  virtual void upload(View dst, const int32_t* src) = 0;
  virtual void upload(View dst, const int64_t* src) = 0;
  // Blocking: waits for every op issued before, then copies (bf16 widened to float).
  virtual void download(float* dst, View src) = 0;
  virtual void synchronize() = 0;

  // ---- data movement
  virtual void copy(View dst, View src) = 0;  // same numel; converts between f32 and bf16
  virtual void zero(View x) = 0;
  virtual void fill(View x, float value) = 0;
  virtual void axpy(View y, float alpha, View x) = 0;  // y += alpha x
  virtual void scale(View x, float alpha) = 0;
  // dst[:, dst_col0 : dst_col0+ncols] = src[:, src_col0 : src_col0+ncols] (same rows); add_cols adds.
  virtual void copy_cols(View dst, int64_t dst_col0, View src, int64_t src_col0, int64_t ncols) = 0;
  virtual void add_cols(View dst, int64_t dst_col0, View src, int64_t src_col0, int64_t ncols) = 0;

  // ---- GEMM: C = alpha op(A) op(B) + beta C; C is [m, n], op(A) [m, k], op(B) [k, n], fp32
  // accumulation. C may be f32 while A, B are bf16 (weight gradients accumulate in fp32); A may be
  // f32 while B is bf16 (the f32 logits gradient times bf16 head weights).
  virtual void gemm(bool trans_a, bool trans_b, float alpha, View a, View b, float beta, View c) = 0;

  // ---- model kernels
  // y [rows, h] (may be empty: only rstd), rstd f32 [rows, 1]
  virtual void rmsnorm_forward(View y, View rstd, View x, View w, float eps) = 0;
  // dx = d(norm)/dx^T dy (written); dw f32 += sum over rows (accumulated)
  virtual void rmsnorm_backward(View dx, View dw, View dy, View x, View rstd, View w) = 0;
  // x [rows, heads*head_dim]: rotates pairs (i, i + rot/2) of each head by pos * inv_freq[i], times
  // attn_scale (YaRN); inverse applies the transpose. pos i32 [rows], inv_freq f32 [rot/2].
  virtual void rope(View x, int64_t heads, int64_t head_dim, View pos, View inv_freq, int64_t rot_dim,
                    float attn_scale, bool inverse) = 0;
  virtual void swiglu_forward(View a, View gate, View up) = 0;
  virtual void swiglu_backward(View dgate, View dup, View da, View gate, View up) = 0;
  // out[t] = table[tok[t] - v0] when v0 <= tok < v0 + table.rows(), else 0. tok i32 [tokens].
  virtual void embedding_forward(View out, View table, View tok, int64_t v0) = 0;
  virtual void embedding_backward(View dtable, View dout, View tok, int64_t v0) = 0;  // dtable f32 +=

  // ---- attention (blockwise, online softmax). o [tq, q_heads*d] and lse f32 [tq, q_heads] are
  // the running result: a new key block merges in the stable log-sum-exp form; lse = -inf means
  // "no visible key yet".
  virtual void attention_forward_block(View o, View lse, View q, TokenRefs qt, View k, View v, const KeyBlock& kb,
                                       const AttnShape& s) = 0;
  // Accumulates dq, dk, dv for one key block given the final lse and delta = rowsum(dO * O); the sums
  // run in fp32 within the call (bf16 outputs are rounded once, as FlashAttention writes dK, dV).
  virtual void attention_backward_block(View dq, View dk, View dv, View q, TokenRefs qt, View k, View v,
                                        const KeyBlock& kb, View dout, View lse, View delta, const AttnShape& s) = 0;
  virtual void attention_delta(View delta, View dout, View o, const AttnShape& s) = 0;  // delta f32 [tq, q_heads]
  // The query-key pairs the mask keeps that attention_forward_block has evaluated since construction,
  // counted by the kernel itself (each pair once, however many heads it is evaluated for), so a run
  // reports the attention work it really did; -1 where the backend does not count (CUDA). Read after
  // synchronize().
  virtual int64_t attention_forward_pairs() const { return -1; }

  // ---- vocab-parallel cross-entropy over an f32 [rows, cols] logits shard whose first `valid`
  // columns are vocabulary entries v0..v0+valid. target i32 [rows], -1 = ignored.
  virtual void row_max(View out, View logits, int64_t valid) = 0;  // out f32 [rows]
  // out f32 [rows, 2]: sum exp(l - max[r]), and the target's logit when it lies in this shard (else 0)
  virtual void sumexp_and_target(View out, View logits, View max, View target, int64_t valid, int64_t v0) = 0;
  // lse f32 [rows] = max + log(sumexp); stats[kStatLossSum] += sum over valid rows of (lse - target logit)
  virtual void xent_finish(View lse, View stats, View max, View sumexp_target, View target) = 0;
  // logits <- weight * (softmax - onehot(target)) in place, 0 for ignored rows
  virtual void xent_grad_inplace(View logits, View lse, View target, float weight, int64_t valid, int64_t v0) = 0;

  // ---- step statistics and the optimizer (stats: f32 [1, kStepStats])
  // stats[kStatNonFinite] = max(itself, code) when x holds a NaN or an infinity
  virtual void flag_nonfinite(View stats, View x, float code) = 0;
  // stats[kStatGradNorm2] += sum of squares of x (f32)
  virtual void sum_squares(View stats, View x) = 0;
  // AdamW on one contiguous f32 range. Skips the update (as AMP's grad scaler does) when
  // stats[kStatNonFinite] != 0 or the norm is not finite; otherwise scales the gradient by
  // min(1, clip / (norm + 1e-6)) when clip > 0.
  virtual void adamw(View master, View m, View v, View grad, View stats, const AdamWArgs& a) = 0;

  // ---- the copy stream (offload): copy_async runs after every op issued before it, off the
  // compute stream, and returns its event; wait_copy(e) makes the compute stream wait for it. The
  // caller keeps dst and src alive, and reads or writes neither, until it has waited.
  struct CopyEvent {
    uint64_t id = 0;  // 0: already complete
  };
  virtual CopyEvent copy_async(View dst, View src) {
    copy(dst, src);
    return {};
  }
  virtual void wait_copy(CopyEvent) {}

  // ---- communication: the Comm that moves this backend's tensors over one process group
  // (collective over the group). CPU backends: the group's HostComm run in the backend's stream
  // (comm.hpp HostStagedComm); the CUDA backend: NCCL on its own streams.
  virtual std::unique_ptr<Comm> make_comm(std::unique_ptr<HostComm> group);

  // ---- annotations for profilers (CUDA: NVTX ranges; others: nothing). A phase (forward, loss,
  // backward, optimizer) and, within it, the task being issued, in the simulator's names.
  virtual bool annotates() const { return false; }  // callers skip building labels when false
  virtual void annotate_phase(const char* /*phase*/) {}
  virtual void annotate_task(const std::string& /*label*/, bool /*communication*/) {}

  // ---- phase timing, stream-ordered: mark_time(i) records when the stream reaches it;
  // read_times() (after synchronize) gives seconds since construction per slot, -1 if unset.
  virtual void mark_time(int slot) = 0;
  virtual std::vector<double> read_times() = 0;

 protected:
  friend class HostStagedComm;
  virtual void* raw_alloc(int64_t bytes, bool host) = 0;
  virtual void raw_free(void* p, bool host) = 0;
  // For communicators that move this backend's memory through the host (MPI): runs fn in stream
  // order (now, on synchronous backends) and gives the host address of a view's memory there.
  virtual void submit(std::function<void()> fn) { fn(); }
  virtual void* host_address(const View& v) { return v.p_; }
  static void* raw(const View& v) { return v.p_; }
  static View make_view(void* p, DType dt, int64_t rows, int64_t cols) { return View(p, dt, rows, cols); }
  // What raw_alloc is allocating for (set by alloc/alloc_host just before the call): "activations",
  // "pinned host", ... and the plan's predicted peak (0: unknown), for out-of-memory messages.
  const char* alloc_category() const { return alloc_category_; }
  int64_t predicted_peak_bytes() const { return predicted_peak_bytes_; }

 private:
  MemoryLedger ledger_;
  const char* alloc_category_ = "tensor";
  int64_t predicted_peak_bytes_ = 0;
};

// cpu: Eigen reference. cpu-guarded: tensor memory is mapped twice, and the address strategy code
// holds is not readable or writable (PROT_NONE), so any host access outside the backend faults.
// cpu-deferred: every op and communication runs on a worker thread, in order, drained only at
// synchronisation points (guarded memory too).
enum class CpuMode { plain, guarded, deferred };
std::unique_ptr<Backend> make_cpu_backend(CpuMode mode = CpuMode::plain);
// "cpu" | "cpu-guarded" | "cpu-deferred" -> mode; false for other names.
bool parse_cpu_mode(const std::string& name, CpuMode* mode);

}  // namespace ctx::exec
