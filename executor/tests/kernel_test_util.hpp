// Shared by the kernel tests (CPU backend, CUDA backend, emulated CUDA kernels): seeded normal
// inputs and an element-wise closeness check that reports the worst element.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace ctx::exec::testing {

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 r(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(r);
  return v;
}

// Element-wise |got - want| <= atol + rtol |want| (infinities must match exactly, NaN fails).
inline void expect_close(const std::vector<float>& want, const std::vector<float>& got, double rtol, double atol,
                         const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double w = want[i], g = got[i];
    if (std::isinf(w) || std::isinf(g)) {
      ASSERT_EQ(w, g) << what << " element " << i;
      continue;
    }
    const double excess = std::fabs(g - w) - (atol + rtol * std::fabs(w));
    if (excess > worst || std::isnan(g)) {
      worst = std::isnan(g) ? INFINITY : excess;
      at = i;
    }
  }
  EXPECT_LE(worst, 0.0) << what << ": element " << at << " is " << got[at] << ", reference " << want[at]
                        << " (rtol " << rtol << ", atol " << atol << ")";
}

}  // namespace ctx::exec::testing
