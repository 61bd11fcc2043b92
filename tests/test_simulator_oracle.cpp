// The streaming simulator (simulate_step: one sweep in task-creation order) against the event-queue
// implementation it replaced (simulate_step_reference, kept unchanged as the oracle), over a matrix
// of plans: every CP kind, ZeRO 0-3, recompute none/selective/full, checkpoint/optimizer/parameter
// offload, TP with and without SP, DP, gradient accumulation, packed documents (two pack classes),
// ranks across nodes and uneven node layouts (3-way degrees on 8-GPU nodes). The step time, the
// phases, every breakdown component, the derived throughput, the critical and breakdown ranks
// agree to 1e-9 relative (in practice bit for bit: both take the same maxima and sums in the same
// order); with SimRecord::tasks every task (start, end, ready, stream, collective, ...) and every
// dependency list is the oracle's, so the trace, the GUI timeline and executor/tests/test_schedule
// see exactly today's task graph.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

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
  std::string model, cluster, plan;
  int64_t seq;
};

std::string name(const Case& c) { return c.model + " " + c.cluster + " seq " + std::to_string(c.seq) + " " + c.plan; }

// The matrix: a cross product on one node (CP kind x ZeRO x recompute) plus the other knobs.
std::vector<Case> matrix() {
  std::vector<Case> v;
  const char* cp_kinds[] = {"cp_kind=ring", "cp_kind=zigzag", "cp_kind=allgather", "cp_kind=ulysses", "cp_kind=usp,ulysses=2",
                            "cp_kind=usp,ulysses=4"};
  const char* recomputes[] = {"none", "selective", "full"};
  for (const char* kind : cp_kinds)
    for (int zero = 0; zero <= 3; ++zero)
      for (const char* rc : recomputes)
        v.push_back({"Llama-3.1-8B", "8xh100",
                     std::string("cp=8,") + kind + ",zero=" + std::to_string(zero) + ",recompute=" + rc, 65536});
  const Case more[] = {
      // gradient accumulation, micro-batch size, DP
      {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=ring,zero=0,recompute=selective,ga=2", 65536},
      {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=usp,ulysses=4,zero=3,recompute=full,ga=3", 131072},
      {"Llama-3.1-8B", "8xh100", "dp=8,zero=0", 8192},
      {"Llama-3.1-8B", "8xh100", "dp=8,zero=1,ga=4", 8192},
      {"Llama-3.1-8B", "8xh100", "dp=8,zero=3,recompute=full,ga=2", 8192},
      {"Llama-3.1-8B", "8xh100", "dp=4,cp=2,cp_kind=ring,zero=2,ga=2,mbs=2", 16384},
      // TP with and without sequence parallelism
      {"Llama-3.1-8B", "8xh100", "dp=2,tp=4,zero=3,recompute=full", 32768},
      {"Llama-3.1-8B", "8xh100", "dp=2,tp=4,sp=0,zero=1", 32768},
      {"Llama-3.1-8B", "8xh100", "tp=2,cp=4,cp_kind=ring,sp=0,zero=3,recompute=selective", 65536},
      {"Llama-3.1-8B", "8xh100", "tp=8,zero=0,recompute=selective", 32768},
      // offloads (host stream)
      {"Llama-3.1-8B", "8xh100", "tp=2,cp=4,cp_kind=zigzag,zero=3,recompute=full,ckpt_offload=1,opt_offload=1", 262144},
      {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=ulysses,zero=3,recompute=full,opt_offload=1,param_offload=1,ckpt_offload=1", 524288},
      {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=ring,zero=3,recompute=full,ckpt_offload=1", 131072},
      {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=ring,zero=3,recompute=full,param_offload=1,ga=2", 131072},
      {"Llama-3.1-8B", "8xh100", "dp=8,zero=1,opt_offload=1", 8192},
      {"Llama-3.1-70B", "8x8xh100", "dp=8,tp=8,zero=3,ga=2,param_offload=1", 4096},
      // tiled loss, packed documents (heaviest and lightest pack)
      {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=zigzag,zero=3,recompute=full,tiled_loss=2048", 131072},
      {"Llama-3.1-8B", "8xh100", "dp=8,zero=3,recompute=full,mask=doc:hist:2048@0.8/32768@0.2", 32768},
      {"Llama-3.1-8B", "8xh100", "dp=2,cp=4,cp_kind=ring,zero=3,mask=doc:hist:1024@0.5/16384@0.5,ga=2", 65536},
      // across nodes
      {"Llama-3.1-8B", "4x8xh100", "dp=4,cp=8,cp_kind=zigzag,zero=3,recompute=full", 131072},
      {"Llama-3.1-8B", "4x8xh100", "dp=2,tp=2,cp=8,cp_kind=ring,zero=1,ga=2", 65536},
      {"Llama-3.1-8B", "4x8xh100", "cp=32,cp_kind=ring,zero=3,recompute=full", 262144},
      {"Llama-3.1-70B", "8x8xh100", "tp=8,cp=8,cp_kind=ring,zero=3,recompute=full", 262144},
      {"Llama-3.1-70B", "8x8xh100", "tp=4,cp=16,cp_kind=usp,ulysses=2,zero=3,recompute=full", 262144},
      // uneven node layouts: 3-way degrees on 8-GPU nodes (groups straddle node boundaries unevenly)
      {"Llama-3.1-8B", "3x8xh100", "dp=8,cp=3,cp_kind=ring,zero=3,recompute=full", 49152},
      {"Llama-3.1-8B", "3x8xh100", "dp=4,tp=2,cp=3,cp_kind=ring,zero=2,recompute=selective", 49152},
      {"Llama-3.1-8B", "3x8xh100", "dp=2,tp=4,cp=3,cp_kind=zigzag,zero=3,recompute=full,ga=2", 49152},
      {"Llama-3.1-8B", "3x8xh100", "tp=8,cp=3,cp_kind=ring,zero=1", 49152},
      {"Llama-3.1-8B", "3x8xh100", "dp=3,tp=8,zero=3", 16384},
      // many identical micro-batches (periodic over micro-batches) and a 64-rank plain ring whose
      // ranks drift into step over many layers (periodic layers reached late, jumps checked)
      {"Llama-3.1-8B", "8xh100", "dp=8,zero=1,ga=16", 8192},
      {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=ring,zero=3,recompute=full,ga=9", 65536},
      {"Llama-3.1-8B", "8xh100", "dp=2,cp=4,cp_kind=ring,zero=3,mask=doc:hist:1024@0.5/16384@0.5,ga=12", 65536},
      {"Llama-3.1-8B", "8x8xh100", "cp=64,cp_kind=ring,zero=3,recompute=full", 524288},
      {"Llama-3.1-70B", "8x8xh100", "tp=2,cp=32,cp_kind=ring,zero=3,recompute=selective", 262144},
      // plain rings whose forward layers go on with only the ranks off their lines swept (partial
      // sweep, forced from 4 ranks below): with and without the ZeRO-3 gather that joins every rank
      {"Llama-3.1-8B", "4x8xh100", "cp=32,cp_kind=ring", 262144},
      {"Llama-3.1-8B", "8x8xh100", "cp=64,cp_kind=ring,zero=3", 524288},
  };
  for (const Case& c : more) v.push_back(c);
  return v;
}

double rel(double a, double b) {
  double d = std::abs(a - b);
  return d == 0 ? 0 : d / std::max(std::abs(a), std::abs(b));
}

// `got` against the oracle's `ref` bit for bit (the exact-arithmetic tests below: dyadic costs, so
// any difference is a wrong case, not rounding): the step, the phases, the breakdown, the critical
// and breakdown ranks, the task count, and per rank its end and compute-stream busy time from the
// oracle's tasks.
// the step, its phases and its breakdown within 1e-9 relative of a reference; the largest difference
// goes to *worst (with where it was) when given
void expect_step_within_1e9(const StepTime& got, const StepTime& ref, const std::string& w, double* worst = nullptr,
                            std::string* worst_where = nullptr) {
  auto cmp = [&](const char* field, double a, double b) {
    const double d = rel(a, b);
    if (worst && d > *worst) {
      *worst = d;
      *worst_where = w + " " + field;
    }
    EXPECT_LE(d, 1e-9) << w << ": " << field << " " << a << " vs " << b;
  };
  cmp("step_seconds", got.step_seconds, ref.step_seconds);
  for (int i = 0; i < static_cast<int>(TimePhase::count); ++i) cmp("phase", got.phase_seconds[i], ref.phase_seconds[i]);
  cmp("breakdown.compute", got.breakdown.compute, ref.breakdown.compute);
  cmp("breakdown.exposed_comm", got.breakdown.exposed_comm, ref.breakdown.exposed_comm);
  cmp("breakdown.offload_stall", got.breakdown.offload_stall, ref.breakdown.offload_stall);
  cmp("breakdown.imbalance", got.breakdown.imbalance, ref.breakdown.imbalance);
  cmp("breakdown.optimizer", got.breakdown.optimizer, ref.breakdown.optimizer);
}

void expect_exactly_the_oracle(const SimResult& got, const SimResult& ref, const std::string& w) {
  EXPECT_EQ(got.time.step_seconds, ref.time.step_seconds) << w;
  for (int i = 0; i < static_cast<int>(TimePhase::count); ++i) EXPECT_EQ(got.time.phase_seconds[i], ref.time.phase_seconds[i]) << w;
  EXPECT_EQ(got.time.breakdown.compute, ref.time.breakdown.compute) << w;
  EXPECT_EQ(got.time.breakdown.exposed_comm, ref.time.breakdown.exposed_comm) << w;
  EXPECT_EQ(got.time.breakdown.imbalance, ref.time.breakdown.imbalance) << w;
  EXPECT_EQ(got.time.breakdown.offload_stall, ref.time.breakdown.offload_stall) << w;
  EXPECT_EQ(got.time.breakdown.optimizer, ref.time.breakdown.optimizer) << w;
  EXPECT_EQ(got.critical_rep, ref.critical_rep) << w;
  EXPECT_EQ(got.breakdown_rep, ref.breakdown_rep) << w;
  EXPECT_EQ(got.stats.tasks, ref.stats.tasks) << w;
  ASSERT_EQ(got.reps.size(), ref.reps.size()) << w;
  std::vector<double> end(ref.reps.size(), 0.0), busy(ref.reps.size(), 0.0);
  for (const SimTask& t : ref.tasks) {
    end[static_cast<size_t>(t.rep)] = std::max(end[static_cast<size_t>(t.rep)], t.end);
    if (t.stream == SimStream::compute) busy[static_cast<size_t>(t.rep)] += t.duration;
  }
  for (size_t i = 0; i < ref.reps.size(); ++i) {
    EXPECT_EQ(got.reps[i].end_s, end[i]) << w << ", rep " << i;
    EXPECT_EQ(got.reps[i].compute_stream_busy_s, busy[i]) << w << ", rep " << i;
  }
}

TEST(SimulatorOracle, StreamingSweepMatchesTheEventQueueOnEveryPlanOfTheMatrix) {
  int checked = 0, skipped = 0, extrapolating = 0, partially = 0;
  double worst = 0;
  std::string worst_where;
  for (const Case& c : matrix()) {
    const std::string what = name(c);
    ModelSpec m = resolve_model(profiles(), c.model);
    ClusterSpec cl = resolve_cluster(profiles(), c.cluster);
    const RuntimeProfile& rt = resolve_runtime(profiles(), "ctxrun-cuda");
    Plan p = parse_plan(c.plan);
    PlanCheck chk = check_plan(p, m, cl, c.seq);
    if (!chk.ok()) {
      ++skipped;
      ADD_FAILURE() << what << ": " << chk.message() << " (the matrix must hold valid plans)";
      continue;
    }
    StepCosts k = step_costs(m, cl, rt, p, c.seq, true);
    SimResult ref = simulate_step_reference(k, p);
    // streaming; streaming with the backward ring rank by rank in closed form at every size
    // (by default only from kRingClosedFormMinRanks ranks); recording
    for (int variant = 0; variant < 3; ++variant) {
      const SimRecord record = variant == 2 ? SimRecord::tasks : SimRecord::none;
      // (the forward's partial sweep from 4 ranks, by default from kPartialSweepMinRanks)
      SimResult got = simulate_step(k, p, record, variant == 1 ? 2 : kRingClosedFormMinRanks, 4);
      const std::string w = what + (variant == 0 ? " (streaming)" : variant == 1 ? " (streaming, closed-form backward ring)" : " (recording)");
      expect_step_within_1e9(got.time, ref.time, w + " (vs oracle)", &worst, &worst_where);
      auto cmp = [&](const char* field, double a, double b) {
        double d = rel(a, b);
        if (d > worst) { worst = d; worst_where = w + " " + field; }
        EXPECT_LE(d, 1e-9) << w << ": " << field << " " << a << " vs oracle " << b;
      };
      cmp("tokens_per_second", got.time.tokens_per_second, ref.time.tokens_per_second);
      cmp("mfu", got.time.mfu, ref.time.mfu);
      cmp("model_tflops_per_gpu", got.time.model_tflops_per_gpu, ref.time.model_tflops_per_gpu);
      cmp("hardware_tflops_per_gpu", got.time.hardware_tflops_per_gpu, ref.time.hardware_tflops_per_gpu);
      EXPECT_EQ(got.time.method, ref.time.method) << w;
      EXPECT_EQ(got.critical_rep, ref.critical_rep) << w;
      EXPECT_EQ(got.breakdown_rep, ref.breakdown_rep) << w;
      EXPECT_EQ(got.stats.tasks, ref.stats.tasks) << w;
      EXPECT_EQ(got.stats.events, ref.stats.events) << w;
      EXPECT_EQ(got.stats.never_ran, 0) << w;
      EXPECT_EQ(got.stats.started_twice, 0) << w;
      ASSERT_EQ(got.reps.size(), ref.reps.size()) << w;
      {  // per-rank totals (ctxplan simulate's table) against the oracle's tasks
        std::vector<double> end(ref.reps.size(), 0.0), busy(ref.reps.size(), 0.0);
        for (const SimTask& t : ref.tasks) {
          end[static_cast<size_t>(t.rep)] = std::max(end[static_cast<size_t>(t.rep)], t.end);
          if (t.stream == SimStream::compute) busy[static_cast<size_t>(t.rep)] += t.duration;
        }
        for (size_t i = 0; i < ref.reps.size(); ++i) {
          cmp("rank end", got.reps[i].end_s, end[i]);
          cmp("rank compute-stream busy", got.reps[i].compute_stream_busy_s, busy[i]);
        }
      }
      for (size_t i = 0; i < got.reps.size(); ++i) {
        EXPECT_EQ(got.reps[i].rank, ref.reps[i].rank) << w;
        EXPECT_EQ(got.reps[i].stands_for, ref.reps[i].stands_for) << w;
        EXPECT_EQ(got.reps[i].label, ref.reps[i].label) << w;
      }
      if (variant == 0 && (got.stats.layers_extrapolated > 0 || got.stats.micro_batches_extrapolated > 0)) ++extrapolating;
      if (variant == 0 && got.stats.layers_partially_swept > 0) ++partially;
      if (record == SimRecord::none) {
        EXPECT_TRUE(got.tasks.empty()) << w << ": nothing per task without a recording";
        EXPECT_TRUE(got.deps.empty()) << w;
        continue;
      }
      // the recording is today's task graph, timed identically
      ASSERT_EQ(got.tasks.size(), ref.tasks.size()) << w;
      ASSERT_EQ(got.deps.size(), ref.deps.size()) << w;
      size_t task_mismatches = 0;
      for (size_t i = 0; i < got.tasks.size(); ++i) {
        const SimTask& a = got.tasks[i];
        const SimTask& b = ref.tasks[i];
        bool same = std::strcmp(a.name, b.name) == 0 && a.duration == b.duration && a.rep == b.rep && a.layer == b.layer &&
                    a.micro_batch == b.micro_batch && a.collective == b.collective && a.stream == b.stream && a.pass == b.pass &&
                    a.category == b.category && got.deps[i] == ref.deps[i] && rel(a.start, b.start) <= 1e-9 &&
                    rel(a.end, b.end) <= 1e-9 && rel(a.ready, b.ready) <= 1e-9;
        worst = std::max({worst, rel(a.start, b.start), rel(a.end, b.end), rel(a.ready, b.ready)});
        if (!same && task_mismatches++ < 5)
          ADD_FAILURE() << w << ": task " << i << " " << a.name << " start " << a.start << " end " << a.end << " ready " << a.ready
                        << " vs oracle " << b.name << " " << b.start << " " << b.end << " " << b.ready;
      }
      EXPECT_EQ(task_mismatches, 0u) << w;
    }
    ++checked;
  }
  EXPECT_EQ(skipped, 0);
  EXPECT_GE(checked, 100);
  std::printf("%d of %d plans extrapolated periodic layers or micro-batches without a recording\n", extrapolating, checked);
  // the comparison covers the periodic jumps (layers and micro-batches not swept) on most plans
  EXPECT_GE(extrapolating, checked / 2) << "plans whose streaming sweep extrapolated layers";
  // and the partial sweep (forward layers with only the ranks off their lines swept) on the plain
  // rings of 32 and 64 ranks
  std::printf("%d plans swept forward layers partially\n", partially);
  EXPECT_GE(partially, 4) << "plans whose forward layers were swept partially";
  std::printf("oracle matrix: %d plans, each streaming (swept and closed-form backward ring) and recording; max relative difference %.3g%s%s\n", checked, worst,
              worst > 0 ? " at " : "", worst > 0 ? worst_where.c_str() : "");
}

// A plain ring of cp ranks (one pack class, no Ulysses) for the random cases below: one
// micro-batch, unit tokens and peak (the costs are set by each test).
StepCosts plain_ring(int64_t cp, int64_t layers) {
  StepCosts k;
  k.layers = layers;
  k.ga = 1;
  k.cp = cp;
  k.ulysses = 1;
  k.ring = cp;
  k.cp_kind = CpKind::ring;
  k.world = cp;
  k.tokens_per_step = 1;
  k.peak_flops = 1;
  return k;
}

// Random ring costs against the oracle, bit for bit. The streaming forward ring takes each rank's
// steps in segments of equal cost and equal upstream arrival maximum, each closed-form (which
// step's block is late, the gaps, the task ending last): the segments' cases are c >= p and c < p,
// blocks late from the start or from some step on, zero-cost steps, a zero hop (p = 0), maxima
// rising anywhere upstream, two pack classes and usp's several rings. The costs are small dyadic
// numbers (multiples of 1/4 below 8), so every sum and product of them is exact in binary floating
// point: the closed forms and the oracle's task-by-task sums must agree exactly, and any
// difference is a wrong case, not rounding.
TEST(SimulatorOracle, RandomRingCostsMatchTheEventQueueExactly) {
  std::mt19937 rng(20261125);
  auto pick = [&](std::initializer_list<double> v) { return *(v.begin() + std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)); };
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int cases = 0, segmented = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const bool usp = uni(0, 3) == 0;
    const int64_t u = usp ? 2 : 1;
    const int64_t cp = usp ? 2 * uni(2, 5) : uni(2, 10);
    const int classes = uni(0, 4) == 0 ? 2 : 1;
    StepCosts k;
    k.layers = uni(1, 7);
    k.ga = uni(1, 3);
    k.cp = cp;
    k.ulysses = u;
    k.ring = cp / u;
    k.cp_kind = usp ? CpKind::usp : CpKind::ring;
    k.world = cp * classes;
    k.tokens_per_step = 1;
    k.peak_flops = 1;
    k.recompute = uni(0, 2) == 0 ? Recompute::none : uni(0, 1) ? Recompute::full : Recompute::selective;
    k.p2p_fwd = pick({0, 0.25, 0.5, 1, 2});
    k.p2p_dkv = pick({0, 0.25, 0.5, 1});
    k.pre_fwd = pick({0, 0.5, 1});
    k.post_fwd = pick({0, 0.25});
    k.mlp_fwd = pick({0, 0.5, 1.5});
    k.pre_bwd = pick({0, 0.5});
    k.post_bwd = pick({0, 0.25});
    k.mlp_bwd = pick({0, 1, 3});
    if (usp) k.a2a_qkv = k.a2a_out = k.a2a_bwd_in = pick({0, 0.25});
    // per rank: runs of equal cost, of random lengths
    auto costs = [&]() {
      std::vector<std::vector<double>> v(static_cast<size_t>(cp));
      for (auto& r : v) {
        while (static_cast<int64_t>(r.size()) < k.ring) {
          const double c = pick({0, 0, 0.25, 0.5, 0.75, 1, 1.5, 2, 3});
          for (int n = uni(1, static_cast<int>(k.ring)); n > 0 && static_cast<int64_t>(r.size()) < k.ring; --n) r.push_back(c);
        }
      }
      return v;
    };
    for (int c = 0; c < classes; ++c) {
      k.attn_fwd.push_back(costs());
      k.attn_bwd.push_back(costs());
    }
    if (classes == 2) k.pack_dp_rank = {0, 1};
    const std::string plan = (classes == 2 ? "dp=2," : "") + std::string("cp=") + std::to_string(cp) +
                             (usp ? ",cp_kind=usp,ulysses=2" : ",cp_kind=ring");
    const Plan p = parse_plan(plan);
    const std::string w0 = "trial " + std::to_string(trial) + ": " + plan + ", layers " + std::to_string(k.layers) + ", ga " +
                          std::to_string(k.ga) + ", p " + std::to_string(k.p2p_fwd) + ", q " + std::to_string(k.p2p_dkv);
    const SimResult ref = simulate_step_reference(k, p);
    for (int closed_form = 0; closed_form < 2; ++closed_form) {  // the backward ring swept, then rank by rank in closed form
      const SimResult got = simulate_step(k, p, SimRecord::none, closed_form ? 2 : 1 << 30);
      const std::string w = w0 + (closed_form ? " (closed-form backward ring)" : "");
      expect_exactly_the_oracle(got, ref, w);
    }
    if (k.ring >= 3) ++segmented;
    ++cases;
  }
  EXPECT_EQ(cases, 400);
  EXPECT_GE(segmented, 300) << "cases whose forward ring has receives past the first step";
}

// Rings whose upstream ranks become ready ever later: a rank's attention costs fall with its
// index, so after the first layer each rank's first receive ends later the farther upstream it is
// and the running maximum of the forward ring rises at almost every hop (as in the recompute pass
// of a long causal ring). ring_forward_by_rank takes such stretches of rises at once: blocks late
// at every step while each rise exceeds c - p (c >= p), the maximum over a late run (c < p), and
// the final maximum, by range queries over the first ends. Same exact-arithmetic setting as above
// (dyadic costs: any difference is a wrong case, not rounding), against the oracle bit for bit.
TEST(SimulatorOracle, RingsRisingUpstreamMatchTheEventQueueExactly) {
  std::mt19937 rng(20261127);
  auto pick = [&](std::initializer_list<double> v) { return *(v.begin() + std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)); };
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int cases = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const int64_t cp = uni(4, 24);
    StepCosts k = plain_ring(cp, uni(2, 5));
    k.ga = uni(1, 2);
    k.recompute = uni(0, 1) ? Recompute::full : Recompute::none;
    k.p2p_fwd = pick({0, 0.25, 0.5, 1});
    k.p2p_dkv = pick({0, 0.25, 0.5});
    k.pre_fwd = pick({0, 0.5});
    k.mlp_fwd = pick({0, 1});
    k.pre_bwd = pick({0, 0.5});
    k.mlp_bwd = pick({0, 1});
    // rank r: `unit` x (cp - r) per step on its first (cp - r) steps (or all), then zeros, with
    // a few random steps changed
    const double unit = pick({0.25, 0.5, 1});
    const bool causal = uni(0, 1);
    auto costs = [&]() {
      std::vector<std::vector<double>> v(static_cast<size_t>(cp));
      for (int64_t r = 0; r < cp; ++r) {
        auto& row = v[static_cast<size_t>(r)];
        for (int64_t j = 0; j < cp; ++j) row.push_back(!causal || j < cp - r ? unit * static_cast<double>(cp - r) : 0.0);
        for (int n = uni(0, 2); n > 0; --n) row[static_cast<size_t>(uni(0, static_cast<int>(cp) - 1))] = pick({0, 0.25, 2, 8});
      }
      return v;
    };
    k.attn_fwd.push_back(costs());
    k.attn_bwd.push_back(costs());
    const Plan p = parse_plan("cp=" + std::to_string(cp) + ",cp_kind=ring");
    const std::string w = "trial " + std::to_string(trial) + ": cp " + std::to_string(cp) + ", layers " + std::to_string(k.layers) + ", p " +
                          std::to_string(k.p2p_fwd) + ", unit " + std::to_string(unit) + (causal ? ", causal" : "");
    const SimResult ref = simulate_step_reference(k, p);
    const SimResult got = simulate_step(k, p, SimRecord::none);
    expect_exactly_the_oracle(got, ref, w);
    ++cases;
  }
  EXPECT_EQ(cases, 120);
}

// Longer rings of the same kind (24-64 ranks): a compute-bound run of a rank's forward ring meets
// more than 16 rises ahead, and ring_forward_by_rank takes the rises that cannot make a block late
// at once (a sparse-table search over the first ends less (c - p) per hop, then the exact test at
// the hop it finds). Against the oracle bit for bit (dyadic costs); the test requires the search
// taken (SimStats::rise_searches), in several layers of one simulation: a search over the table of
// an earlier layer's first ends (a table kept across calls) was off here.
TEST(SimulatorOracle, LongRingsRisingUpstreamMatchTheEventQueueExactly) {
  std::mt19937 rng(20261128);
  auto pick = [&](std::initializer_list<double> v) { return *(v.begin() + std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)); };
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int cases = 0, searched = 0;
  int64_t searches = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t cp = uni(24, 64);
    StepCosts k = plain_ring(cp, uni(3, 6));
    k.recompute = uni(0, 1) ? Recompute::full : Recompute::none;
    k.p2p_fwd = pick({0.25, 0.5, 1});
    k.p2p_dkv = pick({0.25, 0.5});
    k.pre_fwd = pick({0, 0.5});
    k.mlp_fwd = pick({0, 1, 4});
    k.pre_bwd = pick({0, 0.5});
    k.mlp_bwd = pick({0, 1});
    k.zero3_ag = pick({0, 0.5, 8});
    // rank r: `unit` x (cp - r) per step on its first (cp - r) steps, then zeros (its upstream
    // ranks, busier, end later: the running maximum rises at every hop), or `unit` on every step;
    // some ranks heavier (a rise large enough to make a block late, among many that are not), a
    // few steps changed
    const double unit = pick({0.25, 0.5, 1});
    const bool causal = uni(0, 1);
    std::vector<double> weight(static_cast<size_t>(cp));
    for (double& x : weight) x = pick({1, 1, 1, 1, 2, 4});
    auto costs = [&]() {
      std::vector<std::vector<double>> v(static_cast<size_t>(cp));
      for (int64_t r = 0; r < cp; ++r) {
        auto& row = v[static_cast<size_t>(r)];
        const double c = unit * weight[static_cast<size_t>(r)] * (causal ? static_cast<double>(cp - r) : 1.0);
        for (int64_t j = 0; j < cp; ++j) row.push_back(!causal || j < cp - r ? c : 0.0);
        for (int n = uni(0, 2); n > 0; --n) row[static_cast<size_t>(uni(1, static_cast<int>(cp) - 1))] = pick({0, 0.25, 2, 8});
      }
      return v;
    };
    k.attn_fwd.push_back(costs());
    k.attn_bwd.push_back(costs());
    const Plan p = parse_plan("cp=" + std::to_string(cp) + ",cp_kind=ring");
    const std::string w = "trial " + std::to_string(trial) + ": cp " + std::to_string(cp) + ", layers " + std::to_string(k.layers) + ", p " +
                          std::to_string(k.p2p_fwd) + ", unit " + std::to_string(unit) + (k.recompute == Recompute::full ? ", recompute" : "") +
                          (causal ? ", causal" : "");
    const SimResult ref = simulate_step_reference(k, p);
    const SimResult got = simulate_step(k, p, SimRecord::none);
    expect_exactly_the_oracle(got, ref, w);
    searches += got.stats.rise_searches;
    searched += got.stats.rise_searches >= 2;
    ++cases;
  }
  EXPECT_EQ(cases, 60);
  std::printf("%d of %d rings took rises at once in two or more runs (%lld searches)\n", searched, cases, static_cast<long long>(searches));
  EXPECT_GE(searched, 20) << "rings whose forward ring took stretches of rises at once";
}

// The random long-ring tests' per-layer costs on a dyadic grid (exact sums: ties are likely), drawn
// in this order by `pick` (one of the values it is given).
template <class Pick>
void random_ring_layer_costs(StepCosts& k, Pick& pick) {
  k.p2p_fwd = pick({0.25, 0.5, 1});
  k.p2p_dkv = pick({0.25, 0.5});
  k.pre_fwd = pick({0.25, 0.5});
  k.post_fwd = pick({0, 0.25});
  k.mlp_fwd = pick({0.5, 1});
  k.pre_bwd = pick({0, 0.5});
}

// The partial sweep (only the ranks off their lines swept, the others moved along their lines)
// on rings whose ranks leave their lines one after another, against the oracle bit for bit: the
// forward costs of a causal ring (rank r computes on its first cp - r steps, or r + 1 with the
// heaviest rank last), many layers (a partial jump needs three observed layers and two more to
// go), with and without a ZeRO-3 gather joining every rank. Same exact-arithmetic setting as the
// tests above (dyadic costs: the lines' extrapolation z + m (z - y) is exact too, so any
// difference is a wrong move of a rank or a missed dependency, not rounding).
TEST(SimulatorOracle, PartialSweepsOfLongRingsMatchTheEventQueueExactly) {
  std::mt19937 rng(20261127);
  auto pick = [&](std::initializer_list<double> v) { return *(v.begin() + std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)); };
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int cases = 0, partial = 0, partial_gathered = 0;
  for (int trial = 0; trial < 160; ++trial) {
    const int64_t cp = uni(8, 40);
    StepCosts k = plain_ring(cp, uni(10, 24));
    k.recompute = uni(0, 2) == 0 ? Recompute::full : Recompute::none;
    random_ring_layer_costs(k, pick);
    k.mlp_bwd = pick({0, 1});
    k.zero3_ag = pick({0, 0.25, 2, 4, 8});
    const double unit = pick({0.25, 0.5});
    const bool heavy_last = uni(0, 1);
    auto costs = [&]() {
      std::vector<std::vector<double>> v(static_cast<size_t>(cp));
      for (int64_t r = 0; r < cp; ++r) {
        const int64_t busy = heavy_last ? r + 1 : cp - r;
        for (int64_t j = 0; j < cp; ++j) v[static_cast<size_t>(r)].push_back(j < busy ? unit : 0.0);
      }
      return v;
    };
    k.attn_fwd.push_back(costs());
    k.attn_bwd.push_back(costs());
    const Plan p = parse_plan("cp=" + std::to_string(cp) + ",cp_kind=ring");
    const std::string w = "trial " + std::to_string(trial) + ": cp " + std::to_string(cp) + ", layers " + std::to_string(k.layers) + ", p " +
                          std::to_string(k.p2p_fwd) + ", unit " + std::to_string(unit) + ", gather " + std::to_string(k.zero3_ag) +
                          (heavy_last ? ", heaviest last" : ", heaviest first");
    const SimResult ref = simulate_step_reference(k, p);
    const SimResult got = simulate_step(k, p, SimRecord::none, kRingClosedFormMinRanks, 4);  // (partial sweep from 4 ranks)
    expect_exactly_the_oracle(got, ref, w);
    if (got.stats.layers_partially_swept > 0) ++partial, partial_gathered += k.zero3_ag > 0;
    ++cases;
  }
  EXPECT_EQ(cases, 160);
  std::printf("%d of %d rings swept forward layers partially, %d of them with the gather\n", partial, cases, partial_gathered);
  EXPECT_GE(partial, 12) << "rings whose forward layers were swept partially";
  EXPECT_GE(partial_gathered, 4) << "of them with the ZeRO-3 gather";
}

