// `ctxplan compare PREDICTION.json RUN.json`: predicted vs measured, row by row (planner/compare.hpp).
// Exit 0 when it ran, misses or not; with --fail-over-tol, kExitOverTolerance when a judged row misses.
#include <cmath>
#include <iostream>

#include "costmodel/errors.hpp"
#include "planner/commands.hpp"
#include "planner/compare.hpp"
#include "planner/stack_measurements.hpp"
#include "costmodel/exit_codes.hpp"

namespace ctx {
namespace {

struct CompareArgs {
  std::vector<std::string> files;
  std::string mem_tol = "2", time_tol = "10", out;
  int64_t rank = -1;
  bool json = false, fail_over_tol = false, allow_mismatch = false;
};

// "2", "2%" or "2.5" -> 0.02, 0.02, 0.025 (percent, as the option says)
double parse_percent(const std::string& text, const std::string& where) {
  std::string t = text;
  if (!t.empty() && t.back() == '%') t.pop_back();
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(t, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (t.empty() || used != t.size() || !std::isfinite(v) || v < 0 || v > 1e6)
    throw InputError(where, "", "expected a tolerance in percent such as 2 or 2.5%, got '" + text + "'");
  return v / 100.0;
}

}  // namespace

std::function<int()> add_compare_command(CLI::App& app, CommonOptions& common) {
  auto a = std::make_shared<CompareArgs>();
  app.add_option("files", a->files,
                 "PREDICTION.json RUN.json (ctxplan predict --json; ctxrun --report, or a Megatron-LM/torchtitan log, a "
                 "torch.cuda.memory_stats() JSON dump or a CSV: docs/STACKS.md), or RUN.json alone to compare with the "
                 "prediction the report embeds")
      ->required()
      ->expected(1, 2);
  app.add_flag("--json", a->json, "print the comparison as JSON (schema ctxplan.comparison/1)");
  app.add_option("--out,-o", a->out, "also write the comparison JSON to this file");
  app.add_option("--rank", a->rank, "compare this rank (default: memory of the highest-peak rank, time of the slowest)");
  app.add_option("--mem-tol", a->mem_tol, "memory tolerance in percent (default 2)");
  app.add_option("--time-tol", a->time_tol, "time tolerance in percent (default 10)");
  app.add_flag("--fail-over-tol", a->fail_over_tol, "exit 4 when a judged row is over its tolerance");
  app.add_flag("--allow-mismatch", a->allow_mismatch,
               "compare even when model, seq, world or plan differ between the files (warns instead of exit 2)");
  app.footer(
      "Examples:\n"
      "  ctxplan predict --model tiny --cluster 1x2xh100 --seq 256 --plan tp=2 --json > pred.json\n"
      "  mpirun -np 2 ctxrun --model tiny --seq 256 --plan tp=2 --steps 20 --report run.json\n"
      "  ctxplan compare pred.json run.json\n"
      "  ctxplan compare run.json          # against the float32 prediction ctxrun embeds in its report\n"
      "Exit codes: 0 compared (misses are printed), 4 a row over tolerance with --fail-over-tol, 2 bad input.");
  (void)common;
  return [a]() {
    CompareOptions o;
    o.mem_tolerance = parse_percent(a->mem_tol, "--mem-tol");
    o.time_tolerance = parse_percent(a->time_tol, "--time-tol");
    if (a->rank < -1) throw InputError("--rank", "", "must be a rank number >= 0, got " + std::to_string(a->rank));
    o.rank = a->rank;
    o.allow_mismatch = a->allow_mismatch;
    // RUN may also be a Megatron/torchtitan log, a torch.cuda.memory_stats() dump or a CSV (stack_measurements.hpp)
    Comparison c = compare_any(a->files[0], a->files.size() > 1 ? a->files[1] : "", o);
    json j = comparison_to_json(c);
    if (!a->out.empty()) write_file_atomic(a->out, json_dump(j) + "\n");
    if (a->json) std::cout << json_dump(j) << "\n";
    else std::cout << comparison_table(c);
    return a->fail_over_tol && c.misses > 0 ? kExitOverTolerance : kExitOk;
  };
}

}  // namespace ctx
