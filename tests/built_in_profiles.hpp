// Test helper: the repository's own profiles (profiles/), loaded once per test binary, the memory of
// one plan under them, and the ctxplan binary run against them.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/runtime_profile.hpp"
#include "run_process.hpp"

namespace ctx::testing {

// The attention seconds of a StepCosts table (attn_fwd or attn_bwd: [pack][rank][call]) summed over
// every call, and the number of calls into *calls.
inline double attention_call_seconds(const std::vector<std::vector<std::vector<double>>>& t, int* calls) {
  double s = 0;
  for (auto& pack : t)
    for (auto& rank : pack)
      for (double x : rank) {
        s += x;
        ++*calls;
      }
  return s;
}

inline const std::string& built_in_profiles_dir() {
  static const std::string dir = std::string(CTXPLAN_SOURCE_DIR) + "/profiles";
  return dir;
}

inline const Profiles& built_in_profiles() {
  static const Profiles p = load_profiles(built_in_profiles_dir());
  return p;
}

// The memory prediction of `plan_text` for `model` on `cluster` under `runtime` at `seq` tokens; the
// plan must pass check_plan (a failure names it).
inline MemoryPrediction built_in_plan_memory(const std::string& model, const std::string& runtime, const std::string& plan_text,
                                             int64_t seq, const std::string& cluster = "8xh100") {
  const Profiles& pr = built_in_profiles();
  const ModelSpec m = resolve_model(pr, model);
  const ClusterSpec c = resolve_cluster(pr, cluster);
  Plan p = parse_plan(plan_text);  // check_plan resolves dp
  const PlanCheck chk = check_plan(p, m, c, seq);
  EXPECT_TRUE(chk.ok()) << plan_text << ": " << chk.message();
  return predict_memory(m, c, resolve_runtime(pr, runtime), p, seq);
}

// One job resolved from the built-in profiles with its plan checked (dp filled in): what the step
// model and the simulator take.
struct PricedJob {
  ModelSpec m;
  ClusterSpec c;
  RuntimeProfile rt;
  Plan p;
  int64_t seq;
};

inline PricedJob built_in_job(const std::string& plan_text, int64_t seq, const std::string& model = "Llama-3.1-8B",
                              const std::string& cluster = "8xh100", const std::string& runtime = "ctxrun-cuda") {
  const Profiles& pr = built_in_profiles();
  PricedJob j{resolve_model(pr, model), resolve_cluster(pr, cluster), resolve_runtime(pr, runtime), parse_plan(plan_text), seq};
  const PlanCheck chk = check_plan(j.p, j.m, j.c, seq);
  EXPECT_TRUE(chk.ok()) << plan_text << " on " << cluster << ": " << chk.message();
  return j;
}

// `ctxplan --profiles <profiles/> args...`
inline RunResult ctxplan_with_built_in_profiles(std::vector<std::string> args) {
  args.insert(args.begin(), {"--profiles", built_in_profiles_dir()});
  return run_process(CTXPLAN_BIN, args);
}

}  // namespace ctx::testing
