// Plan search: only fitting plans, ranked by tokens/s (checked against a brute-force pass over
// the enumerated plans), a non-dominated sorted Pareto frontier, determinism, cancellation,
// monotone max trainable sequence in the GPU count, and what an impossible request says. Then the
// search commands through the real binary (CTXPLAN_BIN): plan --json, simulate --trace, maxseq,
// sweep, budget, bad input (exit 2, the field named) and no fit (exit 3).
#include <gtest/gtest.h>

#include "tests/run_process.hpp"
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/exit_codes.hpp"
#include "costmodel/pipeline_time.hpp"
#include "costmodel/simulator.hpp"
#include "planner/search.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(default_profiles_dir());
  return p;
}

SearchRequest request(const std::string& model, const std::string& cluster, int64_t seq, const std::string& runtime = "ctxrun-cuda") {
  SearchRequest r;
  r.model = resolve_model(profiles(), model);
  r.cluster = resolve_cluster(profiles(), cluster);
  r.runtime = resolve_runtime(profiles(), runtime);
  r.seq = seq;
  return r;
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// ---- the library --------------------------------------------------------------------------------

TEST(Search, FindsExactlyTheFittingPlansRankedByTokensPerSecond) {
  for (auto [cluster, seq, gbt] : {std::tuple<const char*, int64_t, int64_t>{"8xh100", 131072, 0}, {"2x8xh100", 65536, 2097152}}) {
    SearchRequest req = request("Llama-3.1-8B", cluster, seq);
    req.global_batch_tokens = gbt;
    SearchResult r = search_plans(req);
    ASSERT_FALSE(r.ranked.empty()) << cluster;
    EXPECT_FALSE(r.cancelled);
    // brute force: every enumerated plan, checked and predicted on its own
    std::vector<std::string> fitting;
    int64_t valid = 0, total = 0;
    for (Plan p : enumerate_plans(req)) {
      ++total;
      if (!check_plan(p, req.model, req.cluster, req.seq).ok()) continue;
      ++valid;
      if (predict_memory(req.model, req.cluster, req.runtime, p, req.seq).fits()) fitting.push_back(plan_to_string(p) + "|" + order_to_string(p) + "|mbs" + std::to_string(p.mbs));
    }
    EXPECT_EQ(r.enumerated, total) << cluster;
    EXPECT_EQ(r.valid, valid) << cluster;
    EXPECT_EQ(r.fitting, static_cast<int64_t>(fitting.size())) << cluster;
    std::vector<std::string> got;
    for (const Candidate& c : r.ranked) {
      EXPECT_TRUE(c.fits);
      EXPECT_LE(c.peak_bytes, c.capacity_bytes) << plan_to_string(c.plan);
      Plan p = c.plan;
      ASSERT_TRUE(check_plan(p, req.model, req.cluster, req.seq).ok()) << plan_to_string(c.plan);
      EXPECT_TRUE(predict_memory(req.model, req.cluster, req.runtime, p, req.seq).fits()) << plan_to_string(c.plan);
      EXPECT_GT(c.time.tokens_per_second, 0);
      if (gbt > 0) {
        EXPECT_DOUBLE_EQ(c.tokens_per_step(), static_cast<double>(gbt)) << plan_to_string(c.plan);
      }
      got.push_back(plan_to_string(c.plan) + "|" + order_to_string(c.plan) + "|mbs" + std::to_string(c.plan.mbs));
    }
    // pipeline plans the time bound prunes are fitting plans too (Search.PruningPipelinePlansKeeps...)
    for (const Candidate& c : r.unpriced) {
      EXPECT_GT(c.plan.pp, 1);
      EXPECT_LE(c.peak_bytes, c.capacity_bytes) << plan_to_string(c.plan);
      got.push_back(plan_to_string(c.plan) + "|" + order_to_string(c.plan) + "|mbs" + std::to_string(c.plan.mbs));
    }
    std::sort(got.begin(), got.end());
    std::sort(fitting.begin(), fitting.end());
    EXPECT_EQ(got, fitting) << cluster;
    // ranked: the simulated finalists first, best first; then the rest by the closed form
    const size_t nsim = static_cast<size_t>(r.simulated);
    EXPECT_EQ(nsim, std::min(r.ranked.size(), static_cast<size_t>(req.refine)));
    for (size_t i = 0; i < r.ranked.size(); ++i) {
      EXPECT_EQ(r.ranked[i].simulated, i < nsim) << i;
      if (i > 0 && i != nsim) {
        EXPECT_GE(r.ranked[i - 1].time.tokens_per_second, r.ranked[i].time.tokens_per_second) << cluster << " rank " << i;
      }
    }
    // the best closed-form plan of the brute force is among the simulated finalists
    double best_closed = 0;
    for (size_t i = nsim; i < r.ranked.size(); ++i) best_closed = std::max(best_closed, r.ranked[i].time.tokens_per_second);
    for (size_t i = 0; i < nsim; ++i) {
      StepTime cf = estimate_step(step_costs(req.model, req.cluster, req.runtime, r.ranked[i].plan, req.seq, false));
      EXPECT_GE(cf.tokens_per_second * (1 + 1e-9), best_closed) << "finalist " << i << " was not among the closed form's best";
    }
    EXPECT_FALSE(r.ranked[0].why.empty());
  }
}

// Pruning pipeline plans by their time bound (SearchRequest::prune_pipeline) against the same
// search with every plan priced (the exhaustive reference), on spaces where pp = 2..8 plans fit:
// the bound is below every pipeline plan's priced closed form (pipeline_step_lower_bound_s's
// derivation), the first max(refine, top_k + 1) ranked plans are the same plans with the same
// times bit for bit, the Pareto frontier is the same, nothing fitting is lost (ranked + unpriced),
// every unpriced plan is priced below the last kept rank's tokens/s, and the longest trainable
// sequence is the same. A small keep (refine 5, top 3) prunes hardest; the default keep too.
TEST(Search, PruningPipelinePlansKeepsTheRankingTheFrontierAndMaxSeq) {
  struct Case { const char* cluster; int64_t seq, gbt; int refine, top; };
  for (const Case& k : {Case{"8xh100", 131072, 0, 5, 3}, Case{"2x8xh100", 65536, 2097152, 5, 3}, Case{"2x8xh100", 65536, 2097152, 200, 10},
                        Case{"2x8xh100", 262144, 0, 20, 10}}) {
    const std::string name = std::string(k.cluster) + " seq " + std::to_string(k.seq) + " refine " + std::to_string(k.refine);
    // megatron: a stack that runs pipelines (ctxrun-cuda's capabilities have pp=1 only)
    SearchRequest req = request("Llama-3.1-8B", k.cluster, k.seq, "megatron");
    req.global_batch_tokens = k.gbt;
    req.refine = k.refine;
    req.top_k = k.top;
    SearchRequest all = req;
    all.prune_pipeline = false;
    const SearchResult on = search_plans(req), off = search_plans(all);
    EXPECT_TRUE(off.unpriced.empty()) << name;
    EXPECT_GT(on.unpriced.size(), 0u) << name << ": nothing pruned, the comparison proves nothing";
    EXPECT_EQ(on.enumerated, off.enumerated) << name;
    EXPECT_EQ(on.valid, off.valid) << name;
    EXPECT_EQ(on.fitting, off.fitting) << name;
    EXPECT_EQ(on.ranked.size() + on.unpriced.size(), off.ranked.size()) << name;
    EXPECT_EQ(on.simulated, off.simulated) << name;
    auto key = [](const Candidate& c) { return plan_to_string(c.plan) + "|" + order_to_string(c.plan) + "|mbs" + std::to_string(c.plan.mbs); };
    const size_t keep = static_cast<size_t>(std::max(k.refine, k.top + 1));
    ASSERT_GE(off.ranked.size(), keep) << name;
    for (size_t i = 0; i < keep; ++i) {
      ASSERT_EQ(key(on.ranked[i]), key(off.ranked[i])) << name << " rank " << i;
      EXPECT_EQ(on.ranked[i].time.step_seconds, off.ranked[i].time.step_seconds) << name << " rank " << i;
      EXPECT_EQ(on.ranked[i].why, off.ranked[i].why) << name << " rank " << i;
    }
    ASSERT_EQ(on.pareto.size(), off.pareto.size()) << name;
    for (size_t i = 0; i < on.pareto.size(); ++i) {
      EXPECT_EQ(key(on.pareto[i]), key(off.pareto[i])) << name << " frontier " << i;
      EXPECT_EQ(on.pareto[i].time.step_seconds, off.pareto[i].time.step_seconds) << name << " frontier " << i;
    }
    // the bound against the priced closed form of every fitting pipeline plan (the lemma)
    std::map<std::string, const Candidate*> priced;
    for (const Candidate& c : off.ranked) priced[key(c)] = &c;
    int64_t pipelines = 0;
    for (const Candidate& c : off.ranked) {
      if (c.plan.pp == 1 || c.simulated) continue;
      ++pipelines;
      const double lb = pipeline_step_lower_bound_s(req.model, req.cluster, req.runtime, c.plan, req.seq);
      EXPECT_LE(lb, c.time.step_seconds * (1 + 1e-12)) << plan_to_string(c.plan);
    }
    EXPECT_GT(pipelines, 0) << name;
    const double last_kept = off.ranked[keep - 1].time.tokens_per_second;
    for (const Candidate& c : on.unpriced) {
      auto it = priced.find(key(c));
      ASSERT_NE(it, priced.end()) << key(c);
      EXPECT_LE(it->second->time.tokens_per_second, c.tokens_per_second_bound * (1 + 1e-12)) << key(c);
      EXPECT_LT(it->second->time.tokens_per_second, last_kept) << key(c);
    }
    // max-seq: the memory-only bisection (max_trainable_seq_any) must not depend on the pruning
    Plan best_on, best_off;
    EXPECT_EQ(max_trainable_seq_any(req, int64_t(1) << 22, &best_on), max_trainable_seq_any(all, int64_t(1) << 22, &best_off)) << name;
    EXPECT_EQ(plan_to_string(best_on), plan_to_string(best_off)) << name;
  }
}

TEST(Search, ParetoFrontierIsNonDominatedSortedAndComplete) {
  SearchRequest req = request("Llama-3.1-8B", "8xh100", 262144);
  SearchResult r = search_plans(req);
  ASSERT_GE(r.pareto.size(), 2u);
  auto spt = [](const Candidate& c) { return c.seconds_per_token(); };
  for (size_t i = 0; i < r.pareto.size(); ++i) {
    if (i > 0) {  // less memory first, each later plan strictly faster per token
      EXPECT_GE(r.pareto[i].peak_bytes, r.pareto[i - 1].peak_bytes) << i;
      EXPECT_LT(spt(r.pareto[i]), spt(r.pareto[i - 1])) << i;
    }
    for (size_t j = 0; j < r.pareto.size(); ++j) {
      if (i == j) continue;
      const Candidate &a = r.pareto[j], &b = r.pareto[i];
      bool dominates = a.peak_bytes <= b.peak_bytes && spt(a) <= spt(b) && (a.peak_bytes < b.peak_bytes || spt(a) < spt(b));
      EXPECT_FALSE(dominates) << plan_to_string(a.plan) << " dominates " << plan_to_string(b.plan);
    }
  }
  // every fitting plan is matched or beaten on both axes by a frontier plan
  for (const Candidate& c : r.ranked) {
    bool covered = false;
    for (const Candidate& f : r.pareto) covered = covered || (f.peak_bytes <= c.peak_bytes && spt(f) <= spt(c));
    EXPECT_TRUE(covered) << plan_to_string(c.plan);
  }
}

TEST(Search, IsDeterministic) {
  SearchRequest req = request("Llama-3.1-8B", "2x8xh100", 131072);
  req.base = parse_plan("mask=doc:hist:2048@0.8/65536@0.2");
  SearchResult a = search_plans(req), b = search_plans(req);
  ASSERT_EQ(a.ranked.size(), b.ranked.size());
  for (size_t i = 0; i < a.ranked.size(); ++i) {
    ASSERT_EQ(plan_to_string(a.ranked[i].plan), plan_to_string(b.ranked[i].plan)) << i;
    ASSERT_EQ(order_to_string(a.ranked[i].plan), order_to_string(b.ranked[i].plan)) << i;
    ASSERT_EQ(a.ranked[i].time.step_seconds, b.ranked[i].time.step_seconds) << i;
    ASSERT_EQ(a.ranked[i].why, b.ranked[i].why) << i;
  }
  ASSERT_EQ(a.pareto.size(), b.pareto.size());
  for (size_t i = 0; i < a.pareto.size(); ++i) EXPECT_EQ(plan_to_string(a.pareto[i].plan), plan_to_string(b.pareto[i].plan));
  EXPECT_EQ(a.enumerated, b.enumerated);
  EXPECT_EQ(a.fitting, b.fitting);
}

// The search prices many plans on one layout's attention work (computed once, cached); every
// plan's closed form must be what that plan costs priced on its own (step_costs without shared
// work). Packed documents on a runtime without capabilities: the ring plans come in three
// variable-length strategies (native, cycle, split:4) on the same CP layout, whose calls differ
// (cycle runs the ring once per document: hand check, the same plan searched with cp_varlen fixed
// costs 1.5x native's closed form here). The search prices the ranks of equal work (within 1e-9
// relative, search.cpp) once: the times agree within that.
TEST(Search, EachPlansClosedFormIsItsOwnPricing) {
  SearchRequest req = request("Llama-3.1-8B", "8xh100", 262144);
  req.runtime.capabilities = RuntimeCapabilities{};  // a user's profile: every cp_varlen strategy
  req.base = parse_plan("mask=doc:hist:2048@0.8/32768@0.2");
  req.cp_kinds = {CpKind::ring, CpKind::zigzag};
  req.pp_values = {1};
  req.refine = 0;
  const SearchResult r = search_plans(req);
  std::set<std::string> strategies;
  for (const Candidate& c : r.ranked) {
    if (c.plan.cp > 1) strategies.insert(to_string(c.plan.cp_varlen));
    const StepTime own = estimate_step(step_costs(req.model, req.cluster, req.runtime, c.plan, req.seq, false));
    ASSERT_NEAR(c.time.step_seconds, own.step_seconds, 1e-9 * own.step_seconds) << plan_to_string(c.plan);
  }
  EXPECT_EQ(strategies, (std::set<std::string>{"native", "cycle", "split:4"}));
  // the simulated finalists likewise (per ring step work, shared per layout): each the simulation of
  // its own step costs, bit for bit
  req.refine = 40;
  const SearchResult s = search_plans(req);
  ASSERT_EQ(s.simulated, 40);
  for (int64_t i = 0; i < s.simulated; ++i) {
    const Candidate& c = s.ranked[static_cast<size_t>(i)];
    const StepCosts k = step_costs(req.model, req.cluster, req.runtime, c.plan, req.seq, true);
    StepTime own = simulate_step(k, c.plan, SimRecord::none).time;
    add_step_overhead(k, own);
    EXPECT_EQ(c.time.step_seconds, own.step_seconds) << plan_to_string(c.plan);
  }
}

// Beyond the first 20 finalists only plans whose ring attention the sweep does quickly are
// simulated: a space of 256-rank plain rings (256 x 256 ring steps per layer) gets its first 20
// finalists simulated and the rest kept at the closed form, while the same space in zig-zag (one
// simulated rank) gets all its finalists simulated; simulated plans rank first.
TEST(Search, ManyFinalistsAreSimulatedWhenTheSweepIsCheap) {
  for (CpKind kind : {CpKind::ring, CpKind::zigzag}) {
    SearchRequest req = request("Llama-3.1-8B", "32x8xh100", 1048576);
    req.cp_kinds = {kind};
    req.cp_values = {256};
    req.refine = 60;
    SearchResult r = search_plans(req);
    ASSERT_GT(r.fitting, 40) << to_string(kind);
    EXPECT_EQ(r.simulated, kind == CpKind::ring ? 20 : std::min<int64_t>(60, r.fitting)) << to_string(kind);
    for (size_t i = 0; i < r.ranked.size(); ++i) EXPECT_EQ(r.ranked[i].simulated, static_cast<int64_t>(i) < r.simulated) << i;
  }
}

TEST(Search, ProgressCallbackCancels) {
  SearchRequest req = request("Llama-3.1-8B", "4x8xh100", 131072);
  const int64_t total = static_cast<int64_t>(enumerate_plans(req).size());
  ASSERT_GT(total, 3 * 4096) << "the search reports progress every 4096 plans";
  // uncancelled: fractions rise within [0, 1]
  std::vector<double> seen;
  SearchResult full = search_plans(req, [&](double f) { seen.push_back(f); return true; });
  EXPECT_FALSE(full.cancelled);
  ASSERT_FALSE(seen.empty());
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_GE(seen[i], 0.0);
    EXPECT_LE(seen[i], 1.0);
    if (i) {
      EXPECT_GT(seen[i], seen[i - 1]);
    }
  }
  // cancelled at the second report: stops early, says so
  int calls = 0;
  SearchResult r = search_plans(req, [&](double) { return ++calls < 2; });
  EXPECT_TRUE(r.cancelled);
  EXPECT_EQ(calls, 2);
  EXPECT_LT(r.enumerated, total);
  EXPECT_LE(r.ranked.size(), full.ranked.size());
  EXPECT_EQ(r.simulated, 0);
}

