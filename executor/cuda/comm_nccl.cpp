// The NCCL communicator (see comm_nccl.hpp for the design). Status: compiles, untested on GPU.
#include "executor/cuda/comm_nccl.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "executor/cuda/cuda_backend.hpp"
#include "executor/cuda/cuda_check.hpp"

namespace ctx::exec {
namespace {

double timeout_seconds() {
  const char* v = std::getenv("CTXPLAN_NCCL_TIMEOUT_S");
  double t = v ? std::atof(v) : 0;
  return t > 0 ? t : 600.0;
}
bool blocking_mode() {
  const char* v = std::getenv("CTXPLAN_NCCL_BLOCKING");
  return v && *v && std::string(v) != "0";
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

class NcclComm : public Comm {
 public:
  NcclComm(Backend& be, std::unique_ptr<HostComm> host)
      : be_(be), host_(std::move(host)), timeout_s_(timeout_seconds()), blocking_(blocking_mode()) {
    compute_ = cuda_backend_stream(be);
    if (!compute_) throw std::invalid_argument("the NCCL communicator needs the CUDA backend (got '" + be.name() + "')");
    if (!host_) throw std::invalid_argument("the NCCL communicator needs its group's HostComm");
    rank_ = host_->rank();
    size_ = host_->size();
    label_ = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " in an NCCL group";
    ncclUniqueId id{};
    if (rank_ == 0) {
      ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) throw std::runtime_error(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
    }
    host_->broadcast(&id, static_cast<int64_t>(sizeof(id)), 0);
    ncclResult_t r = ncclCommInitRank(&comm_, size_, id, rank_);
    if (r != ncclSuccess)
      throw std::runtime_error("ncclCommInitRank failed on " + label_ + ": " + ncclGetErrorString(r));
    CTX_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CTX_CUDA(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CTX_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~NcclComm() override {
    if (!aborted_) {
      try {
        flush_p2p("destroy");
      } catch (...) {
      }
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce_sum(View b) override { reduce("allreduce_sum", b, ncclSum); }
  void allreduce_max(View b) override { reduce("allreduce_max", b, ncclMax); }
  void allgather(View s, View r) override {
    same_dtype("allgather", s, r);
    need(r.numel() == s.numel() * size_, "allgather", "recv must hold size() blocks of send");
    collective("allgather", [&] {
      return ncclAllGather(raw(s), raw(r), static_cast<size_t>(s.numel()), nccl_type(s.dtype()), comm_, stream_);
    });
  }
  void reduce_scatter(View s, View r) override {
    same_dtype("reduce_scatter", s, r);
    need(s.numel() == r.numel() * size_, "reduce_scatter", "send must hold size() blocks of recv");
    collective("reduce_scatter", [&] {
      return ncclReduceScatter(raw(s), raw(r), static_cast<size_t>(r.numel()), nccl_type(s.dtype()), ncclSum, comm_,
                               stream_);
    });
  }
  void alltoall(View s, View r) override {
    same_dtype("alltoall", s, r);
    need(s.numel() == r.numel() && s.numel() % size_ == 0, "alltoall", "send and recv must hold size() equal blocks");
    collective("alltoall", [&] {
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
    CTX_CUDA(cudaEventRecord(ready_, compute_));
    CTX_CUDA(cudaStreamWaitEvent(stream_, ready_, 0));
    check(ncclGroupStart(), "ncclGroupStart");
    for (const Pending& p : pending_) {
      if (p.send) check(ncclSend(p.buf, p.count, p.type, p.peer, comm_, stream_), "ncclSend");
      else check(ncclRecv(p.buf, p.count, p.type, p.peer, comm_, stream_), "ncclRecv");
    }
    check(ncclGroupEnd(), "ncclGroupEnd (point-to-point batch)");
    CTX_CUDA(cudaEventRecord(open_->done, stream_));
    open_->launched = true;
    pending_.clear();
    open_.reset();
    sends_ = recvs_ = 0;
  }
  // Stream order: the compute stream's later work waits for `ev` (and, in blocking mode, the host
  // waits for it too, under the timeout).
  void order_after(cudaEvent_t ev, const std::string& op) {
    if (blocking_) wait_on_host(ev, op);
    CTX_CUDA(cudaStreamWaitEvent(compute_, ev, 0));
  }

 private:
  struct Pending {
    bool send;
    void* buf;
    size_t count;
    ncclDataType_t type;
    int peer;
  };
  static void need(bool ok, const char* op, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("NCCL ") + op + ": " + what);
  }
  static void same_dtype(const char* op, const View& s, const View& r) {
    need(s.dtype() == r.dtype(), op, "send and recv dtypes differ");
  }

  void check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return;
    const char* last = ncclGetLastError(comm_);
    throw std::runtime_error(std::string("NCCL ") + what + " failed on " + label_ + ": " + ncclGetErrorString(r) +
                             (last && *last ? std::string(" (") + last + ")" : ""));
  }
  void alive(const char* op) {
    if (aborted_)
      throw std::runtime_error(std::string("NCCL ") + op + " on " + label_ + ": the communicator was aborted earlier");
  }
  void abort() {
    if (aborted_) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }
  void async_error(const std::string& op) {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      abort();
      throw std::runtime_error("NCCL " + op + " failed on " + label_ + ": " + ncclGetErrorString(async) +
                               " (communicator aborted)");
    }
  }
  // Waits for `ev` on the host, polling NCCL's asynchronous error; aborts on error or timeout.
  void wait_on_host(cudaEvent_t ev, const std::string& op) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int spin = 0;; ++spin) {
      cudaError_t q = cudaEventQuery(ev);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda::throw_cuda(q, ("waiting for NCCL " + op).c_str(), __FILE__, __LINE__);
      async_error(op);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited > timeout_s_) {
        abort();
        throw std::runtime_error("NCCL " + op + " on " + label_ + " did not complete in " +
                                 std::to_string(static_cast<int>(timeout_s_)) +
                                 " s (a peer is missing, hung or posted a different operation); communicator aborted "
                                 "(CTXPLAN_NCCL_TIMEOUT_S sets the limit)");
      }
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
    async_error(op);
  }

  std::unique_ptr<Request> post(bool send, const View& b, int peer, std::string what) {
    alive(what.c_str());
    if (!open_) open_ = std::make_shared<P2pBatch>();
    pending_.push_back({send, raw(b), static_cast<size_t>(b.numel()), nccl_type(b.dtype()), peer});
    (send ? sends_ : recvs_) += 1;
    auto req = std::make_unique<NcclRequest>(this, open_, what + " on " + label_);
    if (sends_ > 0 && recvs_ > 0) flush_p2p(what.c_str());  // a ring step: start it now, overlapping compute
    return req;
  }

  void reduce(const char* op, const View& b, ncclRedOp_t r) {
    collective(op, [&] {
      return ncclAllReduce(raw(b), raw(b), static_cast<size_t>(b.numel()), nccl_type(b.dtype()), r, comm_, stream_);
    });
  }

  // One collective on this communicator's stream, after the compute stream's queued work and
  // before its next work.
  template <typename Launch>
  void collective(const char* op, Launch launch) {
    alive(op);
    flush_p2p(op);
    CTX_CUDA(cudaEventRecord(ready_, compute_));
    CTX_CUDA(cudaStreamWaitEvent(stream_, ready_, 0));
    check(launch(), op);
    CTX_CUDA(cudaEventRecord(done_, stream_));
    order_after(done_, op);
  }

  Backend& be_;
  std::unique_ptr<HostComm> host_;
  double timeout_s_;
  bool blocking_;
  ncclComm_t comm_ = nullptr;
  std::string label_;
  cudaStream_t compute_ = nullptr, stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  int rank_ = 0, size_ = 1;
  bool aborted_ = false;
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

std::unique_ptr<Comm> make_nccl_comm(Backend& be, std::unique_ptr<HostComm> host) {
  return std::make_unique<NcclComm>(be, std::move(host));
}

}  // namespace ctx::exec
