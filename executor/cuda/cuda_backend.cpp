// The CUDA backend (see cuda_backend.hpp). Host code only: the kernels are in kernels_*.cu and
// attention.cu, GEMMs in gemm_lt.cpp, memory in caching_allocator.cpp. This file decides where
// each pointer lives, stages host-only inputs (token ids, positions, masks live in std::vector
// on the host), launches, and keeps the Backend contract: when a call returns, its results are
// visible to the host (sync_each_call) -- see docs/CUDA.md for why that is needed today.
#include "executor/cuda/cuda_backend.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "executor/cuda/caching_allocator.hpp"
#include "executor/cuda/cuda_check.hpp"
#include "executor/cuda/embedding_rows.hpp"
#include "executor/cuda/gemm_lt.hpp"
#include "executor/cuda/kernels.hpp"

namespace ctx::exec {
namespace {

using cuda::CachingAllocator;
using cuda::GemmType;
using cuda::LtGemm;

// Where a pointer lives, as the driver sees it.
enum class Where { device, managed, pinned_host, pageable_host };

Where where_is(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return Where::pageable_host;
  }
  switch (a.type) {
    case cudaMemoryTypeDevice: return Where::device;
    case cudaMemoryTypeManaged: return Where::managed;
    case cudaMemoryTypeHost: return a.devicePointer ? Where::pinned_host : Where::pageable_host;
    default: return Where::pageable_host;
  }
}

constexpr size_t kScratchAlign = 256;
size_t round_up(size_t b) { return (b + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaBackendOptions& o) : device_(device), opts_(o) {
    const int n = cuda_device_count();
    if (n == 0) throw std::runtime_error("CUDA backend: no CUDA device (cudaGetDeviceCount found none)");
    if (device < 0 || device >= n)
      throw std::runtime_error("CUDA backend: device " + std::to_string(device) + " does not exist (" +
                               std::to_string(n) + " visible)");
    CTX_CUDA(cudaSetDevice(device));
    cudaDeviceProp prop{};
    CTX_CUDA(cudaGetDeviceProperties(&prop, device));
    name_ = std::string("cuda:") + std::to_string(device) + " (" + prop.name + ", sm_" + std::to_string(prop.major) +
            std::to_string(prop.minor) + ")";
    CTX_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    alloc_ = std::make_unique<CachingAllocator>(device, o.managed_memory);
    // fixed device scratch for the scalar reductions: partial sums, the result, the finite flag
    CTX_CUDA(cudaMalloc(&reduce_, (cuda::k::kReduceBlocks + 2) * sizeof(double)));
    CTX_CUDA(cudaMallocHost(&readback_, 2 * sizeof(double)));
    const int64_t ws = std::max<int64_t>(o.gemm_workspace_bytes, 0);
    if (ws > 0) CTX_CUDA(cudaMalloc(&gemm_ws_, static_cast<size_t>(ws)));
    ledger().on_alloc(Mem::workspace, ws);
    gemm_ = std::make_unique<LtGemm>(gemm_ws_, static_cast<size_t>(ws));
    cuda::k::attention_init();
  }

  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    gemm_.reset();
    if (gemm_ws_) cudaFree(gemm_ws_);
    if (scratch_) cudaFree(scratch_);
    cudaFree(reduce_);
    cudaFreeHost(readback_);
    alloc_.reset();
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return name_; }
  cudaStream_t stream() const { return stream_; }
  void synchronize() { CTX_CUDA(cudaStreamSynchronize(stream_)); }

  CudaMemoryReport report() {
    CudaMemoryReport r;
    r.device = device_;
    r.ledger_current_bytes = ledger().current_total();
    r.ledger_peak_bytes = ledger().peak_total();
    r.allocator_reserved_bytes = alloc_->reserved_device_bytes();
    r.allocator_cached_bytes = alloc_->cached_bytes();
    r.allocator_peak_reserved_bytes = alloc_->peak_reserved_device_bytes();
    r.allocator_host_pinned_bytes = alloc_->reserved_host_bytes();
    r.allocator_cuda_calls = alloc_->cuda_calls();
    size_t f = 0, t = 0;
    CTX_CUDA(cudaSetDevice(device_));
    CTX_CUDA(cudaMemGetInfo(&f, &t));
    r.driver_free_bytes = static_cast<int64_t>(f);
    r.driver_total_bytes = static_cast<int64_t>(t);
    return r;
  }

