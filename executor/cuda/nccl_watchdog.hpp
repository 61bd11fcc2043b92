// The NCCL watchdog: a rank whose communication fails or stalls ends the job within a bounded
// time, with a message, instead of hanging every rank forever.
//
//   what it watches   every communicator registers (WatchedComm: its label, its asynchronous
//                     error, its abort) and every operation it enqueues (track(): two probes,
//                     "has it started on the device" and "has it finished", which the NCCL
//                     communicator answers with cudaEventQuery on events recorded before and
//                     after the operation on its stream).
//   how               one thread per process polls every `poll_s`: each communicator's
//                     asynchronous error (ncclCommGetAsyncError), and each communicator's
//                     oldest unfinished operation (its stream runs them in order). An operation
//                     that has run longer than `timeout_s` since it was seen to start (so time
//                     spent queued behind compute is not counted), or an error, fails the job.
//   failure           fail(): the first failure wins; the default action aborts every registered
//                     communicator (ncclCommAbort, which unblocks the other threads and the GPU
//                     kernels), prints one message naming the operation, the group and rank, how
//                     long it ran and the error, and exits with kExitInternal (1: "ctxrun: a rank
//                     failed"). ncclCommAbort can itself hang (NCCL issue 829): a reaper exits
//                     after `abort_grace_s` regardless. The other ranks then fail the same way
//                     (their operations with this rank never finish) or are killed by mpirun.
//   configuration     CTXPLAN_NCCL_TIMEOUT_S (default 300), CTXPLAN_NCCL_POLL_MS (default 100),
//                     CTXPLAN_NCCL_ABORT_GRACE_S (default 30); tests pass Options and a handler.
//
// Plain C++: no CUDA or NCCL here, so the policy is tested on the CPU with fake communicators
// (tests/test_nccl_watchdog.cpp, label cpu). The NCCL side (comm_nccl.cpp) ran as one rank on one H200 (2026-11-28); a real hang is untested.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ctx::exec::cuda {

// What the watchdog asks of a communicator. Called from the watchdog thread.
class WatchedComm {
 public:
  virtual ~WatchedComm() = default;
  virtual std::string label() const = 0;  // e.g. "rank 3 of 8 of NCCL group dp"
  virtual std::string async_error() = 0;  // empty when healthy (ncclSuccess or ncclInProgress)
  virtual void abort() = 0;               // ncclCommAbort; must be safe to call from another thread
};

enum class Probe { not_yet, done, error };

struct WatchdogOptions {
  double timeout_s = 300;     // an operation may run this long once started
  double poll_s = 0.1;        // how often the thread looks
  double abort_grace_s = 30;  // the default action exits after this even if ncclCommAbort hangs
  // What a failure does: nullptr is the default (abort every communicator, print, exit 1).
  std::function<void(const std::string& message)> on_failure;
};

// Options from CTXPLAN_NCCL_TIMEOUT_S, CTXPLAN_NCCL_POLL_MS, CTXPLAN_NCCL_ABORT_GRACE_S.
WatchdogOptions watchdog_options_from_env();

class Watchdog {
 public:
  explicit Watchdog(WatchdogOptions o);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The process's watchdog (options from the environment), started on first use.
  static Watchdog& process();

  void add(WatchedComm* c);
  void remove(WatchedComm* c);  // after this returns the thread no longer touches c
  // An operation of `c`, in its stream order. `started`/`finished` are polled from the watchdog
  // thread until finished() is done; `retire` runs (on the watchdog thread or in remove()) when
  // the operation is no longer watched, to recycle its events.
  void track(WatchedComm* c, std::string op, std::function<Probe()> started, std::function<Probe()> finished,
             std::function<void()> retire = {});
  // Fails the job now (any thread; the first call wins). With the default action it does not return.
  void fail(const std::string& message);

  double timeout_s() const { return opt_.timeout_s; }
  bool failed() const { return failed_.load(); }
  size_t outstanding(WatchedComm* c);  // operations of c still watched (tests)

 private:
  struct Op {
    std::string name;
    std::function<Probe()> started, finished;
    std::function<void()> retire;
    std::chrono::steady_clock::time_point enqueued;
    bool seen_started = false;
    std::chrono::steady_clock::time_point started_at;
  };
  struct Entry {
    WatchedComm* comm;
    std::deque<Op> ops;
  };
  void run();
  void check_locked(std::vector<std::string>& failures);
  void default_failure(const std::string& message);

  WatchdogOptions opt_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> entries_;
  std::atomic<bool> failed_{false};
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ctx::exec::cuda
