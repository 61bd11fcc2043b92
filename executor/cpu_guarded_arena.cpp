#include "executor/cpu_guarded_arena.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ctx::exec {

int64_t guarded_arena_bytes() {
  int64_t gib = 8;
  if (const char* e = std::getenv("CTXRUN_GUARDED_ARENA_GIB")) {
    char* end = nullptr;
    long v = std::strtol(e, &end, 10);
    if (!end || *end != '\0' || v < 1 || v > 4096)
      throw std::invalid_argument("CTXRUN_GUARDED_ARENA_GIB: expected whole GiB in 1..4096, got '" + std::string(e) + "'");
    gib = v;
  }
  return gib << 30;
}

GuardedArena::GuardedArena(int64_t capacity) : capacity_(capacity) {
  fd_ = memfd_create("ctxrun-guarded", 0);
  if (fd_ < 0) throw std::runtime_error(std::string("cpu-guarded: memfd_create failed: ") + std::strerror(errno));
  if (ftruncate(fd_, capacity) != 0) {
    close(fd_);
    throw std::runtime_error(std::string("cpu-guarded: ftruncate failed: ") + std::strerror(errno));
  }
  void* a = mmap(nullptr, capacity, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
  void* w = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
  if (a == MAP_FAILED || w == MAP_FAILED) {
    if (a != MAP_FAILED) munmap(a, capacity);
    if (w != MAP_FAILED) munmap(w, capacity);
    close(fd_);
    throw std::runtime_error(std::string("cpu-guarded: mmap of the arena failed: ") + std::strerror(errno));
  }
  alias_ = static_cast<char*>(a);
  rw_ = static_cast<char*>(w);
  free_[0] = capacity;
}

GuardedArena::~GuardedArena() {
  munmap(alias_, capacity_);
  munmap(rw_, capacity_);
  close(fd_);
}

void* GuardedArena::allocate(int64_t bytes) {
  const int64_t need = (bytes + 63) / 64 * 64;
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const int64_t off = it->first, rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_[off + need] = rest;
    used_[off] = need;
    return alias_ + off;
  }
  throw std::runtime_error("cpu-guarded: the arena of " + std::to_string(capacity_ >> 30) +
                           " GiB is exhausted (raise CTXRUN_GUARDED_ARENA_GIB)");
}

void GuardedArena::release(void* p) {
  const int64_t off = static_cast<char*>(p) - alias_;
  std::lock_guard<std::mutex> lk(mu_);
  auto u = used_.find(off);
  if (u == used_.end()) throw std::logic_error("cpu-guarded: release of an address the arena did not hand out");
  int64_t start = off, len = u->second;
  used_.erase(u);
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + len) {  // merge with the following free block
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // and with the preceding one
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = len;
}

}  // namespace ctx::exec
