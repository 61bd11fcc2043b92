// The plan table (every valid plan, sortable and filterable, clipped so tens of thousands of rows
// stay smooth) and the Pareto plot of step time vs peak memory. Clicking a row or a point
// selects that plan.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "gui/panels.hpp"
#include "gui/plot.hpp"

namespace ctx::gui {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

// The displayed order, recomputed only when the table, the filter or the sort changes.
struct OrderCache {
  uint64_t generation = ~uint64_t(0);
  std::string filter;
  bool fits_only = false;
  int column = -1;
  bool descending = false;
  std::vector<int> order;
};

const std::vector<int>& displayed_order(const App& app) {
  static OrderCache c;
  const View& v = app.state.view;
  if (c.generation != app.table_generation || c.filter != v.table_filter ||
      c.fits_only != v.fits_only || c.column != v.sort_column || c.descending != v.sort_descending) {
    c.generation = app.table_generation;
    c.filter = v.table_filter;
    c.fits_only = v.fits_only;
    c.column = v.sort_column;
    c.descending = v.sort_descending;
    c.order = table_order(app.table, v.table_filter, v.fits_only, static_cast<PlanColumn>(v.sort_column), v.sort_descending);
  }
  return c.order;
}

std::string selected_text(const App& app) { return app.have_prediction ? plan_to_string(app.prediction.plan) : app.state.plan; }

// Whether the fixed keys already give pad (then the search pads, or was told not to).
bool fixed_keys_name_pad(const std::string& keys) {
  std::stringstream items(keys);
  for (std::string item; std::getline(items, item, ',');) {
    item.erase(0, item.find_first_not_of(" \t"));
    if (item.rfind("pad=", 0) == 0) return true;
  }
  return false;
}

void search_banner(App& app) {
  if (app.search_running()) ImGui::TextDisabled("searching... %.0f%%", app.search_progress() * 100);
  else if (!app.table_current() && !app.table.rows.empty()) ImGui::TextColored(ImVec4(0.95f, 0.75f, 0.3f, 1), "results are for previous inputs");
  if (!app.table.no_fit_reason.empty()) ImGui::TextWrapped("%s", app.table.no_fit_reason.c_str());
  // the plans the search left out (a layout that does not divide the sequence) and the lower optimizer
  // precision, as `ctxplan plan` words them; the nearest edit is one click
  const std::vector<std::string> notes = search_notes(app.table);
  for (const std::string& n : notes) ImGui::TextColored(ImVec4(0.95f, 0.75f, 0.3f, 1), "%s", n.c_str());
  Inputs& in = app.state.inputs;
  if (app.table.not_dividing > 0 && app.table_current() && !fixed_keys_name_pad(in.fixed_keys)) {
    if (ImGui::SmallButton("add pad=1 to the fixed keys")) {
      in.fixed_keys += std::string(in.fixed_keys.empty() ? "" : ",") + "pad=1";
      app.inputs_changed(ImGui::GetTime());
    }
  }
  app.shown["search_notes"] = notes;
}

}  // namespace

