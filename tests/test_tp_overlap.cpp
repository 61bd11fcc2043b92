// Tensor-parallel communication overlap (plan key tp_overlap: Megatron's --tp-comm-overlap, Transformer
// Engine's userbuffers; costmodel/tp_overlap.hpp). Proves:
//   - the closed forms of the three overlap methods equal the schedule TE's stream dependencies build,
//     run chunk by chunk (transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp:
//     split_overlap_ag: GEMM chunk i+1 waits for hop i, the hops wait only for each other;
//     split_overlap_rs (pipeline): the reduce-scatter of chunk i waits for GEMM chunk i and the previous
//     reduce-scatter; bulk_overlap: the collective beside the GEMM on num_sm of the SMs);
//   - one layer at tp=4, by hand: with overlap the layer's SP collectives leave the TP stream and each
//     fused GEMM+collective costs what the schedule says beyond its GEMM, in the comm-bound and the
//     compute-bound regime, in the closed form and the simulator alike;
//   - Transformer Engine's userbuffers are device memory: ten [seq x mbs / cp, hidden] buffers (initialize_ub),
//     the six all-gather ones in FP8 under FP8, by hand for Llama-3.1-70B;
//   - tp_overlap=1 is refused with tp=1 and without SP, naming the key, and by a runtime that does not
//     state the capability.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "costmodel/errors.hpp"
#include "costmodel/framework_memory.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/runtime_capabilities.hpp"
#include "costmodel/simulator.hpp"
#include "costmodel/step_model.hpp"
#include "costmodel/tp_overlap.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(std::string(CTXPLAN_SOURCE_DIR) + "/profiles");
  return p;
}

// ---- the schedules, chunk by chunk, as TE's streams order them (the reference for the closed forms)
double ring_exchange_by_chunks(double gemm, double hop, int tp) {
  double gemm_end = 0, arrived = 0;  // hop i arrives at (i+1) * hop: the send stream waits only for the previous receive
  for (int i = 0; i < tp; ++i) {
    const double start = std::max(gemm_end, i == 0 ? 0.0 : arrived);  // chunk 0 is the rank's own shard
    gemm_end = start + gemm;
    if (i + 1 < tp) arrived += hop;
  }
  return std::max(gemm_end, arrived);
}
double pipeline_rs_by_chunks(double gemm, double rs, int splits) {
  double gemm_end = 0, rs_end = 0;
  for (int i = 0; i < splits; ++i) {
    gemm_end += gemm;                          // GEMM chunks back to back
    rs_end = std::max(rs_end, gemm_end) + rs;  // chunk i's RS after its GEMM and the previous RS
  }
  return rs_end;
}

TEST(TpOverlapSchedules, ClosedFormsEqualTheChunkByChunkSchedule) {
  std::mt19937 rng(16);
  std::uniform_real_distribution<double> t(1e-5, 1e-2);
  for (int trial = 0; trial < 2000; ++trial) {
    const double g = t(rng), p = t(rng);
    for (int tp : {2, 4, 8}) EXPECT_NEAR(ring_exchange_seconds(g, p, tp), ring_exchange_by_chunks(g, p, tp), 1e-15) << g << " " << p << " " << tp;
    for (int n : {1, 2, 4}) EXPECT_NEAR(pipeline_rs_seconds(g, p, n), pipeline_rs_by_chunks(g, p, n), 1e-15) << g << " " << p << " " << n;
  }
}

TEST(TpOverlapSchedules, HandNumbers) {
  // ring exchange, tp=4, 1 ms chunks: 0.5 ms hops hide behind the chunks (4 ms: the GEMM alone); 2 ms hops
  // leave 3 x (2 - 1) ms exposed (1 + 3 x 2 = 7 ms)
  EXPECT_DOUBLE_EQ(ring_exchange_seconds(1e-3, 0.5e-3, 4), 4e-3);
  EXPECT_DOUBLE_EQ(ring_exchange_seconds(1e-3, 2e-3, 4), 7e-3);
  EXPECT_DOUBLE_EQ(ring_exchange_seconds(1e-3, 2e-3, 4, 0.25e-3), 7.25e-3);  // RS form: the final reduction after
  // pipeline, 4 splits of 1 ms: the last chunk's 0.5 ms RS is exposed (4.5 ms); 2 ms RS chunks: 1 + 4 x 2 = 9 ms
  EXPECT_DOUBLE_EQ(pipeline_rs_seconds(1e-3, 0.5e-3, 4), 4.5e-3);
  EXPECT_DOUBLE_EQ(pipeline_rs_seconds(1e-3, 2e-3, 4), 9e-3);
  // bulk: a 4 ms collective on 24 of 132 SMs beside a 10 ms GEMM slows it by 4 x 24/132 ms; a 14 ms one
  // outlasts it (the GEMM, at 108/132 of its speed, needs 12.2 ms); a 12 ms one does not (10 + 12 x 24/132 = 12.18 ms)
  EXPECT_DOUBLE_EQ(bulk_overlap_seconds(10e-3, 4e-3, 24.0 / 132.0), 10e-3 + 4e-3 * 24.0 / 132.0);
  EXPECT_DOUBLE_EQ(bulk_overlap_seconds(10e-3, 14e-3, 24.0 / 132.0), 14e-3);
  EXPECT_DOUBLE_EQ(bulk_overlap_seconds(10e-3, 12e-3, 24.0 / 132.0), 10e-3 + 12e-3 * 24.0 / 132.0);
}

