// The step time of a pipeline-parallel plan (pp > 1): each model chunk's forward and backward of
// one micro-batch priced on its own layers (the event simulator, or the closed form for the
// search), the activation sends between stages on the links the rank grid puts them on, the
// 1F1B or interleaved 1F1B schedule over them (pipeline_schedule.hpp), then each stage's
// gradient reduction and optimizer step after its last backward.
#pragma once
#include <cstdint>
#include <vector>

#include "costmodel/hardware_spec.hpp"
#include "costmodel/model_spec.hpp"
#include "costmodel/pipeline_schedule.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/runtime_profile.hpp"
#include "costmodel/step_model.hpp"

namespace ctx {

struct PipelineStepDetail {
  PipelineTimes times;               // what the schedule was given
  PipelineSchedule schedule;         // the exact schedule (simulated) or only step_s (closed form)
  std::vector<double> tail_s;        // [stage]: exposed gradient reduction + optimizer after its last backward
  double p2p_bytes = 0;              // one micro-batch's activation (or its gradient) between stages
  std::vector<bool> p2p_inter_node;  // [virtual boundary v -> v+1]: the send crosses nodes
  int critical_stage = 0;            // finishes last
};

// Seconds of sending `bytes` from every rank of physical stage `from` to its peer on stage `to`
// (the slowest rank's link: inter-node when any peer sits on another node).
bool pipeline_send_inter_node(const Plan& p, int64_t gpus_per_node, int64_t from, int64_t to);

// The step of plan `p` (p.pp > 1 expected; pp = 1 gives the pipeline of one stage). `simulate`:
// chunks priced by the event simulator and the exact schedule; otherwise the closed forms.
// `pre`, when given, must come from attention_work on the same layout with per_step = simulate.
StepTime pipeline_step_time(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt, const Plan& p,
                            int64_t seq, bool simulate, const AttentionWork* pre = nullptr,
                            PipelineStepDetail* detail = nullptr);

}  // namespace ctx