TEST(Search, MoreGpusNeverShortenTheMaxTrainableSequence) {
  struct Family { const char* model; const char* runtime; std::vector<CpKind> kinds; bool offload; };
  const Family families[] = {
      {"Llama-3.1-8B", "ctxrun-cuda", {}, true},
      {"Llama-3.1-8B", "hf-deepspeed", {CpKind::ulysses}, true},
      {"Llama-3.1-8B", "megatron", {CpKind::zigzag}, false},
      {"Llama-3.1-70B", "megatron", {CpKind::zigzag, CpKind::ring}, false},
  };
  ClusterSpec base = resolve_cluster(profiles(), "h100-superpod-1024");
  for (const Family& f : families) {
    int64_t prev = 0;
    std::string trail;
    for (int64_t gpus : {1, 8, 16, 32}) {
      SearchRequest req = request(f.model, "8xh100", 4096, f.runtime);
      req.cluster = resized_cluster(base, gpus);
      req.cp_kinds = f.kinds;
      req.allow_offload = f.offload;
      Plan best;
      int64_t s = max_trainable_seq_any(req, int64_t(1) << 26, &best);
      trail.append(" ").append(std::to_string(gpus)).append(":").append(std::to_string(s));
      EXPECT_GE(s, prev) << f.model << " " << f.runtime << " at " << gpus << " GPUs;" << trail;
      if (s > 0) {  // the plan it names fits at that length, and not one granule longer
        Plan p = best;
        ASSERT_TRUE(check_plan(p, req.model, req.cluster, s).ok()) << plan_to_string(best);
        EXPECT_TRUE(predict_memory(req.model, req.cluster, req.runtime, p, s).fits()) << plan_to_string(best) << " at " << s;
        const int64_t more = s + seq_granule(p);
        Plan q = best;
        if (more <= (int64_t(1) << 26) && check_plan(q, req.model, req.cluster, more).ok()) {
          EXPECT_FALSE(predict_memory(req.model, req.cluster, req.runtime, q, more).fits()) << plan_to_string(best) << " at " << more;
        }
      }
      prev = s;
    }
    EXPECT_GT(prev, 0) << f.model << " " << f.runtime << ";" << trail;
    std::printf("max trainable sequence, %s %s (GPUs:tokens):%s\n", f.model, f.runtime, trail.c_str());
  }
}

