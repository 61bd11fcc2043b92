// Per-rank attention work of a packed 4-rank context-parallel run (issue 20): the query-key pairs
// ctxrun's CPU attention kernel counts as it evaluates them (Backend::attention_forward_pairs, in
// the report's ranks[].attention_pairs_per_layer_forward) against the cost model's
// attention_pairs_per_rank for the same plan and documents, exactly (integers), for every
// exchange (p2p, allgather, a2a, a2a+p2p) and layout (contiguous, headtail, headtail-doc).
//
// Units: the kernel counts pairs (k <= q, same document), each evaluated for the rank's
// attention_query_heads heads. The cost model's per-rank work is pairs times the share of the TP
// rank's query heads the rank holds (attention_work.hpp): under a2a a rank runs the whole sequence
// for 1/cp of the heads, so its work is (all pairs)/cp; under a2a+p2p its ring position's pairs for
// 1/u of the heads. Like with like: counted * query_heads == cost model * query_heads_per_tp_rank.
//
// Documents: mask=doc:232 at 256 tokens packs one long document (232 tokens) and one short one (the
// remaining 24), both multiples of 2*cp = 8 so headtail-doc runs (ctxrun, like Transformer Engine,
// needs every document divisible by 2*cp). The four layouts then differ: contiguous gives rank 3
// the end of the long document and all of the short one; headtail puts the short document on rank
// 0; headtail-doc cuts each document into 8 chunks. The causal cases run without documents, except
// headtail-doc, which ctxrun runs only with a document mask: there mask=doc:256 (one document filling
// the sequence, the causal mask itself).
//
// References besides the cost model, independent of its code:
//  - conservation: summed over the ranks, counted pairs times heads equal the sequence's pairs
//    sum_docs l(l+1)/2 times the TP rank's heads (every query's pairs are evaluated once per head);
//  - hand derivations for two cases (below, with their arithmetic).
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "costmodel/attention_work.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/process_groups.hpp"
#include "costmodel/profile_store.hpp"
#include "executor/tests/ctxrun_cli.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kRanks = 4;
constexpr int64_t kSeq = 256;
constexpr int kSteps = 1;

struct RankWork {
  int64_t pairs_total = 0, layer_forwards = 0, query_heads = 0, query_heads_per_tp_rank = 0;
};

// Runs the plan on kRanks ranks for kSteps steps and returns every rank's counted attention work.
std::vector<RankWork> run_ctxrun(const std::string& plan, const std::string& backend = "cpu") {
  fs::path report = ctx::exec::testing::scratch("ctxrun_cp_work", "r") / "run.json";
  const std::string cmd = ctx::exec::testing::ctxrun(kRanks, "--model tiny --seq " + std::to_string(kSeq) + " --steps " +
                                                                 std::to_string(kSteps) + " --backend " + backend + " --plan " + plan +
                                                                 " --report " + report.string());
  const auto r = ctx::exec::testing::sh(cmd);
  EXPECT_EQ(r.code, 0) << cmd << "\n" << r.out;
  std::vector<RankWork> out;
  if (r.code != 0) return out;
  json j = json::parse(std::ifstream(report));
  fs::remove_all(report.parent_path());
  for (const json& rk : j.at("ranks")) {
    RankWork w;
    w.pairs_total = rk.at("attention_pairs_total").get<int64_t>();
    w.layer_forwards = rk.at("attention_layer_forwards").get<int64_t>();
    w.query_heads = rk.at("attention_query_heads").get<int64_t>();
    w.query_heads_per_tp_rank = rk.at("attention_query_heads_per_tp_rank").get<int64_t>();
    out.push_back(w);
  }
  return out;
}

// The documents of a sequence of kSeq tokens under mask=doc:<len> (or none: one document), written
// out here rather than taken from the cost model: len repeated, the last one cut at the sequence.
std::vector<int64_t> documents(int64_t len) {
  std::vector<int64_t> d;
  for (int64_t used = 0; used < kSeq; used += d.back()) d.push_back(std::min(len, kSeq - used));
  return d;
}

struct WorkCase {
  const char* plan;  // without the mask
  int64_t doc_len;   // 0: causal, no documents
};

