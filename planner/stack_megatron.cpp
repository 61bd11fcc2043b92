// Megatron-LM / NeMo training arguments <-> a ctxplan job.
//
// Source: Megatron-LM megatron/training/arguments.py (core_r0.14, 2025: _add_network_size_args,
// _add_training_args, _add_distributed_args, _add_mixed_precision_args) and
// megatron/core/transformer/transformer_config.py for cp_comm_type and the hierarchical CP sizes.
// The mapping table (flag, default, plan key) is docs/STACKS.md "Megatron-LM".
//
// The input is a file of arguments: a launch line (`torchrun ... pretrain_gpt.py --flag v ...`,
// `srun ...`), or the argument list alone, or everything after a `--`. Shell comments, quotes and
// line continuations are understood; `$VARIABLES` are not expanded (an option whose value is one is
// an error naming it).
#include <algorithm>
#include <map>
#include <sstream>

#include "costmodel/errors.hpp"
#include "planner/stacks.hpp"

namespace ctx {
namespace {

using stacks::join;

// Shell-like words: quotes, backslash-newline, comments from an unquoted '#' at a word start.
std::vector<std::string> shell_words(const std::string& text) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (quote) {
      if (c == quote) quote = 0;
      else cur += c;
      continue;
    }
    if (c == '\\' && i + 1 < text.size() && (text[i + 1] == '\n' || text[i + 1] == '\r')) {
      ++i;
      if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      continue;
    }
    if (c == '#' && !in_word) {
      while (i < text.size() && text[i] != '\n') ++i;
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(c)) || c == ';') {
      if (in_word) words.push_back(cur);
      cur.clear();
      in_word = false;
      continue;
    }
    cur += c;
    in_word = true;
  }
  if (in_word) words.push_back(cur);
  return words;
}

struct Flag {
  std::string name;  // without the leading "--"
  std::vector<std::string> values;
};

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// Options of Megatron that change nothing ctxplan predicts (optimizer hyperparameters, data,
// tokenizer files, logging, checkpoint I/O): read and listed as ignored.
bool no_effect_on_memory_or_time(const std::string& f) {
  static const char* prefixes[] = {"lr", "min-lr", "weight-decay", "start-weight-decay", "end-weight-decay", "adam-",
                                   "sgd-momentum", "clip-grad", "seed", "init-method", "data-path", "train-data-path",
                                   "valid-data-path", "test-data-path", "data-cache", "split", "tokenizer-", "vocab-file",
                                   "merge-file", "save", "load", "no-load", "no-save", "log-", "eval-", "train-iters",
                                   "train-samples", "exit-", "tensorboard", "wandb", "mock-data", "distributed-backend",
                                   "distributed-timeout", "attention-dropout", "hidden-dropout", "num-workers",
                                   "dataloader-type", "ckpt-", "finetune", "norm-epsilon", "make-vocab-size-divisible-by",
                                   "override-opt", "use-checkpoint", "use-mcore-models", "timing-log", "async-save",
                                   "dist-ckpt", "no-initialization", "use-dist-ckpt", "non-persistent", "rerun-",
                                   "check-for-", "manual-gc", "legacy-tokenizer", "max-position-embeddings",
                                   "eod-mask-loss", "seq-length-"};
  for (const char* p : prefixes)
    if (f.rfind(p, 0) == 0) return true;
  return false;
}

class MegatronArgs {
 public:
  MegatronArgs(const std::string& text, const std::string& where) : where_(where) {
    std::vector<std::string> w = shell_words(text);
    // The launch line: everything before the training script (*.py) or before "--".
    size_t start = 0;
    auto script = std::find_if(w.begin(), w.end(), [](const std::string& s) { return ends_with(s, ".py"); });
    auto dashdash = std::find(w.begin(), w.end(), std::string("--"));
    if (script != w.end()) start = static_cast<size_t>(script - w.begin()) + 1;
    else if (dashdash != w.end()) start = static_cast<size_t>(dashdash - w.begin()) + 1;
    read_launch(std::vector<std::string>(w.begin(), w.begin() + static_cast<long>(start)));
    for (size_t i = start; i < w.size(); ++i) {
      const std::string& t = w[i];
      if (t.rfind("--", 0) != 0 || t.size() < 3) {
        if (flags_.empty())
          throw InputError(where, t, "expected a Megatron option such as --tensor-model-parallel-size 2 (or a launch "
                                     "line ending in the training script, e.g. `torchrun ... pretrain_gpt.py --flags`)");
        flags_.back().values.push_back(t);
        continue;
      }
      Flag f;
      f.name = t.substr(2);
      auto eq = f.name.find('=');
      if (eq != std::string::npos) {
        f.values.push_back(f.name.substr(eq + 1));
        f.name = f.name.substr(0, eq);
      }
      std::replace(f.name.begin(), f.name.end(), '_', '-');
      flags_.push_back(f);
    }
    for (const Flag& f : flags_)
      for (const std::string& v : f.values)
        if (v.find('$') != std::string::npos)
          throw InputError(where, "--" + f.name, "value '" + v + "' is a shell variable; write the number it stands for");
  }

