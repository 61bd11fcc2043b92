// HostStagedComm: the strategy-facing Comm for CPU backends. Every operation is submitted to the
// backend's stream (run at once on synchronous backends, queued on the deferred one), so
// communication is ordered with compute exactly as NCCL on a CUDA stream would be; the host
// communicator sees the backend's own host addresses of the tensors. bf16 reductions are summed
// in fp32 and rounded once per element.
#include <memory>
#include <stdexcept>
#include <vector>

#include "executor/backend.hpp"
#include "executor/bf16.hpp"
#include "executor/comm.hpp"

namespace ctx::exec {

class HostStagedComm final : public Comm {
 public:
  HostStagedComm(Backend& be, std::unique_ptr<HostComm> host) : be_(be), host_(std::move(host)) {}
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  void allreduce_sum(View b) override { reduce(b, true); }
  void allreduce_max(View b) override { reduce(b, false); }
  void allgather(View send, View recv) override {
    need(send.dtype() == recv.dtype() && recv.numel() == send.numel() * size(), "allgather",
         "recv must hold size() blocks of send");
    void *s = be_.host_address(send), *r = be_.host_address(recv);
    const int64_t bytes = send.bytes();
    HostComm* h = host_.get();
    be_.submit([=] { h->allgather(s, r, bytes); });
  }
  void reduce_scatter(View send, View recv) override {
    need(send.numel() == recv.numel() * size(), "reduce_scatter", "send must hold size() blocks of recv");
    const int64_t n = recv.numel();
    HostComm* h = host_.get();
    if (send.dtype() == DType::f32 && recv.dtype() == DType::bf16) {  // fp32 sums rounded once into bf16
      auto* s = static_cast<float*>(be_.host_address(send));
      auto* r = static_cast<uint16_t*>(be_.host_address(recv));
      be_.submit([=] {
        std::vector<float> fr(n);
        h->reduce_scatter(s, fr.data(), n);
        for (int64_t i = 0; i < n; ++i) r[i] = f32_to_bf16(fr[i]);
      });
      return;
    }
    need(send.dtype() == recv.dtype(), "reduce_scatter", "dtypes differ (only f32 into bf16 is allowed)");
    if (send.dtype() == DType::f32) {
      auto* s = static_cast<float*>(be_.host_address(send));
      auto* r = static_cast<float*>(be_.host_address(recv));
      be_.submit([=] { h->reduce_scatter(s, r, n); });
      return;
    }
    need(send.dtype() == DType::bf16, "reduce_scatter", "sums f32 or bf16");
    auto* s = static_cast<uint16_t*>(be_.host_address(send));
    auto* r = static_cast<uint16_t*>(be_.host_address(recv));
    const int64_t total = send.numel();
    be_.submit([=] {
      std::vector<float> fs(total), fr(n);
      for (int64_t i = 0; i < total; ++i) fs[i] = bf16_to_f32(s[i]);
      h->reduce_scatter(fs.data(), fr.data(), n);
      for (int64_t i = 0; i < n; ++i) r[i] = f32_to_bf16(fr[i]);
    });
  }
  void alltoall(View send, View recv) override {
    need(send.dtype() == recv.dtype() && send.numel() == recv.numel() && send.numel() % size() == 0, "alltoall",
         "send and recv must be size() equal blocks");
    void *s = be_.host_address(send), *r = be_.host_address(recv);
    const int64_t bytes = send.bytes() / size();
    HostComm* h = host_.get();
    be_.submit([=] { h->alltoall(s, r, bytes); });
  }

  std::unique_ptr<Request> isend(View b, int peer, int tag) override {
    auto st = std::make_shared<std::unique_ptr<Request>>();
    const void* p = be_.host_address(b);
    const int64_t bytes = b.bytes();
    HostComm* h = host_.get();
    be_.submit([=] { *st = h->isend(p, bytes, peer, tag); });
    return std::make_unique<StagedRequest>(be_, st);
  }
  std::unique_ptr<Request> irecv(View b, int peer, int tag) override {
    auto st = std::make_shared<std::unique_ptr<Request>>();
    void* p = be_.host_address(b);
    const int64_t bytes = b.bytes();
    HostComm* h = host_.get();
    be_.submit([=] { *st = h->irecv(p, bytes, peer, tag); });
    return std::make_unique<StagedRequest>(be_, st);
  }

  void host_allreduce_max(int* buf, int64_t n) override {
    be_.synchronize();
    host_->allreduce_max(buf, n, HostType::i32);
  }
  void host_allreduce_sum(double* buf, int64_t n) override {
    be_.synchronize();
    host_->allreduce_sum(buf, n, HostType::f64);
  }
  void barrier() override {
    be_.synchronize();
    host_->barrier();
  }

 private:
  // A transfer posted in the stream; wait() is stream-ordered too. An unwaited request is waited
  // when dropped (MPI requires every request to complete).
  class StagedRequest final : public Request {
   public:
    StagedRequest(Backend& be, std::shared_ptr<std::unique_ptr<Request>> st) : be_(be), st_(std::move(st)) {}
    ~StagedRequest() override {
      if (!waited_) {
        try {
          wait();
        } catch (...) {
        }
      }
    }
    void wait() override {
      waited_ = true;
      auto st = st_;
      be_.submit([st] {
        if (*st) (*st)->wait();
      });
    }

   private:
    Backend& be_;
    std::shared_ptr<std::unique_ptr<Request>> st_;
    bool waited_ = false;
  };

  static void need(bool ok, const char* op, const char* what) {
    if (!ok) throw std::logic_error(std::string("comm: ") + op + ": " + what);
  }
  void reduce(View b, bool sum) {
    HostComm* h = host_.get();
    const int64_t n = b.numel();
    if (b.dtype() == DType::f32) {
      void* p = be_.host_address(b);
      be_.submit([=] { sum ? h->allreduce_sum(p, n, HostType::f32) : h->allreduce_max(p, n, HostType::f32); });
      return;
    }
    need(b.dtype() == DType::bf16, sum ? "allreduce_sum" : "allreduce_max", "reduces f32 or bf16");
    auto* p = static_cast<uint16_t*>(be_.host_address(b));
    be_.submit([=] {
      std::vector<float> f(n);
      for (int64_t i = 0; i < n; ++i) f[i] = bf16_to_f32(p[i]);
      sum ? h->allreduce_sum(f.data(), n, HostType::f32) : h->allreduce_max(f.data(), n, HostType::f32);
      for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(f[i]);
    });
  }

  Backend& be_;
  std::unique_ptr<HostComm> host_;
};

std::unique_ptr<Comm> make_host_staged_comm(Backend& be, std::unique_ptr<HostComm> host) {
  return std::make_unique<HostStagedComm>(be, std::move(host));
}

}  // namespace ctx::exec
