// The search varies optimizer precision (issue 21, parts 3 and 5): master, grads and moments take
// the values the runtime's capabilities allow, but only where that changes the answer.
//   - plan: every plan at the runtime's own precision first; only when none fits, each plan at the
//     most precise lower variant that fits (most model-state bytes per parameter first). Exhaustive
//     on a small space: the search's ranking is exactly that rule applied by brute force;
//   - maxseq: the answer at the runtime's own precision, and beside it the longest any lower
//     variant reaches, each equal to the brute-force maximum over every enumerated plan and variant;
//   - a precision the user gives (-p moments=bf16) is kept in every plan, lower pass included;
//   - a runtime without precision capabilities (hf-deepspeed) has no variants.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/step_model.hpp"
#include "planner/search.hpp"
#include "built_in_profiles.hpp"

namespace ctx {
namespace {

const Profiles& profiles() { return testing::built_in_profiles(); }
testing::RunResult ctxplan(std::vector<std::string> args) { return testing::ctxplan_with_built_in_profiles(std::move(args)); }

SearchRequest request(int64_t seq, const std::string& keys = "", const std::string& runtime = "megatron",
                      const std::string& cluster = "1xh100") {
  SearchRequest r;
  r.model = resolve_model(profiles(), "Llama-3.1-8B");
  r.cluster = resolve_cluster(profiles(), cluster);
  r.runtime = resolve_runtime(profiles(), runtime);
  r.seq = seq;
  r.refine = 0;  // ranked by the closed form, which the brute force below computes too
  if (!keys.empty()) {
    r.base = parse_plan(keys, "--plan");
    r.fixed_fields = fixed_plan_fields(keys, "--plan");
  }
  return r;
}

// Megatron allows grads fp32|bf16 and moments fp32|bf16 (Megatron-Core's precision-aware optimizer;
// its own: fp32 master 4 + fp32 grads 4 + fp32 m, v 8 = 16 bytes per parameter). Its lower variants,
// most model-state bytes first: grads=bf16 (4 + 2 + 8 = 14), moments=bf16 (4 + 4 + 4 = 12), both (10).
const std::vector<std::string> kMegatronVariants = {"grads=bf16", "moments=bf16", "grads=bf16,moments=bf16"};
// ctxrun allows master fp32|none and moments fp32|bf16 (own: 4 + 4 + 8 = 16): moments=bf16 (4 + 4 + 4
// = 12) and master=none (0 + 4 + 8 = 12) tie, the one that keeps the master copy first (the
// enumeration's order), then both (0 + 4 + 4 = 8).
const std::vector<std::string> kCtxrunVariants = {"moments=bf16", "master=none", "master=none,moments=bf16"};

Plan with_keys(Plan p, const std::string& keys) {
  const Plan k = parse_plan(keys);
  if (keys.find("master") != std::string::npos) p.master = k.master;
  if (keys.find("grads") != std::string::npos) p.grads = k.grads;
  if (keys.find("moments") != std::string::npos) p.moments = k.moments;
  return p;
}

TEST(SearchPrecision, VariantsAreTheCapabilitiesMostPreciseFirst) {
  std::vector<std::string> got;
  for (const StateDtypes& v : lower_precision_variants(request(4096)))
    got.push_back(std::string(to_string(v.master)) + "/" + to_string(v.grads) + "/" + to_string(v.moments));
  EXPECT_EQ(got, (std::vector<std::string>{"fp32/bf16/fp32", "fp32/fp32/bf16", "fp32/bf16/bf16"}));
  got.clear();
  for (const StateDtypes& v : lower_precision_variants(request(4096, "", "ctxrun-cuda")))
    got.push_back(std::string(to_string(v.master)) + "/" + to_string(v.grads) + "/" + to_string(v.moments));
  EXPECT_EQ(got, (std::vector<std::string>{"fp32/fp32/bf16", "none/fp32/fp32", "none/fp32/bf16"}));
  SearchRequest ds = request(4096);
  ds.runtime = resolve_runtime(profiles(), "hf-deepspeed");
  EXPECT_TRUE(lower_precision_variants(ds).empty()) << "hf-deepspeed's capabilities list no optimizer precision";
  // the user's moments=bf16 stays: only grads varies (fp32 with moments=bf16 is the first pass's own)
  got.clear();
  for (const StateDtypes& v : lower_precision_variants(request(4096, "moments=bf16")))
    got.push_back(std::string(to_string(v.master)) + "/" + to_string(v.grads) + "/" + to_string(v.moments));
  EXPECT_EQ(got, (std::vector<std::string>{"fp32/bf16/bf16"}));
  EXPECT_TRUE(lower_precision_variants(request(4096, "grads=bf16,moments=bf16")).empty()) << "megatron has nothing lower";
}

// Brute force of the search's rule over the enumerated space: the plans at the runtime's own
// precision that fit; if none, each plan at the first variant (most precise first) that fits.
struct Brute {
  bool lower = false;
  std::set<std::string> plans;
  double best_tokens_per_second = 0;
};
Brute brute_force(const SearchRequest& req, const std::vector<std::string>& variants) {
  Brute out;
  auto price = [&](const Plan& p) {
    out.plans.insert(plan_to_string(p) + "|" + order_to_string(p) + "|mbs" + std::to_string(p.mbs));
    out.best_tokens_per_second = std::max(
        out.best_tokens_per_second, estimate_step(step_costs(req.model, req.cluster, req.runtime, p, req.seq, false)).tokens_per_second);
  };
  std::vector<Plan> valid;
  for (Plan p : enumerate_plans(req))
    if (check_plan(p, req.model, req.cluster, req.seq).ok()) valid.push_back(p);
  for (const Plan& p : valid)
    if (predict_memory(req.model, req.cluster, req.runtime, p, req.seq).fits()) price(p);
  if (!out.plans.empty()) return out;
  out.lower = true;
  for (const Plan& p : valid)
    for (const std::string& v : variants) {
      const Plan q = with_keys(p, v);
      if (predict_memory(req.model, req.cluster, req.runtime, q, req.seq).fits()) {
        price(q);
        break;
      }
    }
  return out;
}

// Llama-3.1-8B with Megatron on one H100 and with ctxrun-cuda on two H100s without offload. Two
// lengths each, from the space's own max-seqs (the next test checks those by brute force): one that
// fits at the runtime's own precision (its max-seq, rounded down to 1K: the search never lowers the
// precision) and one between that and the lower precisions' max-seq (none fits at the runtime's own,
// some at lower precision). When written: Megatron 22,258 and 32,005 tokens, ctxrun-cuda 70,864 and
// 255,224.
TEST(SearchPrecision, ExhaustiveOnASmallSpaceTheSearchIsTheRuleByBruteForce) {
  struct Case {
    const char* runtime;
    const char* cluster;
    int64_t seq;
    bool offload;
    const std::vector<std::string>* variants;
    bool lower;
  };
  std::vector<Case> cases;
  for (auto [runtime, cluster, offload, variants] :
       {std::tuple{"megatron", "1xh100", true, &kMegatronVariants}, std::tuple{"ctxrun-cuda", "2xh100", false, &kCtxrunVariants}}) {
    SearchRequest req = request(4096, "", runtime, cluster);
    req.allow_offload = offload;
    const int64_t hi = int64_t(1) << 20;
    const int64_t own = max_trainable_seq_any(req, hi, nullptr), low = max_trainable_seq_lower_precision(req, hi, nullptr);
    ASSERT_GT(low, own + 2048) << runtime << ": the lower precisions must reach further for the case to mean anything";
    cases.push_back({runtime, cluster, own / 1024 * 1024, offload, variants, false});
    cases.push_back({runtime, cluster, (own + low) / 2 / 1024 * 1024, offload, variants, true});
  }
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(k.runtime) + " " + k.cluster + " " + std::to_string(k.seq));
    SearchRequest req = request(k.seq, "", k.runtime, k.cluster);
    req.allow_offload = k.offload;
    const Brute want = brute_force(req, *k.variants);
    const SearchResult r = search_plans(req);
    ASSERT_FALSE(r.ranked.empty()) << r.no_fit_reason;
    EXPECT_EQ(r.lower_precision, want.lower);
    EXPECT_EQ(r.lower_precision, k.lower);
    std::set<std::string> got;
    for (const Candidate& c : r.ranked) got.insert(plan_to_string(c.plan) + "|" + order_to_string(c.plan) + "|mbs" + std::to_string(c.plan.mbs));
    EXPECT_EQ(got, want.plans);
    EXPECT_DOUBLE_EQ(r.ranked.front().time.tokens_per_second, want.best_tokens_per_second);
    for (const Candidate& c : r.ranked) {
      const bool lowered = c.plan.master != StateDtype::runtime || c.plan.grads != StateDtype::runtime ||
                           c.plan.moments != StateDtype::runtime;
      EXPECT_EQ(lowered, want.lower) << plan_to_string(c.plan);
    }
    if (k.lower) {
      EXPECT_GE(r.ranked.size(), 2u);
    }
  }
}

