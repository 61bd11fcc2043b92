// The p10-p90 band of a predicted step time, from the residuals of its runtime profile on its GPU
// (RuntimeProfile::time_residuals: a calibrated profile's leave-one-out residuals, or the published
// points `ctxplan validate` predicts for a built-in runtime). Method: the empirical 10th and 90th
// percentiles (linear interpolation between order statistics, numpy's default) of
// ln(measured / predicted); the band is predicted x exp(those). docs/CALIBRATION.md.
#pragma once
#include <string>
#include <vector>

#include "costmodel/runtime_profile.hpp"

namespace ctx {

struct ErrorBand {
  int residuals = 0;              // how many residuals it rests on; 0: no band
  double p10_ratio = 1, p90_ratio = 1;  // measured / predicted at the 10th and 90th percentiles
  bool few = false;               // fewer than kBandFewResiduals: the band is the spread seen, not a calibrated interval
  std::string basis;              // which residuals, in words ("runtime megatron on H100-SXM-80GB: 9 points")
  double low(double predicted) const { return predicted * p10_ratio; }
  double high(double predicted) const { return predicted * p90_ratio; }
};

// Below this many residuals a p10/p90 has no observation beyond it on at least one side
// (10 residuals put one below the 10th percentile): the band says so.
constexpr int kBandFewResiduals = 10;
// With fewer than this many residuals on the prediction's GPU, the runtime's residuals on every GPU are used.
constexpr int kBandMinSameGpu = 3;

// The q-quantile (0..1) of `values` by linear interpolation between order statistics.
double empirical_quantile(std::vector<double> values, double q);

// The band for a prediction of `rt` on `gpu`.
ErrorBand error_band(const RuntimeProfile& rt, const std::string& gpu);

}  // namespace ctx
