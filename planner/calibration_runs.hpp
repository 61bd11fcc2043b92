// The measured runs `ctxplan calibrate --runs FILE` fits a runtime profile to (docs/CALIBRATION.md):
//   - a JSON document {"schema": "ctxplan.runs/1", "runs": [{...}, ...]}, each run naming its job
//     (model, cluster, plan, seq; optional runtime, attention, id) and its measurement: step_seconds
//     or step_ms (optional peak_bytes / peak_gib), or "measurement": a file ctxplan compare reads
//     (a Megatron-LM or torchtitan log, a torch.cuda.memory_stats() dump, a stack CSV:
//     stack_measurements.hpp), or "report": a ctxrun report (ctxplan.measurement/1) whose job it is;
//   - a CSV with a header of those column names, one run per row (quote plans: "cp=8,zero=3");
//   - a ctxrun report on its own.
// Bad input throws InputError naming the file, the line or run, the field and what is valid.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "costmodel/plan.hpp"
#include "costmodel/profile_store.hpp"

namespace ctx {

struct CalibrationRun {
  std::string id;
  std::string where;          // file:line or file: runs[i]
  std::string model_name, cluster_name, runtime_name, attention;  // runtime/attention empty: not stated
  ModelSpec model;
  ClusterSpec cluster;
  Plan plan;
  int64_t seq = 0;
  double measured_step_seconds = 0;
  std::optional<double> measured_peak_bytes;
  std::string measured_from;  // "step_seconds", "Megatron-LM log", "ctxrun report", ...
};

std::vector<CalibrationRun> read_calibration_runs(const Profiles& profiles, const std::string& path);

}  // namespace ctx