// The 1024-GPU job's large plain rings (too large for the event queue: 26-105 million tasks),
// where ranks leave their lines one after another for most of the forward pass: the partial
// sweep against whole-layer sweeps only (simulate_step's partial_sweep = false, itself held to
// the oracle above) and by default (from kPartialSweepMinRanks = 128 ranks), to the matrix's 1e-9 (both extrapolate lines, rounding differently), on every
// output; and the partial sweep must carry most of the forward layers (80 layers, 78 alike).
TEST(SimulatorOracle, PartialSweepOfLargeRingsEqualsWholeLayerSweeps) {
  const char* plans[] = {"cp=256,cp_kind=ring", "dp=4,cp=256,cp_kind=ring,zero=3", "tp=8,cp=128,cp_kind=ring,zero=3,recompute=full",
                         "cp=512,cp_kind=ring,zero=3"};
  ModelSpec m = resolve_model(profiles(), "Llama-3.1-70B");
  ClusterSpec cl = resolve_cluster(profiles(), "h100-superpod-1024");
  const RuntimeProfile& rt = resolve_runtime(profiles(), "ctxrun-cuda");
  for (const char* text : plans) {
    Plan p = parse_plan(text);
    ASSERT_TRUE(check_plan(p, m, cl, 1048576).ok()) << text;
    const StepCosts k = step_costs(m, cl, rt, p, 1048576, true);
    const SimResult whole = simulate_step(k, p, SimRecord::none, kRingClosedFormMinRanks, 1 << 30);
    const SimResult got = simulate_step(k, p, SimRecord::none);
    expect_step_within_1e9(got.time, whole.time, std::string(text) + " (vs whole-layer sweeps)");
    EXPECT_EQ(got.critical_rep, whole.critical_rep) << text;
    EXPECT_EQ(got.breakdown_rep, whole.breakdown_rep) << text;
    EXPECT_EQ(got.stats.tasks, whole.stats.tasks) << text;
    ASSERT_EQ(got.reps.size(), whole.reps.size()) << text;
    for (size_t i = 0; i < got.reps.size(); ++i) {
      EXPECT_LE(rel(got.reps[i].end_s, whole.reps[i].end_s), 1e-9) << text << ": rank end";
      EXPECT_LE(rel(got.reps[i].compute_stream_busy_s, whole.reps[i].compute_stream_busy_s), 1e-9) << text << ": rank compute-stream busy";
    }
    EXPECT_EQ(whole.stats.partial_jumps, 0) << text;
    EXPECT_GE(got.stats.partial_jumps, 1) << text;
    EXPECT_GE(got.stats.layers_partially_swept, 39) << text << ": forward layers swept partially (half of the 78 alike)";
    std::printf("%s: %lld forward layers swept partially in %lld jumps (%lld undone)\n", text, static_cast<long long>(got.stats.layers_partially_swept),
                static_cast<long long>(got.stats.partial_jumps), static_cast<long long>(got.stats.partial_misses));
  }
}

