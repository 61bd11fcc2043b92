// The llm-foundry runtime profile (profiles/runtimes/llm-foundry.json, issue 16): MosaicML llm-foundry on
// Composer 0.16.4 and PyTorch 2.1 FSDP1, as its H100 benchmarks ran MPT-7B. It loads with a source for
// every constant and capability, the published llm-foundry points are priced with it, and the memory
// and communication it predicts follow the stack's own settings (Composer's 'DEFAULT' mixed precision,
// FULL_SHARD, flash-attn's fused cross-entropy), each checked against arithmetic by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "costmodel/attention_kernels.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/runtime_capabilities.hpp"
#include "costmodel/step_model.hpp"
#include "costmodel/zero_comm.hpp"
#include "built_in_profiles.hpp"
#include "planner/validation_points.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(default_profiles_dir());
  return p;
}

MemoryPrediction memory(const std::string& runtime, const std::string& plan_text, int64_t seq) {
  return testing::built_in_plan_memory("MPT-7B", runtime, plan_text, seq);
}

double cat(const MemoryPrediction& mp, Phase ph, Mem m) { return mp.phase_peak[static_cast<int>(ph)][m]; }

// MPT-7B from the Hugging Face config (mosaicml/mpt-7b): d_model 4096, 32 layers, expansion 4, no
// biases (no_bias), LayerNorm weights only, ALiBi (no position table), vocabulary 50432, the unembedding
// tied to wte. Counted here by hand, not from the code under test.
double mpt7b_params_by_hand() {
  const double d = 4096, layers = 32, vocab = 50432;
  const double per_layer = 4 * d * d      // Wqkv (3 d x d) + out_proj (d x d)
                           + 2 * d * 4 * d  // up_proj, down_proj
                           + 2 * d;         // norm_1, norm_2 weights
  return layers * per_layer + vocab * d + d;  // + wte (tied) + norm_f
}

TEST(LlmFoundryRuntime, LoadsWithASourceForEveryConstantAndCapability) {
  const RuntimeProfile rt = resolve_runtime(profiles(), "llm-foundry");
  const RuntimeProfile ds = resolve_runtime(profiles(), "hf-deepspeed");
  EXPECT_EQ(rt.name, "llm-foundry");
  // every constant the parser reads for hf-deepspeed is stated for llm-foundry too, each with a source
  // (but the calibrated scales: optional, fitted to a runtime's own runs; llm-foundry has none)
  for (auto& [key, src] : ds.sources) {
    bool calibrated = false;
    for (auto& n : calibration_constant_names()) calibrated |= key == n;
    if (calibrated) {
      EXPECT_EQ(rt.sources.count(key), 0u) << key << ": nothing was fitted to llm-foundry's runs";
      continue;
    }
    auto it = rt.sources.find(key);
    ASSERT_NE(it, rt.sources.end()) << "llm-foundry.json lacks " << key;
    EXPECT_GT(it->second.size(), 20u) << key << ": " << it->second;
  }
  ASSERT_TRUE(rt.capabilities.declared);
  // the 17 keys of the file plus master/grads/moments (the reader adds the runtime's own)
  EXPECT_EQ(rt.capabilities.sources.size(), 20u);
  for (auto& [key, src] : rt.capabilities.sources) EXPECT_GT(src.size(), 20u) << key;
  // attn_impl 'triton' (what the benchmark ran) is the default; 'flash' (flash-attn 2.3.2) is fa2
  EXPECT_EQ(rt.attention_kernel, "triton");
  EXPECT_EQ(rt.attention_kernels, (std::vector<std::string>{"triton", "fa2"}));
  EXPECT_EQ(rt.step_overhead_seconds, 0.0);
  EXPECT_EQ(rt.attention_efficiency_scale, 1.0);
}

