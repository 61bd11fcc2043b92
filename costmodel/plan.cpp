#include "costmodel/plan.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "costmodel/errors.hpp"
#include "costmodel/suggest.hpp"

namespace ctx {

bool sp_enabled(const Plan& p) { return p.sp < 0 ? p.tp > 1 : p.sp != 0; }

int64_t ulysses_degree(const Plan& p) {
  if (p.cp_comm == CpComm::a2a) return p.cp;
  if (p.cp_comm == CpComm::a2a_p2p) return p.ulysses > 0 ? p.ulysses : 1;
  return 1;
}
int64_t ring_degree(const Plan& p) { return p.cp / std::max<int64_t>(1, ulysses_degree(p)); }
int64_t zero_shard_degree(const Plan& p) { return p.zero_shard > 0 ? p.zero_shard : std::max<int64_t>(1, p.dp) * p.cp; }
int64_t zero_replicate_degree(const Plan& p) {
  return std::max<int64_t>(1, std::max<int64_t>(1, p.dp) * p.cp / std::max<int64_t>(1, zero_shard_degree(p)));
}
int64_t plan_world(const Plan& p) { return std::max<int64_t>(1, p.dp) * p.tp * p.cp * p.pp; }

CpKind cp_kind_of(const Plan& p) {
  switch (p.cp_comm) {
    case CpComm::p2p: return p.cp_layout == CpLayout::contiguous ? CpKind::ring : CpKind::zigzag;
    case CpComm::allgather: return CpKind::allgather;
    case CpComm::a2a: return CpKind::ulysses;
    case CpComm::a2a_p2p: return CpKind::usp;
  }
  return CpKind::zigzag;
}

void set_cp_kind(Plan& p, CpKind k) {
  switch (k) {
    case CpKind::ring: p.cp_comm = CpComm::p2p, p.cp_layout = CpLayout::contiguous; break;
    case CpKind::zigzag: p.cp_comm = CpComm::p2p, p.cp_layout = CpLayout::headtail; break;
    case CpKind::allgather: p.cp_comm = CpComm::allgather, p.cp_layout = CpLayout::headtail; break;
    case CpKind::ulysses: p.cp_comm = CpComm::a2a, p.cp_layout = CpLayout::contiguous; break;
    case CpKind::usp: p.cp_comm = CpComm::a2a_p2p, p.cp_layout = CpLayout::headtail; break;
  }
}

bool cp_kind_exact(const Plan& p) {
  Plan named;
  set_cp_kind(named, cp_kind_of(p));
  return named.cp_comm == p.cp_comm && named.cp_layout == p.cp_layout;
}

bool cp_ring_exchange(const Plan& p) { return p.cp_comm == CpComm::p2p || p.cp_comm == CpComm::a2a_p2p; }

const char* to_string(CpComm c) {
  switch (c) {
    case CpComm::p2p: return "p2p";
    case CpComm::allgather: return "allgather";
    case CpComm::a2a: return "a2a";
    case CpComm::a2a_p2p: return "a2a+p2p";
  }
  return "?";
}
const char* to_string(CpLayout l) {
  switch (l) {
    case CpLayout::contiguous: return "contiguous";
    case CpLayout::headtail: return "headtail";
    case CpLayout::headtail_doc: return "headtail-doc";
  }
  return "?";
}
std::string to_string(const CpVarlen& v) {
  switch (v.kind) {
    case CpVarlen::Kind::native: return "native";
    case CpVarlen::Kind::cycle: return "cycle";
    case CpVarlen::Kind::split: return "split:" + std::to_string(v.split);
  }
  return "?";
}

const char* to_string(CpKind k) {
  switch (k) {
    case CpKind::ring: return "ring";
    case CpKind::zigzag: return "zigzag";
    case CpKind::allgather: return "allgather";
    case CpKind::ulysses: return "ulysses";
    case CpKind::usp: return "usp";
  }
  return "?";
}
const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}
const char* to_string(Precision x) {
  switch (x) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp8: return "fp8";
  }
  return "?";
}
const char* to_string(Compile x) {
  switch (x) {
    case Compile::off: return "off";
    case Compile::model: return "model";
    case Compile::model_loss: return "model+loss";
  }
  return "?";
}
const char* to_string(StateDtype x) {
  switch (x) {
    case StateDtype::runtime: return "runtime";
    case StateDtype::none: return "none";
    case StateDtype::fp32: return "fp32";
    case StateDtype::bf16: return "bf16";
    case StateDtype::q8: return "8bit";
  }
  return "?";
}
const char* to_string(Dim d) {
  switch (d) {
    case Dim::tp: return "tp";
    case Dim::cp: return "cp";
    case Dim::dp: return "dp";
  }
  return "?";
}