TEST(Search, ImpossibleRequestExplainsAndAdvisesMoreGpus) {
  SearchRequest req = request("Llama-3.1-70B", "1xh100", 1048576);
  req.allow_offload = false;
  SearchResult r = search_plans(req);
  EXPECT_TRUE(r.ranked.empty());
  EXPECT_TRUE(r.pareto.empty());
  EXPECT_GT(r.valid, 0);
  EXPECT_EQ(r.fitting, 0);
  EXPECT_FALSE(r.no_fit_reason.empty());
  EXPECT_TRUE(contains(r.no_fit_reason, "memory")) << r.no_fit_reason;
  std::string advice = no_fit_advice(req);
  EXPECT_TRUE(contains(advice, "More GPUs")) << advice;
  // offload would not make 70B at 1M fit on one GPU either, so the advice must not offer it
  SearchRequest off = req;
  off.allow_offload = true;
  EXPECT_LT(max_trainable_seq_any(off, req.seq, nullptr), req.seq);
  EXPECT_FALSE(contains(advice, "offload fits")) << advice;
}

TEST(Search, NoFitAdviceNamesOffloadAndAShorterSequenceWhenTheyFit) {
  // 8B at 2M on 8 GPUs without offload: too long, but offload or a shorter sequence would fit
  SearchRequest req = request("Llama-3.1-8B", "8xh100", 2097152);
  req.allow_offload = false;
  SearchResult r = search_plans(req);
  ASSERT_TRUE(r.ranked.empty());
  EXPECT_GT(r.closest.peak_bytes, r.closest.capacity_bytes);
  EXPECT_TRUE(contains(r.no_fit_reason, plan_to_string(r.closest.plan))) << r.no_fit_reason;
  std::string advice = no_fit_advice(req);
  SearchRequest off = req;
  off.allow_offload = true;
  ASSERT_GE(max_trainable_seq_any(off, req.seq, nullptr), req.seq);
  EXPECT_TRUE(contains(advice, "offload fits")) << advice;
  int64_t shorter = max_trainable_seq_any(req, req.seq, nullptr);
  ASSERT_GT(shorter, 0);
  EXPECT_TRUE(contains(advice, std::to_string(shorter))) << advice;
  EXPECT_TRUE(contains(advice, "More GPUs")) << advice;
}

