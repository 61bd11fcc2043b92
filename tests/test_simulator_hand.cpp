// Schedules small enough to derive by hand (issue 15): the exact step time and breakdown of a few
// hand-built StepCosts, each worked out in the comments, so that a systematically optimistic (or
// pessimistic) overlap cannot pass. Every cost not named is 0: zero-duration compute tasks still
// exist (they only order the stream), zero-duration collectives, p2p hops and copies vanish except
// ring hops and dK,dV hops, which always exist. Each case is checked on the streaming sweep (also
// with the backward ring rank by rank in closed form), the recording mode and the event-queue oracle.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "costmodel/plan.hpp"
#include "costmodel/simulator.hpp"
#include "costmodel/step_model.hpp"

namespace ctx {
namespace {

StepCosts bare(int64_t layers, int64_t cp, CpKind kind) {
  StepCosts k;
  k.layers = layers;
  k.cp = cp;
  k.ring = cp;
  k.cp_kind = kind;
  k.world = cp;
  k.tokens_per_step = 1;
  k.peak_flops = 1;
  return k;
}

struct Expect {
  double step, compute, exposed_comm, imbalance;
};

void check(const StepCosts& k, const std::string& plan, const Expect& e, const std::string& what) {
  Plan p = parse_plan(plan);
  for (int impl = 0; impl < 4; ++impl) {
    SimResult r = impl == 0   ? simulate_step(k, p, SimRecord::none)
                  : impl == 1 ? simulate_step(k, p, SimRecord::tasks)
                  : impl == 2 ? simulate_step_reference(k, p)
                              : simulate_step(k, p, SimRecord::none, 2);  // the backward ring rank by rank in closed form
    const std::string w = what + (impl == 0   ? " (streaming)"
                                  : impl == 1 ? " (recording)"
                                  : impl == 2 ? " (event-queue oracle)"
                                              : " (streaming, backward ring in closed form)");
    EXPECT_DOUBLE_EQ(r.time.step_seconds, e.step) << w;
    EXPECT_DOUBLE_EQ(r.time.breakdown.compute, e.compute) << w;
    EXPECT_DOUBLE_EQ(r.time.breakdown.exposed_comm, e.exposed_comm) << w;
    EXPECT_DOUBLE_EQ(r.time.breakdown.imbalance, e.imbalance) << w;
    EXPECT_DOUBLE_EQ(r.time.breakdown.offload_stall, 0) << w;
    EXPECT_DOUBLE_EQ(r.time.breakdown.optimizer, 0) << w;
  }
}

// Ring of 3, one layer, every rank the same work (one simulated rank stands for the three; its ring
// neighbour is itself, the schedule is the ring's): attention forward c = 1 per step, backward
// b = 2 per step, K,V hop p, dK,dV hop q = 0.5.
//
// p = 0.5 (hop shorter than compute). Forward: recv0 [0, .5], compute0 [0, 1]; recv1 after recv0
// [.5, 1], compute1 [1, 2] (its block arrived at .5); compute2 [2, 3] (block at 1). F = 3.
// Backward (ring stream: recv0, dkv0, recv1, dkv1, dkv2 in order): recv0 [3, 3.5], compute0 [3, 5];
// dkv0 after compute0 (the neighbour's, itself) [5, 5.5]; recv1 behind dkv0 [5.5, 6]; compute1
// [5, 7]; dkv1 after compute1 [7, 7.5]; compute2 [7, 9] (block at 6); dkv2 [9, 9.5]; the dK,dV sum
// waits for dkv2: 9.5. Step 9.5 = compute 3 + 6, exposed 0.5 (the last hop home).
TEST(SimulatorHand, RingOfThreeHopShorterThanCompute) {
  StepCosts k = bare(1, 3, CpKind::ring);
  k.attn_fwd = {{{1, 1, 1}, {1, 1, 1}, {1, 1, 1}}};
  k.attn_bwd = {{{2, 2, 2}, {2, 2, 2}, {2, 2, 2}}};
  k.p2p_fwd = 0.5;
  k.p2p_dkv = 0.5;
  check(k, "cp=3,cp_kind=ring", {9.5, 9, 0.5, 0}, "ring of 3, p = 0.5");
}

// p = 2 (hop longer than the forward's compute, equal to the backward's). Forward: recv0 [0, 2],
// compute0 [0, 1]; recv1 [2, 4], compute1 waits for its block: [2, 3] (1 exposed); compute2 [4, 5]
// (1 exposed). F = 5. Backward: recv0 [5, 7] (the forward's recv1 ended at 4), compute0 [5, 7];
// dkv0 [7, 7.5]; recv1 behind it [7.5, 9.5]; compute1 [7, 9] (block at 7); dkv1 after recv1
// [9.5, 10]; compute2 waits for recv1: [9.5, 11.5] (0.5 exposed); dkv2 [11.5, 12]; the sum at 12
// (0.5 exposed). Step 12 = compute 9 + exposed 1 + 1 + 0.5 + 0.5.
TEST(SimulatorHand, RingOfThreeHopLongerThanCompute) {
  StepCosts k = bare(1, 3, CpKind::ring);
  k.attn_fwd = {{{1, 1, 1}, {1, 1, 1}, {1, 1, 1}}};
  k.attn_bwd = {{{2, 2, 2}, {2, 2, 2}, {2, 2, 2}}};
  k.p2p_fwd = 2;
  k.p2p_dkv = 0.5;
  check(k, "cp=3,cp_kind=ring", {12, 9, 3, 0}, "ring of 3, p = 2");
}

// 2 ranks x 2 layers, plain causal ring with free hops (p = q = 0): rank 0 holds the first half
// (step 0: its diagonal 1, step 1: rank 1's block, masked, 0), rank 1 the second (1, then rank
// 0's block, 2); backward twice that. The hops cost nothing, but a rank receives a block only once
// its neighbour holds it, so the ranks wait for each other.
// Forward layer 0: r0 compute [0, 1], [1, 1]; r1 [0, 1], [1, 3]. Layer 1: the step-0 hop needs the
// sender's layer-0 output: both recv at 3; r0 computes [1, 2] then its step 1 waits for the block:
// [3, 3]; r1 [3, 4], [4, 6]. Backward layer 1 (from 3 and 6): recv at 6 for both; r0 compute0
// [3, 5], r1 [6, 8]; dkv0: r0's waits for r1's compute0 (8), r1's for r0's (5, but behind its recv:
// 6); r0 compute1 [6, 6] (block at 6), r1 [8, 12]; dkv1: r0's after r1's compute1: 12, r1's after
// r0's dkv0: 8; sums: r0 12, r1 max(12, 8) = 12. Backward layer 0 from 12: compute0 [12, 14] both;
// dkv0 at 14; r0 compute1 [14, 14], r1 [14, 18]; r0's dkv1 after r1's compute1: 18; sums at 18.
// Step 18, on both ranks. The breakdown is taken on the rank with least compute, r0 (6 busy):
// layer 1 forward step 1 waits 2 -> 3 for a hop that was ready at 1 but waited for r1: imbalance 1;
// layer 1 backward step 1 waits 5 -> 6, its hop ready at 3 and started at 6 for r1: imbalance 1;
// the layer-1 sum waits 6 -> 12 for its dkv1 (ready at 8 on r0, started at 12 for r1): 4 imbalance,
// 2 exposed; the layer-0 sum waits 14 -> 18 for dkv1 (ready 14, started 18): imbalance 4.
// 6 + 10 + 2 = 18.
TEST(SimulatorHand, TwoRanksTwoLayersCausalRing) {
  StepCosts k = bare(2, 2, CpKind::ring);
  k.attn_fwd = {{{1, 0}, {1, 2}}};
  k.attn_bwd = {{{2, 0}, {2, 4}}};
  check(k, "cp=2,cp_kind=ring", {18, 6, 2, 10}, "2 ranks x 2 layers");
}

// ZeRO-3, one rank, 2 layers: each layer's gather g on the dp stream, the MLP m = 3 forward, 2
// backward (all else 0). The forward gathers layer 0, then prefetches layer 1 behind it; the
// backward gathers layer 1, then prefetches layer 0.
// g = 1 (gather shorter than a layer): ag0 [0, 1], ag1 [1, 2]; layer 0 [1, 4] (1 exposed); layer 1
// [4, 7]. Backward: ag1 [7, 8], ag0 [8, 9]; layer 1 [8, 10] (1 exposed), layer 0 [10, 12].
// Step 12 = compute 10 + exposed 2.
// g = 4 (longer): ag0 [0, 4], ag1 [4, 8]; layer 0 [4, 7] (4 exposed); layer 1 [8, 11] (1 exposed).
// Backward: ag1 [11, 15], ag0 [15, 19]; layer 1 [15, 17] (4 exposed); layer 0 [19, 21] (2 exposed).
// Step 21 = compute 10 + exposed 11.
TEST(SimulatorHand, ZeroThreePrefetch) {
  for (double g : {1.0, 4.0}) {
    StepCosts k = bare(2, 1, CpKind::zigzag);
    k.attn_fwd = {{{0}}};
    k.attn_bwd = {{{0}}};
    k.mlp_fwd = 3;
    k.mlp_bwd = 2;
    k.zero3_ag = g;
    if (g == 1.0) check(k, "zero=3", {12, 10, 2, 0}, "ZeRO-3 prefetch, g = 1");
    else check(k, "zero=3", {21, 10, 11, 0}, "ZeRO-3 prefetch, g = 4");
  }
}

}  // namespace
}  // namespace ctx
