// ctxplan-gui driven headless through state files, one panel per test: the PNG is not blank and
// the panel's region holds the colours it draws, and the numbers the GUI reports equal what the
// cost model and the planner compute for the same job (the library is the reference). Also: a
// malformed config.json opens the error panel and the app keeps the previous job and exits 0;
// a bad state file exits 2 naming the field; settings persist between runs; the exported
// plan.json and the copied command line reproduce the prediction in the ctxplan CLI.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>
#include <fstream>

#include "costmodel/attention_work.hpp"
#include "costmodel/exit_codes.hpp"
#include "costmodel/prediction.hpp"
#include "gui_run.hpp"
#include "planner/search.hpp"

namespace {

using namespace ctx;
using namespace ctx::gui::test;
namespace fs = std::filesystem;

// Colours the panels draw (plot.cpp's palette, panel_header.cpp's error background).
constexpr std::array<int, 3> kBlue{77, 153, 242};     // memory category 0 (weights); forward pass
constexpr std::array<int, 3> kOrange{242, 140, 51};   // Pareto frontier; measured bars
constexpr std::array<int, 3> kGreen{89, 204, 102};    // backward pass
constexpr std::array<int, 3> kCyan{64, 204, 217};     // ring p2p
constexpr std::array<int, 3> kRed{235, 80, 80};       // capacity lines
constexpr std::array<int, 3> kErrorBg{89, 20, 20};    // the error panel
constexpr std::array<int, 3> kYellow{255, 230, 90};   // the CP work chart's mean line

#define REQUIRE_HEADLESS()                                                  \
  do {                                                                      \
    const std::string why = headless_unavailable();                         \
    if (!why.empty()) GTEST_SKIP() << why;                                  \
  } while (0)

struct Reference {
  Profiles profiles = load_profiles(std::string(CTXPLAN_SOURCE_DIR) + "/profiles");
  ModelSpec model(const std::string& name = "Llama-3.1-8B") const { return resolve_model(profiles, name); }
  ClusterSpec cluster(const std::string& name = "8xh100") const { return resolve_cluster(profiles, name); }
  RuntimeProfile runtime(const std::string& name = "ctxrun-cuda") const { return resolve_runtime(profiles, name); }
  SearchRequest request(int64_t seq = 131072) const {
    SearchRequest r;
    r.model = model();
    r.cluster = cluster();
    r.runtime = runtime();
    r.seq = seq;
    r.base = parse_plan("mask=causal,packing=greedy,precision=bf16");
    return r;
  }
};

const Reference& ref() {
  static Reference r;
  return r;
}

// The run finished cleanly and drew a picture, not a blank window.
void expect_clean_picture(const GuiRun& r) {
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(r.report.is_object()) << "no state report; stderr: " << r.err;
  ASSERT_FALSE(r.image.empty()) << "no PNG";
  EXPECT_EQ(r.image.width, 1400);
  EXPECT_EQ(r.image.height, 900);
  EXPECT_GT(r.image.distinct_colors(r.image.whole()), 50) << "the screenshot is (nearly) blank";
  EXPECT_FALSE(r.report["timed_out"].get<bool>());
}

// A region the report names lies inside the picture and has something drawn in it.
void expect_region_drawn(const GuiRun& r, const std::string& name, int64_t min_colors = 8) {
  const auto reg = r.region(name);
  EXPECT_GT(reg[2] - reg[0], 100) << name << " missing or too narrow";
  EXPECT_GT(reg[3] - reg[1], 40) << name << " missing or too short";
  EXPECT_LE(reg[2], static_cast<float>(r.image.width) + 1);
  EXPECT_LE(reg[3], static_cast<float>(r.image.height) + 1);
  EXPECT_GE(r.image.distinct_colors(reg), min_colors) << name << " is blank";
}

TEST(GuiHeadless, MemoryPanelShowsTheLibrarysPrediction) {
  REQUIRE_HEADLESS();
  const std::string plan = "tp=2,cp=4,cp_kind=zigzag,zero=1,recompute=selective,opt_offload=1";
  json state = {{"inputs", {{"seq", 262144}, {"docs", {{"mode", "histogram"}, {"bins", {{2048, 0.8}, {32768, 0.2}}}}}}},
                {"plan", plan},
                {"view", {{"tab", "memory"}}},
                {"search", false}};
  GuiRun r = run_gui(fresh_dir("memory"), "memory", state);
  expect_clean_picture(r);
  Prediction p = predict(ref().model(), ref().cluster(), ref().runtime(), parse_plan(plan + ",mask=doc:hist:2048@0.8/32768@0.2"), 262144);
  EXPECT_EQ(r.report["selected_plan"], plan_to_string(p.plan));
  const json& shown = r.report["shown"]["memory"];
  EXPECT_DOUBLE_EQ(shown["peak_bytes"].get<double>(), p.memory.peak.total());
  EXPECT_DOUBLE_EQ(shown["capacity_bytes"].get<double>(), p.memory.device_capacity_bytes);
  EXPECT_DOUBLE_EQ(shown["host_total_bytes"].get<double>(), p.memory.host_total_bytes_per_node);
  EXPECT_EQ(shown["fits_device"].get<bool>(), p.memory.fits_device);
  // every bar: the peak, then each phase's own peak, by category
  ASSERT_EQ(shown["bars"].size(), static_cast<size_t>(1 + kPhases));
  for (int c = 0; c < kMemCategories; ++c) {
    const char* cat = to_string(static_cast<Mem>(c));
    EXPECT_DOUBLE_EQ(shown["bars"][0]["by_category"][cat].get<double>(), p.memory.peak.bytes[c]) << cat;
    for (int ph = 0; ph < kPhases; ++ph)
      EXPECT_DOUBLE_EQ(shown["bars"][1 + ph]["by_category"][cat].get<double>(), p.memory.phase_peak[ph].bytes[c]) << cat;
  }
  EXPECT_DOUBLE_EQ(r.report["prediction"]["time"]["step_seconds"].get<double>(), p.time.step_seconds);
  expect_region_drawn(r, "memory.bars");
  expect_region_drawn(r, "memory.host");
  EXPECT_GT(r.image.count_color(r.region("memory.bars"), kBlue), 200) << "no weights segment";
  EXPECT_GT(r.image.count_color(r.region("memory.bars"), kRed), 100) << "no capacity line";
  EXPECT_GT(r.image.count_color(r.region("memory.host"), kRed), 20) << "no host capacity line";
}

TEST(GuiHeadless, PlanTableListsEveryValidPlanRankedLikeTheSearch) {
  REQUIRE_HEADLESS();
  json state = {{"view", {{"tab", "plans"}}}};
  GuiRun r = run_gui(fresh_dir("plans"), "plans", state);
  expect_clean_picture(r);
  SearchResult s = search_plans(ref().request());
  const json& search = r.report["search"];
  EXPECT_TRUE(search["current"].get<bool>());
  EXPECT_TRUE(search["complete"].get<bool>());
  EXPECT_EQ(search["enumerated"].get<int64_t>(), s.enumerated);
  EXPECT_EQ(search["valid"].get<int64_t>(), s.valid);
  EXPECT_EQ(search["fitting"].get<int64_t>(), s.fitting);
  EXPECT_EQ(search["rows"].get<int64_t>(), s.valid) << "every valid plan is a row, fitting or not";
  ASSERT_FALSE(s.ranked.empty());
  EXPECT_EQ(search["best"], plan_to_string(s.ranked[0].plan));
  const json& shown = r.report["shown"]["plans"];
  EXPECT_EQ(shown["rows_shown"].get<int64_t>(), s.valid);
  for (size_t i = 0; i < shown["first"].size(); ++i) EXPECT_EQ(shown["first"][i], plan_to_string(s.ranked[i].plan)) << i;
  expect_region_drawn(r, "plans.table");
}

TEST(GuiHeadless, PlanTableFiltersAndSorts) {
  REQUIRE_HEADLESS();
  json state = {{"view", {{"tab", "plans"}, {"table_filter", "ulysses zero=3"}, {"fits_only", true}, {"sort_column", 6}}}};
  GuiRun r = run_gui(fresh_dir("plansfilter"), "plansfilter", state);
  expect_clean_picture(r);
  SearchResult s = search_plans(ref().request());
  int64_t matching = 0;
  double smallest = 1e300;
  for (auto& c : s.ranked) {
    const std::string t = plan_to_string(c.plan);
    if (t.find("ulysses") != std::string::npos && t.find("zero=3") != std::string::npos) {
      ++matching;
      smallest = std::min(smallest, c.peak_bytes);
    }
  }
  const json& shown = r.report["shown"]["plans"];
  EXPECT_EQ(shown["rows_shown"].get<int64_t>(), matching);
  EXPECT_EQ(shown["sort_column"], "peak GiB");
  ASSERT_FALSE(shown["first"].empty());
  // the first row shown is a matching plan with the smallest peak
  for (auto& c : s.ranked) {
    if (plan_to_string(c.plan) == shown["first"][0].get<std::string>()) {
      EXPECT_DOUBLE_EQ(c.peak_bytes, smallest);
    }
  }
}

TEST(GuiHeadless, ParetoPlotDrawsTheSearchsFrontier) {
  REQUIRE_HEADLESS();
  GuiRun r = run_gui(fresh_dir("pareto"), "pareto", json{{"view", {{"tab", "pareto"}}}});
  expect_clean_picture(r);
  SearchResult s = search_plans(ref().request());
  const json& shown = r.report["shown"]["pareto"];
  EXPECT_EQ(shown["points"].get<int64_t>(), s.fitting);
  EXPECT_EQ(shown["frontier"].get<int64_t>(), static_cast<int64_t>(s.pareto.size()));
  EXPECT_DOUBLE_EQ(shown["capacity_bytes"].get<double>(), static_cast<double>(ref().cluster().gpu.usable_bytes));
  expect_region_drawn(r, "pareto.plot");
  EXPECT_GT(r.image.count_color(r.region("pareto.plot"), kOrange), 100) << "no frontier";
  EXPECT_GT(r.image.count_color(r.region("pareto.plot"), kRed), 100) << "no capacity line";
}

TEST(GuiHeadless, TimelineDrawsEverySimulatedRankAndStream) {
  REQUIRE_HEADLESS();
  const std::string plan = "cp=8,cp_kind=ring,zero=3,recompute=selective,tiled_loss=2048";
  GuiRun r = run_gui(fresh_dir("timeline"), "timeline", json{{"view", {{"tab", "timeline"}}}, {"plan", plan}, {"search", false}});
  expect_clean_picture(r);
  SimResult sim;
  predict(ref().model(), ref().cluster(), ref().runtime(), parse_plan(plan), 131072, &sim);
  std::set<std::pair<int, int>> rows;
  for (auto& t : sim.tasks) rows.insert({t.rep, static_cast<int>(t.stream)});
  const json& shown = r.report["shown"]["timeline"];
  EXPECT_EQ(shown["rows"].get<size_t>(), rows.size());
  EXPECT_EQ(shown["tasks"].get<size_t>(), sim.tasks.size());
  EXPECT_DOUBLE_EQ(shown["step_seconds"].get<double>(), sim.time.step_seconds);
  EXPECT_DOUBLE_EQ(shown["t1"].get<double>(), sim.time.step_seconds) << "starts zoomed out to the whole step";
  expect_region_drawn(r, "timeline.plot");
  const auto reg = r.region("timeline.plot");
  EXPECT_GT(r.image.count_color(reg, kBlue), 500) << "no forward compute";
  EXPECT_GT(r.image.count_color(reg, kGreen), 500) << "no backward compute";
  EXPECT_GT(r.image.count_color(reg, kCyan), 100) << "no ring transfers";
}

// A step too large to record (issue 15's 128-rank plain ring: 9.4M tasks) draws the same plan over
// fewer layers: every rank's rows, its forward and backward computes and ring transfers; the header
// keeps the whole step's time.
TEST(GuiHeadless, TimelineOfAHugeStepDrawsTheSamePlanOverFewerLayers) {
  REQUIRE_HEADLESS();
  const std::string plan = "tp=8,cp=128,cp_kind=ring,zero=3,recompute=full";
  GuiRun r = run_gui(fresh_dir("timeline_huge"), "timeline_huge",
                     json{{"inputs", {{"model", "Llama-3.1-70B"}, {"cluster", "h100-superpod-1024"}, {"seq", 1048576}}},
                          {"view", {{"tab", "timeline"}}}, {"plan", plan}, {"search", false}});
  expect_clean_picture(r);
  const json& shown = r.report["shown"]["timeline"];
  // (the numbers of layers and tasks are the app's: test_gui_logic checks them against its limits)
  EXPECT_GE(shown["layers"].get<int64_t>(), 1);
  EXPECT_LT(shown["layers"].get<int64_t>(), 80) << "Llama-3.1-70B has 80 layers";
  EXPECT_GT(shown["tasks"].get<int64_t>(), 0);
  EXPECT_LT(shown["tasks"].get<int64_t>() * 10, shown["step_tasks"].get<int64_t>());
  EXPECT_GE(shown["rows"].get<size_t>(), 128u) << "a row per simulated rank and stream";
  // (512 rows run past the window, which scrolls: the part in the picture is checked)
  auto reg = r.region("timeline.plot");
  reg[3] = std::min(reg[3], static_cast<float>(r.image.height));
  EXPECT_GT(reg[3] - reg[1], 300) << "the plot starts near the window's top";
  EXPECT_GT(r.image.count_color(reg, kBlue), 500) << "no forward compute";
  EXPECT_GT(r.image.count_color(reg, kGreen), 500) << "no backward compute";
  EXPECT_GT(r.image.count_color(reg, kCyan), 100) << "no ring transfers";
}

// The CP work tab: one bar per CP rank with the cost model's pairs (attention_pairs_per_rank), for
// a causal contiguous ring (rising bars) and a document histogram (the expectation over its packs),
// the mean line and the imbalance max/mean - 1.
TEST(GuiHeadless, CpWorkTabDrawsTheCostModelsPairsPerRank) {
  REQUIRE_HEADLESS();
  struct Case {
    std::string name, plan, mask;
    json docs;
  };
  const Case cases[] = {{"cpwork_ring", "cp=8,cp_kind=ring,zero=3,recompute=full", "causal", {{"mode", "causal"}}},
                        {"cpwork_hist", "cp=8,cp_comm=allgather,cp_layout=headtail-doc,zero=3,recompute=full",
                         "doc:hist:2048@0.8/32768@0.2", {{"mode", "histogram"}, {"bins", {{2048, 0.8}, {32768, 0.2}}}}}};
  for (const Case& c : cases) {
    json state = {{"inputs", {{"seq", 131072}, {"docs", c.docs}}}, {"plan", c.plan}, {"view", {{"tab", "cpwork"}}}, {"search", false}};
    GuiRun r = run_gui(fresh_dir(c.name), c.name, state);
    expect_clean_picture(r);
    Plan p = parse_plan(c.plan + ",mask=" + c.mask);
    p.dp = 1;
    const std::vector<double> pairs = attention_pairs_per_rank(p, 131072);
    const json& shown = r.report["shown"]["cpwork"];
    ASSERT_EQ(shown["pairs"].size(), pairs.size()) << c.name;
    double sum = 0, max = 0;
    for (size_t i = 0; i < pairs.size(); ++i) {
      EXPECT_DOUBLE_EQ(shown["pairs"][i].get<double>(), pairs[i]) << c.name << " rank " << i;
      sum += pairs[i], max = std::max(max, pairs[i]);
    }
    const double mean = sum / static_cast<double>(pairs.size());
    EXPECT_NEAR(shown["mean"].get<double>(), mean, 1e-12 * mean);
    EXPECT_NEAR(shown["imbalance"].get<double>(), max / mean - 1, 1e-12);
    expect_region_drawn(r, "cpwork.bars");
    EXPECT_GT(r.image.count_color(r.region("cpwork.bars"), kBlue), 2000) << c.name << ": no bars";
    EXPECT_GT(r.image.count_color(r.region("cpwork.bars"), kYellow), 100) << c.name << ": no mean line";
  }
}

// A CP combination the cost model refuses (cp_varlen without a document mask) shows the parser's
// reason next to the CP controls and in the error panel; the app keeps running and exits 0.
TEST(GuiHeadless, AnInvalidCpCombinationShowsTheReasonAndExitsCleanly) {
  REQUIRE_HEADLESS();
  json state = {{"plan", "cp=8,cp_kind=zigzag,cp_varlen=cycle"}, {"view", {{"tab", "cpwork"}}}, {"search", false}};
  GuiRun r = run_gui(fresh_dir("cpinvalid"), "cpinvalid", state);
  expect_clean_picture(r);
  const json& controls = r.report["shown"]["cp_controls"];
  EXPECT_FALSE(controls["valid"].get<bool>());
  EXPECT_NE(controls["reason"].get<std::string>().find("needs a document mask"), std::string::npos) << controls;
  // the typed text does not parse: the controls show the last valid plan's axes and say so
  EXPECT_TRUE(controls["of_last_valid_plan"].get<bool>());
  EXPECT_EQ(controls["cp_varlen"], "native");
  ASSERT_EQ(r.report["errors"].size(), 1u);
  EXPECT_EQ(r.report["errors"][0]["field"], "cp_varlen");
  EXPECT_TRUE(r.report["error_panel_open"].get<bool>());
  EXPECT_GT(r.image.count_color(r.region("errors"), kErrorBg), 500) << "no error panel";
}

TEST(GuiHeadless, MaxSeqCurveMatchesTheLibraryPerGpuCount) {
  REQUIRE_HEADLESS();
  json state = {{"view", {{"tab", "maxseq"}, {"maxseq_max_gpus", 16}}}, {"search", false}};
  GuiRun r = run_gui(fresh_dir("maxseq"), "maxseq", state);
  expect_clean_picture(r);
  const int64_t hi = r.report["maxseq"]["hi_tokens"].get<int64_t>();
  EXPECT_GE(hi, int64_t(16) << 20) << "the curve's ceiling is below the slider's top (16M)";
  const json& pts = r.report["maxseq"]["points"];
  ASSERT_EQ(pts.size(), 5u);  // 1, 2, 4, 8, 16 GPUs
  for (size_t i = 0; i < pts.size(); ++i) {
    const int64_t g = int64_t(1) << i;
    EXPECT_EQ(pts[i]["gpus"].get<int64_t>(), g);
    SearchRequest req = ref().request();
    req.cluster = resized_cluster(req.cluster, g);
    Plan best;
    EXPECT_EQ(pts[i]["any_tokens"].get<int64_t>(), max_trainable_seq_any(req, hi, &best)) << g << " GPUs";
    // the default plan's family: every GPU on zig-zag CP, ZeRO-3 (none on one GPU), full recompute
    const std::string family = g == 1 ? "cp=1,recompute=full,tiled_loss=2048"
                                      : "cp=" + std::to_string(g) + ",cp_kind=zigzag,zero=3,recompute=full,tiled_loss=2048";
    EXPECT_EQ(pts[i]["family_tokens"].get<int64_t>(), max_trainable_seq(req.model, req.cluster, req.runtime, parse_plan(family), hi))
        << g << " GPUs";
  }
  expect_region_drawn(r, "maxseq.plot");
  EXPECT_GT(r.image.count_color(r.region("maxseq.plot"), kBlue), 50);
  EXPECT_GT(r.image.count_color(r.region("maxseq.plot"), kOrange), 50);
}

TEST(GuiHeadless, MeasuredReportIsComparedFieldByField) {
  REQUIRE_HEADLESS();
  const std::string dir = fresh_dir("measured");
  // a "measurement": the library's prediction with known deviations and a loss curve
  Prediction p = predict(ref().model(), ref().cluster(), ref().runtime(), parse_plan("cp=8,cp_kind=zigzag,zero=3,recompute=full,tiled_loss=2048"), 131072);
  json m = prediction_to_json(p);
  m["schema"] = "ctxrun.report/1";
  m["memory"]["by_category"]["activations"] = m["memory"]["by_category"]["activations"].get<double>() * 1.25;
  m["time"]["step_seconds"] = m["time"]["step_seconds"].get<double>() * 0.8;
  m["losses"] = {11.2, 10.1, 9.5, 9.1, 8.8};
  std::ofstream(fs::path(dir) / "report.json") << m.dump();
  GuiRun r = run_gui(dir, "measured", json{{"view", {{"tab", "measured"}}}, {"measured", "report.json"}, {"search", false}});
  expect_clean_picture(r);
  ASSERT_TRUE(r.report.contains("measured"));
  EXPECT_EQ(r.report["measured"]["losses"].get<int>(), 5);
  int checked = 0;
  for (auto& row : r.report["measured"]["rows"]) {
    const std::string f = row["field"];
    const double e = row["relative_error"];
    if (f == "memory.by_category.activations") {
      EXPECT_NEAR(e, 0.25, 1e-12);
      ++checked;
    } else if (f == "time.step_seconds") {
      EXPECT_NEAR(e, -0.2, 1e-12);
      ++checked;
    } else if (f == "memory.by_category.weights" || f == "memory.peak_bytes") {
      EXPECT_EQ(e, 0.0) << f;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4);
  EXPECT_TRUE(r.report["shown"]["measured"]["mismatches"].empty());
  expect_region_drawn(r, "measured.plot");
  expect_region_drawn(r, "measured.losses");
  EXPECT_GT(r.image.count_color(r.region("measured.plot"), kBlue), 200) << "no predicted bars";
  EXPECT_GT(r.image.count_color(r.region("measured.plot"), kOrange), 200) << "no measured bars";
}

TEST(GuiHeadless, MalformedConfigJsonOpensTheErrorPanelAndKeepsThePreviousJob) {
  REQUIRE_HEADLESS();
  const std::string dir = fresh_dir("badconfig");
  std::ofstream(fs::path(dir) / "config.json") << "{\"hidden_size\": 4096, \"num_attention_heads\": 32,, }";
  GuiRun r = run_gui(dir, "badconfig", json{{"inputs", {{"model", "config.json"}}}, {"search", false}});
  expect_clean_picture(r);  // exit code 0: a broken input is not a crash
  ASSERT_EQ(r.report["errors"].size(), 1u);
  const json& e = r.report["errors"][0];
  EXPECT_EQ(e["source"], "inputs");
  EXPECT_NE(e["where"].get<std::string>().find("config.json"), std::string::npos) << e.dump();
  EXPECT_NE(e["message"].get<std::string>().find("malformed JSON"), std::string::npos) << e.dump();
  EXPECT_TRUE(r.report["error_panel_open"].get<bool>());
  EXPECT_TRUE(r.report["using_previous_inputs"].get<bool>());
  // still showing the built-in default job's prediction
  EXPECT_EQ(r.report["job"]["model"], "Llama-3.1-8B");
  Prediction p = predict(ref().model(), ref().cluster(), ref().runtime(), parse_plan("cp=8,cp_kind=zigzag,zero=3,recompute=full,tiled_loss=2048"), 131072);
  EXPECT_DOUBLE_EQ(r.report["prediction"]["memory"]["peak_bytes"].get<double>(), p.memory.peak.total());
  expect_region_drawn(r, "errors", 3);  // background, text, button
  EXPECT_GT(r.image.count_color(r.region("errors"), kErrorBg), 2000) << "no error panel";
}

TEST(GuiHeadless, ConfigJsonWithABadFieldNamesTheField) {
  REQUIRE_HEADLESS();
  const std::string dir = fresh_dir("badfield");
  std::ofstream(fs::path(dir) / "config.json")
      << R"({"num_hidden_layers": 32, "hidden_size": "wide", "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "vocab_size": 128256})";
  GuiRun r = run_gui(dir, "badfield", json{{"inputs", {{"model", "config.json"}}}, {"search", false}});
  expect_clean_picture(r);
  ASSERT_EQ(r.report["errors"].size(), 1u);
  const json& e = r.report["errors"][0];
  EXPECT_NE(e["where"].get<std::string>().find("config.json"), std::string::npos) << e.dump();
  EXPECT_NE(e["message"].get<std::string>().find("hidden_size"), std::string::npos) << e.dump();
  EXPECT_EQ(r.report["job"]["model"], "Llama-3.1-8B");
}

