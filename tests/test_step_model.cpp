// The op cost model (step_costs) and the closed-form step estimate against closed forms: the
// dense 6N FLOPs per token, the causal attention term, exact per-step ring/zig-zag work, what TP,
// fp8, document masks and recomputation change, and the closed form against the event simulator.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "costmodel/attention_work.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/simulator.hpp"
#include "costmodel/step_model.hpp"
#include "built_in_profiles.hpp"

namespace ctx {
namespace {

using Job = testing::PricedJob;

Job job(const std::string& plan_text, int64_t seq, const std::string& model = "Llama-3.1-8B", const std::string& cluster = "8xh100",
        const std::string& runtime = "ctxrun-cuda") {
  return testing::built_in_job(plan_text, seq, model, cluster, runtime);
}

StepCosts costs(const Job& j, bool per_step = true) { return step_costs(j.m, j.c, j.rt, j.p, j.seq, per_step); }

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-300); }

double forward_flops(const StepCosts& k) {
  double f = 0;
  for (auto& o : k.forward_ops) f += o.flops;
  return f;
}

// Matmul parameters of one layer and of the head, written out from the model's fields (the
// reference: Wq, Wk, Wv, Wo and the MLP's matrices; the output head is a matmul even when tied).
double matmul_params(const ModelSpec& m) {
  const double h = static_cast<double>(m.hidden), q = static_cast<double>(m.heads * m.head_dim),
               kv = static_cast<double>(m.kv_heads * m.head_dim), f = static_cast<double>(m.ffn);
  const double mlp_mats = m.activation == ActivationKind::swiglu ? 3.0 : 2.0;
  return static_cast<double>(m.layers) * (h * q + 2.0 * h * kv + q * h + mlp_mats * h * f) + static_cast<double>(m.vocab) * h;
}

// ---- FLOP counts --------------------------------------------------------------------------------

TEST(StepModel, DenseForwardFlopsAreOneThirdOfSixN) {
  // tp = cp = 1, mbs = 1: layers x (one layer's forward GEMMs) + the head's 2*seq*hidden*vocab is
  // the forward third of 6N per token. Models without q/k/v biases or q/k norms (whose few
  // parameters are not matmuls), SwiGLU and GELU MLPs.
  for (const char* model : {"Llama-3.1-8B", "Llama-3.1-70B", "Llama-2-7B", "MPT-7B"}) {
    const int64_t seq = 8192;
    Job j = job("dp=1", seq, model, "1xh100");
    StepCosts k = costs(j);
    const ModelSpec& m = j.m;
    double head = 2.0 * seq * static_cast<double>(m.hidden) * static_cast<double>(m.vocab);
    double fwd = static_cast<double>(m.layers) * forward_flops(k) + head;
    EXPECT_LT(rel(fwd, dense_train_flops_per_token(m) * seq / 3.0), 1e-9) << model;
    EXPECT_LT(rel(fwd, 2.0 * matmul_params(m) * seq), 1e-9) << model;
  }
}

TEST(StepModel, BackwardGemmFlopsAreTwiceForward) {
  struct Case { const char* plan; const char* cluster; };
  for (const Case c : {Case{"dp=1", "1xh100"}, Case{"tp=2,cp=4,cp_kind=zigzag", "8xh100"}, Case{"tp=8,dp=1", "8xh100"},
                       Case{"cp=8,cp_kind=ulysses,tiled_mlp=auto", "8xh100"}}) {
    const char* plan = c.plan;
    Job j = job(plan, 65536, "Llama-3.1-8B", c.cluster);
    StepCosts k = costs(j);
    ASSERT_EQ(k.forward_ops.size(), k.backward_ops.size());
    double total_f = 0;
    for (size_t i = 0; i < k.forward_ops.size(); ++i) {
      EXPECT_DOUBLE_EQ(k.backward_ops[i].flops, 2.0 * k.forward_ops[i].flops) << plan << " op " << k.forward_ops[i].name;
      total_f += k.forward_ops[i].flops;
    }
    EXPECT_GT(total_f, 0) << plan;
  }
}

