// Properties of the memory model that follow from what each plan knob does.
#include <gtest/gtest.h>

#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(default_profiles_dir());
  return p;
}

MemoryPrediction run(const std::string& plan_text, int64_t seq = 131072, const std::string& cluster = "8xh100",
                     const std::string& model = "Llama-3.1-8B", const std::string& runtime = "megatron") {
  ModelSpec m = resolve_model(profiles(), model);
  ClusterSpec c = resolve_cluster(profiles(), cluster);
  Plan p = parse_plan(plan_text);
  PlanCheck chk = check_plan(p, m, c, seq);
  EXPECT_TRUE(chk.ok()) << plan_text << ": " << chk.message();
  return predict_memory(m, c, resolve_runtime(profiles(), runtime), p, seq);
}

double states(const MemoryPrediction& mp) {
  const MemorySnapshot& s = mp.phase_peak[static_cast<int>(Phase::optimizer)];
  return s[Mem::weights] + s[Mem::grads] + s[Mem::master_weights] + s[Mem::optimizer];
}

TEST(MemoryModel, ZeroStagesShardExactlyTheirStatesOverDpTimesCp) {
  // 8B on 8 GPUs with dp=4, cp=2: ZeRO shards over 8 ranks
  MemoryPrediction z0 = run("dp=4,cp=2,zero=0"), z1 = run("dp=4,cp=2,zero=1"), z2 = run("dp=4,cp=2,zero=2"),
                   z3 = run("dp=4,cp=2,zero=3");
  auto cat = [](const MemoryPrediction& mp, Mem m) { return mp.phase_peak[static_cast<int>(Phase::optimizer)][m]; };
  EXPECT_DOUBLE_EQ(cat(z1, Mem::optimizer), cat(z0, Mem::optimizer) / 8);
  EXPECT_DOUBLE_EQ(cat(z1, Mem::master_weights), cat(z0, Mem::master_weights) / 8);
  EXPECT_DOUBLE_EQ(cat(z1, Mem::grads), cat(z0, Mem::grads));
  EXPECT_DOUBLE_EQ(cat(z2, Mem::grads), cat(z0, Mem::grads) / 8);
  EXPECT_DOUBLE_EQ(cat(z2, Mem::weights), cat(z0, Mem::weights));
  EXPECT_DOUBLE_EQ(cat(z3, Mem::weights), cat(z0, Mem::weights) / 8);
}

TEST(MemoryModel, Fp32PlanStoresWeightsInFourBytesAndKeepsFp32States) {
  // precision=fp32 doubles the bf16 profile's 2-byte weights; grads, master and Adam states are fp32 either way
  for (const char* plan : {"dp=8,zero=0", "dp=4,cp=2,zero=3"}) {
    SCOPED_TRACE(plan);
    auto cat = [](const MemoryPrediction& mp, Mem m) { return mp.phase_peak[static_cast<int>(Phase::optimizer)][m]; };
    MemoryPrediction b = run(std::string(plan) + ",precision=bf16", 32768);
    MemoryPrediction f = run(std::string(plan) + ",precision=fp32", 32768);
    EXPECT_EQ(cat(f, Mem::weights), 2.0 * cat(b, Mem::weights));
    EXPECT_EQ(cat(f, Mem::grads), cat(b, Mem::grads));
    EXPECT_EQ(cat(f, Mem::master_weights), cat(b, Mem::master_weights));
    EXPECT_EQ(cat(f, Mem::optimizer), cat(b, Mem::optimizer));
    EXPECT_GT(f.peak[Mem::activations], b.peak[Mem::activations]);
  }
}

TEST(MemoryModel, RuntimeForPrecisionChangesOnlyTheStoredDtypes) {
  const RuntimeProfile& rt = resolve_runtime(profiles(), "megatron");
  RuntimeProfile f = runtime_for_precision(rt, Precision::fp32);
  EXPECT_EQ(f.weight_bytes, 4);
  EXPECT_EQ(f.activation_bytes, 4);
  EXPECT_EQ(f.logits_bytes, 4);
  EXPECT_EQ(f.grad_bytes, rt.grad_bytes);
  EXPECT_EQ(f.master_bytes, rt.master_bytes);
  EXPECT_EQ(f.optimizer_bytes, rt.optimizer_bytes);
  EXPECT_EQ(f.reserved_bytes, rt.reserved_bytes);
  EXPECT_FALSE(precision_changes_runtime(f, Precision::fp32)) << "applying it twice changes nothing";
  for (Precision q : {Precision::bf16, Precision::fp8}) {
    EXPECT_FALSE(precision_changes_runtime(rt, q));
    EXPECT_EQ(runtime_for_precision(rt, q).weight_bytes, rt.weight_bytes);
  }
}

TEST(MemoryModel, RecomputeOrdersActivationMemory) {
  double none = run("cp=8,recompute=none", 32768).peak.total();
  double sel = run("cp=8,recompute=selective", 32768).peak.total();
  double full = run("cp=8,recompute=full", 32768).peak.total();
  EXPECT_GT(none, sel);
  EXPECT_GT(sel, full);
}

