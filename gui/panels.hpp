// The explorer's panels. Each draws from App and reports what it showed (App::shown) and where
// (App::regions) for the state report that headless runs write next to the screenshot.
#pragma once
#include <imgui.h>

#include <string>

#include "gui/app.hpp"

namespace ctx::gui {

// Per-frame requests from the panels to the window loop.
struct FrameRequests {
  std::string save_png;        // write a screenshot of this frame here
  std::string copy_text;       // put on the clipboard
};

// The whole window: inputs on the left, the selected plan, errors and the tabs on the right.
// `force_tab` selects a tab this frame (after a state file was applied).
void draw_main_window(App& app, double now, bool force_tab, FrameRequests& req);

void draw_inputs_panel(App& app, double now);
void draw_selected_plan_header(App& app, FrameRequests& req);
void draw_error_panel(App& app);
void draw_memory_tab(App& app);
void draw_cpwork_tab(App& app);
void draw_plans_tab(App& app);
void draw_pareto_tab(App& app);
void draw_timeline_tab(App& app);
void draw_maxseq_tab(App& app);
void draw_measured_tab(App& app);

// Records the last item's (or a given) screen rectangle under `name` in App::regions.
void record_region(App& app, const std::string& name, ImVec2 min, ImVec2 max);
void record_last_item(App& app, const std::string& name);

// Small text helpers shared by the panels.
std::string gib_text(double bytes);           // "12.34 GiB"
std::string seconds_text(double seconds);     // "5.79 s", "412 ms"
std::string tokens_text(int64_t tokens);      // "131072 (128K)"
ImVec4 fit_color(bool fits);

}  // namespace ctx::gui
