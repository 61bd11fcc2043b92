#include "gui/cp_work.hpp"

#include <algorithm>

#include "costmodel/attention_work.hpp"
#include "costmodel/step_model.hpp"

namespace ctx::gui {

CpWork cp_work(const Plan& p, int64_t seq) {
  CpWork w;
  // per rank (per_step = false): one entry per rank, or the calls that replace it (step_costs
  // prices call.count kernels of call.pairs[rank] each, in place of pairs[rank])
  const AttentionWork a = attention_work(p, seq, false);
  w.varlen_calls = !a.calls.empty();
  if (w.varlen_calls) {
    w.pairs.assign(a.pairs.size(), 0.0);
    for (const AttentionCall& call : a.calls)
      for (size_t r = 0; r < w.pairs.size() && r < call.pairs.size(); ++r)
        for (double x : call.pairs[r]) w.pairs[r] += call.count * x;
  } else {
    for (const auto& steps : a.pairs) {
      double s = 0;
      for (double x : steps) s += x;
      w.pairs.push_back(s);
    }
  }
  w.packs = static_cast<int64_t>(priced_packs(p, seq).size());
  for (double x : w.pairs) w.mean += x, w.max = std::max(w.max, x);
  if (!w.pairs.empty()) w.mean /= static_cast<double>(w.pairs.size());
  w.imbalance = w.mean > 0 ? w.max / w.mean - 1 : 0;
  return w;
}

}  // namespace ctx::gui
