#include "planner/validation_points.hpp"

#include <cmath>
#include <fstream>
#include <map>
#include <mutex>

#include "costmodel/attention_kernels.hpp"

namespace ctx {
namespace {

// A point carries its source, the job as the source states it, and the published number; nothing
// else may change its prediction (no per-point tuning knobs: issue 16).
void check_point_keys(const JsonReader& r, const std::string& id) {
  static const char* keys[] = {"id", "point", "source", "source_locator", "model", "cluster", "runtime", "plan", "seq",
                               "metric", "published", "definition", "published_notes", "mapping_notes", "attention",
                               "attention_source", "tp_overlap", "tp_overlap_source", "role"};
  for (auto& [key, v] : r.self().items()) {
    bool known = false;
    for (const char* k : keys) known |= key == k;
    if (!known)
      r.fail(key, "unknown key in point " + id + ": a point states its source's facts (model, cluster, runtime, plan, seq, "
                  "attention with attention_source, tp_overlap with tp_overlap_source) and nothing that tunes its prediction");
  }
}

}  // namespace

std::string point_role(const JsonReader& r) {
  const std::string role = r.string_or("role", "fit");
  if (role != "fit" && role != "check") r.fail("role", "'" + role + "': a point's role is fit or check");
  return role;
}

std::vector<json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path, "", "validation data not found");
  std::vector<json> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty()) out.push_back(parse_json_text(line, path + ":" + std::to_string(n)));
  }
  return out;
}

double metric_from(const std::string& def, const ModelSpec& m, const HardwareSpec& gpu, const Prediction& p) {
  const StepTime& t = p.time;
  const double world = static_cast<double>(p.world), s = static_cast<double>(p.seq);
  const double seqs = static_cast<double>(std::max<int64_t>(1, p.plan.dp) * p.plan.mbs * p.plan.ga);
  const double tokens = seqs * s, l = static_cast<double>(m.layers), h = static_cast<double>(m.hidden);
  if (def == "step_seconds") return t.step_seconds;
  if (def == "tokens_per_s_per_gpu") return t.tokens_per_second / world;
  if (def == "alst_megatron_tflops")  // Megatron-LM's formula: non-causal attention, recompute counted
    return 96.0 * seqs * s * l * h * h * (1.0 + s / (6.0 * h) + static_cast<double>(m.vocab) / (16.0 * l * h)) / (world * t.step_seconds) / 1e12;
  // model FLOPs with non-causal attention (4*s*q_dim forward per token and layer, x3 for training)
  const double noncausal = dense_train_flops_per_token(m) + 12.0 * l * static_cast<double>(q_dim(m)) * s;
  if (def == "nemo_model_tflops") return noncausal * tokens / (world * t.step_seconds) / 1e12;
  if (def == "llmfoundry_mfu")  // 6N + 12*l*d*s per token over 989 TFLOP/s per GPU, in percent
    return 100.0 * (6.0 * static_cast<double>(total_params(m)) + 12.0 * l * h * s) * t.tokens_per_second / (world * 989e12);
  if (def == "torch_max_reserved_gib") {
    // torch.cuda.max_memory_reserved in GiB (torchtitan's logged "memory": DeviceMemoryMonitor
    // max_reserved_gib): the device peak of what PyTorch's caching allocator holds -- every category
    // but NCCL's buffers, which NCCL allocates outside it (framework_memory.hpp)
    double nccl = 0;
    for (int i = 0; i < p.memory.framework.count; ++i)
      if (std::string(p.memory.framework.terms[i].name) == "nccl_buffers") nccl += p.memory.framework.terms[i].bytes;
    return (p.memory.peak.total() - nccl) / (1024.0 * 1024.0 * 1024.0);
  }
  if (def == "nvml_used_gib") {
    // NVML's used memory of the device (pynvml nvmlDeviceGetMemoryInfo(handle).used) in GiB, read
    // after a step (ArcticTraining's per-iteration "NV" figure, arctic_training/debug.py get_nvml_mem,
    // printed by metrics.py for rank 0): everything mapped on the card -- what the caching allocator
    // holds (it keeps its peak segments: no empty_cache in the loop), NCCL's buffers, and the CUDA
    // context the hardware profile leaves out of the usable memory. So the whole predicted peak plus
    // that context.
    return (p.memory.peak.total() + static_cast<double>(gpu.hbm_bytes - gpu.usable_bytes)) / (1024.0 * 1024.0 * 1024.0);
  }
  throw InputError("profiles/validation", "definition",
                   "unknown metric definition '" + def + "' (valid: step_seconds, tokens_per_s_per_gpu, alst_megatron_tflops, "
                   "nemo_model_tflops, llmfoundry_mfu, torch_max_reserved_gib, nvml_used_gib)");
}

bool memory_metric_definition(const std::string& def) { return def == "torch_max_reserved_gib" || def == "nvml_used_gib"; }

double max_seq_error_ratio(double predicted, double ran, double failed) {
  if (failed <= 0 || predicted < ran) return predicted / ran;
  return predicted < failed ? 1.0 : predicted / failed;
}

