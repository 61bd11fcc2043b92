// The executor runs the schedule the simulator prices. For a plan, ctxrun records rank 0's first
// step (--schedule-trace: every compute and communication task in issue order, in the simulator's
// names); the simulator builds its task graph for the same model, plan and runtime profile
// (ctxrun-cpu). Proves, for the simulated rank standing for rank 0:
//   - on every stream (compute, tp, ring, dp, host) the same tasks in the same order, each with the
//     same layer, pass and micro-batch;
//   - every dependency the simulator draws between two streams is respected by the executor's
//     issue order (a task is never issued before one it depends on).
// Plans cover ZeRO-3 prefetch and reduce-scatter behind the backward, ring attention with the
// overlapped dK,dV hop, checkpoint and parameter/optimizer offload, all-gather KV, ZeRO-1/2 with
// gradient accumulation, tensor parallel with and without SP (tiled vocab-parallel loss, shared KV
// heads), Ulysses and Ulysses x ring.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/simulator.hpp"
#include "costmodel/step_model.hpp"
#include "executor/parallel_context.hpp"
#include "executor/schedule_trace.hpp"
#include "executor/tests/ctxrun_cli.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ctx;

namespace {

using Case = ctx::exec::testing::PlanCase;

const Case kCases[] = {
    {4, "tiny", 128, "dp=2,cp=2,cp_kind=ring,zero=3,recompute=full,ckpt_offload=1"},
    {4, "tiny", 128, "dp=2,cp=2,cp_kind=zigzag,zero=3,recompute=selective,ga=2"},
    {4, "tiny", 128, "dp=4,zero=3,param_offload=1,opt_offload=1"},
    {4, "tiny", 256, "cp=4,cp_kind=ring,recompute=full,ckpt_offload=1"},
    {4, "tiny", 128, "dp=2,cp=2,cp_kind=allgather,zero=2,ga=2"},
    {2, "tiny", 128, "dp=2,zero=1,ga=2,recompute=selective"},
    // tensor parallel: Megatron SP (gathers, reduce-scatters, the loss's statistics, norm fix-ups)
    {4, "tiny", 128, "tp=2,cp=2,cp_kind=zigzag,zero=1,tiled_loss=16"},
    {4, "tiny", 128, "tp=2,sp=0,dp=2,zero=3,recompute=full"},
    {2, "tiny-nope", 128, "tp=2,recompute=selective"},  // one KV head shared by both TP ranks
    // Ulysses (the backward re-sends q, k, v, o with d(out)), Ulysses x ring
    {4, "tiny", 128, "cp=4,cp_kind=ulysses,recompute=selective"},
    {4, "tiny", 128, "cp=4,cp_kind=usp,ulysses=2,zero=3,dp=1,recompute=full"},
    // HSDP (issue 21): the shard group's gathers and reduce-scatters, the replicas' all-reduce inside grad_reduce
    {4, "tiny", 128, "dp=4,zero=3,zero_shard=2,ga=2"},
};

struct Task {
  std::string name;
  int layer, micro_batch;
  std::string pass;
  bool operator==(const Task& o) const {
    return name == o.name && layer == o.layer && micro_batch == o.micro_batch && pass == o.pass;
  }
};
std::string str(const Task& t) {
  return t.name + " (layer " + std::to_string(t.layer) + ", " + t.pass + ", micro-batch " + std::to_string(t.micro_batch) + ")";
}

class Schedule : public ::testing::TestWithParam<Case> {};

TEST_P(Schedule, ExecutorIssuesTheSimulatorsTasksInOrderRespectingItsDependencies) {
  const Case& c = GetParam();
  const std::string plan_text = std::string(c.plan) + ",precision=fp32";
  fs::path out = fs::temp_directory_path() / ("ctxrun_schedule_" + std::to_string(::getpid()) + ".json");
  const std::string cmd = exec::testing::ctxrun(
      c.ranks, std::string("--model ") + c.model + " --seq " + std::to_string(c.seq) + " --steps 1 --plan " + plan_text +
                   " --schedule-trace " + out.string());
  const auto r = exec::testing::sh(cmd);
  ASSERT_EQ(r.code, 0) << cmd << "\n" << r.out;
  json trace = json::parse(std::ifstream(out));
  fs::remove(out);
  ASSERT_EQ(trace.at("schema"), "ctxrun.schedule/1");

  // the executor: per stream, its tasks in issue order, and each task's global issue index
  std::map<std::string, std::vector<Task>> exec_tasks;
  std::map<std::string, std::vector<size_t>> exec_index;
  size_t idx = 0;
  for (const auto& e : trace.at("events")) {
    const std::string s = e.at("stream");
    exec_tasks[s].push_back({e.at("name"), e.at("layer"), e.at("micro_batch"), e.at("pass")});
    exec_index[s].push_back(idx++);
  }

  // the simulator, for the same model, cluster (ctxrun's default: one node of H100s), runtime and plan
  Profiles prof = load_profiles(default_profiles_dir());
  ModelSpec m = resolve_model(prof, c.model);
  ClusterSpec cl = make_cluster(resolve_hardware(prof, "h100"), 1, c.ranks);
  Plan plan = parse_plan(plan_text);
  ASSERT_TRUE(check_plan(plan, m, cl, c.seq).ok());
  SimResult sim = simulate_step(step_costs(m, cl, resolve_runtime(prof, "ctxrun-cpu"), plan, c.seq, true), plan);
  ASSERT_EQ(sim.reps.at(0).rank, 0) << "the simulator's first rep stands for another rank";
  std::map<std::string, std::vector<Task>> sim_tasks;
  std::vector<std::pair<std::string, size_t>> where(sim.tasks.size(), {"", 0});  // task -> (stream, position)
  for (size_t i = 0; i < sim.tasks.size(); ++i) {
    const SimTask& t = sim.tasks[i];
    if (t.rep != 0) continue;
    const std::string s = to_string(t.stream);
    where[i] = {s, sim_tasks[s].size()};
    sim_tasks[s].push_back({t.name, t.layer, t.micro_batch, exec::to_string(t.pass)});
  }

  for (const char* s : {"compute", "tp", "ring", "dp", "host"}) {
    const auto& a = exec_tasks[s];
    const auto& b = sim_tasks[s];
    size_t n = std::min(a.size(), b.size()), k = 0;
    while (k < n && a[k] == b[k]) ++k;
    EXPECT_TRUE(k == a.size() && k == b.size())
        << c << ": stream " << s << " differs at task " << k << " of " << a.size() << " (executor) / " << b.size()
        << " (simulator): executor " << (k < a.size() ? str(a[k]) : "<end>") << ", simulator "
        << (k < b.size() ? str(b[k]) : "<end>");
  }
  if (::testing::Test::HasFailure()) return;

  // the whole program order: the simulator creates each rank's tasks in the order a runtime issues
  // them (a prefetch before the layer it hides behind), so the interleaving of streams must agree too
  {
    std::vector<std::pair<std::string, Task>> a, b;
    for (const auto& e : trace.at("events"))
      a.push_back({e.at("stream"), {e.at("name"), e.at("layer"), e.at("micro_batch"), e.at("pass")}});
    for (const SimTask& t : sim.tasks)
      if (t.rep == 0) b.push_back({to_string(t.stream), {t.name, t.layer, t.micro_batch, exec::to_string(t.pass)}});
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k].first == b[k].first && a[k].second == b[k].second) ++k;
    EXPECT_TRUE(k == a.size() && k == b.size())
        << c << ": issue order differs at task " << k << ": executor "
        << (k < a.size() ? a[k].first + " " + str(a[k].second) : "<end>") << ", simulator "
        << (k < b.size() ? b[k].first + " " + str(b[k].second) : "<end>");
  }
  int checked = 0;
  for (size_t i = 0; i < sim.tasks.size(); ++i) {
    if (sim.tasks[i].rep != 0) continue;
    for (int32_t d : sim.deps[i]) {
      if (sim.tasks[static_cast<size_t>(d)].rep != 0 || where[static_cast<size_t>(d)].first == where[i].first) continue;
      const size_t before = exec_index[where[static_cast<size_t>(d)].first][where[static_cast<size_t>(d)].second];
      const size_t after = exec_index[where[i].first][where[i].second];
      ++checked;
      EXPECT_LT(before, after) << c << ": the executor issues " << sim.tasks[i].name << " (" << where[i].first
                               << ") before " << sim.tasks[static_cast<size_t>(d)].name << " ("
                               << where[static_cast<size_t>(d)].first << "), which the simulator makes it wait for";
    }
  }
  std::printf("%s: %zu tasks on rank 0, %d cross-stream dependencies respected\n", c.plan,
              static_cast<size_t>(trace.at("events").size()), checked);
}