// A stretch of the forward's partial sweep that its per-layer checks end: an 11-rank causal ring
// (rank r busy on its first 11 - r steps) with a 4 s checkpoint copy to the host per layer and 1
// s parameter copies, one to three micro-batches. A B rank's pre-attention end reaches its A
// neighbour's first receive (check (1), and with it (2): that B rank's first receive ends no
// earlier than its neighbour's) once in every micro-batch's forward (counted with a local build
// instrumenting the checks; none of the random rings above trips them), so the stretch ends a
// layer earlier, B goes back one layer (restore_b) and the far end is checked there: the sweep
// must match the oracle exactly and keep the stretch (no far-end miss). Without checks (1) and
// (2) the far-end check undoes every stretch here (partial_misses > 0, nothing kept).
TEST(SimulatorOracle, PartialSweepStretchEndedByItsChecksMatchesTheEventQueueExactly) {
  for (int64_t ga = 1; ga <= 3; ++ga) {
    StepCosts k = plain_ring(11, 33);
    k.ga = ga;
    k.recompute = Recompute::none;
    k.p2p_fwd = 0.25, k.p2p_dkv = 0.25;
    k.pre_fwd = 0.5, k.post_fwd = 0.25, k.mlp_fwd = 1, k.pre_bwd = 0, k.mlp_bwd = 1;
    k.param_h2d = 1, k.ckpt_d2h = 4;
    std::vector<std::vector<double>> costs(11);
    for (int64_t r = 0; r < 11; ++r)
      for (int64_t j = 0; j < 11; ++j) costs[static_cast<size_t>(r)].push_back(j < 11 - r ? 0.25 : 0.0);
    k.attn_fwd.push_back(costs);
    k.attn_bwd.push_back(costs);
    const Plan p = parse_plan("cp=11,cp_kind=ring");
    const std::string w = "cp=11 causal ring, checkpoint offload, ga " + std::to_string(ga);
    const SimResult ref = simulate_step_reference(k, p);
    const SimResult got = simulate_step(k, p, SimRecord::none, kRingClosedFormMinRanks, 4);  // (partial sweep from 4 ranks)
    expect_exactly_the_oracle(got, ref, w);
    EXPECT_GE(got.stats.layers_partially_swept, ga) << w << ": forward layers swept partially";
    EXPECT_EQ(got.stats.partial_misses, 0) << w << ": stretches undone by the far-end check";
  }
}