std::string order_to_string(const Plan& p) {
  return std::string(to_string(p.order[0])) + "-" + to_string(p.order[1]) + "-" + to_string(p.order[2]);
}

std::string mask_to_string(const Plan& p) {
  if (p.mask == MaskKind::causal) return "causal";
  if (p.mask == MaskKind::explicit_mask) return "explicit";
  std::ostringstream os;
  os << "doc:";
  if (p.docs.kind == DocLengths::Kind::histogram) os << (p.docs.token_share ? "tokhist:" : "hist:");
  for (size_t i = 0; i < p.docs.tokens.size(); ++i) {
    if (i) os << "/";
    os << p.docs.tokens[i];
    if (p.docs.kind == DocLengths::Kind::histogram) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", p.docs.weights[i]);  // round-trips exactly
      os << "@" << buf;
    }
  }
  return os.str();
}

const std::vector<std::pair<std::string, std::string>>& plan_key_help() {
  static const std::vector<std::pair<std::string, std::string>> keys = {
      {"dp", "data-parallel degree (default: the GPUs left by tp*cp*pp)"},
      {"tp", "tensor-parallel degree (default 1)"},
      {"sp", "Megatron sequence parallel on top of TP: 0|1 (default: 1 when tp>1)"},
      {"tp_overlap", "0|1: the TP all-gathers and reduce-scatters overlapped with the layer's GEMMs (Megatron's "
                     "--tp-comm-overlap, Transformer Engine userbuffers); needs tp>1 and sp (default 0)"},
      {"cp", "context-parallel degree (default 1)"},
      {"pp", "pipeline-parallel stages, outermost in the rank order; the layers split evenly (default 1)"},
      {"vpp", "model chunks per pipeline rank: 1 = 1F1B, >1 = interleaved 1F1B (Megatron's virtual pipeline; default 1)"},
      {"pp_first", "layers on the first pipeline stage, the rest split evenly over the stages after it (Megatron's "
                   "--decoder-first-pipeline-num-layers; with vpp a multiple of vpp; default 0 = the even split)"},
      {"pp_last", "layers on the last pipeline stage, the rest split evenly over the stages before it (Megatron's "
                  "--decoder-last-pipeline-num-layers; with vpp a multiple of vpp; default 0 = the even split)"},
      {"pp_embed", "0|1: the embedding takes one layer's place in the even pipeline split, so the first model chunk "
                   "builds one layer fewer (Megatron's --account-for-embedding-in-pipeline-split; default 0)"},
      {"pp_loss", "0|1: the loss takes one layer's place in the even pipeline split, so the last model chunk builds "
                  "one layer fewer (Megatron's --account-for-loss-in-pipeline-split; default 0)"},
      {"cp_kind", "shorthand for the CP axes: ring = p2p+contiguous, zigzag = p2p+headtail (default), "
                  "allgather = allgather+headtail (before issue 20 it meant contiguous: add cp_layout=contiguous for that), "
                  "ulysses = a2a, usp = a2a+p2p+headtail; a cp_comm that disagrees is an error"},
      {"cp_comm", "p2p|allgather|a2a|a2a+p2p: how K,V travel (Megatron's --cp-comm-type names; default p2p)"},
      {"cp_layout", "contiguous|headtail|headtail-doc: chunk c of cp | chunks c and 2cp-1-c of 2cp | every document "
                    "cut into 2cp chunks placed head-tail, as Transformer Engine's THD (default headtail)"},
      {"cp_varlen", "native|cycle|split:<k>, with a document mask under a ring: one varlen call per ring step | the ring "
                    "run once per document | k sub-packs, native in each (GLM-4's divide and conquer; default native)"},
      {"ulysses", "Ulysses degree inside cp_comm=a2a+p2p (cp_kind=usp); ring degree = cp/ulysses"},
      {"zero", "ZeRO stage 0-3 over dp*cp ranks, or over zero_shard of them (default 0)"},
      {"zero_shard", "HSDP with zero>=1: ranks that shard the model states, consecutive in the dp x cp grid (cp innermost); "
                     "the dp*cp/zero_shard groups replicate them and all-reduce the gradient shards (FSDP2 "
                     "data_parallel_shard_degree, DeepSpeed MiCS shard size); must divide dp*cp (default 0 = all dp*cp)"},
      {"mbs", "sequences per micro-batch (default 1)"},
      {"ga", "gradient-accumulation micro-batches per step (default 1)"},
      {"recompute", "none|selective|full (default none)"},
      {"ckpt_offload", "0|1: keep full-recompute checkpoints in host memory (default 0)"},
      {"opt_offload", "0|1: fp32 master weights + Adam states in host memory (default 0)"},
      {"param_offload", "0|1: ZeRO-3 parameter shards in host memory (default 0)"},
      {"tiled_loss", "tokens per logits+loss tile; on|auto = ALST's ~1 GiB fp32 logits tiles; 0|off = untiled (default 0)"},
      {"tiled_mlp", "MLP chunks along the sequence; on|auto = ALST's ceil(tokens per rank / hidden); 0|off = untiled (default 0)"},
      {"mask", "causal | explicit | doc:<len> | doc:<l1>/<l2>/... | doc:hist:<len>@<frac>/... (frac = share of documents "
               "up to <len>) | doc:tokhist:<len>@<frac>/... (frac = share of tokens, as published length statistics "
               "usually are) (default causal)"},
      {"pad", "0|1: pad a sequence the CP/TP layout cannot split up to the layout's multiple (2*cp for head-tail layouts, "
              "cp*tp with SP, else cp) and price the pad tokens in memory and time; tokens/s counts only the real tokens "
              "(default 0: such a sequence is refused with the nearest valid lengths)"},
      {"packing", "greedy|sorted: how documents are packed into sequences; sorted balances attention work over DP ranks (default greedy)"},
      {"precision", "fp32|bf16|fp8: dtype of weights, activations, logits and communication; master weights, grads and optimizer as the runtime profile says unless master, grads or moments set them (default bf16)"},
      {"master", "fp32|none: the optimizer's fp32 copy of the weights, or none (the optimizer updates the compute weights; "
                 "default: the runtime's, `ctxplan show runtime NAME` lists what it allows)"},
      {"grads", "fp32|bf16: the gradient accumulation buffer and its reduction (Megatron --main-grads-dtype, FSDP2 "
                "reduce_dtype; default: the runtime's)"},
      {"moments", "fp32|bf16|8bit: Adam's m and v (Megatron --exp-avg-dtype/--exp-avg-sq-dtype; 8bit = block-wise, "
                  "torchao AdamW8bit's 256-element blocks with an fp32 scale each; default: the runtime's)"},
      {"compile", "off|model|model+loss: torch.compile of each transformer block (model) and of the loss too (model+loss; "
                  "torchtitan's training.compile at 000204a4 and e7c0cae; 9dec370 compiles the blocks only); priced in memory "
                  "from what the compiled code saves, not in time (default off: eager; runtimes list what they run)"},
      {"order", "rank order, innermost first, e.g. tp-cp-dp (default); pp is always outermost"},
  };
  return keys;
}

