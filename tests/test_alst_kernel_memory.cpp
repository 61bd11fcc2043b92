// What the ALST stack's own code holds on the GPU, from its source, against hand arithmetic
// (issue 16, max-sequence fidelity of the hf-deepspeed runtime):
//  - ArcticTraining's checkpoint offload copies each layer's checkpoint to the host and back with
//    blocking copies (arctic_training/monkey_patches.py CheckpointFunctionWithCPUOffload at 9d33fd2,
//    the ALST release): no checkpoint stays on the device beyond the layer being run;
//  - with the tiled (Liger fused) loss the model is Liger's, whose untiled MLP is LigerSwiGLUMLP:
//    it saves gate, up and the product (3 [T, F]) and its backward adds only d(product), writing
//    d(gate), d(up) into the saved tensors (Liger-Kernel ops/swiglu.py); HF's eager LlamaMLP saves 4
//    and its backward adds 3 (d(act), d(gate), d(up));
//  - Liger's kernels of that release index [tokens, hidden] tensors with 32-bit offsets
//    (Liger-Kernel issue #803, fixed by PR #804): at most 2^31 - 1 elements per rank;
//  - transformers' gradient checkpointing is reentrant: CheckpointFunction.backward holds the
//    recomputed layer output while the layer's backward runs (torch/utils/checkpoint.py).
// Shapes (Llama-3.1-8B: hidden 4096, ffn 14336, 32 query / 8 KV heads of 128), seq 1,048,576 over
// Ulysses cp=8: T = 131,072 tokens per rank, X = T x 4096 x 2 B = 1,073,741,824 B (1 GiB), one
// [T, F] tensor = T x 14336 x 2 B = 3.5 X; the allocator slack of hf-deepspeed is 5% (x 1.05).
#include <gtest/gtest.h>

#include <string>

#include "costmodel/attention_kernels.hpp"
#include "costmodel/errors.hpp"
#include "costmodel/json_util.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(default_profiles_dir());
  return p;
}

MemoryPrediction run(const std::string& plan_text, int64_t seq, const std::string& cluster = "8xh100",
                     const std::string& runtime = "hf-deepspeed") {
  ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  ClusterSpec c = resolve_cluster(profiles(), cluster);
  Plan p = parse_plan(plan_text);
  PlanCheck chk = check_plan(p, m, c, seq);
  EXPECT_TRUE(chk.ok()) << plan_text << ": " << chk.message();
  return predict_memory(m, c, resolve_runtime(profiles(), runtime), p, seq);
}

double at(const MemorySnapshot& s, Mem c) { return s[c]; }
const MemorySnapshot& phase(const MemoryPrediction& mp, Phase ph) { return mp.phase_peak[static_cast<int>(ph)]; }

constexpr int64_t kSeq = 1048576;
constexpr double X = 1073741824.0;  // [T, hidden] bf16 at T = 131,072
constexpr double kFrag = 1.05;      // hf-deepspeed fragmentation 0.05
const std::string kUlysses = "cp=8,cp_kind=ulysses,zero=3,recompute=full,opt_offload=1";

// hf-deepspeed as shipped and with one of its boolean constants flipped, and the backward phase of an
// 8B plan at kSeq under each: what one term adds is the difference
struct FlippedConstant {
  RuntimeProfile shipped, flipped;
};
FlippedConstant flip_constant(const char* key) {
  json j = read_json_file(std::string(CTXPLAN_SOURCE_DIR) + "/profiles/runtimes/hf-deepspeed.json");
  FlippedConstant out{runtime_from_json(j, "hf-deepspeed.json"), {}};
  j["constants"][key]["value"] = !j["constants"][key]["value"].get<bool>();
  out.flipped = runtime_from_json(j, "test.json");
  return out;
}
MemorySnapshot backward_8b(const RuntimeProfile& rt, const std::string& plan_text) {
  return predict_memory(resolve_model(profiles(), "Llama-3.1-8B"), resolve_cluster(profiles(), "8xh100"), rt,
                        parse_plan(plan_text), kSeq)
      .phase_peak[static_cast<int>(Phase::backward)];
}

