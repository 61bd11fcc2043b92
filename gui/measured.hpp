// Measured vs predicted: a ctxrun report has the Prediction's JSON shape (prediction_to_json) plus
// `losses`, so any document of that shape can be laid over the current prediction, field by field:
// memory by category, peak, host per node, step time and its phases.
#pragma once
#include <string>
#include <vector>

#include "costmodel/prediction.hpp"

namespace ctx::gui {

struct MeasuredReport {
  std::string path;
  std::string schema, model, cluster, runtime, plan_text;
  int64_t seq_tokens = 0;
  // each field: present or not (a report may carry memory only, or time only)
  struct Value {
    std::string name;             // "memory.by_category.activations", "time.step_seconds", ...
    std::string label;            // what the panel writes
    bool bytes = false;           // bytes (shown in GiB) or seconds / plain numbers
    double value = 0;
  };
  std::vector<Value> values;
  std::vector<double> losses;
  // A stack's log (planner/stack_measurements.hpp) states some rates per GPU or per sample; they
  // become tokens/s against the prediction's world and sequence. 0: not given.
  std::string format;                   // "ctxrun report", "Megatron-LM log", "torchtitan log", ...
  double tokens_per_second_per_gpu = 0;
  double global_batch_samples = 0;      // with step_seconds: tokens/s = samples x seq / step
};

// A ctxrun report (or any prediction-shaped JSON), or a stack's measurement: a Megatron-LM or
// torchtitan log, a torch.cuda.memory_stats() dump, a CSV (docs/STACKS.md).
// Throws InputError naming the file and the field on bad JSON or wrong types.
MeasuredReport load_measured_report(const std::string& path);

struct ComparisonRow {
  std::string name, label;
  bool bytes = false;
  double predicted = 0, measured = 0;
  double relative_error = 0;      // (measured - predicted) / predicted; 0 when both are 0
};
// One row per value the report carries, against the same field of `pred` (prediction_to_json).
std::vector<ComparisonRow> compare_to_prediction(const MeasuredReport& m, const Prediction& pred);

// Fields where the report's job differs from the prediction's (model, cluster, seq, plan).
std::vector<std::string> job_mismatches(const MeasuredReport& m, const Prediction& pred);

}  // namespace ctx::gui
