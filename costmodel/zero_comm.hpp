// The data-parallel collectives of ZeRO and HSDP (plan keys zero, zero_shard): which collective on
// which group moves the parameters and the gradients. The step model prices them per parameter unit
// (step_model.cpp); zero_comm_terms lists them per step for a prediction's breakdown, with the bytes
// each moves and the share of them that leaves a node.
//
//   zero=3           all-gather of a unit's weights before its forward and again before its backward,
//                    over the shard group (zero_shard ranks; all dp*cp without HSDP)
//   zero>=2          reduce-scatter of a unit's gradients every micro-batch over the shard group,
//     HSDP           then an all-reduce of the 1/zero_shard shard over the replicate group (FSDP2 HSDP,
//                    Megatron's distributed-optimizer instances: inside the group, then across groups);
//                    HSDP's zero=1 does the same once per step (Megatron's instances)
//   zero<=1          all-reduce of the gradients once per step over all dp*cp ranks (without HSDP)
//   zero=1,2         all-gather of the updated weights after the optimizer, over the shard group
#pragma once
#include <string>
#include <vector>

#include "costmodel/collectives.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/runtime_profile.hpp"

namespace ctx {

// The gradient reduction inside the shard group (or over dp*cp for zero<=1 without HSDP), and
// whether the shard is then all-reduced across the replicate groups (HSDP, zero>=1).
Coll zero_grad_collective(const Plan& p);
Group zero_grad_group(const Plan& p);
bool zero_grad_replicated(const Plan& p);  // HSDP with zero>=2: the all-reduce of the shard

struct ZeroCommTerm {
  std::string name;                  // zero3_param_all_gather, grad_reduce_scatter, grad_replicate_all_reduce, grad_all_reduce, param_all_gather
  Coll coll = Coll::all_gather;
  Group group = Group::zero;
  GroupPlacement where;
  double message_bytes = 0;          // one call on the whole model's parameters of this TP rank
  double calls_per_step = 0;
  double inter_node_bytes_per_rank = 0;  // per step (inter_node_bytes_per_rank of collectives.hpp x calls)
};
// Whole-model granularity (every unit once per pass; a tied head's second gather is not listed),
// on the s.params one rank holds: the whole model's (pp = 1).
std::vector<ZeroCommTerm> zero_comm_terms(const Plan& p, const LocalShapes& s, const RuntimeProfile& rt, int64_t gpus_per_node);

// The same for plan p of model m: with pp > 1 each pipeline rank holds and reduces only its stage's
// parameters (its layers, the embedding on the first stage, the final norm and head on the last:
// pipeline_stage_params, pp_first/pp_last/pp_embed/pp_loss splits included), and the terms are the
// largest stage's (the one its collectives take longest on); `stage`, when given, gets that stage
// (0 when pp = 1). Megatron's all-reduce of a tied embedding's gradient between the first and last
// stage (the embedding group) is not listed here (not a data-parallel group); the time model prices
// it in both end stages' tails (pipeline_time.cpp).
std::vector<ZeroCommTerm> zero_comm_terms(const ModelSpec& m, const Plan& p, const LocalShapes& s, const RuntimeProfile& rt,
                                          int64_t gpus_per_node, int64_t* stage = nullptr);

}  // namespace ctx
