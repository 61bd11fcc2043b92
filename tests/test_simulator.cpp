// The discrete-event step simulator: event-queue invariants on many plans (time never goes
// backward, every task runs once, after its dependencies, in program order on its stream;
// collective members start together), the causal imbalance of plain ring vs zig-zag, the
// breakdown adding up to the step, the Chrome trace, gradient accumulation and sorted packing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "costmodel/attention_work.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/simulator.hpp"
#include "costmodel/step_model.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(default_profiles_dir());
  return p;
}

struct Case {
  const char* model;
  const char* cluster;
  const char* plan;
  int64_t seq;
};

struct Simulated {
  Plan p;
  StepCosts k;
  SimResult r;
};

Simulated simulate(const Case& c, const std::string& runtime = "ctxrun-cuda") {
  ModelSpec m = resolve_model(profiles(), c.model);
  ClusterSpec cl = resolve_cluster(profiles(), c.cluster);
  const RuntimeProfile& rt = resolve_runtime(profiles(), runtime);
  Simulated out;
  out.p = parse_plan(c.plan);
  PlanCheck chk = check_plan(out.p, m, cl, c.seq);
  EXPECT_TRUE(chk.ok()) << c.plan << ": " << chk.message();
  out.k = step_costs(m, cl, rt, out.p, c.seq, true);
  out.r = simulate_step(out.k, out.p);
  return out;
}

std::string name(const Case& c) { return std::string(c.model) + " " + c.cluster + " " + c.plan; }