namespace {

// Decimal notation only: [+-]digits[.digits][e[+-]digits]. std::stod alone also takes leading
// blanks, hexadecimal ("0x100"), "inf" and "nan".
bool decimal_syntax(const std::string& s) {
  size_t i = 0;
  auto digits = [&] {
    size_t b = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    return i > b;
  };
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  if (!digits()) return false;
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == s.size();
}

}  // namespace

bool parse_scaled_number(const std::string& text, double* out) {
  std::string body = text;
  double scale = 1;
  if (!body.empty() && (body.back() == 'k' || body.back() == 'K')) { scale = 1024; body.pop_back(); }
  else if (!body.empty() && (body.back() == 'm' || body.back() == 'M')) { scale = 1024.0 * 1024.0; body.pop_back(); }
  if (!decimal_syntax(body)) return false;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(body, &used);
  } catch (const std::exception&) {
    return false;
  }
  if (used == 0 || used != body.size() || !std::isfinite(v * scale)) return false;
  *out = v * scale;
  return true;
}

namespace {

std::vector<std::string> plan_key_names() {
  std::vector<std::string> names;
  for (auto& kv : plan_key_help()) names.push_back(kv.first);
  return names;
}

int64_t parse_int(const std::string& where, const std::string& key, const std::string& v, int64_t lo, int64_t hi) {
  double d = 0;
  // counts are decimal integers with the k/m suffixes only: no exponent (tp=1e0), no hex (tp=0x2)
  if (v.find_first_of("eE") != std::string::npos || !parse_scaled_number(v, &d) || d != std::floor(d))
    throw InputError(where, key, "expected a decimal integer (suffix k or m allowed, e.g. 8 or 32k), got '" + v + "'");
  if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
    throw InputError(where, key,
                     "value '" + v + "' is out of range; valid: " + std::to_string(lo) + ".." + std::to_string(hi));
  return static_cast<int64_t>(d);
}

bool parse_bool(const std::string& where, const std::string& key, const std::string& v) {
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  throw InputError(where, key, "expected 0 or 1, got '" + v + "'");
}

template <class E>
E parse_enum(const std::string& where, const std::string& key, const std::string& v,
             const std::vector<std::pair<std::string, E>>& options) {
  std::vector<std::string> names;
  for (auto& [n, e] : options) {
    if (n == v) return e;
    names.push_back(n);
  }
  std::string valid;
  for (auto& n : names) valid += (valid.empty() ? "" : "|") + n;
  std::string msg = "unknown value '" + v + "'; valid: " + valid;
  auto close = closest_names(v, names, 1);
  if (!close.empty()) msg += " (did you mean '" + close[0] + "'?)";
  throw InputError(where, key, msg);
}

void parse_mask(const std::string& where, const std::string& v, Plan& p) {
  if (v == "causal") { p.mask = MaskKind::causal; return; }
  if (v == "explicit") { p.mask = MaskKind::explicit_mask; return; }
  if (v.rfind("doc:", 0) != 0)
    throw InputError(where, "mask",
                     "unknown value '" + v + "'; valid: causal | explicit | doc:<len> | doc:<l1>/<l2>/... | "
                     "doc:hist:<len>@<frac>/... (share of documents) | doc:tokhist:<len>@<frac>/... (share of tokens)");
  std::string body = v.substr(4);
  DocLengths d;
  const bool tokhist = body.rfind("tokhist:", 0) == 0;
  const bool hist = tokhist || body.rfind("hist:", 0) == 0;
  if (hist) body = body.substr(tokhist ? 8 : 5);
  d.token_share = tokhist;
  std::stringstream ss(body);
  std::string item;
  while (std::getline(ss, item, '/')) {
    if (hist) {
      auto at = item.find('@');
      if (at == std::string::npos) throw InputError(where, "mask", "histogram bin '" + item + "' needs <len>@<fraction>");
      d.tokens.push_back(parse_int(where, "mask", item.substr(0, at), 1, int64_t(1) << 34));
      std::string frac = item.substr(at + 1);
      size_t used = 0;
      double w = 0;
      try {
        w = std::stod(frac, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != frac.size() || !std::isfinite(w))
        throw InputError(where, "mask", "bad fraction in '" + item + "'; expected a number between 0 and 1");
      d.weights.push_back(w);
    } else {
      d.tokens.push_back(parse_int(where, "mask", item, 1, int64_t(1) << 34));
    }
  }
  if (d.tokens.empty()) throw InputError(where, "mask", "doc: needs at least one length");
  if (hist) {
    double sum = 0;
    for (double w : d.weights) {
      if (w < 0) throw InputError(where, "mask", "histogram fractions must be >= 0");
      sum += w;
    }
    if (std::abs(sum - 1.0) > 1e-6) throw InputError(where, "mask", "histogram fractions must sum to 1, got " + std::to_string(sum));
    if (!std::is_sorted(d.tokens.begin(), d.tokens.end())) throw InputError(where, "mask", "histogram bin edges must increase");
    d.kind = DocLengths::Kind::histogram;
  } else {
    d.kind = d.tokens.size() == 1 ? DocLengths::Kind::fixed : DocLengths::Kind::list;
  }
  p.mask = MaskKind::document;
  p.docs = d;
}

CpVarlen parse_varlen(const std::string& where, const std::string& v) {
  CpVarlen out;
  if (v == "native") return out;
  if (v == "cycle") { out.kind = CpVarlen::Kind::cycle; return out; }
  if (v.rfind("split:", 0) == 0) {
    out.kind = CpVarlen::Kind::split;
    out.split = parse_int(where, "cp_varlen", v.substr(6), 2, 1 << 20);
    return out;
  }
  throw InputError(where, "cp_varlen", "unknown value '" + v + "'; valid: native | cycle | split:<k> (k >= 2 sub-packs)");
}

void parse_order(const std::string& where, const std::string& v, Plan& p) {
  std::stringstream ss(v);
  std::string item;
  std::vector<Dim> dims;
  while (std::getline(ss, item, '-')) {
    if (item == "tp") dims.push_back(Dim::tp);
    else if (item == "cp") dims.push_back(Dim::cp);
    else if (item == "dp") dims.push_back(Dim::dp);
    else throw InputError(where, "order", "unknown dimension '" + item + "'; valid: a permutation of tp, cp, dp such as tp-cp-dp");
  }
  if (dims.size() != 3 || dims[0] == dims[1] || dims[1] == dims[2] || dims[0] == dims[2])
    throw InputError(where, "order", "must name tp, cp and dp once each, innermost first (e.g. tp-cp-dp), got '" + v + "'");
  for (int i = 0; i < 3; ++i) p.order[i] = dims[i];
}

void set_key(Plan& p, const std::string& where, const std::string& key, const std::string& v) {
  constexpr int64_t kMaxDegree = 1 << 20;
  if (key == "dp") p.dp = parse_int(where, key, v, 0, kMaxDegree);
  else if (key == "tp") p.tp = parse_int(where, key, v, 1, kMaxDegree);
  else if (key == "sp") p.sp = parse_bool(where, key, v) ? 1 : 0;
  else if (key == "tp_overlap") p.tp_overlap = parse_bool(where, key, v);
  else if (key == "cp") p.cp = parse_int(where, key, v, 1, kMaxDegree);
  else if (key == "pp") p.pp = parse_int(where, key, v, 1, kMaxDegree);
  else if (key == "vpp") p.vpp = parse_int(where, key, v, 1, kMaxDegree);
  else if (key == "pp_first") p.pp_first = parse_int(where, key, v, 0, kMaxDegree);
  else if (key == "pp_last") p.pp_last = parse_int(where, key, v, 0, kMaxDegree);
  else if (key == "pp_embed") p.pp_embed = parse_bool(where, key, v);
  else if (key == "pp_loss") p.pp_loss = parse_bool(where, key, v);
  else if (key == "cp_kind")
    set_cp_kind(p, parse_enum<CpKind>(where, key, v,
                                      {{"ring", CpKind::ring}, {"zigzag", CpKind::zigzag}, {"allgather", CpKind::allgather},
                                       {"ulysses", CpKind::ulysses}, {"usp", CpKind::usp}}));
  else if (key == "cp_comm")
    p.cp_comm = parse_enum<CpComm>(where, key, v,
                                   {{"p2p", CpComm::p2p}, {"allgather", CpComm::allgather}, {"a2a", CpComm::a2a},
                                    {"a2a+p2p", CpComm::a2a_p2p}});
  else if (key == "cp_layout")
    p.cp_layout = parse_enum<CpLayout>(where, key, v,
                                       {{"contiguous", CpLayout::contiguous}, {"headtail", CpLayout::headtail},
                                        {"headtail-doc", CpLayout::headtail_doc}});
  else if (key == "cp_varlen") p.cp_varlen = parse_varlen(where, v);
  else if (key == "ulysses") p.ulysses = parse_int(where, key, v, 1, kMaxDegree);
  else if (key == "zero") p.zero = static_cast<int>(parse_int(where, key, v, 0, 3));
  else if (key == "zero_shard") p.zero_shard = parse_int(where, key, v, 0, kMaxDegree);
  else if (key == "mbs") p.mbs = parse_int(where, key, v, 1, 1 << 16);
  else if (key == "ga") p.ga = parse_int(where, key, v, 1, 1 << 20);
  else if (key == "recompute")
    p.recompute = parse_enum<Recompute>(where, key, v,
                                        {{"none", Recompute::none}, {"selective", Recompute::selective}, {"full", Recompute::full}});
  else if (key == "ckpt_offload") p.ckpt_offload = parse_bool(where, key, v);
  else if (key == "opt_offload") p.opt_offload = parse_bool(where, key, v);
  else if (key == "param_offload") p.param_offload = parse_bool(where, key, v);
  // on/auto: the documented defaults (ALST's TiledMLP and tiled loss, memory_model.hpp), off: untiled
  else if (key == "tiled_loss") p.tiled_loss = v == "auto" || v == "on" ? -1 : v == "off" ? 0 : parse_int(where, key, v, 0, int64_t(1) << 34);
  else if (key == "tiled_mlp") p.tiled_mlp = v == "auto" || v == "on" ? -1 : v == "off" ? 0 : parse_int(where, key, v, 0, 1 << 20);
  else if (key == "mask") parse_mask(where, v, p);
  else if (key == "pad") p.pad = parse_bool(where, key, v);
  else if (key == "packing")
    p.sorted_packing = parse_enum<bool>(where, key, v, {{"greedy", false}, {"sorted", true}});
  else if (key == "precision") p.precision = parse_enum<Precision>(where, key, v,
                                        {{"fp32", Precision::fp32}, {"bf16", Precision::bf16}, {"fp8", Precision::fp8}});
  else if (key == "master") p.master = parse_enum<StateDtype>(where, key, v,
                                        {{"fp32", StateDtype::fp32}, {"none", StateDtype::none}, {"runtime", StateDtype::runtime}});
  else if (key == "grads") p.grads = parse_enum<StateDtype>(where, key, v,
                                        {{"fp32", StateDtype::fp32}, {"bf16", StateDtype::bf16}, {"runtime", StateDtype::runtime}});
  else if (key == "moments") p.moments = parse_enum<StateDtype>(where, key, v,
                                        {{"fp32", StateDtype::fp32}, {"bf16", StateDtype::bf16}, {"8bit", StateDtype::q8},
                                         {"runtime", StateDtype::runtime}});
  else if (key == "compile")
    p.compile = parse_enum<Compile>(where, key, v, {{"off", Compile::off}, {"0", Compile::off}, {"model", Compile::model},
                                                   {"model+loss", Compile::model_loss}});
  else if (key == "order") parse_order(where, v, p);
  else {
    std::string msg = "unknown plan key";
    auto close = closest_names(key, plan_key_names(), 2);
    if (!close.empty()) {
      msg += " (did you mean ";
      for (size_t i = 0; i < close.size(); ++i) msg += (i ? " or '" : "'") + close[i] + "'";
      msg += "?)";
    }
    std::string valid;
    for (auto& n : plan_key_names()) valid += (valid.empty() ? "" : ", ") + n;
    throw InputError(where, key, msg + "; valid keys: " + valid);
  }
}

}  // namespace

Plan parse_plan(const std::string& text, const std::string& where) {
  Plan p;
  std::stringstream ss(text);
  std::string item;
  std::vector<std::string> seen, values;
  while (std::getline(ss, item, ',')) {
    // trim spaces
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InputError(where, item, "expected key=value (e.g. tp=2,cp=4,cp_kind=zigzag)");
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) throw InputError(where, key, "given twice");
    seen.push_back(key);
    set_key(p, where, key, value);
    values.push_back(value);
  }
  auto given = [&](const char* key) -> const std::string* {
    for (size_t i = 0; i < seen.size(); ++i)
      if (seen[i] == key) return &values[i];
    return nullptr;
  };
  // cp_kind with the axis keys: the shorthand sets both axes; an explicit cp_comm must be the
  // shorthand's; an explicit cp_layout refines allgather, ulysses and usp (their names say only the
  // exchange) but must be the layout that ring (contiguous) and zigzag (headtail) name.
  if (const std::string* kind = given("cp_kind")) {
    Plan named;
    set_key(named, where, "cp_kind", *kind);
    const std::string *comm = given("cp_comm"), *layout = given("cp_layout");
    Plan axes;  // the axis keys as given (cp_kind, applied in order, may have overwritten them)
    if (comm) set_key(axes, where, "cp_comm", *comm);
    if (comm && named.cp_comm != axes.cp_comm)
      throw InputError(where, "cp_comm",
                       "cp_comm=" + *comm + " disagrees with cp_kind=" + *kind + " (which means cp_comm=" +
                           to_string(named.cp_comm) + "); give one of them");
    if (layout) set_key(p, where, "cp_layout", *layout);  // given before cp_kind, the shorthand overwrote it
    if (layout && (*kind == "ring" || *kind == "zigzag") && named.cp_layout != p.cp_layout)
      throw InputError(where, "cp_layout",
                       "cp_layout=" + *layout + " disagrees with cp_kind=" + *kind + " (which means cp_layout=" +
                           to_string(named.cp_layout) + "); give one of them, e.g. cp_comm=p2p,cp_layout=" + *layout);
    p.cp_comm = named.cp_comm;
    if (!layout) p.cp_layout = named.cp_layout;
  }
  if (const std::string* varlen = given("cp_varlen"); varlen && p.mask != MaskKind::document)
    throw InputError(where, "cp_varlen",
                     "cp_varlen=" + *varlen + " chooses how packed documents run; it needs a document mask (mask=doc:...)");
  if (const std::string* varlen = given("cp_varlen"); varlen && !(p.cp_varlen == CpVarlen{}) && !cp_ring_exchange(p))
    throw InputError(where, "cp_varlen",
                     "cp_varlen=" + *varlen + " runs the ring once per document (cycle) or per sub-pack (split:<k>); cp_comm=" +
                         to_string(p.cp_comm) + " passes no K,V around a ring; valid with it: native (or cp_comm=p2p|a2a+p2p)");
  return p;
}

