// The explorer's logic without a window: state documents round-trip and name the field they
// reject, inputs resolve like the CLI (cluster edits included), the plan table holds every valid
// plan with the search's ranking and filters/sorts as documented, measured reports are compared
// field by field, and the search worker can be cancelled.
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <stdexcept>
#include <thread>

#include "app_settle.hpp"
#include "gui/app.hpp"
#include "gui/background_job.hpp"
#include "gui/gui_state.hpp"
#include "gui/measured.hpp"
#include "gui/plan_rows.hpp"
#include "gui/resolve_inputs.hpp"

namespace {

using namespace ctx;
using namespace ctx::gui;

using ctx::gui::test::settle;

const Profiles& profiles() {
  static Profiles p = load_profiles(std::string(CTXPLAN_SOURCE_DIR) + "/profiles");
  return p;
}

std::string error_field(const json& j) {
  try {
    state_from_json(j, "state.json", default_state());
  } catch (const InputError& e) {
    EXPECT_EQ(e.where, "state.json");
    return e.field;
  }
  return "(accepted)";
}

TEST(GuiState, RoundTripsThroughJson) {
  GuiState s = default_state();
  s.inputs.model = "Qwen3-32B";
  s.inputs.seq_tokens = 1 << 20;
  s.inputs.docs = DocMode::histogram;
  s.inputs.doc_bins = {{1024, 0.5}, {65536, 0.5}};
  s.inputs.cp_kinds = {false, true, false, true, false};
  s.inputs.cluster_edit = {true, 4, 8, "H200-141GB", 450, 50, 1024};
  s.plan = "tp=8,cp=4";
  s.view.tab = "timeline";
  s.view.timeline_t0 = 0.5;
  s.view.timeline_t1 = 1.25;
  const json j = state_to_json(s);
  EXPECT_EQ(state_to_json(state_from_json(j, "x", default_state())), j);
}

TEST(GuiState, MissingFieldsKeepTheBase) {
  GuiState base = default_state();
  base.inputs.seq_tokens = 65536;
  GuiState s = state_from_json(json{{"plan", "cp=4"}}, "x", base);
  EXPECT_EQ(s.inputs.seq_tokens, 65536);
  EXPECT_EQ(s.plan, "cp=4");
}

TEST(GuiState, BadFieldsAreNamed) {
  EXPECT_EQ(error_field(json{{"view", {{"tab", "gantt"}}}}), "view.tab");
  EXPECT_EQ(error_field(json{{"inputs", {{"seq", -5}}}}), "inputs.seq");
  EXPECT_EQ(error_field(json{{"inputs", {{"docs", {{"bins", {{2048, "half"}}}}}}}}), "inputs.docs.bins[0]");
  EXPECT_EQ(error_field(json{{"inputs", {{"constraints", {{"cp_kinds", {"spiral"}}}}}}}), "inputs.constraints.cp_kinds");
  EXPECT_EQ(error_field(json{{"colour", "blue"}}), "colour");
  EXPECT_EQ(error_field(json{{"schema", "ctxplan.plan/1"}}), "schema");
}

TEST(ResolveInputs, MaskTextIsWhatThePlanParserReads) {
  Inputs in = default_state().inputs;
  in.docs = DocMode::histogram;
  in.doc_bins = {{2048, 0.8}, {32768, 0.2}};
  const Plan p = parse_plan("mask=" + mask_text(in));
  const Plan q = parse_plan("mask=doc:hist:2048@0.8/32768@0.2");
  EXPECT_EQ(mask_to_string(p), mask_to_string(q));
  in.docs = DocMode::fixed;
  in.doc_tokens = 8192;
  EXPECT_EQ(mask_text(in), "doc:8192");
}

TEST(ResolveInputs, ClusterEditsOverrideTheProfile) {
  Inputs in = default_state().inputs;
  in.cluster_edit = {true, 2, 4, "", 0, 25, 512};
  const ResolvedJob job = resolve_inputs(profiles(), in);
  EXPECT_EQ(job.cluster.nodes, 2);
  EXPECT_EQ(job.cluster.gpus_per_node, 4);
  EXPECT_EQ(job.cluster.gpu.name, "H100-SXM-80GB");
  EXPECT_DOUBLE_EQ(job.cluster.inter_bytes_per_second, 25e9);
  EXPECT_DOUBLE_EQ(job.cluster.intra_bytes_per_second, resolve_cluster(profiles(), "8xh100").intra_bytes_per_second);
  EXPECT_EQ(job.cluster.host_bytes_per_node, int64_t(512) << 30);
  EXPECT_EQ(job.request.cluster.nodes, 2);
}

TEST(ResolveInputs, BadInputsNameTheField) {
  Inputs in = default_state().inputs;
  in.tp_values = "1,two";
  try {
    resolve_inputs(profiles(), in);
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.where, "inputs");
    EXPECT_EQ(e.field, "constraints.tp");
  }
  in = default_state().inputs;
  in.cp_kinds.fill(false);
  EXPECT_THROW(resolve_inputs(profiles(), in), InputError);
  in = default_state().inputs;
  in.model = "Llama-9";
  EXPECT_THROW(resolve_inputs(profiles(), in), InputError);
}

