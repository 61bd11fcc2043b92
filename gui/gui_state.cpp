#include "gui/gui_state.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "costmodel/attention_kernels.hpp"
#include "planner/job_args.hpp"

namespace ctx::gui {
namespace fs = std::filesystem;

namespace {

const char* const kTabs[] = {"memory", "cpwork", "plans", "pareto", "timeline", "maxseq", "measured"};

void read_cluster_edit(const JsonReader& r, ClusterEdit& e) {
  e.enabled = r.boolean_or("enabled", e.enabled);
  if (r.has("nodes")) e.nodes = r.integer_in("nodes", 1, 1 << 20);
  if (r.has("gpus_per_node")) e.gpus_per_node = r.integer_in("gpus_per_node", 1, 1024);
  e.gpu = r.string_or("gpu", e.gpu);
  e.intra_gbps = r.number_or("intra_gbps", e.intra_gbps);
  e.inter_gbps = r.number_or("inter_gbps", e.inter_gbps);
  e.host_gib_per_node = r.number_or("host_gib_per_node", e.host_gib_per_node);
  for (const char* k : {"intra_gbps", "inter_gbps", "host_gib_per_node"})
    if (r.number_or(k, 0) < 0) r.fail(k, "must be >= 0 (0 = the base cluster's value)");
}

void read_inputs(const JsonReader& r, Inputs& in) {
  in.model = r.string_or("model", in.model);
  in.cluster = r.string_or("cluster", in.cluster);
  if (r.has("cluster_edit")) read_cluster_edit(r.object("cluster_edit"), in.cluster_edit);
  in.runtime = r.string_or("runtime", in.runtime);
  if (r.has("attention")) {  // a name the cost model knows ("" = the runtime's default); whether the runtime runs it: resolve_inputs
    const std::string a = r.string("attention");
    in.attention = a.empty() ? "" : canonical_attention(a);
    if (!a.empty() && in.attention.empty()) {
      std::string all;
      for (auto& k : attention_kernel_catalogue()) all += (all.empty() ? "" : ", ") + k.name;
      r.fail("attention", "unknown attention implementation '" + a + "'; valid: " + all + ", or \"\" for the runtime's default");
    }
  }
  if (r.has("seq")) in.seq_tokens = r.integer_in("seq", 1, int64_t(1) << 34);
  if (r.has("global_batch_tokens")) {
    in.global_batch_tokens = r.integer("global_batch_tokens");
    if (in.global_batch_tokens < 0) r.fail("global_batch_tokens", "must be >= 0 (0 = one sequence per data-parallel rank)");
  }
  if (r.has("docs")) {
    JsonReader d = r.object("docs");
    std::string mode = d.string_or("mode", "causal");
    if (mode == "causal") in.docs = DocMode::causal;
    else if (mode == "fixed") in.docs = DocMode::fixed;
    else if (mode == "histogram") in.docs = DocMode::histogram;
    else d.fail("mode", "unknown value '" + mode + "'; valid: causal | fixed | histogram");
    if (d.has("tokens")) in.doc_tokens = d.integer_in("tokens", 1, int64_t(1) << 34);
    if (d.has("bins")) {
      const json& bins = d.raw("bins");
      if (!bins.is_array()) d.fail("bins", "expected an array of [tokens, fraction] pairs");
      in.doc_bins.clear();
      for (size_t i = 0; i < bins.size(); ++i) {
        const json& b = bins[i];
        if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number())
          d.fail("bins[" + std::to_string(i) + "]", "expected [tokens, fraction], e.g. [2048, 0.8]");
        in.doc_bins.push_back({b[0].get<int64_t>(), b[1].get<double>()});
      }
    }
    in.sorted_packing = d.boolean_or("sorted_packing", in.sorted_packing);
  }
  in.precision = r.string_or("precision", in.precision);
  if (in.precision != "bf16" && in.precision != "fp8" && in.precision != "fp32")
    r.fail("precision", "expected \"bf16\", \"fp8\" or \"fp32\", got \"" + in.precision + "\"");
  if (r.has("constraints")) {
    JsonReader c = r.object("constraints");
    if (c.has("cp_kinds")) {
      const json& kinds = c.raw("cp_kinds");
      if (!kinds.is_array()) c.fail("cp_kinds", "expected an array such as [\"zigzag\", \"ulysses\"]");
      in.cp_kinds.fill(false);
      for (auto& k : kinds) {
        bool known = false;
        for (int i = 0; i < kCpKinds; ++i)
          if (k.is_string() && k.get<std::string>() == cp_kind_name(i)) in.cp_kinds[i] = known = true;
        if (!known) c.fail("cp_kinds", "unknown CP kind " + json_excerpt(k) + "; valid: ring, zigzag, allgather, ulysses, usp");
      }
    }
    in.allow_offload = c.boolean_or("allow_offload", in.allow_offload);
    in.tp_values = c.string_or("tp", in.tp_values);
    in.cp_values = c.string_or("cp", in.cp_values);
    in.pp_values = c.string_or("pp", in.pp_values);
    if (c.has("vpp")) in.vpp = c.integer_in("vpp", 0, 1024);
    if (c.has("pp_first")) in.pp_first = c.integer_in("pp_first", 0, 1 << 20);
    if (c.has("pp_last")) in.pp_last = c.integer_in("pp_last", 0, 1 << 20);
    in.pp_embed = c.boolean_or("pp_embed", in.pp_embed);
    in.pp_loss = c.boolean_or("pp_loss", in.pp_loss);
    in.fixed_keys = c.string_or("keys", in.fixed_keys);
    std::string obj = c.string_or("objective", in.objective_memory ? "memory" : "time");
    if (obj != "time" && obj != "memory") c.fail("objective", "expected \"time\" or \"memory\"");
    in.objective_memory = obj == "memory";
    if (c.has("refine")) in.refine = static_cast<int>(c.integer_in("refine", 0, 1000));
  }
}

void read_view(const JsonReader& r, View& v) {
  v.tab = r.string_or("tab", v.tab);
  bool known = false;
  for (const char* t : kTabs) known |= v.tab == t;
  if (!known) r.fail("tab", "unknown tab '" + v.tab + "'; valid: memory, cpwork, plans, pareto, timeline, maxseq, measured");
  v.left_width = static_cast<float>(r.number_or("left_width", v.left_width));
  if (r.has("window")) {
    const json& w = r.raw("window");
    auto side = [&](const json& x) {
      auto n = json_exact_integer(x);
      return n && *n >= kMinWindowPixels && *n <= kMaxWindowPixels ? static_cast<int>(*n) : -1;
    };
    if (!w.is_array() || w.size() != 2 || side(w[0]) < 0 || side(w[1]) < 0)
      r.fail("window", "expected [width, height] in pixels, each " + std::to_string(kMinWindowPixels) + ".." +
                           std::to_string(kMaxWindowPixels) + ", got " + json_excerpt(w));
    v.window_width = side(w[0]);
    v.window_height = side(w[1]);
  }
  v.table_filter = r.string_or("table_filter", v.table_filter);
  v.fits_only = r.boolean_or("fits_only", v.fits_only);
  if (r.has("sort_column")) v.sort_column = static_cast<int>(r.integer_in("sort_column", 0, 64));
  v.sort_descending = r.boolean_or("sort_descending", v.sort_descending);
  v.timeline_t0 = r.number_or("timeline_t0", v.timeline_t0);
  v.timeline_t1 = r.number_or("timeline_t1", v.timeline_t1);
  if (r.has("maxseq_max_gpus")) v.maxseq_max_gpus = r.integer_in("maxseq_max_gpus", 1, 1 << 20);
  v.export_path = r.string_or("export_path", v.export_path);
  v.png_path = r.string_or("png_path", v.png_path);
  v.pareto_step_time = r.boolean_or("pareto_step_time", v.pareto_step_time);
}

}  // namespace

