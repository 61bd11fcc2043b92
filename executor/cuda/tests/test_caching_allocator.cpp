// The caching allocator's block logic on the CPU (label cpu): a fake device hands out address
// ranges that are never dereferenced, records events per stream and completes them only when the
// test says a stream's work finished, so splitting, coalescing, best fit, cross-stream waiting and
// the out-of-memory path are checked exactly. The randomized test compares every handout against a
// reference model of live ranges and of ranges freed on a stream whose work has not finished.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "executor/cuda/caching_allocator.hpp"

namespace ctx::exec::cuda {
namespace {

constexpr int64_t MiB = 1 << 20;

// The fake device's state, shared with the test after the allocator takes the device.
struct FakeState {
  int64_t capacity = 0, used = 0;
  uintptr_t next_addr = uintptr_t{1} << 40;
  std::map<uintptr_t, int64_t> segments;  // live segments: address -> bytes
  int64_t mallocs = 0, frees = 0, failed_mallocs = 0, syncs = 0;
  int64_t bad_frees = 0;  // frees of an address that is not a live segment
  struct Ev {
    cudaStream_t stream = nullptr;
    uint64_t seq = 0;
    bool alive = true;
  };
  std::map<uintptr_t, Ev> events;
  int64_t events_created = 0, events_destroyed = 0;
  std::map<cudaStream_t, uint64_t> recorded, completed;
  void complete(cudaStream_t s) { completed[s] = recorded[s]; }
};

class FakeDevice final : public AllocatorDevice {
 public:
  explicit FakeDevice(std::shared_ptr<FakeState> st) : st_(std::move(st)) {}
  void* malloc(size_t bytes, bool /*host*/) override {
    if (st_->used + static_cast<int64_t>(bytes) > st_->capacity) {
      ++st_->failed_mallocs;
      return nullptr;
    }
    const uintptr_t a = st_->next_addr;
    st_->next_addr += (bytes + MiB - 1) / MiB * MiB + MiB;  // a gap: neighbours never touch
    st_->segments[a] = static_cast<int64_t>(bytes);
    st_->used += static_cast<int64_t>(bytes);
    ++st_->mallocs;
    return reinterpret_cast<void*>(a);
  }
  void free(void* p, bool) override {
    auto it = st_->segments.find(reinterpret_cast<uintptr_t>(p));
    if (it == st_->segments.end()) {
      ++st_->bad_frees;
      return;
    }
    st_->used -= it->second;
    st_->segments.erase(it);
    ++st_->frees;
  }
  cudaEvent_t event_create() override {
    const uintptr_t id = static_cast<uintptr_t>(++st_->events_created) * 16;
    st_->events[id] = {};
    return reinterpret_cast<cudaEvent_t>(id);
  }
  void event_destroy(cudaEvent_t e) override {
    st_->events.at(reinterpret_cast<uintptr_t>(e)).alive = false;
    ++st_->events_destroyed;
  }
  void event_record(cudaEvent_t e, cudaStream_t s) override {
    FakeState::Ev& ev = st_->events.at(reinterpret_cast<uintptr_t>(e));
    EXPECT_TRUE(ev.alive);
    ev.stream = s;
    ev.seq = ++st_->recorded[s];
  }
  bool event_done(cudaEvent_t e) override {
    const FakeState::Ev& ev = st_->events.at(reinterpret_cast<uintptr_t>(e));
    return ev.seq <= st_->completed[ev.stream];
  }
  void synchronize() override {
    ++st_->syncs;
    for (auto& [s, n] : st_->recorded) st_->completed[s] = n;
  }
  void mem_get_info(size_t* f, size_t* t) override {
    *f = static_cast<size_t>(st_->capacity - st_->used);
    *t = static_cast<size_t>(st_->capacity);
  }

