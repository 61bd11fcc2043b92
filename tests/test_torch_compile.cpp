// torch.compile as a plan input (issue 16, plan key compile=off|model|model+loss) and the torchtitan
// memory terms it and FSDP2 bring: a compiled loss keeps the bf16 logits and their bf16 gradient
// instead of three fp32 [tokens, vocab] copies; a compiled block (recompute=none) keeps w1's and
// w3's outputs and no norm output; op-level selective checkpointing keeps its save list's outputs;
// FSDP2's sharded gradient stays reserved by the reduce-scatter stream. Each number below is derived
// by hand for Llama-3.1-8B (hidden 4096, 32 query / 8 KV heads of 128, FFN 14336, vocabulary
// 128,256, 32 layers) at a stated plan; runtimes that do not list compile refuse it.
#include <gtest/gtest.h>

#include <string>

#include "costmodel/errors.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/runtime_capabilities.hpp"
#include "costmodel/step_model.hpp"
#include "built_in_profiles.hpp"

namespace ctx {
namespace {

constexpr double kHidden = 4096, kFfn = 14336, kVocab = 128256, kLayers = 32;

MemoryPrediction memory(const std::string& plan_text, int64_t seq, const std::string& runtime = "torchtitan") {
  return testing::built_in_plan_memory("Llama-3.1-8B", runtime, plan_text, seq, "8xh100-96gb");
}
double cat(const MemoryPrediction& mp, Phase ph, Mem m) { return mp.phase_peak[static_cast<int>(ph)][m]; }
double frag() { return resolve_runtime(testing::built_in_profiles(), "torchtitan").fragmentation; }

// Eager: 3 fp32 [T, V] copies at log_softmax's backward (12 B per logit). Compiled (e7c0cae / 000204a4
// build_cross_entropy_loss): the bf16 logits the graph saves and the bf16 gradient its one fused
// backward kernel writes (4 B per logit). dp=8, mbs=1 at 8192 tokens: T = 8192, so the loss phase's
// logits category falls by 8 B x 8192 x 128,256 = 8,405,385,216 B (x the allocator slack); the
// d(final hidden) [T, h] bf16 beside it is the same in both. compile=model leaves the loss eager.
TEST(TorchCompile, CompiledLossHoldsTwoBf16LogitTensorsInsteadOfThreeFp32) {
  const double T = 8192;
  const MemoryPrediction eager = memory("dp=8,zero=3,recompute=full", 8192);
  const MemoryPrediction model = memory("dp=8,zero=3,recompute=full,compile=model", 8192);
  const MemoryPrediction both = memory("dp=8,zero=3,recompute=full,compile=model+loss", 8192);
  EXPECT_NEAR(cat(eager, Phase::loss, Mem::logits), (12.0 * T * kVocab + 2.0 * T * kHidden) * (1 + frag()), 1.0);
  EXPECT_NEAR(cat(both, Phase::loss, Mem::logits), (4.0 * T * kVocab + 2.0 * T * kHidden) * (1 + frag()), 1.0);
  EXPECT_NEAR(cat(eager, Phase::loss, Mem::logits) - cat(both, Phase::loss, Mem::logits), 8405385216.0 * (1 + frag()), 1.0);
  EXPECT_DOUBLE_EQ(cat(model, Phase::loss, Mem::logits), cat(eager, Phase::loss, Mem::logits));
}

// recompute=none, dp=8, mbs=1, 8192 tokens (T = 8192). Eager torchtitan saves 4 [T, F] MLP tensors
// (w1's output, SiLU's, w3's, the product) and both norm outputs ([T, h] each); a compiled block saves
// w1's and w3's outputs and recomputes the pointwise rest: per layer 2 x T x F x 2 B + 2 x T x h x 2 B
// = 469,762,048 + 134,217,728 = 603,979,776 B fewer, x 32 layers at the loss (every layer saved).
TEST(TorchCompile, CompiledBlockSavesTwoFfnTensorsAndNoNormOutput) {
  const double T = 8192;
  const double per_layer = 2.0 * T * kFfn * 2.0 + 2.0 * T * kHidden * 2.0;
  EXPECT_DOUBLE_EQ(per_layer, 603979776.0);
  const MemoryPrediction eager = memory("dp=8,zero=3,recompute=none", 8192);
  const MemoryPrediction compiled = memory("dp=8,zero=3,recompute=none,compile=model", 8192);
  EXPECT_NEAR(cat(eager, Phase::loss, Mem::activations) - cat(compiled, Phase::loss, Mem::activations),
              kLayers * per_layer * (1 + frag()), 1.0);
}

// recompute=selective is torchtitan's op-level SAC: a block keeps its input and the outputs of the
// _save_list ops but every second aten.mm (wq, wv, w1, w2 of wq, wk, wv, wo, w1, w3, w2), SDPA's output
// and LSE. dp=8, mbs=2 at 8192 tokens: T = 16384, per layer
//   x, q (wq), v (wv), SDPA out, w2's out: T x (4096 + 4096 + 1024 + 4096 + 4096) x 2 B
//   w1's out: T x 14336 x 2 B; LSE: T x 32 heads x 4 B
// = 16384 x (34816 + 28672 + 128) = 1,042,284,544 B; the loss phase holds 32 of them and the last
// layer's output (T x h x 2 B). Eager and compile=model keep the same set (the partitioner honours
// the policy's MUST_SAVE / PREFER_RECOMPUTE tags).
TEST(TorchCompile, OpSacKeepsItsSaveListOutputsEagerOrCompiled) {
  const double T = 16384;
  const double per_layer = T * (2.0 * (4 * kHidden + 1024) + 2.0 * kFfn + 32 * 4.0);
  EXPECT_DOUBLE_EQ(per_layer, 1042284544.0);
  for (const char* plan : {"dp=8,zero=3,recompute=selective,mbs=2", "dp=8,zero=3,recompute=selective,mbs=2,compile=model"}) {
    const MemoryPrediction mp = memory(plan, 8192);
    EXPECT_NEAR(cat(mp, Phase::loss, Mem::activations), (kLayers * per_layer + 2.0 * T * kHidden) * (1 + frag()), 1.0) << plan;
  }
}

// FSDP2 allocates the sharded gradient on the reduce-scatter stream; its pool keeps the bytes after
// zero_grad, so the forward and the loss of every later step see them: fp32 (4 B) x parameters / 8
// shards at zero=3 over 8 GPUs. DDP-style zero=0 has no reduce-scatter stream term (the term is FSDP's).
TEST(TorchCompile, ReduceScatterStreamKeepsTheShardedGradientReserved) {
  const double params = static_cast<double>(total_params(resolve_model(testing::built_in_profiles(), "Llama-3.1-8B")));
  const MemoryPrediction mp = memory("dp=8,zero=3,recompute=full", 8192);
  EXPECT_DOUBLE_EQ(cat(mp, Phase::forward, Mem::grads), 4.0 * params / 8.0);
  EXPECT_DOUBLE_EQ(cat(mp, Phase::loss, Mem::grads), 4.0 * params / 8.0);
  // hf-deepspeed states no such term: its bf16 partition is persistent anyway (2 B / 8)
  EXPECT_DOUBLE_EQ(cat(memory("dp=8,zero=3,recompute=full", 8192, "hf-deepspeed"), Phase::loss, Mem::grads), 2.0 * params / 8.0);
}

// Under TP torchtitan's loss runs in PyTorch's loss_parallel: _nll_loss_and_log_softmax_backward
// returns (grad_input + exp(x)) * grad_output beside the saved fp32 log-softmax x, 4 fp32 copies of
// [T, V / tp]. tp=2, dp=4, mbs=1 at 8192 tokens: T = 8192 rows (after the SP gather), V / tp = 64,128:
// 16 B x 8192 x 64128 = 8,405,385,216 B, plus d(final hidden) [T, h] bf16 = 67,108,864 B.
TEST(TorchCompile, LossParallelHoldsFourFp32VocabShardCopies) {
  const double T = 8192, v_shard = 64128;
  const MemoryPrediction mp = memory("tp=2,dp=4,zero=3,recompute=full", 8192);
  EXPECT_DOUBLE_EQ(16.0 * T * v_shard + 2.0 * T * kHidden, 8405385216.0 + 67108864.0);
  EXPECT_NEAR(cat(mp, Phase::loss, Mem::logits), (8405385216.0 + 67108864.0) * (1 + frag()), 1.0);
}

// compile changes memory only: the time model prices eager kernels with or without it
TEST(TorchCompile, TheStepTimeIsTheEagerOne) {
  const testing::PricedJob e = testing::built_in_job("dp=8,zero=3,recompute=selective,mbs=2", 8192, "Llama-3.1-8B", "8xh100-96gb", "torchtitan");
  const testing::PricedJob c =
      testing::built_in_job("dp=8,zero=3,recompute=selective,mbs=2,compile=model+loss", 8192, "Llama-3.1-8B", "8xh100-96gb", "torchtitan");
  const StepCosts ke = step_costs(e.m, e.c, e.rt, e.p, e.seq, true, nullptr);
  const StepCosts kc = step_costs(c.m, c.c, c.rt, c.p, c.seq, true, nullptr);
  EXPECT_DOUBLE_EQ(ke.head_fwd + ke.head_bwd, kc.head_fwd + kc.head_bwd);
  EXPECT_DOUBLE_EQ(ke.mlp_fwd + ke.mlp_bwd, kc.mlp_fwd + kc.mlp_bwd);
}

TEST(TorchCompile, RuntimesThatDoNotListItRefuseIt) {
  const Profiles& pr = testing::built_in_profiles();
  const RuntimeProfile& tt = resolve_runtime(pr, "torchtitan");
  for (const char* ok : {"zero=3,compile=model", "zero=3,compile=model+loss", "zero=3,compile=off"})
    EXPECT_EQ(missing_capability(tt.capabilities, tt.name, parse_plan(ok)), "") << ok;
  for (const char* name : {"megatron", "hf-deepspeed", "llm-foundry", "ctxrun-cuda", "ctxrun-cpu"}) {
    const RuntimeProfile& rt = resolve_runtime(pr, name);
    ASSERT_TRUE(rt.capabilities.declared) << name;
    const std::string zero = "zero=" + std::to_string(rt.capabilities.zero.front());  // a stage it runs
    const std::string why = missing_capability(rt.capabilities, rt.name, parse_plan(zero + ",compile=model"));
    EXPECT_NE(why.find("compile=model"), std::string::npos) << name << ": " << why;
    EXPECT_EQ(missing_capability(rt.capabilities, rt.name, parse_plan(zero + ",compile=off")), "") << name;
  }
}

TEST(TorchCompile, PlanKeyParsesRoundTripsAndNamesValidValues) {
  EXPECT_EQ(parse_plan("compile=model+loss").compile, Compile::model_loss);
  EXPECT_EQ(parse_plan("compile=model").compile, Compile::model);
  EXPECT_EQ(parse_plan("compile=0").compile, Compile::off);
  const Plan p = parse_plan("dp=8,zero=3,compile=model+loss");
  EXPECT_NE(plan_to_string(p).find("compile=model+loss"), std::string::npos);
  EXPECT_EQ(plan_from_json(plan_to_json(p), "test").compile, Compile::model_loss);
  EXPECT_EQ(plan_to_json(parse_plan("dp=8")).count("compile"), 0u);  // eager plans carry no key
  try {
    parse_plan("compile=1");
    FAIL() << "compile=1 accepted";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("compile"), std::string::npos) << what;
    EXPECT_NE(what.find("model+loss"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace ctx