  int64_t nodes = 0, gpus_per_node = 0;

  bool has(const std::string& name) {
    used_.push_back(name);
    return find(name) != nullptr;
  }
  std::vector<std::string> values(const std::string& name) {
    used_.push_back(name);
    const Flag* f = find(name);
    return f ? f->values : std::vector<std::string>{};
  }
  std::string str(const std::string& name, const std::string& fallback) {
    used_.push_back(name);
    const Flag* f = find(name);
    if (!f) return fallback;
    if (f->values.size() != 1) throw InputError(where_, "--" + name, "expected one value, got " + std::to_string(f->values.size()));
    return f->values[0];
  }
  // Degrees, batches and model sizes: at most 2^20; the sequence and global batches: at most 2^34.
  int64_t integer(const std::string& name, int64_t fallback, int64_t lo = 1) {
    const std::string s = str(name, "");
    if (s.empty()) return fallback;
    const bool large = name == "seq-length" || name == "global-batch-size" || name == "vocab-size" ||
                       name == "ffn-hidden-size" || name == "max-position-embeddings";
    const int64_t hi = large ? int64_t(1) << 34 : int64_t(1) << 20;
    int64_t v = 0;
    if (!stacks::parse_whole(s, &v) || v < lo || v > hi)
      throw InputError(where_, "--" + name, "expected an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                                                ", got '" + stacks::excerpt(s) + "'");
    return v;
  }
  double number(const std::string& name, double fallback) {
    const std::string s = str(name, "");
    if (s.empty()) return fallback;
    try {
      size_t used = 0;
      double v = std::stod(s, &used);
      if (used == s.size()) return v;
    } catch (const std::exception&) {
    }
    throw InputError(where_, "--" + name, "expected a number, got '" + s + "'");
  }
  // Flags given but never asked for: not modelled (warnings) or of no effect (ignored).
  void unread(std::vector<std::string>& not_modelled, std::vector<std::string>& ignored) const {
    for (const Flag& f : flags_) {
      if (std::find(used_.begin(), used_.end(), f.name) != used_.end()) continue;
      std::string s = "--";
      s += f.name;
      if (!f.values.empty()) {
        s += ' ';
        s += join(f.values, " ");
      }
      s = stacks::excerpt(s);
      (no_effect_on_memory_or_time(f.name) ? ignored : not_modelled).push_back(s);
    }
  }
  const std::string& where() const { return where_; }

 private:
  const Flag* find(const std::string& name) const {
    const Flag* found = nullptr;
    for (const Flag& f : flags_)
      if (f.name == name) found = &f;  // the last one wins, as in argparse
    return found;
  }
  void read_launch(const std::vector<std::string>& w) {
    auto value = [&](size_t& i, const std::string& opt) -> std::string {
      const std::string& t = w[i];
      if (t.size() > opt.size() && t[opt.size()] == '=') return t.substr(opt.size() + 1);
      if (i + 1 < w.size()) return w[++i];
      return "";
    };
    for (size_t i = 0; i < w.size(); ++i) {
      const std::string& t = w[i];
      auto is = [&](const char* opt) { return t == opt || t.rfind(std::string(opt) + "=", 0) == 0; };
      int64_t v = 0;
      std::string s;
      if (is("--nnodes") || is("--nodes") || is("-N") || is("--num_nodes")) {
        s = value(i, t.substr(0, t.find('=')));
        if (stacks::parse_whole(s, &v) && v > 0 && v <= (1 << 20)) nodes = v;
      } else if (is("--nproc-per-node") || is("--nproc_per_node") || is("--ntasks-per-node") || is("--gpus-per-node") ||
                 is("--num_gpus")) {
        s = value(i, t.substr(0, t.find('=')));
        if (stacks::parse_whole(s, &v) && v > 0 && v <= (1 << 20)) gpus_per_node = v;
      }
    }
  }

  std::string where_;
  std::vector<Flag> flags_;
  std::vector<std::string> used_;
};

ModelSpec model_from_flags(MegatronArgs& a) {
  const std::string& where = a.where();
  ModelSpec m;
  for (const char* req : {"num-layers", "hidden-size", "num-attention-heads"})
    if (!a.has(req))
      throw InputError(where, std::string("--") + req,
                       "missing: the model shape needs --num-layers, --hidden-size and --num-attention-heads");
  m.layers = a.integer("num-layers", 0);
  m.hidden = a.integer("hidden-size", 0);
  m.heads = a.integer("num-attention-heads", 0);
  m.kv_heads = a.has("group-query-attention") ? a.integer("num-query-groups", 1) : m.heads;
  if (!a.has("group-query-attention")) a.values("num-query-groups");  // only read with --group-query-attention
  m.head_dim = a.integer("kv-channels", m.hidden / m.heads);
  const bool swiglu = a.has("swiglu");
  m.activation = swiglu ? ActivationKind::swiglu : ActivationKind::gelu;
  // arguments.py: without --ffn-hidden-size, 4*hidden, or for SwiGLU int(4*hidden*2/3 / 64) * 64
  int64_t ffn_default = swiglu ? (4 * m.hidden * 2 / 3) / 64 * 64 : 4 * m.hidden;
  m.ffn = a.integer("ffn-hidden-size", ffn_default);
  m.vocab = a.integer("vocab-size", 0, 0);
  std::string norm = a.str("normalization", "LayerNorm");
  if (norm == "RMSNorm") m.norm = NormKind::rmsnorm;
  else if (norm == "LayerNorm") m.norm = NormKind::layernorm;
  else throw InputError(where, "--normalization", "unknown value '" + norm + "'; valid: LayerNorm (default), RMSNorm");
  m.tied_embeddings = !a.has("untie-embeddings-and-output-weights");
  m.qkv_bias = a.has("add-qkv-bias") || !a.has("disable-bias-linear");
  m.qk_norm = a.has("qk-layernorm");
  std::string pos = a.str("position-embedding-type", "learned_absolute");
  if (pos == "rope") {
    m.rope.base = a.number("rotary-base", 10000);
    m.rope.partial_rotary_factor = a.number("rotary-percent", 1.0);
    if (a.has("use-rope-scaling")) {
      m.rope.scaling = RopeScaling::llama3;
      m.rope.factor = a.number("rope-scaling-factor", 8.0);
    }
  } else if (pos != "none" && pos != "learned_absolute") {
    throw InputError(where, "--position-embedding-type", "unknown value '" + pos + "'; valid: learned_absolute, rope, none");
  }
  m.layer_position.assign(static_cast<size_t>(m.layers), pos == "rope" ? PositionKind::rope : PositionKind::nope);
  m.name = "megatron-" + std::to_string(m.layers) + "l-" + std::to_string(m.hidden) + "h";
  m.source = "Megatron-LM arguments in " + where;
  return m;
}

}  // namespace

