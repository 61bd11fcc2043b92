// Communication in two layers.
//
//   HostComm   one process group over host memory: MPI (comm_mpi.cpp) or a single process
//              (comm_self.cpp). Blocking collectives, non-blocking point-to-point.
//   Comm       what strategy code calls: collectives and ring p2p on tensor views, ordered with the
//              backend's ops (stream order). HostStagedComm (comm_staged.cpp) runs a HostComm in the
//              backend's stream for CPU backends; a CUDA backend uses NCCL on its own streams.
//
// Collectives on views: recv of allgather holds size() blocks of send.numel() in group order;
// reduce_scatter's send holds size() blocks, recv gets the sum of everyone's block rank(); alltoall
// sends block j to rank j. Reductions sum f32 or bf16 (bf16 summed in fp32, rounded once);
// reduce_scatter may also sum an f32 send into a bf16 recv (fp32 dK, dV into bf16 gradients).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "executor/tensor.hpp"

namespace ctx::exec {

class Request {
 public:
  virtual ~Request() = default;
  virtual void wait() = 0;  // stream-ordered: later ops see the transfer done
};

enum class HostType { f32, f64, i32, byte };

class HostComm {
 public:
  virtual ~HostComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void allreduce_sum(void* buf, int64_t n, HostType t) = 0;
  virtual void allreduce_max(void* buf, int64_t n, HostType t) = 0;
  virtual void allgather(const void* send, void* recv, int64_t bytes) = 0;      // bytes per rank
  virtual void reduce_scatter(const float* send, float* recv, int64_t n) = 0;  // n floats per rank
  virtual void alltoall(const void* send, void* recv, int64_t bytes) = 0;       // bytes per block
  virtual std::unique_ptr<Request> isend(const void* buf, int64_t bytes, int peer, int tag) = 0;
  virtual std::unique_ptr<Request> irecv(void* buf, int64_t bytes, int peer, int tag) = 0;
  virtual void broadcast(void* buf, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void allreduce_sum(View buf) = 0;
  virtual void allreduce_max(View buf) = 0;
  virtual void allgather(View send, View recv) = 0;
  virtual void reduce_scatter(View send, View recv) = 0;
  virtual void alltoall(View send, View recv) = 0;
  virtual std::unique_ptr<Request> isend(View buf, int peer, int tag) = 0;
  virtual std::unique_ptr<Request> irecv(View buf, int peer, int tag) = 0;
  // The host control path (blocking; waits for the stream first): flags, step counters.
  virtual void host_allreduce_max(int* buf, int64_t n) = 0;
  virtual void host_allreduce_sum(double* buf, int64_t n) = 0;
  virtual void barrier() = 0;

 protected:
  static void* raw(const View& v) { return v.p_; }
};

// The process-wide communication context: the world and the factory of sub-groups.
class CommWorld {
 public:
  virtual ~CommWorld() = default;
  virtual HostComm& world() = 0;
  // Collective over the world: every rank calls it with its own group's ranks (groups partition
  // the world, e.g. group_ranks(plan, Group::tp, rank)); returns this rank's communicator.
  virtual std::unique_ptr<HostComm> split(const std::vector<int64_t>& my_group_ranks) = 0;
  // Ends every rank of the job now (one rank failed; the others may be blocked in a collective).
  // The default ends this process only, which is the whole job for a one-rank world.
  [[noreturn]] virtual void abort(int exit_code);
};

// MPI if built with it and launched under mpirun (initialises MPI with thread support, since the
// deferred backend communicates from its worker thread), else a one-rank world.
std::unique_ptr<CommWorld> make_world(int* argc, char*** argv);
std::unique_ptr<CommWorld> make_self_world();
bool mpi_available();

class Backend;
// A Comm over a HostComm for backends whose memory the host can reach through the backend (CPU
// backends): every operation is submitted to the backend's stream.
std::unique_ptr<Comm> make_host_staged_comm(Backend& be, std::unique_ptr<HostComm> host);

}  // namespace ctx::exec
