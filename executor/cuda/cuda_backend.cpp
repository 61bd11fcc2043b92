// The CUDA backend (see cuda_backend.hpp). Host code only: the kernels are in kernels_*.cu and
// attention.cu, GEMMs in gemm_lt.cpp, memory in caching_allocator.cpp. This file checks every
// view's dtype and shape, takes its device pointer and launches on the backend's stream. Nothing
// is staged: token data arrives through upload, and every tensor is the backend's own memory.
//
// bf16 (issue 13): every op takes f32 or bf16 views where the interface does (backend.hpp), with
// the CPU reference's semantics: bf16 stored round-to-nearest-even, an op widens its bf16 inputs,
// computes in fp32 exactly as for f32 and rounds its outputs once. The kernels are templates on
// their storage types (kernels.hpp), dispatched here from the views' dtypes. Where one kernel
// parameter stands for several tensors (SwiGLU's, RMSNorm's x, w, y, attention's q, k, v, dout)
// and the views mix f32 and bf16, the op runs on f32 temporaries (Widened below), which is the
// reference's own procedure, so the numerics do not change.
//
// Status: ran on one H200 on 2026-11-28 (docs/GPU_PROOF.md); changes since are untested on GPU.
#include "executor/cuda/cuda_backend.hpp"

#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "executor/bf16.hpp"
#include "executor/comm.hpp"
#include "executor/cuda/caching_allocator.hpp"
#ifdef CTXPLAN_HAVE_NCCL
#include "executor/cuda/comm_nccl.hpp"
#endif
#include "executor/cuda/cuda_check.hpp"
#include "executor/cuda/gemm_lt.hpp"
#include "executor/cuda/attention_mma.hpp"
#include "executor/cuda/kernels.hpp"