TEST(GuiHeadless, BrokenProfileOpensTheErrorPanelNamingFileAndField) {
  REQUIRE_HEADLESS();
  const std::string dir = fresh_dir("badprofile");
  const fs::path profiles = fs::path(dir) / "profiles";
  fs::copy(fs::path(CTXPLAN_SOURCE_DIR) / "profiles", profiles, fs::copy_options::recursive);
  const fs::path runtime = profiles / "runtimes" / "ctxrun-cuda.json";
  json rt = json::parse(std::ifstream(runtime));
  rt["constants"]["weight_bytes"]["value"] = "two";
  std::ofstream(runtime) << rt.dump(2);
  GuiRun r = run_gui(dir, "badprofile", json{{"search", false}}, {"--profiles", profiles.string()});
  expect_clean_picture(r);
  bool named = false;
  for (auto& e : r.report["errors"])
    if (e["source"] == "profiles") {
      named = true;
      EXPECT_NE(e["where"].get<std::string>().find("ctxrun-cuda.json"), std::string::npos) << e.dump();
      EXPECT_NE(e["field"].get<std::string>().find("weight_bytes"), std::string::npos) << e.dump();
    }
  EXPECT_TRUE(named) << r.report["errors"].dump();
  EXPECT_TRUE(r.report["error_panel_open"].get<bool>());
  expect_region_drawn(r, "errors", 3);
  EXPECT_GT(r.image.count_color(r.region("errors"), kErrorBg), 2000) << "no error panel";
}

