#include "costmodel/zero_comm.hpp"

#include <algorithm>

#include "costmodel/pipeline_stages.hpp"

namespace ctx {

bool zero_grad_replicated(const Plan& p) { return p.zero >= 1 && zero_replicate_degree(p) > 1; }
Coll zero_grad_collective(const Plan& p) { return p.zero >= 2 || zero_grad_replicated(p) ? Coll::reduce_scatter : Coll::all_reduce; }
Group zero_grad_group(const Plan& p) { return p.zero >= 2 || zero_grad_replicated(p) ? Group::zero_shard : Group::zero; }

std::vector<ZeroCommTerm> zero_comm_terms(const Plan& p, const LocalShapes& s, const RuntimeProfile& rt, int64_t gpus_per_node) {
  std::vector<ZeroCommTerm> out;
  const double n = static_cast<double>(zero_shard_degree(p)), ga = static_cast<double>(p.ga);
  auto add = [&](const char* name, Coll c, Group g, double bytes, double calls) {
    ZeroCommTerm t;
    t.name = name;
    t.coll = c;
    t.group = g;
    t.where = group_placement(p, g, gpus_per_node);
    if (t.where.size <= 1) return;
    t.message_bytes = bytes;
    t.calls_per_step = calls;
    t.inter_node_bytes_per_rank = calls * inter_node_bytes_per_rank(c, bytes, t.where);
    out.push_back(std::move(t));
  };
  if (p.zero == 3) add("zero3_param_all_gather", Coll::all_gather, Group::zero_shard, s.params * rt.weight_bytes, 2.0 * ga);
  // ZeRO-2/3 reduce every micro-batch, ZeRO-0/1 once per step (step_model.cpp's grad_reduce_every_microbatch),
  // in the stack's communication dtype (grad_comm_bytes; bf16 for DeepSpeed, fp32 for Megatron and FSDP2)
  const double grad_calls = p.zero >= 2 ? ga : 1.0;
  add(zero_grad_collective(p) == Coll::reduce_scatter ? "grad_reduce_scatter" : "grad_all_reduce", zero_grad_collective(p), zero_grad_group(p),
      s.params * rt.grad_comm_bytes, grad_calls);
  if (zero_grad_replicated(p))
    add("grad_replicate_all_reduce", Coll::all_reduce, Group::zero_replicate, s.params * rt.grad_comm_bytes / n, grad_calls);
  if (p.zero == 1 || p.zero == 2) add("param_all_gather", Coll::all_gather, Group::zero_shard, s.params * rt.weight_bytes, 1.0);
  return out;
}

std::vector<ZeroCommTerm> zero_comm_terms(const ModelSpec& m, const Plan& p, const LocalShapes& s, const RuntimeProfile& rt,
                                          int64_t gpus_per_node, int64_t* stage) {
  if (stage) *stage = 0;
  if (std::max<int64_t>(1, p.pp) == 1) return zero_comm_terms(p, s, rt, gpus_per_node);
  // the stage with the most parameters on one TP rank (layers x layer_params, embedding, head)
  LocalShapes st = s;
  st.params = 0;
  for (int64_t k = 0; k < p.pp; ++k) {
    const double held = pipeline_stage_params(m, pipeline_stage(m, p, k), s.layer_params, s.vocab);
    if (held > st.params) {
      st.params = held;
      if (stage) *stage = k;
    }
  }
  return zero_comm_terms(p, st, rt, gpus_per_node);
}

}  // namespace ctx
