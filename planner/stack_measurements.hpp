// Measurements from the stacks users already run, for `ctxplan compare PREDICTION.json RUN`:
//   - Megatron-LM iteration log lines (megatron/training/training.py training_log: "elapsed time per
//     iteration (ms)", "global batch size", "throughput per GPU (TFLOP/s/GPU)") and its memory report
//     lines ("memory (MB) | allocated | max allocated | reserved | max reserved", MB = 2^20 bytes);
//   - torchtitan metrics lines (torchtitan/components/metrics.py: "step: N  loss: ...  memory:
//     X GiB(Y%)  tps: T  tflops: F  mfu: M%", memory = max reserved, tps = tokens/s per GPU);
//   - a torch.cuda.memory_stats() dump as JSON ("allocated_bytes.all.peak", "reserved_bytes.all.peak");
//   - a plain CSV with a header of the columns listed in docs/STACKS.md (one row per step).
// The prediction is compared field by field with the rows each format measures.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "costmodel/memory_model.hpp"
#include "planner/compare.hpp"

namespace ctx {

struct StackMeasurement {
  std::string format;  // "Megatron-LM log", "torchtitan log", "torch.cuda.memory_stats", "CSV"
  std::string where;
  int64_t steps_read = 0, steps_used = 0;  // the first logged step is warm-up when there are more
  std::optional<double> step_seconds;                // mean over the steps used
  std::optional<double> tokens_per_second;           // whole job
  std::optional<double> tokens_per_second_per_gpu;   // torchtitan's tps
  std::optional<double> tflops_per_gpu, mfu;         // as the stack counts them (shown, not judged)
  std::optional<double> global_batch;                // samples per step (Megatron)
  std::optional<double> peak_allocated_bytes, peak_reserved_bytes;  // max over lines and ranks
  std::array<std::optional<double>, kMemCategories> category_bytes{};  // CSV columns named after the categories
  std::optional<double> forward_seconds, backward_seconds, optimizer_seconds;  // CSV
  std::vector<std::string> notes;
};

// Reads `path` when it is one of the formats above; nullopt when it is JSON with a "schema" (a ctxrun
// report, for compare_files). Throws InputError naming the file, line or column and what is valid.
std::optional<StackMeasurement> read_stack_measurement(const std::string& path);

Comparison compare_stack_measurement(const json& pred, const std::string& pred_where, const StackMeasurement& m,
                                     const CompareOptions& o);

// compare_files for a ctxrun report, compare_stack_measurement for the stacks' formats.
Comparison compare_any(const std::string& prediction_path, const std::string& run_path, const CompareOptions& o);

}  // namespace ctx