TEST(GuiHeadless, BadStateFileExitsTwoNamingTheField) {
  REQUIRE_HEADLESS();
  GuiRun r = run_gui(fresh_dir("badstate"), "badstate", json{{"view", {{"tab", "gantt"}}}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("view.tab"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("badstate.state.json"), std::string::npos) << r.err;
  EXPECT_TRUE(r.image.empty());
}

TEST(GuiHeadless, SettingsPersistBetweenRunsOutsideTheWorkingDirectory) {
  REQUIRE_HEADLESS();
  const std::string dir = fresh_dir("settings");
  const std::string settings = (fs::path(dir) / "config" / "ctxplan" / "gui.json").string();
  GuiRun first = run_gui(dir, "first", json{{"inputs", {{"seq", 262144}, {"cluster", "2x8xh100"}}}, {"view", {{"tab", "pareto"}}}, {"search", false}},
                         {"--settings", settings});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_TRUE(fs::exists(settings));
  EXPECT_TRUE(fs::exists(fs::path(settings).parent_path() / "imgui.ini"));
  EXPECT_FALSE(fs::exists(fs::path(dir) / "imgui.ini")) << "imgui.ini written to the working directory";
  GuiRun second = run_gui(dir, "second", json(nullptr), {"--settings", settings});
  expect_clean_picture(second);
  EXPECT_EQ(second.report["state"]["inputs"]["seq"].get<int64_t>(), 262144);
  EXPECT_EQ(second.report["state"]["inputs"]["cluster"], "2x8xh100");
  EXPECT_EQ(second.report["state"]["view"]["tab"], "pareto");
  EXPECT_EQ(second.report["job"]["world"].get<int64_t>(), 16);
}

// The exported plan.json and the copied command line give the CLI the same prediction, also
// for a hand-edited cluster (exported as its own cluster file).
TEST(GuiHeadless, ExportedPlanAndCommandLineReproduceThePrediction) {
  REQUIRE_HEADLESS();
  const std::string dir = fresh_dir("export");
  json state = {{"inputs",
                 {{"seq", 524288},
                  {"cluster_edit", {{"enabled", true}, {"nodes", 2}, {"gpus_per_node", 8}, {"gpu", "H100-SXM-80GB"}, {"inter_gbps", 25}}}}},
                {"plan", "tp=2,cp=8,cp_kind=zigzag,zero=3,recompute=full,tiled_loss=4096"},
                {"export_plan", "plan.json"},
                {"search", false}};
  GuiRun r = run_gui(dir, "export", state);
  expect_clean_picture(r);
  EXPECT_TRUE(r.report["errors"].empty()) << r.report["errors"].dump();
  ASSERT_TRUE(fs::exists(fs::path(dir) / "plan.json"));
  ASSERT_TRUE(fs::exists(fs::path(dir) / "plan.cluster.json"));
  json plan = json::parse(std::ifstream(fs::path(dir) / "plan.json"));
  EXPECT_EQ(plan["schema"], "ctxplan.plan/1");
  EXPECT_EQ(plan["seq"].get<int64_t>(), 524288);
  const json& gui = r.report["prediction"];
  EXPECT_EQ(gui["world"].get<int64_t>(), 16);

  std::string out;
  const std::string profiles = std::string("--profiles=") + CTXPLAN_SOURCE_DIR + "/profiles";
  ASSERT_EQ(run_program({CTXPLAN_BIN, profiles, "predict", "--plan-file", "plan.json", "--json"}, &out, dir), 0) << out;
  json cli = json::parse(out);
  EXPECT_DOUBLE_EQ(cli["memory"]["peak_bytes"].get<double>(), gui["memory"]["peak_bytes"].get<double>());
  EXPECT_DOUBLE_EQ(cli["time"]["step_seconds"].get<double>(), gui["time"]["step_seconds"].get<double>());
  EXPECT_EQ(cli["plan_string"], gui["plan_string"]);

  // the command line, as copied (it names plan.cluster.json, which the export wrote)
  std::string cmd = r.report["shown"]["header"]["command_line"];
  ASSERT_EQ(cmd.rfind("ctxplan predict ", 0), 0u) << cmd;
  cmd = std::string(CTXPLAN_BIN) + " " + profiles + " predict" + cmd.substr(std::string("ctxplan predict").size()) + " --json";
  ASSERT_EQ(run_program({"sh", "-c", cmd}, &out, dir), 0) << cmd << "\n" << out;
  json cli2 = json::parse(out);
  EXPECT_DOUBLE_EQ(cli2["memory"]["peak_bytes"].get<double>(), gui["memory"]["peak_bytes"].get<double>());
  EXPECT_DOUBLE_EQ(cli2["time"]["step_seconds"].get<double>(), gui["time"]["step_seconds"].get<double>());
}

// The attention picker (issue 16): the chosen kernel, its curve's source and the prediction are
// what `ctxplan predict --attention X` gives; the command line the GUI copies carries the choice.
TEST(GuiHeadless, AttentionPickerPricesAsCtxplanPredictAttention) {
  REQUIRE_HEADLESS();
  const std::string dir = fresh_dir("attention");
  const std::string plan = "cp=8,cp_kind=ulysses,zero=3,recompute=full";
  GuiRun r = run_gui(dir, "attention",
                     json{{"inputs", {{"runtime", "hf-deepspeed"}, {"attention", "fa3"}}}, {"plan", plan}, {"search", false}});
  expect_clean_picture(r);
  EXPECT_TRUE(r.report["errors"].empty()) << r.report["errors"].dump();
  const json& shown = r.report["shown"]["attention"];
  EXPECT_EQ(shown["in_force"], "fa3");
  EXPECT_EQ(shown["label"], "fa3");
  const RuntimeProfile rt = ref().runtime("hf-deepspeed");
  for (auto& k : ref().cluster().gpu.kernels.attention)
    if (k.name == "fa3") {
      EXPECT_EQ(shown["source"], k.source);
    }
  std::string out;
  const std::string profiles = std::string("--profiles=") + CTXPLAN_SOURCE_DIR + "/profiles";
  ASSERT_EQ(run_program({CTXPLAN_BIN, profiles, "predict", "--runtime", "hf-deepspeed", "--attention", "fa3", "--plan", plan, "--json"}, &out, dir), 0)
      << out;
  const json cli = json::parse(out);
  const json& gui = r.report["prediction"];
  EXPECT_EQ(gui["attention"], "fa3");
  EXPECT_EQ(cli["attention"], "fa3");
  EXPECT_DOUBLE_EQ(cli["time"]["step_seconds"].get<double>(), gui["time"]["step_seconds"].get<double>());
  EXPECT_DOUBLE_EQ(cli["memory"]["peak_bytes"].get<double>(), gui["memory"]["peak_bytes"].get<double>());
  // without --attention the CLI prices hf-deepspeed's default (fa2), a different step
  ASSERT_EQ(run_program({CTXPLAN_BIN, profiles, "predict", "--runtime", "hf-deepspeed", "--plan", plan, "--json"}, &out, dir), 0) << out;
  EXPECT_NE(json::parse(out)["time"]["step_seconds"].get<double>(), gui["time"]["step_seconds"].get<double>());
  // the copied command line reproduces the prediction
  std::string cmd = r.report["shown"]["header"]["command_line"];
  ASSERT_NE(cmd.find(" --attention fa3 "), std::string::npos) << cmd;
  cmd = std::string(CTXPLAN_BIN) + " " + profiles + " predict" + cmd.substr(std::string("ctxplan predict").size()) + " --json";
  ASSERT_EQ(run_program({"sh", "-c", cmd}, &out, dir), 0) << cmd << "\n" << out;
  EXPECT_DOUBLE_EQ(json::parse(out)["time"]["step_seconds"].get<double>(), gui["time"]["step_seconds"].get<double>());
}

// A kernel without a curve on the GPU (FA3 on an A100): the cost model's words beside the picker and
// in the error panel, exit 0, as `ctxplan predict --attention fa3` refuses it (exit 2).
TEST(GuiHeadless, AttentionWithoutACurveShowsTheCostModelsReason) {
  REQUIRE_HEADLESS();
  const std::string dir = fresh_dir("attention-a100");
  GuiRun r = run_gui(dir, "attention-a100",
                     json{{"inputs", {{"runtime", "hf-deepspeed"}, {"cluster", "8xa100"}, {"attention", "fa3"}}}, {"search", false}});
  expect_clean_picture(r);
  const std::string error = r.report["shown"]["attention"]["error"];
  const std::string says = "'fa3' has no throughput curve in hardware profile A100";
  EXPECT_NE(error.find(says), std::string::npos) << error;
  ASSERT_EQ(r.report["errors"].size(), 1u);
  EXPECT_EQ(r.report["errors"][0]["field"], "attention");
  EXPECT_GT(r.image.count_color(r.region("errors"), kErrorBg), 500) << "no error panel";
  std::string out;
  const std::string profiles = std::string("--profiles=") + CTXPLAN_SOURCE_DIR + "/profiles";
  EXPECT_EQ(run_program({"sh", "-c", std::string(CTXPLAN_BIN) + " " + profiles +
                                         " predict --runtime hf-deepspeed --cluster 8xa100 --attention fa3 --plan cp=8,cp_kind=ulysses,zero=3 2>&1"},
                        &out, dir),
            kExitBadInput);
  // the same words after where each names the input (--attention; the GUI's inputs.attention)
  EXPECT_EQ(error.substr(error.find(says)), out.substr(out.find(says), error.size() - error.find(says))) << out;
}

// Issue 21 follow-up: the plans the search left out because their layout does not divide the
// sequence, counted as the search counts them, with the nearest edit.
TEST(GuiHeadless, PlansTabShowsTheSearchsNotDividingCount) {
  REQUIRE_HEADLESS();
  json state = {{"inputs", {{"seq", 131000}, {"constraints", {{"cp_kinds", {"ring", "zigzag"}}, {"cp", "8"}}}}}, {"view", {{"tab", "plans"}}}};
  GuiRun r = run_gui(fresh_dir("notdividing"), "notdividing", state);
  expect_clean_picture(r);
  SearchRequest req = ref().request(131000);
  req.cp_kinds = {CpKind::ring, CpKind::zigzag};
  req.cp_values = {8};
  const SearchResult s = search_plans(req);
  ASSERT_GT(s.not_dividing, 0);
  EXPECT_EQ(r.report["search"]["not_dividing"].get<int64_t>(), s.not_dividing);
  EXPECT_EQ(r.report["search"]["valid"].get<int64_t>(), s.valid);
  const json& notes = r.report["shown"]["search_notes"];
  ASSERT_EQ(notes.size(), 1u) << notes;
  EXPECT_EQ(notes[0].get<std::string>().rfind(std::to_string(s.not_dividing) + " plans left out: their layout does not divide the 131000-token sequence", 0), 0u)
      << notes[0];
  EXPECT_NE(notes[0].get<std::string>().find("pad=1"), std::string::npos);
  expect_region_drawn(r, "plans.table");
}

}  // namespace

// ---- hostile settings and sizes (issue 17) -------------------------------------------------------

// Before: one wrong value in the settings file, and the GUI wrote the defaults over it at exit.
TEST(GuiHeadless, UnreadableSettingsAreMovedAsideNeverOverwritten) {
  REQUIRE_HEADLESS();
  const std::string dir = fresh_dir("badsettings");
  const std::string settings = (fs::path(dir) / "gui.json").string();
  const std::string original = R"({"schema": "ctxplan.gui-state/1", "view": {"tab": "gantt"}, "inputs": {"seq": 1e400}})";
  std::ofstream(settings) << original;
  GuiRun r = run_gui(dir, "badsettings", json{{"search", false}}, {"--settings", settings});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find(settings + ".unreadable"), std::string::npos) << r.err;
  std::ifstream kept(settings + ".unreadable");
  std::stringstream ss;
  ss << kept.rdbuf();
  EXPECT_EQ(ss.str(), original) << "the unreadable settings were not kept byte for byte";
}

