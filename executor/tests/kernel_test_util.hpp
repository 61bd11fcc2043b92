// Shared by the kernel tests (CPU backend, CUDA backend, emulated CUDA kernels): seeded normal
// inputs, an element-wise closeness check that reports the worst element, and host data in and
// out of a backend's tensors (Backend::upload / Backend::download, the only way since tensors are
// opaque).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "executor/backend.hpp"

namespace ctx::exec::testing {

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 r(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(r);
  return v;
}

// Element-wise |got - want| <= atol + rtol |want| (infinities must match exactly; NaN fails unless
// the reference is NaN at that element too: a NaN input copied or converted must stay NaN).
inline void expect_close(const std::vector<float>& want, const std::vector<float>& got, double rtol, double atol,
                         const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double w = want[i], g = got[i];
    if (std::isnan(w) || std::isnan(g)) {
      if (std::isnan(w) && std::isnan(g)) continue;
      worst = INFINITY;  // NaN on one side only
      at = i;
      continue;
    }
    if (std::isinf(w) || std::isinf(g)) {
      ASSERT_EQ(w, g) << what << " element " << i;
      continue;
    }
    const double excess = std::fabs(g - w) - (atol + rtol * std::fabs(w));
    if (excess > worst) {
      worst = excess;
      at = i;
    }
  }
  EXPECT_LE(worst, 0.0) << what << ": element " << at << " is " << got[at] << ", reference " << want[at]
                        << " (rtol " << rtol << ", atol " << atol << ")";
}

// A [rows, cols] tensor of `be` holding `v` (rows = 0: one row of v.size()). Float data goes into
// an f32 tensor unless `dt` says bf16 (rounded to nearest even by the backend); int32 and int64
// data into i32 / i64 tensors.
template <typename T>
Tensor upload(Backend& be, const std::vector<T>& v, int64_t rows = 0, int64_t cols = 0, DType dt = DType::f32) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>);
  if (rows == 0) {
    rows = 1;
    cols = static_cast<int64_t>(v.size());
  }
  if constexpr (std::is_same_v<T, int32_t>) dt = DType::i32;
  if constexpr (std::is_same_v<T, int64_t>) dt = DType::i64;
  Tensor t = be.alloc(rows, cols, dt, Mem::workspace);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(v.size())) << "upload: shape does not match the data";
  be.upload(t, v.data());
  return t;
}

// A zero-filled f32 tensor (alloc does not zero; zero() is the op).
inline Tensor zeros(Backend& be, int64_t rows, int64_t cols, DType dt = DType::f32) {
  Tensor t = be.alloc(rows, cols, dt, Mem::workspace);
  be.zero(t);
  return t;
}

// The values of a float view (bf16 widened), after everything queued before (blocking).
inline std::vector<float> download(Backend& be, View v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  be.download(out.data(), v);
  return out;
}

}  // namespace ctx::exec::testing

namespace ctx::exec::testing {

// The hull [lo, hi) of the key rows each query token can see (same document, key index <= query
// index), as the strategy code computes a KeyBlock's kv_range; lo == hi when it sees none. Flat
// [tq * 2], for upload into an i32 [tq, 2] tensor.
inline std::vector<int32_t> kv_hulls(const std::vector<int64_t>& q_index, const std::vector<int32_t>& q_doc,
                                     const std::vector<int64_t>& k_index, const std::vector<int32_t>& k_doc) {
  std::vector<int32_t> r(2 * q_index.size(), 0);
  for (size_t i = 0; i < q_index.size(); ++i) {
    int32_t lo = -1, hi = -1;
    for (size_t j = 0; j < k_index.size(); ++j)
      if (k_index[j] <= q_index[i] && k_doc[j] == q_doc[i]) {
        if (lo < 0) lo = static_cast<int32_t>(j);
        hi = static_cast<int32_t>(j) + 1;
      }
    r[2 * i] = lo < 0 ? 0 : lo;
    r[2 * i + 1] = lo < 0 ? 0 : hi;
  }
  return r;
}

}  // namespace ctx::exec::testing