 private:
  std::shared_ptr<FakeState> st_;
};

cudaStream_t stream(int i) { return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(0x1000 * i)); }
uintptr_t addr(void* p) { return reinterpret_cast<uintptr_t>(p); }

struct Fixture {
  std::shared_ptr<FakeState> st = std::make_shared<FakeState>();
  std::unique_ptr<CachingAllocator> a;
  explicit Fixture(int64_t capacity = int64_t{1} << 40) {
    st->capacity = capacity;
    a = std::make_unique<CachingAllocator>(std::make_unique<FakeDevice>(st), stream(1));
  }
};

TEST(CachingAllocator, SplitsOneSegmentIntoRoundedBlocks) {
  Fixture f;
  void* p = f.a->alloc(1000, stream(1), "x");
  void* q = f.a->alloc(3000, stream(1), "x");
  EXPECT_EQ(f.st->mallocs, 1);  // one 2 MiB segment serves both
  EXPECT_EQ(f.st->segments.begin()->second, CachingAllocator::kSmallSegmentBytes);
  EXPECT_EQ(addr(q), addr(p) + 1024);  // 1000 rounded up to 512-byte granularity
  const AllocatorStats s = f.a->stats();
  EXPECT_EQ(s.reserved_bytes, 2 * MiB);
  EXPECT_EQ(s.allocated_bytes, 1024 + 3072);
  EXPECT_EQ(s.requested_bytes, 4000);
  EXPECT_EQ(s.segments, 1);
  EXPECT_EQ(s.cuda_malloc_calls, 1);
  // a large request takes its own segment, rounded to 2 MiB above 10 MiB, 20 MiB below
  f.a->alloc(11 * MiB, stream(1), "x");
  f.a->alloc(3 * MiB, stream(1), "x");
  EXPECT_EQ(f.st->mallocs, 3);
  EXPECT_EQ(f.a->stats().reserved_bytes, 2 * MiB + 12 * MiB + 20 * MiB);
}

TEST(CachingAllocator, FreedNeighboursCoalesce) {
  Fixture f;
  void* a = f.a->alloc(512 * 1024, stream(1), "x");
  void* b = f.a->alloc(512 * 1024, stream(1), "x");
  void* c = f.a->alloc(512 * 1024, stream(1), "x");
  f.a->free(a, stream(1));
  f.a->free(b, stream(1));
  void* ab = f.a->alloc(MiB, stream(1), "x");  // a and b merged: 1 MiB at a
  EXPECT_EQ(ab, a);
  EXPECT_EQ(f.st->mallocs, 1);
  f.a->free(ab, stream(1));
  f.a->free(c, stream(1));
  f.st->complete(stream(1));
  f.a->trim();  // the whole segment is one free block again: given back
  EXPECT_EQ(f.st->frees, 1);
  EXPECT_EQ(f.a->stats().reserved_bytes, 0);
  EXPECT_EQ(f.a->stats().segments, 0);
}

TEST(CachingAllocator, BestFitReusesBlocksAcrossSizes) {
  Fixture f;
  void* big = f.a->alloc(40 * MiB, stream(1), "x");
  void* mid = f.a->alloc(24 * MiB, stream(1), "x");
  f.a->free(big, stream(1));
  f.a->free(mid, stream(1));
  void* p = f.a->alloc(20 * MiB, stream(1), "x");  // the smallest block that holds it
  EXPECT_EQ(p, mid);
  void* q = f.a->alloc(12 * MiB, stream(1), "x");  // the 40 MiB block, split: 28 MiB stay free
  EXPECT_EQ(q, big);
  void* r = f.a->alloc(16 * MiB, stream(1), "x");
  EXPECT_EQ(addr(r), addr(big) + 12 * MiB);
  EXPECT_EQ(f.st->mallocs, 2);
  // the 24 MiB block's 4 MiB rest was split off (rests up to 1 MiB stay inside a large block)
  EXPECT_EQ(f.a->stats().allocated_bytes, 20 * MiB + 12 * MiB + 16 * MiB);
}

TEST(CachingAllocator, AnotherStreamReusesABlockOnlyAfterItsFreeEventCompleted) {
  Fixture f;
  void* p = f.a->alloc(MiB, stream(1), "x");
  f.a->free(p, stream(1));
  // stream 2 must not get it while stream 1's work may still use it
  void* q = f.a->alloc(MiB, stream(2), "x");
  EXPECT_FALSE(addr(q) >= addr(p) && addr(q) < addr(p) + 2 * MiB);
  EXPECT_EQ(f.st->mallocs, 2);
  f.a->alloc(MiB, stream(2), "x");  // fills the second segment
  // the freeing stream itself reuses it at once
  void* r = f.a->alloc(MiB, stream(1), "x");
  EXPECT_EQ(r, p);
  f.a->free(r, stream(1));
  f.st->complete(stream(1));
  void* s = f.a->alloc(MiB, stream(3), "x");  // after the event: any stream
  EXPECT_EQ(s, p);
  EXPECT_EQ(f.st->mallocs, 2);
  // a block allocated on one stream and freed on another waits for the freeing stream
  void* t = f.a->alloc(512, stream(2), "x");
  f.a->free(t, stream(3));
  void* u = f.a->alloc(512, stream(2), "x");
  EXPECT_NE(u, t);
  void* v = f.a->alloc(512, stream(3), "x");
  EXPECT_EQ(v, t);
}

TEST(CachingAllocator, OutOfMemoryGivesTheCacheBackThenRetriesOnce) {
  Fixture f(48 * MiB);
  void* small = f.a->alloc(MiB, stream(1), "x");  // a 2 MiB small-pool segment
  f.a->free(small, stream(1));                    // cached, its event still pending
  void* big = f.a->alloc(40 * MiB, stream(1), "x");
  // 6 MiB wants a 20 MiB segment: no room; the device is synchronised, the cached small segment
  // given back, and the request retried at its own size
  void* p = f.a->alloc(6 * MiB, stream(1), "x");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(f.st->syncs, 1);
  EXPECT_EQ(f.st->frees, 1);
  EXPECT_EQ(f.a->stats().oom_retries, 1);
  EXPECT_EQ(f.a->stats().reserved_bytes, 46 * MiB);
  (void)big;
}

TEST(CachingAllocator, OutOfMemoryErrorNamesRequestCategoryAllocatorAndDevice) {
  Fixture f(48 * MiB);
  f.a->alloc(40 * MiB, stream(1), "x");
  f.a->alloc(6 * MiB, stream(1), "x");  // its 20 MiB segment does not fit: retried at 6 MiB
  const int64_t retries = f.a->stats().oom_retries;
  try {
    f.a->alloc(4 * MiB, stream(1), "activations; ledger total 1.5 GiB; predicted peak 2.0 GiB");
    FAIL() << "expected OutOfDeviceMemory";
  } catch (const OutOfDeviceMemory& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.requested_bytes, 4 * MiB);
    EXPECT_NE(m.find("4194304 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("activations; ledger total 1.5 GiB; predicted peak 2.0 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(46 * MiB) + " bytes reserved"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(46 * MiB) + " allocated"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(2 * MiB) + " bytes free"), std::string::npos) << m;
    EXPECT_NE(m.find("of " + std::to_string(48 * MiB)), std::string::npos) << m;
  }
  EXPECT_EQ(f.a->stats().oom_retries, retries + 1);  // tried once more, no loop
  // the allocator still works after the error
  f.st->capacity = 64 * MiB;
  EXPECT_NE(f.a->alloc(4 * MiB, stream(1), "x"), nullptr);
}