// One Llama-2-7B layer at tp=4 (sp on), 4096 tokens, on a test GPU whose GEMMs run at exactly half the
// bf16 peak at every size (a flat curve), without launch costs or link latency, so every term is arithmetic.
struct OneLayer {
  ModelSpec m;
  ClusterSpec c;
  RuntimeProfile rt;
  OneLayer(double nvlink_bytes_per_second) {
    m = resolve_model(profiles(), "Llama-2-7B");
    m.layers = 1;
    c = make_cluster(resolve_hardware(profiles(), "h100"), 1, 4);
    c.gpu.kernels.gemm.points = {{1.0, 0.5}};
    c.gpu.kernels.launch_seconds = 0;
    c.gpu.collectives.launch_seconds = 0;
    c.gpu.collectives.p2p = c.gpu.collectives.all_gather = c.gpu.collectives.reduce_scatter = 1.0;
    c.intra_latency_seconds = 0;
    c.intra_bytes_per_second = nvlink_bytes_per_second;
    c.gpu.sm_count = 132;
    rt = resolve_runtime(profiles(), "megatron");
    rt.gemm_efficiency_scale = rt.attention_efficiency_scale = rt.comm_efficiency_scale = 1.0;
    rt.step_overhead_seconds = 0;
    rt.tp_overlap_rs_splits = 4;
    rt.tp_overlap_proj_fprop_sms = 24;
    rt.tp_overlap_fc2_fprop_sms = 16;
    rt.tp_overlap_qkv_dgrad_sms = 4;
    rt.tp_overlap_qkv_wgrad_sms = 24;
    rt.tp_overlap_fc1_dgrad_sms = 2;
    rt.tp_overlap_fc1_wgrad_sms = 4;
  }
  Plan plan(bool overlap) const {
    Plan p = parse_plan(std::string("tp=4,dp=1") + (overlap ? ",tp_overlap=1" : ""));
    EXPECT_TRUE(check_plan(p, m, c, 4096).ok());
    return p;
  }
  StepCosts costs(bool overlap) const { return step_costs(m, c, rt, plan(overlap), 4096); }
};

// By hand for Llama-2-7B (h = 4096, 32 heads of 128, FFN 11008, SwiGLU) at T = 4096 tokens, tp = 4:
// per rank the QKV GEMM is 2 T h (3 h / 4) FLOP, the output projection 2 T (h/4) h, FC1 2 T h (2 x 11008/4),
// FC2 2 T (11008/4) h; one SP shard is T/4 x h x 2 bytes; the full activation T x h x 2 bytes.
struct Hand {
  double peak, bw;
  double T = 4096, h = 4096, F = 11008 / 4.0, tp = 4;
  double gemm(double flops) const { return flops / (0.5 * peak); }
  double qkv() const { return gemm(2 * T * h * 3 * h / tp); }
  double o() const { return gemm(2 * T * h / tp * h); }
  double up() const { return gemm(2 * T * h * 2 * F); }
  double down() const { return gemm(2 * T * F * h); }
  double hop() const { return T / tp * h * 2 / bw; }                          // one shard, p2p
  double ag() const { return T * h * 2 * (tp - 1) / tp / bw; }                // ring all-gather of the activation
  double rs_chunk() const { return T * h * 2 / 4 * (tp - 1) / tp / bw; }      // a quarter of it reduce-scattered
  double ring(double G) const { return std::max(tp * G / tp, G / tp + (tp - 1) * hop()) - G; }
  double pipe(double G, double sms) const {
    const double g = G / 4 * 132 / (132 - sms), r = rs_chunk();
    return std::max(4 * g + r, g + 4 * r) - G;
  }
  double bulk(double G, double sms) const { return std::max(ag(), G + ag() * sms / 132) - G; }  // AG and RS of T h 2 B cost the same here
};