std::string plan_text(const WorkCase& c) {
  return std::string(c.plan) + (c.doc_len > 0 ? ",mask=doc:" + std::to_string(c.doc_len) : std::string());
}

void PrintTo(const WorkCase& c, std::ostream* os) { *os << plan_text(c); }

class CpAttentionWork : public ::testing::TestWithParam<WorkCase> {};

TEST_P(CpAttentionWork, CountedPairsPerRankEqualTheCostModel) {
  const WorkCase c = GetParam();
  const std::string text = plan_text(c);
  ctx::Plan plan = ctx::parse_plan(text, "test");
  plan.dp = kRanks / (plan.tp * plan.cp);
  const int64_t layers = ctx::resolve_model(ctx::load_profiles(ctx::default_profiles_dir()), "tiny").layers;
  const std::vector<int64_t> docs = documents(c.doc_len > 0 ? c.doc_len : kSeq);
  ASSERT_EQ(ctx::document_layout(plan, kSeq), docs) << text << ": the cost model prices other documents than the run has";
  const std::vector<double> model = ctx::attention_pairs_per_rank(plan, docs);

  const std::vector<RankWork> run = run_ctxrun(text);
  ASSERT_EQ(run.size(), static_cast<size_t>(kRanks)) << text;
  double sequence_pairs = 0;  // sum over documents of l(l+1)/2
  for (int64_t l : docs) sequence_pairs += static_cast<double>(l) * static_cast<double>(l + 1) / 2.0;
  double head_pairs_sum = 0;
  for (int k = 0; k < kRanks; ++k) {
    const RankWork& w = run[static_cast<size_t>(k)];
    // one forward per layer in one step of one micro-batch, no recompute
    ASSERT_EQ(w.layer_forwards, layers * kSteps) << text << ", rank " << k;
    ASSERT_EQ(w.pairs_total % w.layer_forwards, 0) << text << ", rank " << k << ": layer forwards saw different work";
    const int64_t counted = w.pairs_total / w.layer_forwards;
    const int64_t cp_index = ctx::coord_of_rank(plan, k).cp;
    const double predicted = model[static_cast<size_t>(cp_index)];
    // like with like, both sides integers: pairs x heads evaluated = cost model x heads of the TP rank
    const double predicted_head_pairs = predicted * static_cast<double>(w.query_heads_per_tp_rank);
    ASSERT_EQ(predicted_head_pairs, std::floor(predicted_head_pairs)) << text << ", rank " << k;
    EXPECT_EQ(static_cast<double>(counted * w.query_heads), predicted_head_pairs)
        << text << ", rank " << k << " (CP index " << cp_index << "): counted " << counted << " pairs for "
        << w.query_heads << " of " << w.query_heads_per_tp_rank << " heads, cost model " << predicted;
    head_pairs_sum += static_cast<double>(counted * w.query_heads);
  }
  EXPECT_EQ(head_pairs_sum, sequence_pairs * static_cast<double>(run[0].query_heads_per_tp_rank))
      << text << ": every query's pairs are evaluated once per head, summed over the ranks";
}

const WorkCase kCases[] = {
    // packed documents of very different lengths (232 and 24 tokens), every exchange x layout
    {"cp=4,cp_comm=p2p,cp_layout=contiguous", 232},
    {"cp=4,cp_comm=p2p,cp_layout=headtail", 232},
    {"cp=4,cp_comm=p2p,cp_layout=headtail-doc", 232},
    {"cp=4,cp_comm=allgather,cp_layout=contiguous", 232},
    {"cp=4,cp_comm=allgather,cp_layout=headtail", 232},
    {"cp=4,cp_comm=allgather,cp_layout=headtail-doc", 232},
    {"cp=4,cp_comm=a2a,cp_layout=contiguous", 232},
    {"cp=4,cp_comm=a2a,cp_layout=headtail", 232},
    {"cp=4,cp_comm=a2a,cp_layout=headtail-doc", 232},
    {"cp=4,cp_comm=a2a+p2p,ulysses=2,cp_layout=contiguous", 232},
    {"cp=4,cp_comm=a2a+p2p,ulysses=2,cp_layout=headtail", 232},
    {"cp=4,cp_comm=a2a+p2p,ulysses=2,cp_layout=headtail-doc", 232},
    // causal, one per layout (headtail-doc: one document filling the sequence, see the top)
    {"cp=4,cp_comm=p2p,cp_layout=contiguous", 0},
    {"cp=4,cp_comm=allgather,cp_layout=headtail", 0},
    {"cp=4,cp_comm=a2a+p2p,ulysses=2,cp_layout=headtail-doc", 256},
};

