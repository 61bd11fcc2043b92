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
// Whole-model granularity (every unit once per pass; a tied head's second gather is not listed).
std::vector<ZeroCommTerm> zero_comm_terms(const Plan& p, const LocalShapes& s, const RuntimeProfile& rt, int64_t gpus_per_node);

}  // namespace ctx