GuiState default_state() {
  GuiState s;
  s.inputs.model = kDefaultModel;
  s.inputs.cluster = kDefaultCluster;
  s.inputs.runtime = kDefaultRuntime;
  s.inputs.seq_tokens = std::stoll(kDefaultSeq);
  s.plan = kDefaultPlan;
  return s;
}

std::string cp_kind_name(int i) {
  static const char* const names[kCpKinds] = {"ring", "zigzag", "allgather", "ulysses", "usp"};
  return i >= 0 && i < kCpKinds ? names[i] : "?";
}

std::string mask_text(const Inputs& in) {
  if (in.docs == DocMode::causal) return "causal";
  if (in.docs == DocMode::fixed) return "doc:" + std::to_string(in.doc_tokens);
  std::string s = "doc:hist:";
  for (size_t i = 0; i < in.doc_bins.size(); ++i) {
    // the shortest fraction that reads back as the same double (0.6, not 0.59999999999999998)
    char frac[32];
    for (int digits = 15; digits <= 17; ++digits) {
      std::snprintf(frac, sizeof frac, "%.*g", digits, in.doc_bins[i].fraction);
      if (std::strtod(frac, nullptr) == in.doc_bins[i].fraction) break;
    }
    s += (i ? "/" : "") + std::to_string(in.doc_bins[i].tokens) + "@" + frac;
  }
  return s;
}