void expect_one_layer_by_hand(double nvlink) {
  const OneLayer job(nvlink);
  const Hand x{job.c.gpu.peak_bf16_flops, nvlink};
  const StepCosts off = job.costs(false), on = job.costs(true);
  const double tol = 1e-12;
  // without overlap: the collectives on the TP stream, as the model always priced them
  EXPECT_NEAR(off.tp_ag, x.ag(), tol);
  EXPECT_NEAR(off.tp_rs, x.ag(), tol);
  // with overlap: the layer's collectives leave the TP stream; the embedding's and the head's stay
  EXPECT_EQ(on.tp_ag, 0.0);
  EXPECT_EQ(on.tp_rs, 0.0);
  EXPECT_NEAR(on.tp_ag_ends, off.tp_ag, tol);
  EXPECT_NEAR(on.tp_rs_ends, off.tp_rs, tol);
  // each fused operation's time beyond its GEMM, in the op that holds the GEMM
  EXPECT_NEAR(on.pre_fwd - off.pre_fwd, x.ring(x.qkv()), tol);
  EXPECT_NEAR(on.post_fwd - off.post_fwd, x.pipe(x.o(), 24), tol);
  EXPECT_NEAR(on.mlp_fwd - off.mlp_fwd, x.ring(x.up()) + x.pipe(x.down(), 16), tol);
  EXPECT_NEAR(on.post_bwd - off.post_bwd, x.ring(x.o()), tol);
  EXPECT_NEAR(on.pre_bwd - off.pre_bwd, x.bulk(x.qkv(), 4) + x.bulk(x.qkv(), 24), tol);
  EXPECT_NEAR(on.mlp_bwd - off.mlp_bwd, x.ring(x.down()) + x.bulk(x.up(), 2) + x.bulk(x.up(), 4), tol);
  // the step: the TP stream's 2 AG + 2 RS (forward) and 4 AG + 2 RS (backward) of the layer replaced by
  // the fused operations' excess; the closed form reports that excess as exposed communication
  const double excess = on.tp_overlap_fwd + on.tp_overlap_bwd;
  const double removed = 2 * (x.ag() + x.ag()) + 2 * (2 * x.ag() + x.ag());
  const StepTime t_off = estimate_step(off), t_on = estimate_step(on);
  EXPECT_NEAR(t_on.step_seconds - t_off.step_seconds, excess - removed, 1e-9 * t_off.step_seconds);
  EXPECT_NEAR(t_on.breakdown.compute, t_off.breakdown.compute, 1e-9 * t_off.step_seconds);
  // the simulator runs the same schedule (no recompute, one layer: compute and TP in series); it differs from
  // the closed form only in where the SP norm-gradient fix-ups (all-reduces of h fp32 on the TP stream, off
  // the compute stream) land: the closed form charges them in full, the simulator hides what it can
  const StepTime s_off = simulate_step(off, job.plan(false)).time, s_on = simulate_step(on, job.plan(true)).time;
  const double fixups = (on.tp_fixups_norm_per_layer + on.tp_fixups_norm_final) * on.tp_fixup_norm;
  ASSERT_GT(fixups, 0.0);
  EXPECT_NEAR(s_on.step_seconds - s_off.step_seconds, excess - removed, fixups + 1e-9 * t_off.step_seconds);
}

TEST(TpOverlapOneLayer, CommBoundRegimeByHand) {
  // 20 GB/s links: a shard's hop (8 MiB, 0.42 ms) outlasts a GEMM chunk, (tp-1)(hop - chunk) stays exposed
  const Hand x{resolve_hardware(profiles(), "h100").peak_bf16_flops, 20e9};
  ASSERT_GT(x.hop(), x.qkv() / 4);
  expect_one_layer_by_hand(20e9);
}

TEST(TpOverlapOneLayer, ComputeBoundRegimeByHand) {
  // 900 GB/s: every hop (9.3 us) hides behind its chunk (the smallest, the output projection's, 17 us);
  // what remains is the SMs the pipelined reduce-scatters and bulk collectives take, and the last RS chunk
  const Hand x{resolve_hardware(profiles(), "h100").peak_bf16_flops, 900e9};
  ASSERT_LT(x.hop(), x.o() / 4);
  expect_one_layer_by_hand(900e9);
  const OneLayer job(900e9);
  const StepCosts off = job.costs(false), on = job.costs(true);
  EXPECT_LT(estimate_step(on).step_seconds, estimate_step(off).step_seconds);
}