void draw_plans_tab(App& app) {
  View& v = app.state.view;
  ImGui::SetNextItemWidth(300);
  ImGui::InputTextWithHint("##filter", "filter: words of the plan text, e.g. zigzag zero=3", &v.table_filter);
  ImGui::SameLine();
  ImGui::Checkbox("fitting only", &v.fits_only);
  const std::vector<int>& order = displayed_order(app);
  ImGui::SameLine();
  ImGui::TextDisabled("%zu of %zu plans", order.size(), app.table.rows.size());
  search_banner(app);

  const int ncols = static_cast<int>(PlanColumn::count);
  const ImGuiTableFlags flags = ImGuiTableFlags_Sortable | ImGuiTableFlags_ScrollY | ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersV |
                                ImGuiTableFlags_Resizable | ImGuiTableFlags_SizingFixedFit;
  const std::string sel = selected_text(app);
  json first = json::array();
  if (ImGui::BeginTable("plans", ncols, flags, ImVec2(0, 0))) {
    ImGui::TableSetupScrollFreeze(0, 1);
    for (PlanColumn column : kColumnDisplayOrder) {
      const int c = static_cast<int>(column);
      ImGuiTableColumnFlags cf = column == PlanColumn::plan ? ImGuiTableColumnFlags_WidthStretch : 0;
      if (c == v.sort_column) cf |= ImGuiTableColumnFlags_DefaultSort | (v.sort_descending ? ImGuiTableColumnFlags_PreferSortDescending : 0);
      ImGui::TableSetupColumn(column_name(static_cast<PlanColumn>(c)), cf, 0, static_cast<ImGuiID>(c));
    }
    ImGui::TableHeadersRow();
    if (ImGuiTableSortSpecs* specs = ImGui::TableGetSortSpecs()) {
      if (specs->SpecsDirty && specs->SpecsCount > 0) {
        v.sort_column = static_cast<int>(specs->Specs[0].ColumnUserID);
        v.sort_descending = specs->Specs[0].SortDirection == ImGuiSortDirection_Descending;
        specs->SpecsDirty = false;
      }
    }
    ImGuiListClipper clipper;
    clipper.Begin(static_cast<int>(order.size()));
    while (clipper.Step()) {
      for (int i = clipper.DisplayStart; i < clipper.DisplayEnd; ++i) {
        const PlanRow& r = app.table.rows[static_cast<size_t>(order[static_cast<size_t>(i)])];
        ImGui::TableNextRow();
        ImGui::TableNextColumn();
        ImGui::PushID(i);
        const std::string rank = r.rank >= 0 ? std::to_string(r.rank + 1) : std::string("-");
        if (ImGui::Selectable(rank.c_str(), r.text == sel, ImGuiSelectableFlags_SpanAllColumns)) app.select_plan(r.text);
        if (ImGui::IsItemHovered() && !r.why.empty()) ImGui::SetTooltip("%s", r.why.c_str());
        ImGui::PopID();
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(r.text.c_str());
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(layout_cell(r.plan).c_str());
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(varlen_cell(r.plan).c_str());
        ImGui::TableNextColumn();
        ImGui::TextColored(fit_color(r.fits), "%s", r.fits ? "yes" : "no");
        ImGui::TableNextColumn();
        if (r.fits) ImGui::Text("%.3f%s", r.step_seconds, r.simulated ? "*" : "");
        else ImGui::TextDisabled("-");
        ImGui::TableNextColumn();
        if (r.fits) ImGui::Text("%.0f", r.tokens_per_second);
        ImGui::TableNextColumn();
        if (r.fits) ImGui::Text("%.1f%%", r.mfu * 100);
        ImGui::TableNextColumn();
        ImGui::Text("%.2f", r.peak_bytes / kGiB);
        ImGui::TableNextColumn();
        ImGui::TextColored(fit_color(r.capacity_bytes >= r.peak_bytes), "%.2f", (r.capacity_bytes - r.peak_bytes) / kGiB);
        ImGui::TableNextColumn();
        ImGui::Text("%.1f", r.host_bytes_per_node / kGiB);
      }
    }
    ImGui::EndTable();
    record_last_item(app, "plans.table");
  }
  for (size_t i = 0; i < order.size() && i < 5; ++i) first.push_back(app.table.rows[static_cast<size_t>(order[i])].text);
  app.shown["plans"] = {{"rows_total", app.table.rows.size()},
                        {"rows_shown", order.size()},
                        {"first", first},
                        {"sort_column", column_name(static_cast<PlanColumn>(v.sort_column))},
                        {"sort_descending", v.sort_descending},
                        {"filter", v.table_filter},
                        {"current", app.table_current()}};
}

