#include "gui/measured.hpp"

#include <cmath>

namespace ctx::gui {
namespace {

// The comparable fields of a prediction-shaped document, as JSON pointers and labels.
struct Field {
  std::string pointer, label;
  bool bytes;
};

std::vector<Field> comparable_fields() {
  std::vector<Field> f = {{"/memory/peak_bytes", "peak (device)", true}};
  for (int i = 0; i < kMemCategories; ++i) {
    const std::string cat = to_string(static_cast<Mem>(i));
    f.push_back({"/memory/by_category/" + cat, "  " + cat, true});
  }
  f.push_back({"/memory/host_per_node/total_bytes", "host per node", true});
  f.push_back({"/time/step_seconds", "step time (s)", false});
  f.push_back({"/time/phases_seconds/forward", "  forward (s)", false});
  f.push_back({"/time/phases_seconds/backward", "  backward (s)", false});
  f.push_back({"/time/phases_seconds/optimizer", "  optimizer (s)", false});
  f.push_back({"/time/tokens_per_second", "tokens/s", false});
  f.push_back({"/time/mfu", "MFU", false});
  return f;
}

}  // namespace

MeasuredReport load_measured_report(const std::string& path) {
  json j = read_json_file(path);
  JsonReader r(j, path);
  MeasuredReport m;
  m.path = path;
  m.schema = r.string_or("schema", "");
  m.model = r.string_or("model", "");
  m.cluster = r.string_or("cluster", "");
  m.runtime = r.string_or("runtime", "");
  m.plan_text = r.string_or("plan_string", "");
  if (r.has("seq")) m.seq_tokens = r.integer("seq");
  for (const Field& f : comparable_fields()) {
    const json::json_pointer ptr(f.pointer);
    if (!j.contains(ptr) || j.at(ptr).is_null()) continue;
    const json& v = j.at(ptr);
    std::string field = f.pointer.substr(1);
    for (auto& ch : field)
      if (ch == '/') ch = '.';
    if (!v.is_number()) throw InputError(path, field, "expected a number, got " + std::string(v.type_name()));
    m.values.push_back({field, f.label, f.bytes, v.get<double>()});
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
    row.measured = v.value;
    row.relative_error = row.predicted != 0 ? (row.measured - row.predicted) / row.predicted : (row.measured == 0 ? 0 : INFINITY);
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
