// The Measurement a run reports: the Prediction schema's shape (costmodel/prediction.hpp) with
// measured numbers (per-category peak bytes at the peak instant, per-phase peaks, host bytes,
// per-phase seconds), the worst rank at the top level and every rank under "ranks", plus the
// per-step losses. `ctxplan compare prediction.json run.json` diffs it field by field.
#pragma once
#include <vector>

#include "costmodel/json_util.hpp"
#include "executor/trainer.hpp"

namespace ctx::exec {

struct RunRecord {
  std::string model, cluster, gpu;
  int64_t seq = 0;
  Plan plan;
  std::vector<double> losses, grad_norms, step_seconds;
  std::array<double, kPhases> phase_seconds{};  // summed over the measured steps
  int64_t measured_steps = 0;
  int64_t tokens_per_step = 0;
};

// Collective: gathers every rank's ledger; returns the JSON on every rank.
json measurement_json(Trainer& t, Backend& be, const RunRecord& r);

}  // namespace ctx::exec