// ---- the binary -------------------------------------------------------------------------------------

using ctx::testing::RunResult;
using ctx::testing::slurp;

RunResult run_ctxplan(const std::vector<std::string>& args) { return ctx::testing::run_process(CTXPLAN_BIN, args); }

json parse_out(const RunResult& r) { return parse_json_text(r.out, "ctxplan stdout"); }

TEST(SearchCli, PlanJsonListsRankedPlansAndFrontier) {
  RunResult r = run_ctxplan({"plan", "--model", "Llama-3.1-8B", "--cluster", "8xh100", "--seq", "128k", "--json", "--top", "5"});
  ASSERT_EQ(r.exit_code, kExitOk) << r.both();
  json j = parse_out(r);
  EXPECT_EQ(j.at("schema"), "ctxplan.search/1");
  EXPECT_EQ(j.at("seq"), 131072);
  ASSERT_EQ(j.at("top").size(), 5u);
  EXPECT_GE(j.at("enumerated").get<int64_t>(), j.at("valid").get<int64_t>());
  EXPECT_GE(j.at("valid").get<int64_t>(), j.at("fitting").get<int64_t>());
  double prev = 1e300;
  for (const json& c : j.at("top")) {
    EXPECT_LE(c.at("peak_bytes").get<double>(), c.at("capacity_bytes").get<double>());
    double tps = c.at("time").at("tokens_per_second");
    EXPECT_LE(tps, prev);
    prev = tps;
    // the plan it prints parses back to the same plan
    EXPECT_EQ(plan_to_string(parse_plan(c.at("plan_string").get<std::string>())), c.at("plan_string").get<std::string>());
    EXPECT_TRUE(c.at("simulated").get<bool>());
    EXPECT_FALSE(c.at("why").get<std::string>().empty());
  }
  EXPECT_FALSE(j.at("pareto").empty());
}