TEST(StepModel, ModelFlopsAreSixNTokensPlusCausalAttention) {
  // model FLOPs per step = 6N x tokens + 12 x head_dim x heads x (query-key pairs) x layers, with
  // causal pairs N(N+1)/2 per sequence, or the sum over documents under intra-document masking
  struct Case { const char* plan; int64_t seq; double pairs_per_seq; };
  const double s1 = 65536, s2 = 16384, d = 2048;
  const Case cases[] = {
      {"dp=2,cp=4,cp_kind=zigzag,ga=2", 65536, s1 * (s1 + 1) / 2},
      {"dp=8,mbs=2", 16384, s2 * (s2 + 1) / 2},
      {"dp=1,cp=8,cp_kind=ring,mask=doc:2048", 16384, (s2 / d) * d * (d + 1) / 2},
      {"dp=1,tp=2,cp=4,cp_kind=usp,ulysses=2", 65536, s1 * (s1 + 1) / 2},
  };
  for (const Case& c : cases) {
    Job j = job(c.plan, c.seq);
    StepCosts k = costs(j);
    const ModelSpec& m = j.m;
    double seqs = static_cast<double>(j.p.dp * j.p.mbs * j.p.ga);
    double tokens = seqs * static_cast<double>(c.seq);
    double expect = 6.0 * matmul_params(m) * tokens +
                    12.0 * static_cast<double>(m.head_dim * m.heads) * c.pairs_per_seq * static_cast<double>(m.layers) * seqs;
    EXPECT_LT(rel(k.model_flops, expect), 1e-12) << c.plan;
    EXPECT_DOUBLE_EQ(k.tokens_per_step, tokens) << c.plan;
    if (j.p.mask == MaskKind::causal) {  // the model spec's own causal-attention formula agrees
      double attn = causal_attention_train_flops_per_token(m, c.seq) * tokens;
      EXPECT_LT(rel(k.model_flops, dense_train_flops_per_token(m) * tokens + attn), 1e-12) << c.plan;
    }
  }
}

TEST(StepModel, RingAndZigZagStepsSumToTheCausalTotal) {
  const int64_t seq = 65536;
  const double causal = static_cast<double>(seq) * (seq + 1) / 2.0;
  for (const char* plan : {"cp=8,cp_kind=ring", "cp=8,cp_kind=zigzag", "cp=4,cp_kind=zigzag", "cp=2,cp_kind=ring",
                           "cp=8,cp_kind=allgather", "cp=8,cp_kind=ulysses", "cp=8,cp_kind=usp,ulysses=2",
                           "cp=8,cp_kind=usp,ulysses=4"}) {
    Plan p = parse_plan(plan);
    p.dp = 1;
    auto w = attention_pairs_per_step(p, seq);
    ASSERT_EQ(static_cast<int64_t>(w.size()), p.cp) << plan;
    double total = 0;
    for (auto& steps : w) total = std::accumulate(steps.begin(), steps.end(), total);
    EXPECT_LT(rel(total, causal), 1e-12) << plan;
  }
}

TEST(StepModel, ZigZagStepsAreEqualAcrossRanksPlainRingStepsAreNot) {
  // plain ring, chunk c = N/cp: at step j rank i pairs its queries with chunk (i-j) mod cp:
  // c(c+1)/2 on the diagonal, c^2 from an earlier chunk, 0 from a later one.
  const int64_t seq = 65536, cp = 8;
  const double c = static_cast<double>(seq / cp);
  Plan ring = parse_plan("cp=8,cp_kind=ring"), zz = parse_plan("cp=8,cp_kind=zigzag");
  ring.dp = zz.dp = 1;
  auto wr = attention_pairs_per_step(ring, seq), wz = attention_pairs_per_step(zz, seq);
  for (int64_t i = 0; i < cp; ++i) {
    ASSERT_EQ(static_cast<int64_t>(wr[i].size()), cp);
    for (int64_t j = 0; j < cp; ++j) {
      int64_t src = ((i - j) % cp + cp) % cp;
      double expect = src == i ? c * (c + 1) / 2 : src < i ? c * c : 0.0;
      EXPECT_DOUBLE_EQ(wr[i][j], expect) << "rank " << i << " step " << j;
    }
  }
  // zig-zag (chunk c = N/2cp, rank i holds chunks i and 2cp-1-i): step 0 c(c+1) + c^2, every
  // later step 2c^2, on every rank
  const double z = static_cast<double>(seq / (2 * cp));
  for (int64_t i = 0; i < cp; ++i)
    for (int64_t j = 0; j < cp; ++j) EXPECT_DOUBLE_EQ(wz[i][j], j == 0 ? z * (z + 1) + z * z : 2 * z * z) << i << " " << j;
  // so per-rank totals: zig-zag equal, plain ring spread
  auto total = [](const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); };
  for (int64_t i = 1; i < cp; ++i) {
    EXPECT_DOUBLE_EQ(total(wz[i]), total(wz[0]));
    EXPECT_GT(total(wr[i]), total(wr[i - 1]));
  }
}