// FSDP1 FULL_SHARD under Composer's 'DEFAULT' mixed precision (param_dtype bf16, reduce_dtype fp32) with
// DecoupledAdamW keeps per parameter, over the 8 shards: the fp32 sharded flat parameter the optimizer
// steps (4 B), its fp32 sharded gradient (FSDP1 casts the reduced gradient to the parameter's dtype: 4 B)
// and the two fp32 Adam moments (8 B): 16 B / 8. DeepSpeed ZeRO-3 (hf-deepspeed) keeps the same 16 B
// (bf16 shard 2 + fp32 master 4 + bf16 gradient partition 2 + moments 8) and, in the step, flattens one
// optimizer sub-group in bf16 and converts it to fp32 (2 + 4 B per element): MPT-7B's 831,160,832-element
// partition is below sub_group_size 1e9, so the whole partition: 6 B x params / 8 more.
TEST(LlmFoundryRuntime, FullShardModelStatesAreSixteenBytesPerParameterOverTheShards) {
  const double params = mpt7b_params_by_hand();
  ASSERT_DOUBLE_EQ(static_cast<double>(total_params(resolve_model(profiles(), "MPT-7B"))), params);
  const MemoryPrediction lf = memory("llm-foundry", "dp=8,zero=3,recompute=full", 8192);
  const MemoryPrediction ds = memory("hf-deepspeed", "dp=8,zero=3,recompute=full", 8192);
  auto states = [](const MemoryPrediction& mp) {
    return cat(mp, Phase::optimizer, Mem::weights) + cat(mp, Phase::optimizer, Mem::grads) +
           cat(mp, Phase::optimizer, Mem::master_weights) + cat(mp, Phase::optimizer, Mem::optimizer);
  };
  EXPECT_DOUBLE_EQ(states(lf), 16.0 * params / 8.0);
  EXPECT_DOUBLE_EQ(cat(lf, Phase::optimizer, Mem::grads), 4.0 * params / 8.0);
  EXPECT_DOUBLE_EQ(cat(lf, Phase::optimizer, Mem::optimizer), 8.0 * params / 8.0);
  EXPECT_DOUBLE_EQ(states(ds) - states(lf), 6.0 * params / 8.0);
  // Composer's _train_microbatches starts every batch with zero_grad(set_to_none=True): no gradient
  // exists in the forward of a step without accumulation
  EXPECT_EQ(cat(lf, Phase::forward, Mem::grads), 0.0);
}

// Composer's 'DEFAULT' reduces in fp32: the gradient reduce-scatter moves 4 B per parameter, twice
// DeepSpeed's bf16 (ALST's communication dtype); the parameter all-gather moves bf16 (param_dtype) in both.
TEST(LlmFoundryRuntime, DefaultMixedPrecisionReduceScattersFp32Gradients) {
  const ModelSpec m = resolve_model(profiles(), "MPT-7B");
  const Plan p = parse_plan("dp=8,zero=3,recompute=full,mbs=2,ga=2");
  const double params = mpt7b_params_by_hand();
  auto term = [&](const std::string& runtime, const std::string& name) {
    const RuntimeProfile rt = resolve_runtime(profiles(), runtime);
    for (auto& t : zero_comm_terms(m, p, local_shapes(m, p, 32768), rt, 8))
      if (t.name == name) return t;
    ADD_FAILURE() << runtime << " lists no " << name;
    return ZeroCommTerm{};
  };
  EXPECT_DOUBLE_EQ(term("llm-foundry", "grad_reduce_scatter").message_bytes, 4.0 * params);
  EXPECT_DOUBLE_EQ(term("hf-deepspeed", "grad_reduce_scatter").message_bytes, 2.0 * params);
  EXPECT_DOUBLE_EQ(term("llm-foundry", "zero3_param_all_gather").message_bytes, 2.0 * params);
  // FSDP1 without no_sync (Composer uses it for DDP only): a reduce-scatter per micro-batch
  EXPECT_DOUBLE_EQ(term("llm-foundry", "grad_reduce_scatter").calls_per_step, 2.0);
}

// flash-attn 1.0.9's fused cross-entropy (llm-foundry's default loss_fn) saves the bf16 logits and writes
// a bf16 gradient (at::empty_like(logits)), no fp32 [tokens, vocab] tensor; transformers' loss
// (hf-deepspeed) holds three fp32 copies beside the bf16 logits. At the loss backward of one 8192-token
// sequence and MPT-7B's 50432-token vocabulary: (2 + 2) B per logit + d(final hidden) [8192, 4096] bf16,
// times the allocator slack (fragmentation) the profile states.
TEST(LlmFoundryRuntime, FusedCrossEntropyHoldsTwoBf16LogitTensors) {
  const MemoryPrediction lf = memory("llm-foundry", "dp=8,zero=3,recompute=full", 8192);
  const double frag = resolve_runtime(profiles(), "llm-foundry").fragmentation;
  const double tokens = 8192, vocab = 50432, hidden = 4096;
  EXPECT_NEAR(cat(lf, Phase::loss, Mem::logits), ((2.0 + 2.0) * tokens * vocab + 2.0 * tokens * hidden) * (1.0 + frag), 1.0);
}