TEST(SearchCli, SimulateWritesAChromeTrace) {
  std::string path = "/tmp/ctxplan_search_trace_" + std::to_string(getpid()) + ".json";
  RunResult r = run_ctxplan({"simulate", "--seq", "64k", "--plan", "cp=8,cp_kind=ring,zero=3,recompute=full", "--trace", path});
  ASSERT_EQ(r.exit_code, kExitOk) << r.both();
  EXPECT_TRUE(contains(r.out, "imbalance bubble"));
  json t = parse_json_text(slurp(path), path);
  unlink(path.c_str());
  ASSERT_TRUE(t.at("traceEvents").is_array());
  std::set<int64_t> pids;
  for (const json& e : t.at("traceEvents"))
    if (e.at("ph") == "X") pids.insert(e.at("pid").get<int64_t>());
  EXPECT_EQ(pids.size(), 8u) << "plain ring: every CP rank is its own track";
}

// Without --trace nothing is kept per task, so a step of 614M tasks (a million identical
// micro-batches) simulates in well under a second; its trace is refused naming --trace and the
// limit, and no file is written.
TEST(SearchCli, HugeStepSimulatesButItsTraceIsRefused) {
  const std::vector<std::string> job = {"simulate", "--model", "Llama-3.1-8B", "--cluster", "8x8xh100", "--seq", "8k", "--plan", "dp=8,tp=8,zero=1,ga=1048576"};
  RunResult r = run_ctxplan(job);
  ASSERT_EQ(r.exit_code, kExitOk) << r.both();
  // almost every micro-batch is taken on the line (the first and last are not alike, and the jumps'
  // checks sweep a few); how many the jumps sweep is the search strategy's, not asserted exactly
  const size_t at = r.out.find(" micro-batches)");
  ASSERT_NE(at, std::string::npos) << r.out;
  const size_t from = r.out.rfind(' ', at - 1) + 1;
  const int64_t extrapolated = std::stoll(r.out.substr(from, at - from));
  EXPECT_GE(extrapolated, 1048576 - 64) << r.out;
  EXPECT_LE(extrapolated, 1048576 - 2) << r.out;
  std::string path = "/tmp/ctxplan_huge_trace_" + std::to_string(getpid()) + ".json";
  std::vector<std::string> traced = job;
  traced.push_back("--trace");
  traced.push_back(path);
  r = run_ctxplan(traced);
  EXPECT_EQ(r.exit_code, kExitBadInput) << r.both();
  EXPECT_TRUE(contains(r.err, "--trace")) << r.err;
  EXPECT_TRUE(contains(r.err, "at most 10000000")) << r.err;
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "no trace file is written";
}

