#include "costmodel/runtime_capabilities.hpp"

#include <algorithm>

namespace ctx {
namespace {

const char* const kKeys[] = {"stack",     "tp",        "sp",   "pp",        "vpp",         "cp_comm",       "cp_layout", "zero_shard",
                             "cp_varlen", "zero",      "recompute", "opt_offload", "param_offload", "ckpt_offload",
                             "tiled_loss", "tiled_mlp", "master", "grads", "moments", "zero_with_pp", "tp_overlap", "compile"};

// {"value": ..., "source": "..."} with a non-empty source
const json& statement(const JsonReader& r, const std::string& key, RuntimeCapabilities& c) {
  const JsonReader e = r.object(key);
  const std::string src = e.string("source");
  if (src.empty()) e.fail("source", "every capability needs its source (the stack's flag, file or doc that says it)");
  c.sources[key] = src;
  return e.raw("value");
}

bool flag(const JsonReader& r, const std::string& key, RuntimeCapabilities& c) {
  const json& v = statement(r, key, c);
  if (!v.is_boolean()) r.object(key).fail("value", "expected true or false");
  return v.get<bool>();
}

int64_t largest(const JsonReader& r, const std::string& key, RuntimeCapabilities& c) {
  const json& v = statement(r, key, c);
  if (v.is_string() && v.get<std::string>() == "any") return 0;
  if (!v.is_number_integer() || v.get<int64_t>() < 1) r.object(key).fail("value", "expected \"any\" or the largest degree (an integer >= 1)");
  return v.get<int64_t>();
}

// A list of names, each one of `valid` (their printed names); returns the indices.
std::vector<int> names(const JsonReader& r, const std::string& key, RuntimeCapabilities& c, const std::vector<std::string>& valid) {
  const json& v = statement(r, key, c);
  std::string all;
  for (auto& n : valid) all += (all.empty() ? "" : ", ") + n;
  if (!v.is_array()) r.object(key).fail("value", "expected a list of: " + all + " ([] for none)");
  std::vector<int> out;
  for (size_t i = 0; i < v.size(); ++i) {
    auto it = v[i].is_string() ? std::find(valid.begin(), valid.end(), v[i].get<std::string>()) : valid.end();
    if (it == valid.end()) r.object(key).fail("value[" + std::to_string(i) + "]", "expected one of: " + all);
    out.push_back(static_cast<int>(it - valid.begin()));
  }
  return out;
}

// A list of ZeRO stages lowest..3, each a number (0) or as plan text spells it ("0").
std::vector<int> zero_stages(const JsonReader& r, const std::string& key, RuntimeCapabilities& c, int lowest) {
  const json& v = statement(r, key, c);
  const std::string range = "ZeRO stages " + std::to_string(lowest) + "..3";
  if (!v.is_array()) r.object(key).fail("value", "expected a list of " + range + (key == "zero_shard" ? " (or true / false)" : ""));
  std::vector<int> out;
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t z = -1;
    if (v[i].is_number_integer()) z = v[i].get<int64_t>();
    else if (v[i].is_string() && v[i].get<std::string>().size() == 1) z = v[i].get<std::string>()[0] - '0';
    if (z < lowest || z > 3) r.object(key).fail("value[" + std::to_string(i) + "]", "expected one of the " + range);
    out.push_back(static_cast<int>(z));
  }
  return out;
}

template <class T>
bool listed(const std::vector<T>& v, T x) { return std::find(v.begin(), v.end(), x) != v.end(); }

template <class T, class F>
std::string list_text(const std::vector<T>& v, F name) {
  std::string s;
  for (const T& x : v) s += (s.empty() ? "" : ", ") + std::string(name(x));
  return s.empty() ? "none" : s;
}

}  // namespace