// Every knob the simulator schedules differently: CP kinds (all ranks simulated for plain ring),
// ZeRO 0-3, TP with and without SP, offloads (host stream), gradient accumulation, packed documents
// (heaviest and lightest pack), ranks across nodes.
const Case kPlans[] = {
    {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=zigzag,zero=3,recompute=full,tiled_loss=2048", 131072},
    {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=ring,zero=3,recompute=full", 131072},
    {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=ring,zero=0,recompute=selective,ga=2", 65536},
    {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=ulysses,zero=3,recompute=full", 131072},
    {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=allgather,zero=1", 65536},
    {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=usp,ulysses=2,zero=2,recompute=selective", 131072},
    {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=usp,ulysses=4,zero=3,recompute=full,ga=2", 131072},
    {"Llama-3.1-8B", "8xh100", "dp=8,zero=0", 8192},
    {"Llama-3.1-8B", "8xh100", "dp=8,zero=1,ga=4", 8192},
    {"Llama-3.1-8B", "8xh100", "dp=4,cp=2,cp_kind=ring,zero=2,ga=2,mbs=2", 16384},
    {"Llama-3.1-8B", "8xh100", "dp=2,tp=4,zero=3,recompute=full", 32768},
    {"Llama-3.1-8B", "8xh100", "dp=2,tp=4,sp=0,zero=1", 32768},
    {"Llama-3.1-8B", "8xh100", "tp=2,cp=4,cp_kind=zigzag,zero=3,recompute=full,ckpt_offload=1,opt_offload=1", 262144},
    {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=ulysses,zero=3,recompute=full,opt_offload=1,param_offload=1,ckpt_offload=1", 524288},
    {"Llama-3.1-8B", "8xh100", "dp=8,zero=3,recompute=full,mask=doc:hist:2048@0.8/32768@0.2", 32768},
    {"Llama-3.1-8B", "8xh100", "dp=2,cp=4,cp_kind=ring,zero=3,mask=doc:hist:1024@0.5/16384@0.5,ga=2", 65536},
    {"Llama-3.1-8B", "4x8xh100", "dp=4,cp=8,cp_kind=zigzag,zero=3,recompute=full", 131072},
    {"Llama-3.1-8B", "4x8xh100", "dp=2,tp=2,cp=8,cp_kind=ring,zero=1,ga=2", 65536},
    {"Llama-3.1-70B", "8x8xh100", "tp=8,cp=8,cp_kind=ring,zero=3,recompute=full", 262144},
    {"Llama-3.1-70B", "8x8xh100", "dp=8,tp=8,zero=3,ga=2,param_offload=1", 4096},
};

TEST(Simulator, EventQueueInvariantsHoldOnManyPlans) {
  for (const Case& c : kPlans) {
    Simulated run = simulate(c);
    const SimResult& r = run.r;
    const std::string what = name(c);
    EXPECT_EQ(r.stats.time_regressions, 0) << what;
    EXPECT_EQ(r.stats.started_twice, 0) << what;
    EXPECT_EQ(r.stats.never_ran, 0) << what;
    EXPECT_EQ(r.stats.tasks, static_cast<int64_t>(r.tasks.size())) << what;
    EXPECT_EQ(r.stats.events, r.stats.tasks) << what << ": every task finishes exactly once";
    ASSERT_EQ(r.deps.size(), r.tasks.size()) << what;
    double last_end = 0;
    for (size_t i = 0; i < r.tasks.size(); ++i) {
      const SimTask& t = r.tasks[i];
      ASSERT_GE(t.start, 0) << what << " task " << i << " " << t.name;
      EXPECT_DOUBLE_EQ(t.end, t.start + t.duration) << what << " task " << i;
      for (int32_t d : r.deps[i]) {
        ASSERT_LT(d, static_cast<int32_t>(i)) << what << ": a dependency is created before its dependant";
        EXPECT_GE(t.start, r.tasks[static_cast<size_t>(d)].end) << what << " task " << i << " " << t.name << " dep " << d << " "
                                                                 << r.tasks[static_cast<size_t>(d)].name;
      }
      last_end = std::max(last_end, t.end);
    }
    EXPECT_DOUBLE_EQ(r.time.step_seconds, last_end) << what;
    // one stream of one simulated rank runs its tasks one at a time, in creation (program) order
    std::map<std::pair<int, int>, double> stream_free;
    for (const SimTask& t : r.tasks) {
      auto key = std::make_pair(t.rep, static_cast<int>(t.stream));
      auto it = stream_free.find(key);
      if (it != stream_free.end()) {
        EXPECT_GE(t.start, it->second) << what << ": " << t.name << " overlaps on its stream";
      }
      stream_free[key] = t.end;
    }
    // members of one collective start at the same instant, one per simulated rank
    std::map<int32_t, std::vector<const SimTask*>> colls;
    for (const SimTask& t : r.tasks)
      if (t.collective >= 0) colls[t.collective].push_back(&t);
    for (auto& [id, members] : colls) {
      std::set<int> reps;
      for (const SimTask* t : members) {
        EXPECT_EQ(t->start, members[0]->start) << what << ": collective " << id << " " << t->name;
        EXPECT_STREQ(t->name, members[0]->name) << what;
        reps.insert(t->rep);
      }
      EXPECT_EQ(reps.size(), members.size()) << what << ": collective " << id << " has two members on one rank";
    }
    // plain ring simulates every CP rank; ranks with identical work collapse to one
    if (run.k.cp_kind == CpKind::ring && run.k.cp > 1 && run.p.mask == MaskKind::causal) {
      EXPECT_EQ(static_cast<int64_t>(r.reps.size()), run.k.cp * static_cast<int64_t>(run.k.attn_fwd.size())) << what;
    }
    if (run.k.attn_fwd.size() == 1) {
      int64_t covered = 0;
      for (auto& rep : r.reps) covered += rep.stands_for;
      EXPECT_EQ(covered, run.k.world) << what << ": the simulated ranks stand for every rank";
    }
  }
}

TEST(Simulator, BreakdownAddsUpToTheStep) {
  for (const Case& c : kPlans) {
    Simulated run = simulate(c);
    for (const StepTime& t : {run.r.time, estimate_step(run.k)}) {
      const StepBreakdown& b = t.breakdown;
      for (double part : {b.compute, b.exposed_comm, b.offload_stall, b.imbalance, b.optimizer})
        EXPECT_GE(part, -1e-12 * t.step_seconds) << name(c) << " " << t.method;
      double sum = b.compute + b.exposed_comm + b.offload_stall + b.imbalance + b.optimizer;
      EXPECT_NEAR(sum, t.step_seconds, 1e-6 * t.step_seconds) << name(c) << " " << t.method;
      double phases = t.phase_seconds[0] + t.phase_seconds[1] + t.phase_seconds[2];
      EXPECT_NEAR(phases, t.step_seconds, 1e-6 * t.step_seconds) << name(c) << " " << t.method << " phases";
      EXPECT_GT(t.tokens_per_second, 0) << name(c);
      EXPECT_GT(t.mfu, 0) << name(c);
      EXPECT_LT(t.mfu, 1) << name(c);
    }
  }
}

TEST(Simulator, PlainRingHasAnImbalanceBubbleZigZagDoesNot) {
  for (const char* cluster : {"8xh100", "4x8xh100"}) {
    const int64_t seq = 131072;
    Case ring{"Llama-3.1-8B", cluster, "cp=8,cp_kind=ring,zero=3,recompute=full", seq};
    Case zz{"Llama-3.1-8B", cluster, "cp=8,cp_kind=zigzag,zero=3,recompute=full", seq};
    Simulated r = simulate(ring), z = simulate(zz);
    // rank 0 of a plain ring does 1/(2cp-1) of the last rank's causal work and waits for it
    EXPECT_GT(r.r.time.breakdown.imbalance, 0.10 * r.r.time.step_seconds) << cluster;
    EXPECT_LT(z.r.time.breakdown.imbalance, 1e-6 * z.r.time.step_seconds) << cluster;
    EXPECT_GT(r.r.time.step_seconds, z.r.time.step_seconds) << cluster;
    EXPECT_EQ(z.r.reps.size(), 1u) << cluster << ": zig-zag ranks are symmetric and collapse";
    // the closed form sees the same bubble
    EXPECT_GT(estimate_step(r.k).breakdown.imbalance, 0.10 * r.r.time.step_seconds) << cluster;
    EXPECT_LT(estimate_step(z.k).breakdown.imbalance, 1e-6 * z.r.time.step_seconds) << cluster;
  }
}

TEST(Simulator, ChromeTraceHasOneProcessPerSimulatedRank) {
  for (const Case& c : {kPlans[1], kPlans[12], kPlans[14]}) {
    Simulated run = simulate(c);
    json trace = parse_json_text(chrome_trace(run.r, name(c)).dump(), "trace");  // round-trips as JSON text
    ASSERT_TRUE(trace.contains("traceEvents")) << name(c);
    const json& ev = trace.at("traceEvents");
    ASSERT_TRUE(ev.is_array());
    std::set<int64_t> rep_pids, x_pids, named_pids;
    for (auto& rep : run.r.reps) rep_pids.insert(rep.rank);
    EXPECT_EQ(rep_pids.size(), run.r.reps.size()) << name(c) << ": each simulated rank has its own pid";
    size_t x = 0;
    for (const json& e : ev) {
      std::string ph = e.at("ph");
      ASSERT_TRUE(ph == "X" || ph == "M") << ph;
      int64_t pid = e.at("pid");
      if (ph == "X") {
        ++x;
        x_pids.insert(pid);
        EXPECT_GE(e.at("ts").get<double>(), 0);
        EXPECT_GT(e.at("dur").get<double>(), 0);
        int tid = e.at("tid");
        EXPECT_GE(tid, 0);
        EXPECT_LT(tid, kSimStreams);
        EXPECT_LE(e.at("ts").get<double>() + e.at("dur").get<double>(), run.r.time.step_seconds * 1e6 * (1 + 1e-9));
      } else if (e.at("name") == "process_name") {
        named_pids.insert(pid);
      }
    }
    size_t positive = 0;
    for (auto& t : run.r.tasks) positive += t.duration > 0;
    EXPECT_EQ(x, positive) << name(c) << ": one X event per task with a duration";
    EXPECT_EQ(x_pids, rep_pids) << name(c);
    EXPECT_EQ(named_pids, rep_pids) << name(c);
  }
}

TEST(Simulator, GradientAccumulationCostsLessThanTwoSteps) {
  for (const char* base : {"dp=8,zero=1", "dp=8,zero=3,recompute=full", "cp=8,cp_kind=zigzag,zero=2", "dp=4,tp=2,zero=0"}) {
    Simulated one = simulate({"Llama-3.1-8B", "8xh100", base, 16384});
    Simulated two = simulate({"Llama-3.1-8B", "8xh100", (std::string(base) + ",ga=2").c_str(), 16384});
    double t1 = one.r.time.step_seconds, t2 = two.r.time.step_seconds;
    double opt = one.r.time.phase_seconds[static_cast<int>(TimePhase::optimizer)];
    EXPECT_GT(opt, 0) << base;
    EXPECT_GT(t2, t1) << base;
    // two micro-batches, one optimizer step (and, below ZeRO-2, one gradient reduction)
    EXPECT_LE(t2, 2 * (t1 - opt) + opt + 1e-9 * t1) << base << ": ga=1 " << t1 << " s (optimizer " << opt << " s), ga=2 " << t2 << " s";
    EXPECT_DOUBLE_EQ(two.k.tokens_per_step, 2 * one.k.tokens_per_step) << base;
  }
}

TEST(Simulator, SortedPackingBalancesDocumentWorkAcrossDataParallelRanks) {
  for (const char* mask : {"mask=doc:hist:2048@0.8/32768@0.2", "mask=doc:hist:512@0.5/8192@0.3/65536@0.2", "mask=doc:1024/4096/30000"}) {
    const int64_t seq = 65536;
    std::string greedy = std::string("dp=8,zero=3,recompute=full,") + mask;
    std::string sorted = greedy + ",packing=sorted";
    Simulated g = simulate({"Llama-3.1-8B", "8xh100", greedy.c_str(), seq});
    Simulated s = simulate({"Llama-3.1-8B", "8xh100", sorted.c_str(), seq});
    // the packs' attention work: spread (max - min over the mean) never wider when sorted
    auto spread = [&](const Plan& p) {
      auto w = pack_attention_work(p, seq, 8);
      double mean = 0;
      for (double x : w) mean += x / 8.0;
      return (*std::max_element(w.begin(), w.end()) - *std::min_element(w.begin(), w.end())) / mean;
    };
    EXPECT_LE(spread(s.p), spread(g.p)) << mask;
    EXPECT_GT(spread(g.p), 0.01) << mask << ": greedy packing leaves packs unequal";
    EXPECT_LE(s.r.time.breakdown.imbalance, g.r.time.breakdown.imbalance + 1e-9 * g.r.time.step_seconds) << mask;
    EXPECT_GT(g.r.time.breakdown.imbalance, 0) << mask;
    EXPECT_LE(s.r.time.step_seconds, g.r.time.step_seconds * (1 + 1e-9)) << mask;
    EXPECT_EQ(g.r.reps.size(), 2u) << mask << ": the heaviest and the lightest pack are simulated";
  }
}

TEST(Simulator, PlainRingAtScaleSimulatesEveryCpRank) {
  // 256 GPUs, a plain ring of 32: every CP rank is simulated (~490K tasks) and the invariants hold.
  // (The 1024-GPU ring step, 8M tasks and ~1 GiB, is measured in bench/bench_search.cpp instead.)
  Case c{"Llama-3.1-70B", "32x8xh100", "tp=8,cp=32,cp_kind=ring,zero=3,recompute=full", 1048576};
  Simulated run = simulate(c);
  EXPECT_EQ(run.r.reps.size(), 32u);
  EXPECT_EQ(run.r.stats.never_ran, 0);
  EXPECT_EQ(run.r.stats.started_twice, 0);
  EXPECT_EQ(run.r.stats.time_regressions, 0);
  EXPECT_GT(run.r.time.breakdown.imbalance, 0.10 * run.r.time.step_seconds);
  // the busiest rank is the last in the ring (causal work grows with the position)
  std::vector<double> busy(run.r.reps.size(), 0.0);
  for (const SimTask& t : run.r.tasks)
    if (t.stream == SimStream::compute) busy[static_cast<size_t>(t.rep)] += t.duration;
  for (size_t i = 1; i < busy.size(); ++i) EXPECT_GT(busy[i], busy[i - 1]) << "cp rank " << i;
  EXPECT_LT(busy.back(), run.r.time.step_seconds);
  EXPECT_LT(run.r.stats.wall_seconds, 5.0);
}

// The same results, bit for bit, with and without a layer profile.
void expect_same_result(const SimResult& a, const SimResult& b, const std::string& what) {
  EXPECT_EQ(a.time.step_seconds, b.time.step_seconds) << what;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.time.phase_seconds[i], b.time.phase_seconds[i]) << what;
  EXPECT_EQ(a.time.breakdown.compute, b.time.breakdown.compute) << what;
  EXPECT_EQ(a.time.breakdown.exposed_comm, b.time.breakdown.exposed_comm) << what;
  EXPECT_EQ(a.time.breakdown.imbalance, b.time.breakdown.imbalance) << what;
  EXPECT_EQ(a.stats.tasks, b.stats.tasks) << what;
  EXPECT_EQ(a.stats.layers_extrapolated, b.stats.layers_extrapolated) << what;
  EXPECT_EQ(a.stats.layers_partially_swept, b.stats.layers_partially_swept) << what;
}

TEST(Simulator, LayerProfileListsEveryIterationTheLoopsRanAndChangesNoResult) {
  {
    // with a recording nothing is jumped: per micro-batch the forward layers 0 .. L-1, then the
    // backward ones L-1 .. 0, each swept over every simulated rank
    Simulated s = simulate({"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=ring,zero=0,recompute=selective,ga=2", 65536});
    SimProfile prof;
    const SimResult r = simulate_step(s.k, s.p, SimRecord::tasks, kRingClosedFormMinRanks, kPartialSweepMinRanks, true, &prof);
    expect_same_result(s.r, r, "recording");
    const int64_t L = s.k.layers;
    ASSERT_EQ(static_cast<int64_t>(prof.runs.size()), 2 * 2 * L);
    for (size_t i = 0; i < prof.runs.size(); ++i) {
      const SimLayerRun& x = prof.runs[i];
      const int64_t mb = static_cast<int64_t>(i) / (2 * L), j = static_cast<int64_t>(i) % (2 * L);
      EXPECT_EQ(x.micro_batch, mb) << i;
      EXPECT_EQ(x.pass, j < L ? SimPass::forward : SimPass::backward) << i;
      EXPECT_EQ(x.layer, j < L ? j : 2 * L - 1 - j) << i;
      EXPECT_EQ(x.kind, SimLayerRun::swept) << i;
      EXPECT_EQ(x.swept_ranks, 8) << i;
      EXPECT_GE(x.cpu_s, 0) << i;
    }
  }
  {
    // a 256-rank plain ring of the 1024-GPU space, streaming: lines jumped (their far ends
    // probed), the forward partly swept, the backward ring in closed form
    const Plan plan = parse_plan("dp=1,tp=4,cp=256,cp_kind=ring,zero=3");
    const StepCosts k = step_costs(resolve_model(profiles(), "Llama-3.1-70B"), resolve_cluster(profiles(), "h100-superpod-1024"),
                                   resolve_runtime(profiles(), "ctxrun-cuda"), plan, 1048576, true);
    const SimResult plain = simulate_step(k, plan, SimRecord::none);
    SimProfile prof;
    const SimResult r = simulate_step(k, plan, SimRecord::none, kRingClosedFormMinRanks, kPartialSweepMinRanks, true, &prof);
    expect_same_result(plain, r, "streaming");
    std::map<int, int> kinds;
    int64_t partial_ranks = 0, whole = 0;
    const int64_t L = k.layers, R = 256;
    for (const SimLayerRun& x : prof.runs) {
      ++kinds[x.kind];
      EXPECT_TRUE(x.layer >= 0 && x.layer < L) << x.layer;
      if (x.kind == SimLayerRun::partial) {
        EXPECT_EQ(x.pass, SimPass::forward);
        EXPECT_TRUE(x.swept_ranks > 0 && x.swept_ranks < R) << x.swept_ranks;
        partial_ranks += x.swept_ranks;
      } else {
        EXPECT_EQ(x.swept_ranks, R);
      }
      if (x.pass == SimPass::forward) {
        EXPECT_EQ(x.ring_computed + x.ring_moved, 0);
      } else if (x.ring_gave_way == 0 && x.ring_computed + x.ring_moved > 0) {
        // a closed form that held: every rank of the ring computed or moved from the layer before,
        // at least once
        EXPECT_GE(x.ring_computed + x.ring_moved, R) << "backward layer " << x.layer;
        ++whole;
      }
    }
    // the statistics count the same partial layers and ranks (no stretch of this plan is ended early by
    // its checks, which would sweep a layer it then drops); every layer a loop did not jump ran
    EXPECT_EQ(kinds[SimLayerRun::partial], r.stats.layers_partially_swept);
    EXPECT_EQ(partial_ranks, r.stats.partial_rank_layers);
    EXPECT_GT(kinds[SimLayerRun::probe], 0);
    EXPECT_GT(whole, 40);
    EXPECT_GE(static_cast<int64_t>(prof.runs.size()) + r.stats.layers_extrapolated, 2 * L);
  }
}

}  // namespace
}  // namespace ctx
