// DeepSpeed config JSON and ArcticTraining (ALST) YAML <-> a ctxplan job.
//
// Sources: DeepSpeed's configuration reference (deepspeed.ai/docs/config-json, DeepSpeed 0.17:
// train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel
// ranks; zero_optimization.stage, offload_optimizer.device, offload_param.device; bf16/fp16;
// activation_checkpointing.cpu_checkpointing) and ArcticTraining's arctic_training/config/trainer.py
// (micro_batch_size, gradient_accumulation_steps, sequence_parallel_size,
// activation_checkpoint_cpu_offload, tiled_mlp_compute, deepspeed; ZeRO stage 2 when the YAML gives
// no zero_optimization) and model.py (type liger, disable_activation_checkpoint), as used by the ALST
// recipes in projects/sequence-parallelism/*.yml. The mapping tables are docs/STACKS.md "DeepSpeed"
// and "ArcticTraining". YAML is read with yaml-cpp (Debian libyaml-cpp-dev).
#include <algorithm>
#include <sstream>
#if CTXPLAN_HAVE_YAML
#include <yaml-cpp/yaml.h>
#endif

#include "costmodel/errors.hpp"
#include "costmodel/json_util.hpp"
#include "planner/stacks.hpp"

namespace ctx {
namespace {

using stacks::join;

// Tracks which keys of a JSON object tree were read; the rest are reported.
class Keys {
 public:
  explicit Keys(std::string where) : where_(std::move(where)) {}
  const json* get(const json& obj, const std::string& path, const std::string& key) {
    used_.push_back(path.empty() ? key : path + "." + key);
    if (!obj.is_object() || !obj.contains(key) || obj.at(key).is_null()) return nullptr;
    return &obj.at(key);
  }
  void use(const std::string& full) { used_.push_back(full); }
  int64_t integer(const json& obj, const std::string& path, const std::string& key, int64_t fallback, int64_t lo, bool* is_auto = nullptr) {
    const json* v = get(obj, path, key);
    if (!v) return fallback;
    if (v->is_string() && v->get<std::string>() == "auto") {
      if (is_auto) *is_auto = true;
      return fallback;
    }
    int64_t n = 0;
    bool ok = v->is_number_integer() ? (n = v->get<int64_t>(), true)
              : v->is_number()       ? stacks::parse_whole(v->dump(), &n)
              : v->is_string()       ? stacks::parse_whole(v->get<std::string>(), &n)
                                     : false;
    // batches and degrees at most 2^20; train_batch_size and max_length at most 2^34
    const int64_t hi = key == "train_batch_size" || key == "max_length" ? int64_t(1) << 34 : int64_t(1) << 20;
    if (!ok || n < lo || n > hi)
      throw InputError(where_, name(path, key),
                       "expected an integer in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " + json_excerpt(*v));
    return n;
  }
  bool boolean(const json& obj, const std::string& path, const std::string& key, bool fallback) {
    const json* v = get(obj, path, key);
    if (!v) return fallback;
    if (!v->is_boolean()) throw InputError(where_, name(path, key), "expected true or false, got " + json_excerpt(*v));
    return v->get<bool>();
  }
  std::string str(const json& obj, const std::string& path, const std::string& key, const std::string& fallback) {
    const json* v = get(obj, path, key);
    if (!v) return fallback;
    if (!v->is_string()) throw InputError(where_, name(path, key), "expected a string, got " + json_excerpt(*v));
    return v->get<std::string>();
  }
  // Every leaf not read, "path = value"; `no_effect` decides which list it goes to.
  void unread(const json& obj, const std::string& path, std::vector<std::string>& not_modelled,
              std::vector<std::string>& ignored, bool (*no_effect)(const std::string&)) const {
    if (!obj.is_object()) return;
    for (auto& [k, v] : obj.items()) {
      const std::string full = path.empty() ? k : path + "." + k;
      if (v.is_object() && !v.empty()) {  // a section: its keys are reported one by one
        unread(v, full, not_modelled, ignored, no_effect);
        continue;
      }
      if (std::find(used_.begin(), used_.end(), full) != used_.end()) continue;
      (no_effect(full) ? ignored : not_modelled).push_back(full + " = " + json_excerpt(v));
    }
  }
  const std::string& where() const { return where_; }
  static std::string name(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

 private:
  std::string where_;
  std::vector<std::string> used_;
};

bool prefix_of(const std::string& full, std::initializer_list<const char*> prefixes) {
  for (const char* p : prefixes)
    if (full.rfind(p, 0) == 0) return true;
  return false;
}

bool deepspeed_no_effect(const std::string& k) {
  // strip an "deepspeed." prefix (the ArcticTraining YAML nests the config)
  const std::string s = k.rfind("deepspeed.", 0) == 0 ? k.substr(10) : k;
  return prefix_of(s, {"optimizer", "scheduler", "gradient_clipping", "steps_per_print", "wall_clock_breakdown",
                       "prescale_gradients", "dump_state", "tensorboard", "wandb", "csv_monitor", "comms_logger",
                       "flops_profiler", "checkpoint", "data_types", "seed"});
}

// The DeepSpeed config proper (a ds_config.json, or the `deepspeed:` section of an Arctic YAML).
void read_deepspeed(const json& ds, const std::string& path, Keys& k, StackJob& job, int default_stage) {
  Plan& p = job.plan;
  const json* zo = k.get(ds, path, "zero_optimization");
  const std::string zpath = Keys::name(path, "zero_optimization");
  p.zero = default_stage;
  if (zo) {
    p.zero = static_cast<int>(k.integer(*zo, zpath, "stage", 0, 0));
    if (p.zero > 3) throw InputError(k.where(), zpath + ".stage", "expected 0, 1, 2 or 3");
    // MiCS (deepspeed/runtime/zero/mics.py): ZeRO-3 states sharded within groups of this many ranks,
    // replicated across them: HSDP, plan key zero_shard (plan_check asks it to divide dp x cp)
    if (const int64_t mics = k.integer(*zo, zpath, "mics_shard_size", -1, -1); mics > 0) {
      if (p.zero != 3)
        throw InputError(k.where(), zpath + ".mics_shard_size", "MiCS shards ZeRO-3 states; valid: stage 3, or -1 (off)");
      p.zero_shard = mics;
      k.use(zpath + ".mics_hierarchical_params_gather");
    }
    for (const char* off : {"offload_optimizer", "offload_param"}) {
      const json* o = k.get(*zo, zpath, off);
      if (!o) continue;
      const std::string opath = zpath + "." + off;
      const std::string dev = k.str(*o, opath, "device", "none");
      bool on = dev == "cpu" || dev == "nvme";
      if (dev != "cpu" && dev != "nvme" && dev != "none")
        throw InputError(k.where(), opath + ".device", "unknown value '" + dev + "'; valid: none, cpu, nvme");
      if (dev == "nvme") job.warnings.push_back(opath + ".device = nvme: modelled as host (cpu) memory; NVMe bandwidth is not modelled");
      k.use(opath + ".pin_memory");
      if (std::string(off) == "offload_optimizer") p.opt_offload = on;
      else p.param_offload = on;
    }
    if (p.param_offload && p.zero != 3)
      throw InputError(k.where(), zpath + ".offload_param", "parameter offload needs ZeRO stage 3; valid: stage 3, or device none");
  }
  bool bf16 = false, fp16 = false;
  for (const char* key : {"bf16", "bfloat16"})
    if (const json* b = k.get(ds, path, key)) bf16 = bf16 || k.boolean(*b, Keys::name(path, key), "enabled", false);
  if (const json* f = k.get(ds, path, "fp16")) {
    fp16 = k.boolean(*f, Keys::name(path, "fp16"), "enabled", false);
    for (const char* s : {"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale"})
      k.use(Keys::name(path, "fp16") + "." + s);
  }
  p.precision = bf16 || fp16 ? Precision::bf16 : Precision::fp32;
  if (fp16) job.warnings.push_back("fp16: modelled as precision=bf16 (the same bytes; loss scaling is not modelled)");
  if (const json* ac = k.get(ds, path, "activation_checkpointing")) {
    const std::string apath = Keys::name(path, "activation_checkpointing");
    if (k.boolean(*ac, apath, "cpu_checkpointing", false)) {
      p.recompute = Recompute::full;
      p.ckpt_offload = true;
      job.warnings.push_back(apath + ".cpu_checkpointing: modelled as recompute=full,ckpt_offload=1 (it applies where the "
                             "model checkpoints through deepspeed.checkpointing)");
    }
    if (k.boolean(*ac, apath, "partition_activations", false))
      job.warnings.push_back(apath + ".partition_activations: splitting checkpoints over model-parallel ranks is not modelled");
    for (const char* s : {"contiguous_memory_optimization", "number_checkpoints", "synchronize_checkpoint_boundary", "profile"})
      k.use(apath + "." + s);
  }
}

#if CTXPLAN_HAVE_YAML
// YAML -> JSON (maps, sequences, scalars typed the way YAML 1.1 loaders (PyYAML) type them).
json yaml_to_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      json j = json::object();
      for (auto it = n.begin(); it != n.end(); ++it) j[it->first.as<std::string>()] = yaml_to_json(it->second);
      return j;
    }
    case YAML::NodeType::Sequence: {
      json j = json::array();
      for (auto it = n.begin(); it != n.end(); ++it) j.push_back(yaml_to_json(*it));
      return j;
    }
    case YAML::NodeType::Scalar: {
      const std::string s = n.Scalar();
      if (n.Tag() == "!") return s;  // quoted
      if (s == "true" || s == "True" || s == "yes") return true;
      if (s == "false" || s == "False" || s == "no") return false;
      if (s == "null" || s == "~") return nullptr;
      int64_t v = 0;
      if (s.find_first_not_of("0123456789_+-") == std::string::npos && stacks::parse_whole(s, &v)) return v;
      try {
        size_t used = 0;
        double d = std::stod(s, &used);
        if (used == s.size()) return d;
      } catch (const std::exception&) {
      }
      return s;
    }
    default: return nullptr;
  }
}
#endif

}  // namespace