TEST(TpOverlapMemory, UserbuffersByHandForLlama70B) {
  // Llama-3.1-70B (hidden 8192), seq 8192, mbs 1, cp 1, tp 4: each buffer [8192, 8192]; FP8: six all-gather
  // buffers of 1 byte and four reduce-scatter ones of 2 (the pipelined RS of proj/FC2 holds one shape):
  // 8192 x 8192 x (6 + 8) = 939,524,096 bytes; bf16: 8192 x 8192 x 20
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-70B");
  const ClusterSpec c = resolve_cluster(profiles(), "8x8xh100");
  const RuntimeProfile rt = resolve_runtime(profiles(), "megatron");
  auto runtime_bytes = [&](const std::string& text) {
    Plan p = parse_plan(text);
    EXPECT_TRUE(check_plan(p, m, c, 8192).ok()) << text;
    const MemoryPrediction mp = predict_memory(m, c, rt, p, 8192);
    double ub = -1;
    for (int i = 0; i < mp.framework.count; ++i)
      if (std::string(mp.framework.terms[i].name) == "te_userbuffers") ub = mp.framework.terms[i].bytes;
    return std::make_pair(mp.peak[Mem::runtime], ub);
  };
  const auto fp8_on = runtime_bytes("tp=4,pp=8,vpp=5,zero=1,ga=64,precision=fp8,tp_overlap=1");
  const auto fp8_off = runtime_bytes("tp=4,pp=8,vpp=5,zero=1,ga=64,precision=fp8");
  EXPECT_DOUBLE_EQ(fp8_on.second, 8192.0 * 8192.0 * 14.0);
  EXPECT_EQ(fp8_off.second, -1.0);  // no term without the overlap
  EXPECT_DOUBLE_EQ(fp8_on.first - fp8_off.first, 8192.0 * 8192.0 * 14.0);
  EXPECT_DOUBLE_EQ(runtime_bytes("tp=4,pp=8,vpp=5,zero=1,ga=64,tp_overlap=1").second, 8192.0 * 8192.0 * 20.0);
  // a ring-exchange RS (Megatron-Bridge's FP8 configurations) holds 2 tp - 1 shards of tp: 7/4 of the shape each
  RuntimeProfile ring = rt;
  ring.tp_overlap_rs_splits = 0;
  Plan p = parse_plan("tp=4,pp=8,vpp=5,zero=1,ga=64,precision=fp8,tp_overlap=1");
  EXPECT_DOUBLE_EQ(te_userbuffer_bytes(m, ring, p, 8192), 8192.0 * 8192.0 * (6.0 + 2.0 * 2.0 * 7.0 / 4.0 + 4.0));
}

TEST(TpOverlapPlan, RefusedWithTpOneAndWithoutSequenceParallelNamingTheKey) {
  const ModelSpec m = resolve_model(profiles(), "Llama-2-7B");
  const ClusterSpec c = resolve_cluster(profiles(), "8xh100");
  Plan one = parse_plan("tp=1,tp_overlap=1");
  PlanCheck r = check_plan(one, m, c, 4096);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.errors[0].find("tp_overlap=1"), std::string::npos) << r.errors[0];
  EXPECT_NE(r.errors[0].find("tp > 1"), std::string::npos) << r.errors[0];
  Plan nosp = parse_plan("tp=2,sp=0,tp_overlap=1");
  r = check_plan(nosp, m, c, 4096);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.errors[0].find("sp=1"), std::string::npos) << r.errors[0];
  Plan fine = parse_plan("tp=2,tp_overlap=1");
  EXPECT_TRUE(check_plan(fine, m, c, 4096).ok());
  EXPECT_THROW(parse_plan("tp=2,tp_overlap=yes please"), InputError);
}

TEST(TpOverlapPlan, OnlyARuntimeThatStatesItRunsIt) {
  const Plan p = parse_plan("tp=2,tp_overlap=1");
  const RuntimeProfile meg = resolve_runtime(profiles(), "megatron"), tt = resolve_runtime(profiles(), "torchtitan");
  EXPECT_EQ(missing_capability(meg.capabilities, meg.name, p), "");
  const std::string no = missing_capability(tt.capabilities, tt.name, p);
  EXPECT_NE(no.find("tp_overlap=1"), std::string::npos) << no;
}

TEST(TpOverlapPlan, RoundTripsThroughTextAndJson) {
  const Plan p = parse_plan("tp=4,tp_overlap=1");
  EXPECT_TRUE(p.tp_overlap);
  EXPECT_NE(plan_to_string(p).find("tp_overlap=1"), std::string::npos);
  EXPECT_TRUE(plan_from_json(plan_to_json(p), "test").tp_overlap);
  EXPECT_FALSE(plan_from_json(plan_to_json(parse_plan("tp=4")), "test").tp_overlap);
}

}  // namespace
}  // namespace ctx