// The two tests below' cases: one simulated rank (a plain ring of two alike ranks) with parameter
// and checkpoint offload on one host stream, compute C = 4 a layer, the host h + d = 1 + d, for d in
// {3.25, 3.5, 4.5} and ga 1, 2; `check(k, p, w, ref)` with the event queue's result.
template <class F>
void for_each_host_bound_ring(F check) {
  for (double d : {3.25, 3.5, 4.5}) {
    for (int64_t ga = 1; ga <= 2; ++ga) {
      StepCosts k = plain_ring(2, 40);
      k.ga = ga;
      k.recompute = Recompute::none;
      k.p2p_fwd = 0.25, k.p2p_dkv = 0.25;
      k.pre_fwd = 1, k.post_fwd = 0.5, k.mlp_fwd = 1.5, k.pre_bwd = 1, k.post_bwd = 0.5, k.mlp_bwd = 3;
      k.param_h2d = 1, k.ckpt_d2h = d, k.ckpt_h2d = d;
      const std::vector<std::vector<double>> costs(2, std::vector<double>{0.5, 0.5});
      k.attn_fwd.push_back(costs);
      k.attn_bwd.push_back(costs);
      const Plan p = parse_plan("cp=2,cp_kind=ring");
      const std::string w = "one rank, parameter and checkpoint offload, d2h " + std::to_string(d) + ", ga " + std::to_string(ga);
      check(k, p, w, simulate_step_reference(k, p));
    }
  }
}

