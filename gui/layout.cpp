// The window layout: one full-viewport window split into the inputs pane (left, resizable) and
// the results pane (right): selected plan and actions, the error panel, then one tab per view.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "gui/panels.hpp"

namespace ctx::gui {

void record_region(App& app, const std::string& name, ImVec2 min, ImVec2 max) { app.regions[name] = {min.x, min.y, max.x, max.y}; }
void record_last_item(App& app, const std::string& name) { record_region(app, name, ImGui::GetItemRectMin(), ImGui::GetItemRectMax()); }

std::string gib_text(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

std::string seconds_text(double s) {
  char buf[32];
  if (s >= 1) std::snprintf(buf, sizeof buf, "%.2f s", s);
  else if (s >= 1e-3) std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  return buf;
}

std::string tokens_text(int64_t t) {
  char buf[64];
  if (t >= (1 << 20) && t % (1 << 20) == 0) std::snprintf(buf, sizeof buf, "%" PRId64 " (%" PRId64 "M)", t, t >> 20);
  else if (t >= 1024 && t % 1024 == 0) std::snprintf(buf, sizeof buf, "%" PRId64 " (%" PRId64 "K)", t, t >> 10);
  else std::snprintf(buf, sizeof buf, "%" PRId64, t);
  return buf;
}

ImVec4 fit_color(bool fits) { return fits ? ImVec4(0.35f, 0.85f, 0.45f, 1) : ImVec4(0.95f, 0.35f, 0.35f, 1); }

void draw_main_window(App& app, double now, bool force_tab, FrameRequests& req) {
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(vp->WorkPos);
  ImGui::SetNextWindowSize(vp->WorkSize);
  ImGui::Begin("ctxplan", nullptr,
               ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoSavedSettings |
                   ImGuiWindowFlags_NoBringToFrontOnFocus);
  View& view = app.state.view;
  view.left_width = std::clamp(view.left_width, 280.0f, std::max(300.0f, vp->WorkSize.x - 400));

  ImGui::BeginChild("inputs", ImVec2(view.left_width, 0), true);
  draw_inputs_panel(app, now);
  ImGui::EndChild();
  record_last_item(app, "inputs");
  // Inputs changed above are re-predicted before anything on the right is drawn.
  app.update(now);

  // splitter
  ImGui::SameLine(0, 0);
  ImGui::InvisibleButton("splitter", ImVec2(6, std::max(1.0f, ImGui::GetContentRegionAvail().y)));
  if (ImGui::IsItemHovered() || ImGui::IsItemActive()) ImGui::SetMouseCursor(ImGuiMouseCursor_ResizeEW);
  if (ImGui::IsItemActive()) view.left_width += ImGui::GetIO().MouseDelta.x;
  ImGui::SameLine(0, 0);

  ImGui::BeginChild("results", ImVec2(0, 0), false);
  draw_selected_plan_header(app, req);
  draw_error_panel(app);
  if (ImGui::BeginTabBar("views")) {
    struct Tab {
      const char* id;
      const char* label;
      void (*draw)(App&);
    };
    static const Tab tabs[] = {{"memory", "Memory", draw_memory_tab},       {"cpwork", "CP work", draw_cpwork_tab},
                               {"plans", "Plans", draw_plans_tab},
                               {"pareto", "Pareto", draw_pareto_tab},       {"timeline", "Timeline", draw_timeline_tab},
                               {"maxseq", "Max sequence", draw_maxseq_tab}, {"measured", "Measured vs predicted", draw_measured_tab}};
    std::string active = view.tab;
    for (const Tab& t : tabs) {
      const ImGuiTabItemFlags flags = force_tab && view.tab == t.id ? ImGuiTabItemFlags_SetSelected : 0;
      if (ImGui::BeginTabItem(t.label, nullptr, flags)) {
        active = t.id;
        ImGui::BeginChild(t.id, ImVec2(0, 0), false, ImGuiWindowFlags_NoScrollWithMouse * (std::string(t.id) == "timeline"));
        t.draw(app);
        ImGui::EndChild();
        record_last_item(app, std::string("tab.") + t.id);
        ImGui::EndTabItem();
      }
    }
    if (!force_tab) view.tab = active;
    ImGui::EndTabBar();
  }
  ImGui::EndChild();
  ImGui::End();
}

}  // namespace ctx::gui