TEST(SearchCli, MaxseqPerGpuCount) {
  RunResult r = run_ctxplan({"maxseq", "--model", "Llama-3.1-8B", "--cluster", "4x8xh100", "--gpus", "1,8", "--json"});
  ASSERT_EQ(r.exit_code, kExitOk) << r.both();
  json j = parse_out(r);
  EXPECT_EQ(j.at("schema"), "ctxplan.maxseq/1");
  ASSERT_EQ(j.at("rows").size(), 2u);
  EXPECT_EQ(j.at("rows")[0].at("gpus"), 1);
  EXPECT_EQ(j.at("rows")[1].at("gpus"), 8);
  int64_t one = j.at("rows")[0].at("max_seq"), eight = j.at("rows")[1].at("max_seq");
  EXPECT_GT(one, 0);
  EXPECT_GT(eight, one);
  EXPECT_FALSE(j.at("rows")[1].at("plan").get<std::string>().empty());
}

TEST(SearchCli, SweepWritesOneRowPerCell) {
  RunResult r = run_ctxplan({"sweep", "--model", "Llama-3.1-8B", "--cluster", "2x8xh100", "--seqs", "32k,64k", "--gpus", "8,16"});
  ASSERT_EQ(r.exit_code, kExitOk) << r.both();
  std::stringstream ss(r.out);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(ss, line))
    if (!line.empty()) lines.push_back(line);
  ASSERT_EQ(lines.size(), 5u) << r.out;
  EXPECT_EQ(lines[0].rfind("seq,gpus,fits,plan,", 0), 0u);
  EXPECT_EQ(lines[1].rfind("32768,8,1,", 0), 0u) << lines[1];
  EXPECT_EQ(lines[4].rfind("65536,16,1,", 0), 0u) << lines[4];
}