void draw_pareto_tab(App& app) {
  View& v = app.state.view;
  ImGui::Checkbox("y: step time (plans with more data-parallel ranks process more tokens per step)", &v.pareto_step_time);
  search_banner(app);
  const PlanTable& t = app.table;
  auto y_of = [&](double step_seconds, double tokens_per_second) {
    return v.pareto_step_time ? step_seconds : (tokens_per_second > 0 ? 1e6 / tokens_per_second : 0);
  };
  // bounds over fitting plans and the capacity
  double xlo = 1e300, xhi = 0, ylo = 1e300, yhi = 0;
  int64_t npoints = 0, nfrontier = 0;
  double capacity = 0;
  for (const PlanRow& r : t.rows) {
    capacity = std::max(capacity, r.capacity_bytes);
    if (!r.fits) continue;
    const double y = y_of(r.step_seconds, r.tokens_per_second);
    xlo = std::min(xlo, r.peak_bytes), xhi = std::max(xhi, r.peak_bytes);
    ylo = std::min(ylo, y), yhi = std::max(yhi, y);
  }
  if (app.have_prediction) capacity = app.prediction.memory.device_capacity_bytes;
  if (xhi <= 0) {
    ImGui::TextDisabled("no fitting plans to plot yet");
    return;
  }
  Axis x{0, std::max(xhi, capacity) * 1.05, false, "peak memory per GPU (GiB)", Axis::Format::gib};
  Axis y{ylo, yhi, ylo > 0 && yhi / ylo > 20, v.pareto_step_time ? "step time" : "seconds per million tokens", Axis::Format::seconds};
  pad_axis(y, 0.06);
  if (!y.log) y.lo = std::max(0.0, y.lo);
  PlotFrame f("pareto", ImVec2(0, 0), x, y);
  const ImU32 dim = IM_COL32(150, 150, 160, 150), frontier = category_color(1), selected = IM_COL32(255, 255, 255, 255);
  int hovered = -1;
  float best_d2 = 64;  // 8 px
  const ImVec2 mp = f.mouse();
  std::vector<double> fx, fy;
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const PlanRow& r = t.rows[i];
    if (!r.fits) continue;
    ++npoints;
    const double yv = y_of(r.step_seconds, r.tokens_per_second);
    const float sx = f.px(r.peak_bytes), sy = f.py(yv);
    if (r.pareto) {
      fx.push_back(r.peak_bytes);
      fy.push_back(yv);
    } else {
      f.draw()->AddRectFilled(ImVec2(sx - 1.5f, sy - 1.5f), ImVec2(sx + 1.5f, sy + 1.5f), dim);
    }
    if (f.hovered()) {
      const float d2 = (sx - mp.x) * (sx - mp.x) + (sy - mp.y) * (sy - mp.y);
      if (d2 < best_d2) best_d2 = d2, hovered = static_cast<int>(i);
    }
  }
  // the frontier as a staircase of its points, sorted by memory
  std::vector<size_t> idx(fx.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return fx[a] < fx[b]; });
  std::vector<double> sx, sy;
  for (size_t k : idx) {
    if (!sx.empty()) sx.push_back(fx[k]), sy.push_back(sy.back());
    sx.push_back(fx[k]), sy.push_back(fy[k]);
  }
  f.line(sx, sy, frontier, 1.5f);
  for (size_t k = 0; k < fx.size(); ++k) f.point(fx[k], fy[k], 4, frontier);
  nfrontier = static_cast<int64_t>(fx.size());
  f.vrule(capacity, IM_COL32(235, 80, 80, 255), ("capacity " + gib_text(capacity)).c_str());
  json sel = nullptr;
  if (app.have_prediction && !app.time_pending) {
    const double sy_sel = y_of(app.prediction.time.step_seconds, app.prediction.time.tokens_per_second);
    f.point(app.prediction.memory.peak.total(), sy_sel, 7, selected, false);
    sel = {{"peak_bytes", app.prediction.memory.peak.total()}, {"y", sy_sel}};
  }
  f.legend({{"plans that fit", dim}, {"Pareto frontier", frontier}, {"selected (simulated)", selected}}, true);
  if (hovered >= 0) {
    const PlanRow& r = t.rows[static_cast<size_t>(hovered)];
    f.point(r.peak_bytes, y_of(r.step_seconds, r.tokens_per_second), 6, IM_COL32(255, 230, 90, 255), false);
    tooltip_lines({r.text, "peak " + gib_text(r.peak_bytes) + ", step " + seconds_text(r.step_seconds) + (r.simulated ? " (simulated)" : " (closed form)"),
                   "click to select"});
    if (f.clicked()) app.select_plan(r.text);
  }
  record_region(app, "pareto.plot", f.outer_min(), f.outer_max());
  app.shown["pareto"] = {{"points", npoints},      {"frontier", nfrontier},        {"capacity_bytes", capacity},
                         {"x_max_bytes", x.hi},    {"y_axis", y.label},            {"selected", sel},
                         {"current", app.table_current()}};
}

}  // namespace ctx::gui
