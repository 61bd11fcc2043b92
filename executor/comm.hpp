// The communicator interface: collectives over one process group, non-blocking point-to-point,
// barrier. Implementations: MPI (comm_mpi.cpp) and a single-process one (comm_self.cpp) so ctxrun
// and its tests build and run without MPI. Buffers are the backend's memory (host for the CPU
// backend; device memory for a CUDA/NCCL communicator later).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace ctx::exec {

class Request {
 public:
  virtual ~Request() = default;
  virtual void wait() = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void allreduce_sum(float* buf, int64_t n) = 0;
  virtual void allreduce_sum(double* buf, int64_t n) = 0;
  virtual void allreduce_max(float* buf, int64_t n) = 0;
  virtual void allreduce_max(int* buf, int64_t n) = 0;
  // recv holds size() blocks of n, in group order
  virtual void allgather(const float* send, float* recv, int64_t n) = 0;
  // send holds size() blocks of n; recv gets the sum of everyone's block rank()
  virtual void reduce_scatter(const float* send, float* recv, int64_t n) = 0;
  // send block j goes to rank j; recv block j came from rank j; n floats per block
  virtual void alltoall(const float* send, float* recv, int64_t n) = 0;
  virtual std::unique_ptr<Request> isend(const float* buf, int64_t n, int peer, int tag) = 0;
  virtual std::unique_ptr<Request> irecv(float* buf, int64_t n, int peer, int tag) = 0;
  virtual void broadcast(float* buf, int64_t n, int root) = 0;
  virtual void barrier() = 0;
};

// The process-wide communication context: the world and the factory of sub-groups.
class CommWorld {
 public:
  virtual ~CommWorld() = default;
  virtual Comm& world() = 0;
  // Collective over the world: every rank calls it with its own group's ranks (groups partition
  // the world, e.g. group_ranks(plan, Group::tp, rank)); returns this rank's communicator.
  virtual std::unique_ptr<Comm> split(const std::vector<int64_t>& my_group_ranks) = 0;
  // Ends every rank of the job now (one rank failed; the others may be blocked in a collective).
  // The default ends this process only, which is the whole job for a one-rank world.
  [[noreturn]] virtual void abort(int exit_code);
};

// MPI if built with it and launched under mpirun (initialises MPI), else a one-rank world.
std::unique_ptr<CommWorld> make_world(int* argc, char*** argv);
std::unique_ptr<CommWorld> make_self_world();
bool mpi_available();

}  // namespace ctx::exec