INSTANTIATE_TEST_SUITE_P(Layouts, CpAttentionWork, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<WorkCase>& i) {
                           std::string n = plan_text(i.param);
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// Hand derivations (rank i of 4, 256 tokens; a query at position q of a document starting at s sees
// q - s + 1 keys):
//  contiguous, mask=doc:232: rank i holds [64i, 64i+64).
//    rank 0: sum_{q=0}^{63} (q+1) = 64*65/2 = 2080; rank 1: sum_{65}^{128} = (65+128)*64/2 = 6176;
//    rank 2: sum_{129}^{192} = (129+192)*64/2 = 10272; rank 3: the long document's [192,232):
//    sum_{193}^{232} = (193+232)*40/2 = 8500, plus the short one's 24*25/2 = 300: 8800.
//  headtail, causal: rank i holds chunks i and 7-i of 32 tokens; chunk c's queries see
//    sum_{q=32c}^{32c+31} (q+1) = 16*(64c+33) = 1024c + 528 keys, so every rank does
//    1024*7 + 2*528 = 8224 (zig-zag balances causal work).
TEST(CpAttentionWorkByHand, ContiguousDocumentsAndHeadTailCausal) {
  struct Hand {
    const char* plan;
    std::vector<int64_t> pairs;
  };
  for (const Hand& h : {Hand{"cp=4,cp_comm=p2p,cp_layout=contiguous,mask=doc:232", {2080, 6176, 10272, 8800}},
                        Hand{"cp=4,cp_comm=allgather,cp_layout=headtail", {8224, 8224, 8224, 8224}}}) {
    const std::vector<RankWork> run = run_ctxrun(h.plan);
    ASSERT_EQ(run.size(), static_cast<size_t>(kRanks)) << h.plan;
    for (int k = 0; k < kRanks; ++k) {
      const RankWork& w = run[static_cast<size_t>(k)];
      ASSERT_GT(w.layer_forwards, 0) << h.plan;
      EXPECT_EQ(w.pairs_total / w.layer_forwards, h.pairs[static_cast<size_t>(k)]) << h.plan << ", rank " << k;
      EXPECT_EQ(w.query_heads, w.query_heads_per_tp_rank) << h.plan << ": without Ulysses a rank holds all its heads";
    }
  }
}

// The count is stream-ordered (the deferred backend runs every kernel on a worker thread and the
// report reads the count after synchronising) and covers recomputed forwards: under recompute=full
// each layer's forward runs twice per micro-batch, so the layer forwards double and the pairs per
// layer forward stay the hand-derived contiguous ones above.
TEST(CpAttentionWorkByHand, DeferredBackendAndFullRecompute) {
  const std::string plan = "cp=4,cp_comm=p2p,cp_layout=contiguous,mask=doc:232,recompute=full";
  const int64_t layers = ctx::resolve_model(ctx::load_profiles(ctx::default_profiles_dir()), "tiny").layers;
  const std::vector<RankWork> run = run_ctxrun(plan, "cpu-deferred");
  ASSERT_EQ(run.size(), static_cast<size_t>(kRanks)) << plan;
  const int64_t hand[kRanks] = {2080, 6176, 10272, 8800};
  for (int k = 0; k < kRanks; ++k) {
    const RankWork& w = run[static_cast<size_t>(k)];
    EXPECT_EQ(w.layer_forwards, 2 * layers * kSteps) << plan << ", rank " << k;
    ASSERT_GT(w.layer_forwards, 0) << plan;
    EXPECT_EQ(w.pairs_total, hand[k] * w.layer_forwards) << plan << ", rank " << k;
  }
}

}  // namespace
