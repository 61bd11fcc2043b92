// A Prediction: what ctxplan says one step of a plan costs. A Measurement (ctxrun's report) has
// the same shape, so `compare` is a field-by-field diff. Schema "ctxplan.prediction/1".
#pragma once
#include <string>
#include <vector>

#include "costmodel/error_band.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/pipeline_time.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/simulator.hpp"
#include "costmodel/step_model.hpp"
#include "costmodel/zero_comm.hpp"

namespace ctx {

struct Prediction {
  std::string model, cluster, gpu, runtime;
  std::string attention;       // the attention kernel priced (attention_kernels.hpp)
  int64_t seq = 0;
  int64_t pad_tokens = 0;      // pad=1: tokens added to each sequence to reach the layout's multiple (priced at seq + pad_tokens)
  int64_t world = 0;
  Plan plan;
  MemoryPrediction memory;
  StepTime time;               // simulated (the event simulator)
  StepTime time_closed_form;   // the search's fast estimate, for comparison
  ErrorBand time_band;         // p10-p90 of the step time from the runtime's residuals (error_band.hpp)
  SimStats sim_stats;
  std::vector<ZeroCommTerm> zero_comm;  // the ZeRO/HSDP collectives of one step and their inter-node bytes (zero_comm.hpp)
  json pipeline;               // pp > 1: the schedule, its bubble and sends (pipeline_time.hpp); null otherwise
  std::vector<std::string> warnings;
};

// Checks the plan (throws InputError with the reason and nearest valid alternatives when it
// cannot run) and predicts it.
// With `sim` non-null the simulation (its tasks, for a trace) is returned there too. A pipeline
// plan (pp > 1) is priced stage by stage (pipeline_time.hpp); its `sim` carries the step time and
// no tasks.
Prediction predict(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt, Plan plan, int64_t seq,
                   SimResult* sim = nullptr, SimRecord record = SimRecord::tasks);

json step_time_to_json(const StepTime& t);

// The pipeline's schedule for a prediction's JSON: stages, chunks, micro-batches, bubble, sends.
json pipeline_to_json(const Plan& p, const ModelSpec& m, const PipelineStepDetail& d);

// {"method", "residuals", "basis", "p10_step_seconds", "p90_step_seconds", "p10_ratio", "p90_ratio", "few_residuals"}
json error_band_to_json(const ErrorBand& b, double step_seconds);

json prediction_to_json(const Prediction& p);

}  // namespace ctx
