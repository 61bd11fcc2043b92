// Per-rank attention work under ring and zig-zag placement, against closed forms and brute force.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

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

// A ring's step 0 pairs each rank's queries with its own keys: attention_pairs_own_keys (one pass over
// the ranks, for the pricing of unmasked ring blocks) equals that step of the per-step matrix for every
// layout with ring steps, by hand for the plain ring (rank r holds n = 96 tokens: n(n+1)/2 pairs) and
// zig-zag (rank r's two chunks of c = 48: each causal on itself, c(c+1)/2 twice, plus its tail chunk's
// queries against its head chunk's keys, c^2), and under Ulysses x ring (1/u of the heads each).
TEST(AttentionWork, OwnKeysAreTheRingsFirstStep) {
  const int64_t seq = 384;
  for (const char* text : {"cp=4,cp_kind=ring", "cp=4,cp_kind=zigzag", "cp=8,cp_kind=usp,ulysses=2", "cp=4,cp_kind=usp,ulysses=2"}) {
    SCOPED_TRACE(text);
    const Plan p = plan(text);
    const std::vector<double> own = attention_pairs_own_keys(p, seq);
    const std::vector<std::vector<double>> steps = attention_pairs_per_step(p, seq);
    ASSERT_EQ(own.size(), steps.size());
    for (size_t r = 0; r < own.size(); ++r) EXPECT_DOUBLE_EQ(own[r], steps[r][0]) << "rank " << r;
  }
  const double n = 96, c = 48;
  for (double x : attention_pairs_own_keys(plan("cp=4,cp_kind=ring"), seq)) EXPECT_DOUBLE_EQ(x, n * (n + 1) / 2);
  for (double x : attention_pairs_own_keys(plan("cp=4,cp_kind=zigzag"), seq)) EXPECT_DOUBLE_EQ(x, c * (c + 1) + c * c);
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

// Issue 20: all-gather CP places tokens head-tail, as the stacks do. Hand derivation: with cp ranks
// and 2cp chunks of c tokens, chunk j's causal pairs are c^2 (j + 1/2) (+ c/2), so a contiguous rank r
// (chunks 2r, 2r+1) does c^2 (4r + 2) and the last rank (4cp - 2) c^2 against a mean of 2cp c^2:
// (2cp - 1)/cp = 1.875 of the mean at cp = 8; head-tail rank r (chunks r, 2cp-1-r) does 2cp c^2, the mean.
TEST(AttentionWork, AllGatherHeadTailBalancesCausalWorkContiguousDoesNot) {
  const int64_t seq = 1 << 20;
  for (const char* text : {"cp=8,cp_kind=allgather", "cp=8,cp_kind=allgather,cp_layout=contiguous"}) {
    const Plan p = plan(text);
    const std::vector<double> w = attention_pairs_per_rank(p, seq);
    const double mean = std::accumulate(w.begin(), w.end(), 0.0) / static_cast<double>(w.size());
    const double worst = *std::max_element(w.begin(), w.end());
    if (p.cp_layout == CpLayout::headtail)
      EXPECT_LE(worst / mean, 1.0 + 1e-5) << text;  // equal up to the c/2 diagonal terms (c = 64K)
    else
      EXPECT_NEAR(worst / mean, 15.0 / 8.0, 1e-4) << text;
  }
}

// The per-document layout balances a pack of documents rank by rank: every document contributes the
// same work to every rank (its head-tail pair), whatever the lengths, when 2cp divides them.
TEST(AttentionWork, HeadTailDocBalancesEveryPack) {
  const std::vector<int64_t> docs{4096, 64, 512, 65536, 1024, 64512};  // sum 135,744; every length a multiple of 16
  Plan doc = plan("cp=8,cp_comm=p2p,cp_layout=headtail-doc");
  Plan whole = plan("cp=8,cp_comm=p2p,cp_layout=headtail");
  auto spread = [](const std::vector<double>& w) {
    const double mean = std::accumulate(w.begin(), w.end(), 0.0) / static_cast<double>(w.size());
    return *std::max_element(w.begin(), w.end()) / mean - 1.0;
  };
  EXPECT_LE(spread(attention_pairs_per_rank(doc, docs)), 1e-4);
  EXPECT_GT(spread(attention_pairs_per_rank(whole, docs)), 0.05);  // the global pair misses the documents' edges
}

// Token share per bin in the packs a histogram is priced on, against the histogram. Bound: the
// priced packs hold N = tokens / E[L] documents drawn independently; the share of bin b is the ratio
// sum(L 1_b) / sum(L), whose standard error (delta method) is sqrt(Var(L (1_b - s_b)) / N) / E[L].
// Lengths are uniform over (previous edge, edge], so E[L] and E[L^2] per bin are closed forms. We
// allow 4 standard errors plus the one document the last pack cuts (at most the largest bin edge).
TEST(AttentionWork, PricedPacksRepresentTheHistogramsTokenShares) {
  const int64_t seq = 1 << 20;
  for (const char* mask : {"mask=doc:hist:2k@0.6/32k@0.3/512k@0.1", "mask=doc:tokhist:2k@0.6/32k@0.3/512k@0.1",
                           "mask=doc:tokhist:1k@0.25/8k@0.25/64k@0.5"}) {
    SCOPED_TRACE(mask);
    const Plan p = plan(std::string("cp=8,") + mask);
    const DocLengths& d = p.docs;
    const size_t bins = d.tokens.size();
    std::vector<double> m1(bins), m2(bins), prob(bins);
    double norm = 0;
    for (size_t b = 0; b < bins; ++b) {
      const double lo = b == 0 ? 1.0 : static_cast<double>(d.tokens[b - 1] + 1), hi = static_cast<double>(d.tokens[b]);
      m1[b] = (lo + hi) / 2.0;
      m2[b] = (lo * lo + lo * hi + hi * hi) / 3.0;  // E[L^2] of a uniform length (continuous approximation)
      prob[b] = d.token_share ? d.weights[b] / m1[b] : d.weights[b];
      norm += prob[b];
    }
    double el = 0;
    for (size_t b = 0; b < bins; ++b) el += (prob[b] /= norm) * m1[b];
    std::vector<double> share(bins);  // the expected token share of each bin
    for (size_t b = 0; b < bins; ++b) share[b] = prob[b] * m1[b] / el;
    if (d.token_share) {
      for (size_t b = 0; b < bins; ++b) {
        EXPECT_NEAR(share[b], d.weights[b], 1e-12);  // tokhist: the weights are token shares
      }
    }
    // observed shares in the priced packs: greedy packing cuts a document at a pack's end and starts
    // the next pack with its rest, so the packs laid end to end are the drawn documents with the pieces
    // at each boundary joined (only the last pack's cut document keeps its first piece alone)
    const auto packs = priced_packs(p, seq);
    std::vector<int64_t> drawn;
    for (size_t k = 0; k < packs.size(); ++k)
      for (size_t i = 0; i < packs[k].size(); ++i) {
        if (k > 0 && i == 0) drawn.back() += packs[k][i];
        else drawn.push_back(packs[k][i]);
      }
    double total = 0;
    std::vector<double> seen(bins, 0.0);
    for (int64_t l : drawn) {
      size_t b = 0;
      while (b + 1 < bins && l > d.tokens[b]) ++b;
      seen[b] += static_cast<double>(l);
      total += static_cast<double>(l);
    }
    ASSERT_EQ(total, static_cast<double>(seq) * static_cast<double>(kPricedPacks));
    const double n_docs = total / el;
    for (size_t b = 0; b < bins; ++b) {
      double var = 0;  // Var(L (1_b - s_b)) = E[L^2 (1_b - s_b)^2]
      for (size_t j = 0; j < bins; ++j) var += prob[j] * m2[j] * std::pow((j == b ? 1.0 : 0.0) - share[b], 2);
      const double se = std::sqrt(var / n_docs) / el;
      const double last_cut = static_cast<double>(d.tokens.back()) / total;  // the last pack's cut document
      EXPECT_NEAR(seen[b] / total, share[b], 4.0 * se + last_cut) << "bin " << d.tokens[b] << " se " << se;
    }
  }
}

}  // namespace
}  // namespace ctx
