// Readers for the stacks' own measurements and their comparison with a prediction
// (planner/stack_measurements.hpp; formats and column names in docs/STACKS.md).
#include "planner/stack_measurements.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "costmodel/errors.hpp"
#include "costmodel/plan.hpp"

namespace ctx {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;  // Megatron's report_memory divides by 1024*1024 and says "MB"
constexpr double kGiB = 1024.0 * kMiB;
constexpr size_t kMaxLineChars = 8192;  // a Megatron or torchtitan log line is a few hundred characters

std::string read_all(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(path, "", "is a folder; expected a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "", "cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string line;
  static const std::regex ansi("\x1b\\[[0-9;]*m");  // torchtitan colours its log
  while (std::getline(ss, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // std::regex recurses per character: longer lines are no log line of these stacks, and are left
    // for the readers to skip rather than risk the stack
    if (line.size() > kMaxLineChars) line.clear();
    else if (line.find('\x1b') != std::string::npos) line = std::regex_replace(line, ansi, "");
    out.push_back(line);
  }
  return out;
}

double number_at(const std::string& text, const std::string& where, int line, const std::string& field) {
  std::string t;
  for (char c : text)
    if (c != ',') t += c;  // "1,234" tokens per second
  try {
    size_t used = 0;
    double v = std::stod(t, &used);
    if (used == t.size() && std::isfinite(v) && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw InputError(where + ":" + std::to_string(line), field, "expected a non-negative number, got '" + text + "'");
}

// Mean over the steps after the first (warm-up: compilation, allocator growth) when there are more.
double mean_after_warmup(const std::vector<double>& v, int64_t* used) {
  size_t from = v.size() > 1 ? 1 : 0;
  double s = 0;
  for (size_t i = from; i < v.size(); ++i) s += v[i];
  *used = static_cast<int64_t>(v.size() - from);
  return s / static_cast<double>(v.size() - from);
}

StackMeasurement read_megatron(const std::vector<std::string>& lines, const std::string& where) {
  StackMeasurement m;
  m.format = "Megatron-LM log";
  m.where = where;
  static const std::regex elapsed(R"(elapsed time per iteration \(ms\):\s*([0-9.eE+-]+))");
  static const std::regex gbs(R"(global batch size:\s*([0-9]+))");
  static const std::regex tflops(R"(throughput per GPU \(TFLOP/s/GPU\):\s*([0-9.eE+-]+))");
  static const std::regex max_alloc(R"(max allocated:\s*([0-9.eE+-]+))");
  static const std::regex max_res(R"(max reserved:\s*([0-9.eE+-]+))");
  std::vector<double> step_ms, tf;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    const int ln = static_cast<int>(i) + 1;
    std::smatch mt;
    if (std::regex_search(l, mt, elapsed)) {
      step_ms.push_back(number_at(mt[1], where, ln, "elapsed time per iteration (ms)"));
      if (std::regex_search(l, mt, gbs)) {
        double g = number_at(mt[1], where, ln, "global batch size");
        if (m.global_batch && *m.global_batch != g)
          throw InputError(where + ":" + std::to_string(ln), "global batch size",
                           "changes during the log (batch-size ramp-up); compare iterations of one batch size");
        m.global_batch = g;
      }
      if (std::regex_search(l, mt, tflops)) tf.push_back(number_at(mt[1], where, ln, "throughput per GPU"));
    }
    if (std::regex_search(l, mt, max_alloc)) {
      double b = number_at(mt[1], where, ln, "max allocated") * kMiB;
      m.peak_allocated_bytes = std::max(m.peak_allocated_bytes.value_or(0), b);
    }
    if (std::regex_search(l, mt, max_res)) {
      double b = number_at(mt[1], where, ln, "max reserved") * kMiB;
      m.peak_reserved_bytes = std::max(m.peak_reserved_bytes.value_or(0), b);
    }
  }
  m.steps_read = static_cast<int64_t>(step_ms.size());
  if (!step_ms.empty()) m.step_seconds = mean_after_warmup(step_ms, &m.steps_used) / 1000.0;
  if (!tf.empty()) {
    int64_t u = 0;
    m.tflops_per_gpu = mean_after_warmup(tf, &u);
  }
  if (!m.step_seconds && !m.peak_allocated_bytes)
    throw InputError(where, "", "no Megatron iteration lines ('elapsed time per iteration (ms): ...') and no memory "
                                "lines ('max allocated: ...')");
  return m;
}

StackMeasurement read_torchtitan(const std::vector<std::string>& lines, const std::string& where) {
  StackMeasurement m;
  m.format = "torchtitan log";
  m.where = where;
  static const std::regex step(R"(step:\s*([0-9]+))");
  static const std::regex mem(R"(memory:\s*([0-9.]+)\s*GiB)");
  static const std::regex tps(R"((?:tps|wps):\s*([0-9,.]+))");
  static const std::regex tflops(R"(tflops:\s*([0-9,.]+))");
  static const std::regex mfu(R"(mfu:\s*([0-9.]+)%)");
  std::vector<double> t, tf, mf;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    const int ln = static_cast<int>(i) + 1;
    std::smatch mt;
    if (!std::regex_search(l, mt, step)) continue;
    std::smatch x;
    if (!std::regex_search(l, x, tps)) continue;  // "step: N" lines of other loggers
    t.push_back(number_at(x[1], where, ln, "tps"));
    if (std::regex_search(l, x, tflops)) tf.push_back(number_at(x[1], where, ln, "tflops"));
    if (std::regex_search(l, x, mfu)) mf.push_back(number_at(x[1], where, ln, "mfu"));
    if (std::regex_search(l, x, mem)) {
      double b = number_at(x[1], where, ln, "memory") * kGiB;
      m.peak_reserved_bytes = std::max(m.peak_reserved_bytes.value_or(0), b);
    }
  }
  if (t.empty()) throw InputError(where, "", "no torchtitan metrics lines ('step: N  loss: ...  memory: X GiB  tps: T ...')");
  m.steps_read = static_cast<int64_t>(t.size());
  m.tokens_per_second_per_gpu = mean_after_warmup(t, &m.steps_used);
  int64_t u = 0;
  if (!tf.empty()) m.tflops_per_gpu = mean_after_warmup(tf, &u);
  if (!mf.empty()) m.mfu = mean_after_warmup(mf, &u) / 100.0;
  return m;
}

StackMeasurement read_memory_stats(const json& j, const std::string& where) {
  StackMeasurement m;
  m.format = "torch.cuda.memory_stats";
  m.where = where;
  std::vector<const json*> dumps;
  if (j.is_array()) {
    for (const json& e : j)
      if (e.is_object()) dumps.push_back(&e);
  } else {
    dumps.push_back(&j);
  }
  for (size_t i = 0; i < dumps.size(); ++i) {
    const json& d = *dumps[i];
    const std::string at = j.is_array() ? "[" + std::to_string(i) + "]." : "";
    if (!d.contains("allocated_bytes.all.peak"))
      throw InputError(where, at + "allocated_bytes.all.peak", "missing; expected a torch.cuda.memory_stats() dictionary");
    for (const char* key : {"allocated_bytes.all.peak", "reserved_bytes.all.peak"}) {
      if (!d.contains(key)) continue;
      const json& v = d.at(key);
      if (!v.is_number() || v.get<double>() < 0) throw InputError(where, at + key, "expected a number of bytes");
      auto& slot = std::string(key).rfind("allocated", 0) == 0 ? m.peak_allocated_bytes : m.peak_reserved_bytes;
      slot = std::max(slot.value_or(0), v.get<double>());
    }
  }
  if (dumps.size() > 1) m.notes.push_back("the highest peak of " + std::to_string(dumps.size()) + " dumps (ranks)");
  return m;
}

StackMeasurement read_csv(const std::vector<std::string>& lines, const std::string& where) {
  StackMeasurement m;
  m.format = "CSV";
  m.where = where;
  auto split = [](const std::string& l) {
    std::vector<std::string> cells;
    std::stringstream ss(l);
    std::string c;
    while (std::getline(ss, c, ',')) {
      c.erase(0, c.find_first_not_of(" \t\""));
      c.erase(c.find_last_not_of(" \t\"") + 1);
      cells.push_back(c);
    }
    return cells;
  };
  size_t h = 0;
  while (h < lines.size() && (lines[h].empty() || lines[h][0] == '#')) ++h;
  if (h == lines.size()) throw InputError(where, "", "empty CSV; expected a header such as step_seconds,tokens_per_second,peak_bytes");
  std::vector<std::string> header = split(lines[h]);
  std::vector<std::string> valid = {"step",           "step_seconds",      "step_ms",           "tokens_per_second",
                                    "tokens_per_second_per_gpu",           "peak_bytes",        "peak_gib",
                                    "peak_mib",       "reserved_bytes",    "reserved_gib",      "forward_seconds",
                                    "backward_seconds", "optimizer_seconds"};
  for (int i = 0; i < kMemCategories; ++i) valid.push_back(to_string(static_cast<Mem>(i)) + std::string("_bytes"));
  for (const std::string& c : header)
    if (std::find(valid.begin(), valid.end(), c) == valid.end()) {
      std::string all;
      for (auto& v : valid) all += (all.empty() ? "" : ", ") + v;
      throw InputError(where + ":" + std::to_string(h + 1), c, "unknown column; valid: " + all);
    }
  std::vector<std::vector<double>> cols(header.size());
  for (size_t i = h + 1; i < lines.size(); ++i) {
    if (lines[i].empty() || lines[i][0] == '#') continue;
    std::vector<std::string> cells = split(lines[i]);
    if (cells.size() != header.size())
      throw InputError(where + ":" + std::to_string(i + 1), "",
                       std::to_string(cells.size()) + " cells; the header has " + std::to_string(header.size()));
    for (size_t c = 0; c < cells.size(); ++c) cols[c].push_back(number_at(cells[c], where, static_cast<int>(i + 1), header[c]));
  }
  if (cols.empty() || cols[0].empty()) throw InputError(where, "", "a header but no rows");
  m.steps_read = static_cast<int64_t>(cols[0].size());
  for (size_t c = 0; c < header.size(); ++c) {
    const std::string& n = header[c];
    const std::vector<double>& v = cols[c];
    int64_t used = 0;
    const double mean = mean_after_warmup(v, &used), peak = *std::max_element(v.begin(), v.end());
    if (n == "step_seconds") m.step_seconds = mean, m.steps_used = used;
    else if (n == "step_ms") m.step_seconds = mean / 1000.0, m.steps_used = used;
    else if (n == "tokens_per_second") m.tokens_per_second = mean;
    else if (n == "tokens_per_second_per_gpu") m.tokens_per_second_per_gpu = mean;
    else if (n == "peak_bytes") m.peak_allocated_bytes = peak;
    else if (n == "peak_gib") m.peak_allocated_bytes = peak * kGiB;
    else if (n == "peak_mib") m.peak_allocated_bytes = peak * kMiB;
    else if (n == "reserved_bytes") m.peak_reserved_bytes = peak;
    else if (n == "reserved_gib") m.peak_reserved_bytes = peak * kGiB;
    else if (n == "forward_seconds") m.forward_seconds = mean;
    else if (n == "backward_seconds") m.backward_seconds = mean;
    else if (n == "optimizer_seconds") m.optimizer_seconds = mean;
    else
      for (int i = 0; i < kMemCategories; ++i)
        if (n == to_string(static_cast<Mem>(i)) + std::string("_bytes")) m.category_bytes[i] = peak;
  }
  return m;
}

void add(Comparison& c, const std::string& section, const std::string& name, const std::string& unit, double p, double m,
         bool judged, const std::string& note = "") {
  CompareRow r;
  r.section = section;
  r.name = (judged ? "" : "~") + name;
  r.unit = unit;
  r.predicted = p;
  r.measured = m;
  r.abs_error = m - p;
  if (p != 0) {
    r.rel_defined = true;
    r.rel_error = (m - p) / p;
  } else if (m == 0) {
    r.rel_defined = true;
  }
  r.judged = judged;
  r.tolerance = section == "memory" ? c.options.mem_tolerance : c.options.time_tolerance;
  r.miss = judged && (!r.rel_defined || std::abs(r.rel_error) > r.tolerance);
  r.note = note;
  if (judged) {
    ++c.judged;
    if (r.miss) ++c.misses;
  }
  c.rows.push_back(r);
}

double num(const json& j, const std::string& path, const std::string& where) {
  const json* v = &j;
  std::stringstream ss(path);
  std::string k;
  while (std::getline(ss, k, '.')) {
    if (!v->is_object() || !v->contains(k)) throw InputError(where, path, "missing; expected " + std::string("what `ctxplan predict --json` writes"));
    v = &v->at(k);
  }
  if (!v->is_number()) throw InputError(where, path, "expected a number");
  return v->get<double>();
}

}  // namespace

std::optional<StackMeasurement> read_stack_measurement(const std::string& path) {
  const std::string text = read_all(path);
  const size_t first = text.find_first_not_of(" \t\r\n");
  const size_t second = first == std::string::npos ? first : text.find_first_not_of(" \t\r\n", first + 1);
  const bool json_array = first != std::string::npos && text[first] == '[' && second != std::string::npos &&
                          (text[second] == '{' || text[second] == ']');  // not "[rank0]:[titan] ..." log lines
  if (first != std::string::npos && (text[first] == '{' || json_array)) {
    json j = parse_json_text(text, path);
    const json& probe = j.is_array() && !j.empty() ? j[0] : j;
    if (probe.is_object() && probe.contains("allocated_bytes.all.peak")) return read_memory_stats(j, path);
    return std::nullopt;  // a ctxrun report (or another schema): compare_files says what it expects
  }
  std::vector<std::string> lines = lines_of(text);
  if (text.find("elapsed time per iteration (ms)") != std::string::npos || text.find("max allocated:") != std::string::npos)
    return read_megatron(lines, path);
  static const std::regex titan(R"(step:\s*[0-9]+.*(tps|wps):)");
  for (const std::string& l : lines)
    if (l.find("step:") != std::string::npos && std::regex_search(l, titan)) return read_torchtitan(lines, path);
  for (const std::string& l : lines)
    if (!l.empty() && l[0] != '#') {
      if (l.find(',') != std::string::npos || l.find("_") != std::string::npos) return read_csv(lines, path);
      break;
    }
  throw InputError(path, "",
                   "not a measurement ctxplan reads; expected a ctxrun report (ctxplan.measurement/1 JSON), Megatron-LM "
                   "iteration log lines, torchtitan metrics lines, a torch.cuda.memory_stats() JSON dump, or a CSV with "
                   "a header (docs/STACKS.md)");
}

Comparison compare_stack_measurement(const json& pred, const std::string& pred_where, const StackMeasurement& m,
                                     const CompareOptions& o) {
  Comparison c;
  c.options = o;
  c.prediction_file = pred_where;
  c.measurement_file = m.where;
  c.prediction_source = "file";
  JsonReader r(pred, pred_where);
  if (r.string_or("schema", "") != "ctxplan.prediction/1")
    r.fail("schema", "expected \"ctxplan.prediction/1\" (what `ctxplan predict --json` writes) to compare with " + m.format);
  c.model = r.string("model");
  c.cluster = r.string_or("cluster", "");
  c.seq = r.integer("seq");
  c.world = r.integer("world");
  Plan plan = plan_from_json(r.raw("plan"), pred_where);
  if (plan.dp == 0 && c.world % (plan.tp * plan.cp) == 0) plan.dp = c.world / (plan.tp * plan.cp);
  c.plan = plan_to_string(plan);
  c.prediction_runtime = r.string_or("runtime", "");
  c.measurement_runtime = m.format;
  c.memory_rank_why = c.time_rank_why = "as the " + m.format + " reports it";
  for (const std::string& n : m.notes) c.warnings.push_back(n);
  if (o.rank >= 0) c.warnings.push_back("--rank is ignored: " + m.format + " has no per-rank breakdown");

  const double p_step = num(pred, "time.step_seconds", pred_where);
  const double p_tps = num(pred, "time.tokens_per_second", pred_where);
  const double tokens_per_step = p_tps * p_step;  // dp x ga x mbs x seq
  const double p_peak = num(pred, "memory.peak_bytes", pred_where);
  const double p_runtime = num(pred, "memory.by_category.runtime", pred_where);
  const double samples_per_step = static_cast<double>(plan.dp * plan.ga * plan.mbs);

  if (m.global_batch && *m.global_batch != samples_per_step) {
    std::string d = "global batch size: the log's " + std::to_string(static_cast<int64_t>(*m.global_batch)) +
                    " samples per step, the prediction's dp x ga x mbs = " + std::to_string(static_cast<int64_t>(samples_per_step));
    if (!o.allow_mismatch)
      throw InputError(m.where, "global batch size",
                       "does not describe the job " + pred_where + " predicts (" + d + "); pass --allow-mismatch to compare anyway");
    c.warnings.push_back("different jobs: " + d);
  }

  // ---- memory
  bool any_category = false;
  for (int i = 0; i < kMemCategories; ++i) {
    if (!m.category_bytes[i]) continue;
    any_category = true;
    const std::string name = to_string(static_cast<Mem>(i));
    add(c, "memory", name, "bytes", num(pred, "memory.by_category." + name, pred_where), *m.category_bytes[i], true);
  }
  if (any_category) c.mapping.push_back("memory categories: the CSV's <category>_bytes columns, peak over its rows");
  if (m.peak_allocated_bytes) {
    add(c, "memory", "peak (allocated)", "bytes", p_peak - p_runtime, *m.peak_allocated_bytes, true,
        "predicted: peak minus the 'runtime' category");
    c.mapping.push_back("peak (allocated): the allocator's peak of live tensors (" + m.format +
                        ") vs the predicted peak without its 'runtime' category (CUDA context, NCCL buffers, allocator "
                        "slack), which PyTorch's allocated bytes do not count");
  }
  if (m.peak_reserved_bytes) {
    add(c, "memory", "peak (reserved)", "bytes", p_peak, *m.peak_reserved_bytes, false,
        "reserved includes cached blocks: shown, not judged");
    c.mapping.push_back("~peak (reserved): the caching allocator's reserved peak" +
                        std::string(m.format == "torchtitan log" ? " (torchtitan's 'memory' is max reserved)" : "") +
                        " vs the predicted peak with 'runtime'; cached, unused blocks make it higher, so it is not judged");
  }

  // ---- time
  if (m.forward_seconds || m.backward_seconds) {
    if (m.forward_seconds && m.backward_seconds)
      add(c, "time", "forward+backward", "seconds", num(pred, "time.phases_seconds.forward", pred_where) +
                                                         num(pred, "time.phases_seconds.backward", pred_where),
          *m.forward_seconds + *m.backward_seconds, true);
    if (m.forward_seconds) add(c, "time", "forward", "seconds", num(pred, "time.phases_seconds.forward", pred_where), *m.forward_seconds, false);
    if (m.backward_seconds) add(c, "time", "backward", "seconds", num(pred, "time.phases_seconds.backward", pred_where), *m.backward_seconds, false);
    c.mapping.push_back("forward, backward: where the loss is timed differs between stacks, so only their sum is judged");
  }
  if (m.optimizer_seconds) add(c, "time", "optimizer", "seconds", num(pred, "time.phases_seconds.optimizer", pred_where), *m.optimizer_seconds, true);
  if (m.step_seconds) add(c, "time", "step", "seconds", p_step, *m.step_seconds, true, "mean after the first logged step");
  std::optional<double> job_tps = m.tokens_per_second;
  if (!job_tps && m.tokens_per_second_per_gpu) job_tps = *m.tokens_per_second_per_gpu * static_cast<double>(c.world);
  if (!job_tps && m.step_seconds && *m.step_seconds > 0)
    job_tps = (m.global_batch ? *m.global_batch * static_cast<double>(c.seq) : tokens_per_step) / *m.step_seconds;
  if (job_tps) {
    add(c, "time", "tokens/s", "tokens/s", p_tps, *job_tps, true);
    if (m.tokens_per_second_per_gpu) {
      add(c, "time", "step (from tokens/s)", "seconds", p_step, tokens_per_step / *job_tps, false);
      c.mapping.push_back("tokens/s: torchtitan's tps is per GPU; the job's is tps x " + std::to_string(c.world) +
                          " GPUs; the step follows from the tokens per step");
    } else if (!m.tokens_per_second) {
      c.mapping.push_back("tokens/s: measured = " +
                          std::string(m.global_batch ? "the log's global batch size x seq" : "the prediction's tokens per step") +
                          " / the measured step");
    }
  }
  if (m.tflops_per_gpu)
    add(c, "time", "TFLOP/s per GPU", "TFLOP/s", num(pred, "time.model_tflops_per_gpu", pred_where), *m.tflops_per_gpu, false,
        "each stack counts FLOPs its own way");
  if (m.mfu)
    add(c, "time", "MFU (%)", "%", 100.0 * num(pred, "time.mfu", pred_where), 100.0 * *m.mfu, false, "each stack counts FLOPs its own way");
  if (m.steps_read > 0)
    c.mapping.push_back("time: the mean of " + std::to_string(m.steps_used) + " of " + std::to_string(m.steps_read) +
                        " logged steps" + (m.steps_used < m.steps_read ? " (the first is warm-up and left out)" : ""));
  if (c.rows.empty()) throw InputError(m.where, "", "no quantity ctxplan predicts was found in this " + m.format);
  judge_step_band(c, pred);
  return c;
}

Comparison compare_any(const std::string& prediction_path, const std::string& run_path, const CompareOptions& o) {
  if (!run_path.empty()) {
    std::optional<StackMeasurement> m = read_stack_measurement(run_path);
    if (m) return compare_stack_measurement(read_json_file(prediction_path), prediction_path, *m, o);
  }
  return compare_files(prediction_path, run_path, o);
}

}  // namespace ctx
