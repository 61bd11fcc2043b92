// The NCCL communicator (see comm_nccl.hpp for the design; failures: nccl_watchdog.hpp).
// Status: a one-rank communicator ran on one H200 on 2026-11-28 (docs/GPU_PROOF.md); several GPUs untested.
#include "executor/cuda/comm_nccl.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "executor/cuda/cuda_backend.hpp"
#include "executor/cuda/cuda_check.hpp"
#include "executor/cuda/nccl_watchdog.hpp"

namespace ctx::exec::cuda {
namespace {

bool blocking_mode() {
  const char* v = std::getenv("CTXPLAN_NCCL_BLOCKING");
  return v && *v && std::string(v) != "0";
}

// This process within the job, for messages: the launcher's world rank where it says one.
std::string process_name() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK"}) {
    const char* v = std::getenv(var);
    if (v && *v) return std::string("world rank ") + v;
  }
  return "this process";
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
  }
  throw std::logic_error("nccl_type: unknown dtype");
}

Probe query(cudaEvent_t e) {
  const cudaError_t q = cudaEventQuery(e);
  if (q == cudaSuccess) return Probe::done;
  if (q == cudaErrorNotReady) return Probe::not_yet;
  return Probe::error;
}

class NcclComm;

// One launched (or still queued) batch of point-to-point operations.
struct P2pBatch {
  cudaEvent_t done = nullptr;
  bool launched = false;
  P2pBatch() { CTX_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming)); }
  ~P2pBatch() { cudaEventDestroy(done); }
};

class NcclRequest : public Request {
 public:
  NcclRequest(NcclComm* c, std::shared_ptr<P2pBatch> b, std::string what)
      : comm_(c), batch_(std::move(b)), what_(std::move(what)) {}
  void wait() override;
  ~NcclRequest() override {
    if (!waited_) {
      try {
        wait();
      } catch (...) {  // a destructor must not throw; the failure was (or will be) reported by wait()
      }
    }
  }

 private:
  NcclComm* comm_;
  std::shared_ptr<P2pBatch> batch_;
  std::string what_;
  bool waited_ = false;
};

class NcclComm final : public Comm, public WatchedComm {
 public:
  NcclComm(Backend& be, std::unique_ptr<HostComm> host, const std::string& group)
      : be_(be), host_(std::move(host)), dog_(Watchdog::process()), blocking_(blocking_mode()) {
    compute_ = cuda_backend_stream(be);
    if (!compute_) throw std::invalid_argument("the NCCL communicator needs the CUDA backend (got '" + be.name() + "')");
    if (!host_) throw std::invalid_argument("the NCCL communicator needs its group's HostComm");
    rank_ = host_->rank();
    size_ = host_->size();
    label_ = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " of NCCL group " +
             (group.empty() ? std::string("(unnamed)") : "'" + group + "'") + " (" + process_name() + ")";
    ncclUniqueId id{};
    if (rank_ == 0) {
      ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) throw std::runtime_error(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
    }
    host_->broadcast(&id, static_cast<int64_t>(sizeof(id)), 0);
    // Non-blocking: no NCCL call may hang the host; a missing peer at initialisation is a timeout.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      throw std::runtime_error("ncclCommInitRankConfig failed on " + label_ + ": " + ncclGetErrorString(r));
    }
    settle("ncclCommInitRankConfig");
    CTX_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CTX_CUDA(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CTX_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    dog_.add(this);
  }
  ~NcclComm() override {
    if (!aborted_.load()) {
      try {
        flush_p2p("destroy");
      } catch (...) {
      }
    }
    dog_.remove(this);  // from here the watchdog no longer touches this communicator
    if (!aborted_.load()) {
      try {
        // flushes outstanding work without blocking the host; settle() bounds the wait
        ncclResult_t r = ncclCommFinalize(comm_);
        if (r == ncclSuccess || r == ncclInProgress) settle("ncclCommFinalize");
      } catch (...) {
      }
      if (!aborted_.load()) ncclCommDestroy(comm_);
    }
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
    for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  }

