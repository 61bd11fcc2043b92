// Context-parallel token placement (costmodel/cp_placement.hpp, the one the executor runs) against
// the cost model's attention work: per-rank and per-ring-step query-key pair counts computed by
// brute force from cp_token_indices equal attention_work's exactly, for every exchange x layout
// (cp_comm x cp_layout, plan.hpp) and for packs of documents, fixed, listed and sampled from histograms.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "costmodel/attention_work.hpp"
#include "costmodel/cp_placement.hpp"

namespace ctx {
namespace {

struct Case {
  std::string plan;
  int64_t seq;
};

// Every exchange x layout at several degrees, sequence lengths and masks (causal, packed documents
// of fixed and listed lengths, and histograms by share of documents and of tokens).
std::vector<Case> cases() {
  std::vector<Case> out;
  std::vector<std::string> kinds;
  for (const char* layout : {"contiguous", "headtail", "headtail-doc"}) {
    const std::string l = std::string(",cp_layout=") + layout;
    for (const char* cp : {"cp=2", "cp=4", "cp=8"}) {
      kinds.push_back(std::string(cp) + ",cp_comm=p2p" + l);
      kinds.push_back(std::string(cp) + ",cp_comm=allgather" + l);
      kinds.push_back(std::string(cp) + ",cp_comm=a2a" + l);
    }
    for (const char* usp : {"cp=2,ulysses=2", "cp=4,ulysses=2", "cp=8,ulysses=2", "cp=8,ulysses=4"})
      kinds.push_back(std::string(usp) + ",cp_comm=a2a+p2p" + l);
  }
  for (const std::string& k : kinds)
    for (int64_t seq : {256, 768, 1024})
      for (const char* mask : {"", ",mask=doc:100", ",mask=doc:40/300/17", ",mask=doc:hist:16@0.5/200@0.5",
                               ",mask=doc:tokhist:16@0.5/200@0.5"})
        out.push_back({k + mask, seq});
  return out;
}

Plan plan(const std::string& text) {
  Plan p = parse_plan(text);
  p.dp = 1;
  return p;
}

// Document index of every token of one pack.
std::vector<int64_t> doc_of_token(const std::vector<int64_t>& docs) {
  std::vector<int64_t> doc;
  int64_t d = 0;
  for (int64_t len : docs) {
    doc.insert(doc.end(), static_cast<size_t>(len), d);
    ++d;
  }
  return doc;
}

// The tokens a CP rank's attention runs on, from cp_token_indices alone: its own, or under
// Ulysses (ulysses, usp) those of its whole Ulysses group (u consecutive CP ranks), whose
// all-to-all gathers the group's tokens and gives each rank 1/u of the heads.
std::vector<int64_t> attention_tokens(const Plan& p, int64_t c, const std::vector<int64_t>& docs) {
  const int64_t u = ulysses_degree(p);
  std::vector<int64_t> out;
  for (int64_t i = c / u * u; i < c / u * u + u; ++i) {
    std::vector<int64_t> part = cp_token_indices(p, i, docs);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

// Pairs (q, k) with k <= q in the same document, q in `queries`, k in `keys`.
double brute_pairs(const std::vector<int64_t>& queries, const std::vector<int64_t>& keys, const std::vector<int64_t>& doc) {
  double n = 0;
  for (int64_t q : queries)
    for (int64_t k : keys) n += (k <= q && doc[static_cast<size_t>(k)] == doc[static_cast<size_t>(q)]);
  return n;
}

std::vector<int64_t> all_tokens(int64_t seq) {
  std::vector<int64_t> v(static_cast<size_t>(seq));
  for (int64_t i = 0; i < seq; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

TEST(CpPlacement, RanksPartitionTheSequence) {
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.plan + " seq " + std::to_string(k.seq));
    Plan p = plan(k.plan);
    for (const std::vector<int64_t>& docs : priced_packs(p, k.seq)) {
      std::vector<int64_t> seen;
      for (int64_t c = 0; c < p.cp; ++c) {
        std::vector<int64_t> mine = cp_token_indices(p, c, docs);
        // equal shares; headtail-doc cuts each document at floor(len*j/2cp), so a rank's two chunks of
        // one document differ from len/cp by less than 2 tokens (under a2a+p2p, its slice of them)
        const int64_t slack = p.cp_layout == CpLayout::headtail_doc ? 2 * static_cast<int64_t>(docs.size()) : 0;
        EXPECT_LE(std::abs(static_cast<int64_t>(mine.size()) - k.seq / p.cp), slack) << "rank " << c;
        seen.insert(seen.end(), mine.begin(), mine.end());
      }
      std::sort(seen.begin(), seen.end());
      EXPECT_EQ(seen, all_tokens(k.seq));
    }
  }
}

TEST(CpPlacement, HeadTailDocCutsEveryDocumentInTwoCpChunks) {
  // cp=2, documents 8 and 16 tokens: chunks of 2 and of 4; rank 0 holds chunks 0 and 3 of each
  Plan p = plan("cp=2,cp_comm=p2p,cp_layout=headtail-doc");
  const std::vector<int64_t> want{0, 1, 6, 7, 8, 9, 10, 11, 20, 21, 22, 23};
  EXPECT_EQ(cp_token_indices(p, 0, std::vector<int64_t>{8, 16}), want);
  // Transformer Engine's own expectation for its THD partition (tests/pytorch/attention/test_cp_utils.py,
  // test_thd_get_partitioned_indices_matches_dual_chunk_expected_indices: cu_seqlens [0, 8, 16], cp = 2)
  const std::vector<int64_t> te0{0, 1, 6, 7, 8, 9, 14, 15}, te1{2, 3, 4, 5, 10, 11, 12, 13};
  EXPECT_EQ(cp_token_indices(p, 0, std::vector<int64_t>{8, 8}), te0);
  EXPECT_EQ(cp_token_indices(p, 1, std::vector<int64_t>{8, 8}), te1);
}

TEST(CpPlacement, ZigZagRankHoldsChunksCAndTwoCpMinusOneMinusC) {
  Plan p = plan("cp=4,cp_kind=zigzag");
  std::vector<int64_t> want;
  for (int64_t i = 32; i < 64; ++i) want.push_back(i);    // chunk 1 of 8 (32 tokens each)
  for (int64_t i = 192; i < 224; ++i) want.push_back(i);  // chunk 8-1-1 = 6
  EXPECT_EQ(cp_token_indices(p, 1, 256), want);
}

TEST(CpPlacement, UspSlicesTheRingPositionsZigZagPair) {
  // cp=4, ulysses=2: ring degree 2, chunks of 256/4 = 64; ring position 1 holds chunks 1 and 2
  // ([64, 192)); its two Ulysses ranks (cp 2 and 3) hold the halves in order
  Plan p = plan("cp=4,cp_kind=usp,ulysses=2");
  std::vector<int64_t> a = cp_token_indices(p, 2, 256), b = cp_token_indices(p, 3, 256);
  ASSERT_EQ(a.size(), 64u);
  ASSERT_EQ(b.size(), 64u);
  EXPECT_EQ(a.front(), 64);
  EXPECT_EQ(a.back(), 127);
  EXPECT_EQ(b.front(), 128);
  EXPECT_EQ(b.back(), 191);
}

TEST(CpPlacement, PerRankWorkFromTokenIndicesEqualsAttentionWork) {
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.plan + " seq " + std::to_string(k.seq));
    Plan p = plan(k.plan);
    const double u = static_cast<double>(ulysses_degree(p));
    const std::vector<std::vector<int64_t>> packs = priced_packs(p, k.seq);
    std::vector<double> mean(static_cast<size_t>(p.cp), 0.0);
    for (const std::vector<int64_t>& docs : packs) {
      const std::vector<int64_t> doc = doc_of_token(docs);
      const std::vector<double> model = attention_pairs_per_rank(p, docs);
      ASSERT_EQ(static_cast<int64_t>(model.size()), p.cp);
      for (int64_t c = 0; c < p.cp; ++c) {
        // every key reaches every rank (ring passes, all-gather, all-to-all); the rank holds 1/u of the heads
        double brute = brute_pairs(attention_tokens(p, c, docs), all_tokens(k.seq), doc) / u;
        EXPECT_EQ(model[static_cast<size_t>(c)], brute) << "rank " << c;
        mean[static_cast<size_t>(c)] += brute / static_cast<double>(packs.size());
      }
    }
    // the plan's figure is the expectation over the priced packs (one pack unless a histogram)
    const std::vector<double> model = attention_pairs_per_rank(p, k.seq);
    for (int64_t c = 0; c < p.cp; ++c) EXPECT_NEAR(model[static_cast<size_t>(c)], mean[static_cast<size_t>(c)], 1e-9 * mean[0] + 1e-9);
  }
}

TEST(CpPlacement, PerRingStepWorkFromTokenIndicesEqualsAttentionWork) {
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.plan + " seq " + std::to_string(k.seq));
    Plan p = plan(k.plan);
    const std::vector<int64_t> docs = priced_packs(p, k.seq).back();
    const std::vector<int64_t> doc = doc_of_token(docs);
    const std::vector<std::vector<double>> model = attention_pairs_per_step(p, docs);
    ASSERT_EQ(static_cast<int64_t>(model.size()), p.cp);
    const int64_t u = ulysses_degree(p), r = ring_degree(p);
    for (int64_t c = 0; c < p.cp; ++c) {
      const std::vector<double>& steps = model[static_cast<size_t>(c)];
      const std::vector<int64_t> queries = attention_tokens(p, c, docs);
      if (p.cp_comm == CpComm::a2a || p.cp_comm == CpComm::allgather) {
        // one step over every key (all-to-all or all-gather first)
        ASSERT_EQ(steps.size(), 1u);
        EXPECT_EQ(steps[0], brute_pairs(queries, all_tokens(k.seq), doc) / static_cast<double>(u)) << "rank " << c;
        continue;
      }
      // ring kinds: step j brings the keys of the ring position j places back
      ASSERT_EQ(static_cast<int64_t>(steps.size()), r);
      const int64_t pos = c / u;
      for (int64_t j = 0; j < r; ++j) {
        const int64_t src = ((pos - j) % r + r) % r;
        double brute = brute_pairs(queries, attention_tokens(p, src * u, docs), doc) / static_cast<double>(u);
        EXPECT_EQ(steps[static_cast<size_t>(j)], brute) << "rank " << c << " step " << j;
      }
    }
  }
}

}  // namespace
}  // namespace ctx
