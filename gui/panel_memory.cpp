// Memory of the selected plan on one rank: stacked bars by category at the step's peak and at
// each phase's own peak, the device capacity and the headroom; host memory per node as a bar
// against the node's capacity.
#include <imgui.h>

#include <algorithm>

#include "gui/panels.hpp"
#include "gui/plot.hpp"

namespace ctx::gui {
namespace {

constexpr ImU32 kCapacityColor = IM_COL32(235, 80, 80, 255);

void category_table(const char* id, const std::vector<std::pair<std::string, double>>& rows, double total, int color_offset) {
  if (!ImGui::BeginTable(id, 3, ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingFixedFit)) return;
  ImGui::TableSetupColumn("category");
  ImGui::TableSetupColumn("GiB");
  ImGui::TableSetupColumn("share");
  ImGui::TableHeadersRow();
  for (size_t i = 0; i < rows.size(); ++i) {
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::ColorButton("##c", ImGui::ColorConvertU32ToFloat4(category_color(static_cast<int>(i) + color_offset)),
                       ImGuiColorEditFlags_NoTooltip, ImVec2(10, 10));
    ImGui::SameLine();
    ImGui::TextUnformatted(rows[i].first.c_str());
    ImGui::TableNextColumn();
    ImGui::Text("%.2f", rows[i].second / (1024.0 * 1024 * 1024));
    ImGui::TableNextColumn();
    ImGui::Text("%.1f%%", total > 0 ? 100 * rows[i].second / total : 0.0);
  }
  ImGui::EndTable();
}

}  // namespace

void draw_memory_tab(App& app) {
  if (!app.have_prediction) {
    ImGui::TextDisabled("no prediction: fix the inputs or the plan (see the error panel)");
    return;
  }
  const MemoryPrediction& m = app.prediction.memory;
  // bars: the peak, then each phase's own peak
  struct Bar {
    std::string label;
    const MemorySnapshot* snap;
  };
  std::vector<Bar> bars = {{std::string("peak (") + to_string(m.peak_phase) + ")", &m.peak}};
  for (int i = 0; i < kPhases; ++i) bars.push_back({to_string(static_cast<Phase>(i)), &m.phase_peak[i]});
  double top = m.device_capacity_bytes;
  for (auto& b : bars) top = std::max(top, b.snap->total());

  const float table_width = 300;
  ImGui::BeginGroup();
  Axis x{-0.5, static_cast<double>(bars.size()) - 0.5, false, "", Axis::Format::number};
  for (auto& b : bars) x.categories.push_back(b.label);
  Axis y{0, top * 1.08, false, "GiB per GPU", Axis::Format::gib};
  const float plot_w = std::max(300.0f, ImGui::GetContentRegionAvail().x - table_width - 10);
  const float plot_h = std::max(260.0f, ImGui::GetContentRegionAvail().y * 0.68f);
  json shown_bars = json::array();
  {
    PlotFrame f("membars", ImVec2(plot_w, plot_h), x, y);
    std::string hover;
    for (size_t b = 0; b < bars.size(); ++b) {
      const double cx = static_cast<double>(b);
      double base = 0;
      json cats = json::object();
      for (int c = 0; c < kMemCategories; ++c) {
        const double v = bars[b].snap->bytes[c];
        cats[to_string(static_cast<Mem>(c))] = v;
        if (v <= 0) continue;
        f.rect(cx - 0.32, base, cx + 0.32, base + v, category_color(c), b == 0 ? IM_COL32(255, 255, 255, 200) : 0);
        if (f.hovered()) {
          const ImVec2 mp = f.mouse();
          if (mp.x >= f.px(cx - 0.32) && mp.x <= f.px(cx + 0.32) && mp.y <= f.py(base) && mp.y >= f.py(base + v))
            hover = bars[b].label + ": " + to_string(static_cast<Mem>(c)) + " " + gib_text(v);
        }
        base += v;
      }
      shown_bars.push_back({{"label", bars[b].label}, {"total_bytes", bars[b].snap->total()}, {"by_category", cats}});
      const std::string total = gib_text(bars[b].snap->total());
      const float tw = ImGui::CalcTextSize(total.c_str()).x;
      f.draw()->AddText(ImVec2(f.px(cx) - tw * 0.5f, f.py(base) - ImGui::GetTextLineHeight() - 2), ImGui::GetColorU32(ImGuiCol_Text),
                        total.c_str());
    }
    f.hrule(m.device_capacity_bytes, kCapacityColor, ("capacity " + gib_text(m.device_capacity_bytes)).c_str());
    std::vector<std::pair<std::string, ImU32>> legend;
    for (int c = 0; c < kMemCategories; ++c)
      if (m.peak.bytes[c] > 0) legend.emplace_back(to_string(static_cast<Mem>(c)), category_color(c));
    f.legend(legend);
    if (!hover.empty()) tooltip_lines({hover});
    record_region(app, "memory.bars", f.outer_min(), f.outer_max());
  }
  // host memory per node
  ImGui::TextUnformatted("Host memory per node");
  {
    const double host_top = std::max(m.host_capacity_bytes_per_node, m.host_total_bytes_per_node) * 1.05;
    PlotFrame h("hostbar", ImVec2(plot_w, 90), Axis{0, std::max(host_top, 1.0), false, "GiB per node", Axis::Format::gib},
                std::vector<std::string>{"host"}, 50);
    double base = 0;
    std::string hover;
    for (int c = 0; c < kHostCategories; ++c) {
      const double v = m.host_bytes_per_node[c];
      if (v <= 0) continue;
      const float x0 = h.px(base), x1 = h.px(base + v);
      h.draw()->AddRectFilled(ImVec2(x0, h.row_top(0) + 6), ImVec2(std::max(x1, x0 + 1), h.row_bottom(0) - 6), category_color(c + 4));
      if (h.hovered() && h.mouse().x >= x0 && h.mouse().x <= x1) hover = std::string(to_string(static_cast<HostMem>(c))) + " " + gib_text(v);
      base += v;
    }
    const float cx = h.px(m.host_capacity_bytes_per_node);
    h.draw()->AddLine(ImVec2(cx, h.inner_min().y), ImVec2(cx, h.inner_max().y), kCapacityColor, 2);
    if (!hover.empty()) tooltip_lines({hover});
    record_region(app, "memory.host", h.outer_min(), h.outer_max());
  }
  ImGui::EndGroup();

  ImGui::SameLine();
  ImGui::BeginGroup();
  ImGui::Text("At the peak: %s, layer %lld", to_string(m.peak_phase), static_cast<long long>(m.peak_layer));
  std::vector<std::pair<std::string, double>> rows;
  for (int c = 0; c < kMemCategories; ++c) rows.emplace_back(to_string(static_cast<Mem>(c)), m.peak.bytes[c]);
  category_table("devcats", rows, m.peak.total(), 0);
  ImGui::Text("total     %s", gib_text(m.peak.total()).c_str());
  ImGui::Text("capacity  %s", gib_text(m.device_capacity_bytes).c_str());
  ImGui::TextColored(fit_color(m.fits_device), "headroom  %s", gib_text(m.headroom_bytes()).c_str());
  ImGui::Spacing();
  ImGui::Text("Host per node (%lld ranks)", static_cast<long long>(m.ranks_per_node));
  std::vector<std::pair<std::string, double>> host_rows;
  for (int c = 0; c < kHostCategories; ++c) host_rows.emplace_back(to_string(static_cast<HostMem>(c)), m.host_bytes_per_node[c]);
  category_table("hostcats", host_rows, m.host_total_bytes_per_node, 4);
  ImGui::TextColored(fit_color(m.fits_host), "%s of %s", gib_text(m.host_total_bytes_per_node).c_str(),
                     gib_text(m.host_capacity_bytes_per_node).c_str());
  ImGui::EndGroup();

  json host = json::object();
  for (int c = 0; c < kHostCategories; ++c) host[to_string(static_cast<HostMem>(c))] = m.host_bytes_per_node[c];
  app.shown["memory"] = {{"peak_bytes", m.peak.total()},
                         {"capacity_bytes", m.device_capacity_bytes},
                         {"headroom_bytes", m.headroom_bytes()},
                         {"fits_device", m.fits_device},
                         {"fits_host", m.fits_host},
                         {"bars", shown_bars},
                         {"host_total_bytes", m.host_total_bytes_per_node},
                         {"host_capacity_bytes", m.host_capacity_bytes_per_node},
                         {"host_by_category", host}};
}

}  // namespace ctx::gui
