#include "gui/resolve_inputs.hpp"

#include "costmodel/attention_kernels.hpp"
#include "costmodel/limits.hpp"
#include "planner/validation_points.hpp"

#include <sstream>

namespace ctx::gui {

std::vector<int64_t> parse_degree_list(const std::string& text, const std::string& field) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used != item.size() || v < 1 || v > (1 << 20))
      throw InputError(kInputsWhere, field, "'" + item + "' is not a degree; expected a list such as 1,2,4,8");
    out.push_back(v);
  }
  return out;
}

std::string pipeline_split_keys(const Inputs& in) {
  auto bad = [](const char* field, int64_t v, const char* valid) {
    throw InputError(kInputsWhere, field, std::to_string(v) + " is not valid: " + valid);
  };
  if (in.vpp < 0) bad("constraints.vpp", in.vpp, "0 (the search's choice) or the virtual stages per rank, >= 1");
  if (in.pp_first < 0) bad("constraints.pp_first", in.pp_first, "0 (even split) or the first stage's layers, >= 1");
  if (in.pp_last < 0) bad("constraints.pp_last", in.pp_last, "0 (even split) or the last stage's layers, >= 1");
  std::string keys;
  auto add = [&keys](const std::string& kv) { keys += (keys.empty() ? "" : ",") + kv; };
  if (in.vpp > 0) add("vpp=" + std::to_string(in.vpp));
  if (in.pp_first > 0) add("pp_first=" + std::to_string(in.pp_first));
  if (in.pp_last > 0) add("pp_last=" + std::to_string(in.pp_last));
  if (in.pp_embed) add("pp_embed=1");
  if (in.pp_loss) add("pp_loss=1");
  return keys;
}

ResolvedJob resolve_inputs(const Profiles& profiles, const Inputs& in) {
  ResolvedJob job;
  if (in.seq_tokens < 1024 || in.seq_tokens > (int64_t(1) << 30))
    throw InputError(kInputsWhere, "seq", "sequence length " + std::to_string(in.seq_tokens) + " is outside 1K..1G tokens");
  job.seq_tokens = in.seq_tokens;
  job.model = resolve_model(profiles, in.model);
  job.cluster = resolve_cluster(profiles, in.cluster);
  const ClusterEdit& e = in.cluster_edit;
  if (e.enabled) {
    // shape first (the GPU's default fabric), then the links and host memory the person typed
    const HardwareSpec& gpu = e.gpu.empty() ? job.cluster.gpu : resolve_hardware(profiles, e.gpu);
    ClusterSpec base = job.cluster;
    if (e.nodes < 1 || e.gpus_per_node < 1 || e.gpus_per_node > 1024 || e.nodes > kMaxClusterGpus ||
        e.nodes * e.gpus_per_node > kMaxClusterGpus)
      throw InputError(kInputsWhere, "cluster_edit", std::to_string(e.nodes) + " nodes x " + std::to_string(e.gpus_per_node) +
                                                         " GPUs: GPUs per node must be 1..1024 and the cluster 1.." +
                                                         std::to_string(kMaxClusterGpus) + " GPUs");
    job.cluster = make_cluster(gpu, e.nodes, e.gpus_per_node);
    if (gpu.name == base.gpu.name) {
      job.cluster.intra_bytes_per_second = base.intra_bytes_per_second;
      job.cluster.inter_bytes_per_second = base.inter_bytes_per_second;
      job.cluster.intra_latency_seconds = base.intra_latency_seconds;
      job.cluster.inter_latency_seconds = base.inter_latency_seconds;
      job.cluster.host_bytes_per_node = base.host_bytes_per_node;
    }
    if (e.intra_gbps > 0) job.cluster.intra_bytes_per_second = e.intra_gbps * 1e9;
    if (e.inter_gbps > 0) job.cluster.inter_bytes_per_second = e.inter_gbps * 1e9;
    if (e.host_gib_per_node > 0) job.cluster.host_bytes_per_node = static_cast<int64_t>(e.host_gib_per_node * 1024.0 * 1024 * 1024);
    job.cluster.name = "edited-" + job.cluster.name;
    job.cluster.source = "edited in ctxplan-gui from " + in.cluster;
  }
  if (in.docs == DocMode::histogram && in.doc_bins.empty())
    throw InputError(kInputsWhere, "docs.bins", "a histogram needs at least one [tokens, fraction] bin");
  std::string base = "mask=" + mask_text(in) + ",packing=" + (in.sorted_packing ? "sorted" : "greedy") +
                     ",precision=" + in.precision;
  job.base = parse_plan(base, std::string(kInputsWhere) + " (documents)");
  // the attention choice, then the step time's band, in the CLI's order (planner/job_args.cpp resolve_job)
  RuntimeProfile rt = resolve_runtime(profiles, in.runtime);
  job.attention_default = rt.attention_kernel;
  try {
    job.attention_default_here = find_attention_kernel(job.cluster, rt).name;
  } catch (const InputError&) {  // said when the default is in force (below); a choice may still price
  }
  job.runtime = with_time_residuals(profiles, runtime_with_attention(std::move(rt), job.cluster, job.base, in.attention, &job.attention));

  SearchRequest& r = job.request;
  r.model = job.model;
  r.cluster = job.cluster;
  r.runtime = job.runtime;
  r.seq = job.seq_tokens;
  if (in.global_batch_tokens < 0) throw InputError(kInputsWhere, "global_batch_tokens", "must be >= 0");
  r.global_batch_tokens = in.global_batch_tokens;
  r.objective = in.objective_memory ? Objective::memory : Objective::time;
  r.base = job.base;
  for (int i = 0; i < kCpKinds; ++i)
    if (in.cp_kinds[i]) r.cp_kinds.push_back(static_cast<CpKind>(i));
  if (r.cp_kinds.empty()) throw InputError(kInputsWhere, "constraints.cp_kinds", "allow at least one CP kind");
  if (r.cp_kinds.size() == kCpKinds) r.cp_kinds.clear();
  r.allow_offload = in.allow_offload;
  r.tp_values = parse_degree_list(in.tp_values, "constraints.tp");
  r.cp_values = parse_degree_list(in.cp_values, "constraints.cp");
  r.pp_values = parse_degree_list(in.pp_values, "constraints.pp");
  r.refine = in.refine;
  r.top_k = 10;
  // the pipeline split: plan keys the search keeps, as if among the fixed keys (a key there too
  // is refused by the plan parser as given twice)
  std::string keys = pipeline_split_keys(in);
  if (!in.fixed_keys.empty()) keys += (keys.empty() ? "" : ",") + in.fixed_keys;
  if (!keys.empty()) {  // constraints, not seeds: the search keeps every key (planner/search.hpp)
    const std::string where = std::string(kInputsWhere) + " (constraints.keys)";
    r.base = parse_plan(base + "," + keys, where);
    r.fixed_fields = fixed_plan_fields(keys, where);
    check_constraints(r, where);
    attention_mask(r.base, job.attention, job.runtime);  // a mask among the fixed keys meets the kernel here, not in the search
  }

  // the key: every input the job depends on, plus what the files resolved to
  std::ostringstream k;
  GuiState only_inputs;
  only_inputs.inputs = in;
  k << state_to_json(only_inputs)["inputs"].dump() << "|" << job.model.name << "|" << job.model.layers << "|"
    << job.model.hidden << "|" << job.cluster.name << "|" << job.cluster.host_bytes_per_node;
  job.key = k.str();
  return job;
}

