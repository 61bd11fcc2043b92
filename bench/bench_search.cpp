// The plan search and its two evaluators. Targets (issue 3): the full search for Llama-3.1-70B on
// 1024 H100s at 1M tokens under 1 s on 2 cores (with the number of plans evaluated), at least
// 100,000 plans per second per core for the closed-form estimate, and under 100 ms of simulator
// wall time for one 1024-GPU step. Run: build/bench/bench_search (single-threaded throughout).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/simulator.hpp"
#include "costmodel/step_model.hpp"
#include "planner/search.hpp"

namespace {

const ctx::Profiles& profiles() {
  static ctx::Profiles p = ctx::load_profiles(ctx::default_profiles_dir());
  return p;
}

constexpr int64_t kSeq = 1048576;

ctx::SearchRequest request70b() {
  ctx::SearchRequest r;
  r.model = ctx::resolve_model(profiles(), "Llama-3.1-70B");
  r.cluster = ctx::resolve_cluster(profiles(), "h100-superpod-1024");
  r.runtime = ctx::resolve_runtime(profiles(), "ctxrun-cuda");
  r.seq = kSeq;
  return r;
}

// Full search: enumerate, check, memory-prune, closed-form rank, simulate 200 finalists (SearchRequest::refine), Pareto.
void BM_Search70B_1024xH100_1M(benchmark::State& state) {
  const ctx::SearchRequest req = request70b();
  ctx::SearchResult r;
  for (auto _ : state) {
    r = ctx::search_plans(req);
    benchmark::DoNotOptimize(r.ranked.data());
  }
  state.counters["plans"] = static_cast<double>(r.enumerated);
  state.counters["valid"] = static_cast<double>(r.valid);
  state.counters["fitting"] = static_cast<double>(r.fitting);
  state.counters["simulated"] = static_cast<double>(r.simulated);
  state.SetLabel(r.ranked.empty() ? "no plan fits" : "best " + ctx::plan_to_string(r.ranked[0].plan));
}
BENCHMARK(BM_Search70B_1024xH100_1M)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// One closed-form evaluation per valid plan of that search space: plan_valid (check_plan's rules
// without building their text, as the search asks them) + predict_memory + step_costs(per_step =
// false) + estimate_step. range(0) = 1: the attention work is computed once
// per (cp, kind, ulysses, dp) layout and CP ranks with equal work priced once, as the search does;
// 0: recomputed for every plan and every CP rank priced.
void BM_ClosedFormPlansPerSecond(benchmark::State& state) {
  const ctx::SearchRequest req = request70b();
  const bool cached = state.range(0) == 1;
  std::vector<ctx::Plan> plans;
  for (ctx::Plan p : ctx::enumerate_plans(req))
    if (ctx::check_plan(p, req.model, req.cluster, req.seq).ok()) plans.push_back(p);
  std::map<std::tuple<int64_t, int, int, int64_t, int64_t>, ctx::AttentionWork> works;
  if (cached)
    for (const ctx::Plan& p : plans) {
      auto key = std::make_tuple(p.cp, static_cast<int>(p.cp_comm), static_cast<int>(p.cp_layout), ctx::ulysses_degree(p), p.dp);
      if (works.count(key)) continue;
      ctx::AttentionWork w = ctx::attention_work(p, req.seq, false);
      bool equal = true;  // every CP rank alike: price one (what the search does)
      for (auto& v : w.pairs) equal = equal && std::abs(v[0] - w.pairs[0][0]) <= 1e-9 * std::max(1.0, w.pairs[0][0]);
      if (equal) w.pairs.resize(1);
      works.emplace(key, std::move(w));
    }
  size_t i = 0;
  int64_t fits = 0;
  for (auto _ : state) {
    ctx::Plan p = plans[i];
    if (++i == plans.size()) i = 0;
    const bool valid = ctx::plan_valid(p, req.model, req.cluster, req.seq);
    ctx::MemoryPrediction mem = ctx::predict_memory(req.model, req.cluster, req.runtime, p, req.seq);
    const ctx::AttentionWork* pre = nullptr;
    if (cached) pre = &works.find(std::make_tuple(p.cp, static_cast<int>(p.cp_comm), static_cast<int>(p.cp_layout), ctx::ulysses_degree(p), p.dp))->second;
    ctx::StepTime t = ctx::estimate_step(ctx::step_costs(req.model, req.cluster, req.runtime, p, req.seq, false, pre));
    fits += mem.fits();
    benchmark::DoNotOptimize(valid);
    benchmark::DoNotOptimize(t);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["distinct_plans"] = static_cast<double>(plans.size());
  state.SetLabel(cached ? "attention work cached per layout (as the search)" : "attention work per plan");
  benchmark::DoNotOptimize(fits);
}
BENCHMARK(BM_ClosedFormPlansPerSecond)->Arg(1)->Arg(0);

// The event simulator on one 1024-GPU step (costs built outside the timed loop).
// 0: zig-zag (CP ranks symmetric: one simulated rank), 1: plain ring (all 128 CP ranks simulated),
// 2: the search's best plan for this job (Ulysses x ring, dp=8).
const char* kSimPlans[] = {
    "tp=8,cp=128,cp_kind=zigzag,zero=3,recompute=full",
    "tp=8,cp=128,cp_kind=ring,zero=3,recompute=full",
    "dp=8,tp=2,cp=64,cp_kind=usp,ulysses=2,zero=3,tiled_mlp=auto",
};
void BM_Simulate1024GpuStep(benchmark::State& state) {
  const ctx::SearchRequest req = request70b();
  ctx::Plan p = ctx::parse_plan(kSimPlans[state.range(0)]);
  if (!ctx::check_plan(p, req.model, req.cluster, req.seq).ok()) {
    state.SkipWithError("invalid plan");
    return;
  }
  const ctx::StepCosts k = ctx::step_costs(req.model, req.cluster, req.runtime, p, req.seq, true);
  ctx::SimResult r;
  for (auto _ : state) {
    r = ctx::simulate_step(k, p);
    benchmark::DoNotOptimize(r.time.step_seconds);
  }
  state.counters["tasks"] = static_cast<double>(r.stats.tasks);
  state.counters["simulated_ranks"] = static_cast<double>(r.reps.size());
  state.SetLabel(kSimPlans[state.range(0)]);
}
BENCHMARK(BM_Simulate1024GpuStep)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