TEST(StepModel, TensorParallelHalvesPerRankGemmFlops) {
  // 8 KV heads: tp=2 and tp=4 split every projection exactly (no KV replication)
  for (const char* model : {"Llama-3.1-8B", "Llama-3.1-70B"}) {
    StepCosts k1 = costs(job("dp=1,tp=1", 32768, model, "1xh100"));
    StepCosts k2 = costs(job("dp=1,tp=2", 32768, model, "2xh100"));
    StepCosts k4 = costs(job("dp=1,tp=4", 32768, model, "4xh100"));
    for (size_t i = 0; i < k1.forward_ops.size(); ++i) {
      EXPECT_DOUBLE_EQ(k2.forward_ops[i].flops, k1.forward_ops[i].flops / 2) << model << " " << k1.forward_ops[i].name;
      EXPECT_DOUBLE_EQ(k4.forward_ops[i].flops, k1.forward_ops[i].flops / 4) << model << " " << k1.forward_ops[i].name;
    }
    // and the attention core: heads split, pairs unchanged
    EXPECT_LT(k2.attn_fwd[0][0][0], k1.attn_fwd[0][0][0]);
  }
}

TEST(StepModel, Fp8SpeedsUpGemmsButNotAttention) {
  StepCosts bf = costs(job("cp=8,cp_kind=zigzag", 131072));
  StepCosts f8 = costs(job("cp=8,cp_kind=zigzag,precision=fp8", 131072));
  for (size_t i = 0; i < bf.forward_ops.size(); ++i) {
    if (bf.forward_ops[i].flops > 0) {
      EXPECT_LT(f8.forward_ops[i].seconds, bf.forward_ops[i].seconds) << bf.forward_ops[i].name;
    } else {
      EXPECT_DOUBLE_EQ(f8.forward_ops[i].seconds, bf.forward_ops[i].seconds) << bf.forward_ops[i].name;
    }
    EXPECT_DOUBLE_EQ(f8.forward_ops[i].flops, bf.forward_ops[i].flops);
  }
  EXPECT_EQ(f8.attn_fwd, bf.attn_fwd);
  EXPECT_EQ(f8.attn_bwd, bf.attn_bwd);
  EXPECT_GT(f8.peak_flops, bf.peak_flops);
  EXPECT_LT(estimate_step(f8).step_seconds, estimate_step(bf).step_seconds);
}

TEST(StepModel, DocumentMaskCutsAttentionTime) {
  auto attn = [](const StepCosts& k) {
    double t = 0;
    for (auto& steps : k.attn_fwd[0])
      for (double x : steps) t += x;
    return t;
  };
  StepCosts causal = costs(job("cp=8,cp_kind=zigzag", 131072));
  StepCosts docs = costs(job("cp=8,cp_kind=zigzag,mask=doc:8192", 131072));
  StepCosts short_docs = costs(job("cp=8,cp_kind=zigzag,mask=doc:2048", 131072));
  EXPECT_LT(attn(docs), attn(causal));
  EXPECT_LT(attn(short_docs), attn(docs));
  // 16 documents of 8K hold about 1/16 of the causal pairs; the time is cut by more than half
  EXPECT_LT(attn(docs), attn(causal) / 2);
  EXPECT_LT(estimate_step(docs).step_seconds, estimate_step(causal).step_seconds);
  // the dense part is untouched
  for (size_t i = 0; i < causal.forward_ops.size(); ++i) EXPECT_DOUBLE_EQ(docs.forward_ops[i].seconds, causal.forward_ops[i].seconds);
}

