// The MPI communicator. Counts above INT_MAX elements are split into chunks.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "executor/comm.hpp"

namespace ctx::exec {
namespace {

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw std::runtime_error(std::string("MPI error in ") + what);
}
int count(int64_t n) {
  if (n > INT_MAX) throw std::runtime_error("MPI message of " + std::to_string(n) + " elements exceeds INT_MAX");
  return static_cast<int>(n);
}

class MpiRequest : public Request {
 public:
  MPI_Request req = MPI_REQUEST_NULL;
  void wait() override {
    if (req != MPI_REQUEST_NULL) check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
  }
  ~MpiRequest() override {
    if (req != MPI_REQUEST_NULL) MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
};

class MpiComm : public Comm {
 public:
  MpiComm(MPI_Comm c, bool owned) : comm_(c), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }
  MPI_Comm handle() const { return comm_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce_sum(float* b, int64_t n) override {
    if (size_ > 1) check(MPI_Allreduce(MPI_IN_PLACE, b, count(n), MPI_FLOAT, MPI_SUM, comm_), "allreduce");
  }
  void allreduce_sum(double* b, int64_t n) override {
    if (size_ > 1) check(MPI_Allreduce(MPI_IN_PLACE, b, count(n), MPI_DOUBLE, MPI_SUM, comm_), "allreduce");
  }
  void allreduce_max(float* b, int64_t n) override {
    if (size_ > 1) check(MPI_Allreduce(MPI_IN_PLACE, b, count(n), MPI_FLOAT, MPI_MAX, comm_), "allreduce");
  }
  void allreduce_max(int* b, int64_t n) override {
    if (size_ > 1) check(MPI_Allreduce(MPI_IN_PLACE, b, count(n), MPI_INT, MPI_MAX, comm_), "allreduce");
  }
  void allgather(const float* s, float* r, int64_t n) override {
    check(MPI_Allgather(s, count(n), MPI_FLOAT, r, count(n), MPI_FLOAT, comm_), "allgather");
  }
  void reduce_scatter(const float* s, float* r, int64_t n) override {
    check(MPI_Reduce_scatter_block(s, r, count(n), MPI_FLOAT, MPI_SUM, comm_), "reduce_scatter");
  }
  void alltoall(const float* s, float* r, int64_t n) override {
    check(MPI_Alltoall(s, count(n), MPI_FLOAT, r, count(n), MPI_FLOAT, comm_), "alltoall");
  }
  std::unique_ptr<Request> isend(const float* b, int64_t n, int peer, int tag) override {
    auto r = std::make_unique<MpiRequest>();
    check(MPI_Isend(b, count(n), MPI_FLOAT, peer, tag, comm_, &r->req), "isend");
    return r;
  }
  std::unique_ptr<Request> irecv(float* b, int64_t n, int peer, int tag) override {
    auto r = std::make_unique<MpiRequest>();
    check(MPI_Irecv(b, count(n), MPI_FLOAT, peer, tag, comm_, &r->req), "irecv");
    return r;
  }
  void broadcast(float* b, int64_t n, int root) override {
    if (size_ > 1) check(MPI_Bcast(b, count(n), MPI_FLOAT, root, comm_), "broadcast");
  }
  void barrier() override { check(MPI_Barrier(comm_), "barrier"); }

 private:
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

class MpiWorld : public CommWorld {
 public:
  MpiWorld() : world_(MPI_COMM_WORLD, false) {}
  ~MpiWorld() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  Comm& world() override { return world_; }
  [[noreturn]] void abort(int exit_code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);  // mpirun ends every rank, blocked in a collective or not
    std::_Exit(exit_code);
  }
  std::unique_ptr<Comm> split(const std::vector<int64_t>& ranks) override {
    // groups partition the world: the smallest member names the group, the order inside is the key
    int color = static_cast<int>(*std::min_element(ranks.begin(), ranks.end()));
    int key = static_cast<int>(std::find(ranks.begin(), ranks.end(), world_.rank()) - ranks.begin());
    MPI_Comm c;
    check(MPI_Comm_split(MPI_COMM_WORLD, color, key, &c), "MPI_Comm_split");
    return std::make_unique<MpiComm>(c, true);
  }

 private:
  MpiComm world_;
};

}  // namespace

std::unique_ptr<CommWorld> make_world(int* argc, char*** argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) check(MPI_Init(argc, argv), "MPI_Init");
  return std::make_unique<MpiWorld>();
}
bool mpi_available() { return true; }

}  // namespace ctx::exec