StackJob import_megatron(const std::string& text, const std::string& where, const Profiles& profiles, const ImportOptions& o) {
  MegatronArgs a(text, where);
  StackJob job;
  job.runtime = "megatron";
  job.nodes = a.nodes;
  job.gpus_per_node = a.gpus_per_node;
  Plan& p = job.plan;

  // ---- parallel degrees ----
  p.tp = a.integer("tensor-model-parallel-size", 1);
  p.pp = a.integer("pipeline-model-parallel-size", 1);
  // interleaving: --virtual-pipeline-model-parallel-size (chunks per rank) or the older
  // --num-layers-per-virtual-pipeline-stage (layers per chunk; needs the model's layers)
  if (a.has("virtual-pipeline-model-parallel-size")) p.vpp = a.integer("virtual-pipeline-model-parallel-size", 1);
  if (a.has("num-layers-per-virtual-pipeline-stage")) {
    const int64_t per = a.integer("num-layers-per-virtual-pipeline-stage", 1);
    const int64_t layers = a.integer("num-layers", 0);
    // arguments.py: the layers counted with the embedding and loss where they take a layer's place
    const int64_t counted = layers + (a.has("account-for-embedding-in-pipeline-split") ? 1 : 0) +
                            (a.has("account-for-loss-in-pipeline-split") ? 1 : 0);
    if (layers <= 0 || per <= 0 || counted % (p.pp * per) != 0)
      throw InputError(where, "--num-layers-per-virtual-pipeline-stage",
                       std::to_string(per) + " must divide --num-layers / --pipeline-model-parallel-size (" +
                           std::to_string(counted) + " / " + std::to_string(p.pp) + ")");
    p.vpp = counted / (p.pp * per);
  }
  // uneven pipeline splits (arguments.py; the rules in pipeline_stages.hpp pipeline_split_error)
  if (a.has("num-virtual-stages-per-pipeline-rank")) p.vpp = a.integer("num-virtual-stages-per-pipeline-rank", 1);
  if (a.has("decoder-first-pipeline-num-layers")) p.pp_first = a.integer("decoder-first-pipeline-num-layers", 0);
  if (a.has("decoder-last-pipeline-num-layers")) p.pp_last = a.integer("decoder-last-pipeline-num-layers", 0);
  p.pp_embed = a.has("account-for-embedding-in-pipeline-split");
  p.pp_loss = a.has("account-for-loss-in-pipeline-split");
  for (const char* moe : {"num-experts", "expert-model-parallel-size"})
    if (a.has(moe) && a.integer(moe, 1) > 1)
      throw InputError(where, std::string("--") + moe, "mixture of experts is not modelled; valid: dense models only");
  p.cp = a.integer("context-parallel-size", 1);
  std::vector<std::string> comm = a.values("cp-comm-type");
  std::string kind = comm.empty() ? "p2p" : comm[0];
  for (const std::string& c : comm)
    if (c != kind)
      throw InputError(where, "--cp-comm-type", "one kind per layer (" + join(comm, " ") +
                                                    ") is not modelled; valid: one of p2p, all_gather, a2a, a2a+p2p");
  std::vector<std::string> hier = a.values("hierarchical-context-parallel-sizes");
  // docs/CONTEXT_PARALLEL.md: Megatron's get_batch_on_this_cp_rank cuts the sequence in 2*cp chunks
  // (head-tail) for every --cp-comm-type
  if (kind == "p2p") set_cp_kind(p, CpKind::zigzag);
  else if (kind == "all_gather") set_cp_kind(p, CpKind::allgather);
  else if (kind == "a2a") set_cp_kind(p, CpKind::ulysses);
  else if (kind == "a2a+p2p") {
    set_cp_kind(p, CpKind::usp);
    int64_t u = 0, r = 0;
    if (hier.size() != 2 || !stacks::parse_whole(hier[0], &u) || !stacks::parse_whole(hier[1], &r) || u < 1 || r < 1 ||
        u * r != p.cp)
      throw InputError(where, "--hierarchical-context-parallel-sizes",
                       "a2a+p2p needs two sizes, the all-to-all (inner) and the p2p degree, whose product is "
                       "--context-parallel-size " + std::to_string(p.cp) + "; got '" + join(hier, " ") + "'");
    p.ulysses = u;
  } else {
    throw InputError(where, "--cp-comm-type", "unknown value '" + kind + "'; valid: p2p (default), all_gather, a2a, a2a+p2p");
  }
  if (p.cp == 1) set_cp_kind(p, CpKind::zigzag);
  // Megatron's sequence parallel is off unless asked for (ctxplan's default is on with tp > 1).
  if (p.tp > 1) p.sp = a.has("sequence-parallel") ? 1 : 0;
  else a.has("sequence-parallel");
  // --tp-comm-overlap: Transformer Engine's userbuffers overlap of the TP collectives with the GEMMs
  // (plan key tp_overlap; Megatron asserts --sequence-parallel with it, validate_args). The per-GEMM
  // configuration (--tp-comm-overlap-cfg YAML) is priced from the runtime profile's, not the file
  p.tp_overlap = a.has("tp-comm-overlap");
  if (a.has("tp-comm-overlap-cfg"))
    job.warnings.push_back("--tp-comm-overlap-cfg " + a.str("tp-comm-overlap-cfg", "") +
                           ": the userbuffers configuration is not read; the runtime profile's (tp_overlap_* constants, "
                           "NeMo's ub_cfg_h100_h8192_tp4) is priced");

  // ---- data parallel and sharding ----
  if (a.has("use-megatron-fsdp") || a.has("use-custom-fsdp")) {
    std::string s = a.str("data-parallel-sharding-strategy", "optim_grads_params");
    if (s == "no_shard") p.zero = 0;
    else if (s == "optim") p.zero = 1;
    else if (s == "optim_grads") p.zero = 2;
    else if (s == "optim_grads_params") p.zero = 3;
    else throw InputError(where, "--data-parallel-sharding-strategy",
                          "unknown value '" + s + "'; valid: no_shard, optim, optim_grads, optim_grads_params");
    a.has("use-distributed-optimizer");
  } else if (a.has("use-torch-fsdp2")) {
    p.zero = 3;
    a.has("use-distributed-optimizer");
  } else if (a.has("use-distributed-optimizer")) {
    p.zero = 1;  // optimizer states and fp32 master weights sharded over the data-parallel (x CP) ranks
  }

  // ---- batch ----
  p.mbs = a.integer("micro-batch-size", 1);
  if (!a.has("seq-length"))
    throw InputError(where, "--seq-length", "missing: Megatron needs the sequence length (tokens per sample)");
  job.seq = a.integer("seq-length", 0);
  int64_t world = o.world > 0 ? o.world : a.nodes * a.gpus_per_node;
  if (o.world == 0 && a.gpus_per_node > 0 && a.nodes == 0) world = a.gpus_per_node;  // torchrun --standalone
  job.world = world;
  if (world > 0) {
    if (world % (p.tp * p.cp * p.pp) != 0)
      throw InputError(where, "--tensor-model-parallel-size",
                       "tp x cp x pp = " + std::to_string(p.tp * p.cp * p.pp) + " does not divide the " + std::to_string(world) + " GPUs");
    p.dp = world / (p.tp * p.cp * p.pp);
  }
  // HSDP: the distributed optimizer (ZeRO-1) shards within each of N consecutive blocks of the dp x cp
  // ranks and all-reduces across them (intra/inter partial data-parallel groups, parallel_state.py)
  if (const int64_t instances = a.integer("num-distributed-optimizer-instances", 1); instances > 1) {
    if (p.zero != 1)
      throw InputError(where, "--num-distributed-optimizer-instances",
                       std::to_string(instances) + " instances without --use-distributed-optimizer (or with Megatron FSDP) "
                       "is not modelled; valid: 1, or N > 1 with --use-distributed-optimizer (ZeRO-1)");
    if (p.dp == 0)
      throw InputError(where, "--num-distributed-optimizer-instances",
                       "sizing each instance needs the data-parallel size, so the GPU count: give `ctxplan import --cluster` "
                       "or keep the torchrun/srun launch line in the file");
    const int64_t dpcp = p.dp * p.cp;
    if (dpcp % instances != 0 || dpcp / instances < 2)
      throw InputError(where, "--num-distributed-optimizer-instances",
                       std::to_string(instances) + " must split dp x cp = " + std::to_string(dpcp) +
                           " ranks into equal groups of at least 2; valid: a divisor of " + std::to_string(dpcp) + " up to " +
                           std::to_string(dpcp / 2));
    p.zero_shard = dpcp / instances;
  }
  if (a.has("global-batch-size")) {
    const int64_t gbs = a.integer("global-batch-size", 0);
    if (p.dp == 0) {
      if (gbs != p.mbs)
        throw InputError(where, "--global-batch-size",
                         "turning it into gradient accumulation needs the data-parallel size, so the GPU count: give "
                         "`ctxplan import --cluster` or keep the torchrun/srun launch line in the file");
    } else {
      p.ga = stacks::accumulation_from_global(gbs, p.mbs, p.dp, where, "--global-batch-size");
    }
  }

  // ---- recompute ----
  std::string gran = a.str("recompute-granularity", "");
  if (gran == "selective") {
    p.recompute = Recompute::selective;
    std::vector<std::string> mods = a.values("recompute-modules");
    if (!mods.empty() && !(mods.size() == 1 && mods[0] == "core_attn"))
      job.warnings.push_back("--recompute-modules " + join(mods, " ") +
                             ": modelled as recompute=selective, which recomputes the attention core (core_attn) only");
  } else if (gran == "full") {
    std::string method = a.str("recompute-method", "");
    int64_t n = a.integer("recompute-num-layers", 1);
    if (method == "uniform" && n == 1) p.recompute = Recompute::full;
    else if (method == "block" && n == a.integer("num-layers", 0)) p.recompute = Recompute::full;
    else
      throw InputError(where, "--recompute-method",
                       "full recompute with method '" + method + "' and --recompute-num-layers " + std::to_string(n) +
                           " checkpoints some layers or groups of layers, which ctxplan does not model; valid: "
                           "--recompute-method uniform --recompute-num-layers 1 (every layer), or block over all layers");
  } else if (!gran.empty()) {
    throw InputError(where, "--recompute-granularity", "unknown value '" + gran + "'; valid: full, selective");
  } else {
    a.values("recompute-method");
    a.values("recompute-num-layers");
  }

  // ---- offload ----
  if (a.has("cpu-offloading")) {
    a.values("cpu-offloading-num-layers");
    a.has("cpu-offloading-activations");
    if (a.has("cpu-offloading-weights"))
      job.warnings.push_back("--cpu-offloading-weights: weight offload through TransformerEngine is not modelled");
    p.ckpt_offload = true;
    if (p.recompute != Recompute::full)
      throw InputError(where, "--cpu-offloading",
                       "activation offload is modelled as checkpoint offload, which needs full recompute; valid: add "
                       "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1");
    job.warnings.push_back("--cpu-offloading: modelled as ckpt_offload=1 (each layer's recompute checkpoint in host memory)");
  }
  if (a.has("optimizer-cpu-offload")) {
    double frac = a.number("optimizer-offload-fraction", 1.0);
    if (frac != 1.0)
      throw InputError(where, "--optimizer-offload-fraction",
                       std::to_string(frac) + ": a partial optimizer offload is not modelled; valid: 1.0 (all states on the host)");
    p.opt_offload = true;
    a.has("use-precision-aware-optimizer");
  }
  if (a.has("reset-attention-mask") || a.has("reset-position-ids"))
    job.warnings.push_back("--reset-attention-mask/--reset-position-ids: intra-document masking depends on your data's "
                           "document lengths; imported as mask=causal (set mask=doc:<len> with `ctxplan import --set`)");

  // ---- precision ----
  if (a.has("fp8-format")) {
    a.values("fp8-format");
    a.values("fp8-recipe");
    p.precision = Precision::fp8;
    a.has("bf16");
  } else if (a.has("bf16")) {
    p.precision = Precision::bf16;
  } else if (a.has("fp16")) {
    p.precision = Precision::bf16;
    job.warnings.push_back("--fp16: modelled as precision=bf16 (the same bytes; loss scaling is not modelled)");
  } else {
    p.precision = Precision::fp32;
  }
  if (a.has("use-tp-pp-dp-mapping"))
    throw InputError(where, "--use-tp-pp-dp-mapping", "this rank order is not modelled; valid: Megatron's default tp-cp-ep-dp-pp");

  // ---- model ----
  if (!o.model.empty()) {  // named by the caller: the shape flags are read, not matched
    for (const char* f : {"num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "group-query-attention",
                          "num-query-groups", "kv-channels", "swiglu", "normalization", "untie-embeddings-and-output-weights",
                          "disable-bias-linear", "add-qkv-bias", "qk-layernorm", "position-embedding-type", "rotary-base",
                          "rotary-percent", "use-rope-scaling", "rope-scaling-factor", "vocab-size"})
      a.values(f);
    job.model = o.model;
    std::vector<std::string> unread;
    a.unread(unread, job.ignored);
    for (const std::string& u : unread) job.warnings.push_back(u + ": not a Megatron option ctxplan models (ignored)");
    return job;
  }
  ModelSpec m = model_from_flags(a);
  std::string name = stacks::match_model_profile(profiles, m);
  if (!name.empty()) {
    job.model = name;
  } else {
    if (m.vocab <= 0)
      throw InputError(where, "--vocab-size",
                       "the model shape matches no profile and its vocabulary comes from the tokenizer; give --vocab-size "
                       "in the file or `ctxplan import --model NAME|config.json`");
    validate_model(m, where);
    job.model_spec = m;
  }

  std::vector<std::string> unread;
  a.unread(unread, job.ignored);
  for (const std::string& u : unread) job.warnings.push_back(u + ": not a Megatron option ctxplan models (ignored)");
  return job;
}