std::string plan_to_string(const Plan& p) {
  Plan d;  // defaults
  std::ostringstream os;
  os << "dp=" << p.dp << ",tp=" << p.tp << ",cp=" << p.cp;
  if (p.pp != d.pp) os << ",pp=" << p.pp;
  if (p.vpp != d.vpp) os << ",vpp=" << p.vpp;
  if (p.pp_first != d.pp_first) os << ",pp_first=" << p.pp_first;
  if (p.pp_last != d.pp_last) os << ",pp_last=" << p.pp_last;
  if (p.pp_embed) os << ",pp_embed=1";
  if (p.pp_loss) os << ",pp_loss=1";
  // the CP axes: the shorthand where one names them, else the axis keys
  if (cp_kind_exact(p)) {
    if (p.cp > 1 || cp_kind_of(p) != cp_kind_of(d)) os << ",cp_kind=" << to_string(cp_kind_of(p));
  } else {
    os << ",cp_comm=" << to_string(p.cp_comm) << ",cp_layout=" << to_string(p.cp_layout);
  }
  if (p.cp_comm == CpComm::a2a_p2p && p.ulysses > 0) os << ",ulysses=" << p.ulysses;  // unset: plan_check asks for it
  if (p.sp >= 0 && sp_enabled(p) != (p.tp > 1)) os << ",sp=" << (sp_enabled(p) ? 1 : 0);
  if (p.tp_overlap) os << ",tp_overlap=1";
  if (p.zero != d.zero) os << ",zero=" << p.zero;
  if (p.zero_shard != d.zero_shard) os << ",zero_shard=" << p.zero_shard;
  if (p.mbs != d.mbs) os << ",mbs=" << p.mbs;
  if (p.ga != d.ga) os << ",ga=" << p.ga;
  if (p.recompute != d.recompute) os << ",recompute=" << to_string(p.recompute);
  if (p.ckpt_offload) os << ",ckpt_offload=1";
  if (p.opt_offload) os << ",opt_offload=1";
  if (p.param_offload) os << ",param_offload=1";
  if (p.tiled_loss > 0) os << ",tiled_loss=" << p.tiled_loss;
  if (p.tiled_loss < 0) os << ",tiled_loss=auto";
  if (p.tiled_mlp > 1) os << ",tiled_mlp=" << p.tiled_mlp;
  if (p.tiled_mlp < 0) os << ",tiled_mlp=auto";
  if (p.mask != MaskKind::causal) os << ",mask=" << mask_to_string(p);
  if (!(p.cp_varlen == d.cp_varlen)) os << ",cp_varlen=" << to_string(p.cp_varlen);
  if (p.sorted_packing) os << ",packing=sorted";
  if (p.pad) os << ",pad=1";
  if (p.precision != d.precision) os << ",precision=" << to_string(p.precision);
  // optimizer precision: only what the plan sets (unset = the runtime's own, which the plan does not know)
  if (p.master != StateDtype::runtime) os << ",master=" << to_string(p.master);
  if (p.grads != StateDtype::runtime) os << ",grads=" << to_string(p.grads);
  if (p.moments != StateDtype::runtime) os << ",moments=" << to_string(p.moments);
  if (p.compile != Compile::off) os << ",compile=" << to_string(p.compile);
  if (order_to_string(p) != order_to_string(d)) os << ",order=" << order_to_string(p);
  return os.str();
}