TEST(CachingAllocator, OldEntryPointsUseTheDefaultStream) {
  Fixture f;
  void* p = f.a->allocate(1000, false);
  f.a->release(p, false);
  EXPECT_EQ(f.st->recorded[stream(1)], 1u);  // the free's event went on the default stream
  EXPECT_EQ(f.a->allocate(1000, false), p);
  void* h = f.a->allocate(1000, true);  // pinned host: its own pools
  EXPECT_EQ(f.a->reserved_host_bytes(), 2 * MiB);
  EXPECT_EQ(f.a->reserved_device_bytes(), 2 * MiB);
  f.a->release(h, true);
  EXPECT_THROW(f.a->release(reinterpret_cast<void*>(0x10), false), std::logic_error);
}

TEST(CachingAllocator, DestructorReturnsEverySegmentAndEvent) {
  auto st = std::make_shared<FakeState>();
  st->capacity = int64_t{1} << 40;
  {
    CachingAllocator a(std::make_unique<FakeDevice>(st), stream(1));
    void* p = a.alloc(3 * MiB, stream(1), "x");
    a.alloc(100, stream(2), "x");  // live at destruction
    a.free(p, stream(2));
  }
  EXPECT_TRUE(st->segments.empty());
  EXPECT_EQ(st->bad_frees, 0);
  EXPECT_EQ(st->events_created, st->events_destroyed);
}