TEST(MemoryModel, MoreContextParallelNeverNeedsMorePerGpuActivations) {
  double prev = 1e300;
  for (int cp : {1, 2, 4, 8}) {
    MemoryPrediction mp = run("cp=" + std::to_string(cp) + ",zero=3,recompute=full", 65536);
    double act = mp.peak.total() - states(mp);
    EXPECT_LT(act, prev) << "cp=" << cp;
    prev = act;
  }
}

TEST(MemoryModel, ZigZagAndRingHoldTheSameBytes) {
  // placement changes who computes what, not what each rank stores
  EXPECT_DOUBLE_EQ(run("cp=8,cp_kind=ring,recompute=full").peak.total(),
                   run("cp=8,cp_kind=zigzag,recompute=full").peak.total());
}

TEST(MemoryModel, CheckpointOffloadMovesCheckpointsToHost) {
  MemoryPrediction dev = run("cp=8,zero=3,recompute=full", 1048576);
  MemoryPrediction off = run("cp=8,zero=3,recompute=full,ckpt_offload=1", 1048576);
  double ckpt = dev.phase_peak[static_cast<int>(Phase::loss)][Mem::checkpoints];
  EXPECT_GT(ckpt, 0);
  // 8 ranks per node each put all their checkpoints on the host
  // (the device figure carries the runtime's allocator slack; host buffers are pinned, exact)
  double frag = resolve_runtime(profiles(), "megatron").fragmentation;
  EXPECT_DOUBLE_EQ(off.host_bytes_per_node[static_cast<int>(HostMem::checkpoints)], 8 * ckpt / (1.0 + frag));
  EXPECT_LT(off.phase_peak[static_cast<int>(Phase::loss)][Mem::checkpoints], ckpt / 10);
}

TEST(MemoryModel, OptimizerOffloadEmptiesDeviceStatesAndFillsHost) {
  MemoryPrediction mp = run("dp=8,zero=1,opt_offload=1", 8192);
  EXPECT_EQ(mp.peak[Mem::optimizer], 0);
  EXPECT_EQ(mp.peak[Mem::master_weights], 0);
  EXPECT_GT(mp.host_bytes_per_node[static_cast<int>(HostMem::optimizer)], 0);
}

TEST(MemoryModel, TiledLossShrinksTheLogitsWorkingSet) {
  MemoryPrediction untiled = run("cp=8,recompute=full", 131072);
  MemoryPrediction tiled = run("cp=8,recompute=full,tiled_loss=1024", 131072);
  EXPECT_LT(tiled.phase_peak[static_cast<int>(Phase::loss)][Mem::logits],
            untiled.phase_peak[static_cast<int>(Phase::loss)][Mem::logits] / 4);
}

TEST(MemoryModel, UlyssesBeyondKvHeadsReplicatesKv) {
  // 8B has 8 KV heads: Ulysses 8 gives each rank one KV head; Ulysses 32 still one (replicated)
  ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  Plan u8 = parse_plan("cp=8,cp_kind=ulysses"), u32 = parse_plan("cp=32,cp_kind=ulysses");
  u8.dp = u32.dp = 1;
  EXPECT_DOUBLE_EQ(local_shapes(m, u8, 1 << 20).kv_heads, 1.0);
  EXPECT_DOUBLE_EQ(local_shapes(m, u32, 1 << 20).kv_heads, 1.0);
  EXPECT_DOUBLE_EQ(local_shapes(m, u32, 1 << 20).q_heads, 1.0);
}

TEST(MemoryModel, PeakIsTheLargestPhaseNotASumOfMaxima) {
  MemoryPrediction mp = run("cp=8,zero=3,recompute=full", 131072);
  double max_phase = 0, sum_of_category_maxima = 0;
  for (auto& s : mp.phase_peak) max_phase = std::max(max_phase, s.total());
  for (int c = 0; c < kMemCategories; ++c) {
    double m = 0;
    for (auto& s : mp.phase_peak) m = std::max(m, s.bytes[c]);
    sum_of_category_maxima += m;
  }
  EXPECT_DOUBLE_EQ(mp.peak.total(), max_phase);
  EXPECT_LT(mp.peak.total(), sum_of_category_maxima);
}

TEST(MemoryModel, MaxTrainableSequenceGrowsWithGpus) {
  ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const RuntimeProfile& rt = resolve_runtime(profiles(), "hf-deepspeed");
  int64_t prev = 0;
  for (int gpus : {1, 2, 4, 8}) {
    Plan p = parse_plan("cp=" + std::to_string(gpus) + ",cp_kind=ulysses,zero=3,recompute=full,opt_offload=1");
    p.dp = 1;
    ClusterSpec c = resolve_cluster(profiles(), std::to_string(gpus) + "xh100");
    int64_t s = max_trainable_seq(m, c, rt, p, int64_t(1) << 26);
    EXPECT_GT(s, prev) << gpus << " GPUs";
    prev = s;
  }
}