  // ---- data movement
  void copy(float* dst, const float* src, int64_t n) override {
    if (n <= 0 || dst == src) return;
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    const bool overlap = dst < src + n && src < dst + n;
    if (overlap) {  // memmove semantics: through scratch
      void* tmp = scratch(bytes);
      CTX_CUDA(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDefault, stream_));
      CTX_CUDA(cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDefault, stream_));
    } else {
      CTX_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
    }
    done();
  }
  void fill(float* dst, float value, int64_t n) override {
    if (n <= 0) return;
    const Where w = where_is(dst);
    if (w == Where::pinned_host || w == Where::pageable_host) {  // host memory: fill it from the host
      synchronize();
      std::fill(dst, dst + n, value);
      return;
    }
    if (value == 0.0f) CTX_CUDA(cudaMemsetAsync(dst, 0, static_cast<size_t>(n) * sizeof(float), stream_));
    else cuda::k::fill(dst, value, n, stream_);
    done();
  }
  void axpy(float* y, float alpha, const float* x, int64_t n) override {
    if (n <= 0) return;
    auto in = stage<1>({{{x, bytes_f(n)}}});
    cuda::k::axpy(out(y, "axpy"), alpha, f(in[0]), n, stream_);
    done();
  }
  void scale(float* x, float alpha, int64_t n) override {
    if (n <= 0) return;
    cuda::k::scale(out(x, "scale"), alpha, n, stream_);
    done();
  }
  double sum_squares(const float* x, int64_t n) override {
    if (n <= 0) return 0.0;
    auto in = stage<1>({{{x, bytes_f(n)}}});
    double* partials = static_cast<double*>(reduce_);
    double* result = partials + cuda::k::kReduceBlocks;
    cuda::k::sum_squares(result, partials, f(in[0]), n, stream_);
    CTX_CUDA(cudaMemcpyAsync(readback_, result, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    synchronize();
    return *static_cast<double*>(readback_);
  }
  bool all_finite(const float* x, int64_t n) override {
    if (n <= 0) return true;
    auto in = stage<1>({{{x, bytes_f(n)}}});
    int* flag = reinterpret_cast<int*>(static_cast<double*>(reduce_) + cuda::k::kReduceBlocks + 1);
    CTX_CUDA(cudaMemsetAsync(flag, 0, sizeof(int), stream_));
    cuda::k::count_nonfinite(flag, f(in[0]), n, stream_);
    CTX_CUDA(cudaMemcpyAsync(readback_, flag, sizeof(int), cudaMemcpyDeviceToHost, stream_));
    synchronize();
    return *static_cast<int*>(readback_) == 0;
  }
  void copy_block(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols) override {
    if (rows <= 0 || cols <= 0) return;
    CTX_CUDA(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_ld) * sizeof(float), src,
                               static_cast<size_t>(src_ld) * sizeof(float), static_cast<size_t>(cols) * sizeof(float),
                               static_cast<size_t>(rows), cudaMemcpyDefault, stream_));
    done();
  }
  void add_block(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols) override {
    if (rows <= 0 || cols <= 0) return;
    auto in = stage<1>({{{src, bytes_f((rows - 1) * src_ld + cols)}}});
    cuda::k::add_block(out(dst, "add_block"), dst_ld, f(in[0]), src_ld, rows, cols, stream_);
    done();
  }

  // ---- GEMM
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b, float beta,
            float* c) override {
    if (m <= 0 || n <= 0) return;
    out(c, "gemm");
    if (k <= 0 || alpha == 0.0f) {  // C = beta C, as the reference does when there is nothing to add
      if (beta == 0.0f) CTX_CUDA(cudaMemsetAsync(c, 0, bytes_f(m * n), stream_));
      else if (beta != 1.0f) cuda::k::scale(c, beta, m * n, stream_);
      done();
      return;
    }
    auto in = stage<2>({{{a, bytes_f(m * k)}, {b, bytes_f(k * n)}}});
    gemm_->run(opts_.tf32 ? GemmType::tf32 : GemmType::fp32, ta, tb, m, n, k, alpha, in[0], in[1], beta, c, stream_);
    done();
  }

  // ---- model kernels
  void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t rows, int64_t h,
                       float eps) override {
    if (rows <= 0) return;
    auto in = stage<2>({{{x, bytes_f(rows * h)}, {w, bytes_f(h)}}});
    cuda::k::rmsnorm_forward(y ? out(y, "rmsnorm_forward") : nullptr, out(rstd, "rmsnorm_forward"), f(in[0]), f(in[1]),
                             rows, h, eps, stream_);
    done();
  }
  void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* rstd, const float* w,
                        int64_t rows, int64_t h) override {
    if (rows <= 0) return;
    const size_t dw_scratch = bytes_f(cuda::k::rmsnorm_dw_chunks(rows) * h);
    auto in = stage<4>({{{dy, bytes_f(rows * h)}, {x, bytes_f(rows * h)}, {rstd, bytes_f(rows)}, {w, bytes_f(h)}}},
                       dw_scratch);
    cuda::k::rmsnorm_backward_dx(out(dx, "rmsnorm_backward"), f(in[0]), f(in[1]), f(in[2]), f(in[3]), rows, h, stream_);
    float* partial = static_cast<float*>(scratch_tail(dw_scratch));
    cuda::k::rmsnorm_backward_dw(out(dw, "rmsnorm_backward"), partial, f(in[0]), f(in[1]), f(in[2]), rows, h, stream_);
    done();
  }
  void rope(float* x, int64_t rows, int64_t heads, int64_t d, const int32_t* pos, const float* inv_freq, int64_t rot,
            float attn_scale, bool inverse) override {
    if (rows <= 0 || rot < 2) return;
    auto in = stage<2>({{{pos, sizeof(int32_t) * static_cast<size_t>(rows)}, {inv_freq, bytes_f(rot / 2)}}});
    cuda::k::rope(out(x, "rope"), rows, heads, d, static_cast<const int32_t*>(in[0]), f(in[1]), rot, attn_scale, inverse,
                  stream_);
    done();
  }
  void swiglu_forward(float* a, const float* gate, const float* up, int64_t n) override {
    if (n <= 0) return;
    auto in = stage<2>({{{gate, bytes_f(n)}, {up, bytes_f(n)}}});
    cuda::k::swiglu_forward(out(a, "swiglu_forward"), f(in[0]), f(in[1]), n, stream_);
    done();
  }
  void swiglu_backward(float* dgate, float* dup, const float* da, const float* gate, const float* up,
                       int64_t n) override {
    if (n <= 0) return;
    auto in = stage<3>({{{da, bytes_f(n)}, {gate, bytes_f(n)}, {up, bytes_f(n)}}});
    cuda::k::swiglu_backward(out(dgate, "swiglu_backward"), out(dup, "swiglu_backward"), f(in[0]), f(in[1]), f(in[2]),
                             n, stream_);
    done();
  }
  void embedding_forward(float* o, const float* table, const int32_t* tok, int64_t tokens, int64_t h, int64_t v0,
                         int64_t vrows) override {
    if (tokens <= 0) return;
    auto in = stage<2>({{{table, bytes_f(std::max<int64_t>(vrows, 1) * h)}, {tok, sizeof(int32_t) * tokens}}});
    cuda::k::embedding_forward(out(o, "embedding_forward"), f(in[0]), static_cast<const int32_t*>(in[1]), tokens, h, v0,
                               vrows, stream_);
    done();
  }
  void embedding_backward(float* dtable, const float* dout, const int32_t* tok, int64_t tokens, int64_t h, int64_t v0,
                          int64_t vrows) override {
    if (tokens <= 0) return;
    // Group the tokens by vocabulary row on the host (token ids are host data in the strategy
    // code); each row then sums its tokens' gradients in token order, like the reference.
    host_tok_.resize(static_cast<size_t>(tokens));
    if (where_is(tok) == Where::pageable_host) std::memcpy(host_tok_.data(), tok, sizeof(int32_t) * tokens);
    else {
      CTX_CUDA(cudaMemcpyAsync(host_tok_.data(), tok, sizeof(int32_t) * tokens, cudaMemcpyDefault, stream_));
      synchronize();
    }
    cuda::group_tokens_by_row(host_tok_.data(), tokens, v0, vrows, groups_);
    if (groups_.rows.empty()) return;
    auto in = stage<4>({{{dout, bytes_f(tokens * h)},
                         {groups_.rows.data(), sizeof(int32_t) * groups_.rows.size()},
                         {groups_.offsets.data(), sizeof(int64_t) * groups_.offsets.size()},
                         {groups_.positions.data(), sizeof(int32_t) * groups_.positions.size()}}});
    cuda::k::embedding_backward(out(dtable, "embedding_backward"), f(in[0]), static_cast<const int32_t*>(in[1]),
                                static_cast<const int64_t*>(in[2]), static_cast<const int32_t*>(in[3]),
                                static_cast<int64_t>(groups_.rows.size()), h, stream_);
    done();
  }

  // ---- attention
  void attention_forward_block(float* o, float* lse, const float* q, TokenRefs qt, int64_t tq, const float* k,
                               const float* v, TokenRefs kt, int64_t tk, const AttnShape& s) override {
    if (tq <= 0 || tk <= 0) return;
    const int64_t qn = tq * s.q_heads * s.head_dim, kn = tk * s.kv_heads * s.head_dim;
    auto in = stage<7>({{{q, bytes_f(qn)},
                         {k, bytes_f(kn)},
                         {v, bytes_f(kn)},
                         {qt.index, sizeof(int64_t) * tq},
                         {qt.doc, sizeof(int32_t) * tq},
                         {kt.index, sizeof(int64_t) * tk},
                         {kt.doc, sizeof(int32_t) * tk}}});
    cuda::k::attention_forward(out(o, "attention_forward_block"), out(lse, "attention_forward_block"), f(in[0]),
                               i64(in[3]), i32(in[4]), tq, f(in[1]), f(in[2]), i64(in[5]), i32(in[6]), tk, dims(s),
                               stream_);
    done();
  }
  void attention_backward_block(float* dq, float* dk, float* dv, const float* q, TokenRefs qt, int64_t tq,
                                const float* k, const float* v, TokenRefs kt, int64_t tk, const float* dout,
                                const float* lse, const float* delta, const AttnShape& s) override {
    if (tq <= 0 || tk <= 0) return;
    const int64_t qn = tq * s.q_heads * s.head_dim, kn = tk * s.kv_heads * s.head_dim, rn = tq * s.q_heads;
    auto in = stage<10>({{{q, bytes_f(qn)},
                          {k, bytes_f(kn)},
                          {v, bytes_f(kn)},
                          {dout, bytes_f(qn)},
                          {lse, bytes_f(rn)},
                          {delta, bytes_f(rn)},
                          {qt.index, sizeof(int64_t) * tq},
                          {qt.doc, sizeof(int32_t) * tq},
                          {kt.index, sizeof(int64_t) * tk},
                          {kt.doc, sizeof(int32_t) * tk}}});
    cuda::k::attention_backward(out(dq, "attention_backward_block"), out(dk, "attention_backward_block"),
                                out(dv, "attention_backward_block"), f(in[0]), i64(in[6]), i32(in[7]), tq, f(in[1]),
                                f(in[2]), i64(in[8]), i32(in[9]), tk, f(in[3]), f(in[4]), f(in[5]), dims(s), stream_);
    done();
  }
  void attention_delta(float* delta, const float* dout, const float* o, int64_t tq, const AttnShape& s) override {
    if (tq <= 0) return;
    const int64_t rows = tq * s.q_heads;
    auto in = stage<2>({{{dout, bytes_f(rows * s.head_dim)}, {o, bytes_f(rows * s.head_dim)}}});
    cuda::k::attention_delta(out(delta, "attention_delta"), f(in[0]), f(in[1]), rows, s.head_dim, stream_);
    done();
  }

  // ---- cross-entropy pieces
  void row_max(float* o, const float* logits, int64_t rows, int64_t cols, int64_t valid) override {
    if (rows <= 0) return;
    auto in = stage<1>({{{logits, bytes_f(rows * cols)}}});
    cuda::k::row_max(out(o, "row_max"), f(in[0]), rows, cols, valid, stream_);
    done();
  }
  void sumexp_and_target(float* o, const float* logits, const float* mx, const int32_t* target, int64_t rows,
                         int64_t cols, int64_t valid, int64_t v0) override {
    if (rows <= 0) return;
    auto in = stage<3>({{{logits, bytes_f(rows * cols)}, {mx, bytes_f(rows)}, {target, sizeof(int32_t) * rows}}});
    cuda::k::sumexp_and_target(out(o, "sumexp_and_target"), f(in[0]), f(in[1]), i32(in[2]), rows, cols, valid, v0,
                               stream_);
    done();
  }
  void xent_grad_inplace(float* logits, const float* lse, const int32_t* target, const float* weight, int64_t rows,
                         int64_t cols, int64_t valid, int64_t v0) override {
    if (rows <= 0) return;
    auto in = stage<3>({{{lse, bytes_f(rows)}, {target, sizeof(int32_t) * rows}, {weight, bytes_f(rows)}}});
    cuda::k::xent_grad_inplace(out(logits, "xent_grad_inplace"), f(in[0]), i32(in[1]), f(in[2]), rows, cols, valid, v0,
                               stream_);
    done();
  }

  // ---- optimizer
  void adamw(float* master, float* m, float* v, const float* grad, float decay, int64_t n, float lr, float beta1,
             float beta2, float eps, float weight_decay, float grad_scale, int64_t step) override {
    if (n <= 0) return;
    const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
    const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
    auto in = stage<1>({{{grad, bytes_f(n)}}});
    cuda::k::adamw(out(master, "adamw"), out(m, "adamw"), out(v, "adamw"), f(in[0]), decay, n, lr, beta1, beta2, eps,
                   weight_decay, grad_scale, bc1, bc2, stream_);
    done();
  }

 protected:
  float* raw_alloc(int64_t bytes, bool host) override { return static_cast<float*>(alloc_->allocate(bytes, host)); }
  void raw_free(float* p, bool host) override {
    // The block may still be read by queued work; the cache hands it out again only to work
    // queued later on the same stream, so stream order keeps reuse safe.
    alloc_->release(p, host);
  }

 private:
  struct In {
    const void* p;
    size_t bytes;
  };
  static size_t bytes_f(int64_t n) { return static_cast<size_t>(std::max<int64_t>(n, 0)) * sizeof(float); }
  static const float* f(const void* p) { return static_cast<const float*>(p); }
  static const int64_t* i64(const void* p) { return static_cast<const int64_t*>(p); }
  static const int32_t* i32(const void* p) { return static_cast<const int32_t*>(p); }
  static cuda::k::AttnDims dims(const AttnShape& s) { return {s.q_heads, s.kv_heads, s.head_dim, s.scale}; }

  void done() {
    if (opts_.sync_each_call) synchronize();
  }

  // An output pointer must be reachable by kernels; host-only (pageable) memory is not.
  template <typename T>
  T* out(T* p, const char* op) {
    if (where_is(p) == Where::pageable_host)
      throw std::invalid_argument(std::string("CUDA backend: ") + op +
                                  " was given an output in pageable host memory; allocate it with the backend");
    return p;
  }

  // Returns device-reachable versions of the inputs: pointers the GPU can read pass through,
  // pageable host inputs (std::vector data of the strategy code) are copied into the scratch
  // arena. `extra` bytes of scratch are reserved after them for the caller (scratch_tail).
  template <size_t N>
  std::array<const void*, N> stage(const std::array<In, N>& in, size_t extra = 0) {
    std::array<const void*, N> outp{};
    std::array<bool, N> copy{};
    size_t total = round_up(extra);
    for (size_t i = 0; i < N; ++i) {
      outp[i] = in[i].p;
      copy[i] = in[i].p && in[i].bytes > 0 && where_is(in[i].p) == Where::pageable_host;
      if (copy[i]) total += round_up(in[i].bytes);
    }
    reserve_scratch(total);
    size_t off = 0;
    for (size_t i = 0; i < N; ++i) {
      if (!copy[i]) continue;
      char* dst = static_cast<char*>(scratch_) + off;
      CTX_CUDA(cudaMemcpyAsync(dst, in[i].p, in[i].bytes, cudaMemcpyHostToDevice, stream_));
      outp[i] = dst;
      off += round_up(in[i].bytes);
    }
    tail_offset_ = off;
    return outp;
  }
  void* scratch_tail(size_t bytes) {
    if (tail_offset_ + bytes > scratch_bytes_) throw std::logic_error("CUDA backend: scratch tail not reserved");
    return static_cast<char*>(scratch_) + tail_offset_;
  }
  void* scratch(size_t bytes) {
    reserve_scratch(round_up(bytes));
    return scratch_;
  }
  // Grows the scratch arena (device memory, accounted as workspace). Growing waits for queued
  // work, which may still read the old arena; steady state never grows.
  void reserve_scratch(size_t bytes) {
    if (bytes <= scratch_bytes_) return;
    const size_t grown = std::max(bytes, scratch_bytes_ * 2);
    synchronize();
    if (scratch_) {
      CTX_CUDA(cudaFree(scratch_));
      ledger().on_free(Mem::workspace, static_cast<int64_t>(scratch_bytes_));
    }
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    CTX_CUDA(cudaMalloc(&scratch_, grown));
    scratch_bytes_ = grown;
    ledger().on_alloc(Mem::workspace, static_cast<int64_t>(grown));
  }

  int device_;
  CudaBackendOptions opts_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CachingAllocator> alloc_;
  std::unique_ptr<LtGemm> gemm_;
  void* gemm_ws_ = nullptr;
  void* reduce_ = nullptr;
  void* readback_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0, tail_offset_ = 0;
  // host-side grouping for embedding_backward (kept to reuse capacity)
  std::vector<int32_t> host_tok_;
  cuda::TokenRows groups_;
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return (end && *end == '\0' && x >= 0) ? static_cast<int>(x) : fallback;
}

}  // namespace

