// The NCCL watchdog (design in nccl_watchdog.hpp). Verified on the CPU with fake communicators.
#include "executor/cuda/nccl_watchdog.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "costmodel/exit_codes.hpp"

namespace ctx::exec::cuda {
namespace {

double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const double d = std::strtod(v, &end);
  return end != v && d > 0 ? d : fallback;
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

}  // namespace

WatchdogOptions watchdog_options_from_env() {
  WatchdogOptions o;
  o.timeout_s = env_double("CTXPLAN_NCCL_TIMEOUT_S", 300.0);
  o.poll_s = env_double("CTXPLAN_NCCL_POLL_MS", 100.0) * 1e-3;
  o.abort_grace_s = env_double("CTXPLAN_NCCL_ABORT_GRACE_S", 30.0);
  return o;
}

Watchdog::Watchdog(WatchdogOptions o) : opt_(std::move(o)) { thread_ = std::thread([this] { run(); }); }

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (Entry& e : entries_)
    for (Op& op : e.ops)
      if (op.retire) op.retire();
}

Watchdog& Watchdog::process() {
  // Never destroyed: communicators may outlive static destruction order; the thread is parked.
  static Watchdog* w = new Watchdog(watchdog_options_from_env());
  return *w;
}

void Watchdog::add(WatchedComm* c) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back({c, {}});
}

void Watchdog::remove(WatchedComm* c) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].comm != c) continue;
    for (Op& op : entries_[i].ops)
      if (op.retire) op.retire();
    entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
    return;
  }
}

void Watchdog::track(WatchedComm* c, std::string op, std::function<Probe()> started, std::function<Probe()> finished,
                     std::function<void()> retire) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Entry& e : entries_) {
    if (e.comm != c) continue;
    Op o;
    o.name = std::move(op);
    o.started = std::move(started);
    o.finished = std::move(finished);
    o.retire = std::move(retire);
    o.enqueued = std::chrono::steady_clock::now();
    e.ops.push_back(std::move(o));
    return;
  }
  if (retire) retire();  // an unregistered communicator: nothing to watch
}

size_t Watchdog::outstanding(WatchedComm* c) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Entry& e : entries_)
    if (e.comm == c) return e.ops.size();
  return 0;
}

void Watchdog::check_locked(std::vector<std::string>& failures) {
  const auto now = std::chrono::steady_clock::now();
  for (Entry& e : entries_) {
    const std::string err = e.comm->async_error();
    if (!err.empty()) {
      std::string what = e.ops.empty() ? std::string("no operation outstanding") : "during " + e.ops.front().name;
      failures.push_back("NCCL asynchronous error on " + e.comm->label() + " (" + what + "): " + err);
      continue;
    }
    // the stream runs a communicator's operations in order: retire the finished ones, then judge
    // the oldest unfinished one
    while (!e.ops.empty()) {
      Op& op = e.ops.front();
      const Probe f = op.finished();
      if (f == Probe::done) {
        if (op.retire) op.retire();
        e.ops.pop_front();
        continue;
      }
      const double queued = std::chrono::duration<double>(now - op.enqueued).count();
      if (f == Probe::error) {
        failures.push_back("NCCL " + op.name + " on " + e.comm->label() + " failed on the device after " +
                           seconds(queued) + " (a CUDA error on its stream)");
        break;
      }
      if (!op.seen_started) {
        const Probe s = op.started();
        if (s == Probe::done) {
          op.seen_started = true;
          op.started_at = now;
        } else if (s == Probe::error) {
          failures.push_back("NCCL " + op.name + " on " + e.comm->label() + " could not start (a CUDA error on its stream)");
          break;
        }
      }
      if (op.seen_started) {
        const double ran = std::chrono::duration<double>(now - op.started_at).count();
        if (ran > opt_.timeout_s)
          failures.push_back("NCCL " + op.name + " on " + e.comm->label() + " did not complete: it has run " +
                             seconds(ran) + " (enqueued " + seconds(queued) + " ago; the limit is " +
                             seconds(opt_.timeout_s) +
                             ", CTXPLAN_NCCL_TIMEOUT_S); a peer is missing, hung, or posted a different operation");
      }
      break;
    }
  }
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::duration<double>(opt_.poll_s));
    if (stop_ || failed_.load()) continue;
    std::vector<std::string> failures;
    check_locked(failures);
    if (failures.empty()) continue;
    std::string msg = failures.front();
    for (size_t i = 1; i < failures.size(); ++i) msg += "; also: " + failures[i];
    lock.unlock();
    fail(msg);
    lock.lock();
  }
}

void Watchdog::fail(const std::string& message) {
  if (failed_.exchange(true)) return;  // the first failure wins
  if (opt_.on_failure) {
    opt_.on_failure(message);
    return;
  }
  default_failure(message);
}

void Watchdog::default_failure(const std::string& message) {
  std::fprintf(stderr, "ctxrun: %s. Aborting the NCCL communicators and this rank (exit %d).\n", message.c_str(),
               ctx::kExitInternal);
  std::fflush(stderr);
  // ncclCommAbort may hang (NCCL issue 829): whatever happens, exit after the grace period
  const double grace = opt_.abort_grace_s;
  std::thread([grace] {
    std::this_thread::sleep_for(std::chrono::duration<double>(grace));
    std::fprintf(stderr, "ctxrun: ncclCommAbort did not return within %.0f s; exiting anyway\n", grace);
    std::fflush(stderr);
    std::_Exit(ctx::kExitInternal);
  }).detach();
  {
    // under the lock: a communicator cannot be destroyed (remove()) while it is being aborted
    std::lock_guard<std::mutex> lock(mu_);
    for (Entry& e : entries_) e.comm->abort();
  }
  std::_Exit(ctx::kExitInternal);
}

}  // namespace ctx::exec::cuda
