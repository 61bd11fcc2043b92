#include "executor/memory_accounting.hpp"

#include <stdexcept>

namespace ctx::exec {

void MemoryLedger::snapshot_if_peak() {
  auto fill = [&](MemorySnapshot& s) {
    for (int i = 0; i < kMemCategories; ++i) s.bytes[i] = static_cast<double>(cur_[i]);
  };
  if (total_ > peak_total_) {
    peak_total_ = total_;
    fill(at_peak_);
    peak_phase_ = phase_;
  }
  int p = static_cast<int>(phase_);
  if (total_ > phase_peak_total_[p]) {
    phase_peak_total_[p] = total_;
    fill(phase_peak_[p]);
  }
}

void MemoryLedger::set_phase(Phase p) {
  phase_ = p;
  snapshot_if_peak();
}

void MemoryLedger::on_alloc(Mem c, int64_t bytes) {
  cur_[static_cast<int>(c)] += bytes;
  total_ += bytes;
  snapshot_if_peak();
}

void MemoryLedger::on_free(Mem c, int64_t bytes) {
  cur_[static_cast<int>(c)] -= bytes;
  total_ -= bytes;
  if (cur_[static_cast<int>(c)] < 0) throw std::logic_error("memory ledger: category freed below zero");
}

void MemoryLedger::on_host_alloc(HostMem c, int64_t bytes) {
  int i = static_cast<int>(c);
  host_cur_[i] += bytes;
  if (host_cur_[i] > host_peak_[i]) host_peak_[i] = host_cur_[i];
}

void MemoryLedger::on_host_free(HostMem c, int64_t bytes) { host_cur_[static_cast<int>(c)] -= bytes; }

void MemoryLedger::retag(Mem from, Mem to, int64_t bytes) {
  cur_[static_cast<int>(from)] -= bytes;
  cur_[static_cast<int>(to)] += bytes;
  snapshot_if_peak();
}

void MemoryLedger::reset_peaks() {
  peak_total_ = 0;
  phase_peak_total_ = {};
  at_peak_ = {};
  phase_peak_ = {};
  host_peak_ = host_cur_;
  snapshot_if_peak();
}

}  // namespace ctx::exec
