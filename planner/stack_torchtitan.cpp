// torchtitan job TOML <-> a ctxplan job.
//
// Source: torchtitan torchtitan/config/job_config.py (commit 000204a4, mid-2025: [training]
// local_batch_size / global_batch_size / seq_len / enable_cpu_offload / mixed_precision_param,
// [parallelism] data_parallel_replicate_degree / data_parallel_shard_degree (-1 = the leftover
// ranks) / fsdp_reshard_after_forward / tensor_parallel_degree / context_parallel_degree /
// context_parallel_rotate_method / pipeline_parallel_degree / _schedule / _microbatch_size,
// [activation_checkpoint] mode / selective_ac_option, [model] name / flavor / converters), the stage
// split of torchtitan/distributed/pipeline.py, and the llama3 / qwen3 flavors in
// torchtitan/models/*/__init__.py. The
// mapping table is docs/STACKS.md "torchtitan". Read with toml++ (Debian libtomlplusplus-dev).
#include <algorithm>
#include <sstream>
#if CTXPLAN_HAVE_TOML
#include <toml++/toml.h>
#endif

#include "costmodel/errors.hpp"
#include "costmodel/pipeline_stages.hpp"
#include "costmodel/profile_store.hpp"
#include "planner/stacks.hpp"

namespace ctx {
namespace {

using stacks::join;

// torchtitan model flavors that are ctxplan model profiles.
const std::vector<std::tuple<std::string, std::string, std::string>>& flavors() {
  static const std::vector<std::tuple<std::string, std::string, std::string>> t = {
      {"llama3", "8B", "Llama-3.1-8B"},  {"llama3", "70B", "Llama-3.1-70B"}, {"llama3", "405B", "Llama-3.1-405B"},
      {"qwen3", "4B", "Qwen3-4B"},       {"qwen3", "32B", "Qwen3-32B"},
  };
  return t;
}

// Sections whose keys change nothing ctxplan predicts.
bool ignored_section(const std::string& s) {
  static const char* names[] = {"job", "profiling", "metrics", "optimizer", "lr_scheduler", "checkpoint", "comm",
                                "validation", "fault_tolerance", "experimental", "memory_estimation"};
  return std::find(std::begin(names), std::end(names), s) != std::end(names);
}

// torchtitan's split of `layers` over `stages` virtual pipeline stages (torchtitan
// torchtitan/distributed/pipeline.py generate_module_names_per_stage, read at 0ab23071, with its
// defaults input_weight = output_weight = 1): the embedding and the final norm + output weigh one
// layer each; every stage gets (layers + 2) / stages effective layers, the first (layers + 2) %
// stages stages one more, and stage 0 (stages - 1) builds one transformer layer fewer for the
// embedding (the output). One stage builds everything. Empty when a stage would get no layer.
std::vector<int64_t> torchtitan_stage_layers(int64_t layers, int64_t stages) {
  if (stages <= 1) return {layers};
  const int64_t effective = layers + 2, per = effective / stages, extra = effective % stages;
  if (per < 1) return {};
  std::vector<int64_t> out;
  int64_t left = layers;
  for (int64_t s = 0; s < stages; ++s) {
    int64_t n = per + (s < extra ? 1 : 0) - (s == 0 || s == stages - 1 ? 1 : 0);
    n = std::min(std::max<int64_t>(n, 0), left);
    left -= n;
    out.push_back(n);
  }
  for (int64_t n : out)
    if (n < 1) return {};
  return out;
}

// The plan keys (pp_embed / pp_loss, pp_first / pp_last, or none) whose split is torchtitan's for
// plan p's pp and vpp; false when none gives it.
bool express_torchtitan_split(int64_t layers, Plan& p) {
  const std::vector<int64_t> want = torchtitan_stage_layers(layers, p.pp * p.vpp);
  if (want.empty()) return false;
  Plan even = p, embed_loss = p, first_last = p;
  even.pp_embed = even.pp_loss = false;
  even.pp_first = even.pp_last = 0;
  embed_loss = even;
  embed_loss.pp_embed = embed_loss.pp_loss = true;  // Megatron's account-for-embedding/loss rule
  first_last = even;
  first_last.pp_first = want.front() * p.vpp;       // exact for one chunk per stage (vpp = 1)
  first_last.pp_last = want.back() * p.vpp;
  for (const Plan* t : {&even, &embed_loss, &first_last}) {
    if (!pipeline_split_error(layers, *t).empty() || pipeline_chunk_layers(layers, *t) != want) continue;
    p = *t;
    return true;
  }
  return false;
}

#if CTXPLAN_HAVE_TOML
class TomlJob {
 public:
  TomlJob(const std::string& text, const std::string& where) : where_(where) {
    try {
      root_ = toml::parse(text, where);
    } catch (const toml::parse_error& e) {
      throw InputError(where, "",
                       "malformed TOML at line " + std::to_string(e.source().begin.line) + ", column " +
                           std::to_string(e.source().begin.column) + ": " + std::string(e.description()));
    }
    for (auto&& [k, v] : root_)
      if (!v.is_table())
        throw InputError(where, std::string(k.str()), "a top-level key outside a [section]; torchtitan's keys live in sections");
  }