// Period::jump checks the farthest distance first where every rank keeps one pace (here one rank:
// a plain ring of two alike ranks). A line that breaks before the loop's end makes that probe
// fail, and the search must go on below it exactly. The forward of a rank with parameter and
// checkpoint offload on one host stream: per layer the compute takes C (norm 1, attention 1,
// o_proj 0.5, MLP 1.5: C = 4) and the host h2d (the next layer's parameters, after the layer
// starts) plus d2h (this layer's checkpoint, after it starts) = h + d. With h + d > C the host
// falls behind by h + d - C a layer while the compute is ahead; once the lag uses up the one-layer
// prefetch's slack, the compute waits for the parameters every layer and runs at the host's pace
// h + d: the state moves on one line (compute C, host h + d a layer), then on another, the kink
// some layers in (d = 3.25: lag 0.25 a layer against a slack of about C - h = 3: near layer 12 of
// 40). Dyadic costs: the sums are exact, so the streaming sweep must equal the event queue bit for
// bit (the breakdown's offload stall and optimizer too). Each d must trip the far-first check at
// least once (far_first_misses), and the search below it must still extrapolate layers. Checked
// by breaking the code temporarily: leaving the failed probe's state in place fails every case.
// (Taking the failed probe's far state as if it had held would go unnoticed here: past the kink
// the compute waits for the host, so the wrong compute times are forgotten, and the stalls the far
// step adds at once sum to the ones the layers add one by one; the check itself is the one every
// probe makes.)
TEST(SimulatorOracle, LineBrokenBeforeTheLoopsEndAfterTheFarthestCheckMatchesTheEventQueueExactly) {
  int tripped = 0;
  for_each_host_bound_ring([&](const StepCosts& k, const Plan& p, const std::string& w, const SimResult& ref) {
    // (without the margins' guess, which would check the kink's distance first: the next test)
    const SimResult got = simulate_step(k, p, SimRecord::none, kRingClosedFormMinRanks, kPartialSweepMinRanks, false);
    expect_exactly_the_oracle(got, ref, w);
    EXPECT_EQ(got.reps.size(), 1u) << w;
    EXPECT_GT(got.stats.layers_extrapolated, 0) << w;
    std::printf("%s: %lld layers extrapolated, %lld far-first misses of %lld\n", w.c_str(), static_cast<long long>(got.stats.layers_extrapolated),
                static_cast<long long>(got.stats.far_first_misses), static_cast<long long>(got.stats.jump_misses));
    tripped += got.stats.far_first_misses > 0;
  });
  EXPECT_EQ(tripped, 6) << "cases whose first check at the farthest distance failed";
}