// The inputs' fixed keys are the CLI's -p: every plan the search proposes keeps them (the same
// implementation, planner/search.hpp), a key no plan can have names the input field, and the keys
// survive the state file.
TEST(ResolveInputs, FixedKeysAreKeptByEveryPlanTheSearchProposes) {
  Inputs in = default_state().inputs;
  in.fixed_keys = "tp=1,cp_kind=ulysses";
  const ResolvedJob job = resolve_inputs(profiles(), in);
  SearchResult r = search_plans(job.request);
  ASSERT_FALSE(r.ranked.empty());
  for (const Candidate& c : r.ranked) {
    EXPECT_EQ(c.plan.tp, 1) << plan_to_string(c.plan);
    EXPECT_EQ(c.plan.cp_comm, CpComm::a2a) << plan_to_string(c.plan);
  }
  in.fixed_keys = "tp=3";
  try {
    resolve_inputs(profiles(), in);
    FAIL() << "tp=3 on 8 GPUs accepted";
  } catch (const InputError& e) {
    EXPECT_NE(e.where.find("constraints.keys"), std::string::npos) << e.what();
    EXPECT_EQ(e.field, "tp") << e.what();
  }
  GuiState s = default_state();
  s.inputs.fixed_keys = "zero=3,tiled_loss=256";
  EXPECT_EQ(state_from_json(state_to_json(s), "state.json", default_state()).inputs.fixed_keys, "zero=3,tiled_loss=256");
}