  const toml::node* node(const std::string& sec, const std::string& key) {
    used_.push_back(sec + "." + key);
    const toml::table* t = root_[sec].as_table();
    return t ? t->get(key) : nullptr;
  }
  int64_t integer(const std::string& sec, const std::string& key, int64_t fallback, int64_t lo) {
    const toml::node* n = node(sec, key);
    if (!n) return fallback;
    auto v = n->value<int64_t>();
    // degrees and batches at most 2^20; seq_len and global_batch_size at most 2^34
    const int64_t hi = key == "seq_len" || key == "global_batch_size" ? int64_t(1) << 34 : int64_t(1) << 20;
    if (!n->is_integer() || !v || *v < lo || *v > hi)
      throw InputError(where_, sec + "." + key,
                       "expected an integer in " + std::to_string(lo) + ".." + std::to_string(hi));
    return *v;
  }
  std::string str(const std::string& sec, const std::string& key, const std::string& fallback) {
    const toml::node* n = node(sec, key);
    if (!n) return fallback;
    if (n->is_integer()) return std::to_string(*n->value<int64_t>());  // selective_ac_option = 2
    if (!n->is_string()) throw InputError(where_, sec + "." + key, "expected a string");
    return *n->value<std::string>();
  }
  bool boolean(const std::string& sec, const std::string& key, bool fallback) {
    const toml::node* n = node(sec, key);
    if (!n) return fallback;
    if (!n->is_boolean()) throw InputError(where_, sec + "." + key, "expected true or false");
    return *n->value<bool>();
  }
  std::vector<std::string> strings(const std::string& sec, const std::string& key) {
    const toml::node* n = node(sec, key);
    std::vector<std::string> out;
    if (!n) return out;
    if (n->is_string()) {  // "float8,other" (the CLI form) or one name
      std::stringstream ss(*n->value<std::string>());
      std::string item;
      while (std::getline(ss, item, ','))
        if (!item.empty()) out.push_back(item);
      return out;
    }
    const toml::array* a = n->as_array();
    if (!a) throw InputError(where_, sec + "." + key, "expected a list of strings");
    for (auto&& e : *a) {
      if (!e.is_string()) throw InputError(where_, sec + "." + key, "expected a list of strings");
      out.push_back(*e.value<std::string>());
    }
    return out;
  }
  void unread(std::vector<std::string>& not_modelled, std::vector<std::string>& ignored) const {
    for (auto&& [sk, sv] : root_) {
      const std::string sec(sk.str());
      const toml::table* t = sv.as_table();
      for (auto&& [k, v] : *t) {
        const std::string key = sec + "." + std::string(k.str());
        if (std::find(used_.begin(), used_.end(), key) != used_.end()) continue;
        std::ostringstream val;
        v.visit([&](auto&& x) { val << x; });
        (ignored_section(sec) || key == "model.tokenizer_path" || key == "model.hf_assets_path" ||
                 key == "training.dataset" || key == "training.dataset_path" || key == "training.steps" ||
                 key == "training.max_norm" || key == "training.seed" || key == "training.gc_freq"
             ? ignored
             : not_modelled)
            .push_back(key + " = " + stacks::excerpt(val.str()));
      }
    }
  }