TEST(SearchCli, BudgetSumsStages) {
  RunResult r = run_ctxplan({"budget", "--model", "Llama-3.1-8B", "--cluster", "8xh100", "--stages", "4k:1e9,32k:1e8", "--json"});
  ASSERT_EQ(r.exit_code, kExitOk) << r.both();
  json j = parse_out(r);
  EXPECT_EQ(j.at("schema"), "ctxplan.budget/1");
  ASSERT_EQ(j.at("stages").size(), 2u);
  double wall = 0, gpu = 0;
  for (const json& s : j.at("stages")) {
    ASSERT_TRUE(s.at("fits").get<bool>());
    double tps = s.at("best").at("time").at("tokens_per_second");
    // hours = tokens / (tokens/s) / 3600, GPU-hours = hours x 8 GPUs
    EXPECT_NEAR(s.at("wall_hours").get<double>(), s.at("tokens").get<double>() / tps / 3600.0, 1e-9 * s.at("wall_hours").get<double>());
    EXPECT_NEAR(s.at("gpu_hours").get<double>(), 8 * s.at("wall_hours").get<double>(), 1e-9 * s.at("gpu_hours").get<double>());
    wall += s.at("wall_hours").get<double>();
    gpu += s.at("gpu_hours").get<double>();
  }
  EXPECT_NEAR(j.at("wall_hours").get<double>(), wall, 1e-9 * wall);
  EXPECT_NEAR(j.at("gpu_hours").get<double>(), gpu, 1e-9 * gpu);
}