TEST(StepModel, FullRecomputeAddsExactlyOneForward) {
  // one rank (no communication): full recompute adds one layer forward per layer (attention
  // included) to the compute; selective adds the attention core's forward only
  for (const char* extra : {"", ",mbs=2,ga=3", ",tiled_mlp=auto"}) {
    Job none = job(std::string("dp=1") + extra, 16384, "Llama-3.1-8B", "1xh100");
    Job full = job(std::string("dp=1,recompute=full") + extra, 16384, "Llama-3.1-8B", "1xh100");
    Job sel = job(std::string("dp=1,recompute=selective") + extra, 16384, "Llama-3.1-8B", "1xh100");
    StepCosts kn = costs(none), kf = costs(full), ks = costs(sel);
    const double L = static_cast<double>(kn.layers), ga = static_cast<double>(kn.ga);
    const double attn = kn.attn_fwd[0][0][0];
    const double layer_fwd = kn.pre_fwd + kn.post_fwd + kn.mlp_fwd + attn;
    StepTime tn = estimate_step(kn), tf = estimate_step(kf), ts = estimate_step(ks);
    EXPECT_LT(rel(tf.breakdown.compute - tn.breakdown.compute, ga * L * layer_fwd), 1e-9) << extra;
    EXPECT_LT(rel(ts.breakdown.compute - tn.breakdown.compute, ga * L * attn), 1e-9) << extra;
    EXPECT_LT(rel(tf.step_seconds - tn.step_seconds, ga * L * layer_fwd), 1e-9) << extra;
    // hardware FLOPs: one more forward's GEMMs and attention
    double fwd_fl = forward_flops(kn);
    double attn_fl = 4.0 * static_cast<double>(none.m.head_dim * none.m.heads) * static_cast<double>(none.p.mbs) * 16384.0 * 16385.0 / 2;
    EXPECT_LT(rel(kf.hardware_flops - kn.hardware_flops, ga * L * (fwd_fl + attn_fl)), 1e-9) << extra;
    EXPECT_LT(rel(ks.hardware_flops - kn.hardware_flops, ga * L * attn_fl), 1e-9) << extra;
    // the simulator runs the same extra work on the compute stream
    auto busy = [](const SimResult& r) {
      double b = 0;
      for (auto& t : r.tasks)
        if (t.stream == SimStream::compute && t.category == SimCategory::compute) b += t.duration;
      return b;
    };
    EXPECT_LT(rel(busy(simulate_step(kf, full.p)) - busy(simulate_step(kn, none.p)), ga * L * layer_fwd), 1e-9) << extra;
  }
}

// ---- closed form vs simulator ---------------------------------------------------------------------

// The closed form prices each layer as the max of compute and the transfer it overlaps, prefetches
// and gradient reductions as hidden unless they outlast their layer, and takes the slowest rank;
// the simulator schedules the same costs event by event. Measured on the matrix below (Release
// build, ctxrun runtime, profiles of 2026-11-27): most plans agree within 0.2%; the largest
// differences are 3.51% (8B tp=1,cp=64 plain ring at 64K, closed 0.938 s < simulated 0.973 s), 1.90% (8B
// dp=32,zero=3,param_offload=1,opt_offload=1,ga=2) and 0.67% (8B dp=2,tp=2,cp=8 ring, zero=1, ga=2). The
// cp=64 ring is 88% exposed ring hops across nodes: since ring steps past the first run on the kernel's
// no-mask curve (1,024-token blocks, steps now shorter than their hop) the closed form, which takes each
// step's max with its own hop on the heaviest rank alone, comes out below the simulator, which times
// every rank's steps and hops together (our reading, not traced: the lighter ranks that forward the
// heaviest rank's blocks pace its hops); it was 0.5% with those steps priced on the causal curve.
// Tolerance 5%: 1.4x that worst case; a schedule the closed form stops describing (a missing overlap,
// a doubled collective) moves these communication-bound steps by far more (the hops are 88% of one).
constexpr double kClosedFormTolerance = 0.05;

