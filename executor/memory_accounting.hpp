// The accounting allocator's ledger: every byte a backend allocates is tagged with one of the cost
// model's categories (costmodel/memory_model.hpp: Mem for device, HostMem for host) and the ledger
// keeps current and peak bytes per category, the breakdown at the instant of the overall peak, and
// each phase's own peak instant, so a run reports the same shape the memory model predicts.
#pragma once
#include <array>
#include <cstdint>

#include "costmodel/memory_model.hpp"

namespace ctx::exec {

class MemoryLedger {
 public:
  void on_alloc(Mem c, int64_t bytes);
  void on_free(Mem c, int64_t bytes);
  void on_host_alloc(HostMem c, int64_t bytes);
  void on_host_free(HostMem c, int64_t bytes);
  // Moves bytes from one category to another without a new allocation (a tensor changing role).
  void retag(Mem from, Mem to, int64_t bytes);

  // Enters a phase; what is allocated at entry counts toward the phase's peak (a phase that only
  // computes in place, like the optimizer, still reports the memory it runs in).
  void set_phase(Phase p);
  Phase phase() const { return phase_; }
  // Forgets the peaks (keeps what is allocated now); called after set-up so a step's peak is measured.
  void reset_peaks();

  int64_t current(Mem c) const { return cur_[static_cast<int>(c)]; }
  int64_t current_total() const { return total_; }
  int64_t peak_total() const { return peak_total_; }
  const MemorySnapshot& at_peak() const { return at_peak_; }          // breakdown at the overall peak
  Phase peak_phase() const { return peak_phase_; }
  const MemorySnapshot& phase_peak(Phase p) const { return phase_peak_[static_cast<int>(p)]; }
  int64_t host_current(HostMem c) const { return host_cur_[static_cast<int>(c)]; }
  int64_t host_peak(HostMem c) const { return host_peak_[static_cast<int>(c)]; }

 private:
  void snapshot_if_peak();
  std::array<int64_t, kMemCategories> cur_{};
  std::array<int64_t, kHostCategories> host_cur_{}, host_peak_{};
  int64_t total_ = 0, peak_total_ = 0;
  MemorySnapshot at_peak_{};
  Phase peak_phase_ = Phase::forward;
  std::array<MemorySnapshot, kPhases> phase_peak_{};
  std::array<int64_t, kPhases> phase_peak_total_{};
  Phase phase_ = Phase::forward;
};

}  // namespace ctx::exec
