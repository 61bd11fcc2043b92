// Max trainable sequence vs GPU count: for the selected plan's family (its CP kind, ZeRO stage,
// recompute, offloads and tiling, with TP kept and every other GPU put on context parallelism,
// dp = 1) and for the best plan of the whole search space. Runs on a worker thread.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "planner/search.hpp"

namespace ctx::gui {

struct MaxSeqPoint {
  int64_t gpus = 0;
  int64_t family_tokens = 0;      // 0: the family has no valid plan or nothing fits
  std::string family_plan;
  int64_t any_tokens = 0;
  std::string any_plan;
};

struct MaxSeqCurve {
  std::vector<MaxSeqPoint> points;
  std::string family;             // the family's fixed keys, for the legend
  int64_t hi_tokens = 0;          // the search's ceiling
  bool cancelled = false;
  std::string job_key;
};

// The family member on `gpus` GPUs (`cluster` already resized); false when no member exists.
bool family_member(const Plan& family, const ClusterSpec& cluster, Plan* out);

// GPU counts 1, 2, 4, ... up to max_gpus (whole nodes beyond one node).
MaxSeqCurve max_seq_curve(const SearchRequest& req, const Plan& family, int64_t max_gpus, int64_t hi_tokens,
                          const std::function<bool(double)>& progress);

}  // namespace ctx::gui