RuntimeCapabilities capabilities_from_json(const JsonReader& r) {
  RuntimeCapabilities c;
  c.declared = true;
  for (auto& item : r.self().items()) {
    const std::string key = item.key();
    if (std::none_of(std::begin(kKeys), std::end(kKeys), [&](const char* k) { return key == k; })) {
      std::string all;
      for (const char* k : kKeys) all += (all.empty() ? "" : ", ") + std::string(k);
      r.fail(key, "unknown capability; valid: " + all);
    }
  }
  {
    const json& v = statement(r, "stack", c);
    if (!v.is_string() || v.get<std::string>().empty()) r.object("stack").fail("value", "expected the stack and its version");
    c.stack = v.get<std::string>();
  }
  c.max_tp = largest(r, "tp", c);
  c.max_pp = largest(r, "pp", c);
  {
    const json& v = statement(r, "sp", c);
    if (!v.is_array() || v.empty()) r.object("sp").fail("value", "expected a non-empty list of true (on) and false (off)");
    c.sp_on = c.sp_off = false;
    for (auto& x : v) {
      if (!x.is_boolean()) r.object("sp").fail("value", "expected a list of true (on) and false (off)");
      (x.get<bool>() ? c.sp_on : c.sp_off) = true;
    }
  }
  c.interleaved = flag(r, "vpp", c);
  for (int i : names(r, "cp_comm", c, {"p2p", "allgather", "a2a", "a2a+p2p"})) c.cp_comm.push_back(static_cast<CpComm>(i));
  for (int i : names(r, "cp_layout", c, {"contiguous", "headtail", "headtail-doc"})) c.cp_layout.push_back(static_cast<CpLayout>(i));
  for (int i : names(r, "cp_varlen", c, {"native", "cycle", "split"})) c.cp_varlen.push_back(static_cast<CpVarlen::Kind>(i));
  c.zero = zero_stages(r, "zero", c, 0);
  // optional: absent = ZeRO over all dp*cp ranks only; true = HSDP with every ZeRO stage >= 1
  if (r.has("zero_shard")) {
    const json& v = statement(r, "zero_shard", c);
    if (v.is_boolean()) c.zero_shard = v.get<bool>() ? std::vector<int>{1, 2, 3} : std::vector<int>{};
    else c.zero_shard = zero_stages(r, "zero_shard", c, 1);
  }
  // optional: absent = the zero list holds with pipeline stages too
  if (r.has("zero_with_pp")) {
    c.zero_with_pp = zero_stages(r, "zero_with_pp", c, 0);
    c.zero_with_pp_declared = true;
  }
  for (int i : names(r, "recompute", c, {"none", "selective", "full"})) c.recompute.push_back(static_cast<Recompute>(i));
  c.opt_offload = flag(r, "opt_offload", c);
  c.param_offload = flag(r, "param_offload", c);
  c.ckpt_offload = flag(r, "ckpt_offload", c);
  c.tiled_loss = flag(r, "tiled_loss", c);
  c.tiled_mlp = flag(r, "tiled_mlp", c);
  // optional: absent = the stack does not overlap TP collectives with GEMMs (tp_overlap=0 only)
  c.tp_overlap = r.has("tp_overlap") && flag(r, "tp_overlap", c);
  // optional: absent = eager only
  if (r.has("compile")) {
    c.compile.clear();
    for (int i : names(r, "compile", c, {"off", "model", "model+loss"})) c.compile.push_back(static_cast<Compile>(i));
  }
  const std::vector<std::pair<const char*, std::vector<StateDtype>>> precision = {
      {"master", {StateDtype::fp32, StateDtype::none}},
      {"grads", {StateDtype::fp32, StateDtype::bf16}},
      {"moments", {StateDtype::fp32, StateDtype::bf16, StateDtype::q8}}};
  for (auto& [key, valid] : precision) {
    if (!r.has(key)) continue;  // the runtime's own value only (added by the profile reader)
    std::vector<std::string> names_of;
    for (StateDtype x : valid) names_of.push_back(to_string(x));
    std::vector<StateDtype>& out = std::string(key) == "master" ? c.master : std::string(key) == "grads" ? c.grads : c.moments;
    for (int i : names(r, key, c, names_of)) out.push_back(valid[static_cast<size_t>(i)]);
  }
  return c;
}

