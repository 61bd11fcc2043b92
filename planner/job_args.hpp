// The options every planning command shares (--model, --cluster, --seq, --runtime, --plan,
// --plan-file) and their resolution against the profiles, so each command reads them one way.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "costmodel/plan.hpp"
#include "costmodel/profile_store.hpp"
#include "planner/commands.hpp"

namespace ctx {

// The built-in default job: Llama-3.1-8B at 128K on one 8xH100 node.
constexpr const char* kDefaultModel = "Llama-3.1-8B";
constexpr const char* kDefaultCluster = "8xh100";
constexpr const char* kDefaultSeq = "131072";
constexpr const char* kDefaultPlan = "cp=8,cp_kind=zigzag,zero=3,recompute=full,tiled_loss=2048";
constexpr const char* kDefaultRuntime = "ctxrun-cuda";  // ctxrun on a GPU cluster (profiles/runtimes/ctxrun-cuda.json)

struct JobArgs {
  std::string model = kDefaultModel, cluster = kDefaultCluster, seq = kDefaultSeq, plan, plan_file;
  std::string runtime = kDefaultRuntime;
  std::string attention;  // --attention: empty = the runtime's default kernel
  bool with_plan = false;    // the command takes one plan (predict, simulate, launch): checked against the runtime
  bool any_runtime = false;  // --any-runtime: a plan the runtime cannot run is priced with a warning, not refused
  CLI::Option *model_opt = nullptr, *cluster_opt = nullptr, *seq_opt = nullptr, *runtime_opt = nullptr, *attention_opt = nullptr;
};

struct Job {
  Profiles profiles;
  ModelSpec model;
  ClusterSpec cluster;
  RuntimeProfile runtime;  // with the job's attention kernel (--attention or the plan file's) in force
  Plan plan;
  int64_t seq = 0;
};

// with_plan: also --plan/--plan-file (predict, simulate); without, the plan's mask/precision keys
// may still be given with --plan as constraints (search commands use Plan as a base).
void add_job_options(CLI::App& app, JobArgs& a, bool with_plan);
Job resolve_job(const JobArgs& a, const CommonOptions& common);
// The runtime with a plan file's "attention" (when --attention is not given) or --attention applied
// (attention_kernels.hpp: unknown names and kernels the runtime does not run are input errors).
RuntimeProfile runtime_with_job_attention(RuntimeProfile rt, const JobArgs& a, const json* plan_file_doc);

}  // namespace ctx