StackJob import_deepspeed(const std::string& text, const std::string& where, const Profiles& profiles, const ImportOptions& o) {
  (void)profiles;
  json ds = parse_json_text(text, where);
  if (!ds.is_object()) throw InputError(where, "", "expected a DeepSpeed config object");
  StackJob job;
  job.runtime = "hf-deepspeed";
  job.world = o.world;
  job.model = o.model;
  Keys k(where);
  read_deepspeed(ds, "", k, job, 0);
  Plan& p = job.plan;
  bool mbs_auto = false, ga_auto = false, tbs_auto = false;
  const bool has_mbs = k.get(ds, "", "train_micro_batch_size_per_gpu") != nullptr;
  const bool has_ga = k.get(ds, "", "gradient_accumulation_steps") != nullptr;
  const bool has_tbs = k.get(ds, "", "train_batch_size") != nullptr;
  p.mbs = k.integer(ds, "", "train_micro_batch_size_per_gpu", 1, 1, &mbs_auto);
  p.ga = k.integer(ds, "", "gradient_accumulation_steps", 1, 1, &ga_auto);
  const int64_t tbs = k.integer(ds, "", "train_batch_size", 0, 1, &tbs_auto);
  if (mbs_auto || ga_auto)
    job.warnings.push_back("\"auto\" batch sizes come from the Hugging Face TrainingArguments; imported as mbs=" +
                           std::to_string(p.mbs) + ", ga=" + std::to_string(p.ga) + " (set them with `ctxplan import --set`)");
  // DeepSpeed: train_batch_size = micro x accumulation x data-parallel ranks (any two give the third)
  if (has_tbs && !tbs_auto) {
    if (!has_ga || ga_auto) {
      if (job.world > 0) p.ga = stacks::accumulation_from_global(tbs, p.mbs, job.world, where, "train_batch_size");
      else if (tbs % p.mbs == 0 && has_mbs) {
        p.dp = tbs / p.mbs;
        job.warnings.push_back("gradient_accumulation_steps not given and no GPU count: read as 1, so train_batch_size " +
                               std::to_string(tbs) + " = " + std::to_string(p.dp) + " data-parallel ranks (give "
                               "`ctxplan import --cluster` to derive the accumulation instead)");
      }
    } else if (tbs % (p.mbs * p.ga) != 0) {
      throw InputError(where, "train_batch_size", std::to_string(tbs) + " is not micro batch x accumulation x ranks");
    } else {
      p.dp = tbs / (p.mbs * p.ga);
    }
  }
  if (job.world > 0) {
    if (p.dp > 0 && p.dp != job.world)
      throw InputError(where, "train_batch_size",
                       std::to_string(tbs) + " = " + std::to_string(p.mbs) + " x " + std::to_string(p.ga) + " x " +
                           std::to_string(p.dp) + " ranks, but the job has " + std::to_string(job.world) + " GPUs");
    p.dp = job.world;
  }
  job.warnings.push_back("recompute: a DeepSpeed config does not say whether the model checkpoints activations (the HF "
                         "Trainer's --gradient_checkpointing does); imported as recompute=" +
                         std::string(to_string(p.recompute)) + " (override with `ctxplan import --set recompute=full`)");
  std::vector<std::string> unread;
  k.unread(ds, "", unread, job.ignored, deepspeed_no_effect);
  for (const std::string& u : unread) job.warnings.push_back(u + ": not modelled (ignored)");
  return job;
}

