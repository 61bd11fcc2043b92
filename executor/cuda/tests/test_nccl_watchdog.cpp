// The NCCL watchdog's policy on the CPU (label cpu): fake communicators and fake operations whose
// start and end the test controls. A stalled operation or an asynchronous error must end the job
// within a bounded time with a message naming the operation, the group and rank, and how long it
// ran; the default action aborts every communicator and exits 1 (kExitInternal).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "costmodel/exit_codes.hpp"
#include "executor/cuda/nccl_watchdog.hpp"

namespace ctx::exec::cuda {
namespace {

using Clock = std::chrono::steady_clock;

struct FakeComm : WatchedComm {
  std::string name;
  std::mutex mu;
  std::string error;  // what ncclCommGetAsyncError would report
  std::atomic<int> aborts{0};
  explicit FakeComm(std::string n) : name(std::move(n)) {}
  std::string label() const override { return name; }
  std::string async_error() override {
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }
  void abort() override { ++aborts; }
};

// An operation whose device progress the test sets.
struct FakeOp {
  std::atomic<Probe> started{Probe::not_yet}, finished{Probe::not_yet};
  std::atomic<int> retired{0};
};

void track(Watchdog& w, FakeComm& c, const std::string& name, std::shared_ptr<FakeOp> op) {
  w.track(
      &c, name, [op] { return op->started.load(); }, [op] { return op->finished.load(); }, [op] { ++op->retired; });
}

struct Captured {
  std::mutex mu;
  std::string message;
  Clock::time_point when;
  std::atomic<bool> fired{false};
};

WatchdogOptions capture(Captured& cap, double timeout_s) {
  WatchdogOptions o;
  o.timeout_s = timeout_s;
  o.poll_s = 0.01;
  o.on_failure = [&cap](const std::string& m) {
    std::lock_guard<std::mutex> lock(cap.mu);
    cap.message = m;
    cap.when = Clock::now();
    cap.fired = true;
  };
  return o;
}

bool wait_for(const std::atomic<bool>& flag, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (!flag.load() && Clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return flag.load();
}

TEST(NcclWatchdog, AStalledOperationFailsWithinTheTimeoutNamingOpGroupAndRank) {
  Captured cap;
  Watchdog w(capture(cap, 0.3));
  FakeComm c("rank 2 of 4 of NCCL group 'dp' (world rank 6)");
  w.add(&c);
  auto done = std::make_shared<FakeOp>();
  done->started = Probe::done;
  done->finished = Probe::done;
  track(w, c, "allreduce_sum of 4096 bytes", done);
  auto stuck = std::make_shared<FakeOp>();
  track(w, c, "reduce_scatter of 1048576 bytes", stuck);
  // queued behind compute: not counted against the limit
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_FALSE(cap.fired.load()) << cap.message;
  EXPECT_EQ(done->retired.load(), 1);  // the finished one was retired, its events recycled
  const auto t0 = Clock::now();
  stuck->started = Probe::done;  // now it runs on the device, and never finishes
  ASSERT_TRUE(wait_for(cap.fired, 5.0)) << "no failure reported";
  const double after = std::chrono::duration<double>(cap.when - t0).count();
  EXPECT_GE(after, 0.3);
  EXPECT_LT(after, 1.5);  // bounded: the limit plus a few polls
  const std::string& m = cap.message;
  EXPECT_NE(m.find("reduce_scatter of 1048576 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 2 of 4 of NCCL group 'dp' (world rank 6)"), std::string::npos) << m;
  EXPECT_NE(m.find("has run 0."), std::string::npos) << m;  // how long it ran, in seconds
  EXPECT_NE(m.find("CTXPLAN_NCCL_TIMEOUT_S"), std::string::npos) << m;
  w.remove(&c);
  EXPECT_EQ(stuck->retired.load(), 1);
}

TEST(NcclWatchdog, AnAsynchronousErrorFailsAtTheNextPoll) {
  Captured cap;
  Watchdog w(capture(cap, 100.0));
  FakeComm a("rank 0 of 2 of NCCL group 'cp ring'"), b("rank 1 of 8 of NCCL group 'dp'");
  w.add(&a);
  w.add(&b);
  auto op = std::make_shared<FakeOp>();
  op->started = Probe::done;
  track(w, b, "point-to-point batch (send to 2, recv from 0), 8192 bytes", op);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(cap.fired.load());
  const auto t0 = Clock::now();
  {
    std::lock_guard<std::mutex> lock(b.mu);
    b.error = "remote process exited or there was a network error (NET/IB : Got completion with error 12)";
  }
  ASSERT_TRUE(wait_for(cap.fired, 5.0));
  EXPECT_LT(std::chrono::duration<double>(cap.when - t0).count(), 0.5);
  const std::string& m = cap.message;
  EXPECT_NE(m.find("rank 1 of 8 of NCCL group 'dp'"), std::string::npos) << m;
  EXPECT_NE(m.find("point-to-point batch (send to 2, recv from 0)"), std::string::npos) << m;
  EXPECT_NE(m.find("Got completion with error 12"), std::string::npos) << m;
  EXPECT_EQ(m.find("cp ring"), std::string::npos) << m;  // the healthy communicator is not blamed
  w.remove(&a);
  w.remove(&b);
}

TEST(NcclWatchdog, ACudaErrorOnTheStreamFails) {
  Captured cap;
  Watchdog w(capture(cap, 100.0));
  FakeComm c("rank 0 of 1 of NCCL group 'tp'");
  w.add(&c);
  auto op = std::make_shared<FakeOp>();
  op->started = Probe::done;
  op->finished = Probe::error;
  track(w, c, "allgather of 64 bytes", op);
  ASSERT_TRUE(wait_for(cap.fired, 5.0));
  EXPECT_NE(cap.message.find("allgather of 64 bytes"), std::string::npos) << cap.message;
  EXPECT_NE(cap.message.find("CUDA error"), std::string::npos) << cap.message;
  w.remove(&c);
}

TEST(NcclWatchdog, HealthyTrafficNeverFails) {
  Captured cap;
  Watchdog w(capture(cap, 0.2));
  FakeComm c("rank 0 of 2 of NCCL group 'dp'");
  w.add(&c);
  std::vector<std::shared_ptr<FakeOp>> ops;
  for (int i = 0; i < 50; ++i) {
    auto op = std::make_shared<FakeOp>();
    track(w, c, "allreduce_sum " + std::to_string(i), op);
    ops.push_back(op);
  }
  // each runs 20 ms, well under the limit; 50 of them take far longer than the limit in total
  for (auto& op : ops) {
    op->started = Probe::done;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    op->finished = Probe::done;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(cap.fired.load()) << cap.message;
  EXPECT_EQ(w.outstanding(&c), 0u);
  w.remove(&c);
}

TEST(NcclWatchdog, OnlyTheFirstFailureActs) {
  Captured cap;
  Watchdog w(capture(cap, 100.0));
  w.fail("first");
  w.fail("second");
  EXPECT_EQ(cap.message, "first");
  EXPECT_TRUE(w.failed());
}

// The default action: every communicator aborted, one message, exit code 1.
TEST(NcclWatchdogDeathTest, DefaultActionAbortsAndExitsWithTheInternalCode) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        WatchdogOptions o;
        o.timeout_s = 0.1;
        o.poll_s = 0.01;
        o.abort_grace_s = 5;
        Watchdog w(o);
        struct AbortPrinter : FakeComm {
          using FakeComm::FakeComm;
          void abort() override { std::fprintf(stderr, "aborted %s\n", name.c_str()); }
        } c("rank 3 of 4 of NCCL group 'dp'");
        w.add(&c);
        auto op = std::make_shared<FakeOp>();
        op->started = Probe::done;
        track(w, c, "allreduce_sum of 4 bytes", op);
        std::this_thread::sleep_for(std::chrono::seconds(10));  // killed long before
      },
      ::testing::ExitedWithCode(ctx::kExitInternal),
      "NCCL allreduce_sum of 4 bytes on rank 3 of 4 of NCCL group 'dp' did not complete(.|\n)*aborted rank 3 of 4");
}

// ncclCommAbort can hang: the job still ends after the grace period.
TEST(NcclWatchdogDeathTest, AHangingAbortStillEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        WatchdogOptions o;
        o.timeout_s = 0.05;
        o.poll_s = 0.01;
        o.abort_grace_s = 0.3;
        Watchdog w(o);
        struct HangingAbort : FakeComm {
          using FakeComm::FakeComm;
          void abort() override { std::this_thread::sleep_for(std::chrono::seconds(60)); }
        } c("rank 0 of 2 of NCCL group 'dp'");
        w.add(&c);
        auto op = std::make_shared<FakeOp>();
        op->started = Probe::done;
        track(w, c, "alltoall of 8 bytes", op);
        std::this_thread::sleep_for(std::chrono::seconds(30));
      },
      ::testing::ExitedWithCode(ctx::kExitInternal), "ncclCommAbort did not return within");
}

}  // namespace
}  // namespace ctx::exec::cuda
