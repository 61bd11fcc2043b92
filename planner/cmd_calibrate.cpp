// `ctxplan calibrate --runs FILE`: a runtime profile's time constants fitted to measured runs
// (planner/calibrate.hpp), with every run's error before, after (in sample) and leave-one-out (each
// run predicted by a fit to the others), and the calibrated profile written as a runtime JSON.
#include <cmath>
#include <filesystem>
#include <iostream>

#include "costmodel/exit_codes.hpp"
#include "planner/calibrate.hpp"
#include "planner/commands.hpp"
#include "planner/format.hpp"

namespace ctx {
namespace {

namespace fs = std::filesystem;

struct CalibrateArgs {
  std::vector<std::string> runs;
  std::string runtime, out, name;
  std::vector<std::string> hold;  // parameters held at the prior (calibration_param_name)
  bool json = false;
};

// The prior's own JSON document (its constants keep their sources in the calibrated profile).
json runtime_document(const Profiles& profiles, const std::string& arg, const RuntimeProfile& rt) {
  if (fs::is_regular_file(arg)) return read_json_file(arg);
  for (auto& e : fs::directory_iterator(fs::path(profiles.dir) / "runtimes")) {
    if (e.path().extension() != ".json") continue;
    json j = read_json_file(e.path().string());
    if (j.is_object() && j.value("name", "") == rt.name) return j;
  }
  throw InputError(arg, "", "the runtime's JSON file was not found in " + profiles.dir + "/runtimes");
}

double geomean_abs_error(const std::vector<double>& log_ratios) {
  if (log_ratios.empty()) return 0;
  double s = 0;
  for (double r : log_ratios) s += std::abs(r);
  return std::exp(s / static_cast<double>(log_ratios.size())) - 1.0;
}

std::string pct(double log_ratio) {  // measured vs predicted, as the predicted's error
  const double e = std::exp(-log_ratio) - 1.0;  // predicted / measured - 1
  return (e >= 0 ? "+" : "") + fixed(100.0 * e, 1) + "%";
}

}  // namespace

std::function<int()> add_calibrate_command(CLI::App& app, CommonOptions& common) {
  auto a = std::make_shared<CalibrateArgs>();
  app.add_option("--runs", a->runs,
                 "measured runs: a ctxplan.runs/1 JSON, a CSV (id,model,cluster,plan,seq,step_seconds,...), or a ctxrun report; "
                 "runs may point to Megatron-LM/torchtitan logs or torch.cuda.memory_stats dumps (docs/CALIBRATION.md); repeatable")
      ->required();
  app.add_option("--runtime,-r", a->runtime, "the runtime profile to calibrate, a name or a runtime JSON (default: the runs' runtime)");
  app.add_option("--out,-o", a->out,
                 "write the calibrated runtime profile here; use it as --runtime FILE, or copy it into profiles/runtimes/ to use it by name");
  app.add_option("--name", a->name, "the calibrated profile's name (default <runtime>-calibrated)");
  app.add_option("--hold", a->hold,
                 "hold a parameter at the prior whatever the runs identify: gemm, attention, traffic, comm or overhead; repeatable "
                 "(the calibrated profile's record lists them, calibration.held_by_request)");
  app.add_flag("--json", a->json, "print the fit and every run as JSON (schema ctxplan.calibration/1)");
  app.footer(
      "Fits GEMM and attention efficiency, the memory-bound traffic factor, communication efficiency and a fixed per-step\n"
      "overhead by Levenberg-Marquardt on ln(step time); parameters the runs do not identify stay at the prior and are named.\n"
      "Example:\n"
      "  ctxplan calibrate --runs runs.csv --runtime megatron -o megatron-mycluster.json\n"
      "  ctxplan predict --runtime megatron-mycluster.json --model Llama-3.1-8B --cluster 8xh100 --seq 128k --plan cp=8\n"
      "Exit codes: 0 fitted, 2 bad input.");
  return [a, &common]() {
    Profiles profiles = load_profiles(common.profiles.empty() ? default_profiles_dir() : common.profiles);
    std::vector<CalibrationRun> runs;
    for (auto& f : a->runs)
      for (auto& r : read_calibration_runs(profiles, f)) runs.push_back(r);
    std::string runtime_arg = a->runtime;
    for (auto& r : runs)
      if (runtime_arg.empty() && !r.runtime_name.empty()) runtime_arg = r.runtime_name;
    if (runtime_arg.empty()) throw InputError("--runtime", "", "no runtime: name one with --runtime or give each run a runtime");
    const RuntimeProfile prior = resolve_runtime(profiles, runtime_arg);
    for (auto& r : runs)
      if (!r.runtime_name.empty() && resolve_runtime(profiles, r.runtime_name).name != prior.name)
        throw InputError(r.where, "runtime", "'" + r.runtime_name + "' differs from the runtime calibrated, " + prior.name +
                                                 "; calibrate one runtime's runs at a time");

    CalibrationHeld hold{};
    std::vector<std::string> held_by_request;
    for (const std::string& h : a->hold) {
      int found = -1;
      for (int p = 0; p < kCalParams; ++p)
        if (h == calibration_param_name(static_cast<CalParam>(p))) found = p;
      if (found < 0) throw InputError("--hold", "", "unknown parameter '" + h + "'; valid: gemm, attention, traffic, comm, overhead");
      if (!hold[found]) held_by_request.push_back(h);
      hold[found] = true;
    }
    std::vector<size_t> all;
    for (size_t i = 0; i < runs.size(); ++i) all.push_back(i);
    const CalibrationFit fit = fit_calibration(runs, all, prior, hold);
    const RuntimeProfile calibrated = with_calibration(prior, fit.values);
    // before, after and leave-one-out: ln(measured / predicted) per run
    const std::vector<double> loo = leave_one_out_log_ratios(runs, prior, hold);
    std::vector<double> before, after, pred_before, pred_after, pred_loo;
    for (size_t i = 0; i < runs.size(); ++i) {
      const double m = runs[i].measured_step_seconds;
      pred_before.push_back(predicted_step_seconds(runs[i], prior));
      pred_after.push_back(predicted_step_seconds(runs[i], calibrated));
      pred_loo.push_back(m / std::exp(loo[i]));
      before.push_back(std::log(m / pred_before.back()));
      after.push_back(std::log(m / pred_after.back()));
    }
    std::vector<std::string> held;
    for (int p = 0; p < kCalParams; ++p)
      if (!fit.fitted[p]) held.push_back(to_string(static_cast<CalParam>(p)));

    // ---- the calibrated profile: the prior's document, the fitted constants, and the record
    json doc = runtime_document(profiles, runtime_arg, prior);
    const std::string name = a->name.empty() ? prior.name + "-calibrated" : a->name;
    doc["name"] = name;
    doc["description"] = "calibrated from " + prior.name + " to " + std::to_string(runs.size()) + " measured runs (ctxplan calibrate)";
    std::string files;
    for (auto& f : a->runs) files += (files.empty() ? "" : ", ") + f;
    json fitted = json::object(), runs_json = json::array(), residuals = json::array();
    for (int p = 0; p < kCalParams; ++p) {
      const CalibrationValues pv = calibration_values(prior);
      if (!fit.fitted[p]) continue;
      doc["constants"][calibration_constant(static_cast<CalParam>(p))] = {
          {"value", fit.values.value[p]},
          {"source", "ctxplan calibrate: fitted to " + std::to_string(runs.size()) + " runs (" + files +
                         ") by Levenberg-Marquardt on ln(step time); prior " + fixed(pv.value[p], 4) +
                         (fit.at_bound[p] ? "; stopped at its bound" : "")}};
      fitted[calibration_constant(static_cast<CalParam>(p))] = {{"value", fit.values.value[p]}, {"prior", pv.value[p]},
                                                                  {"at_bound", fit.at_bound[p]}};
    }
    for (size_t i = 0; i < runs.size(); ++i) {
      const CalibrationRun& r = runs[i];
      json row = {{"id", r.id}, {"where", r.where}, {"model", r.model.name}, {"cluster", r.cluster.name}, {"gpu", r.cluster.gpu.name},
                  {"plan", plan_to_string(r.plan)}, {"seq", r.seq}, {"attention", r.attention}, {"measured_from", r.measured_from},
                  {"measured_step_seconds", r.measured_step_seconds}, {"predicted_before_seconds", pred_before[i]},
                  {"predicted_after_seconds", pred_after[i]}, {"predicted_leave_one_out_seconds", pred_loo[i]}};
      if (r.measured_peak_bytes) row["measured_peak_bytes"] = *r.measured_peak_bytes;
      runs_json.push_back(row);
      residuals.push_back({{"id", r.id}, {"gpu", r.cluster.gpu.name}, {"log_ratio", loo[i]}});
    }
    json summary = {{"geomean_abs_error_before", geomean_abs_error(before)},
                    {"geomean_abs_error_after", geomean_abs_error(after)},
                    {"geomean_abs_error_leave_one_out", geomean_abs_error(loo)}};
    doc["calibration"] = {{"method", "Levenberg-Marquardt on ln(predicted/measured step time), forward-difference Jacobian; parameters "
                                     "not identified by the runs (column-pivoted QR of the Jacobian at the prior) held at the prior"},
                          {"prior", prior.name},
                          {"runs_files", a->runs},
                          {"fitted", fitted},
                          {"held_at_prior", held},
                          {"held_by_request", held_by_request},
                          {"iterations", fit.iterations},
                          {"summary", summary},
                          {"runs", runs_json},
                          {"residuals_note", "leave-one-out ln(measured/predicted): the error band of this profile's predictions"},
                          {"residuals", residuals}};
    if (!a->out.empty()) write_file_atomic(a->out, json_dump(doc) + "\n");
    if (a->json) {
      std::cout << json_dump(json{{"schema", "ctxplan.calibration/1"}, {"runtime", name}, {"calibration", doc["calibration"]}}) << "\n";
      return kExitOk;
    }
    std::cout << "ctxplan calibrate: runtime " << prior.name << ", " << runs.size() << " measured run" << (runs.size() == 1 ? "" : "s")
              << " (" << files << ")\n\n";
    Table pt;
    pt.header = {"parameter", "prior", "fitted", "constant"};
    const CalibrationValues pv = calibration_values(prior);
    for (int p = 0; p < kCalParams; ++p)
      pt.rows.push_back({to_string(static_cast<CalParam>(p)), fixed(pv.value[p], 4),
                         fit.fitted[p] ? fixed(fit.values.value[p], 4) + (fit.at_bound[p] ? " (at bound)" : "") : "held at prior",
                         calibration_constant(static_cast<CalParam>(p))});
    std::cout << "Fitted by Levenberg-Marquardt on ln(step time), " << fit.iterations << " iterations:\n" << pt.render();
    if (!held.empty()) {
      std::cout << "Held at the prior (" << (held_by_request.empty() ? "" : "--hold, or ") << "these runs do not identify them";
      if (runs.size() < static_cast<size_t>(kCalParams)) std::cout << "; " << runs.size() << " runs fit at most " << runs.size() << " parameters";
      std::cout << "):";
      for (auto& h : held) std::cout << " " << h << ";";
      std::cout << "\n";
    }
    Table t;
    t.header = {"run", "measured s", "before s", "error", "after s", "error", "leave-one-out s", "error"};
    for (size_t i = 0; i < runs.size(); ++i)
      t.rows.push_back({runs[i].id, fixed(runs[i].measured_step_seconds, 3), fixed(pred_before[i], 3), pct(before[i]),
                        fixed(pred_after[i], 3), pct(after[i]), fixed(pred_loo[i], 3), pct(loo[i])});
    std::cout << "\nStep time per run (error = predicted / measured - 1; leave-one-out: fitted to the other runs):\n" << t.render();
    std::cout << "\nGeometric-mean |error|: before " << fixed(100 * geomean_abs_error(before), 1) << "%, after (in sample) "
              << fixed(100 * geomean_abs_error(after), 1) << "%, leave-one-out (out of sample) " << fixed(100 * geomean_abs_error(loo), 1)
              << "%\n";
    if (!a->out.empty())
      std::cout << "\nWrote " << a->out << " (runtime \"" << name << "\"): use it as --runtime " << a->out
                << ", or copy it into profiles/runtimes/ to use it by name. Its predictions carry a p10-p90 band from the "
                   "leave-one-out residuals above.\n";
    return kExitOk;
  };
}

}  // namespace ctx