TEST(MemoryModel, MegatronFullRecomputeHoldsTheRecomputedLayerOutput) {
  // megatron/core/tensor_parallel/random.py CheckpointFunction.backward keeps `outputs` (the recomputed
  // layer's [s/tp, b, h] under SP) referenced while torch.autograd.backward runs the layer's backward:
  // 131,072 tokens over cp x tp = 8 ranks -> 16,384 x 4096 x 2 B = 134,217,728 B at both backward high
  // points, x 1.05 (megatron's fragmentation), against the same profile without the term
  const double out_bytes = 16384.0 * 4096.0 * 2.0 * 1.05;
  const RuntimeProfile with = resolve_runtime(profiles(), "megatron");
  EXPECT_TRUE(with.recompute_keeps_output);
  RuntimeProfile without = with;
  without.recompute_keeps_output = false;
  ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  ClusterSpec c = resolve_cluster(profiles(), "8xh100");
  auto backward = [&](const RuntimeProfile& rt, const std::string& plan) {
    return predict_memory(m, c, rt, parse_plan(plan), 131072).phase_peak[static_cast<int>(Phase::backward)];
  };
  for (const std::string plan : {"tp=8,recompute=full", "tp=4,cp=2,recompute=full"}) {
    SCOPED_TRACE(plan);
    // 1 B: the difference of two ~1e10 B sums of doubles, not a tolerance on the term
    EXPECT_NEAR(backward(with, plan).total() - backward(without, plan).total(), out_bytes, 1.0);
  }
  // selective recompute keeps the layer's tensors: no rematerialised output to hold
  EXPECT_DOUBLE_EQ(backward(with, "tp=8,recompute=selective").total(), backward(without, "tp=8,recompute=selective").total());
}

TEST(MemoryModel, Fsdp2RootUnitStaysUnshardedThroughTheStep) {
  // torchtitan under FSDP2 (zero3_root_unit_unsharded, zero3_last_layer_kept_after_forward): Llama-3.1-8B,
  // dp=8, zero=3 at 2 x 8K tokens. V x h = 128,256 x 4096 = 525,336,576 weights, 1,050,673,152 B in bf16; the
  // last block 4096 x (4096 + 2 x 1024 + 4096) + 3 x 4096 x 14,336 + 2 x 4096 = 218,112,000 weights, 436,224,000 B.
  // Against the same profile without the two terms (x 1.05, torchtitan's fragmentation):
  //   forward: embedding + head           2 x 1,050,673,152 B
  //   loss:    embedding + the last block 1,050,673,152 + 436,224,000 B (the head was counted at the loss before)
  //   backward: embedding + head + the head's bf16 gradient 3 x 1,050,673,152 B
  const double vh_bytes = 1050673152.0, block_bytes = 436224000.0, frag = 1.05;
  const RuntimeProfile with = resolve_runtime(profiles(), "torchtitan");
  EXPECT_TRUE(with.zero3_root_unit_unsharded);
  EXPECT_TRUE(with.zero3_last_layer_kept_after_forward);
  RuntimeProfile without = with;
  without.zero3_root_unit_unsharded = false;
  without.zero3_last_layer_kept_after_forward = false;
  ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  ClusterSpec c = resolve_cluster(profiles(), "8xh100");
  const Plan p = parse_plan("dp=8,zero=3,recompute=selective,mbs=2");
  const MemoryPrediction a = predict_memory(m, c, with, p, 8192), b = predict_memory(m, c, without, p, 8192);
  auto diff = [&](Phase ph) { return a.phase_peak[static_cast<int>(ph)].total() - b.phase_peak[static_cast<int>(ph)].total(); };
  // 1 B: the difference of two ~8e10 B sums of doubles, not a tolerance on the terms
  EXPECT_NEAR(diff(Phase::forward), 2 * vh_bytes * frag, 1.0);
  EXPECT_NEAR(diff(Phase::loss), (vh_bytes + block_bytes) * frag, 1.0);
  EXPECT_NEAR(diff(Phase::backward), 3 * vh_bytes * frag, 1.0);
  EXPECT_DOUBLE_EQ(diff(Phase::optimizer), 0.0);  // resharded at the backward's end
  // ZeRO-1/2 keep whole weights anyway: nothing changes
  const Plan z2 = parse_plan("dp=8,zero=2,recompute=selective,mbs=2");
  EXPECT_DOUBLE_EQ(predict_memory(m, c, with, z2, 8192).peak.total(), predict_memory(m, c, without, z2, 8192).peak.total());
  // the other stacks gather the embedding and head at the ends only
  for (const char* name : {"megatron", "hf-deepspeed", "llm-foundry", "ctxrun-cpu", "ctxrun-cuda"})
    EXPECT_FALSE(resolve_runtime(profiles(), name).zero3_root_unit_unsharded) << name;
}

}  // namespace
}  // namespace ctx