std::vector<std::vector<std::string>> capability_rows(const RuntimeCapabilities& c) {
  std::vector<std::vector<std::string>> rows;
  if (!c.declared) return rows;
  auto src = [&](const char* k) {
    auto it = c.sources.find(k);
    return it == c.sources.end() ? std::string() : it->second;
  };
  auto yes = [](bool b) { return std::string(b ? "yes" : "no"); };
  auto degree = [](int64_t m) { return m == 0 ? std::string("any") : "up to " + std::to_string(m); };
  rows.push_back({"stack", c.stack, src("stack")});
  rows.push_back({"tp", degree(c.max_tp), src("tp")});
  rows.push_back({"sp", std::string(c.sp_on ? "on" : "") + (c.sp_on && c.sp_off ? ", " : "") + (c.sp_off ? "off" : ""), src("sp")});
  rows.push_back({"pp", degree(c.max_pp), src("pp")});
  rows.push_back({"vpp", c.interleaved ? "interleaved too" : "1 only", src("vpp")});
  rows.push_back({"cp_comm", list_text(c.cp_comm, [](CpComm x) { return to_string(x); }), src("cp_comm")});
  rows.push_back({"cp_layout", list_text(c.cp_layout, [](CpLayout x) { return to_string(x); }), src("cp_layout")});
  rows.push_back({"cp_varlen", list_text(c.cp_varlen, [](CpVarlen::Kind k) {
                    return k == CpVarlen::Kind::native ? "native" : k == CpVarlen::Kind::cycle ? "cycle" : "split:<k>";
                  }),
                  src("cp_varlen")});
  rows.push_back({"zero", list_text(c.zero, [](int z) { return std::to_string(z); }), src("zero")});
  rows.push_back({"zero_shard", c.zero_shard.empty() ? "no (all dp*cp ranks)"
                                                     : "HSDP with zero " + list_text(c.zero_shard, [](int z) { return std::to_string(z); }),
                  src("zero_shard")});
  if (c.zero_with_pp_declared)
    rows.push_back({"zero_with_pp", "with pp > 1: zero " + list_text(c.zero_with_pp, [](int z) { return std::to_string(z); }), src("zero_with_pp")});
  rows.push_back({"recompute", list_text(c.recompute, [](Recompute x) { return to_string(x); }), src("recompute")});
  rows.push_back({"opt_offload", yes(c.opt_offload), src("opt_offload")});
  rows.push_back({"param_offload", yes(c.param_offload), src("param_offload")});
  rows.push_back({"ckpt_offload", yes(c.ckpt_offload), src("ckpt_offload")});
  rows.push_back({"tiled_loss", yes(c.tiled_loss), src("tiled_loss")});
  rows.push_back({"tiled_mlp", yes(c.tiled_mlp), src("tiled_mlp")});
  rows.push_back({"tp_overlap", yes(c.tp_overlap), src("tp_overlap")});
  rows.push_back({"compile", list_text(c.compile, [](Compile x) { return to_string(x); }),
                  c.sources.count("compile") ? src("compile") : std::string("not stated: eager only")});
  auto dtypes = [](const std::vector<StateDtype>& v) { return list_text(v, [](StateDtype x) { return to_string(x); }); };
  rows.push_back({"master", dtypes(c.master), src("master")});
  rows.push_back({"grads", dtypes(c.grads), src("grads")});
  rows.push_back({"moments", dtypes(c.moments), src("moments")});
  return rows;
}

CapabilityGap capability_gap(const RuntimeCapabilities& c, const Plan& p) {
  // the rules, in the order missing_capability reports them (the first a plan breaks); nothing here
  // allocates: the search asks this of every plan it enumerates (twice), the message is built only
  // where a person reads it
  using G = CapabilityGap;
  if (!c.declared) return G::none;
  if (c.max_tp > 0 && p.tp > c.max_tp) return G::tp;
  if (p.tp > 1) {
    const bool sp = sp_enabled(p);
    if (sp && !c.sp_on) return G::sp_on;
    if (!sp && !c.sp_off) return G::sp_off;
  }
  if (c.max_pp > 0 && p.pp > c.max_pp) return G::pp;
  if (p.vpp > 1 && !c.interleaved) return G::vpp;
  if (p.cp > 1) {
    if (!listed(c.cp_comm, p.cp_comm)) return G::cp_comm;
    if (!listed(c.cp_layout, p.cp_layout)) return G::cp_layout;
    if (p.mask == MaskKind::document && !listed(c.cp_varlen, p.cp_varlen.kind)) return G::cp_varlen;
  }
  if (p.pp > 1 && c.zero_with_pp_declared) {
    if (!listed(c.zero_with_pp, p.zero)) return G::zero_with_pp;
  } else if (!listed(c.zero, p.zero)) {
    return G::zero;
  }
  if (p.zero >= 1 && zero_replicate_degree(p) > 1 && !listed(c.zero_shard, p.zero)) return G::zero_shard;
  if (!listed(c.recompute, p.recompute)) return G::recompute;
  if (p.opt_offload && !c.opt_offload) return G::opt_offload;
  if (p.param_offload && !c.param_offload) return G::param_offload;
  if (p.ckpt_offload && !c.ckpt_offload) return G::ckpt_offload;
  if (p.tiled_loss != 0 && !c.tiled_loss) return G::tiled_loss;
  if (p.tiled_mlp != 0 && p.tiled_mlp != 1 && !c.tiled_mlp) return G::tiled_mlp;
  if (p.tp_overlap && !c.tp_overlap) return G::tp_overlap;
  if (!listed(c.compile, p.compile)) return G::compile;
  if (p.master != StateDtype::runtime && !listed(c.master, p.master)) return G::master;
  if (p.grads != StateDtype::runtime && !listed(c.grads, p.grads)) return G::grads;
  if (p.moments != StateDtype::runtime && !listed(c.moments, p.moments)) return G::moments;
  return G::none;
}