// The inputs' pipeline split (vpp, pp_first, pp_last, pp_embed, pp_loss) is a constraint like the
// fixed keys: Llama-3.1-8B (32 layers) on 8 GPUs with pp_first = pp_last = 4 leaves 24 layers for
// the other stages, which pp = 4 (12 each) and pp = 8 (4 each) build and pp = 2 does not (no middle
// stages for them; pipeline_split_error): every plan of the table keeps the split at one of those
// pp, the table is the CLI search's with the same keys, and the keys survive the state file; a
// negative value names its input.
TEST(ResolveInputs, ThePipelineSplitIsKeptByEveryPlanOfTheTable) {
  Inputs in = default_state().inputs;
  in.model = "Llama-3.1-8B";
  in.cluster = "8xh100";
  in.runtime = "megatron";  // a stack that runs pipelines (ctxrun refuses pp > 1, naming the key)
  in.seq_tokens = 8192;
  in.refine = 0;
  in.pp_first = 4;
  in.pp_last = 4;
  EXPECT_EQ(pipeline_split_keys(in), "pp_first=4,pp_last=4");
  const ResolvedJob job = resolve_inputs(profiles(), in);
  EXPECT_EQ(job.request.base.pp_first, 4);
  EXPECT_EQ(job.request.base.pp_last, 4);
  const PlanTable t = build_plan_table(job.request, {});
  ASSERT_FALSE(t.rows.empty());
  bool pp4 = false, pp8 = false;
  for (const PlanRow& row : t.rows) {
    EXPECT_EQ(row.plan.pp_first, 4) << row.text;
    EXPECT_EQ(row.plan.pp_last, 4) << row.text;
    EXPECT_TRUE(row.plan.pp == 4 || row.plan.pp == 8) << row.text;
    EXPECT_NE(row.text.find("pp_first=4"), std::string::npos) << row.text;
    pp4 |= row.plan.pp == 4;
    pp8 |= row.plan.pp == 8;
  }
  EXPECT_TRUE(pp4 && pp8);
  // the same search as the keys typed among the fixed keys (the CLI's -p)
  Inputs typed = in;
  typed.pp_first = typed.pp_last = 0;
  typed.fixed_keys = "pp_first=4,pp_last=4";
  const SearchResult r = search_plans(resolve_inputs(profiles(), typed).request);
  EXPECT_EQ(r.valid, t.valid);
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_EQ(plan_to_string(r.ranked.front().plan), t.rows.front().text);
  // pp_embed / pp_loss and vpp the same way; the state file keeps them
  GuiState s = default_state();
  s.inputs.vpp = 2;
  s.inputs.pp_embed = true;
  s.inputs.pp_loss = true;
  const GuiState back = state_from_json(state_to_json(s), "state.json", default_state());
  EXPECT_EQ(back.inputs.vpp, 2);
  EXPECT_TRUE(back.inputs.pp_embed);
  EXPECT_TRUE(back.inputs.pp_loss);
  EXPECT_EQ(pipeline_split_keys(back.inputs), "vpp=2,pp_embed=1,pp_loss=1");
  EXPECT_EQ(error_field(json{{"inputs", {{"constraints", {{"pp_first", -1}}}}}}), "inputs.constraints.pp_first");
  in.pp_last = -2;
  try {
    resolve_inputs(profiles(), in);
    FAIL() << "pp_last=-2 accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.where, "inputs");
    EXPECT_EQ(e.field, "constraints.pp_last");
  }
}

struct SmallTable : ::testing::Test {
  static SearchRequest request() {
    SearchRequest r = resolve_inputs(profiles(), default_state().inputs).request;
    r.cluster = resolve_cluster(profiles(), "4xh100");
    return r;
  }
  static const PlanTable& table() {
    static PlanTable t = build_plan_table(request(), {});
    return t;
  }
};

TEST_F(SmallTable, HoldsEveryValidPlanFittingFirstInSearchOrder) {
  // the table prices every fitting plan (no pipeline plan left unpriced): the search it matches is
  // the one with pruning off
  SearchRequest all = request();
  all.prune_pipeline = false;
  const SearchResult s = search_plans(all);
  const PlanTable& t = table();
  EXPECT_TRUE(t.complete);
  EXPECT_EQ(static_cast<int64_t>(t.rows.size()), s.valid);
  ASSERT_GE(t.rows.size(), s.ranked.size());
  for (size_t i = 0; i < s.ranked.size(); ++i) {
    EXPECT_EQ(t.rows[i].text, plan_to_string(s.ranked[i].plan));
    EXPECT_TRUE(t.rows[i].fits);
    EXPECT_EQ(t.rows[i].rank, static_cast<int>(i));
  }
  for (size_t i = s.ranked.size(); i < t.rows.size(); ++i) EXPECT_FALSE(t.rows[i].fits) << t.rows[i].text;
  size_t frontier = 0;
  for (auto& r : t.rows) frontier += r.pareto;
  EXPECT_EQ(frontier, s.pareto.size());
}

TEST_F(SmallTable, FilterKeepsRowsWithEveryWord) {
  const PlanTable& t = table();
  const std::vector<int> order = table_order(t, "ZIGZAG  zero=3", false, PlanColumn::rank, false);
  ASSERT_FALSE(order.empty());
  size_t expected = 0;
  for (auto& r : t.rows) expected += r.text.find("zigzag") != std::string::npos && r.text.find("zero=3") != std::string::npos;
  EXPECT_EQ(order.size(), expected);
  const std::vector<int> fitting = table_order(t, "", true, PlanColumn::rank, false);
  EXPECT_EQ(static_cast<int64_t>(fitting.size()), t.fitting);
}

