// The emulated device: memory arena, stream queues, the scheduler (emu_device.hpp).
#include "executor/cuda/emulated/emu_device.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "executor/cuda/tests/cuda_emulator.hpp"

namespace ctx_emu {
namespace {

constexpr size_t kAlign = 256;  // cudaMalloc's alignment
size_t round_up(size_t b, size_t a) { return (b + a - 1) / a * a; }
size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}
double env_double(const char* name, double fallback) {
  const char* e = std::getenv(name);
  return e && *e ? std::strtod(e, nullptr) : fallback;
}

}  // namespace

cudaError_t& last_error() {
  static cudaError_t e = cudaSuccess;
  return e;
}

Device& Device::get() {
  static Device* d = new Device();  // never destroyed: static destructors may still free memory
  return *d;
}

Device::Device() {
  capacity_ = static_cast<size_t>(env_double("CTX_EMU_DEVICE_MIB", 4096)) << 20;
  void* p = mmap(nullptr, capacity_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("emulated CUDA: cannot reserve the device address range");
  arena_ = static_cast<char*>(p);
  free_[0] = capacity_;
  const char* e = std::getenv("CTX_EMU_SEED");
  seed_ = e ? std::strtoull(e, nullptr, 0) : uint64_t{0x5eed};
  rng_ = seed_ * 0x9e3779b97f4a7c15ull + 1;
  // kernels run without the shared-memory race detector unless asked (CTX_EMU_RACE=1): it costs
  // two signals per shared-memory access; the kernel tests run with it on
  const char* race = std::getenv("CTX_EMU_RACE");
  options().race_check = race && std::atoi(race) != 0 && race::available();
  options().seed = seed_;
  auto def = std::make_unique<StreamState>();
  def->id = next_stream_id_++;
  streams_.push_back(std::move(def));
}

// ---- memory
void* Device::malloc_device(size_t bytes) {
  bytes = round_up(bytes ? bytes : 1, kAlign);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    const size_t off = it->first, rest = it->second - bytes;
    free_.erase(it);
    if (rest) free_[off + bytes] = rest;
    live_[off] = bytes;
    used_ += bytes;
    if (off + bytes > high_) {
      const size_t old = round_up(high_, page_size());
      high_ = off + bytes;
      if (access_depth_ > 0 && round_up(high_, page_size()) > old)
        mprotect(arena_ + old, round_up(high_, page_size()) - old, PROT_READ | PROT_WRITE);
    }
    return arena_ + off;
  }
  return nullptr;
}

void Device::free_device(void* p) {
  const size_t off = static_cast<size_t>(static_cast<char*>(p) - arena_);
  auto it = live_.find(off);
  if (it == live_.end()) throw std::invalid_argument("emulated CUDA: cudaFree of a pointer cudaMalloc did not return");
  size_t start = off, bytes = it->second;
  used_ -= bytes;
  live_.erase(it);
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + bytes) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = bytes;  // the old contents stay: fresh cudaMalloc memory holds garbage, as on a GPU
}

void* Device::malloc_host(size_t bytes, bool managed) {
  void* p = std::aligned_alloc(kAlign, round_up(bytes ? bytes : 1, kAlign));
  if (!p) return nullptr;
  host_[reinterpret_cast<uintptr_t>(p)] = {bytes, managed};
  return p;
}

void Device::free_host(void* p) {
  auto it = host_.find(reinterpret_cast<uintptr_t>(p));
  if (it == host_.end()) throw std::invalid_argument("emulated CUDA: cudaFreeHost/cudaFree of an unknown host pointer");
  host_.erase(it);
  std::free(p);
}

PtrKind Device::kind(const void* p) const {
  const auto* c = static_cast<const char*>(p);
  if (c >= arena_ && c < arena_ + capacity_) return PtrKind::device;
  const auto u = reinterpret_cast<uintptr_t>(p);
  auto it = host_.upper_bound(u);
  if (it != host_.begin()) {
    --it;
    if (u < it->first + std::max<size_t>(it->second.first, 1))
      return it->second.second ? PtrKind::managed : PtrKind::pinned;
  }
  return PtrKind::pageable;
}

Device::Access::Access() {
  Device& d = get();
  if (d.access_depth_++ == 0 && d.high_)
    mprotect(d.arena_, round_up(d.high_, page_size()), PROT_READ | PROT_WRITE);
}
Device::Access::~Access() {
  Device& d = get();
  if (--d.access_depth_ == 0 && d.high_) mprotect(d.arena_, round_up(d.high_, page_size()), PROT_NONE);
}

// ---- streams
StreamState* Device::create_stream() {
  auto s = std::make_unique<StreamState>();
  s->id = next_stream_id_++;
  streams_.push_back(std::move(s));
  return streams_.back().get();
}

void Device::destroy_stream(StreamState* s) {
  synchronize_stream(reinterpret_cast<cudaStream_t>(s));
  if (current_ == s) current_ = nullptr;
  for (auto it = streams_.begin(); it != streams_.end(); ++it)
    if (it->get() == s) {
      streams_.erase(it);
      return;
    }
}