TEST(AlstKernelMemory, BlockingCheckpointOffloadKeepsNoCheckpointOnTheDevice) {
  // without offload the backward's high point holds layers 0..30's checkpoints; layer 31's, which
  // torch.utils.checkpoint keeps, is the rematerialised layer's input itself (CheckpointFunction.backward
  // runs the layer on detach_variable(saved_tensors), a tensor sharing the checkpoint's storage), counted
  // once, with that layer's tensors (activations): 31 X x 1.05 among the checkpoints
  MemoryPrediction kept = run(kUlysses + ",tiled_loss=4096", kSeq);
  EXPECT_DOUBLE_EQ(at(phase(kept, Phase::backward), Mem::checkpoints), 31 * X * kFrag);
  EXPECT_DOUBLE_EQ(at(phase(kept, Phase::forward), Mem::checkpoints), 31 * X * kFrag);
  // with ArcticTraining's offload the checkpoint moves by blocking arg.detach().cpu() in the forward
  // and tensors[0].to(device) at the start of its layer's backward: none is in flight or prefetched
  // (the current layer's input is that layer's own tensor, counted in its activations)
  MemoryPrediction off = run(kUlysses + ",tiled_loss=4096,ckpt_offload=1", kSeq);
  for (Phase ph : {Phase::forward, Phase::loss, Phase::backward}) EXPECT_EQ(at(phase(off, ph), Mem::checkpoints), 0.0);
  // the host holds all 32 per rank: 8 ranks x 32 X
  EXPECT_DOUBLE_EQ(off.host_bytes_per_node[static_cast<int>(HostMem::checkpoints)], 8 * 32 * X);
}

TEST(AlstKernelMemory, TiledLossRunsLigersSwiGluMlp) {
  // layer 31 at its MLP backward (the backward's high point here: it exceeds the attention backward's
  // 32 X + 5.5 X + 10 X + 2.5 X by 6.5 X), rematerialised layer, hand count in X:
  //   attention side: input 1, norm output 1, q (head layout, S x 4 heads x 128) 1, k and v
  //   (seq layout, T x 8 KV heads x 128 each) 0.5, output head layout 1 and seq layout 1 = 5.5 X,
  //   plus 1/rms (T x 4 B = 524,288 B) and the LSE (S x 4 heads x 4 B = 16,777,216 B)
  //   MLP side: input 1, norm output 1, 1/rms, and the MLP's saved [T, F] tensors (3.5 X each)
  //   and the recomputed layer output the reentrant checkpoint holds (1 X, recompute_keeps_output)
  const double rstd = 131072.0 * 4, lse = 1048576.0 * 4 * 4;
  const double attn_side = 5.5 * X + rstd + lse;
  MemoryPrediction liger = run(kUlysses + ",tiled_loss=4096", kSeq);
  const MemorySnapshot& lb = phase(liger, Phase::backward);
  // Liger: gate, up, product saved (3 x 3.5 X); its backward adds d(product) (3.5 X) beside the
  // three [T, hidden] activation gradients (backward_grad_tensors)
  EXPECT_DOUBLE_EQ(at(lb, Mem::activations), (attn_side + 2 * X + rstd + 3 * 3.5 * X + X) * kFrag);
  EXPECT_DOUBLE_EQ(at(lb, Mem::workspace), (1 * 3.5 * X + 3 * X) * kFrag);
  // HF eager LlamaMLP (no tiled loss: the plain Hugging Face model): 4 saved, 3 more in its backward
  MemoryPrediction eager = run(kUlysses, kSeq);
  const MemorySnapshot& eb = phase(eager, Phase::backward);
  EXPECT_DOUBLE_EQ(at(eb, Mem::activations), (attn_side + 2 * X + rstd + 4 * 3.5 * X + X) * kFrag);
  EXPECT_DOUBLE_EQ(at(eb, Mem::workspace), (3 * 3.5 * X + 3 * X) * kFrag);
  // TiledMLP switches Liger's MLP off (ArcticTraining liger_factory: swiglu=False): the shards run
  // HF's eager MLP, whose tensors are per shard, the full MLP keeping only its input
  // HF's eager MLP, whose tensors are per shard: the backward is the same with and without the tiled loss
  MemoryPrediction tiled = run(kUlysses + ",tiled_loss=4096,tiled_mlp=auto", kSeq);
  MemoryPrediction tiled_plain = run(kUlysses + ",tiled_mlp=auto", kSeq);
  for (Phase ph : {Phase::forward, Phase::backward})
    EXPECT_DOUBLE_EQ(phase(tiled, ph).total(), phase(tiled_plain, ph).total());
}