RuntimeProfile runtime_with_attention(RuntimeProfile rt, const ClusterSpec& cluster, const Plan& base, const std::string& name,
                                      AttentionKernel* kernel) {
  if (!name.empty()) rt = with_attention(std::move(rt), name, kInputsWhere, "attention");
  // what step_costs will look up: a kernel without a curve here (fa3 on an A100), or without a
  // variable-length entry for the inputs' documents, is refused now with the cost model's words
  // rather than by the simulation and the search on their workers
  const AttentionKernel& k = find_attention_kernel(cluster, rt);
  attention_mask(base, k, rt);
  if (kernel) *kernel = k;
  return rt;
}

std::string attention_unavailable(const ResolvedJob& job, const std::string& name) {
  RuntimeProfile rt = job.runtime;  // back to the profile's default, then `name` as resolve_inputs applies it
  rt.attention_kernel = job.attention_default;
  rt.attention_where.clear();
  rt.attention_field.clear();
  try {
    runtime_with_attention(std::move(rt), job.cluster, job.base, name);
    return "";
  } catch (const InputError& e) {
    return e.what();
  }
}

Plan selected_plan(const ResolvedJob& job, const std::string& text) {
  // the inputs' mask goes first unless the text names one (replaced below either way), so keys that
  // need a document mask (cp_varlen) parse when the inputs give one
  bool names_mask = false;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    item.erase(0, item.find_first_not_of(" \t"));
    names_mask = names_mask || item.rfind("mask=", 0) == 0;
  }
  Plan p = parse_plan(names_mask ? text : "mask=" + mask_to_string(job.base) + "," + text, "selected plan");
  p.mask = job.base.mask;
  p.docs = job.base.docs;
  p.sorted_packing = job.base.sorted_packing;
  p.precision = job.base.precision;
  // the plan text's keys with the job's mask: parsed once more so the parser's rules that join keys
  // (cp_varlen needs a document mask) judge the combination, not only the text as typed
  return parse_plan(plan_to_string(p), "selected plan");
}

}  // namespace ctx::gui
