// `ctxplan compare`: a Prediction (ctxplan.prediction/1, what `ctxplan predict --json` writes) against
// a Measurement (ctxplan.measurement/1, what `ctxrun --report` writes), row by row: memory by
// category at the peak instant, the peak, host memory, time per phase, the step and tokens/s.
#pragma once
#include <string>
#include <vector>

#include "costmodel/json_util.hpp"

namespace ctx {

struct CompareOptions {
  double mem_tolerance = 0.02;    // |relative error| allowed on memory rows
  double time_tolerance = 0.10;   // |relative error| allowed on time rows
  int64_t rank = -1;              // -1: memory of the rank with the highest peak, time of the slowest rank
  bool allow_mismatch = false;    // compare even when model, seq, world or plan differ (warn instead)
};

struct CompareRow {
  std::string section;            // "memory" or "time"
  std::string name;               // "weights", "total (peak)", "forward+backward", ...
  std::string unit;               // "bytes", "seconds", "tokens/s"
  bool has_predicted = true;      // false: the prediction has no such row (measured only)
  double predicted = 0, measured = 0;
  double abs_error = 0;           // measured - predicted
  bool rel_defined = false;       // false when predicted is 0 and measured is not (or no prediction)
  double rel_error = 0;           // (measured - predicted) / predicted; 0 when both are 0
  bool judged = true;             // false: shown for reading only (the mapping is not 1:1)
  double tolerance = 0;
  bool miss = false;              // judged and |rel_error| > tolerance (or undefined)
  std::string note;               // how the two sides were mapped, when not 1:1
};

struct Comparison {
  std::string prediction_file, measurement_file;
  std::string prediction_source;  // "file" or "embedded" (the report's own "prediction")
  std::string model, cluster, plan, prediction_runtime, measurement_runtime, backend;
  int64_t seq = 0, world = 0;
  int64_t memory_rank = 0, time_rank = 0;
  std::string memory_rank_why, time_rank_why;
  CompareOptions options;
  std::vector<CompareRow> rows;
  std::vector<std::string> mapping;   // how categories and phases were paired (printed and in JSON)
  std::vector<std::string> warnings;
  int judged = 0, misses = 0;
  // the prediction's p10-p90 step-time band (prediction_to_json "time.band"), when it has one, and
  // whether the measured step lies in it
  bool has_band = false, step_in_band = false;
  double band_low_seconds = 0, band_high_seconds = 0, band_measured_seconds = 0;
  std::string band_basis;
};

// Fills the band fields from the prediction document and the comparison's judged "step" row.
void judge_step_band(Comparison& c, const json& pred);

// Reads both files (run_path empty: prediction_path is a ctxplan.measurement/1 report compared with
// the prediction it embeds). Bad input throws InputError naming the file, the field and what is valid.
Comparison compare_files(const std::string& prediction_path, const std::string& run_path, const CompareOptions& o);
// The same on parsed documents (`pred` may be the report's "prediction" object: pred_prefix says so).
Comparison compare_documents(const json& pred, const std::string& pred_where, const std::string& pred_prefix,
                             const json& run, const std::string& run_where, const CompareOptions& o);

std::string comparison_table(const Comparison& c);
json comparison_to_json(const Comparison& c);   // schema "ctxplan.comparison/1"

}  // namespace ctx
