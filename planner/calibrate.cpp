#include "planner/calibrate.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

#include "costmodel/attention_kernels.hpp"
#include "costmodel/simulator.hpp"
#include "costmodel/step_model.hpp"

namespace ctx {
namespace {

constexpr double kScaleBound = 20;        // a fitted scale stays within 1/20..20 x the prior's
constexpr double kFdStep = 1e-6;          // forward-difference step in the (log) parameters
constexpr double kIdentifiedRatio = 1e-3; // a pivot of the scaled Jacobian's QR below this x the largest: not identified
constexpr int kMaxIterations = 200;

// theta: ln(scale / prior scale) for the four scales, overhead / reference seconds for the overhead
CalibrationValues values_at(const CalibrationValues& prior, const std::array<double, kCalParams>& theta, double ref_seconds) {
  CalibrationValues v = prior;
  for (int i = 0; i < kCalParams; ++i) {
    if (static_cast<CalParam>(i) == CalParam::overhead) v.value[i] = prior.value[i] + theta[i] * ref_seconds;
    else v.value[i] = prior.value[i] * std::exp(theta[i]);
  }
  return v;
}

// Keeps theta inside the bounds; returns which parameters sit on one.
std::array<bool, kCalParams> clamp(std::array<double, kCalParams>& theta, const CalibrationValues& prior, double ref_seconds) {
  std::array<bool, kCalParams> at{};
  const double lim = std::log(kScaleBound);
  for (int i = 0; i < kCalParams; ++i) {
    if (static_cast<CalParam>(i) == CalParam::overhead) {
      const double lo = -prior.value[i] / ref_seconds;  // overhead >= 0
      if (theta[i] <= lo) theta[i] = lo, at[i] = true;
    } else if (std::abs(theta[i]) >= lim) {
      theta[i] = std::copysign(lim, theta[i]);
      at[i] = true;
    }
  }
  return at;
}

}  // namespace

const char* to_string(CalParam p) {
  static const char* names[] = {"GEMM efficiency", "attention efficiency", "memory-bound traffic factor", "communication efficiency",
                                "per-step overhead"};
  return names[static_cast<int>(p)];
}

const char* calibration_constant(CalParam p) {
  static const char* names[] = {"gemm_efficiency_scale", "attention_efficiency_scale", "memory_traffic_factor", "comm_efficiency_scale",
                                "step_overhead_seconds"};
  return names[static_cast<int>(p)];
}

CalibrationValues calibration_values(const RuntimeProfile& rt) {
  CalibrationValues v;
  v.value = {rt.gemm_efficiency_scale, rt.attention_efficiency_scale, rt.memory_traffic_factor, rt.comm_efficiency_scale,
             rt.step_overhead_seconds};
  return v;
}

RuntimeProfile with_calibration(RuntimeProfile rt, const CalibrationValues& v) {
  rt.gemm_efficiency_scale = v.value[static_cast<int>(CalParam::gemm)];
  rt.attention_efficiency_scale = v.value[static_cast<int>(CalParam::attention)];
  rt.memory_traffic_factor = v.value[static_cast<int>(CalParam::memory)];
  rt.comm_efficiency_scale = v.value[static_cast<int>(CalParam::comm)];
  rt.step_overhead_seconds = v.value[static_cast<int>(CalParam::overhead)];
  return rt;
}

double predicted_step_seconds(const CalibrationRun& run, const RuntimeProfile& rt0) {
  // the kernel the run used, checked as --attention is (a name the runtime runs)
  const RuntimeProfile rt = run.attention.empty() ? rt0 : with_attention(rt0, run.attention, run.where, "attention");
  const StepCosts k = step_costs(run.model, run.cluster, rt, run.plan, run.seq, true);
  StepTime t = simulate_step(k, run.plan, SimRecord::none).time;
  add_step_overhead(k, t);
  return t.step_seconds;
}

const char* calibration_param_name(CalParam p) {
  static const char* names[] = {"gemm", "attention", "traffic", "comm", "overhead"};
  return names[static_cast<int>(p)];
}

CalibrationFit fit_calibration(const std::vector<CalibrationRun>& runs, const std::vector<size_t>& used, const RuntimeProfile& prior_rt,
                               const CalibrationHeld& held) {
  const CalibrationValues prior = calibration_values(prior_rt);
  const int n = static_cast<int>(used.size());
  std::vector<double> measured;
  for (size_t i : used) measured.push_back(runs[i].measured_step_seconds);
  std::vector<double> sorted = measured;
  std::sort(sorted.begin(), sorted.end());
  const double ref = sorted.empty() ? 1.0 : sorted[sorted.size() / 2];  // the overhead's unit: the median step

  auto residuals = [&](const std::array<double, kCalParams>& theta) {
    const RuntimeProfile rt = with_calibration(prior_rt, values_at(prior, theta, ref));
    Eigen::VectorXd r(n);
    for (int i = 0; i < n; ++i) r[i] = std::log(predicted_step_seconds(runs[used[i]], rt) / measured[i]);
    return r;
  };
  auto jacobian = [&](const std::array<double, kCalParams>& theta, const Eigen::VectorXd& r0, const std::vector<int>& cols) {
    Eigen::MatrixXd J(n, static_cast<int>(cols.size()));
    for (size_t c = 0; c < cols.size(); ++c) {
      std::array<double, kCalParams> t = theta;
      t[cols[c]] += kFdStep;
      J.col(static_cast<int>(c)) = (residuals(t) - r0) / kFdStep;
    }
    return J;
  };

  CalibrationFit fit;
  fit.values = prior;
  std::array<double, kCalParams> theta{};
  Eigen::VectorXd r = residuals(theta);
  // which parameters these runs identify: the pivots of the Jacobian at the prior, at most one per run
  // (among the parameters not held at the prior by request)
  std::vector<int> all;
  for (int i = 0; i < kCalParams; ++i)
    if (!held[i]) all.push_back(i);
  const int free = static_cast<int>(all.size());
  const Eigen::MatrixXd J0 = free > 0 ? jacobian(theta, r, all) : Eigen::MatrixXd(n, 0);
  std::vector<int> active;
  if (n > 0 && free > 0 && J0.norm() > 0) {
    Eigen::ColPivHouseholderQR<Eigen::MatrixXd> qr(J0);
    const Eigen::MatrixXd R = qr.matrixR().triangularView<Eigen::Upper>();
    const double top = std::abs(R(0, 0));
    for (int k = 0; k < std::min(n, free); ++k)
      if (top > 0 && std::abs(R(k, k)) > kIdentifiedRatio * top) active.push_back(all[qr.colsPermutation().indices()[k]]);
  }
  std::sort(active.begin(), active.end());
  for (int a : active) fit.fitted[a] = true;

  // Levenberg-Marquardt (Marquardt's diagonal scaling) on the active parameters
  double cost = r.squaredNorm(), lambda = 1e-3;
  const int m = static_cast<int>(active.size());
  for (int it = 0; it < kMaxIterations && m > 0; ++it) {
    fit.iterations = it + 1;
    const Eigen::MatrixXd J = jacobian(theta, r, active);
    const Eigen::MatrixXd H = J.transpose() * J;
    const Eigen::VectorXd g = J.transpose() * r;
    bool accepted = false, converged = false;
    while (lambda < 1e12) {
      Eigen::MatrixXd A = H;
      for (int k = 0; k < m; ++k) A(k, k) += lambda * std::max(H(k, k), 1e-12);
      const Eigen::VectorXd d = A.ldlt().solve(-g);
      std::array<double, kCalParams> t = theta;
      for (int k = 0; k < m; ++k) t[active[k]] += d[k];
      fit.at_bound = clamp(t, prior, ref);
      const Eigen::VectorXd rt = residuals(t);
      const double c = rt.squaredNorm();
      if (c < cost) {
        double step = 0;
        for (int k = 0; k < m; ++k) step = std::max(step, std::abs(t[active[k]] - theta[active[k]]));
        // a step below the tolerance, residuals that stopped falling (relative), or an exact fit
        converged = step <= kCalStepTolerance || cost - c <= 1e-15 * cost || c <= 1e-30;
        theta = t;
        r = rt;
        cost = c;
        lambda = std::max(lambda / 10, 1e-12);
        accepted = true;
        break;
      }
      lambda *= 10;
    }
    if (!accepted || converged) break;
  }
  fit.at_bound = clamp(theta, prior, ref);
  fit.values = values_at(prior, theta, ref);
  fit.rms_log_residual = n > 0 ? std::sqrt(cost / n) : 0;
  for (int i = 0; i < n; ++i) fit.log_ratios.push_back(-r[i]);
  return fit;
}

std::vector<double> leave_one_out_log_ratios(const std::vector<CalibrationRun>& runs, const RuntimeProfile& prior,
                                             const CalibrationHeld& held) {
  std::vector<double> out;
  for (size_t i = 0; i < runs.size(); ++i) {
    std::vector<size_t> others;
    for (size_t k = 0; k < runs.size(); ++k)
      if (k != i) others.push_back(k);
    const CalibrationFit f = fit_calibration(runs, others, prior, held);
    out.push_back(std::log(runs[i].measured_step_seconds / predicted_step_seconds(runs[i], with_calibration(prior, f.values))));
  }
  return out;
}

}  // namespace ctx
