// What every stack mapping shares: stack names, model matching, plan comparison, and the export
// check (an export is imported back; whatever differs from the plan is listed as not expressible).
#include <algorithm>
#include <cctype>
#include <cmath>

#include "costmodel/errors.hpp"
#include "costmodel/suggest.hpp"
#include "planner/stacks.hpp"

namespace ctx {

const char* to_string(Stack s) {
  switch (s) {
    case Stack::megatron: return "megatron";
    case Stack::torchtitan: return "torchtitan";
    case Stack::deepspeed: return "deepspeed";
    case Stack::arctic: return "arctic";
  }
  return "?";
}

const char* stack_runtime(Stack s) {
  switch (s) {
    case Stack::megatron: return "megatron";
    case Stack::torchtitan: return "torchtitan";
    case Stack::deepspeed:
    case Stack::arctic: return "hf-deepspeed";
  }
  return "?";
}

Stack parse_stack(const std::string& name, const std::string& where) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "megatron" || n == "megatron-lm" || n == "nemo") return Stack::megatron;
  if (n == "torchtitan") return Stack::torchtitan;
  if (n == "deepspeed" || n == "ds") return Stack::deepspeed;
  if (n == "arctic" || n == "arctictraining" || n == "alst") return Stack::arctic;
  std::string msg = "unknown stack '" + name + "'; valid: megatron (Megatron-LM/NeMo arguments), torchtitan (job TOML), "
                    "deepspeed (DeepSpeed config JSON), arctic (ArcticTraining YAML)";
  auto close = closest_names(n, {"megatron", "torchtitan", "deepspeed", "arctic"}, 1);
  if (!close.empty()) msg += " (did you mean '" + close[0] + "'?)";
  throw InputError(where, "", msg);
}

StackJob import_stack(Stack stack, const std::string& text, const std::string& where, const Profiles& profiles,
                      const ImportOptions& options) {
  switch (stack) {
    case Stack::megatron: return import_megatron(text, where, profiles, options);
    case Stack::torchtitan: return import_torchtitan(text, where, profiles, options);
    case Stack::deepspeed: return import_deepspeed(text, where, profiles, options);
    case Stack::arctic: return import_arctic(text, where, profiles, options);
  }
  throw InputError(where, "", "unknown stack");
}

bool same_plan(const Plan& a, const Plan& b) { return plan_to_json(a) == plan_to_json(b); }

std::vector<std::string> plan_differences(const Plan& from, const Plan& to) {
  json a = plan_to_json(from), b = plan_to_json(to);
  std::vector<std::string> out;
  for (auto& [k, v] : a.items()) {
    const json& w = b.contains(k) ? b.at(k) : json();
    if (v != w) out.push_back(k + ": " + (v.is_string() ? v.get<std::string>() : v.dump()) + " -> " +
                              (w.is_string() ? w.get<std::string>() : w.dump()));
  }
  return out;
}

StackExport export_stack(Stack stack, const ExportJob& job, const Profiles& profiles) {
  StackExport e;
  switch (stack) {
    case Stack::megatron: e = export_megatron(job, profiles); break;
    case Stack::torchtitan: e = export_torchtitan(job, profiles); break;
    case Stack::deepspeed: e = export_deepspeed(job, profiles); break;
    case Stack::arctic: e = export_arctic(job, profiles); break;
  }
  // The export's proof: read it back as a user's file would be read. Any plan key that comes back
  // different is something the stack cannot express; the exporter names most of them with the
  // reason, the rest are listed here so none is lost.
  ImportOptions o;
  o.world = job.nodes * job.gpus_per_node;
  o.model = job.model_arg.empty() ? job.model.name : job.model_arg;  // a model the stack cannot name is listed, not fatal
  StackJob back = import_stack(stack, e.text, std::string("the ") + to_string(stack) + " export", profiles, o);
  e.exported = back.plan;
  for (const std::string& d : plan_differences(job.plan, back.plan)) {
    const std::string key = d.substr(0, d.find(':'));
    // a key that follows from another (ulysses from cp_kind, sp from tp, dp from tp and cp) is
    // explained by that one's entry
    std::vector<std::string> causes = {key};
    if (key == "ulysses") causes = {"ulysses", "cp_kind", "cp"};
    if (key == "sp") causes = {"sp", "tp"};
    if (key == "dp") causes = {"dp", "tp", "cp"};
    if (key == "opt_offload" || key == "param_offload") causes = {key, "opt_offload/param_offload"};
    bool named = false;
    for (const std::string& c : e.cannot_express)
      for (const std::string& k : causes)
        if (c.rfind(k + "=", 0) == 0 || c.rfind(k + " ", 0) == 0 || c.rfind(k + ":", 0) == 0) named = true;
    if (!named) e.cannot_express.push_back(d + " (the written file runs the plan with this value)");
  }
  return e;
}

