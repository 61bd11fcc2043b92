#include "gui/app.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <sstream>

#include "planner/stacks.hpp"

namespace ctx::gui {
namespace fs = std::filesystem;

namespace {

// Searches restart this long after the last input change, so dragging a slider does not start
// one search per frame.
constexpr double kSearchDebounceSeconds = 0.3;
// The max-seq curve's ceiling: 16x the slider's top (16M tokens); bisection makes it cheap.
constexpr int64_t kMaxSeqCeilingTokens = int64_t(1) << 28;

std::string shell_quote(const std::string& s) {
  bool plain = !s.empty();
  for (char ch : s) plain = plain && (std::isalnum(static_cast<unsigned char>(ch)) || std::string("-_./:=,@+").find(ch) != std::string::npos);
  if (plain) return s;
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

}  // namespace

App::App(std::string profiles_dir) {
  state = default_state();
  try {
    profiles = load_profiles(profiles_dir);
  } catch (const InputError& e) {
    profiles.dir = profiles_dir;
    set_error("profiles", e);
  }
}

void App::set_error(const std::string& source, const InputError& e) { errors[source] = {e.where, e.field, e.what()}; }
void App::set_error(const std::string& source, const std::string& message) { errors[source] = {"", "", message}; }

void App::reload_profiles() {
  try {
    profiles = load_profiles(profiles.dir);
    errors.erase("profiles");
    inputs_dirty_ = true;
  } catch (const InputError& e) {
    set_error("profiles", e);  // keep the profiles loaded before
  }
}

void App::inputs_changed(double now) {
  inputs_dirty_ = true;
  last_input_change_ = now;
}

void App::select_plan(const std::string& text) {
  state.plan = text;
  plan_dirty_ = true;
}

void App::choose_cp(const CpChoice& c) {
  cp_choice = c;
  cp_choice_from = CpChoiceFrom::pick;
  Plan base;
  bool parsed = false;
  if (job) {
    try {
      base = selected_plan(*job, state.plan);
      parsed = true;
    } catch (const InputError&) {  // its reason is already in errors["plan"]
    }
  }
  if (!parsed && have_prediction) base = prediction.plan;  // keep the last plan's other keys
  select_plan(plan_text_with(base, c));
}

void App::predict_selected() {
  plan_dirty_ = false;
  if (!job) return;
  Plan p;
  try {
    p = selected_plan(*job, state.plan);
  } catch (const InputError& e) {
    set_error("plan", e);
    // typed text that does not parse: the controls show the last valid plan's axes (the header says so)
    if (cp_choice_from != CpChoiceFrom::pick && have_prediction) {
      cp_choice = cp_choice_of(prediction.plan);
      cp_choice_from = CpChoiceFrom::last_valid;
    }
    return;
  }
  cp_choice = cp_choice_of(p);
  cp_choice_from = CpChoiceFrom::plan;
  const PlanCheck check = check_plan(p, job->model, job->cluster, job->seq_tokens);
  if (!check.ok()) {
    // the same words predict() uses
    set_error("plan", InputError("selected plan", "", "invalid plan for " + job->model.name + " on " + job->cluster.name + " at " +
                                                         std::to_string(job->seq_tokens) + " tokens: " + check.message()));
    return;
  }
  errors.erase("plan");
  // memory now, within the frame
  prediction.model = job->model.name;
  prediction.cluster = job->cluster.name;
  prediction.gpu = job->cluster.gpu.name;
  prediction.runtime = job->runtime.name;
  prediction.attention = job->attention.name;  // what step_costs prices (the simulation's prediction says the same)
  prediction.seq = job->seq_tokens;
  prediction.world = world_size(job->cluster);
  prediction.plan = p;
  prediction.warnings = check.warnings;
  prediction.memory = predict_memory(job->model, job->cluster, job->runtime, p, job->seq_tokens);
  have_prediction = true;
  time_pending = true;
  predict_key_ = job->key + "|" + plan_to_string(p);
  // the simulated step on the worker: one at a time, the latest plan next
  if (predict_.running()) {
    simulation_waiting_ = true;
  } else {
    start_simulation();
    // small plans simulate in milliseconds: show them in this frame rather than the next
    for (int i = 0; i < 40 && time_pending; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      poll_simulation();
    }
  }
}

void App::start_simulation() {
  simulation_waiting_ = false;
  const ModelSpec m = job->model;
  const ClusterSpec c = job->cluster;
  const RuntimeProfile rt = job->runtime;
  const Plan p = prediction.plan;
  const int64_t seq = job->seq_tokens;
  const std::string key = predict_key_;
  predict_.start([m, c, rt, p, seq, key](const BackgroundJob<Simulated>::Progress&) {
    Simulated s;
    s.key = key;
    try {
      // the numbers from the streaming sweep; the timeline's tasks are recorded only for a step
      // of at most kTimelineMaxTasks (a 128-rank plain ring has 9.4M: seconds and 2 GB to record)
      // (the numbers shown are the streaming sweep's, the same as ctxplan predict's; the recording
      // sweeps every task and can differ from them by rounding, ~1e-15)
      // the per-rank attention work (0.6 s for headtail-doc over 16M tokens at cp=128: not in the frame)
      s.rank_work = cp_work(p, seq);
      s.prediction = predict(m, c, rt, p, seq, &s.sim, SimRecord::none);
      if (s.sim.stats.tasks <= kTimelineMaxTasks) {
        predict(m, c, rt, p, seq, &s.sim, SimRecord::tasks);
      } else if (p.pp <= 1 && m.layers > 1) {
        // too large to record (the 1024-GPU space's plain rings: 9.4M-588M tasks): the timeline
        // draws the same plan over fewer layers, where a layer has few enough tasks
        const int64_t per_layer = (s.sim.stats.tasks + m.layers - 1) / m.layers;
        const int64_t layers = std::min({kTimelineShortLayers, m.layers - 1, kTimelineMaxTasks / std::max<int64_t>(1, per_layer)});
        if (layers >= 1) {
          ModelSpec shorter = m;
          shorter.layers = layers;
          predict(shorter, c, rt, p, seq, &s.timeline_sim, SimRecord::tasks);
          if (s.timeline_sim.stats.tasks <= kTimelineMaxTasks) s.timeline_layers = layers;
          else s.timeline_sim = SimResult{};  // (the estimate per layer missed: no timeline)
        }
      }
      s.ok = true;
    } catch (const InputError& e) {
      s.error = e.what();
    }
    return s;
  });
}

void App::poll_simulation() {
  Simulated s;
  if (!predict_.take(s)) return;
  if (!predict_.failure().empty()) {
    set_error("simulation", "the simulation failed: " + predict_.failure() + " (a bug: please report it)");
    time_pending = false;
    return;
  }
  if (s.key == predict_key_) {
    if (s.ok) {
      prediction = std::move(s.prediction);
      sim = std::move(s.sim);
      timeline_sim = std::move(s.timeline_sim);
      timeline_layers = s.timeline_layers;
      rank_work = std::move(s.rank_work);
      ++sim_generation;
      time_pending = false;
      if (measured) comparison = compare_to_prediction(*measured, prediction);
    } else {
      set_error("plan", s.error);
    }
  }
  if (simulation_waiting_) start_simulation();
}

void App::update(double now) {
  if (inputs_dirty_) {
    inputs_dirty_ = false;
    try {
      ResolvedJob j = resolve_inputs(profiles, state.inputs);
      const bool same = job && job->key == j.key;
      job = std::move(j);
      using_previous_inputs = false;
      errors.erase("inputs");
      if (!same) plan_dirty_ = true;
    } catch (const InputError& e) {
      set_error("inputs", e);
      using_previous_inputs = job.has_value();
    }
  }
  if (plan_dirty_) predict_selected();
  poll_simulation();

  // search: one per job, restarted when the job changes (debounced)
  PlanTable done;
  const bool searched = search_.take(done);
  if (searched && !search_.failure().empty()) {
    // running_search_key_ stays set: the same job is not searched again until its inputs change
    set_error("search", "the search failed: " + search_.failure() + " (a bug: please report it)");
  } else if (searched) {
    const bool for_current = job && done.job_key == job->key;
    if (done.complete || table.job_key != done.job_key) {
      table = std::move(done);
      ++table_generation;
    }
    running_search_key_.clear();
    if (for_current && !table.rows.empty() && table.rows[0].fits) {
      // a requested rank, or the best plan when the selected one cannot run here
      if (select_after_search_ && state.select_rank >= 0 && state.select_rank < table.fitting) {
        select_plan(table.rows[static_cast<size_t>(state.select_rank)].text);
      } else if (errors.count("plan")) {
        select_plan(table.rows[0].text);
      }
      select_after_search_ = false;
      if (plan_dirty_) predict_selected();
    }
  }
  if (state.run_search && job && table.job_key != job->key && running_search_key_ != job->key &&
      now - last_input_change_ >= kSearchDebounceSeconds)
    start_search();

  MaxSeqCurve c;
  if (maxseq_.take(c)) {
    if (!maxseq_.failure().empty()) {
      // running_curve_key_ stays set: the same curve is not started again until the inputs change
      set_error("maxseq", "the max-sequence curve failed: " + maxseq_.failure() + " (a bug: please report it)");
    } else {
      if (!c.cancelled) curve = std::move(c);
      running_curve_key_.clear();
    }
  }
  if ((state.run_maxseq || state.view.tab == "maxseq") && job && have_prediction && !curve_current() && running_curve_key_.empty() &&
      now - last_input_change_ >= kSearchDebounceSeconds)
    start_maxseq();
}

void App::start_search() {
  if (!job) return;
  const SearchRequest req = job->request;
  const std::string key = job->key;
  running_search_key_ = key;
  select_after_search_ = state.select_rank >= 0;
  search_.start([req, key](const BackgroundJob<PlanTable>::Progress& progress) {
    PlanTable t = build_plan_table(req, progress);
    t.job_key = key;
    return t;
  });
}

bool App::curve_current() const {
  return job && have_prediction && curve.job_key == job->key + "|" + plan_to_string(prediction.plan) + "|" +
                                                     std::to_string(state.view.maxseq_max_gpus);
}

void App::start_maxseq() {
  if (!job || !have_prediction) return;
  const SearchRequest req = job->request;
  const Plan family = prediction.plan;
  const int64_t max_gpus = state.view.maxseq_max_gpus;
  const std::string key = job->key + "|" + plan_to_string(family) + "|" + std::to_string(max_gpus);
  running_curve_key_ = key;
  maxseq_.start([req, family, max_gpus, key](const BackgroundJob<MaxSeqCurve>::Progress& progress) {
    MaxSeqCurve c = max_seq_curve(req, family, max_gpus, kMaxSeqCeilingTokens, progress);
    c.job_key = key;
    return c;
  });
}

void App::use_measured_job() {
  if (!measured) return;
  if (!measured->model.empty()) state.inputs.model = measured->model;
  if (!measured->cluster.empty()) {
    state.inputs.cluster = measured->cluster;
    state.inputs.cluster_edit.enabled = false;
  }
  if (!measured->runtime.empty()) state.inputs.runtime = measured->runtime;
  if (measured->seq_tokens > 0) state.inputs.seq_tokens = measured->seq_tokens;
  if (!measured->plan_text.empty()) state.plan = measured->plan_text;
  inputs_dirty_ = plan_dirty_ = true;
}

void App::drop_files(const std::vector<std::string>& paths) {
  if (paths.empty()) return;
  load_measured(paths.front());
  state.view.tab = "measured";
  tab_requested_ = true;
  if (paths.size() > 1) status = "dropped " + std::to_string(paths.size()) + " files: loaded the first as the measured run";
}

void App::load_measured(const std::string& path) {
  state.measured_path = path;
  if (path.empty()) {
    measured.reset();
    comparison.clear();
    errors.erase("measured");
    return;
  }
  try {
    measured = load_measured_report(path);
    errors.erase("measured");
    comparison = have_prediction ? compare_to_prediction(*measured, prediction) : std::vector<ComparisonRow>{};
  } catch (const InputError& e) {
    set_error("measured", e);  // keep the report loaded before
  }
}

bool App::idle() {
  return !inputs_dirty_ && !plan_dirty_ && !time_pending && !predict_.busy() && !search_.busy() && !maxseq_.busy() &&
         !(state.run_search && job && table.job_key != job->key) && !((state.run_maxseq || state.view.tab == "maxseq") && job && have_prediction && !curve_current());
}

std::string App::cluster_arg(const std::string& cluster_file) const {
  return state.inputs.cluster_edit.enabled ? cluster_file : state.inputs.cluster;
}

std::string App::command_line(const std::string& cluster_file) const {
  if (!job || !have_prediction) return "";
  std::ostringstream os;
  os << "ctxplan predict --model " << shell_quote(state.inputs.model) << " --cluster " << shell_quote(cluster_arg(cluster_file))
     << " --seq " << job->seq_tokens << " --runtime " << shell_quote(state.inputs.runtime);
  if (!state.inputs.attention.empty()) os << " --attention " << shell_quote(state.inputs.attention);
  os << " --plan " << shell_quote(plan_to_string(prediction.plan));
  return os.str();
}

std::string App::export_plan(const std::string& path) const {
  if (!job || !have_prediction) throw InputError(path, "", "no plan to export: the selected plan has no prediction yet");
  std::string model = state.inputs.model;
  std::error_code ec;
  if (fs::exists(model, ec)) model = fs::absolute(model, ec).string();  // a config.json: usable from anywhere
  std::string cluster = state.inputs.cluster;
  if (state.inputs.cluster_edit.enabled) {
    fs::path cpath = fs::path(path);
    cpath.replace_extension(".cluster.json");
    const ClusterSpec& c = job->cluster;
    json cj = {{"schema", "ctxplan.cluster/1"},
               {"name", c.name},
               {"gpu", c.gpu.name},
               {"nodes", c.nodes},
               {"gpus_per_node", c.gpus_per_node},
               {"intra_gbps", c.intra_bytes_per_second / 1e9},
               {"intra_latency_us", c.intra_latency_seconds * 1e6},
               {"inter_gbps", c.inter_bytes_per_second / 1e9},
               {"inter_latency_us", c.inter_latency_seconds * 1e6},
               {"host_gib_per_node", static_cast<double>(c.host_bytes_per_node) / (1024.0 * 1024 * 1024)},
               {"source", c.source}};
    write_file_atomic(cpath.string(), cj.dump(2) + "\n");
    cluster = fs::absolute(cpath, ec).string();
  } else if (fs::exists(cluster, ec)) {
    cluster = fs::absolute(cluster, ec).string();
  }
  json j = {{"schema", "ctxplan.plan/1"},
            {"model", model},
            {"cluster", cluster},
            {"seq", job->seq_tokens},
            {"runtime", state.inputs.runtime},
            {"plan", plan_to_json(prediction.plan)}};
  // as plan files carry it (planner/job_args.cpp runtime_with_job_attention); absent: the runtime's default
  if (!state.inputs.attention.empty()) j["attention"] = state.inputs.attention;
  write_file_atomic(path, j.dump(2) + "\n");
  return cluster;
}

std::vector<std::string> App::export_to_stack(const std::string& stack_name, const std::string& path) const {
  if (!job || !have_prediction) throw InputError(path, "", "no plan to export: the selected plan has no prediction yet");
  const Stack stack = parse_stack(stack_name, "export");
  ExportJob ej;
  ej.model = job->model;
  ej.model_arg = state.inputs.model;
  ej.seq = job->seq_tokens;
  ej.nodes = job->cluster.nodes;
  ej.gpus_per_node = job->cluster.gpus_per_node;
  ej.plan = prediction.plan;
  if (ej.plan.dp == 0) ej.plan.dp = world_size(job->cluster) / (ej.plan.tp * ej.plan.cp * ej.plan.pp);
  StackExport e = ctx::export_stack(stack, ej, profiles);
  write_file_atomic(path, e.text);
  std::vector<std::string> out = {"launch: " + e.launch};
  for (const auto& c : e.cannot_express) out.push_back(std::string(to_string(stack)) + " cannot express: " + c);
  return out;
}

void App::open_stack_config(const std::string& stack_name, const std::string& path, double now) {
  try {
    const Stack stack = parse_stack(stack_name, "open configuration");
    std::error_code ec;
    if (path.empty() || !std::filesystem::is_regular_file(path, ec)) throw InputError(path, "", "no such file");
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    ImportOptions o;
    if (job) o.world = world_size(job->cluster);  // the plan's dp fills the current cluster
    StackJob sj = import_stack(stack, text.str(), path, profiles, o);
    if (sj.model_spec)
      throw InputError(path, "", "the model shape matches no profile: `ctxplan import " + std::string(to_string(stack)) +
                                     " FILE -o plan.json` writes it as plan.model.json, which opens as the model");
    if (!sj.model.empty()) state.inputs.model = sj.model;
    if (sj.seq > 0) state.inputs.seq_tokens = sj.seq;
    state.inputs.runtime = sj.runtime;
    state.inputs.attention.clear();  // as `ctxplan import` writes the plan file: the runtime's default kernel
    state.inputs.precision = to_string(sj.plan.precision);
    state.plan = plan_to_string(sj.plan);
    errors.erase("action");
    status = "opened " + path + " (" + to_string(stack) + "): " + state.plan;
    if (!sj.warnings.empty())
      status += "; " + std::to_string(sj.warnings.size()) + " warning(s), first: " + sj.warnings.front();
    inputs_changed(now);
    plan_changed();
  } catch (const InputError& e) {
    set_error("action", e);
  }
}

json App::report(int frames) const {
  json j;
  j["schema"] = "ctxplan.gui-report/1";
  j["frames"] = frames;
  j["state"] = state_to_json(state, true);
  json errs = json::array();
  for (auto& [source, e] : errors) errs.push_back({{"source", source}, {"where", e.where}, {"field", e.field}, {"message", e.message}});
  j["errors"] = errs;
  j["error_panel_open"] = !errors.empty();
  j["using_previous_inputs"] = using_previous_inputs;
  if (job)
    j["job"] = {{"model", job->model.name},
                {"cluster", job->cluster.name},
                {"runtime", job->runtime.name},
                {"attention", job->attention.name},
                {"attention_default", job->attention_default},
                {"seq", job->seq_tokens},
                {"world", world_size(job->cluster)}};
  j["time_pending"] = time_pending;
  if (have_prediction) {
    j["selected_plan"] = plan_to_string(prediction.plan);
    j["prediction"] = prediction_to_json(prediction);
    j["timeline"] = {{"reps", sim.reps.size()}, {"tasks", sim.tasks.size()}, {"step_seconds", sim.time.step_seconds}};
  }
  j["search"] = {{"running", search_.running()},
                 {"current", table_current()},
                 {"complete", table.complete},
                 {"rows", table.rows.size()},
                 {"enumerated", table.enumerated},
                 {"valid", table.valid},
                 {"fitting", table.fitting},
                 {"simulated", table.simulated},
                 {"best", table.rows.empty() || !table.rows[0].fits ? "" : table.rows[0].text},
                 {"no_fit_reason", table.no_fit_reason},
                 {"not_dividing", table.not_dividing},
                 {"lower_precision", table.lower_precision}};
  if (!curve.points.empty() || curve_current()) {
    json pts = json::array();
    for (auto& p : curve.points)
      pts.push_back({{"gpus", p.gpus}, {"family_tokens", p.family_tokens}, {"family_plan", p.family_plan}, {"any_tokens", p.any_tokens},
                     {"any_plan", p.any_plan}});
    j["maxseq"] = {{"current", curve_current()}, {"family", curve.family}, {"hi_tokens", curve.hi_tokens}, {"points", pts}};
  }
  if (measured) {
    json rows = json::array();
    for (auto& r : comparison)
      rows.push_back({{"field", r.name}, {"predicted", r.predicted}, {"measured", r.measured}, {"relative_error", r.relative_error}});
    j["measured"] = {{"path", measured->path}, {"rows", rows}, {"losses", measured->losses.size()}};
  }
  j["shown"] = shown;
  json regs = json::object();
  for (auto& [name, r] : regions) regs[name] = {r[0], r[1], r[2], r[3]};
  j["regions"] = regs;
  j["status"] = status;
  return j;
}

}  // namespace ctx::gui
