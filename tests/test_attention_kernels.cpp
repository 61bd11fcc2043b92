// The attention implementation as an input (issue 16): --attention and a plan file's "attention"
// pick the kernel whose curve prices the attention core; the choice is checked against the runtime
// (what the stack runs) and the GPU (what has a curve, e.g. no FlashAttention-3 on an A100).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "costmodel/attention_kernels.hpp"
#include "costmodel/exit_codes.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/step_model.hpp"
#include "tests/built_in_profiles.hpp"
#include "tests/run_process.hpp"

namespace {

using ctx::testing::RunResult;

RunResult run_ctxplan(const std::vector<std::string>& args) { return ctx::testing::run_process(CTXPLAN_BIN, args); }
bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// The efficiency a hardware profile states for one kernel at one token count, read from the JSON
// file itself (not through the loader under test); the token count must be one of the curve's points.
double stated_efficiency(const std::string& hardware_file, const std::string& kernel, const std::string& curve, double tokens) {
  std::ifstream in(ctx::default_profiles_dir() + "/hardware/" + hardware_file);
  const nlohmann::json j = nlohmann::json::parse(in);
  for (auto& pt : j["kernels"]["attention"][kernel][curve]["points"])
    if (pt[0].get<double>() == tokens) return pt[1].get<double>();
  ADD_FAILURE() << kernel << "." << curve << " has no point at " << tokens;
  return 0;
}

// Each attention call costs flops / (peak x efficiency) + launch (step_model.cpp, Pricer::attention), so
// with the same plan the launch-free attention time of two kernels is in the inverse ratio of their
// stated efficiencies at the call's token count. Llama-3.1-8B (head dim 128, where the head-dim factor is
// 1 by definition) at 16,384 tokens on one rank's whole sequence (cp=1): every call spans 16,384 keys, a
// point of the H100 curves, so no interpolation enters the expected number. Relative 1e-9: arithmetic only.
TEST(AttentionKernels, AChoiceScalesAttentionTimeByTheRatioOfItsCurves) {
  const ctx::Profiles prof = ctx::load_profiles(ctx::default_profiles_dir());
  const ctx::ModelSpec m = ctx::resolve_model(prof, "Llama-3.1-8B");
  ASSERT_EQ(m.head_dim, 128);
  const ctx::ClusterSpec c = ctx::resolve_cluster(prof, "8xh100");
  const ctx::RuntimeProfile base = ctx::resolve_runtime(prof, "hf-deepspeed");
  const ctx::Plan plan = ctx::parse_plan("dp=8,zero=3,recompute=full", "test");
  const int64_t seq = 16384;
  const double launch = c.gpu.kernels.launch_seconds;
  for (const char* curve : {"fwd_tokens", "bwd_tokens"}) {
    const bool bwd = std::string(curve) == "bwd_tokens";
    double t[2];
    int n[2] = {0, 0};
    const char* names[2] = {"fa2", "fa3"};
    for (int i = 0; i < 2; ++i) {
      const ctx::RuntimeProfile rt = ctx::with_attention(base, names[i], "--attention", "");
      const ctx::StepCosts k = ctx::step_costs(m, c, rt, plan, seq, false);
      EXPECT_EQ(k.attention_kernel, names[i]);
      t[i] = ctx::testing::attention_call_seconds(bwd ? k.attn_bwd : k.attn_fwd, &n[i]);
    }
    ASSERT_EQ(n[0], n[1]);
    ASSERT_GT(n[0], 0);
    const double expected = stated_efficiency("h100-sxm-80gb.json", "fa3", curve, 16384) /
                            stated_efficiency("h100-sxm-80gb.json", "fa2", curve, 16384);
    const double got = (t[0] - n[0] * launch) / (t[1] - n[1] * launch);
    EXPECT_NEAR(got / expected, 1.0, 1e-9) << curve;
  }
}

// ctxrun's CUDA backend runs fp32 attention on its SIMT kernel (attention.cu), bf16 on its tensor-core
// kernel: on a GPU whose profile has both measured curves (h200-141gb-measured, ctxrun-calibrate's output
// from the first GPU run) an fp32 plan is priced on ctxrun_fp32 and a bf16 plan on ctxrun_mma, so their
// launch-free attention times are in the inverse ratio of the stated efficiencies at the call's token
// count (8,192 tokens at cp=1: a point of both curves; head dim 128, factor 1; fp32 is priced at the bf16
// peak like every fp32 GEMM). Where the GPU has neither curve (the datasheet h200) both fall back to fa2,
// and a kernel chosen with --attention is kept. Relative 1e-9: arithmetic only.
TEST(AttentionKernels, Fp32PlansOnCtxrunCudaArePricedOnItsSimtKernelWhereMeasured) {
  const ctx::Profiles prof = ctx::load_profiles(ctx::default_profiles_dir());
  const ctx::ModelSpec m = ctx::resolve_model(prof, "Llama-3.1-8B");
  const ctx::RuntimeProfile rt = ctx::resolve_runtime(prof, "ctxrun-cuda");
  const ctx::Plan bf16 = ctx::parse_plan("tp=1", "test"), fp32 = ctx::parse_plan("tp=1,precision=fp32", "test");
  const int64_t seq = 8192;
  const ctx::ClusterSpec measured = ctx::resolve_cluster(prof, "1x1xh200-measured");
  const ctx::ClusterSpec datasheet = ctx::resolve_cluster(prof, "1x1xh200");
  const ctx::StepCosts k32 = ctx::step_costs(m, measured, rt, fp32, seq, false);
  const ctx::StepCosts k16 = ctx::step_costs(m, measured, rt, bf16, seq, false);
  EXPECT_EQ(k32.attention_kernel, "ctxrun_fp32");
  EXPECT_EQ(k16.attention_kernel, "ctxrun_mma");
  EXPECT_EQ(ctx::step_costs(m, datasheet, rt, fp32, seq, false).attention_kernel, "fa2");
  EXPECT_EQ(ctx::step_costs(m, datasheet, rt, bf16, seq, false).attention_kernel, "fa2");
  const ctx::RuntimeProfile chosen = ctx::with_attention(rt, "ctxrun_mma", "--attention", "");
  EXPECT_EQ(ctx::step_costs(m, measured, chosen, fp32, seq, false).attention_kernel, "ctxrun_mma");
  const double launch = measured.gpu.kernels.launch_seconds;
  for (const char* curve : {"fwd_tokens", "bwd_tokens"}) {
    const bool bwd = std::string(curve) == "bwd_tokens";
    int n32 = 0, n16 = 0;
    const double t32 = ctx::testing::attention_call_seconds(bwd ? k32.attn_bwd : k32.attn_fwd, &n32);
    const double t16 = ctx::testing::attention_call_seconds(bwd ? k16.attn_bwd : k16.attn_fwd, &n16);
    ASSERT_EQ(n32, n16);
    ASSERT_GT(n32, 0);
    const double expected = stated_efficiency("h200-141gb-measured.json", "ctxrun_mma", curve, 8192) /
                            stated_efficiency("h200-141gb-measured.json", "ctxrun_fp32", curve, 8192);
    EXPECT_GT(expected, 5.0) << "the SIMT kernel measured several times slower";
    EXPECT_NEAR(((t32 - n32 * launch) / (t16 - n16 * launch)) / expected, 1.0, 1e-9) << curve;
  }
}

// A ring's later steps pair a rank's queries with another rank's keys, blocks no causal mask cuts: they
// run on the no-mask curve (Transformer Engine's AttnFuncWithCPAndKVP2P, PyTorch's
// _templated_ring_attention). Plain ring cp=2 at 32,768 tokens: each rank holds n = 16,384 (a point of
// both curves). Rank 1's step 0 is its causal diagonal, n(n+1)/2 pairs; its step 1 rank 0's keys, n^2
// pairs, unmasked; rank 0's step 1 is empty. Launch-free times are flops / (peak x scale x efficiency)
// with flops proportional to pairs, so step 1 / step 0 = 2n/(n+1) x causal(n) / full(n), forward and
// backward. The closed form's one entry per rank prices the same two blocks: it equals the steps' sum
// (each call one launch). Relative 1e-9: arithmetic only.
TEST(AttentionKernels, RingStepsPastTheFirstRunOnTheNoMaskCurve) {
  const ctx::Profiles prof = ctx::load_profiles(ctx::default_profiles_dir());
  const ctx::ModelSpec m = ctx::resolve_model(prof, "Llama-3.1-8B");
  const ctx::ClusterSpec c = ctx::resolve_cluster(prof, "8xh100");
  const ctx::RuntimeProfile rt = ctx::with_attention(ctx::resolve_runtime(prof, "megatron"), "fa2", "--attention", "");
  const ctx::Plan plan = ctx::parse_plan("dp=4,cp=2,cp_kind=ring", "test");
  const int64_t seq = 32768;
  const double n = 16384, launch = c.gpu.kernels.launch_seconds;
  const ctx::StepCosts steps = ctx::step_costs(m, c, rt, plan, seq, true);
  const ctx::StepCosts closed = ctx::step_costs(m, c, rt, plan, seq, false);
  for (const char* curve : {"fwd_tokens", "bwd_tokens"}) {
    SCOPED_TRACE(curve);
    const bool bwd = std::string(curve) == "bwd_tokens";
    const auto& t = (bwd ? steps.attn_bwd : steps.attn_fwd).at(0);
    ASSERT_EQ(t.size(), 2u);
    ASSERT_EQ(t[1].size(), 2u);
    EXPECT_EQ(t[0][1], 0.0);  // rank 0 sees none of rank 1's keys
    const double expected = 2 * n / (n + 1) * stated_efficiency("h100-sxm-80gb.json", "fa2", curve, 16384) /
                            stated_efficiency("h100-sxm-80gb.json", "fa2", std::string("full_") + curve, 16384);
    EXPECT_NEAR((t[1][1] - launch) / (t[1][0] - launch) / expected, 1.0, 1e-9);
    const auto& one = (bwd ? closed.attn_bwd : closed.attn_fwd).at(0);
    ASSERT_EQ(one[1].size(), 1u);
    EXPECT_NEAR(one[1][0] / (t[1][0] + t[1][1]), 1.0, 1e-9);
  }
}

// The mask picks the causal or the no-mask curve (document masks run the causal kernel per document),
// and the head-dim factor multiplies it: checked on the kernel the loader built, against the numbers the
// file states (at a point of each curve, so no interpolation enters).
TEST(AttentionKernels, HeadDimAndMaskPickTheStatedCurves) {
  const ctx::Profiles prof = ctx::load_profiles(ctx::default_profiles_dir());
  const ctx::ClusterSpec c = ctx::resolve_cluster(prof, "8xh100");
  const ctx::RuntimeProfile rt = ctx::with_attention(ctx::resolve_runtime(prof, "hf-deepspeed"), "fa3", "--attention", "");
  const ctx::AttentionKernel& k = ctx::find_attention_kernel(c, rt);
  const double causal = stated_efficiency("h100-sxm-80gb.json", "fa3", "fwd_tokens", 4096);
  const double full = stated_efficiency("h100-sxm-80gb.json", "fa3", "full_fwd_tokens", 4096);
  const double hd64 = stated_efficiency("h100-sxm-80gb.json", "fa3", "head_dim", 64);
  EXPECT_DOUBLE_EQ(ctx::attention_efficiency(k, ctx::AttentionMask::causal, 128, 4096, false), causal);
  EXPECT_DOUBLE_EQ(ctx::attention_efficiency(k, ctx::AttentionMask::document, 128, 4096, false), causal);
  EXPECT_DOUBLE_EQ(ctx::attention_efficiency(k, ctx::AttentionMask::full, 128, 4096, false), full);
  EXPECT_DOUBLE_EQ(ctx::attention_efficiency(k, ctx::AttentionMask::causal, 64, 4096, false), causal * hd64);
}

TEST(AttentionKernels, Fa3OnAnA100IsRefusedNamingTheGpuAndWhatItHas) {
  RunResult r = run_ctxplan({"predict", "--cluster", "8xa100", "--runtime", "hf-deepspeed", "--attention", "fa3", "--seq", "8k",
                             "--plan", "dp=8,zero=3,recompute=full"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << r.both();
  EXPECT_TRUE(contains(r.err, "--attention")) << r.err;
  EXPECT_TRUE(contains(r.err, "'fa3' has no throughput curve in hardware profile A100-SXM-80GB")) << r.err;
  EXPECT_TRUE(contains(r.err, "valid on this GPU: cudnn, fa2, flex, sdpa, triton")) << r.err;
}

TEST(AttentionKernels, AnUnknownNameListsTheValidOnes) {
  RunResult r = run_ctxplan({"predict", "--runtime", "hf-deepspeed", "--attention", "flash4"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << r.both();
  EXPECT_TRUE(contains(r.err, "unknown attention implementation 'flash4'")) << r.err;
  EXPECT_TRUE(contains(r.err, "fa2, fa3, cudnn, flex, sdpa, triton")) << r.err;
}

TEST(AttentionKernels, AKernelTheRuntimeDoesNotRunIsRefused) {
  RunResult r = run_ctxplan({"predict", "--runtime", "ctxrun-cuda", "--attention", "fa3"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << r.both();
  EXPECT_TRUE(contains(r.err, "runtime ctxrun-cuda does not run 'fa3'; it runs: ctxrun_mma")) << r.err;
}

TEST(AttentionKernels, SdpaRefusesPackedDocuments) {
  RunResult r = run_ctxplan({"predict", "--runtime", "hf-deepspeed", "--attention", "sdpa", "--seq", "32k", "--plan",
                             "dp=8,zero=3,recompute=full,mask=doc:4096"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << r.both();
  EXPECT_TRUE(contains(r.err, "'sdpa' cannot run mask=document")) << r.err;
}

std::string write_plan_file(const std::string& name, const std::string& extra) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << "{\"schema\": \"ctxplan.plan/1\", \"model\": \"Llama-3.1-8B\", \"cluster\": \"8xh100\", \"seq\": 16384, "
                         "\"runtime\": \"hf-deepspeed\", \"plan\": {\"dp\": 8, \"zero\": 3, \"recompute\": \"full\"}" +
                             extra + "}";
  return path;
}

TEST(AttentionKernels, PlanFilesCarryTheKernelAndOldOnesStillLoad) {
  // a file from before issue 16 has no "attention": the runtime's default (hf-deepspeed: fa2)
  RunResult old = run_ctxplan({"predict", "--json", "--plan-file", write_plan_file("old_plan.json", "")});
  ASSERT_TRUE(old.exit_code == ctx::kExitOk || old.exit_code == ctx::kExitDoesNotFit) << old.both();
  EXPECT_EQ(nlohmann::json::parse(old.out)["attention"], "fa2");
  RunResult fa3 = run_ctxplan({"predict", "--json", "--plan-file", write_plan_file("fa3_plan.json", ", \"attention\": \"fa3\"")});
  ASSERT_TRUE(fa3.exit_code == ctx::kExitOk || fa3.exit_code == ctx::kExitDoesNotFit) << fa3.both();
  EXPECT_EQ(nlohmann::json::parse(fa3.out)["attention"], "fa3");
  // --attention on the command line wins over the file's
  RunResult cli = run_ctxplan({"predict", "--json", "--attention", "sdpa", "--plan-file", write_plan_file("fa3_plan2.json", ", \"attention\": \"fa3\"")});
  EXPECT_EQ(nlohmann::json::parse(cli.out)["attention"], "sdpa");
  // a bad name in the file names the file and the field
  const std::string bad = write_plan_file("bad_plan.json", ", \"attention\": \"fa9\"");
  RunResult r = run_ctxplan({"predict", "--plan-file", bad});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << r.both();
  EXPECT_TRUE(contains(r.err, bad)) << r.err;
  EXPECT_TRUE(contains(r.err, "attention")) << r.err;
  EXPECT_TRUE(contains(r.err, "unknown attention implementation 'fa9'")) << r.err;
}

TEST(AttentionKernels, ListHardwareShowsTheGpuVariants) {
  RunResult r = run_ctxplan({"list", "hardware"});
  EXPECT_EQ(r.exit_code, ctx::kExitOk) << r.both();
  for (const char* gpu : {"H100-SXM-80GB", "H100-NVL-94GB", "H100-PCIe-80GB", "H100-96GB-500W", "H800-SXM-80GB", "H200-141GB",
                          "A100-SXM-40GB", "A100-SXM-80GB", "B200-180GB"})
    EXPECT_TRUE(contains(r.out, gpu)) << gpu << "\n" << r.out;
}

// A curve is linear in log(size) between its points, clamped at both ends (curve.hpp). The loader
// keeps each segment's log (Curve::prepare) so a lookup takes one log; the value must be the
// definition's, y0 + log(x/x0) / log(x1/x0) * (y1 - y0), bit for bit, at every point, between and
// beyond them, on every curve of every hardware profile; and a curve whose points change after
// prepare() (its kept logs stale) still gives the definition's value on its new points.
TEST(AttentionKernels, CurveLookupsAreTheLogLinearDefinitionBitForBit) {
  const ctx::Profiles prof = ctx::load_profiles(ctx::default_profiles_dir());
  auto definition = [](const ctx::Curve& c, double x) {
    const auto& pts = c.points;
    if (x <= pts.front().first) return pts.front().second;
    if (x >= pts.back().first) return pts.back().second;
    size_t i = 1;
    while (pts[i].first < x) ++i;
    return pts[i - 1].second + std::log(x / pts[i - 1].first) / std::log(pts[i].first / pts[i - 1].first) * (pts[i].second - pts[i - 1].second);
  };
  auto check = [&](const ctx::Curve& c, const std::string& what) {
    if (c.points.empty()) return 0;
    int n = 0;
    for (size_t i = 0; i < c.points.size(); ++i)
      for (double f : {0.5, 0.999, 1.0, 1.001, 1.37, 2.0}) {
        const double x = c.points[i].first * f;
        EXPECT_EQ(c.at(x), definition(c, x)) << what << " at " << x;
        ++n;
      }
    return n;
  };
  int lookups = 0, prepared = 0;
  for (const ctx::HardwareSpec& hw : prof.hardware) {
    const ctx::KernelCurves& k = hw.kernels;
    std::vector<std::pair<const ctx::Curve*, std::string>> curves = {{&k.gemm, "gemm"}, {&k.gemm_fp8, "gemm_fp8"}, {&k.memory, "memory"}};
    for (const ctx::AttentionKernel& a : k.attention)
      for (auto [c, name] : {std::pair<const ctx::Curve*, const char*>{&a.fwd, "fwd"}, {&a.bwd, "bwd"}, {&a.full_fwd, "full_fwd"},
                             {&a.full_bwd, "full_bwd"}, {&a.head_dim, "head_dim"}})
        curves.emplace_back(c, a.name + "." + name);
    for (auto& [c, name] : curves) {
      lookups += check(*c, hw.name + " " + name);
      if (c->points.size() > 1) prepared += c->segments.size() + 1 == c->points.size();
      if (c->points.size() > 2) {  // edited after prepare(): the middle point moves, its two segments' kept logs are stale
        ctx::Curve edited = *c;
        edited.points[1].first = std::sqrt(edited.points[0].first * edited.points[2].first);
        lookups += check(edited, hw.name + " " + name + " (edited)");
      }
    }
  }
  EXPECT_GT(lookups, 1000);
  EXPECT_GT(prepared, 10);  // the loader prepared them (else the lookups above took the two-log path only)
}

}  // namespace
