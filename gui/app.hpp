// The explorer's state between frames and the logic that keeps it consistent: inputs resolve to a
// job (or an error, keeping the previous job), the selected plan is re-predicted within the frame
// its inputs change, the search and the max-seq curve run on worker threads. No drawing here:
// panels.hpp draws from this and calls back into it.
#pragma once
#include <array>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "costmodel/prediction.hpp"
#include "gui/background_job.hpp"
#include "gui/cp_choice.hpp"
#include "gui/cp_work.hpp"
#include "gui/gui_state.hpp"
#include "gui/maxseq_curve.hpp"
#include "gui/measured.hpp"
#include "gui/plan_rows.hpp"
#include "gui/resolve_inputs.hpp"

namespace ctx::gui {

struct GuiError {
  std::string where, field, message;  // message: the full text (InputError::what)
};

// The timeline records every task of the simulated step up to this many (about 200 bytes each);
// beyond it the timeline tab says so and the numbers still come from the whole simulation.
constexpr int64_t kTimelineMaxTasks = 3'000'000;
// Layers of the shorter step the timeline draws for a step too large to record (at most; fewer
// where they would pass kTimelineMaxTasks): enough to show the repeating layer between the first
// and the last.
constexpr int64_t kTimelineShortLayers = 6;

class App {
 public:
  explicit App(std::string profiles_dir);

  // ---- what the panels read and edit
  GuiState state;
  Profiles profiles;
  std::optional<ResolvedJob> job;       // the last inputs that resolved
  bool using_previous_inputs = false;   // the current inputs do not resolve; `job` is the previous one
  bool have_prediction = false;
  Prediction prediction;                // of the selected plan under `job`
  SimResult sim;                        // its simulated step (the timeline)
  // A step too large to record (over kTimelineMaxTasks tasks) keeps its numbers in `sim` without
  // tasks; the timeline then draws the same plan's step over fewer layers (timeline_layers of the
  // model's), recorded here (empty: none, or `sim` holds the tasks).
  SimResult timeline_sim;
  int64_t timeline_layers = 0;
  CpWork rank_work;                     // its attention pairs per CP rank (the CP work tab; with the simulated step)
  CpChoice cp_choice;                   // the CP axes the header's controls show: the selected plan's, or the last pick
  // where cp_choice comes from: the selected plan's text, a pick with the controls, or (typed text
  // that does not parse) the last valid plan
  enum class CpChoiceFrom { plan, pick, last_valid } cp_choice_from = CpChoiceFrom::plan;
  // The memory part is predicted within the frame (nanoseconds); the simulated step runs on a
  // worker (seconds for large ring plans). Until it is back, prediction.time and sim are stale.
  bool time_pending = false;
  uint64_t sim_generation = 0;          // bumped whenever `sim` is replaced (for caches over it)
  uint64_t table_generation = 0;        // bumped whenever `table` is replaced
  PlanTable table;                      // the last finished search
  MaxSeqCurve curve;
  std::optional<MeasuredReport> measured;
  std::vector<ComparisonRow> comparison;
  std::map<std::string, GuiError> errors;  // by source: profiles, inputs, plan, measured, action
  std::string status;                   // the last action's result, for the status line
  // filled while drawing, for the state report
  std::map<std::string, std::array<float, 4>> regions;
  json shown = json::object();

  // ---- events from the panels
  void inputs_changed(double now);
  void plan_changed() { plan_dirty_ = true; }
  void select_plan(const std::string& text);
  // The header's CP controls: the selected plan (or, when its text does not parse, the last plan
  // predicted) with these axes becomes the selected plan; the cost model judges it as typed text.
  void choose_cp(const CpChoice& c);
  void start_search();
  void cancel_search() { search_.cancel(); }
  void start_maxseq();
  void cancel_maxseq() { maxseq_.cancel(); }
  void load_measured(const std::string& path);
  // Files dropped on the window: the first becomes the measured run, shown on its tab.
  void drop_files(const std::vector<std::string>& paths);
  bool take_tab_request() { return std::exchange(tab_requested_, false); }
  void use_measured_job();  // set model, cluster, runtime, seq and plan to the report's
  void reload_profiles();
  void set_error(const std::string& source, const InputError& e);
  void set_error(const std::string& source, const std::string& message);

  // Resolves, predicts, starts and polls the workers. Call once a frame, after the inputs panel.
  void update(double now);

  // ---- worker status
  bool search_running() const { return search_.running(); }
  double search_progress() const { return search_.progress(); }
  bool maxseq_running() const { return maxseq_.running(); }
  bool simulating() const { return predict_.running(); }
  double maxseq_progress() const { return maxseq_.progress(); }
  bool table_current() const { return job && table.job_key == job->key; }
  bool curve_current() const;
  // Nothing left to compute: used by headless runs before taking the screenshot.
  bool idle();

  // ---- actions
  std::string command_line(const std::string& cluster_file) const;
  // Writes plan.json (schema ctxplan.plan/1) and, for an edited cluster, <stem>.cluster.json;
  // returns the cluster argument used (a name, or that file's path).
  std::string export_plan(const std::string& path) const;
  // Writes the selected plan as a stack's file (megatron | torchtitan | deepspeed | arctic, planner/
  // stacks.hpp); returns the launch line and what the stack cannot express, for the status line.
  std::vector<std::string> export_to_stack(const std::string& stack, const std::string& path) const;
  // Opens a Megatron-LM / torchtitan / DeepSpeed / ArcticTraining configuration as the inputs
  // (model, sequence, runtime, precision) and the plan, on the current cluster. Errors go to the
  // error panel ("action"); the import's warnings to the status line.
  void open_stack_config(const std::string& stack, const std::string& path, double now);

  json report(int frames) const;
  void begin_frame() {
    regions.clear();
    shown = json::object();
  }

 private:
  void predict_selected();
  void start_simulation();
  void poll_simulation();
  bool tab_requested_ = false;  // select state.view.tab on the next frame
  struct Simulated {
    std::string key;
    bool ok = false;
    std::string error;
    Prediction prediction;
    SimResult sim;
    SimResult timeline_sim;  // (App::timeline_sim)
    int64_t timeline_layers = 0;
    CpWork rank_work;
  };
  std::string cluster_arg(const std::string& cluster_file) const;
  bool inputs_dirty_ = true, plan_dirty_ = true;
  double last_input_change_ = -1e9;
  std::string running_search_key_, running_curve_key_;
  bool select_after_search_ = false;
  std::string predict_key_;             // the job and plan the latest memory prediction is for
  bool simulation_waiting_ = false;     // a newer plan waits for the running simulation to end
  BackgroundJob<Simulated> predict_;
  BackgroundJob<PlanTable> search_;
  BackgroundJob<MaxSeqCurve> maxseq_;
};

}  // namespace ctx::gui