namespace ctx::exec {
namespace {

using cuda::CachingAllocator;
using cuda::k::bf16_bits;
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

// the kernels' slots of the step statistics (elementwise_kernels.cuh) are the interface's
static_assert(kStatLossSum == 0 && kStatNonFinite == 1 && kStatGradNorm2 == 2 && kStepStats == 3,
              "elementwise_kernels.cuh's kStat* constants assume this layout");

void need(bool ok, const char* op, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string("cuda backend: ") + op + ": " + what);
}
bool is_float(DType t) { return t == DType::f32 || t == DType::bf16; }
void need_float(const View& v, const char* op) {
  need(is_float(v.dtype()), op, std::string("expects a float tensor (f32 or bf16), got ") + to_string(v.dtype()));
}
// Calls f(float{}) or f(bf16_bits{}) by a float view's dtype: the kernels' storage type.
template <class F>
void by_dtype(const View& v, const char* op, F&& f) {
  need_float(v, op);
  if (v.dtype() == DType::f32) f(float{});
  else f(bf16_bits{});
}
// Whether the (non-empty) float views share one dtype; *dt gets it.
bool one_dtype(std::initializer_list<View> vs, const char* op, DType* dt) {
  bool first = true, same = true;
  for (const View& v : vs) {
    if (!v) continue;
    need_float(v, op);
    if (first) *dt = v.dtype();
    else same = same && v.dtype() == *dt;
    first = false;
  }
  return same;
}

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
    attention_ = o.attention;
    if (const char* e = std::getenv("CTXPLAN_CUDA_ATTENTION"); e && *e) attention_ = e;
    if (attention_ != "auto" && attention_ != "mma" && attention_ != "simt")
      throw std::invalid_argument("cuda backend: attention '" + attention_ + "' (CudaBackendOptions::attention or "
                                  "CTXPLAN_CUDA_ATTENTION) is not one of auto, mma, simt");
    name_ = std::string("cuda:") + std::to_string(device) + " (" + prop.name + ", sm_" + std::to_string(prop.major) +
            std::to_string(prop.minor) + ")";
    CTX_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    alloc_ = std::make_unique<CachingAllocator>(device, o.managed_memory, stream_);  // stream-ordered reuse
    alloc_->set_oom_context([this] {
      char peak[64] = "unknown";
      if (predicted_peak_bytes() > 0)
        std::snprintf(peak, sizeof peak, "%.4f GiB", static_cast<double>(predicted_peak_bytes()) / (1 << 30));
      char ctx[160];
      std::snprintf(ctx, sizeof ctx, "; ledger total %.3f GiB; predicted peak %s",
                    static_cast<double>(ledger().current_total()) / (1 << 30), peak);
      return std::string(ctx);
    });
    // fixed device scratch for the whole-array reductions: partial sums, then the non-finite flag
    CTX_CUDA(cudaMalloc(&reduce_, (cuda::k::kReduceBlocks + 1) * sizeof(double)));
    const int64_t ws = std::max<int64_t>(o.gemm_workspace_bytes, 0);
    if (ws > 0) CTX_CUDA(cudaMalloc(&gemm_ws_, static_cast<size_t>(ws)));
    ledger().on_alloc(Mem::runtime, ws);  // the model's reserved_mib (profiles/runtimes/ctxrun-cuda.json)
    gemm_ = std::make_unique<LtGemm>(gemm_ws_, static_cast<size_t>(ws));
    cuda::k::attention_init();
    // the origin of read_times(): recorded now, so slot times are seconds since construction
    CTX_CUDA(cudaEventCreate(&origin_));
    CTX_CUDA(cudaEventRecord(origin_, stream_));
  }

  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    if (copy_stream_) {
      cudaStreamSynchronize(copy_stream_);
      for (auto& [id, e] : copy_events_) cudaEventDestroy(e);
      for (cudaEvent_t e : free_copy_events_) cudaEventDestroy(e);
      cudaEventDestroy(compute_mark_);
      cudaStreamDestroy(copy_stream_);
    }
    for (int i = 0; i < kStagingSlots; ++i)
      if (staging_[i]) {
        cudaFreeHost(staging_[i]);
        cudaEventDestroy(staging_done_[i]);
      }
    for (cudaEvent_t e : marks_)
      if (e) cudaEventDestroy(e);
    cudaEventDestroy(origin_);
    gemm_.reset();
    if (gemm_ws_) cudaFree(gemm_ws_);
    if (scratch_) alloc_->free(scratch_, stream_);
    cudaFree(reduce_);
    alloc_.reset();
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return name_; }
  cudaStream_t stream() const { return stream_; }

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

  // ---- the host boundary. cudaMemcpyAsync from pageable host memory returns once the source
  // has been copied to the driver's staging buffer, so the caller may reuse `src` at once; the
  // copy to the tensor stays in stream order. bf16 tensors are converted on the host (f32_to_bf16,
  // executor/bf16.hpp: the CPU backend's rounding, bit for bit) into a buffer the copy stages.
  void upload(View dst, const float* src) override {
    need_float(dst, "upload");
    if (dst.dtype() == DType::f32) {
      copy_in(dst, src, raw(dst), "upload (float)");
      return;
    }
    std::vector<uint16_t> bits(static_cast<size_t>(dst.numel()));
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = f32_to_bf16(src[i]);
    copy_in(dst, bits.data(), raw(dst), "upload (float into bf16)");
  }
  void upload(View dst, const int32_t* src) override {
    need(dst.dtype() == DType::i32, "upload", std::string("int32 data into a ") + to_string(dst.dtype()) + " tensor");
    copy_in(dst, src, raw(dst), "upload (int32)");
  }
  void upload(View dst, const int64_t* src) override {
    need(dst.dtype() == DType::i64, "upload", std::string("int64 data into a ") + to_string(dst.dtype()) + " tensor");
    copy_in(dst, src, raw(dst), "upload (int64)");
  }
  void download(float* dst, View src) override {
    need_float(src, "download");
    if (src.dtype() == DType::f32) {
      if (src.numel() > 0)
        CTX_CUDA(cudaMemcpyAsync(dst, raw(src), static_cast<size_t>(src.bytes()), cudaMemcpyDefault, stream_));
      synchronize();
      return;
    }
    std::vector<uint16_t> bits(static_cast<size_t>(src.numel()));
    if (src.numel() > 0)
      CTX_CUDA(cudaMemcpyAsync(bits.data(), raw(src), static_cast<size_t>(src.bytes()), cudaMemcpyDefault, stream_));
    synchronize();
    for (size_t i = 0; i < bits.size(); ++i) dst[i] = bf16_to_f32(bits[i]);
  }
  void synchronize() override { CTX_CUDA(cudaStreamSynchronize(stream_)); }

  // ---- data movement
  void copy(View dst, View src) override {
    need(dst.numel() == src.numel(), "copy", "element counts differ");
    if (dst.dtype() != src.dtype()) {  // f32 <-> bf16: widen, or round once to nearest even
      need(is_float(dst.dtype()) && is_float(src.dtype()), "copy",
           std::string("from ") + to_string(src.dtype()) + " to " + to_string(dst.dtype()) +
               " (only f32 <-> bf16 converts)");
      if (dst.numel() == 0) return;
      const void* s = raw(src);
      if (overlap(dst, src)) {  // views of one tensor: convert from a copy of the source
        void* tmp = scratch(static_cast<size_t>(src.bytes()));
        CTX_CUDA(cudaMemcpyAsync(tmp, s, static_cast<size_t>(src.bytes()), cudaMemcpyDefault, stream_));
        s = tmp;
      }
      if (dst.dtype() == DType::bf16)
        cuda::k::convert(static_cast<bf16_bits*>(raw(dst)), static_cast<const float*>(s), dst.numel(), stream_);
      else
        cuda::k::convert(static_cast<float*>(raw(dst)), static_cast<const bf16_bits*>(s), dst.numel(), stream_);
      done();
      return;
    }
    if (dst.numel() == 0 || dst.same_memory(src)) return;
    const size_t bytes = static_cast<size_t>(dst.bytes());
    const char* s = static_cast<const char*>(raw(src));
    char* d = static_cast<char*>(raw(dst));
    if (overlap(dst, src)) {  // overlapping views of one tensor: memmove through scratch
      void* tmp = scratch(bytes);
      CTX_CUDA(cudaMemcpyAsync(tmp, s, bytes, cudaMemcpyDefault, stream_));
      CTX_CUDA(cudaMemcpyAsync(d, tmp, bytes, cudaMemcpyDefault, stream_));
    } else {
      CTX_CUDA(cudaMemcpyAsync(d, s, bytes, cudaMemcpyDefault, stream_));
    }
    done();
  }
  void zero(View x) override {
    if (x.numel() == 0) return;
    const Where w = where_is(raw(x));
    if (w == Where::pinned_host) {  // pinned host tensors: a kernel writes them through the mapping
      if (x.dtype() == DType::bf16) cuda::k::fill(static_cast<bf16_bits*>(raw(x)), 0.0f, x.numel(), stream_);
      else cuda::k::fill(static_cast<float*>(raw(x)), 0.0f, x.bytes() / 4, stream_);  // f32, i32, i64: 4k bytes
    } else {
      CTX_CUDA(cudaMemsetAsync(raw(x), 0, static_cast<size_t>(x.bytes()), stream_));
    }
    done();
  }
  void fill(View x, float value) override {
    by_dtype(x, "fill", [&](auto t) {
      using T = decltype(t);
      cuda::k::fill(ptr<T>(x), value, x.numel(), stream_);
    });
    done();
  }
  void axpy(View y, float alpha, View x) override {
    need(x.numel() == y.numel(), "axpy", "element counts differ");
    by_dtype(y, "axpy", [&](auto ty) {
      by_dtype(x, "axpy", [&](auto tx) {
        using TY = decltype(ty);
        using TX = decltype(tx);
        cuda::k::axpy(ptr<TY>(y), alpha, ptr<TX>(x), y.numel(), stream_);
      });
    });
    done();
  }
  void scale(View x, float alpha) override {
    by_dtype(x, "scale", [&](auto t) {
      using T = decltype(t);
      cuda::k::scale(ptr<T>(x), alpha, x.numel(), stream_);
    });
    done();
  }
  void copy_cols(View dst, int64_t dc, View src, int64_t sc, int64_t n) override {
    check_cols("copy_cols", dst, dc, src, sc, n);
    need(dst.dtype() == src.dtype(), "copy_cols", "dtypes differ");
    if (dst.rows() == 0 || n == 0) return;
    if (dst.dtype() == DType::f32) {
      cuda::k::copy_cols(ptr<float>(dst) + dc, dst.cols(), ptr<float>(src) + sc, src.cols(), dst.rows(), n, false,
                         stream_);
    } else {  // bf16 (as stored, bit for bit, as the reference's memcpy) and token data: a strided byte copy
      const size_t e = static_cast<size_t>(dtype_bytes(dst.dtype()));
      CTX_CUDA(cudaMemcpy2DAsync(static_cast<char*>(raw(dst)) + dc * e, dst.cols() * e,
                                 static_cast<const char*>(raw(src)) + sc * e, src.cols() * e, n * e,
                                 static_cast<size_t>(dst.rows()), cudaMemcpyDefault, stream_));
    }
    done();
  }
  void add_cols(View dst, int64_t dc, View src, int64_t sc, int64_t n) override {
    check_cols("add_cols", dst, dc, src, sc, n);
    by_dtype(dst, "add_cols", [&](auto td) {
      by_dtype(src, "add_cols", [&](auto ts) {
        using TD = decltype(td);
        using TS = decltype(ts);
        cuda::k::copy_cols(ptr<TD>(dst) + dc, dst.cols(), ptr<TS>(src) + sc, src.cols(), dst.rows(), n, true, stream_);
      });
    });
    done();
  }

  // ---- GEMM. A and B of one dtype run on cuBLASLt as they are: f32 (exact, or tf32 when asked),
  // bf16 with fp32 accumulation into a bf16 C (rounded once) or an f32 C (weight gradients).
  // Other mixes (A f32 x B bf16: the logits gradient times the head weights; or a bf16 C under
  // f32 A, B) widen their bf16 operands into f32 temporaries and run the fp32 GEMM, rounding a
  // bf16 C once at the end: cuBLASLt has no mixed A/B types, and this is what the CPU reference
  // computes (bf16 values are exact in fp32, products and sums in fp32), so the numerics stay
  // equal to it -- at the cost of one widening pass over the bf16 operand.
  void gemm(bool ta, bool tb, float alpha, View a, View b, float beta, View c) override {
    const int64_t m = c.rows(), n = c.cols(), k = ta ? a.rows() : a.cols();
    need((ta ? a.cols() : a.rows()) == m, "gemm", "op(A) rows differ from C rows");
    need(tb ? (b.rows() == n && b.cols() == k) : (b.rows() == k && b.cols() == n), "gemm", "op(B) is not [k, n]");
    need_float(a, "gemm");
    need_float(b, "gemm");
    need_float(c, "gemm");
    if (m <= 0 || n <= 0) return;
    if (k <= 0 || alpha == 0.0f) {  // C = beta C, as the reference does when there is nothing to add
      if (beta == 0.0f) CTX_CUDA(cudaMemsetAsync(raw(c), 0, static_cast<size_t>(c.bytes()), stream_));
      else if (beta != 1.0f) scale(c, beta);
      done();
      return;
    }
    const DType ab = a.dtype();
    GemmType type;
    if (ab == DType::f32 && b.dtype() == DType::f32 && c.dtype() == DType::f32) {
      type = opts_.tf32 ? GemmType::tf32 : GemmType::fp32;
    } else if (ab == DType::bf16 && b.dtype() == DType::bf16) {
      type = c.dtype() == DType::bf16 ? GemmType::bf16 : GemmType::bf16_f32;
    } else {
      Widened w(*this);
      const View A = w.in(a), B = w.in(b), C = beta != 0.0f ? w.in(c) : w.out(c);
      gemm(ta, tb, alpha, A, B, beta, C);
      w.commit(c, C);
      return;
    }
    gemm_->run(type, ta, tb, m, n, k, alpha, raw(a), raw(b), beta, raw(c), stream_);
    done();
  }

  // ---- model kernels
  void rmsnorm_forward(View y, View rstd, View x, View w, float eps) override {
    const int64_t rows = x.rows(), h = x.cols();
    need(!y || y.numel() == x.numel(), "rmsnorm_forward", "y and x differ in size");
    need(rstd.numel() == rows && w.numel() == h, "rmsnorm_forward", "rstd must be [rows] and w [h]");
    float* RS = f32(rstd, "rmsnorm_forward");
    DType dt = DType::f32;
    if (!one_dtype({y, x, w}, "rmsnorm_forward", &dt)) {
      Widened wd(*this);
      const View Y = y ? wd.out(y) : y;
      rmsnorm_forward(Y, rstd, wd.in(x), wd.in(w), eps);
      if (y) wd.commit(y, Y);
      return;
    }
    by_dtype(x, "rmsnorm_forward", [&](auto t) {
      using T = decltype(t);
      cuda::k::rmsnorm_forward(y ? ptr<T>(y) : nullptr, RS, ptr<T>(x), ptr<T>(w), rows, h, eps, stream_);
    });
    done();
  }
  void rmsnorm_backward(View dx, View dw, View dy, View x, View rstd, View w) override {
    const int64_t rows = x.rows(), h = x.cols();
    need(dx.numel() == x.numel() && dy.numel() == x.numel(), "rmsnorm_backward", "dx, dy and x differ in size");
    need(dw.numel() == h && w.numel() == h && rstd.numel() == rows, "rmsnorm_backward", "dw, w must be [h], rstd [rows]");
    float *DW = f32(dw, "rmsnorm_backward"), *RS = f32(rstd, "rmsnorm_backward");
    DType dt = DType::f32;
    if (!one_dtype({dx, dy, x, w}, "rmsnorm_backward", &dt)) {
      Widened wd(*this);
      const View DX = wd.out(dx);
      rmsnorm_backward(DX, dw, wd.in(dy), wd.in(x), rstd, wd.in(w));
      wd.commit(dx, DX);
      return;
    }
    if (rows <= 0) return;
    float* partial = static_cast<float*>(scratch(sizeof(float) * cuda::k::rmsnorm_dw_chunks(rows) * h));
    by_dtype(x, "rmsnorm_backward", [&](auto t) {
      using T = decltype(t);
      cuda::k::rmsnorm_backward_dx(ptr<T>(dx), ptr<T>(dy), ptr<T>(x), RS, ptr<T>(w), rows, h, stream_);
      cuda::k::rmsnorm_backward_dw(DW, partial, ptr<T>(dy), ptr<T>(x), RS, rows, h, stream_);
    });
    done();
  }
  void rope(View x, int64_t heads, int64_t d, View pos, View inv_freq, int64_t rot, float attn_scale,
            bool inverse) override {
    const int64_t rows = x.rows();
    need(x.cols() == heads * d, "rope", "x must be [rows, heads * head_dim]");
    need(pos.numel() == rows && inv_freq.numel() >= rot / 2, "rope", "pos must be [rows] and inv_freq [rot/2]");
    const int32_t* P = i32(pos, "rope");
    const float* F = f32(inv_freq, "rope");
    need_float(x, "rope");
    if (rows <= 0 || rot < 2) return;
    by_dtype(x, "rope", [&](auto t) {
      using T = decltype(t);
      cuda::k::rope(ptr<T>(x), rows, heads, d, P, F, rot, attn_scale, inverse, stream_);
    });
    done();
  }
  void swiglu_forward(View a, View gate, View up) override {
    need(a.numel() == gate.numel() && a.numel() == up.numel(), "swiglu_forward", "sizes differ");
    DType dt = DType::f32;
    if (!one_dtype({a, gate, up}, "swiglu_forward", &dt)) {
      Widened wd(*this);
      const View A = wd.out(a);
      swiglu_forward(A, wd.in(gate), wd.in(up));
      wd.commit(a, A);
      return;
    }
    by_dtype(a, "swiglu_forward", [&](auto t) {
      using T = decltype(t);
      cuda::k::swiglu_forward(ptr<T>(a), ptr<T>(gate), ptr<T>(up), a.numel(), stream_);
    });
    done();
  }
  void swiglu_backward(View dgate, View dup, View da, View gate, View up) override {
    const int64_t n = da.numel();
    need(dgate.numel() == n && dup.numel() == n && gate.numel() == n && up.numel() == n, "swiglu_backward",
         "sizes differ");
    DType dt = DType::f32;
    if (!one_dtype({dgate, dup, da, gate, up}, "swiglu_backward", &dt)) {
      Widened wd(*this);
      const View DG = wd.out(dgate), DU = wd.out(dup);
      swiglu_backward(DG, DU, wd.in(da), wd.in(gate), wd.in(up));
      wd.commit(dgate, DG);
      wd.commit(dup, DU);
      return;
    }
    by_dtype(da, "swiglu_backward", [&](auto t) {
      using T = decltype(t);
      cuda::k::swiglu_backward(ptr<T>(dgate), ptr<T>(dup), ptr<T>(da), ptr<T>(gate), ptr<T>(up), n, stream_);
    });
    done();
  }
  void embedding_forward(View out, View table, View tok, int64_t v0) override {
    const int64_t tokens = tok.numel(), h = out.cols();
    need(out.rows() == tokens && table.cols() == h, "embedding_forward", "out must be [tokens, h], table [rows, h]");
    need(out.dtype() == table.dtype(), "embedding_forward", "out must have the table's dtype");
    const int32_t* T_ = i32(tok, "embedding_forward");
    by_dtype(table, "embedding_forward", [&](auto t) {
      using T = decltype(t);
      cuda::k::embedding_forward(ptr<T>(out), ptr<T>(table), T_, tokens, h, v0, table.rows(), stream_);
    });
    done();
  }
  void embedding_backward(View dtable, View dout, View tok, int64_t v0) override {
    const int64_t tokens = tok.numel(), h = dtable.cols(), vrows = dtable.rows();
    need(dout.rows() == tokens && dout.cols() == h, "embedding_backward", "dout must be [tokens, h]");
    float* DT = f32(dtable, "embedding_backward");
    const int32_t* T_ = i32(tok, "embedding_backward");
    need_float(dout, "embedding_backward");
    if (tokens <= 0 || vrows <= 0) return;
    void* tmp = scratch(cuda::k::embedding_backward_scratch_bytes(tokens, vrows));
    by_dtype(dout, "embedding_backward", [&](auto t) {
      using T = decltype(t);
      cuda::k::embedding_backward(DT, ptr<T>(dout), T_, tokens, h, v0, vrows, tmp, stream_);
    });
    done();
  }

  // ---- NVTX (nvtx3, header-only: no-ops unless a profiler such as nsys injects itself): one range
  // per phase, inside it one range per compute task from its record to the next (named as the
  // simulator's tasks, "L3 forward mlp mb0"), and a mark per communication task.
  bool annotates() const override { return true; }
  void annotate_phase(const char* phase) override {
    if (task_open_) nvtxRangePop();
    if (phase_open_) nvtxRangePop();
    task_open_ = false;
    nvtxRangePushA(phase);
    phase_open_ = true;
  }
  void annotate_task(const std::string& label, bool communication) override {
    if (communication) {
      nvtxMarkA(label.c_str());
      return;
    }
    if (task_open_) nvtxRangePop();
    nvtxRangePushA(label.c_str());
    task_open_ = true;
  }

  // Which attention kernel runs bf16 inputs: the tensor-core one (attention_mma.cu) where it
  // supports the head dim, unless CudaBackendOptions::attention (or CTXPLAN_CUDA_ATTENTION) says
  // simt; "mma" refuses a shape it cannot run instead of falling back. fp32 inputs: SIMT.
  bool use_mma(const AttnShape& s) const {
    if (attention_ == "simt") return false;
    const bool ok = cuda::k::attention_mma_supported(dims(s));
    if (attention_ == "mma" && !ok)
      throw std::invalid_argument("cuda backend: attention=mma cannot run head_dim " + std::to_string(s.head_dim) +
                                  " (multiples of 16 up to 128); use attention=auto or simt");
    return ok;
  }

  // ---- attention: q, k, v (and dout) share a storage type T, each output has its own (o; dq;
  // dk with dv), so the context-parallel fp32 accumulators under bf16 inputs need no widening.
  void attention_forward_block(View o, View lse, View q, TokenRefs qt, View k, View v, const KeyBlock& kb,
                               const AttnShape& s) override {
    static const char* op = "attention_forward_block";
    const auto t = tokens(op, q, qt, k, kb, s);
    need(o.numel() == q.numel() && lse.numel() == t.tq * s.q_heads && v.numel() == k.numel(), op,
         "o must be q's shape, v k's, and lse [tq, q_heads]");
    float* L = f32(lse, op);
    need_float(o, op);
    DType dt = DType::f32;
    if (!one_dtype({q, k, v}, op, &dt)) {
      Widened wd(*this);
      attention_forward_block(o, lse, wd.in(q), qt, wd.in(k), wd.in(v), kb, s);
      return;
    }
    by_dtype(q, op, [&](auto ti) {
      by_dtype(o, op, [&](auto to) {
        using T = decltype(ti);
        using TO = decltype(to);
        if constexpr (std::is_same_v<T, cuda::k::bf16_bits>) {
          if (use_mma(s)) {  // tensor cores (attention_mma.cu)
            cuda::k::attention_mma_forward(ptr<TO>(o), L, ptr<T>(q), ptr<T>(k), ptr<T>(v), t, dims(s), stream_);
            return;
          }
        }
        cuda::k::attention_forward(ptr<TO>(o), L, ptr<T>(q), ptr<T>(k), ptr<T>(v), t, dims(s), stream_);
      });
    });
    done();
  }
  void attention_backward_block(View dq, View dk, View dv, View q, TokenRefs qt, View k, View v, const KeyBlock& kb,
                                View dout, View lse, View delta, const AttnShape& s) override {
    static const char* op = "attention_backward_block";
    const auto t = tokens(op, q, qt, k, kb, s);
    need(dq.numel() == q.numel() && dout.numel() == q.numel() && dk.numel() == k.numel() && dv.numel() == k.numel() &&
             v.numel() == k.numel(),
         op, "dq, dout must be q's shape and dk, dv, v k's");
    need(lse.numel() == t.tq * s.q_heads && delta.numel() == t.tq * s.q_heads, op, "lse, delta must be [tq, q_heads]");
    const float *L = f32(lse, op), *D = f32(delta, op);
    need_float(dq, op);
    need_float(dk, op);
    need_float(dv, op);
    DType dt = DType::f32;
    if (!one_dtype({q, k, v, dout}, op, &dt) || dk.dtype() != dv.dtype()) {
      Widened wd(*this);
      const bool kv_mixed = dk.dtype() != dv.dtype();
      const View DK = kv_mixed ? wd.in(dk) : dk, DV = kv_mixed ? wd.in(dv) : dv;
      attention_backward_block(dq, DK, DV, wd.in(q), qt, wd.in(k), wd.in(v), kb, wd.in(dout), lse, delta, s);
      if (kv_mixed) {
        wd.commit(dk, DK);
        wd.commit(dv, DV);
      }
      return;
    }
    by_dtype(q, op, [&](auto ti) {
      by_dtype(dq, op, [&](auto tq) {
        by_dtype(dk, op, [&](auto tkv) {
          using T = decltype(ti);
          using TQ = decltype(tq);
          using TKV = decltype(tkv);
          if constexpr (std::is_same_v<T, cuda::k::bf16_bits>) {
            if (use_mma(s)) {
              cuda::k::attention_mma_backward(ptr<TQ>(dq), ptr<TKV>(dk), ptr<TKV>(dv), ptr<T>(q), ptr<T>(k),
                                              ptr<T>(v), t, ptr<T>(dout), L, D, dims(s), stream_);
              return;
            }
          }
          cuda::k::attention_backward(ptr<TQ>(dq), ptr<TKV>(dk), ptr<TKV>(dv), ptr<T>(q), ptr<T>(k), ptr<T>(v), t,
                                      ptr<T>(dout), L, D, dims(s), stream_);
        });
      });
    });
    done();
  }
  void attention_delta(View delta, View dout, View o, const AttnShape& s) override {
    const int64_t rows = dout.rows() * s.q_heads;
    need(dout.cols() == s.q_heads * s.head_dim && o.numel() == dout.numel() && delta.numel() == rows,
         "attention_delta", "dout, o must be [tq, q_heads*d] and delta [tq, q_heads]");
    float* D = f32(delta, "attention_delta");
    by_dtype(dout, "attention_delta", [&](auto td) {
      by_dtype(o, "attention_delta", [&](auto to) {
        using TD = decltype(td);
        using TO = decltype(to);
        cuda::k::attention_delta(D, ptr<TD>(dout), ptr<TO>(o), rows, s.head_dim, stream_);
      });
    });
    done();
  }

  // ---- cross-entropy pieces (f32 logits shards, as the interface says)
  void row_max(View out, View logits, int64_t valid) override {
    need(out.numel() == logits.rows() && valid <= logits.cols(), "row_max", "out must be [rows], valid <= cols");
    cuda::k::row_max(f32(out, "row_max"), f32(logits, "row_max"), logits.rows(), logits.cols(), valid, stream_);
    done();
  }
  void sumexp_and_target(View out, View logits, View mx, View target, int64_t valid, int64_t v0) override {
    const int64_t rows = logits.rows();
    need(out.numel() == 2 * rows && mx.numel() == rows && target.numel() == rows, "sumexp_and_target",
         "out must be [rows, 2], max and target [rows]");
    cuda::k::sumexp_and_target(f32(out, "sumexp_and_target"), f32(logits, "sumexp_and_target"),
                               f32(mx, "sumexp_and_target"), i32(target, "sumexp_and_target"), rows, logits.cols(),
                               valid, v0, stream_);
    done();
  }
  void xent_finish(View lse, View stats, View mx, View se, View target) override {
    const int64_t rows = lse.numel();
    need(mx.numel() == rows && se.numel() == 2 * rows && target.numel() == rows, "xent_finish",
         "max, target must be [rows] and sumexp_target [rows, 2]");
    float* st = stats_ptr(stats, "xent_finish");
    cuda::k::xent_finish(f32(lse, "xent_finish"), st + kStatLossSum, f32(mx, "xent_finish"), f32(se, "xent_finish"),
                         i32(target, "xent_finish"), rows, stream_);
    done();
  }
  void xent_grad_inplace(View logits, View lse, View target, float weight, int64_t valid, int64_t v0) override {
    const int64_t rows = logits.rows();
    need(lse.numel() == rows && target.numel() == rows, "xent_grad_inplace", "lse and target must be [rows]");
    cuda::k::xent_grad_inplace(f32(logits, "xent_grad_inplace"), f32(lse, "xent_grad_inplace"),
                               i32(target, "xent_grad_inplace"), weight, rows, logits.cols(), valid, v0, stream_);
    done();
  }

  // ---- step statistics and the optimizer: everything stays on the device
  void flag_nonfinite(View stats, View x, float code) override {
    float* st = stats_ptr(stats, "flag_nonfinite");
    int* flag = reinterpret_cast<int*>(static_cast<double*>(reduce_) + cuda::k::kReduceBlocks);
    by_dtype(x, "flag_nonfinite", [&](auto t) {
      using T = decltype(t);
      cuda::k::flag_nonfinite(st + kStatNonFinite, flag, ptr<T>(x), x.numel(), code, stream_);
    });
    done();
  }
  void sum_squares(View stats, View x) override {  // x f32, as in the reference (gradients are f32)
    float* st = stats_ptr(stats, "sum_squares");
    cuda::k::sum_squares(st + kStatGradNorm2, static_cast<double*>(reduce_), f32(x, "sum_squares"), x.numel(), stream_);
    done();
  }
  void adamw(View master, View m, View v, View grad, View stats, const AdamWArgs& a) override {
    const int64_t n = master.numel();
    need(m.numel() == n && v.numel() == n && grad.numel() == n, "adamw", "master, m, v and grad differ in size");
    need(m.dtype() == v.dtype(), "adamw", "m and v differ in dtype");
    const float* st = stats_ptr(stats, "adamw");
    const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step));
    const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step));
    // the weights stepped: fp32 master, or bf16/fp32 compute weights (master=none); moments fp32 or bf16
    by_dtype(master, "adamw", [&](auto tp) {
      by_dtype(m, "adamw", [&](auto ts) {
        using P = decltype(tp);
        using S = decltype(ts);
        cuda::k::adamw(ptr<P>(master), ptr<S>(m), ptr<S>(v), f32(grad, "adamw"), st, a.decay, n, a.lr, a.beta1, a.beta2,
                       a.eps, a.weight_decay, a.clip, bc1, bc2, stream_);
      });
    });
    done();
  }

  // ---- phase timing: one CUDA event per slot, timed against the origin recorded at construction
  void mark_time(int slot) override {
    if (slot < 0) return;
    if (static_cast<size_t>(slot) >= marks_.size()) marks_.resize(slot + 1, nullptr);
    if (!marks_[slot]) CTX_CUDA(cudaEventCreate(&marks_[slot]));
    CTX_CUDA(cudaEventRecord(marks_[slot], stream_));
  }
  std::vector<double> read_times() override {
    std::vector<double> t(marks_.size(), -1.0);
    for (size_t i = 0; i < marks_.size(); ++i) {
      if (!marks_[i]) continue;
      CTX_CUDA(cudaEventSynchronize(marks_[i]));
      float ms = 0;
      CTX_CUDA(cudaEventElapsedTime(&ms, origin_, marks_[i]));
      t[i] = static_cast<double>(ms) * 1e-3;
    }
    return t;
  }

 protected:
  // Out of memory names what was being allocated, the ledger's total and the plan's predicted
  // peak (cuda::OutOfDeviceMemory, a DeviceOutOfMemory: ctxrun exits kExitDoesNotFit).
  void* raw_alloc(int64_t bytes, bool host) override { return alloc_->alloc(bytes, stream_, alloc_category(), host); }
  void raw_free(void* p, bool host) override {
    // The block may still be read by queued work: the allocator records an event on the compute
    // stream and hands the block to another stream only after it (same-stream reuse is ordered).
    // Copy-stream and communicator uses are ordered before this by wait_copy / the comm's events.
    (void)host;
    alloc_->free(p, stream_);
  }
  // A host-staged (MPI) communicator: its host work runs after everything queued (blocking), on
  // memory the host can read (managed or pinned); cudaMalloc memory is refused with the reason.
  void submit(std::function<void()> fn) override {
    synchronize();
    fn();
  }
  // NCCL where it is built (device memory, its own streams ordered by events); otherwise the
  // host-staged communicator, which needs managed memory (host_address refuses cudaMalloc memory).
  std::unique_ptr<Comm> make_comm(std::unique_ptr<HostComm> group) override {
#ifdef CTXPLAN_HAVE_NCCL
    return cuda::make_nccl_comm(*this, std::move(group), "");
#else
    return Backend::make_comm(std::move(group));
#endif
  }
  void* host_address(const View& v) override {
    void* p = raw(v);
    const Where w = where_is(p);
    if (w == Where::device)
      throw std::invalid_argument("cuda backend: a host-staged communicator was given device memory (cudaMalloc); "
                                  "use the NCCL communicator, or CudaBackendOptions::managed_memory = true");
    return p;
  }

 private:
  // Mixed f32/bf16 operands of a kernel parameter that has one storage type: each bf16 view is
  // widened into an f32 temporary (Mem::workspace, through the caching allocator; in() loads it,
  // out() does not), the op runs on the f32 views, and commit() rounds a bf16 output back once.
  // That is the CPU reference's own procedure (cpu_backend.cpp: in/out/commit), so the numerics
  // are the reference's. The temporaries are released when the op has been queued; the allocator
  // hands their blocks only to work queued later on the stream, so that is safe.
  class Widened {
   public:
    explicit Widened(CudaBackend& be) : be_(be) {}
    View in(const View& v) { return wide(v, true); }
    View out(const View& v) { return wide(v, false); }
    void commit(const View& orig, const View& w) {
      if (orig.dtype() == DType::bf16) be_.copy(orig, w);
    }

   private:
    View wide(const View& v, bool load) {
      if (v.dtype() != DType::bf16) return v;
      tmp_.push_back(be_.alloc(v.rows(), v.cols(), DType::f32, Mem::workspace));
      if (load) be_.copy(tmp_.back(), v);
      return tmp_.back().view();
    }
    CudaBackend& be_;
    std::vector<Tensor> tmp_;
  };

  template <typename T>
  static T* ptr(const View& v) {
    return static_cast<T*>(raw(v));
  }
  static bool overlap(const View& a, const View& b) {
    const char *pa = static_cast<const char*>(raw(a)), *pb = static_cast<const char*>(raw(b));
    return pa < pb + b.bytes() && pb < pa + a.bytes();
  }
  static void dtype_is(const View& v, DType want, const char* op) {
    if (v.dtype() != want)
      throw std::invalid_argument(std::string("cuda backend: ") + op + ": expected a " + to_string(want) +
                                  " tensor, got " + to_string(v.dtype()));
  }
  static float* f32(const View& v, const char* op) {
    dtype_is(v, DType::f32, op);
    return static_cast<float*>(raw(v));
  }
  static const int32_t* i32(const View& v, const char* op) {
    dtype_is(v, DType::i32, op);
    return static_cast<const int32_t*>(raw(v));
  }
  static const int64_t* i64(const View& v, const char* op) {
    dtype_is(v, DType::i64, op);
    return static_cast<const int64_t*>(raw(v));
  }
  static float* stats_ptr(const View& stats, const char* op) {
    need(stats.numel() >= kStepStats, op, "the step statistics tensor must hold kStepStats floats");
    return f32(stats, op);
  }
  static void check_cols(const char* op, const View& dst, int64_t dc, const View& src, int64_t sc, int64_t n) {
    need(dst.rows() == src.rows(), op, "row counts differ");
    need(dc >= 0 && sc >= 0 && n >= 0 && dc + n <= dst.cols() && sc + n <= src.cols(), op,
         "column range outside a view");
  }
  static cuda::k::AttnDims dims(const AttnShape& s) { return {s.q_heads, s.kv_heads, s.head_dim, s.scale}; }
  // The token ids and hulls of one attention call, checked against q and k.
  static cuda::k::AttnTokens tokens(const char* op, const View& q, const TokenRefs& qt, const View& k,
                                    const KeyBlock& kb, const AttnShape& s) {
    cuda::k::AttnTokens t;
    t.tq = q.rows();
    t.tk = k.rows();
    need(q.cols() == s.q_heads * s.head_dim && k.cols() == s.kv_heads * s.head_dim, op,
         "q must be [tq, q_heads*d] and k [tk, kv_heads*d]");
    need(qt.index.numel() == t.tq && qt.doc.numel() == t.tq, op, "query token refs must hold tq entries");
    need(kb.keys.index.numel() == t.tk && kb.keys.doc.numel() == t.tk, op, "key token refs must hold tk entries");
    need(kb.kv_range.numel() == 2 * t.tq, op, "kv_range must be [tq, 2]");
    t.q_index = i64(qt.index, op);
    t.q_doc = i32(qt.doc, op);
    t.k_index = i64(kb.keys.index, op);
    t.k_doc = i32(kb.keys.doc, op);
    t.kv_range = i32(kb.kv_range, op);
    return t;
  }

  template <typename T>
  void copy_in(const View& dst, const T* src, void* d, const char*) {
    if (dst.numel() <= 0) return;
    stage_in(static_cast<char*>(d), reinterpret_cast<const char*>(src), static_cast<size_t>(dst.bytes()));
    done();
  }

  // Host-to-device through a ring of pinned staging slots: the host copies a chunk into the next
  // slot and queues the DMA from it, so the copy is truly asynchronous (a pageable source would
  // make the driver stage it synchronously) and the caller may reuse its buffer at once. A slot is
  // reused only after the event recorded behind its last DMA: the host waits only when it runs
  // kStagingSlots chunks ahead of the device.
  static constexpr int kStagingSlots = 4;
  static constexpr size_t kStagingSlotBytes = size_t{4} << 20;
  void stage_in(char* d, const char* src, size_t bytes) {
    if (staging_[0] == nullptr) {
      for (int i = 0; i < kStagingSlots; ++i) {
        CTX_CUDA(cudaMallocHost(reinterpret_cast<void**>(&staging_[i]), kStagingSlotBytes));
        CTX_CUDA(cudaEventCreateWithFlags(&staging_done_[i], cudaEventDisableTiming));
      }
      ledger().on_host_alloc(HostMem::runtime, static_cast<int64_t>(kStagingSlots * kStagingSlotBytes));
    }
    for (size_t off = 0; off < bytes; off += kStagingSlotBytes) {
      const size_t n = std::min(kStagingSlotBytes, bytes - off);
      const int slot = next_slot_;
      next_slot_ = (next_slot_ + 1) % kStagingSlots;
      CTX_CUDA(cudaEventSynchronize(staging_done_[slot]));  // its previous DMA has read the slot
      std::memcpy(staging_[slot], src + off, n);
      CTX_CUDA(cudaMemcpyAsync(d + off, staging_[slot], n, cudaMemcpyHostToDevice, stream_));
      CTX_CUDA(cudaEventRecord(staging_done_[slot], stream_));
    }
  }

  // ---- the copy stream (offload): copy_async waits for the compute stream's work so far, copies
  // on its own stream and returns an event; wait_copy makes the compute stream wait for it.
  CopyEvent copy_async(View dst, View src) override {
    if (dst.dtype() != src.dtype() || dst.numel() != src.numel()) {  // conversions: on the compute stream
      copy(dst, src);
      return {};
    }
    if (dst.numel() <= 0) return {};
    if (!copy_stream_) {
      CTX_CUDA(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
      CTX_CUDA(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
    }
    CTX_CUDA(cudaEventRecord(compute_mark_, stream_));
    CTX_CUDA(cudaStreamWaitEvent(copy_stream_, compute_mark_, 0));
    CTX_CUDA(cudaMemcpyAsync(raw(dst), raw(src), static_cast<size_t>(dst.bytes()), cudaMemcpyDefault, copy_stream_));
    cudaEvent_t e = nullptr;
    if (!free_copy_events_.empty()) {
      e = free_copy_events_.back();
      free_copy_events_.pop_back();
    } else {
      CTX_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    CTX_CUDA(cudaEventRecord(e, copy_stream_));
    const uint64_t id = ++copy_ids_;
    copy_events_[id] = e;
    done();
    return {id};
  }
  void wait_copy(CopyEvent c) override {
    if (c.id == 0) return;
    auto it = copy_events_.find(c.id);
    need(it != copy_events_.end(), "wait_copy", "an unknown or already waited copy event");
    CTX_CUDA(cudaStreamWaitEvent(stream_, it->second, 0));
    free_copy_events_.push_back(it->second);  // the wait captured the record: the event may be reused
    copy_events_.erase(it);
  }

  void done() {
    if (opts_.sync_each_call) synchronize();
  }

  // Scratch arena (device memory, accounted as workspace) for kernels' temporaries; steady state
  // never grows. One arena: each op's use ends before the next op's starts, in stream order.
  // Growing does not wait: the old arena goes back to the stream-ordered caching allocator, which
  // hands it out again only after the work queued so far on the stream (an event at free).
  void* scratch(size_t bytes) {
    reserve_scratch(round_up(std::max<size_t>(bytes, 1)));
    return scratch_;
  }
  void reserve_scratch(size_t bytes) {
    if (bytes <= scratch_bytes_) return;
    const size_t grown = std::max(bytes, scratch_bytes_ * 2);
    if (scratch_) {
      alloc_->free(scratch_, stream_);
      ledger().on_free(Mem::workspace, static_cast<int64_t>(scratch_bytes_));
    }
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    scratch_ = alloc_->alloc(static_cast<int64_t>(grown), stream_, "workspace (kernel scratch)");
    scratch_bytes_ = grown;
    ledger().on_alloc(Mem::workspace, static_cast<int64_t>(grown));
  }

  int device_;
  CudaBackendOptions opts_;
  std::string name_;
  std::string attention_ = "auto";  // auto | mma | simt (use_mma)
  bool phase_open_ = false, task_open_ = false;  // NVTX ranges pushed by annotate_*
  char* staging_[kStagingSlots] = {};  // pinned host-to-device staging ring (stage_in)
  cudaEvent_t staging_done_[kStagingSlots] = {};
  int next_slot_ = 0;
  cudaStream_t copy_stream_ = nullptr;  // copy_async
  cudaEvent_t compute_mark_ = nullptr;
  std::map<uint64_t, cudaEvent_t> copy_events_;
  std::vector<cudaEvent_t> free_copy_events_;
  uint64_t copy_ids_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CachingAllocator> alloc_;
  std::unique_ptr<LtGemm> gemm_;
  void* gemm_ws_ = nullptr;
  void* reduce_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  cudaEvent_t origin_ = nullptr;
  std::vector<cudaEvent_t> marks_;
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

void cuda_backend_synchronize(Backend& be) { be.synchronize(); }

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