TEST(AlstKernelMemory, LigerKernelsIndexAtMost2To31ElementsPerTensor) {
  // one H100, ALST's single-GPU plan: 524,287 x 4096 = 2,147,479,552 <= 2^31 - 1 = 2,147,483,647;
  // 524,288 x 4096 = 2^31 does not run (Liger-Kernel #803: 'an illegal memory access was encountered')
  const std::string alst = "dp=1,zero=3,recompute=full,opt_offload=1,param_offload=1,tiled_loss=4096,tiled_mlp=auto,ckpt_offload=1";
  MemoryPrediction below = run(alst, 524287, "1xh100");
  EXPECT_DOUBLE_EQ(below.tensor_elements, 2147479552.0);
  EXPECT_DOUBLE_EQ(below.max_tensor_elements, 2147483647.0);
  EXPECT_TRUE(below.fits_index);
  EXPECT_TRUE(below.fits_device);  // memory is not what stops it
  MemoryPrediction above = run(alst, 524288, "1xh100");
  EXPECT_FALSE(above.fits_index);
  EXPECT_TRUE(above.fits_device);
  EXPECT_FALSE(above.fits());
  ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  ClusterSpec c = resolve_cluster(profiles(), "1xh100");
  EXPECT_EQ(max_trainable_seq(m, c, resolve_runtime(profiles(), "hf-deepspeed"), parse_plan(alst), int64_t(1) << 27), 524287);
  // per rank: under Ulysses cp=8 the same limit is 8 x 524,287 tokens of sequence
  EXPECT_TRUE(run(kUlysses + ",tiled_loss=4096,tiled_mlp=auto,ckpt_offload=1", 8 * 524287).fits_index);
  EXPECT_FALSE(run(kUlysses + ",tiled_loss=4096,tiled_mlp=auto,ckpt_offload=1", 8 * 524288).fits_index);
  // without the tiled loss the stack is the plain Hugging Face model (no Liger): no such limit
  MemoryPrediction plain = run("dp=1,zero=3,recompute=full,opt_offload=1,param_offload=1", 524288, "1xh100");
  EXPECT_TRUE(plain.fits_index);
  EXPECT_EQ(plain.max_tensor_elements, 0.0);
  // ctxrun's kernels index with 64-bit offsets: no limit in its profiles
  EXPECT_TRUE(run(alst, 524288, "1xh100", "ctxrun-cuda").fits_index);
}

TEST(AlstKernelMemory, ReentrantCheckpointHoldsTheRecomputedLayerOutput) {
  // transformers' gradient_checkpointing_enable() is reentrant: CheckpointFunction.backward keeps
  // `outputs` (the layer's last residual add, [T, hidden]) while it runs the layer's backward, at
  // both of the backward's high points: +X x 1.05 against the same profile without the term
  const auto [with, without] = flip_constant("recompute_keeps_output");
  EXPECT_TRUE(with.recompute_keeps_output);
  ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  ClusterSpec c = resolve_cluster(profiles(), "8xh100");
  for (const std::string extra : {",tiled_loss=4096", ",tiled_loss=4096,tiled_mlp=auto", ",tiled_loss=4096,ckpt_offload=1"}) {
    SCOPED_TRACE(extra);
    const MemorySnapshot a = backward_8b(with, kUlysses + extra), b = backward_8b(without, kUlysses + extra);
    // 1 B: the difference of two ~7e10 B sums of doubles (rounding ~1e-5 B), not a tolerance on the term
    EXPECT_NEAR(a.total() - b.total(), X * kFrag, 1.0);
    EXPECT_NEAR(at(a, Mem::activations) - at(b, Mem::activations), X * kFrag, 1.0);
  }
  // without recompute there is no rematerialised output to hold
  Plan none = parse_plan("cp=8,cp_kind=ulysses,zero=3,opt_offload=1,tiled_loss=4096");
  EXPECT_DOUBLE_EQ(predict_memory(m, c, with, none, 65536).peak.total(), predict_memory(m, c, without, none, 65536).peak.total());
  // non-reentrant checkpointing (torchtitan, llm-foundry) recomputes from unpack hooks: no output held
  for (const char* name : {"torchtitan", "llm-foundry", "ctxrun-cpu", "ctxrun-cuda"})
    EXPECT_FALSE(resolve_runtime(profiles(), name).recompute_keeps_output) << name;
}