TEST(SearchPrecision, MaxSeqAndItsLowerPrecisionAlternativeAreTheBruteForceMaxima) {
  struct Case {
    const char* runtime;
    const char* cluster;
    bool offload;
    const std::vector<std::string>* variants;
    const char* least;  // the least-bytes variant, which the alternative's plan carries
  };
  const Case cases[] = {{"megatron", "1xh100", true, &kMegatronVariants, "grads=bf16,moments=bf16"},
                        {"ctxrun-cuda", "2xh100", false, &kCtxrunVariants, "master=none,moments=bf16"}};
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(k.runtime) + " " + k.cluster);
    SearchRequest req = request(4096, "", k.runtime, k.cluster);
    req.allow_offload = k.offload;
    const int64_t hi = int64_t(1) << 20;
    int64_t own = 0, lower = 0;
    for (const Plan& p : enumerate_plans(req)) {
      if (p.mbs != 1) continue;
      own = std::max(own, max_trainable_seq(req.model, req.cluster, req.runtime, p, hi));
      for (const std::string& v : *k.variants)
        lower = std::max(lower, max_trainable_seq(req.model, req.cluster, req.runtime, with_keys(p, v), hi));
    }
    Plan best, best_low;
    EXPECT_EQ(max_trainable_seq_any(req, hi, &best), own);
    EXPECT_EQ(max_trainable_seq_lower_precision(req, hi, &best_low), lower);
    // maxseq passes its own answer as a floor: the same maximum, only plans that beat it bisected;
    // a floor no plan beats comes back as it is
    Plan floored;
    EXPECT_EQ(max_trainable_seq_lower_precision(req, hi, &floored, own), lower);
    EXPECT_EQ(plan_to_string(floored), plan_to_string(best_low));
    EXPECT_EQ(max_trainable_seq_lower_precision(req, hi, nullptr, lower + 1), lower + 1);
    // seeded with the plan that answered at the runtime's own precision (as maxseq does): the same maximum
    Plan seeded;
    EXPECT_EQ(max_trainable_seq_lower_precision(req, hi, &seeded, own, &best), lower);
    EXPECT_EQ(max_trainable_seq(req.model, req.cluster, req.runtime, seeded, hi), lower) << plan_to_string(seeded);
    EXPECT_GT(lower, own) << "lower optimizer precision leaves room for a longer sequence";
    const Plan least = with_keys(Plan{}, k.least);
    EXPECT_EQ(best_low.master, least.master);
    EXPECT_EQ(best_low.grads, least.grads);
    EXPECT_EQ(best_low.moments, least.moments);
    EXPECT_EQ(best.master, StateDtype::runtime);
    EXPECT_EQ(best.moments, StateDtype::runtime);
  }
}

