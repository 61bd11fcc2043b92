// Max trainable sequence vs GPU count: the selected plan's family and the best plan of the
// whole search space, computed on a worker thread.
#include <imgui.h>

#include <algorithm>

#include "gui/panels.hpp"
#include "gui/plot.hpp"

namespace ctx::gui {

void draw_maxseq_tab(App& app) {
  View& v = app.state.view;
  static const int64_t choices[] = {8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
  ImGui::SetNextItemWidth(120);
  if (ImGui::BeginCombo("up to GPUs", std::to_string(v.maxseq_max_gpus).c_str())) {
    for (int64_t c : choices)
      if (ImGui::Selectable(std::to_string(c).c_str(), c == v.maxseq_max_gpus)) v.maxseq_max_gpus = c;
    ImGui::EndCombo();
  }
  ImGui::SameLine();
  if (app.maxseq_running()) {
    ImGui::ProgressBar(static_cast<float>(app.maxseq_progress()), ImVec2(200, 0), "bisecting");
    ImGui::SameLine();
    if (ImGui::Button("Cancel")) app.cancel_maxseq();
  } else if (!app.curve_current()) {
    if (ImGui::Button("Compute")) app.start_maxseq();
  }
  const MaxSeqCurve& c = app.curve;
  if (c.points.empty()) {
    ImGui::TextDisabled("computing the curve...");
    return;
  }
  if (!app.curve_current()) {
    ImGui::SameLine();
    ImGui::TextColored(ImVec4(0.95f, 0.75f, 0.3f, 1), "curve for previous inputs or plan");
  }
  ImGui::TextDisabled("family: %s", c.family.c_str());

  int64_t lo = c.hi_tokens, hi = 1;
  std::vector<double> gx, fy, gxa, ay;
  for (auto& p : c.points) {
    if (p.family_tokens > 0) gx.push_back(static_cast<double>(p.gpus)), fy.push_back(static_cast<double>(p.family_tokens));
    if (p.any_tokens > 0) gxa.push_back(static_cast<double>(p.gpus)), ay.push_back(static_cast<double>(p.any_tokens));
    for (int64_t t : {p.family_tokens, p.any_tokens})
      if (t > 0) lo = std::min(lo, t), hi = std::max(hi, t);
  }
  const int64_t current_seq = app.job ? app.job->seq_tokens : 0;
  const int64_t current_gpus = app.job ? world_size(app.job->cluster) : 0;
  if (current_seq > 0) lo = std::min(lo, current_seq), hi = std::max(hi, current_seq);
  hi = std::max(hi, std::min(c.hi_tokens, hi * 2));  // room above the top point (and the ceiling when close)
  if (hi < lo) lo = 4096, hi = c.hi_tokens;
  Axis x{1, static_cast<double>(c.points.back().gpus), true, "GPUs", Axis::Format::count2};
  Axis y{static_cast<double>(lo), static_cast<double>(hi), true, "max trainable tokens per sequence", Axis::Format::tokens};
  pad_axis(x, 0.04);
  pad_axis(y, 0.1);
  PlotFrame f("maxseq", ImVec2(0, 0), x, y);
  const ImU32 fam = category_color(0), any = category_color(1);
  f.line(gxa, ay, any, 2);
  f.line(gx, fy, fam, 2);
  int hovered = -1;
  bool hovered_any = false;
  float best = 64;
  for (size_t i = 0; i < c.points.size(); ++i) {
    const MaxSeqPoint& p = c.points[i];
    for (int which = 0; which < 2; ++which) {
      const int64_t t = which ? p.any_tokens : p.family_tokens;
      if (t <= 0) continue;
      f.point(static_cast<double>(p.gpus), static_cast<double>(t), 4, which ? any : fam);
      const float dx = f.px(static_cast<double>(p.gpus)) - f.mouse().x, dy = f.py(static_cast<double>(t)) - f.mouse().y;
      if (f.hovered() && dx * dx + dy * dy < best) best = dx * dx + dy * dy, hovered = static_cast<int>(i), hovered_any = which;
    }
  }
  if (current_seq > 0) {
    f.hrule(static_cast<double>(current_seq), IM_COL32(200, 200, 200, 160), ("current " + tokens_text(current_seq)).c_str());
    f.point(static_cast<double>(current_gpus), static_cast<double>(current_seq), 6, IM_COL32(255, 255, 255, 255), false);
  }
  bool at_ceiling = false;
  for (auto& p : c.points)  // within 1% of the ceiling: the true maximum may be higher
    at_ceiling = at_ceiling || std::max(p.any_tokens, p.family_tokens) >= c.hi_tokens / 100 * 99;
  if (at_ceiling) f.hrule(static_cast<double>(c.hi_tokens), IM_COL32(235, 80, 80, 200), ("search ceiling " + tokens_text(c.hi_tokens)).c_str());
  f.legend({{"selected plan's family", fam}, {"best plan of the search space", any}}, true);
  if (hovered >= 0) {
    const MaxSeqPoint& p = c.points[static_cast<size_t>(hovered)];
    const int64_t t = hovered_any ? p.any_tokens : p.family_tokens;
    tooltip_lines({std::to_string(p.gpus) + " GPUs: " + tokens_text(t) + " tokens", hovered_any ? p.any_plan : p.family_plan});
  }
  record_region(app, "maxseq.plot", f.outer_min(), f.outer_max());
  json pts = json::array();
  for (auto& p : c.points) pts.push_back({{"gpus", p.gpus}, {"family_tokens", p.family_tokens}, {"any_tokens", p.any_tokens}});
  app.shown["maxseq"] = {{"points", pts}, {"family", c.family}, {"current", app.curve_current()}};
}

}  // namespace ctx::gui
