// The explorer's attention picker (issue 16) and the search's notes (issue 21 follow-up), without a
// window. The reference is the CLI's own path: the same arguments parsed by add_job_options and
// resolved by resolve_job (planner/job_args.cpp), then predict(), exactly what `ctxplan predict
// --attention X` runs. Proved here:
//   - a kernel chosen in the GUI gives the CLI's step time, peak memory and kernel name, for kernels
//     whose step times differ (so the comparison can fail);
//   - the runtime's default is the CLI without --attention (including ctxrun-cuda's "ctxrun_mma|fa2",
//     priced at the first with a curve);
//   - a kernel the job cannot price (no curve on the GPU, not run by the runtime, no variable-length
//     entry for packed documents) shows the cost model's own error and keeps the previous job;
//   - the state file, plan.json export and command line carry the choice the way plan files do;
//   - the plan table's "left out" count is the search's not_dividing count (131000 tokens: zig-zag
//     cp=8 needs a multiple of 16), pad=1 among the fixed keys takes them in, and the lower-precision
//     note appears exactly when the search says so.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <memory>

#include "app_settle.hpp"
#include "costmodel/attention_kernels.hpp"
#include "gui/app.hpp"
#include "gui/gui_state.hpp"
#include "gui/plan_rows.hpp"
#include "gui/resolve_inputs.hpp"
#include "planner/job_args.hpp"

