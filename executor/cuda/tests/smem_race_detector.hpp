// Shared-memory race detection for the CUDA emulator (cuda_emulator.hpp).
//
// How accesses are seen: the kernels address shared memory through plain pointers, so the
// detector watches the memory itself. While a launch runs, every page of shared memory (the
// dynamic buffer, and the static __shared__ arrays, which the emulator places in the section
// "ctx_emu_shared") is PROT_NONE. An access faults; the SIGSEGV handler records it (address, read
// or write from the page-fault error code), opens that page and sets the trap flag; after the one
// instruction, SIGTRAP closes the page again. Linux on x86-64 only (available() says so).
// Accesses are recorded at their first 4-byte word (the test target is built without
// auto-vectorisation so that kernel loads and stores are scalar).
//
// What counts as a race (independent of the order the emulator runs threads in): two accesses to
// the same word by different threads of a block, at least one a write, with no barrier between
// them. Thread s's access is ordered before thread t's when a __syncthreads separates them (their
// block epochs, the count of block barriers each thread has passed, differ), or, for two lanes of
// one warp, when a __syncwarp separates them (warp epochs differ). Shuffles and votes are not
// memory fences and do not order. Because the rule is symmetric, a read of a word that another
// thread writes in the same epoch is reported whether the emulator happened to run the reader
// before or after the writer (read-after-write and write-after-read alike).
#pragma once
#include <csignal>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <vector>

namespace ctx_emu::race {

struct Report {
  std::string kernel, region;  // region: "dynamic" or "static"
  unsigned block_x = 0, block_y = 0;
  size_t word = 0;             // word offset in the region
  unsigned first = 0, second = 0;  // linear thread ids in the block: earlier access, later access
  const char* kind = "";       // "read-after-write", "write-after-read", "write-after-write"
  std::string str() const {
    return kernel + ": shared-memory race (" + kind + ") on " + region + " shared word " + std::to_string(word) +
           " between threads " + std::to_string(first) + " and " + std::to_string(second) + " of block (" +
           std::to_string(block_x) + "," + std::to_string(block_y) + "), no barrier between them";
  }
};

struct RaceError : std::logic_error {
  std::vector<Report> reports;
  RaceError(const std::string& what, std::vector<Report> r) : std::logic_error(what), reports(std::move(r)) {}
};

#if defined(__linux__) && defined(__x86_64__)
constexpr bool available() { return true; }
#else
constexpr bool available() { return false; }
#endif

struct Stamp {
  uint32_t thread, block_epoch, warp_epoch;
};

struct WordState {
  bool written = false;
  Stamp writer{};
  std::vector<Stamp> readers;  // reads since the last write
};

struct Region {
  char* base = nullptr;    // page-aligned start of the protected range
  size_t bytes = 0;        // protected length (whole pages)
  char* tracked = nullptr; // the tracked bytes within it
  size_t tracked_bytes = 0;
  const char* name = "";
  std::vector<WordState> words;
};

// Which thread is accessing: supplied by the emulator (nullptr outside a kernel thread).
struct Who {
  uint32_t thread, block_epoch, warp_epoch;
};

struct Detector {
  std::vector<Region> regions;
  std::vector<Report> reports;
  std::vector<char*> open_pages;  // opened by the SIGSEGV handler until the SIGTRAP
  bool (*who)(Who&) = nullptr;
  std::string kernel;
  unsigned block_x = 0, block_y = 0;
  bool armed = false;
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));

  static bool ordered(const Stamp& a, const Who& b) {
    if (a.block_epoch != b.block_epoch) return true;
    return (a.thread >> 5) == (b.thread >> 5) && a.warp_epoch != b.warp_epoch;
  }
  void report(Region& r, size_t w, uint32_t first, uint32_t second, const char* kind) {
    for (auto& p : reports)  // one report per word and block
      if (p.word == w && p.region == r.name && p.block_x == block_x && p.block_y == block_y) return;
    reports.push_back({kernel, r.name, block_x, block_y, w, first, second, kind});
  }
  void access(char* addr, bool write) {
    Who me{};
    if (!who || !who(me)) return;
    for (auto& r : regions) {
      if (addr < r.tracked || addr >= r.tracked + r.tracked_bytes) continue;
      const size_t w = static_cast<size_t>(addr - r.tracked) / 4;
      WordState& s = r.words[w];
      if (s.written && s.writer.thread != me.thread && !ordered(s.writer, me))
        report(r, w, s.writer.thread, me.thread, write ? "write-after-write" : "read-after-write");
      if (write) {
        for (auto& rd : s.readers)
          if (rd.thread != me.thread && !ordered(rd, me)) {
            report(r, w, rd.thread, me.thread, "write-after-read");
            break;
          }
        s.readers.clear();
        s.written = true;
        s.writer = {me.thread, me.block_epoch, me.warp_epoch};
      } else {
        // readers ordered before this one can no longer race with a later write unordered with
        // this read... but they still can with writes of other warps: keep those of this epoch
        bool have = false;
        for (auto& rd : s.readers) have |= rd.thread == me.thread && rd.block_epoch == me.block_epoch &&
                                           rd.warp_epoch == me.warp_epoch;
        if (!have) {
          if (!s.readers.empty() && s.readers.front().block_epoch != me.block_epoch) s.readers.clear();
          s.readers.push_back({me.thread, me.block_epoch, me.warp_epoch});
        }
      }
      return;
    }
  }
  void protect(int prot) {
    for (auto& r : regions)
      if (r.bytes) mprotect(r.base, r.bytes, prot);
  }
  bool owns(char* addr) const {
    for (auto& r : regions)
      if (addr >= r.base && addr < r.base + r.bytes) return true;
    return false;
  }
};

