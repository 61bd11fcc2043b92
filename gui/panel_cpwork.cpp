// Attention work per context-parallel rank for the selected plan (issue 20): one bar per CP rank,
// the query-key pairs it computes in one layer's forward pass for one sequence (App::rank_work,
// cp_work.hpp: the cost model's own numbers), a line at the mean, and the imbalance (max/mean - 1)
// that the slowest rank adds to the step.
#include <imgui.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "gui/panels.hpp"
#include "gui/plot.hpp"

namespace ctx::gui {
namespace {

constexpr ImU32 kMeanColor = IM_COL32(255, 230, 90, 255);
constexpr int kMaxLabelledRanks = 32;  // beyond this many bars the x axis is numeric (labels would overlap)

// Pairs are shown in millions or billions so the ticks stay short.
struct Unit {
  double scale;
  const char* name;
};
Unit pair_unit(double max_pairs) {
  if (max_pairs >= 1e9) return {1e9, "billion"};
  if (max_pairs >= 1e6) return {1e6, "million"};
  return {1, ""};
}

}  // namespace

void draw_cpwork_tab(App& app) {
  if (!app.have_prediction) {
    ImGui::TextDisabled("no prediction: fix the inputs or the plan (see the error panel)");
    return;
  }
  if (app.time_pending) {
    ImGui::TextDisabled("computing the per-rank work with the simulated step...");
    return;
  }
  const Plan& p = app.prediction.plan;
  const CpWork& w = app.rank_work;
  const std::string varlen = p.mask == MaskKind::document ? ", cp_varlen=" + to_string(p.cp_varlen) : "";
  ImGui::TextWrapped("Attention query-key pairs per CP rank, forward, one layer, one sequence: cp=%lld, cp_comm=%s, cp_layout=%s%s, mask=%s",
                     static_cast<long long>(p.cp), to_string(p.cp_comm), to_string(p.cp_layout), varlen.c_str(), mask_to_string(p).c_str());
  size_t argmax = 0;
  for (size_t i = 0; i < w.pairs.size(); ++i)
    if (w.pairs[i] > w.pairs[argmax]) argmax = i;
  const Unit u = pair_unit(w.max);
  ImGui::Text("mean %.4g, max %.4g %s pairs (rank %zu); imbalance max/mean - 1 = %.2f%%", w.mean / u.scale, w.max / u.scale, u.name, argmax,
              100 * w.imbalance);
  std::string notes;
  if (w.packs > 1) notes += "expectation over " + std::to_string(w.packs) + " packs sampled from the histogram; ";
  if (w.varlen_calls) notes += "the sum of the cp_varlen strategy's kernel calls; ";
  if (p.cp_comm == CpComm::a2a || p.cp_comm == CpComm::a2a_p2p) notes += "Ulysses: pairs x the rank's share of the heads; ";
  if (!notes.empty()) ImGui::TextDisabled("%s", notes.substr(0, notes.size() - 2).c_str());
  if (app.errors.count("plan")) ImGui::TextColored(ImVec4(0.95f, 0.75f, 0.3f, 1), "the selected plan is not valid: this is the last valid plan's chart");

  const size_t n = w.pairs.size();
  Axis x{-0.5, static_cast<double>(std::max<size_t>(n, 1)) - 0.5, false, "CP rank (position in the CP group)", Axis::Format::number};
  if (n <= kMaxLabelledRanks)
    for (size_t i = 0; i < n; ++i) x.categories.push_back(std::to_string(i));
  const std::string ylabel = std::string(*u.name ? u.name : "") + (*u.name ? " " : "") + "query-key pairs";
  Axis y{0, std::max(w.max, 1.0) / u.scale * 1.12, false, ylabel, Axis::Format::number};
  json shown_pairs = json::array();
  {
    PlotFrame f("cpwork", ImVec2(0, std::max(260.0f, ImGui::GetContentRegionAvail().y - 8)), x, y);
    const double half = n > 64 ? 0.5 : 0.36;  // many ranks: bars touch
    int hovered = -1;
    for (size_t i = 0; i < n; ++i) {
      const double cx = static_cast<double>(i), v = w.pairs[i] / u.scale;
      f.rect(cx - half, 0, cx + half, v, category_color(0), i == argmax && n > 1 ? IM_COL32(255, 255, 255, 220) : 0);
      if (f.hovered() && f.mouse().x >= f.px(cx - 0.5) && f.mouse().x < f.px(cx + 0.5)) hovered = static_cast<int>(i);
      shown_pairs.push_back(w.pairs[i]);
    }
    char mean_label[64];
    std::snprintf(mean_label, sizeof mean_label, "mean %.4g", w.mean / u.scale);
    f.hrule(w.mean / u.scale, kMeanColor, mean_label);
    f.legend({{"pairs per rank", category_color(0)}, {"mean", kMeanColor}});
    if (hovered >= 0) {
      const double v = w.pairs[static_cast<size_t>(hovered)];
      char line[128];
      std::snprintf(line, sizeof line, "rank %d: %.6g pairs, %.3f x the mean", hovered, v, w.mean > 0 ? v / w.mean : 0.0);
      tooltip_lines({line});
    }
    record_region(app, "cpwork.bars", f.outer_min(), f.outer_max());
  }
  app.shown["cpwork"] = {{"pairs", shown_pairs},
                         {"mean", w.mean},
                         {"max", w.max},
                         {"imbalance", w.imbalance},
                         {"varlen_calls", w.varlen_calls},
                         {"packs", w.packs},
                         {"plan", plan_to_string(p)}};
}

}  // namespace ctx::gui
