// A Prediction: what ctxplan says one step of a plan costs. A Measurement (ctxrun's report) has
// the same shape, so `compare` is a field-by-field diff. Schema "ctxplan.prediction/1".
#pragma once
#include <string>
#include <vector>

#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"

namespace ctx {

struct Prediction {
  std::string model, cluster, gpu, runtime;
  int64_t seq = 0;
  int64_t world = 0;
  Plan plan;
  MemoryPrediction memory;
  std::vector<std::string> warnings;
};

// Checks the plan (throws InputError with the reason and nearest valid alternatives when it
// cannot run) and predicts it.
Prediction predict(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt, Plan plan, int64_t seq);

json prediction_to_json(const Prediction& p);

}  // namespace ctx
