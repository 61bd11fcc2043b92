// The torchtitan runtime profile (profiles/runtimes/torchtitan.json, issue 21): it loads with a
// source for every constant, its memory conventions differ from hf-deepspeed's by exactly the
// arithmetic of the constants that differ (FSDP2's facts, not fitted numbers), the published
// torchtitan points are priced with it, and a torchtitan TOML imports onto it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/runtime_capabilities.hpp"
#include "planner/validation_points.hpp"
#include "built_in_profiles.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(default_profiles_dir());
  return p;
}

MemoryPrediction memory(const std::string& runtime, const std::string& plan_text, int64_t seq) {
  return testing::built_in_plan_memory("Llama-3.1-8B", runtime, plan_text, seq);
}

double cat(const MemoryPrediction& mp, Phase ph, Mem m) { return mp.phase_peak[static_cast<int>(ph)][m]; }

TEST(TorchtitanRuntime, LoadsWithASourceForEveryConstantAndRunsSdpaByDefault) {
  const RuntimeProfile rt = resolve_runtime(profiles(), "torchtitan");
  const RuntimeProfile ds = resolve_runtime(profiles(), "hf-deepspeed");
  // every constant the parser reads for hf-deepspeed is stated for torchtitan too, each with a source
  // (but hf-deepspeed's calibrated scales: optional, fitted to its own runs, docs/CALIBRATION.md)
  for (auto& [key, src] : ds.sources) {
    bool calibrated = false;
    for (auto& n : calibration_constant_names()) calibrated |= key == n;
    if (calibrated) continue;
    auto it = rt.sources.find(key);
    ASSERT_NE(it, rt.sources.end()) << "torchtitan.json lacks " << key;
    EXPECT_GT(it->second.size(), 20u) << key << ": " << it->second;
  }
  // torchtitan's ScaledDotProductAttention: SDPA's flash backend on H100 (cuDNN first only on B200)
  EXPECT_EQ(rt.attention_kernel, "sdpa");
  EXPECT_EQ(rt.attention_kernels, (std::vector<std::string>{"sdpa", "flex", "cudnn"}));
}

// Llama-3.1-8B, zero=3 over 8 GPUs. FSDP2 (MixedPrecisionPolicy bf16/fp32, AdamW) keeps per
// parameter: the fp32 sharded parameter, which the optimizer steps (4 B), its fp32 sharded gradient
// (4 B) and AdamW's two fp32 moments (8 B) = 16 B / 8 shards. DeepSpeed ZeRO-3 under bf16 keeps a
// bf16 parameter shard (2 B) beside a separate fp32 master (4 B), its gradient partition in bf16
// (2 B, stage3.py grad_partitions_flat_buffer) and the moments (8 B) = 16 B / 8 as well; in the step
// it flattens one sub-group (sub_group_size 1e9 of the 1,003,782,656-element partition) in bf16 and
// converts it to fp32 (_prepare_fp32_grad_for_sub_group): 1e9 x (2 + 4) = 6.0 GB more in the
// optimizer phase (costmodel/framework_memory.hpp zero3_step_grad_bytes).
TEST(TorchtitanRuntime, Fsdp2ModelStatesAreSixteenBytesPerParameterOverTheShards) {
  const double params = static_cast<double>(total_params(resolve_model(profiles(), "Llama-3.1-8B")));
  const MemoryPrediction tt = memory("torchtitan", "dp=8,zero=3,recompute=full", 8192);
  const MemoryPrediction ds = memory("hf-deepspeed", "dp=8,zero=3,recompute=full", 8192);
  auto states = [](const MemoryPrediction& mp) {
    return cat(mp, Phase::optimizer, Mem::weights) + cat(mp, Phase::optimizer, Mem::grads) +
           cat(mp, Phase::optimizer, Mem::master_weights) + cat(mp, Phase::optimizer, Mem::optimizer);
  };
  EXPECT_DOUBLE_EQ(states(tt), 16.0 * params / 8.0);
  EXPECT_DOUBLE_EQ(states(ds), 16.0 * params / 8.0 + 6e9);
  EXPECT_DOUBLE_EQ(states(ds) - states(tt), 6e9);
  // torchtitan's train_step starts with optimizer.zero_grad() (set_to_none): no gradient exists in
  // the forward of a step without accumulation, but FSDP2 allocated the sharded fp32 gradients on its
  // reduce-scatter stream, whose caching-allocator pool keeps their 4 B / 8 reserved
  // (grad_shards_reserved_by_reduce_stream); DeepSpeed keeps its bf16 gradient partition (2 B / 8)
  EXPECT_DOUBLE_EQ(cat(tt, Phase::forward, Mem::grads), 4.0 * params / 8.0);
  EXPECT_DOUBLE_EQ(cat(ds, Phase::forward, Mem::grads), 2.0 * params / 8.0);
}