INSTANTIATE_TEST_SUITE_P(Plans, Schedule, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return "Plan" + std::to_string(i.index); });

}  // namespace

namespace ctx {
namespace {

// pad=1 (issue 21): ctxrun does not pad sequences. A plan that would pad (zig-zag over cp=2 needs a
// multiple of 2*cp = 4; 66 pads to 68) is refused naming the key and the lengths that run; pad=1 at a
// length the layout divides pads nothing and is not refused for it.
TEST(ExecutorPlan, PadThatWouldPadIsRefusedNamingTheKey) {
  Profiles prof = load_profiles(default_profiles_dir());
  const ModelSpec m = resolve_model(prof, "tiny");
  const std::string why = exec::executor_plan_problem(m, parse_plan("cp=2,cp_kind=zigzag,pad=1"), 66);
  EXPECT_NE(why.find("pad=1"), std::string::npos) << why;
  EXPECT_NE(why.find("66 tokens to 68"), std::string::npos) << why;
  EXPECT_NE(why.find("(64 or 68)"), std::string::npos) << why;
  EXPECT_EQ(exec::executor_plan_problem(m, parse_plan("cp=2,cp_kind=zigzag,pad=1"), 64), "");
}

// tp_overlap and compile (issue 16) are priced for Megatron and torchtitan, not run by ctxrun: refused
// naming the key and the value that runs, as the ctxrun profiles' capabilities (which ctxplan checks)
// refuse them, so the executor never runs a plan it reports under another name.
TEST(ExecutorPlan, TpOverlapAndCompileAreRefusedAsTheCtxrunProfilesSay) {
  Profiles prof = load_profiles(default_profiles_dir());
  const ModelSpec m = resolve_model(prof, "tiny");
  for (const char* plan : {"tp=2,tp_overlap=1", "compile=model", "compile=model+loss"}) {
    const std::string why = exec::executor_plan_problem(m, parse_plan(plan), 64);
    const std::string key = std::string(plan).find("compile") != std::string::npos ? "compile=off" : "tp_overlap=0";
    EXPECT_NE(why.find(key), std::string::npos) << plan << ": " << why;
    for (const char* rt : {"ctxrun-cpu", "ctxrun-cuda"})
      EXPECT_NE(missing_capability(resolve_runtime(prof, rt).capabilities, rt, parse_plan(plan)), "") << rt << " " << plan;
  }
  EXPECT_EQ(exec::executor_plan_problem(m, parse_plan("tp=2,tp_overlap=0,compile=off"), 64), "");
}


// The ctxrun profiles' capabilities and the executor's own refusals are one statement (review of issue 16):
// ctxplan proposes for ctxrun only plans its profile allows, and ctxrun refuses (executor_plan_problem) what it
// does not run. For one plan per capability value, the profile allows the plan exactly when the executor runs
// it, on both ctxrun profiles; a value one side accepts and the other refuses fails here naming both answers.
TEST(ExecutorPlan, CtxrunProfilesAllowExactlyWhatTheExecutorRuns) {
  Profiles prof = load_profiles(default_profiles_dir());
  const ModelSpec m = resolve_model(prof, "tiny");
  const std::vector<std::string> plans = {
      "tp=2", "tp=2,sp=0", "tp=2,sp=1", "pp=2", "pp=2,vpp=2", "cp=2,cp_kind=ring", "cp=2,cp_kind=zigzag",
      "cp=2,cp_kind=ulysses", "cp=2,cp_comm=allgather", "cp=4,cp_kind=usp,ulysses=2", "cp=2,cp_kind=ring,mask=doc:16,cp_varlen=native",
      "cp=2,cp_kind=ring,mask=doc:16,cp_varlen=cycle", "cp=2,cp_kind=ring,mask=doc:16,cp_varlen=split:2", "zero=0", "zero=1",
      "dp=2,zero=2", "dp=2,zero=3", "dp=4,zero=3,zero_shard=2", "recompute=none", "recompute=selective",
      "recompute=full", "opt_offload=1", "param_offload=1,zero=3,dp=2", "ckpt_offload=1,recompute=full",
      "tiled_loss=16", "tiled_mlp=16", "master=none", "master=fp32", "grads=bf16", "grads=fp32", "moments=bf16",
      "moments=8bit", "tp=2,tp_overlap=1", "compile=model", "compile=model+loss"};
  int checked = 0;
  for (const char* rt : {"ctxrun-cpu", "ctxrun-cuda"}) {
    const RuntimeProfile runtime = resolve_runtime(prof, rt);
    for (const std::string& text : plans) {
      Plan plan;
      try {
        plan = parse_plan(text);
      } catch (const std::exception& e) {
        ADD_FAILURE() << text << " does not parse: " << e.what();
        continue;
      }
      const std::string profile_says = missing_capability(runtime.capabilities, rt, plan);
      const std::string executor_says = exec::executor_plan_problem(m, plan, 64);
      EXPECT_EQ(profile_says.empty(), executor_says.empty())
          << rt << " " << text << ": profile: '" << profile_says << "', executor: '" << executor_says << "'";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * static_cast<int>(plans.size()));
}

}  // namespace
}  // namespace ctx
