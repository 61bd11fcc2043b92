// Variable-length strategies under ring CP (cp_varlen, issue 20): native varlen, cycle (the ring
// once per document) and split:k, priced from the placement (attention_work.hpp, varlen_calls and
// varlen_padded_lse_rows) against hand derivations, and the orderings the GLM-4 1M write-up describes:
// with many short documents cycle is the slowest; with widely different lengths native holds the most.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "costmodel/attention_work.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/prediction.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/step_model.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(default_profiles_dir());
  return p;
}

Plan plan(const std::string& text) {
  Plan p = parse_plan(text);
  p.dp = 1;
  return p;
}

// Hand derivation, cp = 2 head-tail per document, documents 16, 4, 4, 8 (32 tokens): each document
// is cut in 4 chunks and each rank holds two of each, so a rank holds 8 pieces, the longest 16/4 = 4
// tokens, 4+4+1+1+1+1+2+2 = 16 tokens: 8*4 - 16 = 16 padded LSE rows. split:2 deals documents 0,2
// and 1,3 into sub-packs {16, 4} (4 pieces, longest 4, 10 tokens: 6) and {4, 8} (4 pieces, longest 2,
// 6 tokens: 2): the larger, 6. cycle runs one document at a time: none. Equal lengths: none.
TEST(CpVarlen, PaddedLseRowsFollowTheDocumentPieces) {
  const std::string base = "cp=2,cp_comm=p2p,cp_layout=headtail-doc,mask=doc:16/4/4/8";
  EXPECT_EQ(varlen_padded_lse_rows(plan(base), 32), 16.0);
  EXPECT_EQ(varlen_padded_lse_rows(plan(base + ",cp_varlen=native"), 32), 16.0);
  EXPECT_EQ(varlen_padded_lse_rows(plan(base + ",cp_varlen=split:2"), 32), 6.0);
  EXPECT_EQ(varlen_padded_lse_rows(plan(base + ",cp_varlen=cycle"), 32), 0.0);
  EXPECT_EQ(varlen_padded_lse_rows(plan("cp=2,cp_comm=p2p,cp_layout=headtail-doc,mask=doc:8"), 32), 0.0);
  // no ring, no padding to price: all-gather and Ulysses run no varlen ring
  EXPECT_EQ(varlen_padded_lse_rows(plan("cp=2,cp_comm=allgather,mask=doc:16/4/4/8"), 32), 0.0);
}

// cycle's calls: one per document and step, together holding exactly the pack's pairs; split:k's
// sub-packs hold them too (documents never cross a sub-pack).
TEST(CpVarlen, CallsHoldThePacksPairs) {
  for (const char* v : {"cycle", "split:2", "split:3"}) {
    const Plan p = plan(std::string("cp=4,cp_comm=p2p,cp_layout=headtail-doc,mask=doc:64/16/48/128,cp_varlen=") + v);
    const int64_t seq = 256;
    double native = 0;
    for (const auto& steps : attention_pairs_per_step(p, seq))
      for (double w : steps) native += w;
    double calls = 0;
    size_t n = 0;
    for (const AttentionCall& c : varlen_calls(p, seq, true)) {
      n += 1;
      for (const auto& steps : c.pairs)
        for (double w : steps) calls += c.count * w;
    }
    EXPECT_DOUBLE_EQ(calls, native) << v;
    EXPECT_EQ(n, std::string(v) == "cycle" ? 4u : std::string(v) == "split:2" ? 2u : 3u) << v;  // 4 distinct lengths
  }
}

struct Priced {
  StepCosts k;
  Prediction pred;
};

Priced run(const std::string& plan_text) {
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const ClusterSpec c = resolve_cluster(profiles(), "2x8xh100");
  const RuntimeProfile rt = resolve_runtime(profiles(), "ctxrun-cuda");
  const int64_t seq = 1 << 20;
  Plan p = parse_plan(plan_text);
  PlanCheck chk = check_plan(p, m, c, seq);
  EXPECT_TRUE(chk.ok()) << chk.message();
  return {step_costs(m, c, rt, p, seq), predict(m, c, rt, p, seq)};
}

const char* kBase = "cp=16,cp_comm=p2p,cp_layout=headtail-doc,zero=3,recompute=selective,tiled_loss=4096,tiled_mlp=auto";

// 512 documents of 2K per 1M pack: cycle makes 512 calls per ring step, each paying a kernel launch
// and its own hop latency, at the efficiency of a 128-token block; native makes one call per step.
TEST(CpVarlen, ManyShortDocumentsMakeCycleTheSlowest) {
  const std::string mask = ",mask=doc:2k";
  Priced native = run(std::string(kBase) + mask + ",cp_varlen=native");
  Priced cycle = run(std::string(kBase) + mask + ",cp_varlen=cycle");
  Priced split = run(std::string(kBase) + mask + ",cp_varlen=split:4");
  EXPECT_GT(cycle.pred.time.step_seconds, native.pred.time.step_seconds);
  EXPECT_GT(cycle.pred.time.step_seconds, split.pred.time.step_seconds);
  // the explanation, term by term: every step of a cycle rank carries at least 512 launches
  const ClusterSpec c = resolve_cluster(profiles(), "2x8xh100");
  for (const auto& rank : cycle.k.attn_fwd[0])
    for (double step : rank) EXPECT_GE(step, 512.0 * c.gpu.kernels.launch_seconds);
  EXPECT_GT(cycle.k.p2p_fwd, native.k.p2p_fwd);  // 512 hops' latencies instead of one
}

// A few 512K documents among many short ones: native varlen pads its softmax statistics to the longest
// document for every document (varlen_padded_lse_rows), split:4 to the longest of its sub-pack, cycle
// not at all, so the peaks order native > split:4 > cycle.
TEST(CpVarlen, WidelyDifferentLengthsGiveNativeTheHighestPeak) {
  const std::string mask = ",mask=doc:hist:512@0.95/512k@0.05";
  Priced native = run(std::string(kBase) + mask + ",cp_varlen=native");
  Priced cycle = run(std::string(kBase) + mask + ",cp_varlen=cycle");
  Priced split = run(std::string(kBase) + mask + ",cp_varlen=split:4");
  EXPECT_GT(native.pred.memory.peak.total(), split.pred.memory.peak.total());
  EXPECT_GT(split.pred.memory.peak.total(), cycle.pred.memory.peak.total());
}

}  // namespace
}  // namespace ctx
