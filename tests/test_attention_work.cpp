// Per-rank attention work under ring and zig-zag placement, against closed forms and brute force.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "costmodel/attention_work.hpp"

namespace ctx {
namespace {

Plan plan(const std::string& text) {
  Plan p = parse_plan(text);
  p.dp = 1;
  return p;
}

// Brute force: count (q, k) with k <= q in the same document.
double brute_pairs(int64_t q0, int64_t q1, int64_t k0, int64_t k1, const std::vector<int64_t>& starts) {
  auto doc = [&](int64_t t) { return std::upper_bound(starts.begin(), starts.end(), t) - starts.begin(); };
  double n = 0;
  for (int64_t q = q0; q < q1; ++q)
    for (int64_t k = k0; k < k1; ++k) n += (k <= q && doc(k) == doc(q));
  return n;
}

TEST(AttentionWork, MaskedPairsMatchBruteForce) {
  std::vector<int64_t> starts{0, 7, 20, 21, 64};
  for (int64_t q0 : {0, 5, 19}) {
    for (int64_t q1 : {21, 40, 64}) {
      for (int64_t k0 : {0, 6, 30}) {
        for (int64_t k1 : {10, 64}) {
          if (q0 >= q1 || k0 >= k1) continue;
          EXPECT_DOUBLE_EQ(masked_pairs(q0, q1, k0, k1, starts), brute_pairs(q0, q1, k0, k1, starts))
              << q0 << " " << q1 << " " << k0 << " " << k1;
        }
      }
    }
  }
}

TEST(AttentionWork, CausalTotalIsNTimesNPlusOneOverTwo) {
  for (const char* kind : {"ring", "zigzag"}) {
    auto w = attention_pairs_per_rank(plan(std::string("cp=8,cp_kind=") + kind), 4096);
    double total = std::accumulate(w.begin(), w.end(), 0.0);
    EXPECT_DOUBLE_EQ(total, 4096.0 * 4097.0 / 2.0) << kind;
  }
}

TEST(AttentionWork, ZigZagBalancesCausalWork) {
  auto w = attention_pairs_per_rank(plan("cp=8,cp_kind=zigzag"), 65536);
  for (double x : w) EXPECT_DOUBLE_EQ(x, w[0]);
}

TEST(AttentionWork, PlainRingLeavesFirstRanksIdle) {
  // rank i holds chunk i of c = N/cp tokens: work = c*c/2 + c/2 + i*c*c, so max/mean -> (2cp-1)/cp
  const int64_t cp = 8, n = 65536, c = n / cp;
  auto w = attention_pairs_per_rank(plan("cp=8,cp_kind=ring"), n);
  for (int64_t i = 0; i < cp; ++i)
    EXPECT_DOUBLE_EQ(w[i], static_cast<double>(c) * (c + 1) / 2.0 + static_cast<double>(i) * c * c);
  double mean = std::accumulate(w.begin(), w.end(), 0.0) / cp;
  EXPECT_NEAR(*std::max_element(w.begin(), w.end()) / mean, (2.0 * cp - 1) / cp, 1e-3);
}

TEST(AttentionWork, ShortDocumentsCutWorkAndEvenOutRing) {
  // 2K documents at 64K: total pairs = 32 docs x 2048*2049/2; every ring rank holds 4 whole documents
  auto w = attention_pairs_per_rank(plan("cp=8,cp_kind=ring,mask=doc:2048"), 65536);
  double total = std::accumulate(w.begin(), w.end(), 0.0);
  EXPECT_DOUBLE_EQ(total, 32.0 * 2048.0 * 2049.0 / 2.0);
  for (double x : w) EXPECT_DOUBLE_EQ(x, w[0]);
}

}  // namespace
}  // namespace ctx