TEST(StepModel, ClosedFormAgreesWithSimulator) {
  struct Case { const char* model; const char* cluster; const char* plan; int64_t seq; };
  const Case cases[] = {
      {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=zigzag,zero=3,recompute=full,tiled_loss=2048", 131072},
      {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=ring,zero=3,recompute=full", 131072},
      {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=ulysses,zero=3,recompute=full", 131072},
      {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=allgather,zero=1", 65536},
      {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=usp,ulysses=2,zero=2,recompute=selective", 131072},
      {"Llama-3.1-8B", "8xh100", "dp=8,zero=0", 8192},
      {"Llama-3.1-8B", "8xh100", "dp=8,zero=1,ga=4", 8192},
      {"Llama-3.1-8B", "8xh100", "dp=4,cp=2,zero=2,ga=2,mbs=2", 16384},
      {"Llama-3.1-8B", "8xh100", "dp=2,tp=4,zero=3,recompute=full", 32768},
      {"Llama-3.1-8B", "8xh100", "tp=2,cp=4,cp_kind=zigzag,zero=3,recompute=full,ckpt_offload=1,opt_offload=1", 262144},
      {"Llama-3.1-8B", "8xh100", "cp=8,cp_kind=ulysses,zero=3,recompute=full,opt_offload=1,param_offload=1,ckpt_offload=1", 524288},
      {"Llama-3.1-8B", "8xh100", "dp=8,zero=3,recompute=full,mask=doc:hist:2048@0.8/32768@0.2", 32768},
      {"Llama-3.1-8B", "8xh100", "dp=8,zero=3,recompute=full,mask=doc:hist:2048@0.8/32768@0.2,packing=sorted", 32768},
      {"Llama-3.1-8B", "4x8xh100", "dp=4,cp=8,cp_kind=zigzag,zero=3,recompute=full", 131072},
      {"Llama-3.1-8B", "4x8xh100", "dp=2,tp=2,cp=8,cp_kind=ring,zero=1,ga=2", 65536},
      {"Llama-3.1-70B", "8x8xh100", "tp=8,cp=8,cp_kind=zigzag,zero=1,recompute=full", 1048576},
      {"Llama-3.1-70B", "8x8xh100", "tp=8,cp=8,cp_kind=ring,zero=3,recompute=full", 1048576},
      {"Llama-3.1-70B", "8x8xh100", "tp=4,cp=16,cp_kind=usp,ulysses=4,zero=3,recompute=full,precision=fp8", 524288},
      // communication-bound: short sequences, ZeRO-3 gathers and ring hops across nodes
      {"Llama-3.1-70B", "8x8xh100", "dp=64,zero=3,recompute=full", 4096},
      {"Llama-3.1-70B", "8x8xh100", "dp=8,tp=8,zero=3,ga=4", 4096},
      {"Llama-3.1-8B", "8x8xh100", "tp=1,cp=64,cp_kind=ring,zero=3,recompute=full,order=cp-tp-dp", 65536},
      {"Llama-3.1-8B", "8x8xh100", "cp=64,cp_kind=usp,ulysses=8,zero=3,recompute=full", 131072},
      {"Llama-3.1-8B", "8x8xh100", "dp=8,cp=8,cp_kind=zigzag,zero=2,order=dp-cp-tp", 32768},
      {"Llama-3.1-8B", "4x8xh100", "dp=32,zero=1,opt_offload=1", 4096},
      {"Llama-3.1-8B", "4x8xh100", "dp=32,zero=3,param_offload=1,opt_offload=1,ga=2", 4096},
  };
  double worst = 0;
  std::string worst_case;
  for (const Case& c : cases) {
    Job j = job(c.plan, c.seq, c.model, c.cluster);
    StepCosts k = costs(j);
    double closed = estimate_step(k).step_seconds;
    double sim = simulate_step(k, j.p).time.step_seconds;
    ASSERT_GT(sim, 0) << c.plan;
    double e = rel(closed, sim);
    EXPECT_LT(e, kClosedFormTolerance) << c.model << " " << c.cluster << " " << c.plan << ": closed " << closed << " s, simulated "
                                       << sim << " s";
    if (e > worst) { worst = e; worst_case = c.plan; }
  }
  std::printf("closed form vs simulator: worst %.2f%% (%s)\n", 100 * worst, worst_case.c_str());
}

TEST(StepModel, PerRankAndPerStepCostsGiveTheSameClosedForm) {
  // the search prices per-rank totals split evenly over the ring steps (per_step = false); the
  // simulator prices each ring step. They differ only where a step's transfer outlasts its compute
  // (zig-zag's step 0 holds 3/4 of a later step's pairs), which compute-bound plans do not hit.
  for (const char* plan : {"cp=8,cp_kind=zigzag,zero=3,recompute=full", "cp=8,cp_kind=ulysses,zero=3", "dp=8,zero=1"}) {
    Job j = job(plan, 131072);
    double a = estimate_step(costs(j, true)).step_seconds, b = estimate_step(costs(j, false)).step_seconds;
    EXPECT_LT(rel(b, a), 0.02) << plan << ": per step " << a << " s, per rank " << b << " s";
  }
}

}  // namespace
}  // namespace ctx
