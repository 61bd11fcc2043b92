// Fitting a runtime profile's time constants to measured step times (`ctxplan calibrate`,
// docs/CALIBRATION.md). The parameters are scales on the prior profile: the GEMM, attention and
// communication efficiencies (x the hardware curves and link bandwidths), the memory-bound traffic
// factor and a fixed per-step overhead. Levenberg-Marquardt on r_i = ln(predicted_i / measured_i),
// the step predicted as `ctxplan predict` does (the event simulator plus the overhead); Jacobian by
// forward differences. Only parameters the runs identify are fitted (column-pivoted QR of the
// Jacobian at the prior, at most one per run); the others stay at the prior and are named.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "costmodel/runtime_profile.hpp"
#include "planner/calibration_runs.hpp"

namespace ctx {

enum class CalParam : int { gemm, attention, memory, comm, overhead, count };
constexpr int kCalParams = static_cast<int>(CalParam::count);
const char* to_string(CalParam p);
const char* calibration_constant(CalParam p);  // the runtime JSON constant it writes

struct CalibrationValues {
  // gemm/attention/comm efficiency scales, memory_traffic_factor, step_overhead_seconds
  std::array<double, kCalParams> value{1, 1, 1, 1, 0};
};
CalibrationValues calibration_values(const RuntimeProfile& rt);
RuntimeProfile with_calibration(RuntimeProfile rt, const CalibrationValues& v);

struct CalibrationFit {
  CalibrationValues values;
  std::array<bool, kCalParams> fitted{};   // false: held at the prior (not identified by these runs)
  std::array<bool, kCalParams> at_bound{}; // the fit stopped at a bound (scales 1/20..20 of the prior, overhead >= 0)
  int iterations = 0;
  double rms_log_residual = 0;
  std::vector<double> log_ratios;          // ln(measured / predicted) per run used, after the fit
};

// Stops when a step changes no parameter by more than kCalStepTolerance (in ln of a scale; the
// overhead in units of the median measured step), when the sum of squared residuals falls by less than
// 1e-15 of itself, or at 200 iterations.
constexpr double kCalStepTolerance = 1e-10;

// The step time `ctxplan predict` gives the run's job under `rt` (the run's attention applied).
double predicted_step_seconds(const CalibrationRun& run, const RuntimeProfile& rt);

// Parameters the user holds at the prior (`ctxplan calibrate --hold NAME`): never fitted, whatever the runs
// identify. Names: gemm, attention, traffic, comm, overhead (calibration_param_name).
using CalibrationHeld = std::array<bool, kCalParams>;
const char* calibration_param_name(CalParam p);

// Fits `prior` to runs[used...], the `held` parameters at the prior.
CalibrationFit fit_calibration(const std::vector<CalibrationRun>& runs, const std::vector<size_t>& used, const RuntimeProfile& prior,
                               const CalibrationHeld& held = {});

// Out of sample: run i predicted by the fit to every other run, as ln(measured / predicted) (with one
// run, the prior's prediction).
std::vector<double> leave_one_out_log_ratios(const std::vector<CalibrationRun>& runs, const RuntimeProfile& prior,
                                             const CalibrationHeld& held = {});

}  // namespace ctx