TEST(SearchCli, BadInputExitsTwoNamingTheField) {
  struct Case { std::vector<std::string> args; const char* field; };
  const Case cases[] = {
      {{"simulate", "--plan", "cp=8,cp_kind=spiral"}, "cp_kind"},
      {{"plan", "--cp-kinds", "zigzag,spiral"}, "cp_kind"},
      {{"plan", "--seq", "32k", "--global-batch-tokens", "100000"}, "--global-batch-tokens"},
      {{"plan", "--objective", "fastest"}, "--objective"},
      {{"maxseq", "--gpus", "1,eight"}, "--gpus"},
      {{"budget", "--stages", "32k"}, "--stages"},
      {{"sweep", "--seqs", "32k,lots"}, "--seqs"},
  };
  for (const Case& c : cases) {
    RunResult r = run_ctxplan(c.args);
    std::string cmd;
    for (auto& a : c.args) cmd += a + " ";
    EXPECT_EQ(r.exit_code, kExitBadInput) << cmd << "\n" << r.both();
    EXPECT_TRUE(contains(r.err, c.field)) << cmd << ": stderr does not name " << c.field << ":\n" << r.err;
  }
}

TEST(SearchCli, NoFitExitsThreeWithAdvice) {
  RunResult r = run_ctxplan({"plan", "--model", "Llama-3.1-70B", "--cluster", "1xh100", "--seq", "1m", "--no-offload"});
  EXPECT_EQ(r.exit_code, kExitDoesNotFit) << r.both();
  EXPECT_TRUE(contains(r.out, "NO PLAN FITS")) << r.out;
  EXPECT_TRUE(contains(r.out, "More GPUs")) << r.out;
  RunResult j = run_ctxplan({"plan", "--model", "Llama-3.1-70B", "--cluster", "1xh100", "--seq", "1m", "--no-offload", "--json"});
  EXPECT_EQ(j.exit_code, kExitDoesNotFit) << j.both();
  json doc = parse_out(j);
  EXPECT_TRUE(doc.at("top").empty());
  EXPECT_TRUE(contains(doc.at("no_fit").get<std::string>(), "More GPUs"));
}

}  // namespace
}  // namespace ctx