// A length between the max-seq at the runtime's own precision and at the least bytes (Megatron on one
// H100: when written 22,258 and 32,005 tokens), rounded down to 1K.
int64_t between_own_and_lower() {
  const SearchRequest req = request(4096);
  const int64_t hi = int64_t(1) << 20;
  return (max_trainable_seq_any(req, hi, nullptr) + max_trainable_seq_lower_precision(req, hi, nullptr)) / 2 / 1024 * 1024;
}

TEST(SearchPrecision, AUserPrecisionIsKeptInEveryPlan) {
  // grads=bf16,moments=bf16 fits some plan at this length, so the search answers (first pass with
  // moments=bf16, or the lower pass with grads=bf16 too)
  const SearchResult r = search_plans(request(between_own_and_lower(), "moments=bf16"));
  ASSERT_FALSE(r.ranked.empty()) << r.no_fit_reason;
  for (const Candidate& c : r.ranked) EXPECT_EQ(c.plan.moments, StateDtype::bf16) << plan_to_string(c.plan);
}

TEST(SearchPrecision, PlanAndMaxSeqSayWhenLowerPrecisionAnswers) {
  const auto plan = ctxplan({"plan", "--model", "Llama-3.1-8B", "--cluster", "1xh100", "--runtime", "megatron", "--seq",
                            std::to_string(between_own_and_lower()), "--json"});
  ASSERT_EQ(plan.exit_code, 0) << plan.both();
  const json j = json::parse(plan.out);
  EXPECT_EQ(j.at("lower_precision"), true);
  EXPECT_NE(j.at("top").at(0).dump().find("bf16"), std::string::npos) << j.at("top").at(0).dump();
  const auto maxseq = ctxplan({"maxseq", "--model", "Llama-3.1-8B", "--cluster", "1xh100", "--runtime", "megatron", "--gpus", "1", "--json"});
  ASSERT_EQ(maxseq.exit_code, 0) << maxseq.both();
  const json m = json::parse(maxseq.out);
  const json& row = m.at("rows").at(0);
  ASSERT_TRUE(row.contains("lower_precision")) << row.dump();
  EXPECT_GT(row.at("lower_precision").at("max_seq").get<int64_t>(), row.at("max_seq").get<int64_t>());
}

}  // namespace
}  // namespace ctx
