#include "gui/maxseq_curve.hpp"

#include <algorithm>

#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"

namespace ctx::gui {

bool family_member(const Plan& family, const ClusterSpec& cluster, Plan* out) {
  const int64_t world = world_size(cluster);
  Plan p = family;
  // keep the family's TP where it divides the GPUs and fits in a node; the rest is CP
  p.tp = std::min({family.tp, world, cluster.gpus_per_node});
  while (p.tp > 1 && world % p.tp != 0) --p.tp;
  p.cp = world / p.tp;
  p.dp = 1;
  p.mbs = 1;
  p.ga = 1;
  if (p.cp == 1) {
    set_cp_kind(p, CpKind::zigzag);
    p.ulysses = 0;
  } else if (p.cp_comm == CpComm::a2a_p2p) {
    p.ulysses = std::min(family.ulysses, p.cp);
    if (p.ulysses >= p.cp) p.cp_comm = CpComm::a2a, p.ulysses = 0;
  }
  if (p.zero > 0 && p.cp * p.dp == 1) p.zero = 0;
  // HSDP keeps its shard size where it still splits the ranks into several groups, else shards over all
  if (p.zero == 0 || p.zero_shard >= p.cp * p.dp || (p.cp * p.dp) % std::max<int64_t>(1, p.zero_shard) != 0) p.zero_shard = 0;
  if (p.param_offload && p.zero != 3) p.param_offload = false;
  *out = p;
  return true;
}

MaxSeqCurve max_seq_curve(const SearchRequest& req, const Plan& family, int64_t max_gpus, int64_t hi_tokens,
                          const std::function<bool(double)>& progress) {
  MaxSeqCurve c;
  c.hi_tokens = hi_tokens;
  c.family = "tp<=" + std::to_string(family.tp) + ", cp=rest, " + to_string(cp_kind_of(family)) + ", zero=" +
               std::to_string(family.zero) + (family.zero_shard > 0 ? ", zero_shard=" + std::to_string(family.zero_shard) : "") + ", recompute=" + to_string(family.recompute) + (family.ckpt_offload ? ", ckpt_offload" : "") +
               (family.opt_offload ? ", opt_offload" : "") + (family.param_offload ? ", param_offload" : "");
  std::vector<int64_t> counts;
  for (int64_t g = 1; g <= max_gpus; g *= 2) counts.push_back(g);
  for (size_t i = 0; i < counts.size(); ++i) {
    if (progress && !progress(static_cast<double>(i) / static_cast<double>(counts.size()))) {
      c.cancelled = true;
      break;
    }
    MaxSeqPoint pt;
    pt.gpus = counts[i];
    SearchRequest r = req;
    r.cluster = resized_cluster(req.cluster, counts[i]);
    r.global_batch_tokens = 0;  // the longest sequence of one step, not a batch
    Plan member;
    if (family_member(family, r.cluster, &member)) {
      Plan probe = member;
      const int64_t g = seq_granule(probe);
      if (plan_valid(probe, r.model, r.cluster, std::max<int64_t>(g, (std::min<int64_t>(hi_tokens, 1 << 20) / g) * g))) {
        pt.family_tokens = max_trainable_seq(r.model, r.cluster, r.runtime, probe, hi_tokens);
        pt.family_plan = plan_to_string(probe);
      }
    }
    Plan best;
    pt.any_tokens = max_trainable_seq_any(r, hi_tokens, &best);
    if (pt.any_tokens > 0) pt.any_plan = plan_to_string(best);
    c.points.push_back(std::move(pt));
  }
  return c;
}

}  // namespace ctx::gui