TEST(AlstKernelMemory, TheRematerialisedLayersInputIsItsCheckpoint) {
  // the same plan against the profile as it was (recompute_keeps_checkpoint true): the backward's high
  // point held layer 31's input twice, once as the kept checkpoint and once as the rematerialised
  // layer's input; now once: X x 1.05 less, in the checkpoints, at both backward high points
  const auto [now, before] = flip_constant("recompute_keeps_checkpoint");
  EXPECT_FALSE(now.recompute_keeps_checkpoint);
  ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  ClusterSpec c = resolve_cluster(profiles(), "8xh100");
  for (const std::string extra : {",tiled_loss=4096", ",tiled_loss=4096,tiled_mlp=auto"}) {
    SCOPED_TRACE(extra);
    const MemorySnapshot a = backward_8b(now, kUlysses + extra), b = backward_8b(before, kUlysses + extra);
    EXPECT_NEAR(b.total() - a.total(), X * kFrag, 1.0);  // 1 B: rounding of ~7e10 B sums, as above
    EXPECT_NEAR(at(b, Mem::checkpoints) - at(a, Mem::checkpoints), X * kFrag, 1.0);
  }
  // with checkpoint offload the device copy made at the layer's backward is that input: unchanged
  Plan off = parse_plan(kUlysses + ",tiled_loss=4096,ckpt_offload=1");
  EXPECT_DOUBLE_EQ(predict_memory(m, c, now, off, kSeq).peak.total(), predict_memory(m, c, before, off, kSeq).peak.total());
}

TEST(AlstKernelMemory, SdpaSavesKeysAndValuesRepeatedToTheQueryHeads) {
  // alst-t1-r4's recipe runs attn_implementation sdpa: transformers 4.51's sdpa_attention_forward
  // repeat_kv's K and V to the query heads before SDPA, which saves them. Per rank under Ulysses cp=8:
  // 4 query heads and 1 KV head over the whole sequence S = 1,048,576:
  //   q = S x 4 x 128 x 2 B = 1,073,741,824 B = X; K,V as FA2 saves them 2 x S x 1 x 128 x 2 B = 0.5 X;
  //   repeated for SDPA 2 x X: the layer's attention side grows by 1.5 X.
  // In the attention backward SDPA returns dK, dV at the query heads (2 X; repeat_kv's backward sums them
  // to 0.5 X, counted for both kernels), as flash-attn 2 expands them for GQA (dk_expanded, dv_expanded,
  // 2 X): the same workspace. Everything x 1.05 (fragmentation).
  const RuntimeProfile fa2 = resolve_runtime(profiles(), "hf-deepspeed");
  EXPECT_TRUE(fa2.sdpa_repeat_kv);
  const RuntimeProfile sdpa = with_attention(fa2, "sdpa", "test", "attention");
  ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  ClusterSpec c = resolve_cluster(profiles(), "8xh100");
  Plan p = parse_plan(kUlysses + ",tiled_loss=4096,tiled_mlp=auto");  // alst-t1-r4's plan
  const MemoryPrediction a = predict_memory(m, c, sdpa, p, kSeq), b = predict_memory(m, c, fa2, p, kSeq);
  // forward high point: the attention core of layer 31 (TiledMLP keeps the MLP's small)
  const MemorySnapshot& af = phase(a, Phase::forward);
  const MemorySnapshot& bf = phase(b, Phase::forward);
  EXPECT_NEAR(at(af, Mem::activations) - at(bf, Mem::activations), 1.5 * X * kFrag, 1.0);
  EXPECT_NEAR(af.total() - bf.total(), 1.5 * X * kFrag, 1.0);
  // backward high point: the attention backward of layer 31
  const MemorySnapshot& ab = phase(a, Phase::backward);
  const MemorySnapshot& bb = phase(b, Phase::backward);
  EXPECT_NEAR(at(ab, Mem::activations) - at(bb, Mem::activations), 1.5 * X * kFrag, 1.0);
  EXPECT_NEAR(at(ab, Mem::workspace) - at(bb, Mem::workspace), 0.0, 1.0);
  // without GQA (as many KV heads as query heads) repeat_kv repeats nothing
  ModelSpec mha = m;
  mha.kv_heads = mha.heads;
  EXPECT_DOUBLE_EQ(predict_memory(mha, c, sdpa, p, kSeq).peak.total(), predict_memory(mha, c, fa2, p, kSeq).peak.total());
  // the term is the Hugging Face path's: torchtitan, llm-foundry, megatron and ctxrun leave it out
  for (const char* name : {"megatron", "torchtitan", "llm-foundry", "ctxrun-cpu", "ctxrun-cuda"})
    EXPECT_FALSE(resolve_runtime(profiles(), name).sdpa_repeat_kv) << name;
}