 private:
  std::string where_;
  toml::table root_;
  std::vector<std::string> used_;
};

#endif

}  // namespace

StackJob import_torchtitan(const std::string& text, const std::string& where, const Profiles& profiles, const ImportOptions& o) {
#if !CTXPLAN_HAVE_TOML
  (void)text, (void)profiles, (void)o;
  throw InputError(where, "", "this ctxplan was built without toml++, so it cannot read torchtitan TOML; install "
                              "libtomlplusplus-dev (scripts/setup.sh) and rebuild");
#else
  TomlJob t(text, where);
  StackJob job;
  job.runtime = "torchtitan";  // profiles/runtimes/torchtitan.json: FSDP2 mixed precision, SDPA, PyTorch's context_parallel
  job.world = o.world;
  Plan& p = job.plan;

  // ---- model ----
  const std::string name = t.str("model", "name", "llama3"), flavor = t.str("model", "flavor", "debugmodel");
  if (!o.model.empty()) {
    job.model = o.model;
  } else {
    for (auto& [n, f, profile] : flavors())
      if (n == name && f == flavor) job.model = profile;
    if (job.model.empty()) {
      std::vector<std::string> valid;
      for (auto& [n, f, profile] : flavors()) valid.push_back(n + "/" + f);
      throw InputError(where, "model.flavor",
                       "torchtitan model " + name + "/" + flavor + " is not a ctxplan model profile; valid: " + join(valid) +
                           ", or `ctxplan import --model NAME|config.json` to name the model");
    }
  }

  // ---- parallel degrees ----
  p.pp = t.integer("parallelism", "pipeline_parallel_degree", 1, 1);
  if (t.integer("parallelism", "expert_parallel_degree", 1, 1) != 1)
    throw InputError(where, "parallelism.expert_parallel_degree", "mixture of experts is not modelled; valid: 1");
  p.tp = t.integer("parallelism", "tensor_parallel_degree", 1, 1);
  if (p.tp > 1) p.sp = 1;  // torchtitan's TP plan shards norms and residuals along the sequence (SequenceParallel)
  if (t.boolean("parallelism", "enable_async_tensor_parallel", false))
    job.warnings.push_back("parallelism.enable_async_tensor_parallel: the overlap of TP communication is not modelled");
  p.cp = t.integer("parallelism", "context_parallel_degree", 1, 1);
  const std::string rotate = t.str("parallelism", "context_parallel_rotate_method", "allgather");
  // PyTorch's context_parallel load-balances causal attention head-tail by default (docs/CONTEXT_PARALLEL.md)
  if (rotate == "allgather") set_cp_kind(p, CpKind::allgather);
  else if (rotate == "alltoall") set_cp_kind(p, CpKind::zigzag);  // KV shards passed around the ring, head-tail load balanced
  else throw InputError(where, "parallelism.context_parallel_rotate_method", "unknown value '" + rotate + "'; valid: allgather, alltoall");
  if (p.cp == 1) set_cp_kind(p, CpKind::zigzag);
  const int64_t replicate = t.integer("parallelism", "data_parallel_replicate_degree", 1, 1);
  int64_t shard = t.integer("parallelism", "data_parallel_shard_degree", -1, -1);
  if (shard == 0) throw InputError(where, "parallelism.data_parallel_shard_degree", "0; valid: -1 (the leftover ranks) or >= 1");
  if (shard == -1 && job.world > 0) {
    const int64_t other = replicate * p.tp * p.cp * p.pp;
    if (job.world % other != 0)
      throw InputError(where, "parallelism", "replicate x tp x cp = " + std::to_string(other) + " does not divide the " +
                                                 std::to_string(job.world) + " GPUs");
    shard = job.world / other;
  }
  if (shard > 0) {
    p.dp = replicate * shard;
    if (job.world > 0 && p.dp * p.tp * p.cp * p.pp != job.world)
      throw InputError(where, "parallelism",
                       "replicate x shard x tp x cp x pp = " + std::to_string(p.dp * p.tp * p.cp * p.pp) + " but the job has " +
                           std::to_string(job.world) + " GPUs");
  }
  const bool fsdp = shard == -1 || shard * p.cp > 1;  // FSDP shards over the dp_shard x cp mesh
  if (fsdp && replicate > 1) {  // HSDP: FSDP over dp_shard x cp inside each of the replicate groups (outermost mesh dim)
    if (shard < 1)
      throw InputError(where, "parallelism.data_parallel_shard_degree",
                       "-1 with data_parallel_replicate_degree = " + std::to_string(replicate) +
                           " (HSDP) needs the job's GPUs to size the shard group; give the shard degree or `ctxplan import --cluster`");
    p.zero_shard = shard * p.cp;
  }
  const std::string reshard = t.str("parallelism", "fsdp_reshard_after_forward", "default");
  if (reshard != "default" && reshard != "always" && reshard != "never")
    throw InputError(where, "parallelism.fsdp_reshard_after_forward", "unknown value '" + reshard + "'; valid: default, always, never");
  if ((p.pp > 1 || p.tp > 1) && !fsdp && replicate > 1)
    throw InputError(where, "parallelism.data_parallel_replicate_degree",
                     std::to_string(replicate) + " with " + (p.pp > 1 ? "pipeline_parallel_degree = " + std::to_string(p.pp)
                                                                      : "tensor_parallel_degree = " + std::to_string(p.tp)) +
                         ": torchtitan's DDP runs alone (apply_ddp: 'DDP has not supported > 1D parallelism'); valid: 1, or "
                         "data_parallel_shard_degree for FSDP");
  if (fsdp && p.pp > 1) {
    // FSDP2 under torch.distributed.pipelining: torchtitan's "default" policy keeps the stage's
    // parameters unsharded after forward when PP is on (parallelize.py apply_fsdp: reshard_after_forward
    // = not pp_enabled), and PipelineStage.backward_maybe_with_nosync (torch/distributed/pipelining/
    // stage.py) turns off reshard-after-backward and gradient sync for every micro-batch, reducing once
    // after the last (_post_backward): unsharded parameters and gradients through the step, sharded
    // optimizer states, one all-gather and one reduce-scatter per step: ZeRO-1's states and collectives
    if (reshard == "always")
      throw InputError(where, "parallelism.fsdp_reshard_after_forward",
                       "\"always\" with pipeline_parallel_degree = " + std::to_string(p.pp) +
                           ": parameters re-gathered for every micro-batch forward while gradients accumulate unsharded is "
                           "no ZeRO stage ctxplan prices; valid: default, never (both keep the stage unsharded through the step)");
    p.zero = 1;
    job.warnings.push_back("FSDP with pipeline_parallel_degree = " + std::to_string(p.pp) +
                           ": modelled as zero=1 (torchtitan keeps each stage's parameters and gradients unsharded across "
                           "micro-batches and reduce-scatters once per step; optimizer states stay sharded)");
  } else if (fsdp) {
    p.zero = reshard == "never" ? 2 : 3;
    if (reshard == "never")
      job.warnings.push_back("parallelism.fsdp_reshard_after_forward = \"never\": modelled as zero=2 (parameters stay "
                             "gathered from forward to backward; gradients and optimizer states sharded)");
  }

  // ---- batch ----
  p.mbs = t.integer("training", "local_batch_size", 0, 1);
  if (p.mbs == 0) p.mbs = t.integer("training", "batch_size", 8, 1);  // the name before torchtitan 0.1
  else t.node("training", "batch_size");
  job.seq = t.integer("training", "seq_len", 2048, 1);
  const int64_t global = t.integer("training", "global_batch_size", -1, -1);
  if (global > 0) {
    if (p.dp == 0)
      throw InputError(where, "training.global_batch_size",
                       "turning it into gradient accumulation needs the data-parallel size: give "
                       "parallelism.data_parallel_shard_degree or `ctxplan import --cluster`");
    p.ga = stacks::accumulation_from_global(global, p.mbs, p.dp, where, "training.global_batch_size");
  }
  // ---- pipeline schedule (torchtitan/distributed/pipeline.py build_pipeline_schedule) ----
  if (p.pp > 1) {
    const std::string schedule = t.str("parallelism", "pipeline_parallel_schedule", "1F1B");
    if (schedule == "1F1B") p.vpp = 1;
    else if (schedule == "Interleaved1F1B") p.vpp = 2;  // looped schedules: 2 stages per rank by default
    else
      throw InputError(where, "parallelism.pipeline_parallel_schedule",
                       "\"" + schedule + "\" is not a schedule ctxplan prices; valid: 1F1B, Interleaved1F1B");
    if (!t.str("parallelism", "pipeline_parallel_schedule_csv", "").empty())
      throw InputError(where, "parallelism.pipeline_parallel_schedule_csv", "a custom schedule is not modelled; valid: \"\"");
    if (!t.strings("parallelism", "pipeline_parallel_split_points").empty())
      throw InputError(where, "parallelism.pipeline_parallel_split_points",
                       "manual split points are not read; valid: [] (torchtitan's weighted split, which ctxplan reproduces)");
    if (t.integer("parallelism", "pipeline_parallel_layers_per_stage", 0, 0) != 0)
      throw InputError(where, "parallelism.pipeline_parallel_layers_per_stage",
                       "not read (the stage count it gives differs between torchtitan versions); valid: absent (1F1B: one "
                       "stage per rank, Interleaved1F1B: two)");
    // local_batch_size is one schedule step's batch, cut into micro-batches of the pipeline's size
    const int64_t micro = t.integer("parallelism", "pipeline_parallel_microbatch_size", 1, 1);
    if (p.mbs % micro != 0)
      throw InputError(where, "parallelism.pipeline_parallel_microbatch_size",
                       std::to_string(micro) + " does not divide training.local_batch_size = " + std::to_string(p.mbs) +
                           " (torchtitan raises); valid: a divisor of " + std::to_string(p.mbs));
    p.ga *= p.mbs / micro;
    p.mbs = micro;
    const ModelSpec m = resolve_model(profiles, job.model);
    if (!express_torchtitan_split(m.layers, p)) {
      const std::vector<int64_t> split = torchtitan_stage_layers(m.layers, p.pp * p.vpp);
      std::string layers;
      for (int64_t n : split) layers += (layers.empty() ? "" : ", ") + std::to_string(n);
      if (split.empty() || m.layers % (p.pp * p.vpp) != 0)
        throw InputError(where, "parallelism.pipeline_parallel_degree",
                         std::to_string(p.pp) + (p.vpp > 1 ? " x 2 stages per rank" : "") + " over " + std::to_string(m.layers) +
                             " layers: torchtitan's split (" + (layers.empty() ? "a stage without layers" : layers) +
                             ") is no split ctxplan prices (even, pp_first/pp_last, pp_embed/pp_loss); valid: a degree "
                             "whose split is one of those");
      job.warnings.push_back("pipeline split: torchtitan builds " + layers + " layers per virtual stage (embedding and output "
                             "weigh one layer each); priced as the even split of " + std::to_string(m.layers / (p.pp * p.vpp)));
    }
  }
  if (t.boolean("training", "enable_cpu_offload", false)) {
    if (!fsdp) throw InputError(where, "training.enable_cpu_offload", "FSDP's CPU offload needs FSDP (data_parallel_shard_degree or cp > 1)");
    p.param_offload = p.opt_offload = true;  // FSDP2 CPUOffloadPolicy: parameters, gradients and optimizer states
  }
  const std::string mp = t.str("training", "mixed_precision_param", "bfloat16");
  if (mp == "bfloat16") p.precision = Precision::bf16;
  else if (mp == "float32") p.precision = Precision::fp32;
  else throw InputError(where, "training.mixed_precision_param", "unknown value '" + mp + "'; valid: bfloat16, float32");
  t.str("training", "mixed_precision_reduce", "float32");
  std::vector<std::string> conv = t.strings("model", "converters");
  for (const std::string& c : conv) {
    if (c == "float8") p.precision = Precision::fp8;
    else job.warnings.push_back("model.converters \"" + c + "\": not modelled");
  }
  // torchtitan 000204a4: training.compile compiles each TransformerBlock (apply_compile) and the loss
  // (torchtitan/components/loss.py build_cross_entropy_loss): compile=model+loss, priced in memory only
  if (t.boolean("training", "compile", false)) {
    p.compile = Compile::model_loss;
    job.warnings.push_back("training.compile: compile=model+loss, priced in memory (what the compiled blocks and loss save); "
                           "its speed-up is not priced (the runtime profile's eager kernels are)");
  }

  // ---- activation checkpointing ----
  const std::string mode = t.str("activation_checkpoint", "mode", "selective");
  const std::string option = t.str("activation_checkpoint", "selective_ac_option", "2");
  if (mode == "none") p.recompute = Recompute::none;
  else if (mode == "full") p.recompute = Recompute::full;
  else if (mode == "selective") {
    if (option == "op") {
      p.recompute = Recompute::selective;
      job.warnings.push_back("activation_checkpoint selective_ac_option = \"op\": modelled as recompute=selective, "
                             "priced as torchtitan's op-level policy (every other matmul's output and SDPA's kept)");
    } else if (option == "1") {
      p.recompute = Recompute::full;
    } else {
      throw InputError(where, "activation_checkpoint.selective_ac_option",
                       "\"" + option + "\" checkpoints every " + option +
                           "th layer (torchtitan's default is mode = \"selective\", option \"2\"), which ctxplan does not "
                           "model; valid: mode = \"full\" or \"none\", or selective_ac_option = \"op\" or \"1\"");
    }
  } else {
    throw InputError(where, "activation_checkpoint.mode", "unknown value '" + mode + "'; valid: selective, full, none");
  }

  std::vector<std::string> unread;
  t.unread(unread, job.ignored);
  for (const std::string& u : unread) job.warnings.push_back(u + ": not modelled (ignored)");
  return job;
#endif
}

StackExport export_torchtitan(const ExportJob& job, const Profiles& profiles) {
  (void)profiles;
  const Plan& p = job.plan;
  StackExport e;
  e.default_file = "torchtitan_job.toml";
  std::string name = "llama3", flavor;
  for (auto& [n, f, profile] : flavors())
    if (profile == job.model.name) {
      name = n;
      flavor = f;
    }
  if (flavor.empty()) {
    flavor = job.model.name;
    e.cannot_express.push_back("model " + job.model.name +
                               ": no torchtitan flavor; written as flavor \"" + flavor + "\" (add it to torchtitan's model args)");
  }
  int64_t replicate = 1, shard = p.dp;
  std::string reshard = "default";
  if (p.zero == 0 && p.cp == 1 && p.dp > 1 && (p.tp > 1 || p.pp > 1)) {
    e.cannot_express.push_back("zero=0 with dp>1 and tp or pp > 1: torchtitan's DDP runs alone (apply_ddp: 'DDP has not "
                               "supported > 1D parallelism'); written as FSDP (zero=3, or zero=1 under pipelining)");
  } else if (p.zero == 0 && p.cp == 1) {
    replicate = p.dp;
    shard = 1;
  } else if (p.zero == 0) {
    e.cannot_express.push_back("zero=0 with cp>1: torchtitan shards parameters over the cp ranks (FSDP); written as zero=3");
  } else if (p.zero == 1 && p.pp > 1) {
    e.notes.push_back("zero=1 with pp=" + std::to_string(p.pp) + " written as FSDP: under pipelining torchtitan keeps each stage's "
                      "parameters and gradients unsharded across micro-batches and reduce-scatters once per step");
  } else if (p.zero == 1) {
    e.cannot_express.push_back("zero=1: FSDP2 has no optimizer-only sharding; written as zero=3 (full sharding)");
  } else if (p.zero == 2) {
    reshard = "never";
    e.notes.push_back("zero=2 written as fsdp_reshard_after_forward = \"never\" (parameters stay gathered between forward "
                      "and backward)");
  }
  if (p.zero >= 1 && zero_replicate_degree(p) > 1) {  // HSDP: the shard group is dp_shard x cp
    if (zero_shard_degree(p) % p.cp == 0) {
      shard = zero_shard_degree(p) / p.cp;
      replicate = p.dp / shard;
    } else {
      e.cannot_express.push_back("zero_shard=" + std::to_string(p.zero_shard) + ": torchtitan's FSDP shards over whole cp groups "
                                 "(data_parallel_shard_degree x cp); written as FSDP over all dp x cp ranks");
    }
  }
  std::string rotate = "allgather";
  if (p.cp > 1) {
    if (p.cp_comm == CpComm::p2p && p.cp_layout == CpLayout::headtail) rotate = "alltoall";
    else if (p.cp_comm == CpComm::allgather && p.cp_layout == CpLayout::headtail) rotate = "allgather";
    else {
      rotate = "alltoall";
      e.cannot_express.push_back(std::string("cp_kind=") + to_string(cp_kind_of(p)) + ",cp_layout=" + to_string(p.cp_layout) +
                                 ": torchtitan's context parallel is a load-balanced ring (alltoall) or all-gather of KV; "
                                 "written as alltoall (cp_kind=zigzag)");
    }
  }
  if (p.tp > 1 && !sp_enabled(p))
    e.cannot_express.push_back("sp=0: torchtitan's tensor parallel always shards the sequence (sequence parallel)");
  if (p.pp > 1) {
    if (p.vpp > 2)
      e.cannot_express.push_back("vpp=" + std::to_string(p.vpp) + ": torchtitan's Interleaved1F1B builds 2 stages per rank unless "
                                 "pipeline_parallel_layers_per_stage says otherwise; written as 2");
    const int64_t stages = p.pp * std::min<int64_t>(p.vpp, 2);  // the virtual stages the file asks for
    if (pipeline_split_error(job.model.layers, p).empty() &&
        pipeline_chunk_layers(job.model.layers, p) != torchtitan_stage_layers(job.model.layers, stages)) {
      std::string layers;
      for (int64_t n : torchtitan_stage_layers(job.model.layers, stages))
        layers += (layers.empty() ? "" : ", ") + std::to_string(n);
      e.cannot_express.push_back("the plan's pipeline split: torchtitan splits " + std::to_string(job.model.layers) +
                                 " layers as " + (layers.empty() ? "(none)" : layers) +
                                 " per virtual stage (embedding and output weigh one layer each)");
    }
  }
  if (p.compile == Compile::model)
    e.cannot_express.push_back("compile=model: torchtitan 000204a4's training.compile compiles the loss too "
                               "(components/loss.py build_cross_entropy_loss); written as compile = true");
  if (p.ckpt_offload) e.cannot_express.push_back("ckpt_offload=1: torchtitan has no activation checkpoint offload");
  if (p.opt_offload != p.param_offload)
    e.cannot_express.push_back("opt_offload/param_offload: torchtitan's enable_cpu_offload moves parameters, gradients and "
                               "optimizer states together; written as both " + std::string(p.opt_offload || p.param_offload ? "on" : "off"));
  if (p.tiled_loss != 0) e.cannot_express.push_back("tiled_loss: torchtitan computes the loss untiled (loss parallel with TP)");
  if (p.tiled_mlp != 0 && p.tiled_mlp != 1) e.cannot_express.push_back("tiled_mlp: torchtitan has no sequence-tiled MLP");
  if (p.mask == MaskKind::document)
    e.cannot_express.push_back("mask=" + mask_to_string(p) + ": document masking comes from your data loader");
  if (p.sorted_packing) e.cannot_express.push_back("packing=sorted: not a torchtitan option");
  if (order_to_string(p) != "tp-cp-dp")
    e.cannot_express.push_back("order=" + order_to_string(p) + ": torchtitan's device mesh is [dp_replicate, dp_shard, cp, tp] (tp innermost)");

  const int64_t world = job.nodes * job.gpus_per_node;
  std::ostringstream launch;
  launch << "torchrun --nnodes " << job.nodes << " --nproc-per-node " << job.gpus_per_node;
  if (job.nodes > 1) launch << " --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500";
  launch << " -m torchtitan.train --job.config_file " << e.default_file;
  e.launch = launch.str();

  std::ostringstream os;
  os << "# torchtitan job config written by `ctxplan export torchtitan` (torchtitan job_config.py at commit 000204a4; "
        "mapping in docs/STACKS.md)\n";
  os << "# job: " << job.model_arg << ", seq " << job.seq << " tokens, " << job.nodes << " node(s) x " << job.gpus_per_node
     << " GPUs = " << world << " ranks; plan " << plan_to_string(p) << "\n";
  os << "# launch: " << e.launch << "\n";
  for (const auto& n : e.notes) os << "# note: " << n << "\n";
  for (const auto& c : e.cannot_express) os << "# cannot express: " << c << "\n";
  os << "\n[job]\ndescription = \"ctxplan: " << plan_to_string(p) << "\"\n";
  os << "\n[model]\nname = \"" << name << "\"\nflavor = \"" << flavor << "\"\n";
  if (p.precision == Precision::fp8) os << "converters = [\"float8\"]\n";
  // with pp > 1 one schedule step runs all ga micro-batches: local_batch_size = mbs x ga
  const int64_t local = p.pp > 1 ? p.mbs * p.ga : p.mbs;
  os << "\n[training]\nlocal_batch_size = " << local << "\nglobal_batch_size = " << p.mbs * p.dp * p.ga
     << "\nseq_len = " << job.seq << "\nmixed_precision_param = \"" << (p.precision == Precision::fp32 ? "float32" : "bfloat16")
     << "\"\nenable_cpu_offload = " << (p.opt_offload || p.param_offload ? "true" : "false")
     << "\ncompile = " << (p.compile != Compile::off ? "true" : "false") << "\n";
  os << "\n[parallelism]\ndata_parallel_replicate_degree = " << replicate << "\ndata_parallel_shard_degree = " << shard
     << "\nfsdp_reshard_after_forward = \"" << reshard << "\"\ntensor_parallel_degree = " << p.tp
     << "\ncontext_parallel_degree = " << p.cp << "\ncontext_parallel_rotate_method = \"" << rotate
     << "\"\npipeline_parallel_degree = " << p.pp << "\n";
  if (p.pp > 1)  // torchtitan's schedule names (torch.distributed.pipelining): 1F1B, Interleaved1F1B
    os << "pipeline_parallel_schedule = \"" << (p.vpp > 1 ? "Interleaved1F1B" : "1F1B")
       << "\"\npipeline_parallel_microbatch_size = " << p.mbs << "\n";
  os << "\n[activation_checkpoint]\n";
  if (p.recompute == Recompute::none) os << "mode = \"none\"\n";
  if (p.recompute == Recompute::full) os << "mode = \"full\"\n";
  if (p.recompute == Recompute::selective) {
    os << "mode = \"selective\"\nselective_ac_option = \"op\"\n";
    e.notes.push_back("recompute=selective written as torchtitan's op-level selective checkpointing (selective_ac_option = \"op\")");
  }
  e.text = os.str();
  return e;
}

}  // namespace ctx
