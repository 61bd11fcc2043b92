// The simulated step of the selected plan: one row per simulated rank and stream (compute, tp,
// ring, dp, host), zoom with the mouse wheel, pan by dragging, hover for the operation. Ring
// overlap, zig-zag balance and exposed communication show as gaps and overlaps between rows.
#include <imgui.h>

#include <algorithm>
#include <cmath>

#include "gui/panels.hpp"
#include "gui/plot.hpp"

namespace ctx::gui {
namespace {

const char* pass_name(SimPass p) {
  switch (p) {
    case SimPass::forward: return "forward";
    case SimPass::recompute: return "recompute";
    case SimPass::backward: return "backward";
    default: return "optimizer";
  }
}

// Compute tasks are coloured by pass, the other streams by stream.
ImU32 task_color(const SimTask& t) {
  if (t.stream == SimStream::compute) {
    switch (t.pass) {
      case SimPass::forward: return category_color(0);
      case SimPass::recompute: return category_color(4);
      case SimPass::backward: return category_color(2);
      default: return category_color(1);
    }
  }
  switch (t.stream) {
    case SimStream::tp: return category_color(3);
    case SimStream::ring: return category_color(9);
    case SimStream::dp: return category_color(8);
    default: return category_color(5);
  }
}

// Rows (rank x stream with tasks) and each row's tasks in start order, cached per simulation.
struct Rows {
  uint64_t generation = ~uint64_t(0);
  std::vector<std::string> labels;
  std::vector<std::vector<int32_t>> tasks_of;
};

const Rows& rows_of(const SimResult& sim, uint64_t generation) {
  static Rows r;
  if (r.generation == generation) return r;
  r = Rows{generation, {}, {}};
  const size_t reps = sim.reps.size();
  std::vector<std::vector<int32_t>> by(reps * kSimStreams);
  for (size_t i = 0; i < sim.tasks.size(); ++i) {
    const SimTask& t = sim.tasks[i];
    if (t.rep < 0 || static_cast<size_t>(t.rep) >= reps || t.start < 0) continue;
    by[static_cast<size_t>(t.rep) * kSimStreams + static_cast<size_t>(t.stream)].push_back(static_cast<int32_t>(i));
  }
  for (size_t rep = 0; rep < reps; ++rep)
    for (int s = 0; s < kSimStreams; ++s) {
      auto& v = by[rep * kSimStreams + static_cast<size_t>(s)];
      if (v.empty()) continue;
      std::sort(v.begin(), v.end(), [&](int32_t a, int32_t b) { return sim.tasks[a].start < sim.tasks[b].start; });
      // short: rank, CP index, pack; the tooltip has the full label
      const SimRep& rp = sim.reps[rep];
      std::string label = "rank " + std::to_string(rp.rank);
      if (sim.reps.size() > 1) label += " cp" + std::to_string(rp.cp_index) + (rp.pack_class ? " light" : "");
      r.labels.push_back(label + " " + to_string(static_cast<SimStream>(s)));
      r.tasks_of.push_back(std::move(v));
    }
  return r;
}

// A stream runs its tasks in order, so along a row sorted by start the ends increase too.
std::vector<int32_t>::const_iterator first_ending_after(const SimResult& sim, const std::vector<int32_t>& ids, double t) {
  return std::partition_point(ids.begin(), ids.end(), [&](int32_t id) { return sim.tasks[static_cast<size_t>(id)].end < t; });
}

}  // namespace

void draw_timeline_tab(App& app) {
  const bool shorter = app.sim.tasks.empty() && !app.timeline_sim.tasks.empty();  // the same plan over fewer layers
  if (app.have_prediction && !app.time_pending && app.sim.tasks.empty() && app.sim.stats.tasks > kTimelineMaxTasks && !shorter) {
    ImGui::TextWrapped("This step has %lld tasks; the timeline draws steps of up to %lld. The step time and its breakdown above come "
                       "from the whole simulation. For a trace of a smaller step (fewer layers, micro-batches or CP ranks): "
                       "ctxplan simulate --trace step.json",
                       static_cast<long long>(app.sim.stats.tasks), static_cast<long long>(kTimelineMaxTasks));
    app.shown["timeline"] = {{"tasks", 0}, {"step_tasks", app.sim.stats.tasks}, {"too_many_tasks", true}};
    return;
  }
  if (app.have_prediction && !app.time_pending && app.prediction.plan.pp > 1) {
    // a pipeline plan is priced chunk by chunk and scheduled as a whole (pipeline_time.hpp): no task graph
    ImGui::TextWrapped("pp=%lld: the step is the %s schedule over the stages (bubble %.3f s, in the breakdown's imbalance); "
                       "the timeline draws one stage's task graph only for plans without pipeline stages. The schedule "
                       "per stage is in ctxplan predict --json (\"pipeline\").",
                       static_cast<long long>(app.prediction.plan.pp), app.prediction.plan.vpp > 1 ? "interleaved 1F1B" : "1F1B",
                       app.prediction.pipeline.is_object() ? app.prediction.pipeline.value("bubble_seconds", 0.0) : 0.0);
    app.shown["timeline"] = {{"tasks", 0}, {"pipeline", app.prediction.pipeline}};
    return;
  }
  if (!app.have_prediction || (app.sim.tasks.empty() && !shorter)) {
    ImGui::TextDisabled("no simulated step: select a plan that runs");
    return;
  }
  if (app.time_pending) {
    ImGui::TextDisabled("simulating the step of %s ...", plan_to_string(app.prediction.plan).c_str());
    return;
  }
  const SimResult& sim = shorter ? app.timeline_sim : app.sim;
  const StepBreakdown& b = sim.time.breakdown;
  if (shorter)
    ImGui::TextWrapped("This step has %lld tasks; the timeline draws steps of up to %lld, so it shows the same plan over %lld of the "
                       "model's %lld layers: the same operations per layer, ranks and streams. The step time and breakdown in the "
                       "header are the whole step's; the ones below are this shorter step's.",
                       static_cast<long long>(app.sim.stats.tasks), static_cast<long long>(kTimelineMaxTasks),
                       static_cast<long long>(app.timeline_layers), static_cast<long long>(app.job ? app.job->model.layers : 0));
  View& v = app.state.view;
  const double step = std::max(sim.time.step_seconds, 1e-12);
  if (!(v.timeline_t1 > v.timeline_t0)) v.timeline_t0 = 0, v.timeline_t1 = step;
  ImGui::Text("step %s: compute %s, exposed comm %s, offload stall %s, imbalance %s, optimizer %s", seconds_text(step).c_str(),
              seconds_text(b.compute).c_str(), seconds_text(b.exposed_comm).c_str(), seconds_text(b.offload_stall).c_str(),
              seconds_text(b.imbalance).c_str(), seconds_text(b.optimizer).c_str());
  if (ImGui::SmallButton("Reset zoom")) v.timeline_t0 = 0, v.timeline_t1 = step;
  ImGui::SameLine();
  ImGui::TextDisabled("wheel: zoom, drag: pan, double-click: whole step; %zu simulated ranks, %zu tasks", sim.reps.size(),
                      sim.tasks.size());

  const Rows& rows = rows_of(sim, app.sim_generation);
  const float row_h = 16;
  // rows between 16 and 48 px: scroll beyond the window, never stretch a few rows over it
  const float rows_h = static_cast<float>(rows.labels.size());
  const float height = std::clamp(ImGui::GetContentRegionAvail().y - 4, rows_h * row_h + 60, rows_h * 48 + 60);
  Axis x{v.timeline_t0, v.timeline_t1, false, "time in the step", Axis::Format::seconds};
  PlotFrame f("timeline", ImVec2(0, height), x, rows.labels, 150);
  // zoom and pan
  ImGuiIO& io = ImGui::GetIO();
  const double span = v.timeline_t1 - v.timeline_t0;
  const float width = std::max(1.0f, f.inner_max().x - f.inner_min().x);
  if (f.hovered() && io.MouseWheel != 0) {
    const double at = f.data_x(io.MousePos.x), k = std::pow(0.8, static_cast<double>(io.MouseWheel));
    v.timeline_t0 = at - (at - v.timeline_t0) * k;
    v.timeline_t1 = at + (v.timeline_t1 - at) * k;
  }
  if (ImGui::IsItemActive() && ImGui::IsMouseDragging(ImGuiMouseButton_Left)) {
    const double dt = -static_cast<double>(io.MouseDelta.x) / width * span;
    v.timeline_t0 += dt, v.timeline_t1 += dt;
  }
  if (f.hovered() && ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) v.timeline_t0 = 0, v.timeline_t1 = step;
  if (v.timeline_t1 - v.timeline_t0 < 1e-9) v.timeline_t1 = v.timeline_t0 + 1e-9;

  // tasks; runs of sub-pixel tasks of one colour merge into one rectangle
  int64_t drawn = 0;
  const double t0 = x.lo, t1 = x.hi;
  const ImVec2 clip_min = f.draw()->GetClipRectMin(), clip_max = f.draw()->GetClipRectMax();
  for (size_t row = 0; row < rows.tasks_of.size(); ++row) {
    const float top = f.row_top(static_cast<int>(row)) + 2, bottom = f.row_bottom(static_cast<int>(row)) - 2;
    if (bottom < clip_min.y || top > clip_max.y) continue;  // scrolled out of the window
    float run_x0 = 0, run_x1 = -1e9f;
    ImU32 run_color = 0;
    const std::vector<int32_t>& ids = rows.tasks_of[row];
    for (auto it = first_ending_after(sim, ids, t0); it != ids.end(); ++it) {
      const SimTask& t = sim.tasks[static_cast<size_t>(*it)];
      if (t.start > t1) break;
      float x0 = f.px(t.start), x1 = std::max(f.px(t.end), x0 + 1.0f);
      const ImU32 color = task_color(t);
      if (color == run_color && x0 <= run_x1 + 0.5f) {
        run_x1 = std::max(run_x1, x1);
        continue;
      }
      if (run_x1 > run_x0) f.draw()->AddRectFilled(ImVec2(run_x0, top), ImVec2(run_x1, bottom), run_color), ++drawn;
      run_x0 = x0, run_x1 = x1, run_color = color;
    }
    if (run_x1 > run_x0) f.draw()->AddRectFilled(ImVec2(run_x0, top), ImVec2(run_x1, bottom), run_color), ++drawn;
  }
  f.vrule(step, IM_COL32(235, 80, 80, 255), "end of step");
  f.legend({{"forward", category_color(0)},
            {"recompute", category_color(4)},
            {"backward", category_color(2)},
            {"optimizer", category_color(1)},
            {"tp / ulysses", category_color(3)},
            {"ring p2p", category_color(9)},
            {"dp (zero)", category_color(8)},
            {"host copies", category_color(5)}});
  // hover: the task under the mouse (or within 3 px)
  if (f.hovered()) {
    const int row = f.row_at(io.MousePos.y);
    if (row >= 0) {
      const double at = f.data_x(io.MousePos.x), slack = 3.0 / width * (t1 - t0);
      const SimTask* hit = nullptr;
      const std::vector<int32_t>& ids = rows.tasks_of[static_cast<size_t>(row)];
      for (auto it = first_ending_after(sim, ids, at - slack); it != ids.end(); ++it) {
        const SimTask& t = sim.tasks[static_cast<size_t>(*it)];
        if (t.start - slack <= at && at <= t.end + slack) {
          hit = &t;
          if (t.start <= at && at <= t.end) break;
        }
        if (t.start > at + slack) break;
      }
      if (hit) {
        char line[160];
        std::snprintf(line, sizeof line, "layer %d, micro-batch %d, %s pass", hit->layer, hit->micro_batch, pass_name(hit->pass));
        tooltip_lines({hit->name, sim.reps[static_cast<size_t>(hit->rep)].label + ", " + to_string(hit->stream) + " stream", line,
                       "start " + seconds_text(hit->start) + ", takes " + seconds_text(hit->end - hit->start) +
                           (hit->start > hit->ready + 1e-12 ? ", waited " + seconds_text(hit->start - hit->ready) : "")});
        f.draw()->AddRect(ImVec2(f.px(hit->start), f.row_top(row) + 1), ImVec2(std::max(f.px(hit->end), f.px(hit->start) + 2), f.row_bottom(row) - 1),
                          IM_COL32(255, 255, 255, 255), 0, 0, 2);
      }
    }
  }
  record_region(app, "timeline.plot", f.outer_min(), f.outer_max());
  app.shown["timeline"] = {{"rows", rows.labels.size()}, {"row_labels", rows.labels}, {"tasks", sim.tasks.size()},
                           {"rects_drawn", drawn},     {"t0", t0},                  {"t1", t1},
                           {"step_seconds", step},    {"layers", shorter ? app.timeline_layers : (app.job ? app.job->model.layers : 0)},
                           {"step_tasks", app.sim.stats.tasks}};
}

}  // namespace ctx::gui
