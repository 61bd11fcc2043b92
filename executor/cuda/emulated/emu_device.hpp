// The emulated device behind the CPU test doubles of the CUDA runtime, cuBLASLt and NCCL
// (emu_cudart.cpp, emu_cublaslt.cpp, emu_nccl.cpp). One per process, used by one device ordinal.
//
// Streams are queues. Nothing runs when it is issued: work runs when the host synchronises
// (cudaStreamSynchronize, cudaEventSynchronize/Query, cudaDeviceSynchronize, a synchronous copy,
// cudaFree), so host code that reads a result without waiting for it reads stale memory, as it
// would on a GPU that has not finished. Among the streams that can run, the next operation is
// picked in a seeded random order (CTX_EMU_SEED), so a missing event dependency between streams
// changes results under some seed (streams run in bursts: one can run far ahead of another). Events are stream positions; cudaStreamWaitEvent blocks a
// stream until the event's last recorded position has run.
//
// Device memory (cudaMalloc) is one reserved address range that is PROT_NONE while the host runs
// and readable only while device work runs: a host dereference of a device pointer faults, as a
// real one does. Pinned (cudaMallocHost) and managed memory are ordinary host memory. Capacity:
// CTX_EMU_DEVICE_MIB (default 4096); cudaMalloc beyond it fails with cudaErrorMemoryAllocation.
//
// Operations that wait on other processes (NCCL collectives and point-to-point, emu_nccl.cpp) are
// "in flight" after they start: their stream stays blocked until poll() says they completed, and
// the other streams go on meanwhile, so collectives on different communicators never deadlock
// against each other whatever order two ranks start them in.
#pragma once
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ctx_emu {

// One queued operation. start() runs on the device (device memory readable); it returns true
// when the operation is complete, false when it is in flight (then poll() is called until true).
struct Op {
  std::string what;  // named in errors ("kernel rmsnorm_fwd_kernel", "ncclAllReduce", ...)
  std::function<bool()> ready;  // may it start? (empty: yes) -- event waits
  std::function<bool()> start;
  std::function<bool()> poll;
  std::function<std::string()> waiting;  // what a blocked or in-flight operation waits for
};

struct EventState;

struct StreamState {
  int id = 0;
  std::deque<Op> queue;
  bool in_flight = false;  // the head operation started and has not completed
  uint64_t issued = 0;     // operations issued so far (an event records a position)
  uint64_t done = 0;       // operations completed
};

enum class PtrKind { device, pinned, managed, pageable };

class Device {
 public:
  static Device& get();
  std::recursive_mutex& mutex() { return mu_; }

  // ---- memory
  void* malloc_device(size_t bytes);  // nullptr when the capacity is exhausted
  void free_device(void* p);
  void* malloc_host(size_t bytes, bool managed);
  void free_host(void* p);
  PtrKind kind(const void* p) const;
  size_t capacity_bytes() const { return capacity_; }
  size_t used_bytes() const { return used_; }
  // device memory accessible to the calling thread while device work runs (RAII)
  struct Access {
    Access();
    ~Access();
  };

  // ---- streams and events (nullptr: the legacy default stream, ordered with every stream)
  StreamState* create_stream();
  void destroy_stream(StreamState* s);
  StreamState* resolve(cudaStream_t s);
  void enqueue(cudaStream_t s, Op op);
  // the stream's position an event recorded now would name
  uint64_t position(cudaStream_t s) { return resolve(s)->issued; }
  bool reached(StreamState* s, uint64_t pos) const { return s->done >= pos; }

  // ---- running work
  void run_until(const std::function<bool()>& done, const std::string& waiting_for);
  void synchronize_stream(cudaStream_t s);
  void synchronize_all();
  void progress();  // runs whatever can run without blocking, then returns
  // after an error that leaves work that can never run (a wait cycle): drops every queued operation,
  // as a real device after a sticky error is unusable (tests use it to go on)
  void discard_all() {
    for (auto& s : streams_) {
      s->queue.clear();
      s->in_flight = false;
      s->done = s->issued;
    }
  }

  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  uint64_t seed() const { return seed_; }
  void reseed(uint64_t seed) {  // tests: the stream-order seed (0: lowest stream first)
    seed_ = seed;
    rng_ = seed * 0x9e3779b97f4a7c15ull + 1;
  }

 private:
  Device();
  bool step();  // one operation started or completed; false when nothing could move
  std::recursive_mutex mu_;
  std::vector<std::unique_ptr<StreamState>> streams_;  // [0]: the legacy default stream
  int next_stream_id_ = 0;
  StreamState* current_ = nullptr;  // the stream of the last burst (step)
  // device arena
  char* arena_ = nullptr;
  size_t capacity_ = 0, used_ = 0, high_ = 0;
  std::map<size_t, size_t> free_;                   // offset -> bytes, coalesced
  std::map<size_t, size_t> live_;                   // offset -> bytes
  std::map<uintptr_t, std::pair<size_t, bool>> host_;  // pinned/managed: address -> (bytes, managed)
  int access_depth_ = 0;
  uint64_t seed_ = 0;
  uint64_t rng_ = 0;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  friend struct Access;
};

// the sticky-free "last error" of the runtime (cudaGetLastError)
cudaError_t& last_error();

}  // namespace ctx_emu