// What llm-foundry at b2a43a1 runs: FSDP1 NO_SHARD / SHARD_GRAD_OP / FULL_SHARD (and hybrid), per-block
// checkpointing, Composer's CPU offload; no tensor, pipeline or context parallelism, no selective
// recompute, no tiling.
TEST(LlmFoundryRuntime, CapabilitiesAdmitItsPlansAndNameWhatItCannotRun) {
  const RuntimeProfile rt = resolve_runtime(profiles(), "llm-foundry");
  for (const char* ok : {"dp=8,zero=3,recompute=full,mbs=2,ga=2", "dp=8,zero=2", "dp=8,zero=0,recompute=none",
                         "dp=8,zero=3,opt_offload=1,param_offload=1", "dp=8,zero=3,recompute=full,ckpt_offload=1"})
    EXPECT_EQ(missing_capability(rt.capabilities, rt.name, parse_plan(ok)), "") << ok;
  const std::pair<const char*, const char*> refused[] = {
      {"dp=4,tp=2,zero=3", "tp"},
      {"dp=4,cp=2,cp_kind=ring,zero=3", "cp_comm"},
      {"dp=8,zero=1", "zero"},
      {"dp=8,zero=3,recompute=selective", "recompute"},
      {"dp=8,zero=3,tiled_loss=4096", "tiled_loss"},
      {"dp=8,zero=3,tiled_mlp=on", "tiled_mlp"},
      {"dp=4,pp=2,zero=3,ga=4", "pp"},
  };
  for (auto& [plan, key] : refused) {
    const std::string why = missing_capability(rt.capabilities, rt.name, parse_plan(plan));
    EXPECT_NE(why.find(std::string(key) + "="), std::string::npos) << plan << ": " << why;
  }
}

// The README's two long-sequence MPT-7B rows (8192 and 32768 tokens; MFU and tokens/s each) are priced
// with the stack they ran on and the kernel they ran, attn_impl triton.
TEST(LlmFoundryRuntime, PublishedLlmFoundryPointsArePricedWithIt) {
  const auto rows = predict_published_time(profiles(), "llmfoundry-", "");
  ASSERT_EQ(rows.size(), 4u);
  for (auto& r : rows) {
    EXPECT_EQ(r.runtime, "llm-foundry") << r.id;
    EXPECT_EQ(r.attention, "triton") << r.id;
    EXPECT_GT(r.predicted, 0.0) << r.id;
  }
  EXPECT_TRUE(predict_published_time(profiles(), "llmfoundry-", "hf-deepspeed").empty());
}

// llm-foundry's attn_impl triton (flash-attention's flash_attn_triton.py) runs at half FlashAttention-2's
// throughput: its docstring puts its forward + backward 'slightly slower' than FlashAttention-1's, and the
// FlashAttention-2 paper (arXiv:2307.08691, sec. 4.1) measures FA2 'around 2x faster than FlashAttention'
// (both on A100; 'slightly' unquantified, so 2x is the lower bound on the time). So the launch-free
// attention time of the same job is twice fa2's, forward and backward, on the A100 where the ratio was
// measured and on the H100 it is carried to. MPT-7B (head dim 128) at 16,384 tokens, cp=1: every call
// spans a point of the curves. Relative 1e-9: arithmetic only.
TEST(LlmFoundryRuntime, TritonAttentionTakesTwiceFa2sTimeAsItsSourcesState) {
  const ModelSpec m = resolve_model(profiles(), "MPT-7B");
  ASSERT_EQ(m.head_dim, 128);
  const RuntimeProfile triton = resolve_runtime(profiles(), "llm-foundry");
  const RuntimeProfile fa2 = with_attention(triton, "fa2", "--attention", "");
  const Plan plan = parse_plan("dp=8,zero=3,recompute=full,mbs=2", "test");
  for (const char* cluster : {"8xh100", "8xa100"}) {
    const ClusterSpec c = resolve_cluster(profiles(), cluster);
    const StepCosts a = step_costs(m, c, triton, plan, 16384, false), b = step_costs(m, c, fa2, plan, 16384, false);
    EXPECT_EQ(a.attention_kernel, "triton") << cluster;
    EXPECT_EQ(b.attention_kernel, "fa2") << cluster;
    const double launch = c.gpu.kernels.launch_seconds;
    for (bool bwd : {false, true}) {
      int na = 0, nb = 0;
      const double ta = ctx::testing::attention_call_seconds(bwd ? a.attn_bwd : a.attn_fwd, &na);
      const double tb = ctx::testing::attention_call_seconds(bwd ? b.attn_bwd : b.attn_fwd, &nb);
      ASSERT_EQ(na, nb);
      ASSERT_GT(na, 0);
      EXPECT_NEAR((ta - na * launch) / (tb - nb * launch), 2.0, 2e-9) << cluster << (bwd ? " backward" : " forward");
    }
  }
}

}  // namespace
}  // namespace ctx