TEST(AlstKernelMemory, FlashAttnExpandsDkDvOnlyUnderGqaAtTheRank) {
  // flash_attn 2.7.4 mha_varlen_bwd allocates dk_expanded, dv_expanded at the query heads only where
  // num_heads_k != num_heads. Llama-3.1-8B's 32 query / 8 KV heads over Ulysses:
  //   cp=8:  4 query heads, 1 KV head per rank: GQA, +2 [S, 4 x 128] tensors
  //   cp=32: 1 query head, 1 KV head (replicated) per rank: no expansion
  // At cp=32 on 4 nodes and S = 4,194,304 (T = 131,072): q = S x 1 x 128 x 2 B = 1,073,741,824 B = X, so
  // the attention backward's workspace holds 2 X x 1.05 less than with the extras counted everywhere;
  // d(out) is not copied (maybe_contiguous: its last dimension is contiguous), 2 extras, not 3.
  json j = read_json_file(std::string(CTXPLAN_SOURCE_DIR) + "/profiles/runtimes/hf-deepspeed.json");
  const RuntimeProfile now = runtime_from_json(j, "hf-deepspeed.json");
  EXPECT_TRUE(now.attention_backward_extra_gqa_only);
  EXPECT_EQ(now.attention_backward_extra_q_tensors, 2);
  j["constants"].erase("attention_backward_extra_gqa_only");  // optional: absent = the extras everywhere
  const RuntimeProfile everywhere = runtime_from_json(j, "test.json");
  EXPECT_FALSE(everywhere.attention_backward_extra_gqa_only);
  ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const std::string alst = ",tiled_loss=4096,tiled_mlp=auto,ckpt_offload=1";
  {
    ClusterSpec c = resolve_cluster(profiles(), "4x8xh100");
    Plan p = parse_plan("cp=32,cp_kind=ulysses,zero=3,recompute=full,opt_offload=1" + alst);  // alst-t4-alst's plan
    const MemorySnapshot a = phase(predict_memory(m, c, now, p, 4194304), Phase::backward);
    const MemorySnapshot b = phase(predict_memory(m, c, everywhere, p, 4194304), Phase::backward);
    EXPECT_NEAR(at(b, Mem::workspace) - at(a, Mem::workspace), 2 * X * kFrag, 1.0);
    EXPECT_NEAR(b.total() - a.total(), 2 * X * kFrag, 1.0);
  }
  {
    // cp=8: GQA at the rank, the extras stay
    ClusterSpec c = resolve_cluster(profiles(), "8xh100");
    Plan p = parse_plan(kUlysses + alst);
    EXPECT_DOUBLE_EQ(predict_memory(m, c, now, p, kSeq).peak.total(), predict_memory(m, c, everywhere, p, kSeq).peak.total());
  }
}

TEST(AlstKernelMemory, TheFusedMlpConstantsComeTogether) {
  json j = read_json_file(std::string(CTXPLAN_SOURCE_DIR) + "/profiles/runtimes/hf-deepspeed.json");
  j["constants"].erase("tiled_loss_mlp_backward_ffn_tensors");
  try {
    runtime_from_json(j, "test.json");
    FAIL() << "one of the pair must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tiled_loss_mlp_backward_ffn_tensors"), std::string::npos) << e.what();
  }
  // absent from every other profile: their MLPs are as before
  for (const char* name : {"megatron", "torchtitan", "llm-foundry", "ctxrun-cpu", "ctxrun-cuda"}) {
    EXPECT_EQ(resolve_runtime(profiles(), name).tiled_loss_mlp_saved_ffn_tensors, 0) << name;
    EXPECT_EQ(resolve_runtime(profiles(), name).tiled_loss_max_tensor_elements, 0) << name;
  }
}

}  // namespace
}  // namespace ctx
