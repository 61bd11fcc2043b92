// An achieved-throughput curve: efficiency (fraction of a peak) against a size, given as points
// and interpolated linearly in log(size), clamped at both ends. Curves are data in
// profiles/hardware/*.json; `ctxrun calibrate` rewrites them from measurements.
#pragma once
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace ctx {

struct Curve {
  std::vector<std::pair<double, double>> points;  // (size, efficiency), size ascending, > 0
  std::string source;

  double at(double x) const {
    if (points.empty()) return 1.0;
    if (x <= points.front().first) return points.front().second;
    if (x >= points.back().first) return points.back().second;
    size_t i = 1;
    while (points[i].first < x) ++i;
    const auto& [x0, y0] = points[i - 1];
    const auto& [x1, y1] = points[i];
    // linear in log x: two logs, not four (the search prices ~100,000 plans through this)
    const double t = std::log(x / x0) / std::log(x1 / x0);
    return y0 + t * (y1 - y0);
  }
};

}  // namespace ctx