// The same lines broken by the host, with the margins' guess (Margins in simulator.cpp): the
// compute's wait for the next layer's parameters is a maximum whose margin (how far the
// parameters' arrival is below the compute's own previous end) closes by h + d - C a layer, so
// the two swept layers that put the state on its first line also say after how many layers the
// compute starts to wait. The first probe goes to the last layer before it: it must hold (no
// probe fails, where the search alone fails once per jump) and the jumps must reach as far as the
// search's (a guess one layer too far fails its probe; one too short leaves layers the search
// extrapolates: checked by breaking the guess by +1 and -1 temporarily). The kinks of d = 3.25 and
// 3.5 are guessed (one per micro-batch's forward); at d = 4.5 the margin says the line ends within
// a layer, so no probe is spent on it. Exact against the event queue, as above.
TEST(SimulatorOracle, LineEndGuessedFromTheMarginsOfItsMaximaMatchesTheEventQueueExactly) {
  int64_t guessed = 0;
  for_each_host_bound_ring([&](const StepCosts& k, const Plan& p, const std::string& w, const SimResult& ref) {
    const SimResult got = simulate_step(k, p, SimRecord::none);
    const SimResult search = simulate_step(k, p, SimRecord::none, kRingClosedFormMinRanks, kPartialSweepMinRanks, false);
    expect_exactly_the_oracle(got, ref, w);
    std::printf("%s: guess %lld jumps (%lld guessed), %lld layers extrapolated, %lld misses; search %lld jumps, %lld layers, %lld misses\n", w.c_str(),
                static_cast<long long>(got.stats.periodic_jumps), static_cast<long long>(got.stats.kinks_predicted),
                static_cast<long long>(got.stats.layers_extrapolated), static_cast<long long>(got.stats.jump_misses),
                static_cast<long long>(search.stats.periodic_jumps), static_cast<long long>(search.stats.layers_extrapolated),
                static_cast<long long>(search.stats.jump_misses));
    EXPECT_EQ(got.stats.jump_misses, 0) << w;
    EXPECT_GT(search.stats.jump_misses, 0) << w << ": the search alone spends probes here";
    EXPECT_GE(got.stats.layers_extrapolated, search.stats.layers_extrapolated) << w;
    guessed += got.stats.kinks_predicted;
  });
  EXPECT_EQ(guessed, 6) << "jumps whose first probe went where the margins put the line's end";
}