json state_to_json(const GuiState& s, bool include_headless) {
  const Inputs& in = s.inputs;
  json kinds = json::array();
  for (int i = 0; i < kCpKinds; ++i)
    if (in.cp_kinds[i]) kinds.push_back(cp_kind_name(i));
  json bins = json::array();
  for (auto& b : in.doc_bins) bins.push_back({b.tokens, b.fraction});
  const char* modes[] = {"causal", "fixed", "histogram"};
  json j;
  j["schema"] = "ctxplan.gui-state/1";
  j["inputs"] = {{"model", in.model},
                 {"cluster", in.cluster},
                 {"cluster_edit",
                  {{"enabled", in.cluster_edit.enabled},
                   {"nodes", in.cluster_edit.nodes},
                   {"gpus_per_node", in.cluster_edit.gpus_per_node},
                   {"gpu", in.cluster_edit.gpu},
                   {"intra_gbps", in.cluster_edit.intra_gbps},
                   {"inter_gbps", in.cluster_edit.inter_gbps},
                   {"host_gib_per_node", in.cluster_edit.host_gib_per_node}}},
                 {"runtime", in.runtime},
                 {"attention", in.attention},
                 {"seq", in.seq_tokens},
                 {"global_batch_tokens", in.global_batch_tokens},
                 {"docs",
                  {{"mode", modes[static_cast<int>(in.docs)]},
                   {"tokens", in.doc_tokens},
                   {"bins", bins},
                   {"sorted_packing", in.sorted_packing}}},
                 {"precision", in.precision},
                 {"constraints",
                  {{"cp_kinds", kinds},
                   {"allow_offload", in.allow_offload},
                   {"tp", in.tp_values},
                   {"cp", in.cp_values},
                   {"pp", in.pp_values},
                   {"vpp", in.vpp},
                   {"pp_first", in.pp_first},
                   {"pp_last", in.pp_last},
                   {"pp_embed", in.pp_embed},
                   {"pp_loss", in.pp_loss},
                   {"keys", in.fixed_keys},
                   {"objective", in.objective_memory ? "memory" : "time"},
                   {"refine", in.refine}}}};
  j["plan"] = s.plan;
  const View& v = s.view;
  j["view"] = {{"tab", v.tab},
               {"left_width", v.left_width},
               {"window", {v.window_width, v.window_height}},
               {"table_filter", v.table_filter},
               {"fits_only", v.fits_only},
               {"sort_column", v.sort_column},
               {"sort_descending", v.sort_descending},
               {"timeline_t0", v.timeline_t0},
               {"timeline_t1", v.timeline_t1},
               {"maxseq_max_gpus", v.maxseq_max_gpus},
               {"export_path", v.export_path},
               {"png_path", v.png_path},
               {"pareto_step_time", v.pareto_step_time}};
  j["measured"] = s.measured_path;
  if (include_headless) {
    j["search"] = s.run_search;
    j["select_rank"] = s.select_rank;
    j["maxseq"] = s.run_maxseq;
    j["export_plan"] = s.export_plan;
  }
  return j;
}

GuiState state_from_json(const json& j, const std::string& where, const GuiState& base) {
  JsonReader r(j, where);
  std::string schema = r.string_or("schema", "ctxplan.gui-state/1");
  if (schema != "ctxplan.gui-state/1") r.fail("schema", "expected \"ctxplan.gui-state/1\", got \"" + schema + "\"");
  for (auto& [key, _] : j.items()) {
    static const char* const known[] = {"schema", "inputs", "plan", "view", "measured", "search", "select_rank", "maxseq", "export_plan"};
    bool ok = false;
    for (const char* k : known) ok |= key == k;
    if (!ok) r.fail(key, "unknown field; valid: schema, inputs, plan, view, measured, search, select_rank, maxseq, export_plan");
  }
  GuiState s = base;
  if (r.has("inputs")) read_inputs(r.object("inputs"), s.inputs);
  s.plan = r.string_or("plan", s.plan);
  if (r.has("view")) read_view(r.object("view"), s.view);
  s.measured_path = r.string_or("measured", s.measured_path);
  s.run_search = r.boolean_or("search", s.run_search);
  if (r.has("select_rank")) {
    s.select_rank = static_cast<int>(r.integer("select_rank"));
    if (s.select_rank < -1) r.fail("select_rank", "must be >= 0 (or -1: keep the plan)");
  }
  s.run_maxseq = r.boolean_or("maxseq", s.run_maxseq);
  s.export_plan = r.string_or("export_plan", s.export_plan);
  if (!s.export_plan.empty()) s.view.export_path = s.export_plan;
  return s;
}

std::string config_dir() {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  if (xdg && *xdg) return (fs::path(xdg) / "ctxplan").string();
  const char* home = std::getenv("HOME");
  return (fs::path(home && *home ? home : ".") / ".config" / "ctxplan").string();
}

void save_state_file(const std::string& path, const GuiState& s) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  write_file_atomic(path, json_dump(state_to_json(s)) + "\n");
}

}  // namespace ctx::gui
