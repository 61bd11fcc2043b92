#include "planner/job_args.hpp"

#include <iostream>

#include "costmodel/attention_kernels.hpp"
#include "planner/format.hpp"
#include "planner/validation_points.hpp"

namespace ctx {

void add_job_options(CLI::App& app, JobArgs& a, bool with_plan) {
  a.model_opt = app.add_option("--model,-m", a.model,
                               "model profile name/alias, a profile JSON, or a Hugging Face config.json (default Llama-3.1-8B)");
  a.cluster_opt = app.add_option("--cluster,-c", a.cluster,
                                 "cluster profile, or <nodes>x<gpus per node>x<gpu> such as 8xh100, 16x8xh200 (default 8xh100)");
  a.seq_opt = app.add_option("--seq,-s", a.seq, "sequence length in tokens: 131072, 128k, 1m (default 131072)");
  a.runtime_opt = app.add_option("--runtime,-r", a.runtime, "runtime profile: ctxrun-cuda | ctxrun-cpu | hf-deepspeed | megatron | torchtitan | llm-foundry, or a runtime profile JSON file; NAME@VARIANT for a framework version the profile lists, e.g. hf-deepspeed@liger-int64 (default ctxrun-cuda)");
  a.attention_opt = app.add_option("--attention", a.attention,
                                   "attention implementation: " + attention_choices() +
                                       " (default: the runtime's, e.g. fa2 for hf-deepspeed, cudnn for megatron; "
                                       "`ctxplan show runtime NAME` lists what a runtime runs)");
  a.with_plan = with_plan;
  if (with_plan) {
    app.add_flag("--any-runtime", a.any_runtime,
                 "price a plan the runtime's stack cannot run (its capabilities: `ctxplan show runtime NAME`) with a warning "
                 "instead of refusing it");
    app.add_option("--plan,-p", a.plan,
                   "plan as key=value,... (keys: dp tp sp cp cp_kind cp_comm cp_layout cp_varlen ulysses zero zero_shard mbs ga recompute "
                   "ckpt_offload opt_offload param_offload tiled_loss tiled_mlp mask packing pad precision master grads moments order "
                   "pp vpp pp_first pp_last pp_embed pp_loss; default: " +
                       std::string(kDefaultPlan) + ")");
    app.add_option("--plan-file", a.plan_file, "plan.json (may also carry model, cluster, seq, runtime, attention)");
  } else {
    app.add_option("--plan,-p", a.plan,
                   "fixed keys every searched plan keeps, e.g. \"mask=doc:hist:2048@0.8/32768@0.2,packing=sorted,precision=fp8\"");
  }
}

Job resolve_job(const JobArgs& a, const CommonOptions& common) {
  Job job;
  job.profiles = load_profiles(common.profiles.empty() ? default_profiles_dir() : common.profiles);
  std::string model_arg = a.model, cluster_arg = a.cluster, runtime_arg = a.runtime, seq_arg = a.seq;
  json j;
  if (!a.plan_file.empty()) {
    j = read_json_file(a.plan_file);
    JsonReader r(j, a.plan_file);
    std::string schema = r.string_or("schema", "");
    if (schema != "ctxplan.plan/1") r.fail("schema", "expected \"ctxplan.plan/1\", got \"" + schema + "\"");
    job.plan = plan_from_json(r.raw("plan"), a.plan_file);
    // the file's model/cluster/seq apply unless given on the command line
    if (r.has("model") && a.model_opt->count() == 0) model_arg = r.string("model");
    if (r.has("cluster") && a.cluster_opt->count() == 0) cluster_arg = r.string("cluster");
    if (r.has("runtime") && a.runtime_opt->count() == 0) runtime_arg = r.string("runtime");
    if (r.has("seq") && a.seq_opt->count() == 0) seq_arg = std::to_string(r.integer_in("seq", 1, int64_t(1) << 34));
    if (!a.plan.empty()) throw InputError("--plan", "", "give either --plan or --plan-file, not both");
  } else {
    job.plan = parse_plan(a.plan.empty() ? kDefaultPlan : a.plan, "--plan");
  }
  job.seq = parse_tokens(seq_arg, "--seq");
  job.model = resolve_model(job.profiles, model_arg);
  job.cluster = resolve_cluster(job.profiles, cluster_arg);
  job.runtime = runtime_with_job_attention(resolve_runtime(job.profiles, runtime_arg), a, a.plan_file.empty() ? nullptr : &j);
  job.runtime = with_time_residuals(job.profiles, std::move(job.runtime));  // the error band's residuals (validation_points.hpp)
  if (a.with_plan) {  // a plan the stack cannot run is no prediction of anything (issue 21)
    const std::string missing = missing_capability(job.runtime.capabilities, job.runtime.name, job.plan);
    if (!missing.empty() && !a.any_runtime)
      throw InputError(a.plan_file.empty() ? "--plan" : a.plan_file, "", missing + "; --any-runtime prices it anyway");
    if (!missing.empty()) std::cerr << "ctxplan: warning: " << missing << " (priced anyway: --any-runtime)\n";
  }
  return job;
}

RuntimeProfile runtime_with_job_attention(RuntimeProfile rt, const JobArgs& a, const json* plan_file_doc) {
  if (a.attention_opt && a.attention_opt->count() > 0) return with_attention(std::move(rt), a.attention, "--attention", "");
  if (plan_file_doc && plan_file_doc->is_object() && plan_file_doc->contains("attention")) {
    JsonReader r(*plan_file_doc, a.plan_file);
    return with_attention(std::move(rt), r.string("attention"), a.plan_file, "attention");
  }
  return rt;
}

}  // namespace ctx
