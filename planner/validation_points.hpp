// The published step-time points the repo carries (profiles/validation/published_time.jsonl),
// predicted with only the facts their sources state: `ctxplan validate` prints them, and their
// residuals are the error band of a built-in runtime (costmodel/error_band.hpp).
#pragma once
#include <string>
#include <vector>

#include "costmodel/prediction.hpp"

namespace ctx {

std::vector<json> read_jsonl(const std::string& path);

// A point's role: "fit" (absent: the points the built-in profiles were developed against, whose
// residuals are the runtimes' error bands) or "check" (added only to be compared: never in a band
// or a calibration). `ctxplan validate` reports the two apart.
std::string point_role(const JsonReader& r);

// The published metric, computed from a predicted step the way the source computed it. `gpu` is
// the point's card: the NVML reading (nvml_used_gib) adds what the card holds beyond what a process
// can allocate (its CUDA context: hbm_bytes - usable_bytes, the hardware profile's figures).
double metric_from(const std::string& def, const ModelSpec& m, const HardwareSpec& gpu, const Prediction& p);

// True for the memory definitions (GiB of device memory), false for a step time or a rate.
bool memory_metric_definition(const std::string& def);

// A maximum-sequence point against what its source states: the longest length that ran (`ran`) and,
// where the source also states one, the shortest length that failed (`failed`; 0: none stated). A
// prediction in [ran, failed) agrees with every stated fact: ratio 1. Below `ran`: predicted / ran;
// at or above `failed` (it would fit where the run failed): predicted / failed. Without a stated
// failure the length that ran stands for the limit (the authors raised the length until it failed:
// ArcticTraining's README), as before: predicted / ran.
double max_seq_error_ratio(double predicted, double ran, double failed);

struct PublishedTimeRow {
  std::string id, point, metric, runtime, gpu, plan, note;
  std::string model, source_plan;  // the model's name and the plan as the point states it (docs/VALIDATION.md's tables)
  int64_t gpus = 0, seq = 0;       // the cluster's GPUs, the sequence length
  std::string attention;      // the kernel priced: the point's stated one, else the runtime's default
  std::string role = "fit";   // "fit": feeds the runtime's error band; "check": only compared (point_role)
  double published = 0, predicted = 0;
  double step_log_ratio = 0;  // ln(measured / predicted step time) this metric implies (0 for memory)
  double predicted_step_seconds = 0;  // the predicted step; x exp(step_log_ratio): the step the published metric implies
  // the metric predicted out of sample: where the runtime was calibrated on this point (its calibration
  // record's leave-one-out step), the metric at that step; else the prediction (already out of sample)
  double predicted_out_of_sample = 0;
  bool leave_one_out = false;  // predicted_out_of_sample comes from a leave-one-out fit
  bool time_metric = true;    // a step time or a rate; false for a memory metric (no residual for the band)
};

// Every point (its id containing `only`, of runtime `runtime`; empty: all), in file order.
std::vector<PublishedTimeRow> predict_published_time(const Profiles& profiles, const std::string& only, const std::string& runtime);

// One residual per published fit point (a point's metrics are one run: the mean of their step log
// ratios) of this runtime; check points are left out. Computed once per process and runtime name.
std::vector<TimeResidual> published_time_residuals(const Profiles& profiles, const std::string& runtime);

// The runtime with residuals for its error band: its own (a calibrated profile's), else those of the
// published points of its name.
RuntimeProfile with_time_residuals(const Profiles& profiles, RuntimeProfile rt);

}  // namespace ctx
