#include "planner/calibration_runs.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "costmodel/errors.hpp"
#include "costmodel/plan_check.hpp"
#include "planner/format.hpp"
#include "planner/stack_measurements.hpp"

namespace ctx {
namespace {

namespace fs = std::filesystem;

const char* const kColumns[] = {"id", "model", "cluster", "runtime", "attention", "plan", "seq", "step_seconds", "step_ms",
                                "peak_bytes", "peak_gib", "measurement", "report"};

std::string valid_columns() {
  std::string v;
  for (const char* c : kColumns) v += (v.empty() ? "" : ", ") + std::string(c);
  return v;
}

// A run's fields as text, whichever file they came from.
struct Fields {
  std::string where;
  std::vector<std::pair<std::string, std::string>> kv;
  const std::string* get(const std::string& k) const {
    for (auto& [key, v] : kv)
      if (key == k && !v.empty()) return &v;
    return nullptr;
  }
};

double positive(const Fields& f, const std::string& key) {
  double v = 0;
  if (!parse_scaled_number(*f.get(key), &v) || !(v > 0))
    throw InputError(f.where, key, "expected a positive number, got '" + *f.get(key) + "'");
  return v;
}

std::string relative_to(const std::string& file, const std::string& path) {
  if (fs::path(path).is_absolute()) return path;
  return (fs::path(file).parent_path() / path).string();
}

// A ctxrun report (ctxplan.measurement/1): its job and its measured step.
void read_report(const std::string& path, Fields& f) {
  const json j = read_json_file(path);
  JsonReader r(j, path);
  if (r.string_or("schema", "") != "ctxplan.measurement/1")
    r.fail("schema", "expected \"ctxplan.measurement/1\" (what ctxrun --report writes)");
  auto fill = [&](const std::string& key, const std::string& v) {
    if (!f.get(key)) f.kv.push_back({key, v});
  };
  fill("model", r.string("model"));
  fill("cluster", r.string("cluster"));
  fill("seq", std::to_string(r.integer("seq")));
  fill("plan", plan_to_string(plan_from_json(r.raw("plan"), path)));
  fill("runtime", ctxrun_runtime_for_backend(r.string_or("backend", "cuda")));
  const json* step = j.contains("time") && j["time"].is_object() && j["time"].contains("step_seconds") ? &j["time"]["step_seconds"] : nullptr;
  if (!step || !step->is_number()) r.fail("time.step_seconds", "missing; the report has no measured step time to calibrate to");
  fill("step_seconds", std::to_string(step->get<double>()));
  if (j.contains("memory") && j["memory"].is_object() && j["memory"].contains("peak_bytes") && j["memory"]["peak_bytes"].is_number())
    fill("peak_bytes", std::to_string(j["memory"]["peak_bytes"].get<double>()));
  f.kv.push_back({"measured_from", "ctxrun report " + path});
}

CalibrationRun make_run(const Profiles& profiles, Fields f, const std::string& file, size_t index) {
  if (const std::string* rep = f.get("report")) read_report(relative_to(file, *rep), f);
  CalibrationRun run;
  run.where = f.where;
  run.id = f.get("id") ? *f.get("id") : "run" + std::to_string(index + 1);
  for (const char* key : {"model", "cluster", "plan", "seq"})
    if (!f.get(key)) throw InputError(f.where, key, "missing; every run names its model, cluster, plan and seq (or a ctxrun \"report\")");
  run.model_name = *f.get("model");
  run.cluster_name = *f.get("cluster");
  run.model = resolve_model(profiles, run.model_name);
  run.cluster = resolve_cluster(profiles, run.cluster_name);
  if (f.get("runtime")) run.runtime_name = *f.get("runtime");
  if (f.get("attention")) run.attention = *f.get("attention");
  run.plan = parse_plan(*f.get("plan"), f.where + ": plan");
  run.seq = parse_tokens(*f.get("seq"), f.where + ": seq");
  PlanCheck chk = check_plan(run.plan, run.model, run.cluster, run.seq);
  if (!chk.ok()) throw InputError(f.where, "plan", "cannot run: " + chk.message());
  // the measured step: given, or read from a stack's measurement file
  const std::string* from = nullptr;
  for (auto& [k, v] : f.kv)
    if (k == "measured_from") from = &v;
  if (f.get("step_seconds")) run.measured_step_seconds = positive(f, "step_seconds");
  else if (f.get("step_ms")) run.measured_step_seconds = positive(f, "step_ms") / 1000.0;
  run.measured_from = from ? *from : "step_seconds";
  if (f.get("peak_bytes")) run.measured_peak_bytes = positive(f, "peak_bytes");
  else if (f.get("peak_gib")) run.measured_peak_bytes = positive(f, "peak_gib") * 1024.0 * 1024.0 * 1024.0;
  if (const std::string* meas = f.get("measurement")) {
    const std::string path = relative_to(file, *meas);
    std::optional<StackMeasurement> m = read_stack_measurement(path);
    if (!m) throw InputError(f.where, "measurement", path + " is a JSON document with a schema; give a ctxrun report as \"report\"");
    run.measured_from = m->format + " " + path;
    const double world = static_cast<double>(world_size(run.cluster));
    const double tokens = static_cast<double>(run.seq) * static_cast<double>(std::max<int64_t>(1, run.plan.dp) * run.plan.mbs * run.plan.ga);
    const double samples = static_cast<double>(std::max<int64_t>(1, run.plan.dp) * run.plan.mbs * run.plan.ga);
    if (m->global_batch && *m->global_batch != samples)
      throw InputError(f.where, "measurement",
                       path + " logs a global batch of " + std::to_string(static_cast<int64_t>(*m->global_batch)) +
                           " samples, the plan's dp x mbs x ga is " + std::to_string(static_cast<int64_t>(samples)) +
                           ": not this run's job");
    if (m->step_seconds) run.measured_step_seconds = *m->step_seconds;
    else if (m->tokens_per_second) run.measured_step_seconds = tokens / *m->tokens_per_second;
    else if (m->tokens_per_second_per_gpu) run.measured_step_seconds = tokens / (*m->tokens_per_second_per_gpu * world);
    if (m->peak_allocated_bytes && !run.measured_peak_bytes) run.measured_peak_bytes = *m->peak_allocated_bytes;
  }
  if (!(run.measured_step_seconds > 0))
    throw InputError(f.where, "step_seconds",
                     "missing; a run states its measured step (step_seconds or step_ms), or a measurement file or ctxrun report with one");
  return run;
}

// RFC 4180 cells: commas inside double quotes stay in the cell ("cp=8,zero=3"), "" is a quote.
std::vector<std::string> csv_cells(const std::string& line, const std::string& where) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') out.back() += '"', ++i;
      else if (c == '"') quoted = false;
      else out.back() += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else if (c != '\r') {
      out.back() += c;
    }
  }
  if (quoted) throw InputError(where, "", "a quoted cell is not closed");
  for (auto& s : out) {
    s.erase(0, s.find_first_not_of(" \t"));
    s.erase(s.find_last_not_of(" \t") + 1);
  }
  return out;
}

