// Nanoseconds per memory prediction (target: under 5 microseconds), for a small and a large
// model and for several plan shapes. Run: build/bench/bench_memory_model
#include <benchmark/benchmark.h>

#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/memory_model.hpp"

namespace {

struct Case {
  const char* model;
  const char* cluster;
  const char* plan;
  int64_t seq;
};

const Case kCases[] = {
    {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=zigzag,zero=3,recompute=full,tiled_loss=2048", 131072},
    {"Llama-3.1-70B", "128x8xh100", "tp=8,cp=16,cp_kind=usp,ulysses=2,zero=1,recompute=selective", 1048576},
    {"Llama-3.1-405B", "64x8xh200", "tp=8,cp=8,cp_kind=ring,zero=3,recompute=full,ckpt_offload=1,opt_offload=1", 524288},
};

void BM_PredictMemory(benchmark::State& state) {
  static ctx::Profiles profiles = ctx::load_profiles(ctx::default_profiles_dir());
  const Case& c = kCases[state.range(0)];
  ctx::ModelSpec m = ctx::resolve_model(profiles, c.model);
  ctx::ClusterSpec cl = ctx::resolve_cluster(profiles, c.cluster);
  const ctx::RuntimeProfile& rt = ctx::resolve_runtime(profiles, "megatron");
  ctx::Plan p = ctx::parse_plan(c.plan);
  if (!ctx::check_plan(p, m, cl, c.seq).ok()) {
    state.SkipWithError("invalid plan");
    return;
  }
  for (auto _ : state) {
    ctx::MemoryPrediction mp = ctx::predict_memory(m, cl, rt, p, c.seq);
    benchmark::DoNotOptimize(mp);
  }
  state.SetLabel(std::string(c.model) + " " + c.plan);
}
BENCHMARK(BM_PredictMemory)->DenseRange(0, 2);

// check_plan + predict_memory: what a plan search pays per candidate.
void BM_CheckAndPredict(benchmark::State& state) {
  static ctx::Profiles profiles = ctx::load_profiles(ctx::default_profiles_dir());
  ctx::ModelSpec m = ctx::resolve_model(profiles, "Llama-3.1-70B");
  ctx::ClusterSpec cl = ctx::resolve_cluster(profiles, "128x8xh100");
  const ctx::RuntimeProfile& rt = ctx::resolve_runtime(profiles, "megatron");
  const ctx::Plan base = ctx::parse_plan("tp=8,cp=16,cp_kind=zigzag,zero=1,recompute=full");
  for (auto _ : state) {
    ctx::Plan p = base;
    ctx::PlanCheck chk = ctx::check_plan(p, m, cl, 1048576);
    ctx::MemoryPrediction mp = ctx::predict_memory(m, cl, rt, p, 1048576);
    benchmark::DoNotOptimize(chk);
    benchmark::DoNotOptimize(mp);
  }
}
BENCHMARK(BM_CheckAndPredict);

}  // namespace

BENCHMARK_MAIN();