// Lines of the 1024-GPU job's rings with recompute end where a rank behind the heaviest one meets
// the others' pace (a maximum changing its argument): Period checks first where the swept layers'
// margins put each line's end (Margins in simulator.cpp). The cp=64 ring is small enough for the
// event queue (2.4M tasks): against it, to the matrix's 1e-9 (jumps round differently), with one
// guess that held and one that failed (a maximum inside the rings, which the tape does not see).
// The cp=256 and cp=512 rings (37M and 148M tasks) against the search alone (predict_line_ends =
// false, itself held to the event queue above), to 1e-9: there every guess must hold, and the
// jumps must extrapolate as many layers as the search's.
TEST(SimulatorOracle, LinesOfLargeRingsEndedWhereTheMarginsSayMatchTheSearch) {
  ModelSpec m = resolve_model(profiles(), "Llama-3.1-70B");
  ClusterSpec cl = resolve_cluster(profiles(), "h100-superpod-1024");
  const RuntimeProfile& rt = resolve_runtime(profiles(), "ctxrun-cuda");
  auto same = [](const SimResult& got, const SimResult& ref, const std::string& w) {
    expect_step_within_1e9(got.time, ref.time, w);
    EXPECT_EQ(got.critical_rep, ref.critical_rep) << w;
    EXPECT_EQ(got.breakdown_rep, ref.breakdown_rep) << w;
    EXPECT_EQ(got.stats.tasks, ref.stats.tasks) << w;
    ASSERT_EQ(got.reps.size(), ref.reps.size()) << w;
    std::vector<double> end(ref.reps.size(), 0.0), busy(ref.reps.size(), 0.0);  // (the event queue's from its tasks)
    for (size_t i = 0; i < ref.reps.size(); ++i) end[i] = ref.reps[i].end_s, busy[i] = ref.reps[i].compute_stream_busy_s;
    if (!ref.tasks.empty()) {
      std::fill(end.begin(), end.end(), 0.0), std::fill(busy.begin(), busy.end(), 0.0);
      for (const SimTask& t : ref.tasks) {
        end[static_cast<size_t>(t.rep)] = std::max(end[static_cast<size_t>(t.rep)], t.end);
        if (t.stream == SimStream::compute) busy[static_cast<size_t>(t.rep)] += t.duration;
      }
    }
    for (size_t i = 0; i < got.reps.size(); ++i) {
      EXPECT_LE(rel(got.reps[i].end_s, end[i]), 1e-9) << w << ": rank end";
      EXPECT_LE(rel(got.reps[i].compute_stream_busy_s, busy[i]), 1e-9) << w << ": rank compute-stream busy";
    }
  };
  auto costs = [&](Plan& p) {
    EXPECT_TRUE(check_plan(p, m, cl, 1048576).ok()) << plan_to_string(p);
    return step_costs(m, cl, rt, p, 1048576, true);
  };
  {
    Plan p = parse_plan("dp=2,tp=8,cp=64,cp_kind=ring,zero=3,recompute=full");
    const StepCosts k = costs(p);
    const SimResult ref = simulate_step_reference(k, p);
    const SimResult got = simulate_step(k, p, SimRecord::none);
    same(got, ref, "cp=64 (vs the event queue)");
    EXPECT_EQ(got.stats.kinks_predicted, 2);
    EXPECT_EQ(got.stats.kink_misses, 1);
  }
  for (const char* text : {"dp=1,tp=4,cp=256,cp_kind=ring,zero=3,recompute=full", "dp=1,tp=2,cp=512,cp_kind=ring,zero=3,recompute=full"}) {
    Plan p = parse_plan(text);
    const StepCosts k = costs(p);
    const SimResult search = simulate_step(k, p, SimRecord::none, kRingClosedFormMinRanks, kPartialSweepMinRanks, false);
    const SimResult got = simulate_step(k, p, SimRecord::none);
    same(got, search, std::string(text) + " (vs the search alone)");
    EXPECT_GE(got.stats.kinks_predicted, 2) << text;
    EXPECT_EQ(got.stats.kink_misses, 0) << text;
    EXPECT_EQ(got.stats.jump_misses, 0) << text << ": no check failed";
    EXPECT_GT(search.stats.jump_misses, 0) << text << ": the search alone fails some";
    EXPECT_GE(got.stats.layers_extrapolated, search.stats.layers_extrapolated) << text;
    std::printf("%s: %lld jumps guessed, %lld layers extrapolated (search alone: %lld failed checks, %lld layers)\n", text,
                static_cast<long long>(got.stats.kinks_predicted), static_cast<long long>(got.stats.layers_extrapolated),
                static_cast<long long>(search.stats.jump_misses), static_cast<long long>(search.stats.layers_extrapolated));
  }
}

