// Measured vs predicted: a ctxrun report (or any prediction-shaped JSON) laid over the selected
// plan's prediction, memory by category side by side, times and the error of every field, and
// the report's loss curve when it has one.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>

#include "gui/panels.hpp"
#include "gui/plot.hpp"

namespace ctx::gui {

void draw_measured_tab(App& app) {
  static std::string path;
  if (path.empty()) path = app.state.measured_path;
  ImGui::SetNextItemWidth(420);
  const bool enter = ImGui::InputTextWithHint("##report", "a ctxrun report, predict --json, Megatron/torchtitan log, memory_stats JSON or CSV", &path,
                                              ImGuiInputTextFlags_EnterReturnsTrue);
  ImGui::SameLine();
  if (ImGui::Button("Load") || enter) app.load_measured(path);
  if (app.measured) {
    ImGui::SameLine();
    if (ImGui::Button("Close")) {
      app.load_measured("");
      path.clear();
    }
  }
  if (!app.measured) {
    ImGui::TextDisabled("no report loaded");
    return;
  }
  const MeasuredReport& m = *app.measured;
  if (!app.have_prediction) {
    ImGui::TextDisabled("no prediction to compare with");
    return;
  }
  ImGui::TextDisabled("%s (%s)", m.path.c_str(), m.schema.c_str());
  if (app.time_pending) ImGui::TextDisabled("simulating the selected plan; times below are for the previous one");
  const std::vector<std::string> mismatches = job_mismatches(m, app.prediction);
  for (auto& s : mismatches) ImGui::TextColored(ImVec4(0.95f, 0.75f, 0.3f, 1), "different job: %s", s.c_str());
  if (!mismatches.empty() && ImGui::Button("Use the report's job (model, cluster, runtime, seq, plan)")) app.use_measured_job();

  // memory categories, predicted and measured side by side
  std::vector<const ComparisonRow*> mem;
  double top = 0;
  for (auto& r : app.comparison)
    if (r.name.rfind("memory.by_category.", 0) == 0 && (r.predicted > 0 || r.measured > 0)) {
      mem.push_back(&r);
      top = std::max({top, r.predicted, r.measured});
    }
  const float plot_h = std::max(220.0f, ImGui::GetContentRegionAvail().y * 0.5f);
  const float plot_w = m.losses.empty() ? 0 : ImGui::GetContentRegionAvail().x * 0.62f;
  const ImU32 pred_color = category_color(0), meas_color = category_color(1);
  if (!mem.empty()) {
    Axis x{-0.6, static_cast<double>(mem.size()) - 0.4, false, "", Axis::Format::number};
    for (auto* r : mem) x.categories.push_back(r->name.substr(std::string("memory.by_category.").size()));
    Axis y{0, top * 1.1, false, "GiB per GPU", Axis::Format::gib};
    PlotFrame f("measuredmem", ImVec2(plot_w, plot_h), x, y);
    std::string hover;
    for (size_t i = 0; i < mem.size(); ++i) {
      const double cx = static_cast<double>(i);
      f.rect(cx - 0.38, 0, cx, mem[i]->predicted, pred_color);
      f.rect(cx, 0, cx + 0.38, mem[i]->measured, meas_color);
      if (f.hovered() && std::abs(f.data_x(f.mouse().x) - cx) < 0.4) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s: predicted %.3f GiB, measured %.3f GiB (%+.1f%%)", x.categories[i].c_str(),
                      mem[i]->predicted / (1024.0 * 1024 * 1024), mem[i]->measured / (1024.0 * 1024 * 1024), mem[i]->relative_error * 100);
        hover = buf;
      }
    }
    f.legend({{"predicted", pred_color}, {"measured", meas_color}});
    if (!hover.empty()) tooltip_lines({hover});
    record_region(app, "measured.plot", f.outer_min(), f.outer_max());
  }
  if (!m.losses.empty()) {
    if (!mem.empty()) ImGui::SameLine();
    double lo = 1e300, hi = -1e300;
    std::vector<double> xs, ys;
    for (size_t i = 0; i < m.losses.size(); ++i) {
      xs.push_back(static_cast<double>(i + 1));
      ys.push_back(m.losses[i]);
      lo = std::min(lo, m.losses[i]), hi = std::max(hi, m.losses[i]);
    }
    Axis x{0.5, static_cast<double>(m.losses.size()) + 0.5, false, "step", Axis::Format::number};
    Axis y{lo, hi > lo ? hi : lo + 1, false, "loss (report)", Axis::Format::number};
    pad_axis(y, 0.08);
    PlotFrame f("losses", ImVec2(0, plot_h), x, y);
    f.line(xs, ys, category_color(2), 2);
    record_region(app, "measured.losses", f.outer_min(), f.outer_max());
  }

  double worst = 0;
  if (ImGui::BeginTable("comparison", 4, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersV | ImGuiTableFlags_ScrollY | ImGuiTableFlags_SizingFixedFit)) {
    ImGui::TableSetupScrollFreeze(0, 1);
    ImGui::TableSetupColumn("field");
    ImGui::TableSetupColumn("predicted");
    ImGui::TableSetupColumn("measured");
    ImGui::TableSetupColumn("error");
    ImGui::TableHeadersRow();
    for (auto& r : app.comparison) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(r.label.c_str());
      ImGui::TableNextColumn();
      if (r.bytes) ImGui::TextUnformatted(gib_text(r.predicted).c_str());
      else ImGui::Text("%.4g", r.predicted);
      ImGui::TableNextColumn();
      if (r.bytes) ImGui::TextUnformatted(gib_text(r.measured).c_str());
      else ImGui::Text("%.4g", r.measured);
      ImGui::TableNextColumn();
      const double e = r.relative_error;
      if (std::isfinite(e)) worst = std::max(worst, std::abs(e));
      const ImVec4 col = std::abs(e) <= 0.05 ? ImVec4(0.35f, 0.85f, 0.45f, 1) : std::abs(e) <= 0.2 ? ImVec4(0.95f, 0.75f, 0.3f, 1) : ImVec4(0.95f, 0.35f, 0.35f, 1);
      if (std::isfinite(e)) ImGui::TextColored(col, "%+.1f%%", e * 100);
      else ImGui::TextColored(col, "n/a (predicted 0)");
    }
    ImGui::EndTable();
  }
  app.shown["measured"] = {{"rows", app.comparison.size()}, {"max_abs_relative_error", worst}, {"mismatches", mismatches},
                           {"losses", m.losses.size()}};
}

}  // namespace ctx::gui