// Random alloc/free on three streams; every handout is checked against the live ranges (no double
// handout) and against ranges freed on another stream whose work has not completed.
void randomized(uint32_t seed, int64_t capacity, int ops) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  Fixture f(capacity);
  std::mt19937_64 rng(seed);
  struct Live {
    uintptr_t at;
    int64_t bytes;
    cudaStream_t stream;
  };
  std::vector<Live> live;
  std::map<uintptr_t, uintptr_t> live_ranges;  // start -> end
  struct Freed {
    uintptr_t at, end;
    cudaStream_t stream;
    uint64_t seq;
  };
  std::vector<Freed> freed;
  int64_t ooms = 0, allocs = 0;
  auto rounded = [](int64_t b) { return (std::max<int64_t>(b, 1) + 511) / 512 * 512; };
  for (int op = 0; op < ops; ++op) {
    const int r = static_cast<int>(rng() % 100);
    const cudaStream_t s = stream(1 + static_cast<int>(rng() % 3));
    if (r < 50 || live.empty()) {
      const int kind = static_cast<int>(rng() % 10);
      const int64_t bytes = kind < 6 ? static_cast<int64_t>(rng() % (MiB + 1))
                            : kind < 9 ? static_cast<int64_t>(rng() % (12 * MiB))
                                       : static_cast<int64_t>(rng() % (64 * MiB));
      void* p = nullptr;
      try {
        p = f.a->alloc(bytes, s, "random");
      } catch (const OutOfDeviceMemory& e) {
        ++ooms;
        // only when the device really lacks room for the request once the cache is gone
        EXPECT_GT(f.st->used + rounded(bytes), capacity) << e.what();
        continue;
      }
      ++allocs;
      const uintptr_t at = addr(p), end = at + static_cast<uintptr_t>(rounded(bytes));
      ASSERT_EQ(at % 512, 0u);
      // inside one live segment of the device
      auto seg = f.st->segments.upper_bound(at);
      ASSERT_NE(seg, f.st->segments.begin());
      --seg;
      ASSERT_LE(end, seg->first + static_cast<uintptr_t>(seg->second)) << "block runs past its segment";
      // no overlap with a live block
      auto nx = live_ranges.lower_bound(at);
      if (nx != live_ranges.end()) {
        ASSERT_LE(end, nx->first) << "handed out twice (next)";
      }
      if (nx != live_ranges.begin()) {
        ASSERT_LE(std::prev(nx)->second, at) << "handed out twice (prev)";
      }
      // no overlap with a range another stream freed whose event has not completed
      for (const Freed& fr : freed)
        if (fr.stream != s && fr.seq > f.st->completed[fr.stream] && at < fr.end && fr.at < end)
          FAIL() << "reused by another stream before the free's event completed (op " << op << ": [" << at << ", "
                 << end << ") on stream " << s << ", freed [" << fr.at << ", " << fr.end << ") on " << fr.stream
                 << " seq " << fr.seq << ", completed " << f.st->completed[fr.stream] << ")";
      // earlier uses of the range are now ordered before this owner's work (same stream, or
      // completed): a later free on any stream that waits for this owner covers them too
      std::erase_if(freed, [&](const Freed& fr) { return at < fr.end && fr.at < end; });
      live_ranges[at] = end;
      live.push_back({at, bytes, s});
    } else if (r < 95) {
      const size_t i = rng() % live.size();
      const Live l = live[i];
      live[i] = live.back();
      live.pop_back();
      // usually freed on its own stream, sometimes on another (after an ordering the test assumes)
      const cudaStream_t fs = rng() % 8 == 0 ? s : l.stream;
      f.a->free(reinterpret_cast<void*>(l.at), fs);
      live_ranges.erase(l.at);
      freed.push_back({l.at, l.at + static_cast<uintptr_t>(rounded(l.bytes)), fs, f.st->recorded[fs]});
    } else if (r < 99) {
      f.st->complete(s);
      std::erase_if(freed, [&](const Freed& fr) { return fr.seq <= f.st->completed[fr.stream]; });
    } else {
      f.a->trim();
    }
    if (op % 97 == 0) {
      ASSERT_EQ(f.a->check_consistency(), "") << "op " << op;
      const AllocatorStats st = f.a->stats();
      int64_t alloc_bytes = 0, requested = 0;
      for (const Live& l : live) {
        alloc_bytes += rounded(l.bytes);
        requested += l.bytes;
      }
      // a large block may keep a rest of up to 1 MiB that was not worth splitting off
      ASSERT_EQ(st.requested_bytes, requested);
      ASSERT_GE(st.allocated_bytes, alloc_bytes);
      ASSERT_LE(st.allocated_bytes, alloc_bytes + static_cast<int64_t>(live.size()) * MiB);
      ASSERT_EQ(st.live_blocks, static_cast<int64_t>(live.size()));
      ASSERT_EQ(st.reserved_bytes, f.st->used);
      ASSERT_EQ(st.segments, static_cast<int64_t>(f.st->segments.size()));
      ASSERT_LE(st.allocated_bytes, st.reserved_bytes);
    }
  }
  for (const Live& l : live) f.a->free(reinterpret_cast<void*>(l.at), l.stream);
  f.a->empty_cache();  // every block coalesced back into whole segments, all given back
  EXPECT_EQ(f.a->stats().reserved_bytes, 0);
  EXPECT_TRUE(f.st->segments.empty());
  EXPECT_EQ(f.st->bad_frees, 0);
  EXPECT_GT(allocs, ops / 4);
  std::printf("seed %u: %lld allocations, %lld out of memory, %lld segment mallocs, %lld oom retries\n", seed,
              static_cast<long long>(allocs), static_cast<long long>(ooms), static_cast<long long>(f.st->mallocs),
              static_cast<long long>(f.a->stats().oom_retries));
}

TEST(CachingAllocator, RandomizedAllocFreeNeverHandsOutABlockTwice) {
  for (uint32_t seed = 1; seed <= 5; ++seed) randomized(seed, int64_t{1} << 40, 20000);
}

TEST(CachingAllocator, RandomizedUnderMemoryPressureStaysConsistent) {
  for (uint32_t seed = 11; seed <= 13; ++seed) randomized(seed, 512 * MiB, 20000);
}

}  // namespace
}  // namespace ctx::exec::cuda