StackExport export_megatron(const ExportJob& job, const Profiles& profiles) {
  (void)profiles;
  const Plan& p = job.plan;
  const ModelSpec& m = job.model;
  StackExport e;
  e.default_file = "megatron_args.sh";
  std::vector<std::string> args;
  auto add = [&](const std::string& flag, const std::string& value = "") { args.push_back(value.empty() ? flag : flag + " " + value); };
  auto num = [](int64_t v) { return std::to_string(v); };
  auto real = [](double v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };

  add("--tensor-model-parallel-size", num(p.tp));
  add("--pipeline-model-parallel-size", num(p.pp));
  // uneven splits (pipeline_stages.hpp): arguments.py refuses --num-layers-per-virtual-pipeline-stage
  // with --decoder-first/last-pipeline-num-layers ("please use --num-virtual-stages-per-pipeline-rank")
  const bool uneven = p.pp_first > 0 || p.pp_last > 0 || p.pp_embed || p.pp_loss;
  if (p.vpp > 1 && uneven) add("--num-virtual-stages-per-pipeline-rank", num(p.vpp));
  else if (p.vpp > 1) add("--num-layers-per-virtual-pipeline-stage", num(m.layers / (p.pp * p.vpp)));
  if (p.pp_first > 0) add("--decoder-first-pipeline-num-layers", num(p.pp_first));
  if (p.pp_last > 0) add("--decoder-last-pipeline-num-layers", num(p.pp_last));
  if (p.pp_embed) add("--account-for-embedding-in-pipeline-split");
  if (p.pp_loss) add("--account-for-loss-in-pipeline-split");
  add("--context-parallel-size", num(p.cp));
  if (p.cp > 1) {
    switch (cp_kind_of(p)) {
      case CpKind::zigzag: add("--cp-comm-type", "p2p"); break;
      case CpKind::ring:
        add("--cp-comm-type", "p2p");
        e.cannot_express.push_back("cp_kind=ring: Megatron's p2p ring always balances causal work over 2*cp chunks; "
                                   "written as p2p, which ctxplan models as cp_kind=zigzag");
        break;
      case CpKind::allgather: add("--cp-comm-type", "all_gather"); break;
      case CpKind::ulysses: add("--cp-comm-type", "a2a"); break;
      case CpKind::usp:
        add("--cp-comm-type", "a2a+p2p");
        add("--hierarchical-context-parallel-sizes", num(ulysses_degree(p)) + " " + num(ring_degree(p)));
        break;
    }
    // get_batch_on_this_cp_rank places every --cp-comm-type head-tail (docs/CONTEXT_PARALLEL.md)
    if (p.cp_layout == CpLayout::contiguous && p.cp_comm != CpComm::p2p && p.cp_comm != CpComm::a2a)
      e.cannot_express.push_back(std::string("cp_layout=contiguous: Megatron places the sequence head-tail for every "
                                             "--cp-comm-type; written as ") + to_string(p.cp_comm) + " with its head-tail layout");
    if (p.cp_layout == CpLayout::headtail_doc)
      e.cannot_express.push_back("cp_layout=headtail-doc is Transformer Engine's THD layout, chosen by the data (packed "
                                 "sequences with cu_seqlens, each document padded to a multiple of 2*cp), not by a flag");
  }
  if (p.tp > 1 && sp_enabled(p)) add("--sequence-parallel");
  if (p.tp_overlap) add("--tp-comm-overlap");
  if (p.zero == 1) add("--use-distributed-optimizer");
  if (p.zero == 1 && zero_replicate_degree(p) > 1) add("--num-distributed-optimizer-instances", num(zero_replicate_degree(p)));
  if (p.zero >= 2 && zero_replicate_degree(p) > 1)
    e.cannot_express.push_back("zero_shard=" + std::to_string(p.zero_shard) + " with zero=" + std::to_string(p.zero) +
                               ": Megatron's partial sharding is the distributed optimizer's instances (ZeRO-1); written as "
                               "Megatron FSDP over all dp x cp ranks");
  if (p.zero >= 2) {
    add("--use-megatron-fsdp");
    add("--data-parallel-sharding-strategy", p.zero == 2 ? "optim_grads" : "optim_grads_params");
    add("--use-distributed-optimizer");
  }
  add("--micro-batch-size", num(p.mbs));
  add("--global-batch-size", num(p.mbs * p.dp * p.ga));
  add("--seq-length", num(job.seq));
  add("--max-position-embeddings", num(std::max(job.seq, m.max_position)));
  if (p.recompute == Recompute::selective) add("--recompute-granularity", "selective");
  if (p.recompute == Recompute::full) {
    add("--recompute-granularity", "full");
    add("--recompute-method", "uniform");
    add("--recompute-num-layers", "1");
  }
  if (p.ckpt_offload) {
    add("--cpu-offloading");
    add("--cpu-offloading-num-layers", num(std::max<int64_t>(1, m.layers - 1)));
    add("--cpu-offloading-activations");
    e.notes.push_back("ckpt_offload=1 written as --cpu-offloading (TransformerEngine activation offload of all but the "
                      "last layer), the nearest Megatron has to keeping each layer's checkpoint in host memory");
  }
  if (p.opt_offload) {
    add("--optimizer-cpu-offload");
    add("--optimizer-offload-fraction", "1.0");
    add("--use-precision-aware-optimizer");
  }
  if (p.param_offload) e.cannot_express.push_back("param_offload=1: Megatron has no parameter offload; written without it");
  if (p.tiled_loss != 0)
    e.cannot_express.push_back("tiled_loss=" + (p.tiled_loss < 0 ? std::string("auto") : num(p.tiled_loss)) +
                               ": Megatron computes the (vocab-parallel) loss untiled");
  if (p.tiled_mlp != 0 && p.tiled_mlp != 1) e.cannot_express.push_back("tiled_mlp: Megatron has no sequence-tiled MLP");
  if (p.mask == MaskKind::document) {
    add("--reset-position-ids");
    add("--reset-attention-mask");
    e.cannot_express.push_back("mask=" + mask_to_string(p) +
                               ": the document lengths are your data's; written as --reset-position-ids --reset-attention-mask");
  }
  if (p.sorted_packing) e.cannot_express.push_back("packing=sorted: Megatron's data loader does not balance attention work");
  if (order_to_string(p) != "tp-cp-dp")
    e.cannot_express.push_back("order=" + order_to_string(p) + ": Megatron orders ranks tp-cp-ep-dp-pp (tp innermost)");
  if (p.precision == Precision::bf16) add("--bf16");
  if (p.precision == Precision::fp8) {
    add("--bf16");
    add("--fp8-format", "hybrid");
  }
  // model shape
  add("--num-layers", num(m.layers));
  add("--hidden-size", num(m.hidden));
  add("--ffn-hidden-size", num(m.ffn));
  add("--num-attention-heads", num(m.heads));
  if (m.kv_heads != m.heads) {
    add("--group-query-attention");
    add("--num-query-groups", num(m.kv_heads));
  }
  if (m.head_dim != m.hidden / m.heads) add("--kv-channels", num(m.head_dim));
  if (m.activation == ActivationKind::swiglu) add("--swiglu");
  add("--normalization", m.norm == NormKind::rmsnorm ? "RMSNorm" : "LayerNorm");
  if (!m.tied_embeddings) add("--untie-embeddings-and-output-weights");
  add("--disable-bias-linear");
  if (m.qkv_bias) add("--add-qkv-bias");
  if (m.qk_norm) add("--qk-layernorm");
  bool nope = std::any_of(m.layer_position.begin(), m.layer_position.end(), [](PositionKind k) { return k == PositionKind::nope; });
  bool rope = std::any_of(m.layer_position.begin(), m.layer_position.end(), [](PositionKind k) { return k == PositionKind::rope; });
  if (rope) {
    add("--position-embedding-type", "rope");
    add("--rotary-base", real(m.rope.base));
    if (m.rope.partial_rotary_factor != 1.0) add("--rotary-percent", real(m.rope.partial_rotary_factor));
    if (m.rope.scaling == RopeScaling::llama3) {
      add("--use-rope-scaling");
      add("--rope-scaling-factor", real(m.rope.factor));
    }
    if (nope) e.notes.push_back("model " + m.name + " has NoPE layers; Megatron applies RoPE to every layer (cost-neutral)");
  } else {
    add("--position-embedding-type", "none");
  }
  add("--vocab-size", num(m.vocab));

  const int64_t world = job.nodes * job.gpus_per_node;
  std::ostringstream launch;
  launch << "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes " << job.nodes << " --nproc-per-node " << job.gpus_per_node;
  if (job.nodes > 1) launch << " --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500";
  launch << " pretrain_gpt.py";
  e.launch = launch.str() + " \\\n  " + join(args, " \\\n  ");

  std::ostringstream os;
  os << "# Megatron-LM arguments written by `ctxplan export megatron` (Megatron-LM core_r0.14 arguments.py; "
        "mapping in docs/STACKS.md)\n";
  os << "# job: " << job.model_arg << ", seq " << job.seq << " tokens, " << job.nodes << " node(s) x " << job.gpus_per_node
     << " GPUs = " << world << " ranks; plan " << plan_to_string(p) << "\n";
  os << "# the model's tokenizer decides Megatron's vocabulary: replace --vocab-size with your --tokenizer-type/--tokenizer-model\n";
  os << "# under Slurm: srun --nodes " << job.nodes << " --ntasks-per-node " << job.gpus_per_node
     << " python pretrain_gpt.py <the same arguments>\n";
  for (const auto& n : e.notes) os << "# note: " << n << "\n";
  for (const auto& c : e.cannot_express) os << "# cannot express: " << c << "\n";
  os << e.launch << "\n";
  e.text = os.str();
  return e;
}

}  // namespace ctx
