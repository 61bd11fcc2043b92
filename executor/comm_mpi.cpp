// The MPI host communicator (byte moves, float/double/int reductions). A message over INT_MAX elements is refused with an error.
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

MPI_Datatype mpi_type(HostType t) {
  switch (t) {
    case HostType::f32: return MPI_FLOAT;
    case HostType::f64: return MPI_DOUBLE;
    case HostType::i32: return MPI_INT;
    case HostType::byte: return MPI_BYTE;
  }
  return MPI_BYTE;
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

class MpiComm : public HostComm {
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
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce_sum(void* b, int64_t n, HostType t) override {
    if (size_ > 1) check(MPI_Allreduce(MPI_IN_PLACE, b, count(n), mpi_type(t), MPI_SUM, comm_), "allreduce");
  }
  void allreduce_max(void* b, int64_t n, HostType t) override {
    if (size_ > 1) check(MPI_Allreduce(MPI_IN_PLACE, b, count(n), mpi_type(t), MPI_MAX, comm_), "allreduce");
  }
  void allgather(const void* s, void* r, int64_t bytes) override {
    check(MPI_Allgather(s, count(bytes), MPI_BYTE, r, count(bytes), MPI_BYTE, comm_), "allgather");
  }
  void reduce_scatter(const float* s, float* r, int64_t n) override {
    check(MPI_Reduce_scatter_block(s, r, count(n), MPI_FLOAT, MPI_SUM, comm_), "reduce_scatter");
  }
  void alltoall(const void* s, void* r, int64_t bytes) override {
    check(MPI_Alltoall(s, count(bytes), MPI_BYTE, r, count(bytes), MPI_BYTE, comm_), "alltoall");
  }
  std::unique_ptr<Request> isend(const void* b, int64_t bytes, int peer, int tag) override {
    auto r = std::make_unique<MpiRequest>();
    check(MPI_Isend(b, count(bytes), MPI_BYTE, peer, tag, comm_, &r->req), "isend");
    return r;
  }
  std::unique_ptr<Request> irecv(void* b, int64_t bytes, int peer, int tag) override {
    auto r = std::make_unique<MpiRequest>();
    check(MPI_Irecv(b, count(bytes), MPI_BYTE, peer, tag, comm_, &r->req), "irecv");
    return r;
  }
  void broadcast(void* b, int64_t bytes, int root) override {
    if (size_ > 1) check(MPI_Bcast(b, count(bytes), MPI_BYTE, root, comm_), "broadcast");
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
  HostComm& world() override { return world_; }
  [[noreturn]] void abort(int exit_code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);  // mpirun ends every rank, blocked in a collective or not
    std::_Exit(exit_code);
  }
  std::unique_ptr<HostComm> split(const std::vector<int64_t>& ranks) override {
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
  if (!inited) {
    // the deferred backend communicates from its worker thread while the main thread may too
    int provided = 0;
    check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    if (provided < MPI_THREAD_MULTIPLE)
      std::fprintf(stderr, "ctxrun: MPI provides thread level %d < MPI_THREAD_MULTIPLE: use a synchronous backend\n",
                   provided);
  }
  return std::make_unique<MpiWorld>();
}
bool mpi_available() { return true; }

}  // namespace ctx::exec