// torchtitan deletes the bf16 logits before loss.backward(); F.cross_entropy(pred.float()) then holds
// three fp32 [tokens, vocab] tensors at log_softmax's backward, as transformers' loss does, while the
// HF stack also keeps its bf16 outputs.logits. At 8192 tokens per rank and a 128,256-token vocabulary
// the loss phase's logits category differs by exactly 2 B x 8192 x 128256 = 2.10 GB, times the
// allocator slack both profiles state.
TEST(TorchtitanRuntime, TheLossBackwardHoldsNoBf16Logits) {
  const MemoryPrediction tt = memory("torchtitan", "dp=8,zero=3,recompute=full", 8192);
  const MemoryPrediction ds = memory("hf-deepspeed", "dp=8,zero=3,recompute=full", 8192);
  const double frag = resolve_runtime(profiles(), "torchtitan").fragmentation;
  ASSERT_EQ(frag, resolve_runtime(profiles(), "hf-deepspeed").fragmentation);
  const double tokens = 8192, vocab = 128256;
  EXPECT_NEAR(cat(ds, Phase::loss, Mem::logits) - cat(tt, Phase::loss, Mem::logits), 2.0 * tokens * vocab * (1.0 + frag), 1.0);
  // 3 fp32 copies and d(final hidden) [8192, 4096] in bf16
  EXPECT_NEAR(cat(tt, Phase::loss, Mem::logits), (3.0 * 4.0 * tokens * vocab + tokens * 4096 * 2.0) * (1.0 + frag), 1.0);
}

// What torchtitan runs (the profile's "capabilities", each statement with its source at commit
// 000204a4): PyTorch's context parallel with its two rotate methods, load-balanced, FSDP2/DDP, no
// Ulysses, no optimizer-only sharding, no activation offload or tiling.
TEST(TorchtitanRuntime, CapabilitiesAdmitItsPlansAndNameWhatItCannotRun) {
  const RuntimeProfile rt = resolve_runtime(profiles(), "torchtitan");
  ASSERT_TRUE(rt.capabilities.declared);
  // every key of runtime_capabilities.hpp, each sourced: the 15 plan axes, master/grads/moments
  // (issue 21 part 5: the runtime's own values when not stated) and zero_shard (part 4)
  // and zero_with_pp (FSDP under pipeline stages is ZeRO-1), compile, and tp_overlap (async TP is not TE's userbuffers)
  EXPECT_EQ(rt.capabilities.sources.size(), 22u);
  EXPECT_FALSE(rt.capabilities.tp_overlap);
  for (auto& [key, src] : rt.capabilities.sources) EXPECT_GT(src.size(), 20u) << key;
  for (const char* ok : {"dp=8,zero=3,recompute=selective", "dp=4,cp=2,cp_kind=allgather,zero=3,recompute=full",
                         "dp=2,cp=4,cp_kind=zigzag,zero=3,recompute=full", "dp=8,zero=2", "dp=8,zero=0,recompute=none",
                         "dp=8,zero=3,opt_offload=1,param_offload=1", "dp=4,pp=2,zero=1,ga=4", "dp=4,pp=2,zero=1,zero_shard=2,ga=4"})
    EXPECT_EQ(missing_capability(rt.capabilities, rt.name, parse_plan(ok)), "") << ok;
  const std::pair<const char*, const char*> refused[] = {
      {"cp=8,cp_kind=ulysses,zero=3", "cp_comm"},       // no all-to-all of heads
      {"dp=2,cp=4,cp_kind=ring,zero=3", "cp_layout"},   // load balancing cannot be turned off
      {"dp=8,zero=1", "zero"},                          // FSDP2 has no optimizer-only sharding
      {"dp=8,zero=3,recompute=full,ckpt_offload=1", "ckpt_offload"},
      {"dp=8,zero=3,tiled_loss=4096", "tiled_loss"},
      {"dp=4,pp=2,zero=3,ga=4", "zero_with_pp"},       // FSDP under pipelining is never resharded mid-step
  };
  for (auto& [plan, key] : refused) {
    const std::string why = missing_capability(rt.capabilities, rt.name, parse_plan(plan));
    EXPECT_NE(why.find(std::string(key) + "="), std::string::npos) << plan << ": " << why;
  }
}

// The published torchtitan runs (paper Table 1/5, repo benchmarks) are priced with the torchtitan
// profile and, since the points state no kernel beyond the reference's "SDPA", its SDPA default.
TEST(TorchtitanRuntime, PublishedTorchtitanPointsArePricedWithIt) {
  const auto rows = predict_published_time(profiles(), "tt-8b-", "");
  ASSERT_EQ(rows.size(), 10u);  // tokens/s (fit) and peak memory (check) of the 5 runs
  for (auto& r : rows) {
    EXPECT_EQ(r.runtime, "torchtitan") << r.id;
    EXPECT_EQ(r.attention, "sdpa") << r.id;
    EXPECT_GT(r.predicted, 0.0) << r.id;
  }
  // and none of them under hf-deepspeed any more
  EXPECT_TRUE(predict_published_time(profiles(), "tt-8b-", "hf-deepspeed").empty());
}

}  // namespace
}  // namespace ctx
