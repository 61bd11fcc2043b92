// The per-rank attention work chart's data (issue 20): for the selected plan, the query-key pairs
// each CP rank computes in the forward pass of one layer for one sequence (times the share of the
// heads a Ulysses rank holds), exactly as the cost model prices them: costmodel attention_work
// (step_model.hpp), i.e. attention_pairs_per_rank over the plan's placement, or, where cp_varlen
// (cycle, split:k) replaces the one varlen call per step, the sum of its calls. For doc:hist masks
// the numbers are the expectation over the priced packs (kPricedPacks packs sampled with a fixed seed).
#pragma once
#include <cstdint>
#include <vector>

#include "costmodel/plan.hpp"

namespace ctx::gui {

struct CpWork {
  std::vector<double> pairs;    // per CP rank (index = position in the CP group)
  double mean = 0, max = 0;
  double imbalance = 0;         // max/mean - 1: how much longer the slowest rank's attention runs
  bool varlen_calls = false;    // the pairs are the sum of cp_varlen's calls (cycle, split:k)
  int64_t packs = 1;            // packs the expectation is over (1 without a histogram)
};

CpWork cp_work(const Plan& p, int64_t seq);

}  // namespace ctx::gui