TEST_F(SmallTable, SortsByPeakEitherWayAndByRankFirstToLast) {
  const PlanTable& t = table();
  std::vector<int> up = table_order(t, "", false, PlanColumn::peak, false);
  for (size_t i = 1; i < up.size(); ++i) EXPECT_LE(t.rows[up[i - 1]].peak_bytes, t.rows[up[i]].peak_bytes);
  std::vector<int> down = table_order(t, "", false, PlanColumn::peak, true);
  for (size_t i = 1; i < down.size(); ++i) EXPECT_GE(t.rows[down[i - 1]].peak_bytes, t.rows[down[i]].peak_bytes);
  std::vector<int> rank = table_order(t, "", false, PlanColumn::rank, false);
  for (int i = 0; i < t.fitting; ++i) EXPECT_EQ(t.rows[rank[i]].rank, i);
  std::vector<int> tps = table_order(t, "", true, PlanColumn::tokens_per_second, false);
  for (size_t i = 1; i < tps.size(); ++i) EXPECT_GE(t.rows[tps[i - 1]].tokens_per_second, t.rows[tps[i]].tokens_per_second);
}

TEST(Measured, ReportFieldsWithWrongTypesAreNamed) {
  const std::string path = ::testing::TempDir() + "bad_report.json";
  write_file_atomic(path, R"({"schema": "ctxrun.report/1", "memory": {"peak_bytes": "lots"}})");
  try {
    load_measured_report(path);
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.where, path);
    EXPECT_EQ(e.field, "memory.peak_bytes");
  }
  write_file_atomic(path, R"({"schema": "something/1"})");
  EXPECT_THROW(load_measured_report(path), InputError);
}

TEST(Measured, APredictionComparedWithItselfHasNoError) {
  const std::string path = ::testing::TempDir() + "self_report.json";
  const ResolvedJob job = resolve_inputs(profiles(), default_state().inputs);
  const Prediction p = predict(job.model, job.cluster, job.runtime, selected_plan(job, default_state().plan), job.seq_tokens);
  write_file_atomic(path, prediction_to_json(p).dump());
  const MeasuredReport m = load_measured_report(path);
  const std::vector<ComparisonRow> rows = compare_to_prediction(m, p);
  EXPECT_EQ(rows.size(), m.values.size());
  EXPECT_GE(rows.size(), static_cast<size_t>(kMemCategories + 6));
  for (auto& r : rows) EXPECT_EQ(r.relative_error, 0.0) << r.name;
  EXPECT_TRUE(job_mismatches(m, p).empty());
}

TEST(Measured, AMeasurementsPhaseTimesMapOntoThePredictionsPhases) {
  // ctxplan.measurement/1 (ctxrun --report) times forward, loss, backward, optimizer
  const std::string path = ::testing::TempDir() + "measurement.json";
  write_file_atomic(path, R"({"schema": "ctxplan.measurement/1", "model": "tiny", "seq": 256,
    "memory": {"peak_bytes": 1000, "by_category": {"weights": 400, "activations": 600}},
    "time": {"step_seconds": 1.0, "phases": {"forward": 0.25, "loss": 0.125, "backward": 0.5, "optimizer": 0.125}},
    "losses": [5.5, 5.4]})");
  const MeasuredReport m = load_measured_report(path);
  std::map<std::string, double> v;
  for (auto& x : m.values) v[x.name] = x.value;
  EXPECT_EQ(v["time.phases_seconds.forward"], 0.25);
  EXPECT_EQ(v["time.phases_seconds.backward"], 0.625);  // loss + backward
  EXPECT_EQ(v["time.phases_seconds.optimizer"], 0.125);
  EXPECT_EQ(v["memory.by_category.activations"], 600);
  EXPECT_EQ(m.losses.size(), 2u);
}