StreamState* Device::resolve(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return streams_[0].get();
  auto* st = reinterpret_cast<StreamState*>(s);
  for (auto& p : streams_)
    if (p.get() == st) return st;
  throw std::invalid_argument("emulated CUDA: an unknown or destroyed stream");
}

void Device::enqueue(cudaStream_t s, Op op) {
  StreamState* st = resolve(s);
  if (st == streams_[0].get()) {
    // the legacy default stream: waits for all work issued before on every stream, and work issued
    // after on other streams waits for it (every stream here is treated as blocking)
    std::vector<std::pair<StreamState*, uint64_t>> before;
    for (auto& p : streams_)
      if (p.get() != st && p->issued > p->done) before.emplace_back(p.get(), p->issued);
    if (!before.empty()) {
      Op wait;
      wait.what = "default-stream ordering";
      wait.ready = [before] {
        for (auto& [o, pos] : before)
          if (o->done < pos) return false;
        return true;
      };
      wait.start = [] { return true; };
      st->queue.push_back(std::move(wait));
      st->issued++;
    }
  } else {
    StreamState* def = streams_[0].get();
    if (def->issued > def->done) {
      const uint64_t pos = def->issued;
      Op wait;
      wait.what = "default-stream ordering";
      wait.ready = [def, pos] { return def->done >= pos; };
      wait.start = [] { return true; };
      st->queue.push_back(std::move(wait));
      st->issued++;
    }
  }
  st->queue.push_back(std::move(op));
  st->issued++;
}

// ---- running
// Picks the next operation. With a seed, streams run in bursts: the current stream goes on while
// it can (switching at random one time in eight), and when it blocks another runnable stream is
// picked at random -- so one stream can run far ahead of another, as a long kernel sequence runs
// ahead of a copy on a GPU, and a missing event wait shows up as a read of data not yet there.
// Seed 0: the lowest-numbered runnable stream, always.
bool Device::step() {
  const size_t n = streams_.size();
  auto next_random = [this] {
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    return rng_;
  };
  auto try_move = [&](StreamState* s) -> bool {
    if (s->queue.empty()) return false;
    Op& op = s->queue.front();
    bool complete = false;
    if (s->in_flight) {
      complete = op.poll();
      if (!complete) return false;
    } else {
      if (op.ready && !op.ready()) return false;
      try {
        complete = op.start();
      } catch (...) {
        s->queue.pop_front();
        s->done++;
        throw;
      }
      if (!complete) {
        s->in_flight = true;
        return true;
      }
    }
    s->in_flight = false;
    s->queue.pop_front();
    s->done++;
    return true;
  };
  if (seed_ && current_ && next_random() % 8 != 0) {
    for (auto& p : streams_)
      if (p.get() == current_ && try_move(current_)) return true;
  }
  const size_t first = seed_ ? static_cast<size_t>(next_random() % n) : 0;
  for (size_t i = 0; i < n; ++i) {
    StreamState* s = streams_[(first + i) % n].get();
    if (try_move(s)) {
      current_ = s;
      return true;
    }
  }
  return false;
}

void Device::run_until(const std::function<bool()>& done, const std::string& waiting_for) {
  if (done()) return;
  Access access;
  current_ = nullptr;  // each wait starts its first burst on a random stream
  const double timeout_s = env_double("CTX_EMU_TIMEOUT_S", 300);
  double idle_since = -1;
  while (!done()) {
    if (step()) {
      idle_since = -1;
      continue;
    }
    bool any_in_flight = false;
    std::string blocked;
    for (auto& s : streams_) {
      if (s->queue.empty()) continue;
      any_in_flight |= s->in_flight;
      const Op& op = s->queue.front();
      blocked += "\n  stream " + std::to_string(s->id) + ": " + op.what + (s->in_flight ? " (in flight)" : " (blocked)") +
                 (op.waiting ? ": " + op.waiting() : "");
    }
    if (!any_in_flight)
      throw std::runtime_error("emulated CUDA: waiting for " + waiting_for +
                               ", but no stream can run (a wait on an event that is never reached):" + blocked);
    const double now = seconds();
    if (idle_since < 0) idle_since = now;
    if (now - idle_since > timeout_s)
      throw std::runtime_error("emulated CUDA: waiting for " + waiting_for + " for " + std::to_string(timeout_s) +
                               " s (CTX_EMU_TIMEOUT_S) on operations of other processes:" + blocked);
    std::this_thread::yield();
  }
}

void Device::synchronize_stream(cudaStream_t s) {
  StreamState* st = resolve(s);
  if (st == streams_[0].get()) return synchronize_all();
  const uint64_t target = st->issued;
  run_until([st, target] { return st->done >= target; }, "stream " + std::to_string(st->id));
}

void Device::synchronize_all() {
  std::vector<std::pair<StreamState*, uint64_t>> targets;
  for (auto& p : streams_) targets.emplace_back(p.get(), p->issued);
  run_until(
      [&targets] {
        for (auto& [s, pos] : targets)
          if (s->done < pos) return false;
        return true;
      },
      "the device");
}

void Device::progress() {
  Access access;
  for (int i = 0; i < 1 << 20 && step(); ++i) {
  }
}

}  // namespace ctx_emu
