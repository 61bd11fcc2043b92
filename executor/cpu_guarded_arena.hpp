// The cpu-guarded backend's memory: one sparse memfd mapped twice. Strategy code and communicators
// are handed addresses in the first mapping, which is PROT_NONE, so any host read or write of
// tensor memory outside the backend faults at once; the backend computes through the second,
// writable mapping (the same pages, a fixed offset away). First-fit allocation with coalescing.
// Capacity: $CTXRUN_GUARDED_ARENA_GIB (default 8; address space only: pages are allocated on touch).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

namespace ctx::exec {

int64_t guarded_arena_bytes();

class GuardedArena {
 public:
  explicit GuardedArena(int64_t capacity_bytes);
  ~GuardedArena();
  GuardedArena(const GuardedArena&) = delete;
  GuardedArena& operator=(const GuardedArena&) = delete;
  void* allocate(int64_t bytes);  // an address in the inaccessible mapping, 64-byte aligned
  void release(void* p);
  std::ptrdiff_t rw_offset() const { return rw_ - alias_; }  // alias address + offset = writable address

 private:
  int fd_ = -1;
  char* alias_ = nullptr;
  char* rw_ = nullptr;
  int64_t capacity_ = 0;
  std::mutex mu_;
  std::map<int64_t, int64_t> free_;               // offset -> bytes
  std::unordered_map<int64_t, int64_t> used_;     // offset -> bytes
};

}  // namespace ctx::exec
