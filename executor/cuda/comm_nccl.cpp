// The NCCL communicator (see comm_nccl.hpp for the design).
#include "executor/cuda/comm_nccl.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifdef CTXPLAN_HAVE_MPI
#include <mpi.h>
#endif

#include "executor/cuda/cuda_backend.hpp"
#include "executor/cuda/cuda_check.hpp"

namespace ctx::exec {
namespace {

double timeout_seconds() {
  const char* v = std::getenv("CTXPLAN_NCCL_TIMEOUT_S");
  double t = v ? std::atof(v) : 0;
  return t > 0 ? t : 600.0;
}

bool host_memory(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return a.type == cudaMemoryTypeHost || a.type == cudaMemoryTypeUnregistered;
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
  NcclRequest(NcclComm* c, std::shared_ptr<P2pBatch> b, std::string what) : comm_(c), batch_(std::move(b)), what_(std::move(what)) {}
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
  NcclComm(ncclComm_t c, std::string label, cudaStream_t compute, Backend& be)
      : comm_(c), label_(std::move(label)), compute_(compute), be_(be), timeout_s_(timeout_seconds()) {
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check(ncclCommCount(comm_, &size_), "ncclCommCount");
    label_ = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " in " + label_;
    CTX_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CTX_CUDA(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CTX_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    CTX_CUDA(cudaMalloc(&barrier_buf_, sizeof(int)));
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
    if (staging_) {
      cudaFree(staging_);
      be_.ledger().on_free(Mem::comm_buffers, static_cast<int64_t>(staging_bytes_));
    }
    cudaFree(barrier_buf_);
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
  }
  ncclComm_t handle() const { return comm_; }
  const std::string& label() const { return label_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce_sum(float* b, int64_t n) override { reduce("allreduce_sum", b, n, ncclFloat32, ncclSum, 4); }
  void allreduce_sum(double* b, int64_t n) override { reduce("allreduce_sum", b, n, ncclFloat64, ncclSum, 8); }
  void allreduce_max(float* b, int64_t n) override { reduce("allreduce_max", b, n, ncclFloat32, ncclMax, 4); }
  void allreduce_max(int* b, int64_t n) override { reduce("allreduce_max", b, n, ncclInt32, ncclMax, 4); }
  void allgather(const float* s, float* r, int64_t n) override {
    collective("allgather", s, bytes(n), r, bytes(n) * size_, [&](const void* sd, void* rd) {
      return ncclAllGather(sd, rd, static_cast<size_t>(n), ncclFloat32, comm_, stream_);
    });
  }
  void reduce_scatter(const float* s, float* r, int64_t n) override {
    collective("reduce_scatter", s, bytes(n) * size_, r, bytes(n), [&](const void* sd, void* rd) {
      return ncclReduceScatter(sd, rd, static_cast<size_t>(n), ncclFloat32, ncclSum, comm_, stream_);
    });
  }
  void alltoall(const float* s, float* r, int64_t n) override {
    collective("alltoall", s, bytes(n) * size_, r, bytes(n) * size_, [&](const void* sd, void* rd) {
      return ncclAlltoAll(sd, rd, static_cast<size_t>(n), ncclFloat32, comm_, stream_);
    });
  }
  void broadcast(float* b, int64_t n, int root) override {
    collective("broadcast", b, bytes(n), b, bytes(n), [&](const void* sd, void* rd) {
      return ncclBroadcast(sd, rd, static_cast<size_t>(n), ncclFloat32, root, comm_, stream_);
    });
  }
  void barrier() override {
    collective("barrier", barrier_buf_, sizeof(int), barrier_buf_, sizeof(int), [&](const void* sd, void* rd) {
      return ncclAllReduce(sd, rd, 1, ncclInt32, ncclSum, comm_, stream_);
    });
  }

  std::unique_ptr<Request> isend(const float* b, int64_t n, int peer, int tag) override {
    return post(true, const_cast<float*>(b), n, peer, "isend to peer " + std::to_string(peer));
  }
  std::unique_ptr<Request> irecv(float* b, int64_t n, int peer, int tag) override {
    return post(false, b, n, peer, "irecv from peer " + std::to_string(peer));
  }

  // Launches the queued point-to-point operations as one group.
  void flush_p2p(const char* why) {
    if (pending_.empty()) return;
    alive(why);
    CTX_CUDA(cudaEventRecord(ready_, compute_));
    CTX_CUDA(cudaStreamWaitEvent(stream_, ready_, 0));
    check(ncclGroupStart(), "ncclGroupStart");
    for (const Pending& p : pending_) {
      if (p.send) check(ncclSend(p.buf, static_cast<size_t>(p.n), ncclFloat32, p.peer, comm_, stream_), "ncclSend");
      else check(ncclRecv(p.buf, static_cast<size_t>(p.n), ncclFloat32, p.peer, comm_, stream_), "ncclRecv");
    }
    check(ncclGroupEnd(), "ncclGroupEnd (point-to-point batch)");
    CTX_CUDA(cudaEventRecord(open_->done, stream_));
    open_->launched = true;
    pending_.clear();
    open_.reset();
    sends_ = recvs_ = 0;
  }

  // Waits for `ev` on the host, polling NCCL's asynchronous error; aborts on error or timeout.
  void wait_for(cudaEvent_t ev, const std::string& op) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int spin = 0;; ++spin) {
      cudaError_t q = cudaEventQuery(ev);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda::throw_cuda(q, ("waiting for NCCL " + op).c_str(), __FILE__, __LINE__);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        abort();
        throw std::runtime_error("NCCL " + op + " failed on " + label_ + ": " + ncclGetErrorString(async) +
                                 " (communicator aborted)");
      }
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
  void compute_waits(cudaEvent_t ev) { CTX_CUDA(cudaStreamWaitEvent(compute_, ev, 0)); }

 private:
  struct Pending {
    bool send;
    float* buf;
    int64_t n;
    int peer;
  };
  static size_t bytes(int64_t n) { return static_cast<size_t>(std::max<int64_t>(n, 0)) * sizeof(float); }

  void check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return;
    std::string last = ncclGetLastError(comm_) ? ncclGetLastError(comm_) : "";
    throw std::runtime_error(std::string("NCCL ") + what + " failed on " + label_ + ": " + ncclGetErrorString(r) +
                             (last.empty() ? "" : " (" + last + ")"));
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

  std::unique_ptr<Request> post(bool send, float* b, int64_t n, int peer, std::string what) {
    alive(what.c_str());
    if (n > 0 && host_memory(b))
      throw std::invalid_argument("NCCL " + what + " on " + label_ + ": buffer is host memory; point-to-point "
                                  "buffers must be device or managed memory (allocate them with the CUDA backend)");
    if (!open_) open_ = std::make_shared<P2pBatch>();
    pending_.push_back({send, b, n, peer});
    (send ? sends_ : recvs_) += 1;
    auto req = std::make_unique<NcclRequest>(this, open_, what + " on " + label_);
    if (sends_ > 0 && recvs_ > 0) flush_p2p(what.c_str());  // a ring step: start it now, overlapping compute
    return req;
  }

  void reduce(const char* op, void* b, int64_t n, ncclDataType_t t, ncclRedOp_t r, size_t elem) {
    const size_t nb = static_cast<size_t>(std::max<int64_t>(n, 0)) * elem;
    collective(op, b, nb, b, nb, [&](const void* sd, void* rd) {
      return ncclAllReduce(sd, rd, static_cast<size_t>(n), t, r, comm_, stream_);
    });
  }

  // Runs one blocking collective on this communicator's stream, ordered after the compute
  // stream's queued work and before its next work; host buffers go through device staging.
  template <typename Launch>
  void collective(const char* op, const void* send, size_t send_bytes, void* recv, size_t recv_bytes, Launch launch) {
    alive(op);
    flush_p2p(op);
    const bool in_place = send == recv;
    const bool host = (send_bytes > 0 && host_memory(send)) || (recv_bytes > 0 && host_memory(recv));
    const void* sd = send;
    void* rd = recv;
    CTX_CUDA(cudaEventRecord(ready_, compute_));
    CTX_CUDA(cudaStreamWaitEvent(stream_, ready_, 0));
    if (host) {
      const size_t s_round = (send_bytes + 255) / 256 * 256;
      reserve_staging(in_place ? std::max(send_bytes, recv_bytes) : s_round + recv_bytes);
      char* base = static_cast<char*>(staging_);
      rd = in_place ? base : base + s_round;
      sd = in_place ? rd : base;
      CTX_CUDA(cudaMemcpyAsync(const_cast<void*>(sd), send, send_bytes, cudaMemcpyDefault, stream_));
    }
    check(launch(sd, rd), op);
    CTX_CUDA(cudaEventRecord(done_, stream_));
    wait_for(done_, op);
    if (host) {
      CTX_CUDA(cudaMemcpyAsync(recv, rd, recv_bytes, cudaMemcpyDefault, stream_));
      CTX_CUDA(cudaStreamSynchronize(stream_));
    }
    compute_waits(done_);
  }

  void reserve_staging(size_t bytes) {
    if (bytes <= staging_bytes_) return;
    CTX_CUDA(cudaStreamSynchronize(stream_));
    if (staging_) {
      CTX_CUDA(cudaFree(staging_));
      be_.ledger().on_free(Mem::comm_buffers, static_cast<int64_t>(staging_bytes_));
      staging_ = nullptr;
      staging_bytes_ = 0;
    }
    CTX_CUDA(cudaMalloc(&staging_, bytes));
    staging_bytes_ = bytes;
    be_.ledger().on_alloc(Mem::comm_buffers, static_cast<int64_t>(bytes));
  }

  ncclComm_t comm_;
  std::string label_;
  cudaStream_t compute_, stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  Backend& be_;
  double timeout_s_;
  int rank_ = 0, size_ = 1;
  bool aborted_ = false;
  void* barrier_buf_ = nullptr;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  std::vector<Pending> pending_;
  std::shared_ptr<P2pBatch> open_;
  int sends_ = 0, recvs_ = 0;
};

void NcclRequest::wait() {
  if (waited_) return;
  waited_ = true;
  if (!batch_->launched) comm_->flush_p2p(what_.c_str());
  comm_->wait_for(batch_->done, what_);
  comm_->compute_waits(batch_->done);
}

std::string group_label(const std::vector<int64_t>& ranks) {
  std::string s = "group {";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ranks[i]);
  }
  s += '}';
  return s;
}

class NcclWorld : public CommWorld {
 public:
  NcclWorld(std::unique_ptr<CommWorld> bootstrap, Backend& be) : boot_(std::move(bootstrap)), be_(be) {
    cudaStream_t compute = cuda_backend_stream(be);
    if (!compute) throw std::invalid_argument("the NCCL communicator needs the CUDA backend (got '" + be.name() + "')");
    const int rank = boot_ ? boot_->world().rank() : 0, size = boot_ ? boot_->world().size() : 1;
    world_rank_ = rank;
    ncclUniqueId id{};
    if (rank == 0) {
      ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) throw std::runtime_error(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
    }
#ifdef CTXPLAN_HAVE_MPI
    if (size > 1 && MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
      throw std::runtime_error("MPI_Bcast of the ncclUniqueId failed on world rank " + std::to_string(rank));
#else
    if (size > 1) throw std::logic_error("a multi-rank NCCL world needs MPI for its bootstrap");
#endif
    ncclComm_t c = nullptr;
    ncclResult_t r = ncclCommInitRank(&c, size, id, rank);
    if (r != ncclSuccess)
      throw std::runtime_error("ncclCommInitRank failed on world rank " + std::to_string(rank) + " of " +
                               std::to_string(size) + ": " + ncclGetErrorString(r));
    world_ = std::make_unique<NcclComm>(c, "world (world rank " + std::to_string(rank) + ")", compute, be);
  }
  ~NcclWorld() override {
    world_.reset();  // before MPI is finalised by the bootstrap world
    boot_.reset();
  }
  Comm& world() override { return *world_; }
  std::unique_ptr<Comm> split(const std::vector<int64_t>& ranks) override {
    const int color = static_cast<int>(*std::min_element(ranks.begin(), ranks.end()));
    const int key = static_cast<int>(std::find(ranks.begin(), ranks.end(), world_rank_) - ranks.begin());
    ncclComm_t c = nullptr;
    ncclResult_t r = ncclCommSplit(world_->handle(), color, key, &c, nullptr);
    if (r != ncclSuccess || !c)
      throw std::runtime_error("ncclCommSplit into " + group_label(ranks) + " failed on world rank " +
                               std::to_string(world_rank_) + ": " + ncclGetErrorString(r));
    return std::make_unique<NcclComm>(c, group_label(ranks) + " (world rank " + std::to_string(world_rank_) + ")",
                                      cuda_backend_stream(be_), be_);
  }

 private:
  std::unique_ptr<CommWorld> boot_;  // MPI world (owns MPI_Init/Finalize); null for one rank without MPI
  Backend& be_;
  int world_rank_ = 0;
  std::unique_ptr<NcclComm> world_;
};

}  // namespace

std::unique_ptr<CommWorld> make_nccl_world(int* argc, char*** argv, Backend& be) {
#ifdef CTXPLAN_HAVE_MPI
  return std::make_unique<NcclWorld>(make_world(argc, argv), be);
#else
  return std::make_unique<NcclWorld>(nullptr, be);
#endif
}

std::unique_ptr<CommWorld> make_nccl_single_rank_world(Backend& be) { return std::make_unique<NcclWorld>(nullptr, be); }

}  // namespace ctx::exec