json plan_to_json(const Plan& p) {
  json j;
  j["dp"] = p.dp;
  j["tp"] = p.tp;
  j["sp"] = sp_enabled(p);
  j["tp_overlap"] = p.tp_overlap;
  j["cp"] = p.cp;
  j["pp"] = p.pp;
  j["vpp"] = p.vpp;
  if (p.pp_first > 0) j["pp_first"] = p.pp_first;  // uneven splits only where set: older readers see the even plan's keys
  if (p.pp_last > 0) j["pp_last"] = p.pp_last;
  if (p.pp_embed) j["pp_embed"] = true;
  if (p.pp_loss) j["pp_loss"] = true;
  if (cp_kind_exact(p)) j["cp_kind"] = to_string(cp_kind_of(p));  // for readers from before the axes
  j["cp_comm"] = to_string(p.cp_comm);
  j["cp_layout"] = to_string(p.cp_layout);
  if (p.mask == MaskKind::document) j["cp_varlen"] = to_string(p.cp_varlen);
  if (!(p.cp_comm == CpComm::a2a_p2p && p.ulysses == 0)) j["ulysses"] = ulysses_degree(p);  // usp's unset degree stays unset
  j["zero"] = p.zero;
  j["zero_shard"] = p.zero_shard;
  j["mbs"] = p.mbs;
  j["ga"] = p.ga;
  j["recompute"] = to_string(p.recompute);
  j["ckpt_offload"] = p.ckpt_offload;
  j["opt_offload"] = p.opt_offload;
  j["param_offload"] = p.param_offload;
  if (p.tiled_loss < 0) j["tiled_loss"] = "auto";
  else j["tiled_loss"] = p.tiled_loss;
  if (p.tiled_mlp < 0) j["tiled_mlp"] = "auto";
  else j["tiled_mlp"] = p.tiled_mlp;
  j["mask"] = mask_to_string(p);
  j["packing"] = p.sorted_packing ? "sorted" : "greedy";
  j["pad"] = p.pad;
  j["precision"] = to_string(p.precision);
  if (p.master != StateDtype::runtime) j["master"] = to_string(p.master);  // unset: the runtime's own
  if (p.grads != StateDtype::runtime) j["grads"] = to_string(p.grads);
  if (p.moments != StateDtype::runtime) j["moments"] = to_string(p.moments);
  if (p.compile != Compile::off) j["compile"] = to_string(p.compile);  // eager: older readers see the plan's keys
  j["order"] = order_to_string(p);
  return j;
}

Plan plan_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) throw InputError(where, "plan", "expected an object of plan keys");
  // Reuse the command-line parser so both forms accept and reject exactly the same things.
  std::string text;
  for (auto& [k, v] : j.items()) {
    std::string s;
    if (v.is_string()) s = v.get<std::string>();
    else if (v.is_boolean()) s = v.get<bool>() ? "1" : "0";
    else if (auto n = json_exact_integer(v); n && v.is_number_integer()) s = std::to_string(*n);  // no wrap past int64
    else if (v.is_number()) s = v.dump();
    else throw InputError(where, "plan." + k, "expected a string, number or boolean");
    if (s.find(',') != std::string::npos) throw InputError(where, "plan." + k, "value may not contain ','");
    bool usp = (j.contains("cp_kind") && j.at("cp_kind").is_string() && j.at("cp_kind").get<std::string>() == "usp") ||
               (j.contains("cp_comm") && j.at("cp_comm").is_string() && j.at("cp_comm").get<std::string>() == "a2a+p2p");
    if (k == "ulysses" && !usp) continue;  // derived field in our own output
    text += (text.empty() ? "" : ",") + k + "=" + s;
  }
  return parse_plan(text, where + ": plan");
}

}  // namespace ctx