StackJob import_arctic(const std::string& text, const std::string& where, const Profiles& profiles, const ImportOptions& o) {
  json y;
#if !CTXPLAN_HAVE_YAML
  (void)text;
  throw InputError(where, "", "this ctxplan was built without yaml-cpp, so it cannot read ArcticTraining YAML; install "
                              "libyaml-cpp-dev (scripts/setup.sh) and rebuild");
#else
  // yaml-cpp and the conversion recurse per nesting level: a trainer config is small and shallow
  if (text.size() > (size_t(1) << 20)) throw InputError(where, "", "larger than 1 MiB; expected an ArcticTraining config");
  {
    int depth = 0, line = 1;
    size_t indent = 0;
    bool at_line_start = true;
    for (char c : text) {
      if (c == '\n') {
        ++line;
        indent = 0;
        at_line_start = true;
        continue;
      }
      if (at_line_start && c == ' ') ++indent;
      else at_line_start = false;
      if (c == '[' || c == '{') ++depth;
      if (c == ']' || c == '}') --depth;
      if (depth > 32 || indent > 128)
        throw InputError(where, "", "nesting deeper than a trainer config has (line " + std::to_string(line) +
                                        "); expected at most 32 levels and 128 spaces of indentation");
    }
  }
  try {
    y = yaml_to_json(YAML::Load(text));
  } catch (const YAML::Exception& e) {
    throw InputError(where, "", "malformed YAML at line " + std::to_string(e.mark.line + 1) + ", column " +
                                    std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
#endif
  if (!y.is_object()) throw InputError(where, "", "expected an ArcticTraining config (a YAML mapping)");
  StackJob job;
  job.runtime = "hf-deepspeed";
  job.world = o.world;
  Keys k(where);
  Plan& p = job.plan;
  const std::string type = k.str(y, "", "type", "sft");
  if (type != "sft") job.warnings.push_back("type = " + type + ": the step is modelled as SFT (one forward and backward)");
  const json* ds = k.get(y, "", "deepspeed");
  const json no_ds = json::object();
  read_deepspeed(ds ? *ds : no_ds, "deepspeed", k, job, 2);  // trainer.py: stage 2 without zero_optimization
  for (const char* overwritten : {"train_micro_batch_size_per_gpu", "train_batch_size", "gradient_accumulation_steps"})
    if (ds && ds->contains(overwritten))
      job.warnings.push_back(std::string("deepspeed.") + overwritten +
                             ": ArcticTraining overwrites it from micro_batch_size and gradient_accumulation_steps");
  p.mbs = k.integer(y, "", "micro_batch_size", 1, 1);
  p.ga = k.integer(y, "", "gradient_accumulation_steps", 1, 1);
  p.cp = k.integer(y, "", "sequence_parallel_size", 1, 1);
  set_cp_kind(p, p.cp > 1 ? CpKind::ulysses : CpKind::zigzag);  // UlyssesSPAttentionHF: all-to-all over heads
  const json* model = k.get(y, "", "model");
  const json m = model ? *model : json::object();
  const bool no_ckpt = k.boolean(m, "model", "disable_activation_checkpoint", false);
  p.recompute = no_ckpt ? Recompute::none : Recompute::full;  // HF gradient checkpointing: every decoder layer
  if (k.boolean(y, "", "activation_checkpoint_cpu_offload", false)) {
    if (no_ckpt)
      throw InputError(where, "activation_checkpoint_cpu_offload",
                       "offloads activation checkpoints, but model.disable_activation_checkpoint is true; valid: one of them");
    p.ckpt_offload = true;
  }
  if (k.boolean(y, "", "tiled_mlp_compute", false)) p.tiled_mlp = -1;  // ALST TiledMLP: ceil(tokens / hidden) shards
  const std::string mtype = k.str(m, "model", "type", "");
  if (mtype == "liger" || k.boolean(m, "model", "use_liger_kernel", false)) {
    p.tiled_loss = 4096;  // Liger fused linear cross-entropy, priced as 4096-token tiles (profiles/validation/alst_maxseq.jsonl)
    job.warnings.push_back("model.type liger: Liger's fused linear cross-entropy is modelled as tiled_loss=4096");
  } else if (!mtype.empty() && mtype != "hf" && mtype != "huggingface") {
    job.warnings.push_back("model.type = " + mtype + ": modelled as a Hugging Face transformers model");
  }
  // trainer.py adds deepspeed bfloat16 from model.dtype (default bf16): the model's dtype decides
  const std::string dtype = k.str(m, "model", "dtype", "bf16");
  if (dtype == "fp32" || dtype == "float32") p.precision = Precision::fp32;
  else p.precision = Precision::bf16;
  if (dtype != "fp32" && dtype != "float32" && dtype != "bf16" && dtype != "bfloat16")
    job.warnings.push_back("model.dtype = " + dtype + ": modelled as bf16");
  k.use("model.attn_implementation");
  if (m.contains("attn_implementation") && m["attn_implementation"] != "flash_attention_2")
    job.warnings.push_back("model.attn_implementation = " + json_excerpt(m["attn_implementation"]) +
                           ": the hf-deepspeed runtime prices flash_attention_2");
  if (!o.model.empty()) {
    job.model = o.model;
    k.use("model.name_or_path");
  } else {
    const std::string id = k.str(m, "model", "name_or_path", "");
    if (id.empty()) throw InputError(where, "model.name_or_path", "missing: the model to train (a Hugging Face id or path)");
    job.model = stacks::resolve_model_name(profiles, id, where, "model.name_or_path");
  }
  const json* data = k.get(y, "", "data");
  if (data) job.seq = k.integer(*data, "data", "max_length", 0, 1);
  if (job.seq == 0) job.warnings.push_back("data.max_length not given: the plan file carries no sequence length");
  if (job.world > 0) {
    if (job.world % p.cp != 0)
      throw InputError(where, "sequence_parallel_size", std::to_string(p.cp) + " does not divide the " + std::to_string(job.world) + " GPUs");
    p.dp = job.world / p.cp;
  }
  std::vector<std::string> unread;
  auto no_effect = [](const std::string& s) {
    return deepspeed_no_effect(s) || prefix_of(s, {"optimizer", "scheduler", "wandb", "logger", "checkpoint", "data.",
                                                   "tokenizer", "exit_iteration", "min_iterations", "epochs", "seed",
                                                   "train_iters", "eval_", "loss_log_interval", "code", "skip_validation",
                                                   "train_log_iter_interval", "kill_switch_path", "overfit_first_batch",
                                                   "mem_profiler"});
  };
  k.unread(y, "", unread, job.ignored, no_effect);
  for (const std::string& u : unread) job.warnings.push_back(u + ": not modelled (ignored)");
  return job;
}

namespace {
std::string ds_json(const Plan& p, bool with_batch, StackExport& e) {
  json ds;
  if (with_batch) {
    ds["train_micro_batch_size_per_gpu"] = p.mbs;
    ds["gradient_accumulation_steps"] = p.ga;
    ds["train_batch_size"] = p.mbs * p.ga * p.dp;
  }
  json zo = {{"stage", p.zero}};
  if (p.opt_offload) zo["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (p.param_offload) zo["offload_param"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (p.zero == 3 && zero_replicate_degree(p) > 1) zo["mics_shard_size"] = zero_shard_degree(p);
  if (p.zero >= 1 && p.zero < 3 && zero_replicate_degree(p) > 1)
    e.cannot_express.push_back("zero_shard=" + std::to_string(p.zero_shard) + " with zero=" + std::to_string(p.zero) +
                               ": DeepSpeed's partial sharding (MiCS, mics_shard_size) is ZeRO-3 only; written over all ranks");
  if (p.param_offload && p.zero != 3) e.cannot_express.push_back("param_offload=1 needs zero=3 in DeepSpeed");
  if (p.pp > 1)  // DeepSpeed pipelines only a PipelineModule (deepspeed.pipe), not the Hugging Face model this config trains
    e.cannot_express.push_back("pp=" + std::to_string(p.pp) + ": DeepSpeed's pipeline engine needs the model written as a "
                               "PipelineModule; written without pipeline stages (use megatron)");
  ds["zero_optimization"] = zo;
  if (p.precision != Precision::fp32) ds["bf16"] = {{"enabled", true}};
  if (p.precision == Precision::fp8)
    e.cannot_express.push_back("precision=fp8: DeepSpeed's config has no fp8 GEMMs (TransformerEngine is set up in the model); written as bf16");
  return ds.dump(2);
}
}  // namespace

StackExport export_deepspeed(const ExportJob& job, const Profiles& profiles) {
  (void)profiles;
  // Every GPU of a DeepSpeed config is a data-parallel rank (train_batch_size counts them all).
  Plan p = job.plan;
  p.dp = job.plan.dp * job.plan.tp * job.plan.cp;
  StackExport e;
  e.default_file = "ds_config.json";
  std::string text = ds_json(p, true, e);
  json ds = json::parse(text);
  if (p.recompute == Recompute::full && p.ckpt_offload) {
    ds["activation_checkpointing"] = {{"cpu_checkpointing", true}, {"partition_activations", false}};
    e.notes.push_back("ckpt_offload=1 written as activation_checkpointing.cpu_checkpointing (used where the model "
                      "checkpoints through deepspeed.checkpointing, as Megatron-DeepSpeed does)");
  } else if (p.recompute != Recompute::none) {
    e.cannot_express.push_back(std::string("recompute=") + to_string(p.recompute) +
                               ": not a DeepSpeed config key; the launch line passes --gradient_checkpointing to the HF Trainer");
  }
  if (p.ckpt_offload && p.recompute != Recompute::full) e.cannot_express.push_back("ckpt_offload=1 needs recompute=full");
  if (p.tp > 1)
    e.cannot_express.push_back("tp=" + std::to_string(p.tp) + ": the DeepSpeed config has no tensor parallel (use megatron); "
                               "written with every GPU data parallel");
  if (p.cp > 1)
    e.cannot_express.push_back("cp=" + std::to_string(p.cp) + ": the DeepSpeed config has no sequence parallel degree (use "
                               "arctic for Ulysses); written with every GPU data parallel");
  if (p.tiled_loss != 0 || (p.tiled_mlp != 0 && p.tiled_mlp != 1))
    e.cannot_express.push_back("tiled_loss/tiled_mlp: set up in the training script (ALST: use arctic)");
  if (p.mask == MaskKind::document) e.cannot_express.push_back("mask=" + mask_to_string(p) + ": document masking comes from your data");
  if (p.sorted_packing) e.cannot_express.push_back("packing=sorted: not a DeepSpeed option");
  e.text = ds.dump(2) + "\n";
  std::ostringstream launch;
  launch << "deepspeed --num_nodes " << job.nodes << " --num_gpus " << job.gpus_per_node;
  if (job.nodes > 1) launch << " --hostfile hostfile";
  launch << " train.py --deepspeed " << e.default_file << " --per_device_train_batch_size " << p.mbs
         << " --gradient_accumulation_steps " << p.ga << (p.recompute != Recompute::none ? " --gradient_checkpointing" : "")
         << (p.precision != Precision::fp32 ? " --bf16" : "") << " --model_name_or_path "
         << (stacks::hf_repo_for(job.model.name).empty() ? job.model_arg : stacks::hf_repo_for(job.model.name));
  e.launch = launch.str();
  return e;
}

StackExport export_arctic(const ExportJob& job, const Profiles& profiles) {
  (void)profiles;
  const Plan& p = job.plan;
  StackExport e;
  e.default_file = "arctic_job.yml";
  if (p.cp > 1 && p.cp_comm != CpComm::a2a)
    e.cannot_express.push_back(std::string("cp_kind=") + to_string(cp_kind_of(p)) +
                               ": ArcticTraining's sequence parallelism is Ulysses (all-to-all); written as cp_kind=ulysses");
  if (p.tp > 1) e.cannot_express.push_back("tp=" + std::to_string(p.tp) + ": ArcticTraining has no tensor parallel; written as tp=1");
  if (p.pp > 1) e.cannot_express.push_back("pp=" + std::to_string(p.pp) + ": ArcticTraining has no pipeline parallel; written as pp=1");
  if (p.recompute == Recompute::selective)
    e.cannot_express.push_back("recompute=selective: HF gradient checkpointing is per layer; written as recompute=full");
  if (p.tiled_loss != 0 && p.tiled_loss != 4096)
    e.notes.push_back("tiled_loss=" + (p.tiled_loss < 0 ? std::string("auto") : std::to_string(p.tiled_loss)) + " written as Liger's fused loss (model.type liger), "
                      "which ctxplan prices as 4096-token tiles");
  if (p.tiled_mlp > 1) e.notes.push_back("tiled_mlp=" + std::to_string(p.tiled_mlp) + ": ALST's TiledMLP picks ceil(tokens/hidden) shards (tiled_mlp=auto)");
  if (p.mask == MaskKind::document) e.cannot_express.push_back("mask=" + mask_to_string(p) + ": document masking comes from your data (packed samples)");
  if (p.sorted_packing) e.cannot_express.push_back("packing=sorted: not an ArcticTraining option");
  if (p.precision == Precision::fp8) e.cannot_express.push_back("precision=fp8: not an ArcticTraining option; written as bf16");
  if (p.order[0] != Dim::tp || order_to_string(p) != "tp-cp-dp")
    e.cannot_express.push_back("order=" + order_to_string(p) + ": ArcticTraining places the sequence-parallel ranks innermost");
  std::string repo = stacks::hf_repo_for(job.model.name);
  if (repo.empty()) repo = job.model_arg;
  json ds = json::parse(ds_json(p, false, e));
  std::ostringstream os;
  os << "# ArcticTraining (ALST) config written by `ctxplan export arctic` (arctic_training/config/trainer.py, ALST recipes "
        "projects/sequence-parallelism; mapping in docs/STACKS.md)\n";
  os << "# job: " << job.model_arg << ", seq " << job.seq << " tokens, " << job.nodes << " node(s) x " << job.gpus_per_node
     << " GPUs; plan " << plan_to_string(p) << "\n";
  std::ostringstream launch;
  launch << "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True arctic_training " << e.default_file;
  if (job.nodes > 1) launch << " -H /etc/hostfile";
  else launch << " --num_gpus " << job.gpus_per_node;
  e.launch = launch.str();
  os << "# launch: " << e.launch << "\n";
  for (const auto& n : e.notes) os << "# note: " << n << "\n";
  for (const auto& c : e.cannot_express) os << "# cannot express: " << c << "\n";
  os << "type: sft\n";
  os << "micro_batch_size: " << p.mbs << "\n";
  os << "gradient_accumulation_steps: " << p.ga << "\n";
  os << "sequence_parallel_size: " << p.cp << "\n";
  os << "activation_checkpoint_cpu_offload: " << (p.ckpt_offload ? "true" : "false") << "\n";
  os << "tiled_mlp_compute: " << (p.tiled_mlp != 0 && p.tiled_mlp != 1 ? "true" : "false") << "\n";
  os << "deepspeed:\n  zero_optimization:\n    stage: " << p.zero << "\n";
  if (p.opt_offload) os << "    offload_optimizer:\n      device: cpu\n";
  if (p.param_offload) os << "    offload_param:\n      device: cpu\n";
  if (p.precision == Precision::fp32) os << "model:\n  dtype: fp32\n";
  else os << "  bf16:\n    enabled: true\nmodel:\n";
  (void)ds;
  if (p.tiled_loss != 0) os << "  type: liger\n";
  os << "  name_or_path: " << repo << "\n";
  os << "  attn_implementation: flash_attention_2\n";
  if (p.recompute == Recompute::none) os << "  disable_activation_checkpoint: true\n";
  os << "data:\n  max_length: " << job.seq << "\n";
  e.text = os.str();
  return e;
}

}  // namespace ctx