std::vector<PublishedTimeRow> predict_published_time(const Profiles& profiles, const std::string& only, const std::string& runtime) {
  const std::string file = profiles.dir + "/validation/published_time.jsonl";
  std::vector<PublishedTimeRow> rows;
  for (const json& pt : read_jsonl(file)) {
    JsonReader r(pt, file);
    std::string id = r.string("id");
    check_point_keys(r, id);
    if (!only.empty() && id.find(only) == std::string::npos) continue;
    RuntimeProfile rt = resolve_runtime(profiles, r.string("runtime"));
    if (!runtime.empty() && rt.name != runtime) continue;
    ModelSpec m = resolve_model(profiles, r.string("model"));
    ClusterSpec c = resolve_cluster(profiles, r.string("cluster"));
    // the attention implementation, where the point's source states it (quoted in attention_source):
    // the same input as --attention; otherwise the runtime's default
    if (r.has("attention")) {
      if (r.string_or("attention_source", "").empty())
        r.fail("attention_source", "a point's attention must quote where its source states the kernel");
      rt = with_attention(std::move(rt), r.string("attention"), file, id + ": attention");
    }
    Plan plan = parse_plan(r.string("plan"), id + ": plan");
    // TP communication overlap, where the run's configuration states it (quoted in tp_overlap_source): the
    // plan key tp_overlap; otherwise off (Megatron's and NeMo's default)
    if (plan.tp_overlap) r.fail("plan", "tp_overlap belongs in the point's tp_overlap field, with the tp_overlap_source that states it");
    if (r.has("tp_overlap")) {
      if (r.string_or("tp_overlap_source", "").empty())
        r.fail("tp_overlap_source", "a point's tp_overlap must quote where its source's configuration states it");
      plan.tp_overlap = r.boolean_or("tp_overlap", false);
    }
    Prediction p = predict(m, c, rt, plan, r.integer("seq"));
    PublishedTimeRow row;
    row.id = id;
    row.point = r.string_or("point", id);
    row.metric = r.string("metric");
    row.runtime = rt.name;
    row.gpu = c.gpu.name;
    row.attention = p.attention;
    row.role = point_role(r);
    row.plan = plan_to_string(p.plan);
    row.model = m.name;
    row.source_plan = r.string("plan");
    row.gpus = world_size(c);
    row.seq = r.integer("seq");
    row.note = p.memory.fits() ? "" : "predicted not to fit";
    row.published = r.number("published");
    row.predicted = metric_from(r.string("definition"), m, c.gpu, p);
    row.predicted_step_seconds = p.time.step_seconds;
    // every time metric but the step itself is a rate (tokens/s, TFLOP/s, MFU): inversely proportional
    // to the step; a memory metric says nothing about the step
    const double ratio = row.published / row.predicted;
    const std::string def = r.string("definition");
    row.time_metric = !memory_metric_definition(def);
    row.step_log_ratio = !row.time_metric ? 0.0 : def == "step_seconds" ? std::log(ratio) : -std::log(ratio);
    // a calibrated runtime's own fit point: the step its leave-one-out fit predicted (the calibration
    // record's measured step over exp(leave-one-out log ratio)), as this metric
    row.predicted_out_of_sample = row.predicted;
    if (row.time_metric)
      for (const TimeResidual& t : rt.time_residuals)
        if (t.id == row.point && t.measured_step_seconds > 0 && p.time.step_seconds > 0) {
          const double loo_step = t.measured_step_seconds * std::exp(-t.log_ratio);
          row.predicted_out_of_sample = def == "step_seconds" ? row.predicted * loo_step / p.time.step_seconds
                                                               : row.predicted * p.time.step_seconds / loo_step;
          row.leave_one_out = true;
        }
    rows.push_back(row);
  }
  return rows;
}

std::vector<TimeResidual> published_time_residuals(const Profiles& profiles, const std::string& runtime) {
  static std::mutex mu;
  static std::map<std::pair<std::string, std::string>, std::vector<TimeResidual>> cache;  // (profiles dir, runtime)
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(profiles.dir, runtime);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  std::vector<TimeResidual> out;
  std::map<std::string, size_t> at;    // point -> index in out
  std::vector<int> count;
  for (const PublishedTimeRow& row : predict_published_time(profiles, "", runtime)) {
    if (!(row.predicted > 0) || !(row.published > 0) || row.role != "fit" || !row.time_metric) continue;
    auto [it, fresh] = at.try_emplace(row.point, out.size());
    if (fresh) {
      out.push_back({row.point, row.gpu, 0.0});
      count.push_back(0);
    }
    out[it->second].log_ratio += row.step_log_ratio;
    count[it->second] += 1;
  }
  for (size_t i = 0; i < out.size(); ++i) out[i].log_ratio /= count[i];
  cache[key] = out;
  return out;
}

RuntimeProfile with_time_residuals(const Profiles& profiles, RuntimeProfile rt) {
  if (rt.time_residuals.empty()) rt.time_residuals = published_time_residuals(profiles, rt.name);
  return rt;
}

}  // namespace ctx