std::vector<Fields> csv_runs(const std::string& path, const std::string& text) {
  std::vector<Fields> runs;
  std::stringstream ss(text);
  std::string line;
  std::vector<std::string> header;
  for (int n = 1; std::getline(ss, line); ++n) {
    const std::string where = path + ":" + std::to_string(n);
    if (line.empty() || line[0] == '#' || line.find_first_not_of(" \t\r,") == std::string::npos) continue;
    std::vector<std::string> cells = csv_cells(line, where);
    if (header.empty()) {
      for (auto& c : cells) {
        bool known = false;
        for (const char* k : kColumns) known |= c == k;
        if (!known) throw InputError(where, c, "unknown column; valid: " + valid_columns());
      }
      header = cells;
      continue;
    }
    if (cells.size() != header.size())
      throw InputError(where, "", std::to_string(cells.size()) + " cells; the header has " + std::to_string(header.size()) +
                                      " (quote a plan with commas: \"cp=8,zero=3\")");
    Fields f;
    f.where = where;
    for (size_t i = 0; i < cells.size(); ++i) f.kv.push_back({header[i], cells[i]});
    runs.push_back(f);
  }
  if (header.empty()) throw InputError(path, "", "empty; expected a CSV header such as id,model,cluster,plan,seq,step_seconds");
  return runs;
}

std::vector<Fields> json_runs(const std::string& path, const json& j) {
  JsonReader r(j, path);
  std::vector<Fields> runs;
  const std::string schema = r.string_or("schema", "");
  if (schema == "ctxplan.measurement/1") {
    Fields f;
    f.where = path;
    f.kv.push_back({"report", fs::path(path).filename().string()});
    runs.push_back(f);
    return runs;
  }
  if (schema != "ctxplan.runs/1")
    r.fail("schema", "expected \"ctxplan.runs/1\" (a list of runs) or \"ctxplan.measurement/1\" (a ctxrun report), got \"" + schema + "\"");
  const json& list = r.raw("runs");
  if (!list.is_array()) r.fail("runs", "expected a list of runs");
  for (size_t i = 0; i < list.size(); ++i) {
    Fields f;
    f.where = path + ": runs[" + std::to_string(i) + "]";
    if (!list[i].is_object()) throw InputError(f.where, "", "expected an object with model, cluster, plan, seq and step_seconds");
    for (auto& [k, v] : list[i].items()) {
      bool known = false;
      for (const char* c : kColumns) known |= k == c;
      if (!known) throw InputError(f.where, k, "unknown field; valid: " + valid_columns());
      if (v.is_string()) f.kv.push_back({k, v.get<std::string>()});
      else if (v.is_number_integer()) f.kv.push_back({k, std::to_string(v.get<int64_t>())});
      else if (v.is_number()) {
        std::ostringstream os;
        os.precision(17);
        os << v.get<double>();
        f.kv.push_back({k, os.str()});
      } else if (k == "plan" && v.is_object()) f.kv.push_back({k, plan_to_string(plan_from_json(v, f.where + ": plan"))});
      else throw InputError(f.where, k, "expected a string or a number");
    }
    runs.push_back(f);
  }
  return runs;
}

}  // namespace

std::vector<CalibrationRun> read_calibration_runs(const Profiles& profiles, const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw InputError(path, "", "is a folder; expected a runs JSON or CSV file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "", "cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const size_t first = text.find_first_not_of(" \t\r\n");
  std::vector<Fields> fields = first != std::string::npos && text[first] == '{' ? json_runs(path, parse_json_text(text, path))
                                                                                 : csv_runs(path, text);
  if (fields.empty()) throw InputError(path, "runs", "no runs; expected at least one measured run");
  std::vector<CalibrationRun> runs;
  for (size_t i = 0; i < fields.size(); ++i) runs.push_back(make_run(profiles, fields[i], path, i));
  return runs;
}

}  // namespace ctx