  // ---- WatchedComm (called from the watchdog thread) ----
  std::string label() const override { return label_; }
  std::string async_error() override {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_.load()) return {};
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
    if (r != ncclSuccess) return std::string("ncclCommGetAsyncError failed: ") + ncclGetErrorString(r);
    if (async == ncclSuccess || async == ncclInProgress) return {};
    const char* last = ncclGetLastError(comm_);
    return std::string(ncclGetErrorString(async)) + (last && *last ? std::string(" (") + last + ")" : "");
  }
  void abort() override {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_.exchange(true)) return;
    ncclCommAbort(comm_);  // NCCL allows this from another thread, to unblock a hung communicator
  }

  // ---- Comm ----
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce_sum(View b) override { reduce("allreduce_sum", b, ncclSum); }
  void allreduce_max(View b) override { reduce("allreduce_max", b, ncclMax); }
  void allgather(View s, View r) override {
    same_dtype("allgather", s, r);
    need(r.numel() == s.numel() * size_, "allgather", "recv must hold size() blocks of send");
    collective("allgather", s.numel() * dtype_bytes(s.dtype()), [&] {
      return ncclAllGather(raw(s), raw(r), static_cast<size_t>(s.numel()), nccl_type(s.dtype()), comm_, stream_);
    });
  }
  void reduce_scatter(View s, View r) override {
    need(s.numel() == r.numel() * size_, "reduce_scatter", "send must hold size() blocks of recv");
    if (s.dtype() == DType::f32 && r.dtype() == DType::bf16) {
      // fp32 partial sums (dK, dV) into bf16 gradients: NCCL reduces in one dtype, so reduce in
      // fp32 into a temporary and round once on the compute stream, as the host-staged comm does
      // (found by the emulated backend: the all-gather-KV plans' bf16 equivalence)
      Tensor sum = be_.alloc(r.rows(), r.cols(), DType::f32, Mem::comm_buffers);
      reduce_scatter(s, sum.view());
      be_.copy(r, sum.view());
      be_.free_tensor(sum);  // stream-ordered reuse: after the copy on the compute stream
      return;
    }
    same_dtype("reduce_scatter", s, r);
    collective("reduce_scatter", s.numel() * dtype_bytes(s.dtype()), [&] {
      return ncclReduceScatter(raw(s), raw(r), static_cast<size_t>(r.numel()), nccl_type(s.dtype()), ncclSum, comm_,
                               stream_);
    });
  }
  void alltoall(View s, View r) override {
    same_dtype("alltoall", s, r);
    need(s.numel() == r.numel() && s.numel() % size_ == 0, "alltoall", "send and recv must hold size() equal blocks");
    collective("alltoall", s.numel() * dtype_bytes(s.dtype()), [&] {
      return ncclAlltoAll(raw(s), raw(r), static_cast<size_t>(s.numel() / size_), nccl_type(s.dtype()), comm_,
                          stream_);
    });
  }
  std::unique_ptr<Request> isend(View b, int peer, int /*tag: NCCL orders per peer*/) override {
    return post(true, b, peer, "isend to peer " + std::to_string(peer));
  }
  std::unique_ptr<Request> irecv(View b, int peer, int /*tag*/) override {
    return post(false, b, peer, "irecv from peer " + std::to_string(peer));
  }

  // The host control path: both streams drained, NCCL's asynchronous error checked, then MPI.
  void host_allreduce_max(int* buf, int64_t n) override {
    drain("host_allreduce_max");
    host_->allreduce_max(buf, n, HostType::i32);
  }
  void host_allreduce_sum(double* buf, int64_t n) override {
    drain("host_allreduce_sum");
    host_->allreduce_sum(buf, n, HostType::f64);
  }
  void barrier() override {
    drain("barrier");
    host_->barrier();
  }

  // Launches the queued point-to-point operations as one group, after the compute stream's work.
  void flush_p2p(const char* why) {
    if (pending_.empty()) return;
    alive(why);
    std::string name = "point-to-point batch (";
    int64_t bytes = 0;
    for (size_t i = 0; i < pending_.size(); ++i) {
      const Pending& p = pending_[i];
      name += (i ? ", " : "") + std::string(p.send ? "send to " : "recv from ") + std::to_string(p.peer);
      bytes += static_cast<int64_t>(p.bytes);
    }
    name += ")";
    CTX_CUDA(cudaEventRecord(ready_, compute_));
    CTX_CUDA(cudaStreamWaitEvent(stream_, ready_, 0));
    cudaEvent_t start = take_event();
    CTX_CUDA(cudaEventRecord(start, stream_));
    call(ncclGroupStart(), "ncclGroupStart");
    for (const Pending& p : pending_) {
      if (p.send) call(ncclSend(p.buf, p.count, p.type, p.peer, comm_, stream_), "ncclSend");
      else call(ncclRecv(p.buf, p.count, p.type, p.peer, comm_, stream_), "ncclRecv");
    }
    call(ncclGroupEnd(), "ncclGroupEnd (point-to-point batch)");
    CTX_CUDA(cudaEventRecord(open_->done, stream_));
    watch(name + ", " + std::to_string(bytes) + " bytes", start);
    open_->launched = true;
    pending_.clear();
    open_.reset();
    sends_ = recvs_ = 0;
  }
  // Stream order: the compute stream's later work waits for `ev` (and, in blocking mode, the host
  // waits for it too).
  void order_after(cudaEvent_t ev, const std::string& op) {
    if (blocking_) wait_on_host(ev, op);
    CTX_CUDA(cudaStreamWaitEvent(compute_, ev, 0));
  }

 private:
  struct Pending {
    bool send;
    void* buf;
    size_t count;
    size_t bytes;
    ncclDataType_t type;
    int peer;
  };
  static void need(bool ok, const char* op, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("NCCL ") + op + ": " + what);
  }
  static void same_dtype(const char* op, const View& s, const View& r) {
    need(s.dtype() == r.dtype(), op, "send and recv dtypes differ");
  }

  // A failure on this thread: abort this communicator, let the watchdog end the job (its default
  // action does not return); throw when a test's handler lets it return.
  [[noreturn]] void fail_here(const std::string& msg) {
    abort();
    dog_.fail(msg);
    throw std::runtime_error(msg);
  }
  // A non-blocking communicator's call: ncclInProgress means "settle before the next call".
  void call(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return;
    if (r == ncclInProgress) {
      settle(what);
      return;
    }
    const char* last = ncclGetLastError(comm_);
    fail_here(std::string("NCCL ") + what + " failed on " + label_ + ": " + ncclGetErrorString(r) +
              (last && *last ? std::string(" (") + last + ")" : ""));
  }
  // Polls ncclCommGetAsyncError until the communicator leaves ncclInProgress, under the timeout.
  void settle(const char* what) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int spin = 0;; ++spin) {
      ncclResult_t s = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &s);
      if (r != ncclSuccess) s = r;
      if (s == ncclSuccess) return;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s != ncclInProgress) {
        const char* last = ncclGetLastError(comm_);
        fail_here(std::string("NCCL ") + what + " failed on " + label_ + " after " + std::to_string(waited) +
                  " s: " + ncclGetErrorString(s) + (last && *last ? std::string(" (") + last + ")" : ""));
      }
      if (waited > dog_.timeout_s())
        fail_here(std::string("NCCL ") + what + " on " + label_ + " did not complete on the host in " +
                  std::to_string(static_cast<int>(waited)) +
                  " s (a peer is missing or hung; CTXPLAN_NCCL_TIMEOUT_S sets the limit)");
      if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  void alive(const char* op) {
    if (aborted_.load())
      throw std::runtime_error(std::string("NCCL ") + op + " on " + label_ + ": the communicator was aborted earlier");
  }
  // Waits for `ev` on the host (blocking mode), under the same limit as the watchdog.
  void wait_on_host(cudaEvent_t ev, const std::string& op) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int spin = 0;; ++spin) {
      const Probe p = query(ev);
      if (p == Probe::done) return;
      if (p == Probe::error) fail_here("NCCL " + op + " on " + label_ + ": a CUDA error on its stream");
      const std::string err = async_error();
      if (!err.empty()) fail_here("NCCL " + op + " failed on " + label_ + ": " + err);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited > dog_.timeout_s())
        fail_here("NCCL " + op + " on " + label_ + " did not complete in " + std::to_string(static_cast<int>(waited)) +
                  " s (a peer is missing, hung or posted a different operation; CTXPLAN_NCCL_TIMEOUT_S sets the limit)");
      if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // Everything queued on both streams finished (the host path's precondition).
  void drain(const char* op) {
    alive(op);
    flush_p2p(op);
    be_.synchronize();
    CTX_CUDA(cudaEventRecord(done_, stream_));
    wait_on_host(done_, op);
    const std::string err = async_error();
    if (!err.empty()) fail_here(std::string("NCCL ") + op + " failed on " + label_ + ": " + err);
  }

  // Events for the watchdog: recycled by the watchdog thread once the operation has finished.
  cudaEvent_t take_event() {
    {
      std::lock_guard<std::mutex> lock(events_mu_);
      if (!spare_events_.empty()) {
        cudaEvent_t e = spare_events_.back();
        spare_events_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    CTX_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  // Hands the operation that just went onto the stream, between `start` and a new end event, to
  // the watchdog.
  void watch(const std::string& op, cudaEvent_t start) {
    cudaEvent_t end = take_event();
    CTX_CUDA(cudaEventRecord(end, stream_));
    dog_.track(
        this, op, [start] { return query(start); }, [end] { return query(end); },
        [this, start, end] {
          std::lock_guard<std::mutex> lock(events_mu_);
          spare_events_.push_back(start);
          spare_events_.push_back(end);
        });
  }

  std::unique_ptr<Request> post(bool send, const View& b, int peer, std::string what) {
    alive(what.c_str());
    if (!open_) open_ = std::make_shared<P2pBatch>();
    pending_.push_back({send, raw(b), static_cast<size_t>(b.numel()),
                        static_cast<size_t>(b.numel() * dtype_bytes(b.dtype())), nccl_type(b.dtype()), peer});
    (send ? sends_ : recvs_) += 1;
    auto req = std::make_unique<NcclRequest>(this, open_, what + " on " + label_);
    if (sends_ > 0 && recvs_ > 0) flush_p2p(what.c_str());  // a ring step: start it now, overlapping compute
    return req;
  }

  void reduce(const char* op, const View& b, ncclRedOp_t r) {
    collective(op, b.numel() * dtype_bytes(b.dtype()), [&] {
      return ncclAllReduce(raw(b), raw(b), static_cast<size_t>(b.numel()), nccl_type(b.dtype()), r, comm_, stream_);
    });
  }

  // One collective on this communicator's stream, after the compute stream's queued work and
  // before its next work, watched from its start to its end.
  template <typename Launch>
  void collective(const char* op, int64_t bytes, Launch launch) {
    alive(op);
    flush_p2p(op);
    CTX_CUDA(cudaEventRecord(ready_, compute_));
    CTX_CUDA(cudaStreamWaitEvent(stream_, ready_, 0));
    cudaEvent_t start = take_event();
    CTX_CUDA(cudaEventRecord(start, stream_));
    call(launch(), op);
    CTX_CUDA(cudaEventRecord(done_, stream_));
    watch(std::string(op) + " of " + std::to_string(bytes) + " bytes", start);
    order_after(done_, op);
  }

  Backend& be_;
  std::unique_ptr<HostComm> host_;
  Watchdog& dog_;
  bool blocking_;
  ncclComm_t comm_ = nullptr;
  std::string label_;
  cudaStream_t compute_ = nullptr, stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  int rank_ = 0, size_ = 1;
  std::mutex abort_mu_;  // abort() (watchdog thread) against async_error()
  std::atomic<bool> aborted_{false};
  std::mutex events_mu_;
  std::vector<cudaEvent_t> spare_events_;
  std::vector<Pending> pending_;
  std::shared_ptr<P2pBatch> open_;
  int sends_ = 0, recvs_ = 0;
};

void NcclRequest::wait() {
  if (waited_) return;
  waited_ = true;
  if (!batch_->launched) comm_->flush_p2p(what_.c_str());
  comm_->order_after(batch_->done, what_);
}

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(Backend& be, std::unique_ptr<HostComm> host, const std::string& group_name) {
  return std::make_unique<NcclComm>(be, std::move(host), group_name);
}

}  // namespace ctx::exec::cuda

#if !defined(cuda)  // the emulated build renames namespace cuda (-Dcuda=cuda_emu): no second copy
std::unique_ptr<ctx::exec::Comm> ctx::exec::make_nccl_comm(Backend& be, std::unique_ptr<HostComm> host) {
  return cuda::make_nccl_comm(be, std::move(host), "");
}
#endif