namespace {

using namespace ctx;
using namespace ctx::gui;
using ctx::gui::test::settle;
namespace fs = std::filesystem;

const std::string kProfiles = std::string(CTXPLAN_SOURCE_DIR) + "/profiles";

// What `ctxplan predict <args>` predicts: the CLI's option parsing and job resolution, then predict().
Prediction cli_predict(std::vector<std::string> args) {
  CLI::App cli;
  JobArgs a;
  add_job_options(cli, a, true);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
  cli.parse(reversed);
  CommonOptions common;
  common.profiles = kProfiles;
  const Job job = resolve_job(a, common);
  return predict(job.model, job.cluster, job.runtime, job.plan, job.seq);
}

// An App (no search) on these inputs with this plan selected, settled.
std::unique_ptr<App> settled_app(const Inputs& in, const std::string& plan) {
  auto app = std::make_unique<App>(kProfiles);
  app->state.inputs = in;
  app->state.plan = plan;
  app->state.run_search = false;
  app->inputs_changed(0);
  settle(*app, 0);
  return app;
}

Inputs inputs(const std::string& runtime, const std::string& attention, const std::string& cluster = "8xh100") {
  Inputs in = default_state().inputs;
  in.runtime = runtime;
  in.attention = attention;
  in.cluster = cluster;
  return in;
}

// A plan hf-deepspeed runs (Ulysses, ZeRO-3; no ring, no TP), and one Megatron runs (head-tail
// layouts only): the CLI refuses a plan the runtime's stack cannot run.
constexpr const char* kPlan = "cp=8,cp_kind=ulysses,zero=3,recompute=full";
constexpr const char* kMegatronPlan = "cp=8,cp_kind=zigzag,zero=1,recompute=full";
const char* plan_for(const std::string& runtime) { return runtime == "megatron" ? kMegatronPlan : kPlan; }

TEST(AttentionPicker, AChosenKernelPricesAsTheCliDoes) {
  std::map<std::string, double> step_s;
  for (const char* kernel : {"fa2", "fa3", "sdpa", "flex"}) {
    SCOPED_TRACE(kernel);
    auto app = settled_app(inputs("hf-deepspeed", kernel), kPlan);
    ASSERT_TRUE(app->errors.empty()) << app->errors.begin()->second.message;
    ASSERT_TRUE(app->have_prediction && !app->time_pending);
    const Prediction cli = cli_predict({"--runtime", "hf-deepspeed", "--attention", kernel, "--plan", kPlan});
    EXPECT_EQ(plan_to_string(app->prediction.plan), plan_to_string(cli.plan));
    EXPECT_EQ(cli.attention, kernel);
    EXPECT_EQ(app->prediction.attention, kernel);
    EXPECT_EQ(app->job->attention.name, kernel);
    EXPECT_DOUBLE_EQ(app->prediction.time.step_seconds, cli.time.step_seconds);
    EXPECT_DOUBLE_EQ(app->prediction.time.tokens_per_second, cli.time.tokens_per_second);
    EXPECT_DOUBLE_EQ(app->prediction.memory.peak.total(), cli.memory.peak.total());
    step_s[kernel] = app->prediction.time.step_seconds;
  }
  // the kernels are priced differently, so equal numbers above mean the choice reached the cost model
  EXPECT_NE(step_s["fa2"], step_s["fa3"]);
  EXPECT_NE(step_s["fa2"], step_s["sdpa"]);
  EXPECT_NE(step_s["fa3"], step_s["flex"]);
}

TEST(AttentionPicker, TheRuntimeDefaultIsTheCliWithoutAttention) {
  for (const char* runtime : {"hf-deepspeed", "megatron", "ctxrun-cuda"}) {
    SCOPED_TRACE(runtime);
    auto app = settled_app(inputs(runtime, ""), plan_for(runtime));
    ASSERT_TRUE(app->errors.empty()) << app->errors.begin()->second.message;
    const Prediction cli = cli_predict({"--runtime", runtime, "--plan", plan_for(runtime)});
    EXPECT_EQ(app->prediction.attention, cli.attention);
    EXPECT_EQ(app->job->attention_default_here, cli.attention);
    EXPECT_DOUBLE_EQ(app->prediction.time.step_seconds, cli.time.step_seconds);
    EXPECT_DOUBLE_EQ(app->prediction.memory.peak.total(), cli.memory.peak.total());
    // the profile's own statement of its default
    EXPECT_EQ(app->job->attention_default, resolve_runtime(load_profiles(kProfiles), runtime).attention_kernel);
  }
  // megatron's default (cudnn) is not fa2, which it also runs: the default is a choice, not a constant
  auto def = settled_app(inputs("megatron", ""), kMegatronPlan);
  auto fa2 = settled_app(inputs("megatron", "fa2"), kMegatronPlan);
  EXPECT_DOUBLE_EQ(fa2->prediction.time.step_seconds,
                   cli_predict({"--runtime", "megatron", "--attention", "fa2", "--plan", kMegatronPlan}).time.step_seconds);
  EXPECT_EQ(def->prediction.attention, "cudnn");
  EXPECT_NE(def->prediction.time.step_seconds, fa2->prediction.time.step_seconds);
  // ctxrun-cuda's default "ctxrun_mma|fa2" prices fa2 on an H100 (no ctxrun_mma curve there)
  auto ctxrun = settled_app(inputs("ctxrun-cuda", ""), kPlan);
  EXPECT_EQ(ctxrun->job->attention_default, "ctxrun_mma|fa2");
  EXPECT_EQ(ctxrun->prediction.attention, "fa2");
}

// The cost model's error for this runtime, cluster and kernel (the text the picker must show).
std::string cost_model_error(const std::string& runtime, const std::string& cluster, const std::string& kernel) {
  const Profiles p = load_profiles(kProfiles);
  try {
    const RuntimeProfile rt = with_attention(resolve_runtime(p, runtime), kernel, kInputsWhere, "attention");
    find_attention_kernel(resolve_cluster(p, cluster), rt);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(AttentionPicker, AKernelTheJobCannotPriceShowsTheCostModelsErrorAndKeepsTheJob) {
  struct Case {
    const char* runtime;
    const char* cluster;
    const char* kernel;
    const char* says;
  };
  for (const Case& k : {Case{"hf-deepspeed", "8xa100", "fa3", "no throughput curve"},  // FA3 is Hopper-only
                        Case{"ctxrun-cuda", "8xh100", "fa3", "does not run"},        // ctxrun runs its own kernel
                        Case{"torchtitan", "8xh100", "fa2", "does not run"}}) {
    SCOPED_TRACE(std::string(k.runtime) + " " + k.cluster + " " + k.kernel);
    const std::string want = cost_model_error(k.runtime, k.cluster, k.kernel);
    ASSERT_NE(want.find(k.says), std::string::npos) << want;
    auto app = settled_app(inputs(k.runtime, "", k.cluster), kPlan);  // a job that prices
    ASSERT_TRUE(app->errors.empty());
    const double before_s = app->prediction.time.step_seconds;
    EXPECT_EQ(attention_unavailable(*app->job, k.kernel), want);  // the picker's note on that item
    EXPECT_EQ(attention_unavailable(*app->job, ""), "");
    app->state.inputs.attention = k.kernel;
    app->inputs_changed(1);
    settle(*app, 1);
    ASSERT_EQ(app->errors.count("inputs"), 1u);
    EXPECT_EQ(app->errors["inputs"].field, "attention");
    EXPECT_EQ(app->errors["inputs"].message, want);
    EXPECT_TRUE(app->using_previous_inputs);
    EXPECT_DOUBLE_EQ(app->prediction.time.step_seconds, before_s) << "the previous job's numbers stay";
    // back to the default: the error goes
    app->state.inputs.attention.clear();
    app->inputs_changed(2);
    settle(*app, 2);
    EXPECT_EQ(app->errors.count("inputs"), 0u);
  }
  // sdpa has no variable-length entry: packed documents are refused with the kernel's source
  Inputs docs = inputs("hf-deepspeed", "sdpa");
  docs.docs = DocMode::fixed;
  docs.doc_tokens = 8192;
  EXPECT_THROW(
      {
        try {
          resolve_inputs(load_profiles(kProfiles), docs);
        } catch (const InputError& e) {
          EXPECT_EQ(e.field, "attention");
          EXPECT_NE(std::string(e.what()).find("cannot run mask=document"), std::string::npos) << e.what();
          throw;
        }
      },
      InputError);
  docs.attention = "fa2";
  EXPECT_NO_THROW(resolve_inputs(load_profiles(kProfiles), docs));
}

TEST(AttentionPicker, StateFilesCarryTheChoice) {
  GuiState s = default_state();
  s.inputs.attention = "fa3";
  const json j = state_to_json(s);
  EXPECT_EQ(j["inputs"]["attention"], "fa3");
  EXPECT_EQ(state_from_json(j, "state.json", default_state()).inputs.attention, "fa3");
  // the name before issue 16 reads as fa2; "" is the runtime's default; an unknown name names the field
  EXPECT_EQ(state_from_json({{"inputs", {{"attention", "flash2"}}}}, "state.json", s).inputs.attention, "fa2");
  EXPECT_EQ(state_from_json({{"inputs", {{"attention", ""}}}}, "state.json", s).inputs.attention, "");
  EXPECT_EQ(state_from_json({{"inputs", {{"model", "Llama-3.1-8B"}}}}, "state.json", s).inputs.attention, "fa3") << "absent: kept";
  try {
    state_from_json({{"inputs", {{"attention", "fa9"}}}}, "state.json", s);
    FAIL() << "an unknown kernel must be refused";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field, "inputs.attention");
    EXPECT_NE(std::string(e.what()).find("fa2, fa3, cudnn, flex, sdpa, triton"), std::string::npos) << e.what();
  }
  // the job key changes with the choice (a new search starts)
  const Profiles p = load_profiles(kProfiles);
  Inputs a = inputs("hf-deepspeed", ""), b = inputs("hf-deepspeed", "fa3");
  EXPECT_NE(resolve_inputs(p, a).key, resolve_inputs(p, b).key);
}

TEST(AttentionPicker, ExportedPlanFileAndCommandLineCarryTheKernel) {
  const fs::path dir = fs::temp_directory_path() / ("ctxplan-gui-attention-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto app = settled_app(inputs("hf-deepspeed", "fa3"), kPlan);
  const std::string path = (dir / "plan.json").string();
  app->export_plan(path);
  const json written = json::parse(std::ifstream(path));
  EXPECT_EQ(written["attention"], "fa3");
  const Prediction from_file = cli_predict({"--plan-file", path});
  EXPECT_EQ(from_file.attention, "fa3");
  EXPECT_DOUBLE_EQ(from_file.time.step_seconds, app->prediction.time.step_seconds);
  EXPECT_NE(app->command_line("").find(" --attention fa3 "), std::string::npos) << app->command_line("");
  // the default writes no "attention" (a plan file without one means the runtime's default)
  auto def = settled_app(inputs("hf-deepspeed", ""), kPlan);
  def->export_plan(path);
  EXPECT_FALSE(json::parse(std::ifstream(path)).contains("attention"));
  EXPECT_EQ(def->command_line("").find("--attention"), std::string::npos);
  fs::remove_all(dir);
}

// An App that searches these inputs, settled.
std::unique_ptr<App> searched_app(const Inputs& in) {
  auto app = std::make_unique<App>(kProfiles);
  app->state.inputs = in;
  app->state.run_search = true;
  app->inputs_changed(-10);
  settle(*app, 0);
  return app;
}

TEST(SearchNotes, TheLeftOutCountIsTheSearchsNotDividingCount) {
  Inputs in = default_state().inputs;
  in.seq_tokens = 131000;  // 8 x 16375: zig-zag cp=8 needs a multiple of 2 x 8 = 16
  in.cp_kinds = {true, true, false, false, false};  // ring, zigzag
  in.cp_values = "8";
  in.refine = 0;
  auto app = searched_app(in);
  ASSERT_TRUE(app->table_current());
  const SearchResult want = search_plans(app->job->request);
  ASSERT_GT(want.not_dividing, 0);
  EXPECT_EQ(app->table.not_dividing, want.not_dividing);
  EXPECT_EQ(app->table.fitting, want.fitting);
  const std::vector<std::string> notes = search_notes(app->table);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].rfind(std::to_string(want.not_dividing) + " plans left out", 0), 0u) << notes[0];
  EXPECT_NE(notes[0].find("131000-token"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("pad=1"), std::string::npos) << notes[0];
  EXPECT_EQ(app->report(1)["search"]["not_dividing"].get<int64_t>(), want.not_dividing);
  // every zig-zag plan is among them: none is in the table
  for (const PlanRow& r : app->table.rows) EXPECT_NE(r.plan.cp_layout, CpLayout::headtail) << r.text;

  // the nearest edit, pad=1 among the fixed keys: the search pads them and leaves none out
  app->state.inputs.fixed_keys = "pad=1";
  app->inputs_changed(-5);
  settle(*app, 10);
  ASSERT_TRUE(app->table_current());
  EXPECT_EQ(app->table.not_dividing, 0);
  EXPECT_TRUE(search_notes(app->table).empty());
  EXPECT_GT(app->table.fitting, want.fitting) << "the padded zig-zag plans join";

  // at a length every layout divides, nothing is left out
  in.seq_tokens = 131072;
  auto divides = searched_app(in);
  EXPECT_EQ(divides->table.not_dividing, 0);
  EXPECT_EQ(search_notes(divides->table).size(), 0u);
}

TEST(SearchNotes, TheLowerPrecisionNoteFollowsTheSearch) {
  // Megatron on one H100 (tests/test_search_precision.cpp): at 16K tokens plans fit at its own fp32
  // grads and moments; at 27K only with bf16 grads or moments
  for (const auto& [seq, lower] : {std::pair<int64_t, bool>{16384, false}, std::pair<int64_t, bool>{27648, true}}) {
    SCOPED_TRACE(seq);
    Inputs in = default_state().inputs;
    in.runtime = "megatron";
    in.cluster = "1xh100";
    in.seq_tokens = seq;
    in.refine = 0;
    auto app = searched_app(in);
    ASSERT_TRUE(app->table_current());
    const SearchResult want = search_plans(app->job->request);
    EXPECT_EQ(want.lower_precision, lower);
    EXPECT_EQ(app->table.lower_precision, want.lower_precision);
    const std::vector<std::string> notes = search_notes(app->table);
    bool says = false;
    for (const std::string& n : notes) says |= n.rfind("no plan fits at megatron's own optimizer precision", 0) == 0;
    EXPECT_EQ(says, lower);
    EXPECT_EQ(app->report(1)["search"]["lower_precision"].get<bool>(), lower);
  }
}

}  // namespace
