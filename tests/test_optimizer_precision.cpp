// Optimizer and gradient precision as plan keys (issue 21, part 5): master=fp32|none,
// grads=fp32|bf16, moments=fp32|bf16|8bit.
//   - the keys parse, print only when set (unset = the runtime's own) and round-trip through JSON;
//     a bad value is an error naming the key and the valid values, exit 2 on the command line;
//   - the model-state bytes per GPU are the arithmetic of the dtypes (runtime_for_plan);
//   - the optimizer step's time is priced on the bytes it moves at those dtypes;
//   - each runtime allows the values its stack runs (capabilities "master", "grads", "moments"),
//     its own always, and refuses the others naming the key;
//   - the ring-attention memory write-up's configuration (Llama-3.1-8B fully sharded over a 4-H100
//     ring, contiguous ring attention, full activation checkpointing, bf16 gradients and Adam
//     moments, no fp32 master copy, 118K tokens) is predicted to fit.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "costmodel/errors.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/prediction.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/runtime_capabilities.hpp"
#include "costmodel/step_model.hpp"
#include "built_in_profiles.hpp"

namespace ctx {
namespace {

const Profiles& profiles() { return testing::built_in_profiles(); }
testing::RunResult ctxplan(std::vector<std::string> args) { return testing::ctxplan_with_built_in_profiles(std::move(args)); }

// Llama-3.1-8B's parameter count, from its Hugging Face config (32 layers, hidden 4096, 32 query and
// 8 KV heads of 128, ffn 14336, vocab 128256, untied head): 2 x 128256 x 4096 (embedding, head)
// + 32 x (2 x 4096 (norms) + 4096 x 4096 x 2 (q, o) + 4096 x 1024 x 2 (k, v) + 3 x 4096 x 14336)
// + 4096 (final norm) = 8,030,261,248.
constexpr double kLlama8BParams = 8030261248.0;

MemorySnapshot optimizer_phase(const std::string& plan_text, int64_t seq, const std::string& runtime) {
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const ClusterSpec c = resolve_cluster(profiles(), "4xh100");
  Plan p = parse_plan(plan_text);
  const PlanCheck chk = check_plan(p, m, c, seq);
  EXPECT_TRUE(chk.ok()) << plan_text << ": " << chk.message();
  return predict_memory(m, c, resolve_runtime(profiles(), runtime), p, seq).phase_peak[static_cast<int>(Phase::optimizer)];
}

TEST(OptimizerPrecision, KeysPrintOnlyWhenSetAndRoundTripThroughJson) {
  const Plan unset = parse_plan("dp=4,zero=3");
  EXPECT_EQ(unset.master, StateDtype::runtime);
  EXPECT_EQ(plan_to_string(unset).find("master"), std::string::npos) << "unset: the runtime's own, not printed";
  EXPECT_FALSE(plan_to_json(unset).contains("moments"));
  const Plan p = parse_plan("dp=4,zero=3,master=none,grads=bf16,moments=8bit");
  EXPECT_EQ(p.master, StateDtype::none);
  EXPECT_EQ(p.grads, StateDtype::bf16);
  EXPECT_EQ(p.moments, StateDtype::q8);
  const std::string text = plan_to_string(p);
  EXPECT_NE(text.find(",master=none,grads=bf16,moments=8bit"), std::string::npos) << text;
  const Plan back = plan_from_json(plan_to_json(p), "test");
  EXPECT_EQ(plan_to_string(back), text);
  EXPECT_EQ(parse_plan(text).moments, StateDtype::q8);
  // a value set to the runtime's own (fp32 on every built-in profile) is printed: the plan says it
  EXPECT_NE(plan_to_string(parse_plan("master=fp32")).find("master=fp32"), std::string::npos);
  EXPECT_EQ(parse_plan("moments=runtime").moments, StateDtype::runtime);
}

TEST(OptimizerPrecision, ABadValueNamesTheKeyAndTheValidValues) {
  for (const char* bad : {"moments=4bit", "grads=fp16", "master=bf16"}) {
    SCOPED_TRACE(bad);
    const std::string key = std::string(bad).substr(0, std::string(bad).find('='));
    try {
      parse_plan(bad);
      ADD_FAILURE() << "accepted";
    } catch (const InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(key), std::string::npos) << msg;
      EXPECT_NE(msg.find("valid: fp32|"), std::string::npos) << msg;
    }
  }
  const auto r = ctxplan({"predict", "--model", "Llama-3.1-8B", "--cluster", "4xh100", "--seq", "32k", "--runtime", "megatron",
                          "--plan", "dp=4,zero=3,moments=4bit"});
  EXPECT_EQ(r.exit_code, 2) << r.both();
  EXPECT_NE(r.err.find("moments"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("fp32|bf16|8bit"), std::string::npos) << r.err;
}

// Model states per GPU, zero=3 over 4 GPUs (every state sharded over the 4 ranks): per parameter,
// the runtime's own 2 (bf16 weights) + 4 (fp32 grads) + 4 (fp32 master) + 8 (fp32 m, v) = 18 bytes;
// with master=none,grads=bf16,moments=bf16: 2 + 2 + 0 + 4 = 8 bytes; moments=8bit: 1 byte per
// element of m and of v plus one fp32 scale per 256-element block, 2 x (1 + 4/256) = 2.03125 bytes.
TEST(OptimizerPrecision, ModelStateBytesPerGpuAreTheArithmeticOfTheDtypes) {
  ASSERT_EQ(static_cast<double>(total_params(resolve_model(profiles(), "Llama-3.1-8B"))), kLlama8BParams);
  const double P = kLlama8BParams, gpus = 4;
  struct Row {
    const char* keys;
    double weights, grads, master, moments;  // bytes per parameter
  };
  const Row rows[] = {{"", 2, 4, 4, 8},
                      {",master=none,grads=bf16,moments=bf16", 2, 2, 0, 4},
                      {",moments=8bit", 2, 4, 4, 2.0 * (1.0 + 4.0 / 256.0)},
                      {",master=fp32,grads=fp32,moments=fp32", 2, 4, 4, 8}};
  for (const Row& r : rows) {
    SCOPED_TRACE(r.keys);
    const MemorySnapshot s = optimizer_phase(std::string("dp=4,zero=3") + r.keys, 32768, "ctxrun-cuda");
    // double arithmetic of the same products: equal to the last bit or two
    EXPECT_NEAR(s[Mem::weights], r.weights * P / gpus, 1e-9 * P);
    EXPECT_NEAR(s[Mem::grads], r.grads * P / gpus, 1e-9 * P);
    EXPECT_NEAR(s[Mem::master_weights], r.master * P / gpus, 1e-9 * P);
    EXPECT_NEAR(s[Mem::optimizer], r.moments * P / gpus, 1e-9 * P);
  }
  // the total: 8 bytes x P / 4 = 16,060,522,496 bytes of model states per GPU
  const MemorySnapshot low = optimizer_phase("dp=4,zero=3,master=none,grads=bf16,moments=bf16", 32768, "ctxrun-cuda");
  EXPECT_NEAR(low[Mem::weights] + low[Mem::grads] + low[Mem::master_weights] + low[Mem::optimizer], 16060522496.0, 1.0);
}

// The device AdamW streams, per parameter of the rank's shard: the gradient (read), the weights it
// steps (master: read + write, plus the bf16 copy written; master=none: the compute weights read +
// written) and m, v (read + written). Runtime's own dtypes: 4 + 2 x 4 + 2 + 2 x 8 = 30 bytes;
// master=none,grads=bf16,moments=bf16: 2 + 2 x 2 + 2 x 4 = 14 bytes. Priced as every memory-bound
// kernel: bytes x traffic factor / (HBM bandwidth x the hardware curve's efficiency at that size) + launch.
TEST(OptimizerPrecision, OptimizerTimeIsPricedOnTheBytesOfItsDtypes) {
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const ClusterSpec c = resolve_cluster(profiles(), "4xh100");
  const RuntimeProfile& rt = resolve_runtime(profiles(), "ctxrun-cuda");
  auto priced = [&](double bytes) {
    bytes *= rt.memory_traffic_factor;
    return bytes / (c.gpu.hbm_bytes_per_second * c.gpu.kernels.memory.at(bytes)) + c.gpu.kernels.launch_seconds;
  };
  const double shard = kLlama8BParams / 4;
  for (auto [keys, bytes_per_param] : {std::pair<const char*, double>{"", 30}, {",master=none,grads=bf16,moments=bf16", 14}}) {
    SCOPED_TRACE(keys);
    Plan p = parse_plan(std::string("dp=4,zero=3") + keys);
    ASSERT_TRUE(check_plan(p, m, c, 32768).ok());
    const StepCosts k = step_costs(m, c, rt, p, 32768, true, nullptr);
    EXPECT_NEAR(k.opt_device, priced(shard * bytes_per_param), 1e-9 * k.opt_device);
  }
}

// The data-parallel collectives the prediction lists move the plan's gradient dtype: zero=3 over 4
// GPUs reduce-scatters P x 4 bytes of fp32 gradients per micro-batch, P x 2 with grads=bf16; the
// parameter all-gathers stay bf16 weights (P x 2) either way.
TEST(OptimizerPrecision, TheGradientReductionMovesTheGradientDtype) {
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const ClusterSpec c = resolve_cluster(profiles(), "4xh100");
  const RuntimeProfile& rt = resolve_runtime(profiles(), "ctxrun-cuda");
  const std::vector<std::pair<std::string, double>> cases = {{"dp=4,zero=3", 4}, {"dp=4,zero=3,grads=bf16", 2}};
  for (const auto& [text, grad_bytes] : cases) {
    SCOPED_TRACE(text);
    const Plan plan = parse_plan(text);
    const Prediction pr = predict(m, c, rt, plan, 32768);
    int found = 0;
    for (const ZeroCommTerm& t : pr.zero_comm) {
      if (t.name == "grad_reduce_scatter") {
        ++found;
        EXPECT_DOUBLE_EQ(t.message_bytes, grad_bytes * kLlama8BParams);
      }
      if (t.name == "zero3_param_all_gather") {
        ++found;
        EXPECT_DOUBLE_EQ(t.message_bytes, 2 * kLlama8BParams);
      }
    }
    EXPECT_EQ(found, 2);
  }
}

TEST(OptimizerPrecision, EachRuntimeAllowsItsStacksValuesAndRefusesOthersNamingTheKey) {
  const Plan none = parse_plan("master=none"), bf16 = parse_plan("grads=bf16,moments=bf16"), q8 = parse_plan("moments=8bit");
  const Plan own = parse_plan("master=fp32,grads=fp32,moments=fp32");
  for (const char* name : {"ctxrun-cpu", "ctxrun-cuda", "hf-deepspeed", "megatron", "torchtitan"}) {
    SCOPED_TRACE(name);
    const RuntimeProfile& rt = resolve_runtime(profiles(), name);
    EXPECT_EQ(missing_capability(rt.capabilities, name, own), "") << "its own values (fp32 states) always run";
  }
  // Megatron: the precision-aware optimizer's bf16 main grads and moments, always a main fp32 copy
  const RuntimeProfile& mg = resolve_runtime(profiles(), "megatron");
  EXPECT_EQ(missing_capability(mg.capabilities, "megatron", bf16), "");
  EXPECT_NE(missing_capability(mg.capabilities, "megatron", none).find("cannot run master=none"), std::string::npos);
  EXPECT_NE(missing_capability(mg.capabilities, "megatron", q8).find("cannot run moments=8bit"), std::string::npos);
  // ctxrun's CPU backends: no master copy and bf16 moments (executor/params.cpp), fp32 gradients only
  const RuntimeProfile& cpu = resolve_runtime(profiles(), "ctxrun-cpu");
  EXPECT_EQ(missing_capability(cpu.capabilities, "ctxrun-cpu", parse_plan("master=none,moments=bf16")), "");
  EXPECT_NE(missing_capability(cpu.capabilities, "ctxrun-cpu", bf16).find("cannot run grads=bf16"), std::string::npos);
  // a runtime without capabilities states nothing: every value prices
  EXPECT_EQ(missing_capability(RuntimeCapabilities{}, "mine", q8), "");
  // predict refuses on the command line, naming the key (exit 2)
  const auto r = ctxplan({"predict", "--model", "Llama-3.1-8B", "--cluster", "4xh100", "--seq", "32k", "--runtime", "megatron",
                          "--plan", "dp=4,zero=1,master=none"});
  EXPECT_EQ(r.exit_code, 2) << r.both();
  EXPECT_NE(r.err.find("master=none"), std::string::npos) << r.err;
}

// The ring-attention memory write-up trained Llama-3.1-8B at 118K tokens on a ring of 4 H100s:
// fully sharded model states (zero=3 over the 4 ranks of the ring), contiguous ring attention
// (cp=4,cp_kind=ring), full activation checkpointing, bf16 gradients and bf16 Adam moments, no fp32
// master copy. 118K = 118 x 1024 = 120,832 tokens (the reference data states no other count).
// Predicted with ctxrun-cuda's memory conventions (the executor the project measures; the stack of
// the write-up is not named): it fits in an H100's usable memory, and its model states are the
// 8 bytes per parameter over 4 GPUs above. ctxrun runs every part of it but the bf16 gradients
// (it accumulates in fp32): its capabilities name exactly that, so `predict` needs --any-runtime.
TEST(OptimizerPrecision, TheRingAttentionWriteUpConfigurationFits) {
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const ClusterSpec c = resolve_cluster(profiles(), "4xh100");
  const int64_t seq = 118 * 1024;
  Plan p = parse_plan("dp=1,cp=4,cp_kind=ring,zero=3,recompute=full,grads=bf16,moments=bf16,master=none");
  ASSERT_TRUE(check_plan(p, m, c, seq).ok()) << check_plan(p, m, c, seq).message();
  const MemoryPrediction mp = predict_memory(m, c, resolve_runtime(profiles(), "ctxrun-cuda"), p, seq);
  EXPECT_TRUE(mp.fits()) << "peak " << mp.peak.total() << " B of " << mp.device_capacity_bytes;
  const MemorySnapshot& s = mp.phase_peak[static_cast<int>(Phase::optimizer)];
  EXPECT_NEAR(s[Mem::weights] + s[Mem::grads] + s[Mem::master_weights] + s[Mem::optimizer], 8.0 * kLlama8BParams / 4, 1.0);
  const std::string missing = missing_capability(resolve_runtime(profiles(), "ctxrun-cuda").capabilities, "ctxrun-cuda", p);
  EXPECT_NE(missing.find("cannot run grads=bf16"), std::string::npos) << missing;
  Plan fp32_grads = p;
  fp32_grads.grads = StateDtype::fp32;
  EXPECT_EQ(missing_capability(resolve_runtime(profiles(), "ctxrun-cuda").capabilities, "ctxrun-cuda", fp32_grads), "");
}

}  // namespace
}  // namespace ctx
