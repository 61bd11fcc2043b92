#include "costmodel/error_band.hpp"

#include <algorithm>
#include <cmath>

namespace ctx {

double empirical_quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double h = q * static_cast<double>(values.size() - 1);  // position between order statistics
  const size_t lo = static_cast<size_t>(std::floor(h));
  const size_t hi = std::min(values.size() - 1, lo + 1);
  return values[lo] + (h - static_cast<double>(lo)) * (values[hi] - values[lo]);
}

ErrorBand error_band(const RuntimeProfile& rt, const std::string& gpu) {
  ErrorBand b;
  std::vector<double> same, all;
  for (const TimeResidual& r : rt.time_residuals) {
    all.push_back(r.log_ratio);
    if (r.gpu == gpu) same.push_back(r.log_ratio);
  }
  const bool use_same = static_cast<int>(same.size()) >= kBandMinSameGpu;
  const std::vector<double>& v = use_same ? same : all;
  b.residuals = static_cast<int>(v.size());
  if (v.empty()) {
    b.basis = "no band: runtime " + rt.name + " has no measured or published step times to derive one from";
    return b;
  }
  b.p10_ratio = std::exp(empirical_quantile(v, 0.10));
  b.p90_ratio = std::exp(empirical_quantile(v, 0.90));
  b.few = b.residuals < kBandFewResiduals;
  b.basis = "runtime " + rt.name + (use_same ? " on " + gpu : " on every GPU (fewer than " + std::to_string(kBandMinSameGpu) +
                                                                   " on " + gpu + ")") +
            ": " + std::to_string(b.residuals) + " residual" + (b.residuals == 1 ? "" : "s") +
            (b.few ? " (few: the band is the spread seen, not a calibrated interval)" : "");
  return b;
}

}  // namespace ctx
