#include "gui/plan_rows.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <sstream>
#include <unordered_set>

#include "costmodel/plan_check.hpp"

namespace ctx::gui {

PlanTable build_plan_table(const SearchRequest& req, const std::function<bool(double)>& progress) {
  auto t0 = std::chrono::steady_clock::now();
  PlanTable t;
  // 0..0.8: the search itself; 0.8..1: the plans that do not fit
  // every fitting plan is a row with its time: no pipeline plan is left unpriced (prune_pipeline)
  SearchRequest all = req;
  all.prune_pipeline = false;
  SearchResult r = search_plans(all, [&](double f) { return !progress || progress(0.8 * f); });
  t.enumerated = r.enumerated;
  t.valid = r.valid;
  t.fitting = r.fitting;
  t.simulated = r.simulated;
  t.cancelled = r.cancelled;
  t.no_fit_reason = r.no_fit_reason;
  t.not_dividing = r.not_dividing;
  t.lower_precision = r.lower_precision;
  t.seq = req.seq;
  t.runtime = req.runtime.name;
  std::unordered_set<std::string> on_frontier;
  for (auto& c : r.pareto) on_frontier.insert(plan_to_string(c.plan));
  std::unordered_set<std::string> seen;
  t.rows.reserve(r.ranked.size());
  for (size_t i = 0; i < r.ranked.size(); ++i) {
    const Candidate& c = r.ranked[i];
    PlanRow row;
    row.plan = c.plan;
    row.text = plan_to_string(c.plan);
    row.rank = static_cast<int>(i);
    row.fits = true;
    row.simulated = c.simulated;
    row.pareto = on_frontier.count(row.text) > 0;
    row.peak_bytes = c.peak_bytes;
    row.capacity_bytes = c.capacity_bytes;
    row.host_bytes_per_node = c.host_bytes_per_node;
    row.step_seconds = c.time.step_seconds;
    row.tokens_per_second = c.time.tokens_per_second;
    row.mfu = c.time.mfu;
    row.why = c.why;
    seen.insert(row.text);
    t.rows.push_back(std::move(row));
  }
  if (!r.cancelled) {
    const std::vector<Plan> all = enumerate_plans(req);
    for (size_t i = 0; i < all.size(); ++i) {
      if (progress && (i & 1023) == 0 && !progress(0.8 + 0.2 * static_cast<double>(i) / static_cast<double>(all.size()))) {
        t.cancelled = true;
        break;
      }
      Plan p = all[i];
      if (!plan_valid(p, req.model, req.cluster, req.seq)) continue;
      MemoryPrediction mem = predict_memory(req.model, req.cluster, req.runtime, p, req.seq);
      if (mem.fits()) continue;  // already ranked
      PlanRow row;
      row.plan = p;
      row.text = plan_to_string(p);
      if (!seen.insert(row.text).second) continue;
      row.peak_bytes = mem.peak.total();
      row.capacity_bytes = mem.device_capacity_bytes;
      row.host_bytes_per_node = mem.host_total_bytes_per_node;
      t.rows.push_back(std::move(row));
    }
  }
  t.complete = !t.cancelled;
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return t;
}

std::vector<std::string> search_notes(const PlanTable& t) {
  std::vector<std::string> out;
  if (t.not_dividing > 0)
    out.push_back(std::to_string(t.not_dividing) + " plans left out: their layout does not divide the " + std::to_string(t.seq) +
                  "-token sequence (pad=1 pads it and prices the pad tokens: add it to the fixed keys)");
  if (t.lower_precision)
    out.push_back("no plan fits at " + t.runtime +
                  "'s own optimizer precision: the plans below set the lower master/grads/moments it allows (the most precise "
                  "that fits each)");
  return out;
}

const char* column_name(PlanColumn c) {
  switch (c) {
    case PlanColumn::rank: return "#";
    case PlanColumn::plan: return "plan";
    case PlanColumn::fits: return "fits";
    case PlanColumn::step: return "step s";
    case PlanColumn::tokens_per_second: return "tokens/s";
    case PlanColumn::mfu: return "MFU";
    case PlanColumn::peak: return "peak GiB";
    case PlanColumn::headroom: return "headroom GiB";
    case PlanColumn::host: return "host GiB/node";
    case PlanColumn::cp_layout: return "CP layout";
    case PlanColumn::cp_varlen: return "varlen";
    default: return "?";
  }
}

std::string layout_cell(const Plan& p) { return p.cp > 1 ? to_string(p.cp_layout) : "-"; }
std::string varlen_cell(const Plan& p) { return p.mask == MaskKind::document ? to_string(p.cp_varlen) : "-"; }

namespace {

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// A value to sort by; rows that do not fit sort after those that do for time columns.
double sort_key(const PlanRow& r, PlanColumn c) {
  constexpr double kLast = 1e300;
  switch (c) {
    case PlanColumn::rank: return r.rank >= 0 ? r.rank : kLast;
    case PlanColumn::fits: return r.fits ? 0 : 1;
    case PlanColumn::step: return r.fits ? r.step_seconds : kLast;
    case PlanColumn::tokens_per_second: return r.fits ? -r.tokens_per_second : kLast;
    case PlanColumn::mfu: return r.fits ? -r.mfu : kLast;
    case PlanColumn::peak: return r.peak_bytes;
    case PlanColumn::headroom: return -(r.capacity_bytes - r.peak_bytes);
    case PlanColumn::host: return r.host_bytes_per_node;
    default: return 0;
  }
}

}  // namespace

std::vector<int> table_order(const PlanTable& t, const std::string& filter, bool fits_only, PlanColumn sort_by,
                             bool descending) {
  std::vector<std::string> words;
  std::stringstream ss(lower(filter));
  for (std::string w; ss >> w;) words.push_back(w);
  std::vector<int> order;
  order.reserve(t.rows.size());
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const PlanRow& r = t.rows[i];
    if (fits_only && !r.fits) continue;
    bool ok = true;
    if (!words.empty()) {
      const std::string text = lower(r.text);
      for (auto& w : words) ok = ok && text.find(w) != std::string::npos;
    }
    if (ok) order.push_back(static_cast<int>(i));
  }
  // "ascending" means best first for the time columns (fast, high tokens/s and MFU)
  if (sort_by == PlanColumn::plan || sort_by == PlanColumn::cp_layout || sort_by == PlanColumn::cp_varlen) {
    auto text = [&](int i) {
      const PlanRow& r = t.rows[static_cast<size_t>(i)];
      return sort_by == PlanColumn::plan ? r.text : sort_by == PlanColumn::cp_layout ? layout_cell(r.plan) : varlen_cell(r.plan);
    };
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return descending ? text(a) > text(b) : text(a) < text(b); });
  } else {
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      const double ka = sort_key(t.rows[a], sort_by), kb = sort_key(t.rows[b], sort_by);
      return descending ? ka > kb : ka < kb;
    });
  }
  return order;
}

}  // namespace ctx::gui
