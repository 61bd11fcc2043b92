// A one-rank communicator: collectives are copies; a send to oneself is matched by the receive.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <vector>

#include "executor/comm.hpp"

namespace ctx::exec {

void CommWorld::abort(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(exit_code);
}

namespace {

class Done : public Request {
 public:
  void wait() override {}
};

class SelfComm : public HostComm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(void*, int64_t, HostType) override {}
  void allreduce_max(void*, int64_t, HostType) override {}
  void allgather(const void* s, void* r, int64_t bytes) override { if (s != r) std::memmove(r, s, bytes); }
  void reduce_scatter(const float* s, float* r, int64_t n) override { if (s != r) std::memmove(r, s, n * sizeof(float)); }
  void alltoall(const void* s, void* r, int64_t bytes) override { if (s != r) std::memmove(r, s, bytes); }
  std::unique_ptr<Request> isend(const void* buf, int64_t bytes, int, int tag) override {
    const char* b = static_cast<const char*>(buf);
    pending_[tag].assign(b, b + bytes);
    return std::make_unique<Done>();
  }
  std::unique_ptr<Request> irecv(void* buf, int64_t bytes, int, int tag) override {
    auto it = pending_.find(tag);
    if (it == pending_.end() || static_cast<int64_t>(it->second.size()) != bytes)
      throw std::logic_error("self communicator: receive without a matching send");
    std::memcpy(buf, it->second.data(), bytes);
    pending_.erase(it);
    return std::make_unique<Done>();
  }
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}

 private:
  std::map<int, std::vector<char>> pending_;
};

class SelfWorld : public CommWorld {
 public:
  HostComm& world() override { return comm_; }
  std::unique_ptr<HostComm> split(const std::vector<int64_t>&) override { return std::make_unique<SelfComm>(); }

 private:
  SelfComm comm_;
};

}  // namespace

std::unique_ptr<CommWorld> make_self_world() { return std::make_unique<SelfWorld>(); }

#ifndef CTXPLAN_HAVE_MPI
std::unique_ptr<CommWorld> make_world(int*, char***) { return make_self_world(); }
bool mpi_available() { return false; }
#endif

}  // namespace ctx::exec
