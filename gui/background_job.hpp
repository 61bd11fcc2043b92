// One long computation at a time on a worker thread, so the UI never waits: start() hands the
// work a progress callback (return false = stop), the UI polls progress() and take()s the result.
// Starting again cancels the running work; it finishes in the background and is reaped later.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ctx::gui {

template <class Result>
class BackgroundJob {
 public:
  using Progress = std::function<bool(double)>;
  using Work = std::function<Result(const Progress&)>;

  BackgroundJob() = default;
  BackgroundJob(const BackgroundJob&) = delete;
  BackgroundJob& operator=(const BackgroundJob&) = delete;
  ~BackgroundJob() {
    cancel();
    if (current_) retired_.push_back(current_);
    for (auto& r : retired_)
      if (r->thread.joinable()) r->thread.join();
  }

  void start(Work work) {
    cancel();
    if (current_) retired_.push_back(std::move(current_));
    auto run = std::make_shared<Run>();
    Run* raw = run.get();
    run->thread = std::thread([raw, work = std::move(work)] {
      // an exception the work did not handle would terminate the app: it becomes the run's failure,
      // shown in the window by whoever takes the result
      try {
        raw->result = work([raw](double f) {
          raw->progress.store(f, std::memory_order_relaxed);
          return !raw->cancel.load(std::memory_order_relaxed);
        });
      } catch (const std::exception& e) {
        raw->failure = e.what();
      } catch (...) {
        raw->failure = "unknown exception";
      }
      raw->done.store(true, std::memory_order_release);
    });
    current_ = std::move(run);
    reap();
  }

  void cancel() {
    if (current_) current_->cancel.store(true, std::memory_order_relaxed);
  }
  bool running() const { return current_ && !current_->done.load(std::memory_order_acquire); }
  bool cancelling() const { return running() && current_->cancel.load(std::memory_order_relaxed); }
  double progress() const { return current_ ? current_->progress.load(std::memory_order_relaxed) : 0.0; }
  // True once per finished run: moves its result into `out` (a default Result when the work threw:
  // failure() then says what, until the next take).
  bool take(Result& out) {
    reap();
    if (!current_ || !current_->done.load(std::memory_order_acquire)) return false;
    current_->thread.join();
    out = std::move(current_->result);
    failure_ = std::move(current_->failure);
    current_.reset();
    return true;
  }
  const std::string& failure() const { return failure_; }
  // Work still running anywhere (the current run or cancelled ones finishing).
  bool busy() {
    reap();
    return running() || !retired_.empty();
  }

 private:
  struct Run {
    std::thread thread;
    std::atomic<double> progress{0};
    std::atomic<bool> cancel{false}, done{false};
    Result result{};
    std::string failure;  // what the work threw, if it did
  };
  void reap() {
    for (size_t i = 0; i < retired_.size();) {
      if (retired_[i]->done.load(std::memory_order_acquire)) {
        retired_[i]->thread.join();
        retired_.erase(retired_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  std::shared_ptr<Run> current_;
  std::vector<std::shared_ptr<Run>> retired_;
  std::string failure_;
};

}  // namespace ctx::gui
