// The step time of a pipeline-parallel plan (pp > 1): each model chunk's forward and backward of
// one micro-batch priced on its own layers (even, or an uneven split's: pipeline_chunk_layers, so
// that unequal chunks give the schedule unequal stage times) (the event simulator, or the closed form for the
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
  PipelineSchedule schedule;         // the exact schedule (simulated) or only step_s and end_s (closed form)
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

// A lower bound of pipeline_step_time(m, c, rt, p, seq, false).step_seconds for one step_costs of
// the whole model instead of the ten or so the chunks and stage tails take (the search prunes with
// it, planner/search.cpp). Derivation, with M micro-batches, P stages, C chunks per stage, t_s one
// micro-batch's forward and backward on stage s (all its chunks) and T = sum_s t_s:
//  - the closed form (pipeline_schedule.hpp) is at least, for every stage s, the forwards and
//    backwards of the stages before s (chunk 0's, part of their t_j) plus M t_s. For C = 1 that is
//    g_s = sum_{j<s} t_j + M t_s; the weights l_s = (1/M)(1 - 1/M)^(P-1-s) c, c = 1 / (1 - (1 -
//    1/M)^P), sum to 1 and give every t_j the same coefficient c (M l_j + sum_{s>j} l_s = c), so
//    max_s g_s >= sum_s l_s g_s = c T: the bound T / (1 - (1 - 1/M)^P) (T for M = 1, about
//    M T / P + T (P - 1) / (2 P) for M >> P). For C > 1 (the exact schedule or the paths, both >=
//    M t_max): M t_max >= M T / P;
//  - a chunk's seconds (estimate_step of its costs) are at least its slowest rank's, hence at least
//    the mean rank's compute, which is linear in the chunk's layers plus the head on the last
//    chunk: T >= the whole model's compute for one micro-batch (estimate_step's breakdown.compute
//    of the plan with pp = 1, ga = 1);
//  - the stage tails and a fixed per-step overhead only add.
// Uneven splits change none of it: the chunks' layers still sum to the model's.
// tests/test_search.cpp checks it against every pipeline plan of a search space.
double pipeline_step_lower_bound_s(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt, const Plan& p,
                                   int64_t seq, const AttentionWork* pre = nullptr);

}  // namespace ctx
