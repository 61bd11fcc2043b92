// The executor's contract, as properties: strategy code cannot dereference a tensor (a compile-time
// fact), cpu-guarded memory faults on any host access outside the backend, and cpu-deferred really
// runs ops later (an op's error surfaces only at the next synchronisation, its results only after it).
#include <gtest/gtest.h>

#include <vector>

#include "executor/backend.hpp"
#include "executor/comm.hpp"

using namespace ctx;
using namespace ctx::exec;

namespace {

// A tensor's address is private: no data(), no pointer member reachable outside Backend and Comm.
template <class T>
concept HostReadable = requires(T t) { t.data(); };
static_assert(!HostReadable<Tensor>, "Tensor must not expose its memory to strategy code");
static_assert(!HostReadable<View>, "View must not expose its memory to strategy code");
template <class T>
concept PointerVisible = requires(T t) { t.p_; };
static_assert(!PointerVisible<View>, "View's pointer must be private");

// Only a Comm (or a Backend) may see where a view lives; this test plays one to attempt a stray access.
struct Peek : Comm {
  static volatile float* address(const View& v) { return static_cast<volatile float*>(Comm::raw(v)); }
};

TEST(OpaqueTensors, GuardedMemoryFaultsOnHostAccessOutsideTheBackend) {
  auto be = make_cpu_backend(CpuMode::guarded);
  Tensor t = be->alloc(4, 4, DType::f32, Mem::workspace);
  std::vector<float> ones(16, 1.0f);
  be->upload(t, ones.data());
  EXPECT_DEATH({ float x = *Peek::address(t); (void)x; }, "");  // a host read faults
  EXPECT_DEATH({ *Peek::address(t) = 2.0f; }, "");              // so does a host write
  std::vector<float> back(16);
  be->download(back.data(), t);  // through the backend, the same memory is there
  EXPECT_EQ(back, ones);
}

TEST(OpaqueTensors, PlainCpuMemoryIsTheControl) {
  auto be = make_cpu_backend(CpuMode::plain);
  Tensor t = be->alloc(1, 1, DType::f32, Mem::workspace);
  *Peek::address(t) = 3.0f;  // the same access the guarded backend refuses
  float back = 0;
  be->download(&back, t);
  EXPECT_EQ(back, 3.0f);
}

TEST(OpaqueTensors, DeferredBackendRunsOpsLaterAndReportsTheirErrorsAtSynchronisation) {
  auto be = make_cpu_backend(CpuMode::deferred);
  Tensor a = be->alloc(2, 3, DType::f32, Mem::workspace), b = be->alloc(2, 2, DType::f32, Mem::workspace);
  Tensor c = be->alloc(2, 2, DType::f32, Mem::workspace);
  std::vector<float> va = {1, 2, 3, 4, 5, 6};
  be->upload(a, va.data());
  be->gemm(false, false, 1.0f, a, b, 0.0f, c);  // [2,3] x [2,2]: inner sizes differ; queued, not run yet
  std::vector<float> out(4);
  EXPECT_THROW(be->download(out.data(), c), std::logic_error);  // the queued op's error, at synchronisation
  // the stream goes on: a correct chain gives the plain backend's results
  auto ref = make_cpu_backend(CpuMode::plain);
  Tensor ra = ref->alloc(2, 3, DType::f32, Mem::workspace), rc = ref->alloc(2, 2, DType::f32, Mem::workspace);
  ref->upload(ra, va.data());
  for (Backend* x : {be.get(), ref.get()}) {
    const View A = x == be.get() ? View(a) : View(ra), C = x == be.get() ? View(c) : View(rc);
    x->gemm(false, true, 1.0f, A, A, 0.0f, C);  // A A^T
    x->scale(C, 0.5f);
  }
  std::vector<float> got(4), want(4);
  be->download(got.data(), c);
  ref->download(want.data(), rc);
  EXPECT_EQ(got, want);
  EXPECT_EQ(want[0], 7.0f);  // (1 + 4 + 9) / 2
}

}  // namespace
