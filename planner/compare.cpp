#include "planner/compare.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>

#include "costmodel/memory_model.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/runtime_profile.hpp"
#include "planner/format.hpp"

namespace ctx {
namespace {

constexpr const char* kPredictionSchema = "ctxplan.prediction/1";
constexpr const char* kMeasurementSchema = "ctxplan.measurement/1";

// What each document is and where it comes from, for error messages.
const std::string kPredictionWhat = "what `ctxplan predict --json` writes";
const std::string kMeasurementWhat = "what `ctxrun --report run.json` writes";

// ---- reading fields with messages that say what would be valid ----------------------------------

const json& need(const JsonReader& r, const std::string& key, const std::string& valid) {
  if (!r.self().contains(key) || r.self().at(key).is_null()) r.fail(key, "missing; expected " + valid);
  return r.self().at(key);
}

double need_number(const JsonReader& r, const std::string& key, const std::string& valid) {
  const json& v = need(r, key, valid);
  if (!v.is_number()) r.fail(key, "expected " + valid + ", got " + json_excerpt(v));
  double d = v.get<double>();
  if (!std::isfinite(d) || d < 0) r.fail(key, "expected " + valid + " (finite, >= 0), got " + json_excerpt(v));
  return d;
}

JsonReader need_object(const JsonReader& r, const std::string& key, const std::string& valid) {
  const json& v = need(r, key, valid);
  if (!v.is_object()) r.fail(key, "expected " + valid + ", got " + std::string(v.type_name()));
  return JsonReader(v, r.where(), r.path(key));
}

std::string need_string(const JsonReader& r, const std::string& key, const std::string& valid) {
  const json& v = need(r, key, valid);
  if (!v.is_string()) r.fail(key, "expected " + valid + ", got " + json_excerpt(v));
  return v.get<std::string>();
}

int64_t need_count(const JsonReader& r, const std::string& key, const std::string& valid) {
  const json& v = need(r, key, valid);
  const auto n = json_exact_integer(v);  // range-checked before any cast
  if (!n) r.fail(key, "expected " + valid + ", got " + json_excerpt(v));
  if (*n < 1) r.fail(key, "expected " + valid + " (>= 1), got " + json_excerpt(v));
  return *n;
}

// ---- one side's numbers ----------------------------------------------------------------------------

struct MemorySide {
  std::array<double, kMemCategories> by_category{};
  double peak_bytes = 0;
  bool have_phases = false;
  std::array<double, kPhases> phase_peak_bytes{};
  bool have_host = false;
  std::array<double, kHostCategories> host_bytes{};
};

// memory: {peak_bytes, by_category: {weights..runtime}, phases: {forward..optimizer: {peak_bytes}},
// host_per_node: {by_category}} -- the same shape in both schemas (prediction_to_json, report.cpp)
MemorySide read_memory(const JsonReader& mem) {
  MemorySide s;
  s.peak_bytes = need_number(mem, "peak_bytes", "a number of bytes");
  JsonReader cats = need_object(mem, "by_category", "an object of bytes per category (weights, grads, ...)");
  for (int i = 0; i < kMemCategories; ++i)
    s.by_category[i] = need_number(cats, to_string(static_cast<Mem>(i)), "a number of bytes");
  if (mem.has("phases")) {
    JsonReader ph = need_object(mem, "phases", "an object {forward, loss, backward, optimizer: {peak_bytes}}");
    s.have_phases = true;
    for (int p = 0; p < kPhases; ++p) {
      JsonReader one = need_object(ph, to_string(static_cast<Phase>(p)), "an object with peak_bytes");
      s.phase_peak_bytes[p] = need_number(one, "peak_bytes", "a number of bytes");
    }
  }
  if (mem.has("host_per_node")) {
    JsonReader host = need_object(mem, "host_per_node", "an object with by_category");
    if (host.has("by_category")) {
      JsonReader hc = need_object(host, "by_category", "an object of host bytes per category");
      s.have_host = true;
      for (int i = 0; i < kHostCategories; ++i) {
        const char* name = to_string(static_cast<HostMem>(i));
        s.host_bytes[i] = hc.has(name) ? need_number(hc, name, "a number of bytes") : 0.0;
      }
    }
  }
  return s;
}

struct Job {
  std::string model, cluster, runtime, plan;
  int64_t seq = 0, world = 0;
};

// model, cluster, runtime, seq, world and the plan in canonical form (dp filled from world).
Job read_job(const JsonReader& r, const std::string& what) {
  Job j;
  j.model = need_string(r, "model", "the model name (" + what + ")");
  j.cluster = r.has("cluster") ? need_string(r, "cluster", "the cluster name") : "";
  j.runtime = r.has("runtime") ? need_string(r, "runtime", "the runtime name") : "";
  j.seq = need_count(r, "seq", "the sequence length in tokens");
  j.world = need_count(r, "world", "the number of ranks");
  Plan p;
  if (r.has("plan")) {
    const json& pj = r.raw("plan");
    if (!pj.is_object()) r.fail("plan", "expected an object of plan keys (plan_to_json), got " + json_excerpt(pj));
    p = plan_from_json(pj, r.where() + (r.path("plan") == "plan" ? "" : " (" + r.path("plan") + ")"));
  } else if (r.has("plan_string")) {
    p = parse_plan(need_string(r, "plan_string", "key=value,... plan text"), r.where() + ": " + r.path("plan_string"));
  } else {
    r.fail("plan", "missing; expected the plan object (or plan_string) of " + what);
  }
  const int64_t tpcp = p.tp * p.cp;
  if (p.dp == 0 && tpcp > 0 && j.world % tpcp == 0) p.dp = j.world / tpcp;
  j.plan = plan_to_string(p);
  return j;
}

std::string schema_of(const JsonReader& r, const std::string& expected_desc) {
  if (!r.has("schema")) r.fail("schema", "missing; expected " + expected_desc);
  const json& v = r.raw("schema");
  if (!v.is_string()) r.fail("schema", "expected " + expected_desc + ", got " + json_excerpt(v));
  return v.get<std::string>();
}

// ---- rows ------------------------------------------------------------------------------------------

void add_row(Comparison& c, const std::string& section, const std::string& name, const std::string& unit,
             double predicted, double measured, bool judged, const std::string& note = "") {
  CompareRow r;
  r.section = section;
  r.name = name;
  r.unit = unit;
  r.predicted = predicted;
  r.measured = measured;
  r.abs_error = measured - predicted;
  if (predicted != 0) {
    r.rel_defined = true;
    r.rel_error = (measured - predicted) / predicted;
  } else if (measured == 0) {
    r.rel_defined = true;  // both zero: agree exactly
  }
  r.judged = judged;
  r.tolerance = section == "memory" ? c.options.mem_tolerance : c.options.time_tolerance;
  r.miss = judged && (!r.rel_defined || std::fabs(r.rel_error) > r.tolerance);
  r.note = note;
  if (judged) c.judged++;
  if (r.miss) c.misses++;
  c.rows.push_back(r);
}

void add_measured_only(Comparison& c, const std::string& section, const std::string& name, const std::string& unit,
                       double measured, const std::string& note) {
  CompareRow r;
  r.section = section;
  r.name = name;
  r.unit = unit;
  r.has_predicted = false;
  r.measured = measured;
  r.judged = false;
  r.tolerance = section == "memory" ? c.options.mem_tolerance : c.options.time_tolerance;
  r.note = note;
  c.rows.push_back(r);
}

// The ranks array of a measurement: the element whose "rank" is `rank` (or, lacking "rank", the index).
JsonReader rank_object(const JsonReader& run, int64_t rank) {
  const json& ranks = need(run, "ranks", "an array of per-rank objects {rank, memory, time}");
  if (!ranks.is_array() || ranks.empty()) run.fail("ranks", "expected a non-empty array of per-rank objects {rank, memory, time}");
  for (size_t i = 0; i < ranks.size(); ++i) {
    const json& e = ranks[i];
    if (!e.is_object()) run.fail("ranks[" + std::to_string(i) + "]", "expected an object {rank, memory, time}");
    int64_t k = e.contains("rank") && e["rank"].is_number_integer() ? e["rank"].get<int64_t>() : static_cast<int64_t>(i);
    if (k == rank) return JsonReader(e, run.where(), run.path("ranks[" + std::to_string(i) + "]"));
  }
  throw InputError("--rank", "", std::to_string(rank) + " is not a rank of " + run.where() + "; valid: 0.." +
                                     std::to_string(ranks.size() - 1));
}

std::string bytes_text(double b) {
  // exact bytes with thousands separators: memory of ctxrun is meant to match to the byte
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", std::fabs(b));
  std::string digits = buf, out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (b < 0 ? "-" : "") + out;
}

std::string seconds_text(double s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", s);
  return buf;
}

std::string value_text(const CompareRow& r, double v, bool signed_) {
  std::string s = r.unit == "bytes" ? bytes_text(v) : r.unit == "seconds" ? seconds_text(v) : fixed(v, 0);
  if (signed_ && v > 0) s = "+" + s;
  return s;
}

std::string percent(double fraction) { return fixed(100.0 * fraction, 1) + "%"; }

// Long notes wrapped at `width` columns, continuation lines indented.
std::string wrapped(const std::string& text, const std::string& first, const std::string& rest, size_t width = 110) {
  std::istringstream in(text);
  std::string word, line = first, out;
  bool empty = true;
  while (in >> word) {
    if (!empty && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line = rest;
      empty = true;
    }
    line += (empty ? "" : " ") + word;
    empty = false;
  }
  return out + line + "\n";
}

}  // namespace

Comparison compare_documents(const json& pred_doc, const std::string& pred_where, const std::string& pred_prefix,
                             const json& run_doc, const std::string& run_where, const CompareOptions& o) {
  Comparison c;
  c.options = o;
  JsonReader pred(pred_doc, pred_where, pred_prefix);
  JsonReader run(run_doc, run_where);

  // ---- schemas: say which file is which when they look swapped
  std::string run_schema = schema_of(run, "\"" + std::string(kMeasurementSchema) + "\" (" + kMeasurementWhat + ")");
  if (run_schema != kMeasurementSchema) {
    std::string hint = run_schema == kPredictionSchema ? " (a prediction; the second file must be ctxrun's report)" : "";
    run.fail("schema", "expected \"" + std::string(kMeasurementSchema) + "\" (" + kMeasurementWhat + "), got \"" + run_schema +
                           "\"" + hint);
  }
  std::string pred_schema = schema_of(pred, "\"" + std::string(kPredictionSchema) + "\" (" + kPredictionWhat + ")");
  if (pred_schema != kPredictionSchema)
    pred.fail("schema", "expected \"" + std::string(kPredictionSchema) + "\" (" + kPredictionWhat +
                            ", or a ctxplan.measurement/1 report that embeds one under \"prediction\"), got \"" + pred_schema + "\"");

  Job pj = read_job(pred, kPredictionWhat);
  Job mj = read_job(run, kMeasurementWhat);
  c.model = mj.model;
  c.cluster = mj.cluster;
  c.plan = mj.plan;
  c.seq = mj.seq;
  c.world = mj.world;
  c.prediction_runtime = pj.runtime;
  c.measurement_runtime = mj.runtime;
  c.backend = run.has("backend") ? need_string(run, "backend", "the backend name") : "";

  // ---- the two files must describe the same job
  std::vector<std::string> diffs;
  if (pj.model != mj.model) diffs.push_back("model: predicted '" + pj.model + "', measured '" + mj.model + "'");
  if (pj.seq != mj.seq)
    diffs.push_back("seq: predicted " + std::to_string(pj.seq) + " tokens, measured " + std::to_string(mj.seq));
  if (pj.world != mj.world)
    diffs.push_back("world: predicted " + std::to_string(pj.world) + " ranks, measured " + std::to_string(mj.world));
  if (pj.plan != mj.plan) diffs.push_back("plan: predicted '" + pj.plan + "', measured '" + mj.plan + "'");
  if (!diffs.empty()) {
    std::string all;
    for (auto& d : diffs) all += (all.empty() ? "" : "; ") + d;
    if (!o.allow_mismatch)
      throw InputError(run_where, "", "does not describe the job " + pred_where + " predicts (" + all +
                                          "); predict the same job (ctxplan predict --model --seq --cluster --plan) or pass "
                                          "--allow-mismatch to compare anyway");
    for (auto& d : diffs) c.warnings.push_back("different jobs: " + d);
  }
  if (!pj.cluster.empty() && !mj.cluster.empty() && pj.cluster != mj.cluster)
    c.warnings.push_back("cluster: predicted for " + pj.cluster + ", the run's memory check used " + mj.cluster +
                         " (time and capacity are priced on the prediction's cluster)");
  // the runtime profile that describes the backend the run used (ctxrun-cpu, ctxrun-cuda)
  const std::string run_profile = c.backend.empty() ? std::string() : ctxrun_runtime_for_backend(c.backend);
  if (pj.runtime.rfind("ctxrun", 0) != 0)
    c.warnings.push_back("the prediction is for runtime '" + pj.runtime +
                         "' (another stack's constants); the measurement ran ctxrun: predict with --runtime " +
                         (run_profile.empty() ? std::string("ctxrun-cpu or ctxrun-cuda") : run_profile));
  else if (!run_profile.empty() && pj.runtime.rfind("ctxrun-", 0) == 0 &&
           pj.runtime.substr(0, pj.runtime.find(' ')) != run_profile)  // "ctxrun-cpu at precision=bf16 (...)": the name
    c.warnings.push_back("the run used ctxrun's " + c.backend + " backend (runtime profile '" + run_profile +
                         "') but the prediction is for runtime '" + pj.runtime +
                         "': dtypes, workspace and buffers may differ. Predict with --runtime " + run_profile +
                         ", or compare against the prediction the report embeds: `ctxplan compare " + run_where + "`");
  if (c.backend == "cpu")
    c.warnings.push_back("time was measured on the CPU backend; the prediction prices " +
                         (pj.cluster.empty() ? std::string("the cluster's GPUs") : pj.cluster) +
                         ": the time rows compare different machines (memory rows are meant to match)");

  // ---- which rank: memory of the highest peak, time of the slowest step, unless --rank
  JsonReader run_time = need_object(run, "time", "an object {step_seconds, phases: {forward, loss, backward, optimizer}}");
  std::optional<JsonReader> mem_src, time_src;
  if (o.rank >= 0) {
    JsonReader rk = rank_object(run, o.rank);
    mem_src.emplace(need_object(rk, "memory", "the rank's memory object"));
    time_src.emplace(need_object(rk, "time", "the rank's time object"));
    c.memory_rank = c.time_rank = o.rank;
    c.memory_rank_why = c.time_rank_why = "--rank";
  } else {
    JsonReader top_mem = need_object(run, "memory", "an object {peak_bytes, by_category, phases, ...}");
    mem_src.emplace(top_mem);
    c.memory_rank = top_mem.has("peak_rank") ? top_mem.integer("peak_rank") : 0;
    c.memory_rank_why = "the highest peak";
    time_src.emplace(run_time);
    c.time_rank = c.memory_rank;
    c.time_rank_why = "the rank with the highest peak (no per-rank times)";
    if (run.has("ranks")) {
      const json& ranks = run.raw("ranks");
      double slowest = -1;
      for (size_t i = 0; ranks.is_array() && i < ranks.size(); ++i) {
        const json& e = ranks[i];
        if (!e.is_object() || !e.contains("time") || !e["time"].is_object()) continue;
        const json& t = e["time"];
        if (!t.contains("step_seconds") || !t["step_seconds"].is_number()) continue;
        double s = t["step_seconds"].get<double>();
        if (s > slowest) {
          slowest = s;
          c.time_rank = e.contains("rank") && e["rank"].is_number_integer() ? e["rank"].get<int64_t>() : static_cast<int64_t>(i);
        }
      }
      if (slowest >= 0) {
        JsonReader rk = rank_object(run, c.time_rank);
        time_src.emplace(need_object(rk, "time", "the rank's time object"));
        c.time_rank_why = "the slowest step";
      }
    }
  }

  // ---- memory: categories 1:1, the peak, host offload, per-phase peaks
  MemorySide pm = read_memory(need_object(pred, "memory", "an object {peak_bytes, by_category, phases, ...}"));
  MemorySide mm = read_memory(*mem_src);
  for (int i = 0; i < kMemCategories; ++i) {
    if (pm.by_category[i] == 0 && mm.by_category[i] == 0) continue;  // neither side has any: nothing to read
    add_row(c, "memory", to_string(static_cast<Mem>(i)), "bytes", pm.by_category[i], mm.by_category[i], true);
  }
  add_row(c, "memory", "total (peak)", "bytes", pm.peak_bytes, mm.peak_bytes, true);
  c.mapping.push_back("memory categories: the same names on both sides (weights, grads, master_weights, optimizer, "
                      "activations, checkpoints, workspace, comm_buffers, logits, mask, runtime), each at its side's "
                      "peak instant; categories zero on both sides are left out");
  if (pm.have_host && mm.have_host) {
    // ctxrun measures what it offloads; the prediction's host "runtime" (process image, MPI and
    // loader buffers) is not an allocation ctxrun tracks, so it stays out of the judged row
    double p = 0, m = 0;
    for (int i = 0; i < kHostCategories; ++i) {
      if (static_cast<HostMem>(i) == HostMem::runtime) continue;
      p += pm.host_bytes[i];
      m += mm.host_bytes[i];
    }
    if (p != 0 || m != 0) {
      add_row(c, "memory", "host per node (offloaded)", "bytes", p, m, true);
      c.mapping.push_back("host per node (offloaded): host optimizer + master_weights + grads + weights + checkpoints; "
                          "the prediction's host 'runtime' (process footprint) is not measured by ctxrun and is left out");
    }
  }
  if (pm.have_phases && mm.have_phases) {
    // the memory phases (forward, loss, backward, optimizer) are the same on both sides: each phase's
    // own peak instant. A measured 0 where the prediction has bytes is no measurement: an older ctxrun
    // recorded a phase's peak only when that phase allocated (its optimizer updates in place).
    bool unrecorded = false;
    for (int p = 0; p < kPhases; ++p) {
      const std::string name = std::string("peak in ") + to_string(static_cast<Phase>(p));
      const double pv = pm.phase_peak_bytes[p], mv = mm.phase_peak_bytes[p];
      if (mv == 0 && pv > 0) {
        add_row(c, "memory", "~" + name, "bytes", pv, mv, false, "not recorded by this run");
        unrecorded = true;
      } else {
        add_row(c, "memory", name, "bytes", pv, mv, true);
      }
    }
    c.mapping.push_back("peak in <phase>: the memory phases (forward, loss, backward, optimizer) are the same on both "
                        "sides, each at its own peak instant" +
                        std::string(unrecorded ? "; a measured 0 is shown, not judged: this ctxrun recorded no peak in "
                                                 "that phase (older ctxrun records one only when the phase allocates)"
                                               : ""));
  }

  // ---- time. The prediction's forward holds the layers + the head and loss forward, its backward the
  // head and loss backward + the layers (recompute included); ctxrun times the head and loss, forward
  // and backward together, as a phase of its own ("loss"). Only their sum pairs exactly.
  JsonReader pt = need_object(pred, "time", "an object {step_seconds, phases_seconds, tokens_per_second}");
  JsonReader pph = need_object(pt, "phases_seconds", "an object {forward, backward, optimizer} in seconds");
  const double p_fwd = need_number(pph, "forward", "seconds"), p_bwd = need_number(pph, "backward", "seconds"),
               p_opt = need_number(pph, "optimizer", "seconds");
  const double p_step = need_number(pt, "step_seconds", "seconds");
  const double p_tps = need_number(pt, "tokens_per_second", "tokens per second");
  JsonReader mt = *time_src;
  JsonReader mph = need_object(mt, "phases", "an object {forward, loss, backward, optimizer} in seconds");
  const double m_fwd = need_number(mph, "forward", "seconds"), m_loss = need_number(mph, "loss", "seconds"),
               m_bwd = need_number(mph, "backward", "seconds"), m_opt = need_number(mph, "optimizer", "seconds");
  const double m_step = need_number(mt, "step_seconds", "seconds (the sum of the phase means)");
  add_row(c, "time", "~forward", "seconds", p_fwd, m_fwd, false, "measured: layers only (head and loss are in 'loss')");
  add_measured_only(c, "time", "~loss (head + loss, fwd + bwd)", "seconds", m_loss,
                    "measured only: predicted inside forward and backward");
  add_row(c, "time", "~backward", "seconds", p_bwd, m_loss + m_bwd, false, "measured: loss + backward");
  add_row(c, "time", "forward+backward", "seconds", p_fwd + p_bwd, m_fwd + m_loss + m_bwd, true,
          "measured: forward + loss + backward");
  add_row(c, "time", "optimizer", "seconds", p_opt, m_opt, true);
  add_row(c, "time", "step", "seconds", p_step, m_step, true, "measured: sum of the phase means");
  if (run_time.has("wall_step_seconds"))
    add_row(c, "time", "~step (wall clock)", "seconds", p_step,
            need_number(run_time, "wall_step_seconds", "seconds (mean wall-clock step after the first)"), false,
            "measured: mean wall-clock step after the first");
  if (run_time.has("tokens_per_second"))
    add_row(c, "time", "tokens/s", "tokens/s", p_tps,
            need_number(run_time, "tokens_per_second", "tokens per second (whole job)"), true,
            "measured: tokens per step (dp x ga x mbs x seq) / mean wall-clock step after the first");
  c.mapping.push_back("time phases: the prediction's forward includes the head and loss forward and its backward the head "
                      "and loss backward (and recompute); ctxrun times the head and loss, forward and backward, as its own "
                      "'loss' phase. forward+backward (measured forward + loss + backward) pairs exactly and is judged; "
                      "~forward and ~backward (measured loss + backward) are shown, not judged");
  c.mapping.push_back("step: measured = the sum of the per-phase means (the first, warm-up step included, as ctxrun "
                      "reports); tokens/s: measured = tokens per step (dp x ga x mbs x seq) / mean wall-clock step after the "
                      "first");
  return c;
}

void judge_step_band(Comparison& c, const json& pred) {
  const json::json_pointer at("/time/band");
  if (!pred.is_object() || !pred.contains(at)) return;
  const json& b = pred.at(at);
  if (!b.is_object() || !b.contains("p10_step_seconds") || !b.contains("p90_step_seconds") || !b["p10_step_seconds"].is_number() ||
      !b["p90_step_seconds"].is_number())
    return;
  for (const CompareRow& r : c.rows) {
    if (r.section != "time" || r.name != "step") continue;
    c.has_band = true;
    c.band_low_seconds = b["p10_step_seconds"].get<double>();
    c.band_high_seconds = b["p90_step_seconds"].get<double>();
    c.band_basis = b.value("basis", "");
    c.band_measured_seconds = r.measured;
    c.step_in_band = r.measured >= c.band_low_seconds && r.measured <= c.band_high_seconds;
  }
}

namespace {
json read_document(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(path, "", "is a folder; expected a JSON file");
  return read_json_file(path);
}

}  // namespace

Comparison compare_files(const std::string& prediction_path, const std::string& run_path, const CompareOptions& o) {
  json first = read_document(prediction_path);
  if (run_path.empty()) {
    // one file: a report that embeds the prediction ctxrun made for itself
    JsonReader r(first, prediction_path);
    std::string schema = schema_of(r, "\"" + std::string(kMeasurementSchema) + "\" (" + kMeasurementWhat + ")");
    if (schema != kMeasurementSchema)
      r.fail("schema", "with one file, expected \"" + std::string(kMeasurementSchema) + "\" (" + kMeasurementWhat +
                           ") carrying its own \"prediction\", got \"" + schema + "\"; or give PREDICTION.json RUN.json");
    const json& p = need(r, "prediction", "the embedded prediction object (ctxrun writes it with --report)");
    if (!p.is_object()) r.fail("prediction", "expected an object (" + kPredictionWhat + ")");
    Comparison c = compare_documents(p, prediction_path, "prediction", first, prediction_path, o);
    c.prediction_file = c.measurement_file = prediction_path;
    c.prediction_source = "embedded";
    return c;
  }
  json second = read_document(run_path);
  // a report given as the prediction: use the prediction it embeds
  if (first.is_object() && first.value("schema", json()) == kMeasurementSchema && first.contains("prediction") &&
      first["prediction"].is_object()) {
    Comparison c = compare_documents(first["prediction"], prediction_path, "prediction", second, run_path, o);
    c.prediction_file = prediction_path;
    c.measurement_file = run_path;
    c.prediction_source = "embedded";
    return c;
  }
  Comparison c = compare_documents(first, prediction_path, "", second, run_path, o);
  judge_step_band(c, first);
  c.prediction_file = prediction_path;
  c.measurement_file = run_path;
  c.prediction_source = "file";
  return c;
}

std::string comparison_table(const Comparison& c) {
  std::ostringstream os;
  os << "ctxplan compare: prediction " << c.prediction_file
     << (c.prediction_source == "embedded" ? " (the prediction the report embeds)" : "") << " vs measurement "
     << c.measurement_file << "\n";
  os << "job: " << c.model << ", seq " << c.seq << " tokens, plan " << c.plan << ", " << c.world << " ranks, cluster "
     << c.cluster << "\n";
  os << "prediction runtime: " << c.prediction_runtime << "; measured: " << c.measurement_runtime
     << (c.backend.empty() ? "" : ", " + c.backend + " backend") << "\n";
  os << "memory of rank " << c.memory_rank << " (" << c.memory_rank_why << "), time of rank " << c.time_rank << " ("
     << c.time_rank_why << "); tolerance: memory " << percent(c.options.mem_tolerance) << ", time "
     << percent(c.options.time_tolerance) << "\n";
  for (const char* section : {"memory", "time"}) {
    Table t;
    t.header = {"", "predicted", "measured", "error", "rel. error", "status"};
    for (const CompareRow& r : c.rows) {
      if (r.section != section) continue;
      std::string rel = !r.has_predicted ? "" : r.rel_defined ? (r.rel_error > 0 ? "+" : "") + fixed(100.0 * r.rel_error, 2) + "%"
                                                              : "n/a (pred 0)";
      std::string status = !r.judged ? "~" : r.miss ? "MISS" : "ok";
      t.rows.push_back({r.name, r.has_predicted ? value_text(r, r.predicted, false) : "-", value_text(r, r.measured, false),
                        r.has_predicted ? value_text(r, r.abs_error, true) : "", rel, status});
    }
    os << "\n" << (std::string(section) == "memory" ? "Memory per GPU (bytes):" : "Time per step (seconds; tokens/s):")
       << "\n" << t.render();
  }
  os << "\n~ = shown, not judged (the two sides do not pair 1:1). Mapping:\n";
  for (auto& m : c.mapping) os << wrapped(m, "  - ", "    ");
  for (auto& w : c.warnings) os << wrapped(w, "warning: ", "  ");
  if (c.has_band)
    os << "\nstep time band (p10-p90, " << c.band_basis << "): " << fixed(c.band_low_seconds, 3) << " - " << fixed(c.band_high_seconds, 3)
       << " s; the measured " << fixed(c.band_measured_seconds, 3) << " s is " << (c.step_in_band ? "INSIDE" : "OUTSIDE") << " it\n";
  os << "\n";
  if (c.misses == 0) {
    os << "WITHIN TOLERANCE: all " << c.judged << " judged rows\n";
  } else {
    std::string names;
    for (auto& r : c.rows)
      if (r.miss) names += (names.empty() ? "" : ", ") + r.name;
    os << "OVER TOLERANCE: " << c.misses << " of " << c.judged << " judged rows (" << names << ")\n";
  }
  return os.str();
}

json comparison_to_json(const Comparison& c) {
  json rows = json::array();
  for (const CompareRow& r : c.rows) {
    json j = {{"section", r.section}, {"name", r.name}, {"unit", r.unit}, {"measured", r.measured},
              {"judged", r.judged}, {"tolerance", r.tolerance}, {"miss", r.miss}, {"note", r.note}};
    j["predicted"] = r.has_predicted ? json(r.predicted) : json(nullptr);
    j["abs_error"] = r.has_predicted ? json(r.abs_error) : json(nullptr);
    j["rel_error"] = r.has_predicted && r.rel_defined ? json(r.rel_error) : json(nullptr);
    rows.push_back(j);
  }
  return {{"schema", "ctxplan.comparison/1"},
          {"prediction_file", c.prediction_file},
          {"prediction_source", c.prediction_source},
          {"measurement_file", c.measurement_file},
          {"job",
           {{"model", c.model}, {"cluster", c.cluster}, {"seq", c.seq}, {"world", c.world}, {"plan", c.plan},
            {"prediction_runtime", c.prediction_runtime}, {"measurement_runtime", c.measurement_runtime},
            {"backend", c.backend}}},
          {"memory_rank", c.memory_rank},
          {"memory_rank_why", c.memory_rank_why},
          {"time_rank", c.time_rank},
          {"time_rank_why", c.time_rank_why},
          {"tolerance", {{"memory", c.options.mem_tolerance}, {"time", c.options.time_tolerance}}},
          {"rows", rows},
          {"judged", c.judged},
          {"misses", c.misses},
          {"mapping", c.mapping},
          {"warnings", c.warnings},
          {"band", c.has_band ? json{{"p10_step_seconds", c.band_low_seconds}, {"p90_step_seconds", c.band_high_seconds},
                                     {"measured_step_seconds", c.band_measured_seconds}, {"inside", c.step_in_band},
                                     {"basis", c.band_basis}}
                              : json(nullptr)}};
}

}  // namespace ctx