// Before: a timeline range a few ULPs wide looped in the axis-tick builder until memory ran out.
TEST(GuiHeadless, TimelineRangeNarrowerThanItsResolutionStillDraws) {
  REQUIRE_HEADLESS();
  const double t0 = 0.001, t1 = std::nextafter(std::nextafter(std::nextafter(t0, 1.0), 1.0), 1.0);
  GuiRun r = run_gui(fresh_dir("tinyrange"), "tinyrange",
                     json{{"view", {{"tab", "timeline"}, {"timeline_t0", t0}, {"timeline_t1", t1}}}, {"search", false}},
                     {"--timeout", "60"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.image.empty());
}

// Before: a huge window size from --size or the settings broke the X server connection.
// The headless --timeout ends the process while a worker is still searching (the search does not
// poll for cancellation inside a simulation): the report says timed_out and the run takes less
// than the search alone does, measured in the same test.
TEST(GuiHeadless, TimeoutEndsTheProcessWhileAWorkerRuns) {
  REQUIRE_HEADLESS();
  const json state = {{"inputs", {{"model", "Llama-3.1-70B"}, {"cluster", "4096x8xh100"}, {"seq", 1048576}}}, {"search", true}};
  SearchRequest req;
  req.model = ref().model("Llama-3.1-70B");
  req.cluster = ref().cluster("4096x8xh100");
  req.runtime = ref().runtime();
  req.seq = 1048576;
  auto t0 = std::chrono::steady_clock::now();
  search_plans(req);
  const double search_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t0 = std::chrono::steady_clock::now();
  GuiRun r = run_gui(fresh_dir("timeout"), "timeout", state, {"--timeout", "0.5"});
  const double gui_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, kExitInternal) << r.err;
  EXPECT_NE(r.err.find("timed out"), std::string::npos) << r.err;
  ASSERT_FALSE(r.report.is_null()) << "the report is written before the process ends";
  EXPECT_TRUE(r.report["timed_out"].get<bool>());
  EXPECT_LT(gui_s, search_s) << "the GUI waited for the search (" << search_s << " s alone) instead of ending at its timeout";
}

TEST(GuiHeadless, HugeWindowSizeIsRefusedWithTheValidRange) {
  REQUIRE_HEADLESS();
  // --size is checked before any window opens (run_gui passes a size of its own)
  const std::string dir = fresh_dir("hugesize");
  std::string out;
  const int code = run_program({CTXPLAN_GUI_BIN, "--no-settings", "--profiles", std::string(CTXPLAN_SOURCE_DIR) + "/profiles",
                                "--screenshot", (fs::path(dir) / "x.png").string(), "--size", "100000x100000"},
                               &out, dir);
  EXPECT_EQ(code, 2) << out;
  EXPECT_FALSE(fs::exists(fs::path(dir) / "x.png"));
  GuiRun state = run_gui(fresh_dir("hugestate"), "hugestate", json{{"view", {{"window", {100000, 100000}}}}});
  EXPECT_EQ(state.exit_code, 2) << state.err;
  EXPECT_NE(state.err.find("view.window"), std::string::npos) << state.err;
  EXPECT_NE(state.err.find("200..16384"), std::string::npos) << state.err;
}
