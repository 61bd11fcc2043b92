#include "gui/measured.hpp"

#include <cmath>

#include "planner/stack_measurements.hpp"

namespace ctx::gui {
namespace {

// The comparable fields: the Prediction's JSON pointer (what the report is compared with) and
// where a report may carry it. A ctxplan.measurement/1 report times memory phases (forward, loss,
// backward, optimizer) where the Prediction times forward, backward (loss included), optimizer, so
// its backward is read as loss + backward.
struct Field {
  std::string pointer, label;
  bool bytes;
  std::vector<std::vector<std::string>> sources;  // alternatives, each a list of pointers summed
};

std::vector<Field> comparable_fields() {
  std::vector<Field> f = {{"/memory/peak_bytes", "peak (device)", true, {}}};
  for (int i = 0; i < kMemCategories; ++i) {
    const std::string cat = to_string(static_cast<Mem>(i));
    f.push_back({"/memory/by_category/" + cat, "  " + cat, true, {}});
  }
  for (int i = 0; i < kPhases; ++i) {
    const std::string ph = to_string(static_cast<Phase>(i));
    f.push_back({"/memory/phases/" + ph + "/peak_bytes", "peak in " + ph, true, {}});
  }
  f.push_back({"/memory/host_per_node/total_bytes", "host per node", true, {}});
  f.push_back({"/time/step_seconds", "step time (s)", false, {}});
  f.push_back({"/time/phases_seconds/forward", "  forward (s)", false, {{"/time/phases_seconds/forward"}, {"/time/phases/forward"}}});
  f.push_back({"/time/phases_seconds/backward", "  backward incl. loss (s)", false,
               {{"/time/phases_seconds/backward"}, {"/time/phases/loss", "/time/phases/backward"}}});
  f.push_back({"/time/phases_seconds/optimizer", "  optimizer (s)", false, {{"/time/phases_seconds/optimizer"}, {"/time/phases/optimizer"}}});
  f.push_back({"/time/tokens_per_second", "tokens/s", false, {}});
  f.push_back({"/time/mfu", "MFU", false, {}});
  for (auto& x : f)
    if (x.sources.empty()) x.sources = {{x.pointer}};
  return f;
}

std::string dotted(const std::string& pointer) {
  std::string s = pointer.substr(1);
  for (auto& ch : s)
    if (ch == '/') ch = '.';
  return s;
}

// A stack's measurement as the fields of the Prediction it pairs with.
MeasuredReport from_stack(const StackMeasurement& sm) {
  MeasuredReport m;
  m.path = sm.where;
  m.format = sm.format;
  if (sm.peak_allocated_bytes)
    m.values.push_back({"memory.peak_bytes", "peak allocated (predicted without runtime)", true, *sm.peak_allocated_bytes});
  for (int i = 0; i < kMemCategories; ++i)
    if (sm.category_bytes[i]) {
      const std::string cat = to_string(static_cast<Mem>(i));
      m.values.push_back({"memory.by_category." + cat, "  " + cat, true, *sm.category_bytes[i]});
    }
  if (sm.step_seconds) m.values.push_back({"time.step_seconds", "step time (s)", false, *sm.step_seconds});
  if (sm.forward_seconds) m.values.push_back({"time.phases_seconds.forward", "  forward (s)", false, *sm.forward_seconds});
  if (sm.backward_seconds) m.values.push_back({"time.phases_seconds.backward", "  backward (s)", false, *sm.backward_seconds});
  if (sm.optimizer_seconds) m.values.push_back({"time.phases_seconds.optimizer", "  optimizer (s)", false, *sm.optimizer_seconds});
  if (sm.tokens_per_second) m.values.push_back({"time.tokens_per_second", "tokens/s", false, *sm.tokens_per_second});
  if (sm.mfu) m.values.push_back({"time.mfu", "MFU", false, *sm.mfu});
  if (sm.tokens_per_second_per_gpu) m.tokens_per_second_per_gpu = *sm.tokens_per_second_per_gpu;
  if (sm.global_batch) m.global_batch_samples = *sm.global_batch;
  return m;
}

}  // namespace

MeasuredReport load_measured_report(const std::string& path) {
  if (std::optional<StackMeasurement> sm = read_stack_measurement(path)) return from_stack(*sm);
  json j = read_json_file(path);
  JsonReader r(j, path);
  MeasuredReport m;
  m.path = path;
  m.format = "ctxrun report";
  m.schema = r.string_or("schema", "");
  m.model = r.string_or("model", "");
  m.cluster = r.string_or("cluster", "");
  m.runtime = r.string_or("runtime", "");
  m.plan_text = r.string_or("plan_string", "");
  if (r.has("seq")) m.seq_tokens = r.integer("seq");
  for (const Field& f : comparable_fields()) {
    // the first alternative whose pointers are all present
    for (const auto& sum : f.sources) {
      bool present = true;
      for (auto& p : sum) present = present && j.contains(json::json_pointer(p)) && !j.at(json::json_pointer(p)).is_null();
      if (!present) continue;
      double total = 0;
      for (auto& p : sum) {
        const json& v = j.at(json::json_pointer(p));
        if (!v.is_number()) throw InputError(path, dotted(p), "expected a number, got " + std::string(v.type_name()));
        total += v.get<double>();
      }
      m.values.push_back({dotted(f.pointer), f.label, f.bytes, total});
      break;
    }
  }
  if (r.has("losses")) {
    const json& l = r.raw("losses");
    if (!l.is_array()) r.fail("losses", "expected an array of numbers (or of objects with \"loss\")");
    for (size_t i = 0; i < l.size(); ++i) {
      const json& e = l[i];
      if (e.is_number()) m.losses.push_back(e.get<double>());
      else if (e.is_object() && e.contains("loss") && e["loss"].is_number()) m.losses.push_back(e["loss"].get<double>());
      else r.fail("losses[" + std::to_string(i) + "]", "expected a number or {\"loss\": number}");
    }
  }
  if (m.values.empty() && m.losses.empty())
    throw InputError(path, "memory", "no comparable field: expected the prediction shape (memory.by_category, time.step_seconds, ...)");
  return m;
}

std::vector<ComparisonRow> compare_to_prediction(const MeasuredReport& m, const Prediction& pred) {
  const json p = prediction_to_json(pred);
  std::vector<ComparisonRow> rows;
  for (auto& v : m.values) {
    std::string ptr = "/" + v.name;
    for (auto& ch : ptr)
      if (ch == '.') ch = '/';
    const json::json_pointer jp(ptr);
    if (!p.contains(jp) || !p.at(jp).is_number()) continue;
    ComparisonRow row;
    row.name = v.name;
    row.label = v.label;
    row.bytes = v.bytes;
    row.predicted = p.at(jp).get<double>();
    // PyTorch's allocated bytes (a stack's log) count tensors: the prediction's 'runtime' category
    // (CUDA context, NCCL buffers, allocator slack) is left out, as `ctxplan compare` does
    if (!m.format.empty() && m.format != "ctxrun report" && v.name == "memory.peak_bytes")
      row.predicted -= p.at(json::json_pointer("/memory/by_category/runtime")).get<double>();
    row.measured = v.value;
    row.relative_error = row.predicted != 0 ? (row.measured - row.predicted) / row.predicted : (row.measured == 0 ? 0 : INFINITY);
    rows.push_back(std::move(row));
  }
  // rates a stack's log gives per GPU or per sample, as the job's tokens/s
  double tps = 0;
  if (m.tokens_per_second_per_gpu > 0) tps = m.tokens_per_second_per_gpu * static_cast<double>(pred.world);
  for (auto& v : m.values)
    if (v.name == "time.step_seconds" && m.global_batch_samples > 0 && v.value > 0)
      tps = m.global_batch_samples * static_cast<double>(pred.seq) / v.value;
  if (tps > 0) {
    ComparisonRow row;
    row.name = "time.tokens_per_second";
    row.label = "tokens/s";
    row.predicted = p.at(json::json_pointer("/time/tokens_per_second")).get<double>();
    row.measured = tps;
    row.relative_error = row.predicted != 0 ? (tps - row.predicted) / row.predicted : INFINITY;
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<std::string> job_mismatches(const MeasuredReport& m, const Prediction& pred) {
  std::vector<std::string> out;
  if (!m.model.empty() && m.model != pred.model) out.push_back("model: report " + m.model + ", prediction " + pred.model);
  if (!m.cluster.empty() && m.cluster != pred.cluster) out.push_back("cluster: report " + m.cluster + ", prediction " + pred.cluster);
  if (m.seq_tokens && m.seq_tokens != pred.seq)
    out.push_back("seq: report " + std::to_string(m.seq_tokens) + ", prediction " + std::to_string(pred.seq));
  if (!m.plan_text.empty() && m.plan_text != plan_to_string(pred.plan))
    out.push_back("plan: report " + m.plan_text + ", prediction " + plan_to_string(pred.plan));
  return out;
}

}  // namespace ctx::gui