namespace stacks {

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : sep) + i;
  return s;
}

std::string excerpt(const std::string& s, size_t max) {
  return s.size() <= max ? s : s.substr(0, max - 3) + "...";
}

bool parse_whole(const std::string& text, int64_t* out) {
  std::string t;
  for (char c : text)
    if (c != '_') t += c;
  if (t.empty()) return false;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(t, &used);
  } catch (const std::exception&) {
    return false;
  }
  if (used != t.size() || !std::isfinite(v) || v != std::floor(v) || std::abs(v) > 9e15) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

int64_t accumulation_from_global(int64_t global, int64_t mbs, int64_t dp, const std::string& where,
                                 const std::string& field) {
  const int64_t per_step = mbs * dp;
  if (per_step <= 0 || global <= 0 || global % per_step != 0)
    throw InputError(where, field,
                     std::to_string(global) + " is not a multiple of micro batch x data-parallel ranks = " +
                         std::to_string(mbs) + " x " + std::to_string(dp) + "; valid: a multiple of " +
                         std::to_string(per_step));
  return global / per_step;
}

std::string match_model_profile(const Profiles& profiles, const ModelSpec& m) {
  for (const ModelSpec& p : profiles.models) {
    if (p.layers == m.layers && p.hidden == m.hidden && p.heads == m.heads && p.kv_heads == m.kv_heads &&
        p.head_dim == m.head_dim && p.ffn == m.ffn && p.norm == m.norm && p.activation == m.activation &&
        p.tied_embeddings == m.tied_embeddings && (m.vocab <= 0 || p.vocab == m.vocab))
      return p.name;
  }
  return "";
}

namespace {
// Hugging Face repositories of the model profiles (their config.json is each profile's source).
const std::vector<std::pair<std::string, std::string>>& hf_repos() {
  static const std::vector<std::pair<std::string, std::string>> t = {
      {"Llama-3.1-8B", "meta-llama/Llama-3.1-8B"},   {"Llama-3.1-70B", "meta-llama/Llama-3.1-70B"},
      {"Llama-3.1-405B", "meta-llama/Llama-3.1-405B"}, {"Llama-2-7B", "meta-llama/Llama-2-7b-hf"},
      {"Qwen3-4B", "Qwen/Qwen3-4B"},                 {"Qwen3-32B", "Qwen/Qwen3-32B"},
      {"SmolLM3-3B", "HuggingFaceTB/SmolLM3-3B"},    {"GLM-4-9B", "THUDM/glm-4-9b"},
      {"MPT-7B", "mosaicml/mpt-7b"},
  };
  return t;
}
std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}
}  // namespace

std::string hf_repo_for(const std::string& profile_name) {
  for (auto& [n, r] : hf_repos())
    if (n == profile_name) return r;
  return "";
}

std::string resolve_model_name(const Profiles& profiles, const std::string& id, const std::string& where,
                               const std::string& field) {
  for (auto& [n, r] : hf_repos())
    if (lower(r) == lower(id)) return n;
  // org/Name-Instruct -> name-instruct, then without -instruct / -hf / -base
  std::string base = id.substr(id.rfind('/') == std::string::npos ? 0 : id.rfind('/') + 1);
  std::vector<std::string> tries = {id, base};
  for (const char* suffix : {"-instruct", "-hf", "-base", "-chat"}) {
    std::string b = lower(base);
    const std::string s = suffix;
    if (b.size() > s.size() && b.compare(b.size() - s.size(), s.size(), s) == 0) tries.push_back(base.substr(0, b.size() - s.size()));
  }
  for (const std::string& t : tries) {
    try {
      ModelSpec m = resolve_model(profiles, t);
      for (const ModelSpec& p : profiles.models)
        if (p.name == m.name) return p.name;
      return t;  // a config.json path
    } catch (const InputError&) {
    }
  }
  std::vector<std::string> names;
  for (const ModelSpec& m : profiles.models) names.push_back(m.name);
  throw InputError(where, field,
                   "model '" + id + "' matches no model profile; valid: " + join(names) +
                       ", a Hugging Face config.json path, or `ctxplan import --model NAME` to name it");
}

}  // namespace stacks
}  // namespace ctx