int cuda_device_count() {
  int n = 0;  // cudaGetDeviceCount leaves its output unchanged on failure (no driver)
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

int cuda_device_for_local_rank() {
  const int n = cuda_device_count();
  int local = -1;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"}) {
    local = env_int(var, -1);
    if (local >= 0) break;
  }
  if (local < 0 || n == 0) return 0;
  return local % n;
}

std::unique_ptr<Backend> make_cuda_backend(int device, const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(device, options);
}

CUstream_st* cuda_backend_stream(Backend& be) {
  auto* c = dynamic_cast<CudaBackend*>(&be);
  return c ? c->stream() : nullptr;
}

void cuda_backend_synchronize(Backend& be) {
  if (auto* c = dynamic_cast<CudaBackend*>(&be)) c->synchronize();
}

CudaMemoryReport cuda_memory_report(Backend& be) {
  auto* c = dynamic_cast<CudaBackend*>(&be);
  if (!c) throw std::invalid_argument("cuda_memory_report: backend '" + be.name() + "' is not the CUDA backend");
  return c->report();
}

std::string to_string(const CudaMemoryReport& r) {
  auto mib = [](int64_t b) { return std::to_string(b / (1 << 20)) + " MiB"; };
  std::ostringstream o;
  o << "device " << r.device << ": ledger " << mib(r.ledger_current_bytes) << " (peak " << mib(r.ledger_peak_bytes)
    << "), allocator holds " << mib(r.allocator_reserved_bytes) << " (" << mib(r.allocator_cached_bytes)
    << " cached, peak " << mib(r.allocator_peak_reserved_bytes) << ", " << r.allocator_cuda_calls
    << " cudaMalloc calls), pinned host " << mib(r.allocator_host_pinned_bytes) << ", driver "
    << mib(r.driver_used_bytes()) << " used of " << mib(r.driver_total_bytes);
  return o.str();
}

}  // namespace ctx::exec