inline Detector*& current() {
  static Detector* d = nullptr;
  return d;
}

#if defined(__linux__) && defined(__x86_64__)
inline void on_segv(int sig, siginfo_t* si, void* vctx) {
  Detector* d = current();
  char* addr = static_cast<char*>(si->si_addr);
  if (!d || !d->armed || !d->owns(addr)) {  // not ours: the default action (a crash, as without us)
    signal(sig, SIG_DFL);
    return;
  }
  auto* uc = static_cast<ucontext_t*>(vctx);
  const bool write = (uc->uc_mcontext.gregs[REG_ERR] & 2) != 0;
  d->access(addr, write);
  char* pg = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(addr) & ~(d->page - 1));
  mprotect(pg, d->page, PROT_READ | PROT_WRITE);
  d->open_pages.push_back(pg);
  uc->uc_mcontext.gregs[REG_EFL] |= 0x100;  // trap after the instruction
}
inline void on_trap(int, siginfo_t*, void* vctx) {
  Detector* d = current();
  auto* uc = static_cast<ucontext_t*>(vctx);
  uc->uc_mcontext.gregs[REG_EFL] &= ~static_cast<greg_t>(0x100);
  if (!d) return;
  for (char* pg : d->open_pages)
    if (d->armed) mprotect(pg, d->page, PROT_NONE);
  d->open_pages.clear();
}
inline void install_handlers() {
  static bool done = false;
  if (done) return;
  done = true;
  struct sigaction sa {};
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sa.sa_sigaction = on_segv;
  sigaction(SIGSEGV, &sa, nullptr);
  sa.sa_sigaction = on_trap;
  sigaction(SIGTRAP, &sa, nullptr);
}
#else
inline void install_handlers() {}
#endif

// A page-aligned, page-padded buffer (the dynamic shared memory), so that protecting it touches
// nothing else.
struct PageBuffer {
  char* p = nullptr;
  size_t bytes = 0, mapped = 0;
  PageBuffer() = default;
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  ~PageBuffer() { release(); }
  void release() {
    if (p) munmap(p, mapped);
    p = nullptr;
    bytes = mapped = 0;
  }
  void assign(size_t n) {
    release();
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    bytes = n;
    mapped = std::max(page, (n + page - 1) / page * page);
    void* m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::runtime_error("emulator: cannot map shared memory");
    p = static_cast<char*>(m);
  }
  float* data() const { return reinterpret_cast<float*>(p); }
};

}  // namespace ctx_emu::race