TEST(BackgroundJob, CancelStopsTheWorkAndStartingAgainReplacesIt) {
  BackgroundJob<int> job;
  job.start([](const BackgroundJob<int>::Progress& progress) {
    for (int i = 0; i < 100000; ++i) {
      if (!progress(i / 100000.0)) return -1;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return 1;
  });
  EXPECT_TRUE(job.running());
  job.start([](const BackgroundJob<int>::Progress&) { return 2; });  // cancels the first
  int result = 0;
  for (int i = 0; i < 2000 && !job.take(result); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(result, 2);
  for (int i = 0; i < 2000 && job.busy(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_FALSE(job.busy()) << "the cancelled run did not stop";
}

// A worker's exception (not an input error) must not terminate the app: the run ends, its result
// is the default and failure() says what was thrown, until the next run.
TEST(BackgroundJob, AWorkersExceptionBecomesItsFailureNotATermination) {
  BackgroundJob<int> job;
  job.start([](const BackgroundJob<int>::Progress&) -> int { throw std::runtime_error("bad_alloc in the simulator"); });
  int result = 7;
  for (int i = 0; i < 5000 && !job.take(result); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(result, 0);
  EXPECT_EQ(job.failure(), "bad_alloc in the simulator");
  job.start([](const BackgroundJob<int>::Progress&) -> int { throw 42; });
  for (int i = 0; i < 5000 && !job.take(result); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(job.failure(), "unknown exception");
  job.start([](const BackgroundJob<int>::Progress&) { return 3; });
  for (int i = 0; i < 5000 && !job.take(result); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(result, 3);
  EXPECT_TRUE(job.failure().empty());
}

TEST(App, BrokenInputsKeepThePreviousJobAndItsPrediction) {
  App app(std::string(CTXPLAN_SOURCE_DIR) + "/profiles");
  app.state.run_search = false;
  settle(app, 0);
  ASSERT_TRUE(app.have_prediction);
  const double peak = app.prediction.memory.peak.total();
  app.state.inputs.model = "/nonexistent/config.json";
  app.inputs_changed(1);
  settle(app, 2);
  ASSERT_TRUE(app.errors.count("inputs"));
  EXPECT_NE(app.errors["inputs"].message.find("/nonexistent/config.json"), std::string::npos);
  EXPECT_TRUE(app.using_previous_inputs);
  EXPECT_EQ(app.job->model.name, "Llama-3.1-8B");
  EXPECT_EQ(app.prediction.memory.peak.total(), peak);
  // fixing the input clears the error
  app.state.inputs.model = "Llama-3.1-70B";
  app.inputs_changed(3);
  settle(app, 4);
  EXPECT_FALSE(app.errors.count("inputs"));
  EXPECT_EQ(app.prediction.model, "Llama-3.1-70B");
}

TEST(App, UsingAReportsJobMakesItsPredictionComparable) {
  // a report of another job: tiny model, 2 GPUs, 4K tokens
  const std::string path = ::testing::TempDir() + "tiny_report.json";
  const Prediction tiny = predict(resolve_model(profiles(), "tiny"), resolve_cluster(profiles(), "2xh100"),
                                  resolve_runtime(profiles(), "ctxrun-cuda"), parse_plan("cp=2,cp_kind=ring"), 4096);
  write_file_atomic(path, prediction_to_json(tiny).dump());
  App app(std::string(CTXPLAN_SOURCE_DIR) + "/profiles");
  app.state.run_search = false;
  settle(app, 0);
  app.load_measured(path);
  ASSERT_TRUE(app.measured);
  EXPECT_EQ(job_mismatches(*app.measured, app.prediction).size(), 4u);  // model, cluster, seq, plan
  app.use_measured_job();
  settle(app, 1);
  EXPECT_TRUE(app.errors.empty()) << app.errors.begin()->second.message;
  EXPECT_TRUE(job_mismatches(*app.measured, app.prediction).empty());
  for (auto& r : app.comparison) EXPECT_EQ(r.relative_error, 0.0) << r.name;
}

// A file dropped on the window becomes the measured run and its tab is selected on the next frame.
TEST(App, ADroppedFileBecomesTheMeasuredRunOnItsTab) {
  App app(std::string(CTXPLAN_SOURCE_DIR) + "/profiles");
  app.state.run_search = false;
  settle(app, 0);
  app.drop_files({std::string(CTXPLAN_SOURCE_DIR) + "/tests/data/stacks/megatron_train.log", "/tmp/second_file_ignored"});
  ASSERT_TRUE(app.measured);
  EXPECT_EQ(app.measured->format, "Megatron-LM log");
  EXPECT_EQ(app.state.view.tab, "measured");
  EXPECT_TRUE(app.take_tab_request());
  EXPECT_FALSE(app.take_tab_request()) << "the tab is selected once, then the user's clicks rule";
  EXPECT_NE(app.status.find("loaded the first"), std::string::npos) << app.status;
  app.drop_files({"/nonexistent/run.json"});
  EXPECT_TRUE(app.errors.count("measured")) << "a file that cannot be read is an error in the window";
}

// A step too large to draw (the 128-rank plain ring of issue 15: 9.4M tasks) keeps its simulated
// numbers from the streaming sweep, records none of its tasks, and settles quickly; the timeline
// gets the same plan over fewer layers, recorded, and the 1024-rank ring (7M tasks a layer) none.
TEST(App, AHugeStepIsSimulatedButNotRecordedForTheTimeline) {
  App app(std::string(CTXPLAN_SOURCE_DIR) + "/profiles");
  app.state.run_search = false;
  app.state.inputs.model = "Llama-3.1-70B";
  app.state.inputs.cluster = "h100-superpod-1024";
  app.state.inputs.seq_tokens = 1048576;
  app.inputs_changed(0);
  settle(app, 0);
  app.select_plan("tp=8,cp=128,cp_kind=ring,zero=3,recompute=full");
  settle(app, 1);
  ASSERT_TRUE(app.have_prediction);
  ASSERT_FALSE(app.time_pending);
  EXPECT_GT(app.sim.stats.tasks, kTimelineMaxTasks);
  EXPECT_TRUE(app.sim.tasks.empty());
  EXPECT_EQ(app.prediction.time.method, "simulated");
  EXPECT_GT(app.prediction.time.step_seconds, 0);
  // the shorter step: the same ranks and task kinds, fewer layers, every task recorded
  EXPECT_EQ(app.timeline_layers, kTimelineShortLayers);
  EXPECT_EQ(static_cast<int64_t>(app.timeline_sim.tasks.size()), app.timeline_sim.stats.tasks);
  EXPECT_GT(app.timeline_sim.stats.tasks, 0);
  EXPECT_LE(app.timeline_sim.stats.tasks, kTimelineMaxTasks);
  EXPECT_EQ(app.timeline_sim.reps.size(), app.sim.reps.size());
  EXPECT_LT(app.timeline_sim.time.step_seconds, app.prediction.time.step_seconds);
  std::set<std::string> names_short;
  for (const SimTask& t : app.timeline_sim.tasks) names_short.insert(t.name);
  EXPECT_TRUE(names_short.count("attention_bwd") && names_short.count("ring_dkv") && names_short.count("zero3_all_gather"));
  // a layer of the 1024-rank ring alone passes the limit: no timeline
  app.select_plan("cp=1024,cp_kind=ring,zero=3,recompute=full");
  settle(app, 2);
  ASSERT_FALSE(app.time_pending);
  EXPECT_TRUE(app.sim.tasks.empty());
  EXPECT_TRUE(app.timeline_sim.tasks.empty());
  EXPECT_EQ(app.timeline_layers, 0);
  // a small step is recorded for the timeline
  app.state.inputs.model = "Llama-3.1-8B";
  app.state.inputs.cluster = "8xh100";
  app.state.inputs.seq_tokens = 65536;
  app.inputs_changed(3);
  settle(app, 3);
  app.select_plan("cp=8,cp_kind=ring,zero=3,recompute=full");
  settle(app, 4);
  EXPECT_LE(app.sim.stats.tasks, kTimelineMaxTasks);
  EXPECT_EQ(static_cast<int64_t>(app.sim.tasks.size()), app.sim.stats.tasks);
  EXPECT_TRUE(app.timeline_sim.tasks.empty());
  EXPECT_EQ(app.timeline_layers, 0);
}

TEST(App, AnInvalidPlanIsAnErrorNotACrash) {
  App app(std::string(CTXPLAN_SOURCE_DIR) + "/profiles");
  app.state.run_search = false;
  settle(app, 0);
  app.select_plan("cp=3");
  settle(app, 1);
  ASSERT_TRUE(app.errors.count("plan"));
  EXPECT_TRUE(app.have_prediction);  // the previous plan's prediction stays
}

}  // namespace

// ---- the stacks (planner/stacks.hpp, planner/stack_measurements.hpp) ------------------------

TEST(GuiStacks, MeasuredTabReadsAStackLogFieldByField) {
  const std::string log = std::string(CTXPLAN_SOURCE_DIR) + "/tests/data/stacks/megatron_train.log";
  MeasuredReport m = load_measured_report(log);
  EXPECT_EQ(m.format, "Megatron-LM log");
  EXPECT_EQ(m.global_batch_samples, 16);
  Prediction p;
  p.world = 16;
  p.seq = 131072;
  p.time.step_seconds = 40;
  p.time.tokens_per_second = 16.0 * 131072 / 40;
  p.memory.peak.bytes[0] = 6e10;
  p.memory.peak.bytes[static_cast<int>(Mem::runtime)] = 2e9;
  std::vector<ComparisonRow> rows = compare_to_prediction(m, p);
  const double step = (47100.0 + 46900.0 + 47000.0) / 3 / 1000;  // the log's iterations after the first
  bool saw_step = false, saw_tps = false, saw_peak = false;
  for (const auto& r : rows) {
    if (r.name == "time.step_seconds") {
      saw_step = true;
      EXPECT_NEAR(r.measured, step, 1e-9);
      EXPECT_NEAR(r.relative_error, (step - 40) / 40, 1e-9);
    }
    if (r.name == "memory.peak_bytes") {
      saw_peak = true;
      EXPECT_EQ(r.predicted, 6e10);  // the predicted peak without its runtime category
      EXPECT_NEAR(r.measured, 61500.25 * 1024 * 1024, 1);  // the log's highest "max allocated" (MB = 2^20)
    }
    if (r.name == "time.tokens_per_second") {
      saw_tps = true;
      EXPECT_NEAR(r.measured, 16.0 * 131072 / step, 1e-6);  // global batch x seq / step
    }
  }
  EXPECT_TRUE(saw_step);
  EXPECT_TRUE(saw_tps);
  EXPECT_TRUE(saw_peak);
}

TEST(GuiStacks, OpensAStackConfigAndExportsTheSelectedPlanBack) {
  App app(std::string(CTXPLAN_SOURCE_DIR) + "/profiles");
  app.state = default_state();
  app.state.run_search = false;
  app.state.inputs.cluster = "8xh100";
  settle(app, 0);
  ASSERT_TRUE(app.job.has_value());
  const std::string yml = std::string(CTXPLAN_SOURCE_DIR) + "/tests/data/stacks/arctic_sp8_llama_8b.yml";
  app.open_stack_config("arctic", yml, 1);
  ASSERT_TRUE(app.errors.empty()) << app.errors.begin()->second.message;
  settle(app, 100);
  ASSERT_TRUE(app.have_prediction);
  EXPECT_EQ(app.state.inputs.model, "Llama-3.1-8B");
  EXPECT_EQ(app.state.inputs.seq_tokens, 500000);
  EXPECT_EQ(cp_kind_of(app.prediction.plan), CpKind::ulysses);
  EXPECT_EQ(app.prediction.plan.cp, 8);
  const std::string out = (std::filesystem::temp_directory_path() / ("gui_stack_" + std::to_string(::getpid()) + ".yml")).string();
  std::vector<std::string> lines = app.export_to_stack("arctic", out);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find("arctic_training"), std::string::npos);
  // the written file opens back as the same plan
  App again(std::string(CTXPLAN_SOURCE_DIR) + "/profiles");
  again.state = default_state();
  again.state.run_search = false;
  again.state.inputs.cluster = "8xh100";
  settle(again, 0);
  again.open_stack_config("arctic", out, 1);
  settle(again, 100);
  ASSERT_TRUE(again.have_prediction);
  EXPECT_EQ(plan_to_string(again.prediction.plan), plan_to_string(app.prediction.plan));
  std::filesystem::remove(out);
  // a file that is not there goes to the error panel, the inputs stay
  again.open_stack_config("megatron", "/nonexistent/args.sh", 2);
  EXPECT_EQ(again.errors.count("action"), 1u);
  EXPECT_EQ(again.state.inputs.model, "Llama-3.1-8B");
}
