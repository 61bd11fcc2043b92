// Runtime capability sets (issue 21, part 1), costmodel/runtime_capabilities.*:
//   - the search proposes only plans the runtime's stack can run: its enumeration is exactly the
//     capability-free enumeration filtered by missing_capability (nothing lost, nothing added);
//   - hf-deepspeed (ALST's stack: Ulysses, no TP, no ring) never gets a TP or ring plan;
//   - predict refuses a plan the stack cannot run naming the capability (exit 2), prices it with a
//     warning under --any-runtime;
//   - a runtime file with a malformed capability is a bad input naming the field; one without
//     capabilities states nothing and allows every plan;
//   - every validation point's plan is one its runtime can run (validation data describes runs that
//     happened on that stack).
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/runtime_capabilities.hpp"
#include "planner/search.hpp"
#include "planner/validation_points.hpp"
#include "built_in_profiles.hpp"

namespace ctx {
namespace {

const std::string& kProfiles = testing::built_in_profiles_dir();
const Profiles& profiles() { return testing::built_in_profiles(); }

testing::RunResult ctxplan(std::vector<std::string> args) { return testing::ctxplan_with_built_in_profiles(std::move(args)); }

std::string id(const Plan& p) { return plan_to_string(p) + "|" + order_to_string(p) + "|mbs" + std::to_string(p.mbs) + "|vpp" + std::to_string(p.vpp); }

TEST(RuntimeCapabilities, SearchEnumeratesExactlyThePlansTheStackRuns) {
  for (const char* runtime : {"hf-deepspeed", "megatron", "ctxrun-cuda"}) {
    SearchRequest req;
    req.model = resolve_model(profiles(), "Llama-3.1-8B");
    req.cluster = resolve_cluster(profiles(), "2x8xh100");
    req.runtime = resolve_runtime(profiles(), runtime);
    ASSERT_TRUE(req.runtime.capabilities.declared) << runtime;
    req.seq = 131072;
    req.global_batch_tokens = 8 * req.seq;
    SearchRequest free = req;
    free.runtime.capabilities = RuntimeCapabilities{};
    std::vector<std::string> want, got;
    int64_t refused = 0;
    for (const Plan& p : enumerate_plans(free)) {
      if (missing_capability(req.runtime.capabilities, runtime, p).empty()) want.push_back(id(p));
      else ++refused;
    }
    for (const Plan& p : enumerate_plans(req)) got.push_back(id(p));
    EXPECT_EQ(got, want) << runtime;
    if (std::string(runtime) != "ctxrun-cuda") {
      EXPECT_GT(refused, 0) << runtime << ": the free space has plans the stack cannot run";
    }
  }
}

// runtime_runs (what the search asks of every plan it enumerates) is missing_capability(...).empty(),
// and where the stack lacks a capability the message names the key capability_gap found (one
// rule set, two readings): every runtime, over the capability-free space of plans with pipeline
// stages, packed documents and the optimizer precisions the profiles name.
TEST(RuntimeCapabilities, RuntimeRunsIsAnEmptyMissingCapability) {
  const char* keys[] = {"", "tp", "sp", "sp", "pp", "vpp", "cp_comm", "cp_layout", "cp_varlen", "zero_with_pp", "zero", "zero_shard",
                        "recompute", "opt_offload", "param_offload", "ckpt_offload", "tiled_loss", "tiled_mlp", "tp_overlap",
                        "compile", "master", "grads", "moments"};
  std::set<std::string> named;
  int64_t all_runs = 0;
  for (const char* runtime : {"hf-deepspeed", "megatron", "ctxrun-cuda", "ctxrun-cpu", "torchtitan", "llm-foundry"}) {
    SearchRequest req;
    req.model = resolve_model(profiles(), "Llama-3.1-8B");
    req.cluster = resolve_cluster(profiles(), "2x8xh100");
    req.runtime = resolve_runtime(profiles(), runtime);
    req.seq = 131072;
    req.global_batch_tokens = 8 * req.seq;
    req.base = parse_plan("mask=doc:hist:2048@0.8/32768@0.2");
    SearchRequest free = req;
    free.runtime.capabilities = RuntimeCapabilities{};
    int64_t runs = 0, not_runs = 0;
    const StateDtype dtypes[] = {StateDtype::runtime, StateDtype::fp32, StateDtype::bf16, StateDtype::none, StateDtype::q8};
    for (Plan p : enumerate_plans(free))
      for (int v = 0; v < 5; ++v) {
        p.master = v == 3 ? StateDtype::none : StateDtype::runtime;
        p.grads = v == 2 ? StateDtype::bf16 : StateDtype::runtime;
        p.moments = v == 4 ? dtypes[4] : v == 2 ? dtypes[2] : StateDtype::runtime;
        p.compile = v == 1 ? Compile::model : Compile::off;
        const CapabilityGap gap = capability_gap(req.runtime.capabilities, p);
        const std::string why = missing_capability(req.runtime.capabilities, runtime, p);
        ASSERT_EQ(runtime_runs(req.runtime.capabilities, p), why.empty()) << runtime << " " << plan_to_string(p) << ": " << why;
        if (why.empty()) {
          ++runs;
          continue;
        }
        ++not_runs;
        const std::string key = keys[static_cast<int>(gap)];
        ASSERT_NE(why.find(" cannot run " + key + "="), std::string::npos) << runtime << " " << plan_to_string(p) << ": " << why;
        named.insert(key);
      }
    all_runs += runs;
    EXPECT_GT(not_runs, 0) << runtime;
  }
  EXPECT_GT(all_runs, 0);
  // the space reaches most of the rules (tp: no runtime caps it below 8, sp: the plans leave it to the runtime)
  EXPECT_GE(named.size(), 10u);
}

TEST(RuntimeCapabilities, HfDeepspeedNeverGetsTensorParallelOrRingPlans) {
  SearchRequest req;
  req.model = resolve_model(profiles(), "Llama-3.1-8B");
  req.cluster = resolve_cluster(profiles(), "8xh100");
  req.runtime = resolve_runtime(profiles(), "hf-deepspeed");
  req.seq = 131072;
  SearchResult r = search_plans(req);
  ASSERT_FALSE(r.ranked.empty());
  for (const Candidate& c : r.ranked) {
    EXPECT_EQ(c.plan.tp, 1) << plan_to_string(c.plan);
    if (c.plan.cp > 1) {
      EXPECT_EQ(c.plan.cp_comm, CpComm::a2a) << plan_to_string(c.plan);
    }
    EXPECT_EQ(c.plan.pp, 1) << plan_to_string(c.plan);
  }
  // and the CLI: its best plan at 128K on 8 GPUs (the example returned tp=2,cp=4,cp_kind=zigzag)
  auto out = ctxplan({"plan", "--model", "Llama-3.1-8B", "--cluster", "8xh100", "--seq", "128k", "--runtime", "hf-deepspeed", "--json", "--top", "20"});
  ASSERT_EQ(out.exit_code, 0) << out.both();
  for (auto& c : parse_json_text(out.out, "plan").at("top")) {
    const Plan p = parse_plan(c.at("plan_string").get<std::string>());
    EXPECT_EQ(p.tp, 1) << p.tp;
    if (p.cp > 1) {
      EXPECT_EQ(p.cp_comm, CpComm::a2a) << plan_to_string(p);
    }
  }
}

TEST(RuntimeCapabilities, PredictRefusesAPlanTheStackCannotRunUnlessAnyRuntime) {
  const std::vector<std::string> job = {"predict", "--model", "Llama-3.1-8B", "--cluster", "8xh100", "--seq", "128k", "--runtime", "hf-deepspeed",
                                        "--plan", "tp=2,cp=4,cp_kind=zigzag,zero=3,recompute=full"};
  auto r = ctxplan(job);
  EXPECT_EQ(r.exit_code, 2) << r.both();
  EXPECT_NE(r.err.find("cannot run tp=2"), std::string::npos) << r.err;  // the first capability missing, by key and value
  std::vector<std::string> any = job;
  any.push_back("--any-runtime");
  r = ctxplan(any);
  EXPECT_EQ(r.exit_code, 0) << r.both();
  EXPECT_NE(r.err.find("warning"), std::string::npos) << r.err;
  // Megatron runs no contiguous layout (get_batch_on_this_cp_rank is always head-tail)
  r = ctxplan({"predict", "--model", "Llama-3.1-8B", "--cluster", "8xh100", "--seq", "128k", "--runtime", "megatron", "--plan",
               "cp=8,cp_kind=ring,zero=1,recompute=full"});
  EXPECT_EQ(r.exit_code, 2) << r.both();
  EXPECT_NE(r.err.find("cp_layout=contiguous"), std::string::npos) << r.err;
}

TEST(RuntimeCapabilities, ARuntimeFileIsCheckedAndOneWithoutCapabilitiesAllowsEveryPlan) {
  json j = read_json_file(kProfiles + "/runtimes/hf-deepspeed.json");
  j["name"] = "my-stack";
  const std::string path = ::testing::TempDir() + "/my-stack.json";
  auto write = [&](const json& doc) {
    std::ofstream(path) << doc.dump(2);
  };
  const std::vector<std::string> job = {"predict", "--model", "Llama-3.1-8B", "--cluster", "8xh100", "--seq", "128k", "--runtime", path,
                                        "--plan", "tp=2,cp=4,cp_kind=zigzag,zero=3,recompute=full"};
  json bad = j;
  bad["capabilities"]["cp_comm"]["value"] = json::array({"ring"});
  write(bad);
  auto r = ctxplan(job);
  EXPECT_EQ(r.exit_code, 2) << r.both();
  EXPECT_NE(r.err.find("capabilities.cp_comm.value[0]"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("p2p, allgather, a2a, a2a+p2p"), std::string::npos) << r.err;
  bad = j;
  bad["capabilities"]["tp"]["source"] = "";
  write(bad);
  r = ctxplan(job);
  EXPECT_EQ(r.exit_code, 2) << r.both();
  EXPECT_NE(r.err.find("capabilities.tp.source"), std::string::npos) << r.err;
  json none = j;
  none.erase("capabilities");
  write(none);
  r = ctxplan(job);
  EXPECT_EQ(r.exit_code, 0) << r.both();  // nothing stated: the plan is priced
  std::remove(path.c_str());
}

// Validation points are runs that happened: their plans are ones their runtime's stack runs.
TEST(RuntimeCapabilities, EveryValidationPointRunsOnItsRuntime) {
  int points = 0;
  for (const char* file : {"published_time.jsonl", "alst_maxseq.jsonl"})
    for (const json& v : read_jsonl(kProfiles + "/validation/" + file)) {
      if (!v.contains("plan") || !v.contains("runtime")) continue;
      const RuntimeProfile rt = resolve_runtime(profiles(), v.at("runtime").get<std::string>());
      const Plan plan = parse_plan(v.at("plan").get<std::string>(), file);
      EXPECT_EQ(missing_capability(rt.capabilities, rt.name, plan), "") << file << ": " << v.value("id", "?");
      ++points;
    }
  EXPECT_GT(points, 30);
}

}  // namespace
}  // namespace ctx