// How many ranks leave their line in each alike backward layer, from the oracle's own tasks: per
// rank and layer the latest end on its compute, ring and dp streams; a rank is off its line at
// layer l when one of them moves from l + 1 to l by another amount than from l + 2 to l + 1 (the
// backward runs from the top layer down). With dyadic costs the times are exact: any difference
// is a change of pace, not rounding. Returns, per alike layer below the top two, the ranks off.
std::vector<int> backward_ranks_off_their_lines(const SimResult& ref, int64_t layers) {
  const size_t R = ref.reps.size(), L = static_cast<size_t>(layers);
  constexpr int kStreams[] = {static_cast<int>(SimStream::compute), static_cast<int>(SimStream::ring), static_cast<int>(SimStream::dp)};
  std::vector<double> last(L * R * 3, -1.0);
  for (const SimTask& t : ref.tasks) {
    if (t.layer < 0 || t.micro_batch != 0 || (t.pass != SimPass::backward && t.pass != SimPass::recompute)) continue;
    for (int s = 0; s < 3; ++s)
      if (static_cast<int>(t.stream) == kStreams[s]) {
        double& x = last[(static_cast<size_t>(t.layer) * R + static_cast<size_t>(t.rep)) * 3 + static_cast<size_t>(s)];
        x = std::max(x, t.end);
      }
  }
  std::vector<int> off;
  for (size_t l = 1; l + 3 < L; ++l) {  // layers L-2 .. 1 are alike: l, l + 1, l + 2 all in them
    int n = 0;
    for (size_t r = 0; r < R; ++r) {
      bool moved = false;
      for (size_t s = 0; s < 3; ++s) {
        const double a = last[(l * R + r) * 3 + s], b = last[((l + 1) * R + r) * 3 + s], c = last[((l + 2) * R + r) * 3 + s];
        moved = moved || (a - b) != (b - c);
      }
      n += moved;
    }
    off.push_back(n);
  }
  return off;
}

// Long plain rings whose backward layers leave their lines rank by rank, against the oracle bit
// for bit, with the backward ring swept and in closed form: the dK,dV chain around the ring, the
// recompute pass's forward ring inside the backward layer, with and without the ZeRO-3 gather and
// the gradient reduction (the two collectives joining every rank in a backward layer). The cases
// that matter for a partial sweep of the backward layer loop (issue 15: only the ranks off their
// lines swept) are those where an alike backward layer has some ranks off their lines but at
// most R/8 (the forward's partial sweep's bound); the test counts them from the oracle's tasks
// and requires them, with and without the gather. Same exact-arithmetic setting as above.
TEST(SimulatorOracle, BackwardLayersOfLongRingsLeavingTheirLinesMatchTheEventQueueExactly) {
  std::mt19937 rng(20261128);
  auto pick = [&](std::initializer_list<double> v) { return *(v.begin() + std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)); };
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int cases = 0, few_off = 0, few_off_gathered = 0, few_off_reduced = 0;
  int64_t guessed = 0, guesses_failed = 0;  // Period's jumps checked first at the margins' guess
  for (int trial = 0; trial < 120; ++trial) {
    const int64_t cp = uni(16, 40);
    StepCosts k = plain_ring(cp, uni(12, 24));
    const int rc = uni(0, 2);
    k.recompute = rc == 0 ? Recompute::full : rc == 1 ? Recompute::selective : Recompute::none;
    k.p2p_fwd = pick({0.25, 0.5, 1});
    k.p2p_dkv = pick({0.25, 0.5, 1});
    k.pre_fwd = pick({0.25, 0.5});
    k.mlp_fwd = pick({0.5, 1});
    k.pre_bwd = pick({0.25, 0.5});
    k.post_bwd = pick({0, 0.25});
    k.mlp_bwd = pick({0.5, 1, 2});
    k.zero3_ag = pick({0, 0, 0.5, 4, 16});
    k.grad_reduce = pick({0, 0.5, 4});
    // the backward's costs of a causal ring (rank r busy on its first cp - r steps, or on r + 1
    // with the heaviest rank last), a few ranks heavier or lighter
    const double unit = pick({0.25, 0.5});
    const bool heavy_last = uni(0, 1);
    std::vector<double> weight(static_cast<size_t>(cp), 1.0);
    for (int n = uni(0, 3); n > 0; --n) weight[static_cast<size_t>(uni(0, static_cast<int>(cp) - 1))] = pick({0.5, 2});
    auto costs = [&](double scale) {
      std::vector<std::vector<double>> v(static_cast<size_t>(cp));
      for (int64_t r = 0; r < cp; ++r) {
        const int64_t busy = heavy_last ? r + 1 : cp - r;
        for (int64_t j = 0; j < cp; ++j) v[static_cast<size_t>(r)].push_back(j < busy ? scale * unit * weight[static_cast<size_t>(r)] : 0.0);
      }
      return v;
    };
    k.attn_fwd.push_back(costs(1));
    k.attn_bwd.push_back(costs(2));
    const Plan p = parse_plan("cp=" + std::to_string(cp) + ",cp_kind=ring");
    const std::string w0 = "trial " + std::to_string(trial) + ": cp " + std::to_string(cp) + ", layers " + std::to_string(k.layers) + ", p " +
                           std::to_string(k.p2p_fwd) + ", q " + std::to_string(k.p2p_dkv) + ", unit " + std::to_string(unit) + ", gather " +
                           std::to_string(k.zero3_ag) + ", reduce " + std::to_string(k.grad_reduce) + (heavy_last ? ", heaviest last" : ", heaviest first");
    const SimResult ref = simulate_step_reference(k, p);
    for (int closed_form = 0; closed_form < 2; ++closed_form) {  // the backward ring swept, then rank by rank in closed form
      const SimResult got = simulate_step(k, p, SimRecord::none, closed_form ? 2 : 1 << 30, 4);
      expect_exactly_the_oracle(got, ref, w0 + (closed_form ? " (closed-form backward ring)" : ""));
      guessed += got.stats.kinks_predicted, guesses_failed += got.stats.kink_misses;
    }
    bool few = false;
    for (int n : backward_ranks_off_their_lines(ref, k.layers)) few = few || (n >= 1 && 8 * n <= cp);
    if (few) ++few_off, few_off_gathered += k.zero3_ag > 0, few_off_reduced += k.grad_reduce > 0;
    ++cases;
  }
  EXPECT_EQ(cases, 120);
  std::printf("%d of %d rings have alike backward layers with 1 to R/8 ranks off their lines (%d with the gather, %d with the reduction)\n", few_off,
              cases, few_off_gathered, few_off_reduced);
  std::printf("%lld jumps checked first at the margins' guess, %lld of those checks failed\n", static_cast<long long>(guessed),
              static_cast<long long>(guesses_failed));
  EXPECT_GE(few_off, 10) << "rings with backward layers a partial sweep would take";
  EXPECT_GE(few_off_gathered, 4) << "of them with the ZeRO-3 gather";
  EXPECT_GE(few_off_reduced, 4) << "of them with the gradient reduction";
  EXPECT_GE(few_off - few_off_gathered, 4) << "of them without the ZeRO-3 gather";
}

}  // namespace
}  // namespace ctx