std::string missing_capability(const RuntimeCapabilities& c, const std::string& runtime, const Plan& p) {
  // the text of capability_gap's answer (the rule is there, once)
  auto no = [&](const std::string& key, const std::string& value, const std::string& runs) {
    auto it = c.sources.find(key);
    return runtime + " (" + c.stack + ") cannot run " + key + "=" + value + ": it runs " + runs +
           (it == c.sources.end() ? "" : " (" + it->second + ")");
  };
  auto precision = [&](const char* key, StateDtype value, const std::vector<StateDtype>& allowed) {
    return no(key, to_string(value), std::string(key) + " " + list_text(allowed, [](StateDtype x) { return to_string(x); }));
  };
  using G = CapabilityGap;
  switch (capability_gap(c, p)) {
    case G::none: return "";
    case G::tp: return no("tp", std::to_string(p.tp), "tp up to " + std::to_string(c.max_tp));
    case G::sp_on: return no("sp", "1", "tensor parallelism without Megatron sequence parallelism (sp=0)");
    case G::sp_off: return no("sp", "0", "tensor parallelism with sequence parallelism always on");
    case G::pp: return no("pp", std::to_string(p.pp), "pp up to " + std::to_string(c.max_pp));
    case G::vpp: return no("vpp", std::to_string(p.vpp), "non-interleaved pipeline schedules only (vpp=1)");
    case G::cp_comm:
      return no("cp_comm", to_string(p.cp_comm),
                c.cp_comm.empty() ? "no context parallelism (cp=1)" : "cp_comm " + list_text(c.cp_comm, [](CpComm x) { return to_string(x); }));
    case G::cp_layout:
      return no("cp_layout", to_string(p.cp_layout), "cp_layout " + list_text(c.cp_layout, [](CpLayout x) { return to_string(x); }));
    case G::cp_varlen:
      return no("cp_varlen", to_string(p.cp_varlen),
                c.cp_varlen.empty() ? "no packed documents under context parallelism"
                                    : "cp_varlen " + list_text(c.cp_varlen, [](CpVarlen::Kind k) {
                                        return k == CpVarlen::Kind::native ? "native" : k == CpVarlen::Kind::cycle ? "cycle" : "split:<k>";
                                      }));
    case G::zero_with_pp:
      return no("zero_with_pp", std::to_string(p.zero) + " with pp=" + std::to_string(p.pp),
                "zero " + list_text(c.zero_with_pp, [](int z) { return std::to_string(z); }) + " with pipeline stages");
    case G::zero: return no("zero", std::to_string(p.zero), "zero " + list_text(c.zero, [](int z) { return std::to_string(z); }));
    case G::zero_shard:
      return no("zero_shard", std::to_string(p.zero_shard) + " with zero=" + std::to_string(p.zero),
                c.zero_shard.empty() ? "ZeRO over all dp*cp ranks only (zero_shard=0)"
                                     : "HSDP with zero " + list_text(c.zero_shard, [](int z) { return std::to_string(z); }) +
                                           " only, else zero_shard=0");
    case G::recompute:
      return no("recompute", to_string(p.recompute), "recompute " + list_text(c.recompute, [](Recompute x) { return to_string(x); }));
    case G::opt_offload: return no("opt_offload", "1", "optimizer states on the device only");
    case G::param_offload: return no("param_offload", "1", "parameters on the device only");
    case G::ckpt_offload: return no("ckpt_offload", "1", "activation checkpoints on the device only");
    case G::tiled_loss: return no("tiled_loss", p.tiled_loss < 0 ? "auto" : std::to_string(p.tiled_loss), "an untiled loss only");
    case G::tiled_mlp: return no("tiled_mlp", p.tiled_mlp < 0 ? "auto" : std::to_string(p.tiled_mlp), "an untiled MLP only");
    case G::tp_overlap:
      return no("tp_overlap", "1", "no Transformer Engine userbuffers overlap of its tensor-parallel collectives with the GEMMs (tp_overlap=0)");
    case G::compile:
      return no("compile", to_string(p.compile),
                c.compile.size() == 1 ? "eager kernels only (compile=off)" : "compile " + list_text(c.compile, [](Compile x) { return to_string(x); }));
    case G::master: return precision("master", p.master, c.master);
    case G::grads: return precision("grads", p.grads, c.grads);
    case G::moments: return precision("moments", p.moments, c.moments);
  }
  return "";
}

}  // namespace ctx
