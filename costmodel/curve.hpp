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
  // log(x1 / x0) of each segment, with the segment's ends, as prepare() found them (the profile
  // reader calls it). at() takes a segment's log from here only where its ends are still the
  // points' (a curve edited after prepare() computes it): the same value, one log per call, not two
  // (the search prices ~100,000 plans through this).
  struct Segment {
    double x0, x1, log_ratio;
  };
  std::vector<Segment> segments;

  void prepare() {
    segments.clear();
    for (size_t i = 1; i < points.size(); ++i)
      segments.push_back({points[i - 1].first, points[i].first, std::log(points[i].first / points[i - 1].first)});
  }

  double at(double x) const {
    if (points.empty()) return 1.0;
    if (x <= points.front().first) return points.front().second;
    if (x >= points.back().first) return points.back().second;
    size_t i = 1;
    while (points[i].first < x) ++i;
    const auto& [x0, y0] = points[i - 1];
    const auto& [x1, y1] = points[i];
    // linear in log x
    const bool known = i - 1 < segments.size() && segments[i - 1].x0 == x0 && segments[i - 1].x1 == x1;
    const double t = std::log(x / x0) / (known ? segments[i - 1].log_ratio : std::log(x1 / x0));
    return y0 + t * (y1 - y0);
  }
};

}  // namespace ctx
