// Context parallelism over K,V expanded to the query heads (runtime constant cp_kv_query_heads,
// issue 16). torchtitan's Llama calls repeat_kv before SDPA (torchtitan/models/llama3/model/model.py
// Attention.forward), and PyTorch's context_parallel rings or all-gathers the K,V arguments of that
// SDPA call (torch/distributed/tensor/experimental/_attention.py _templated_ring_attention:
// torch.cat([key.flatten(), value.flatten()]) to the rotater): every CP K,V byte, and every buffer
// holding them or their gradients, is n_heads / n_kv_heads times what the KV heads need. Proves, by
// hand arithmetic on Llama-3.1-8B (32 query, 8 KV heads of 128):
//   - the all-gather and ring hops the step prices move 4x the KV bytes on torchtitan, 1x elsewhere;
//   - the CP buffers of the attention backward (tt-8b-cp8's job) are the query heads' size, by hand;
//   - a runtime whose K,V keep the KV heads (hf-deepspeed, megatron, ctxrun) is unchanged, as is a
//     model without GQA, and a profile without the constant reads false.
#include <gtest/gtest.h>

#include <string>

#include "costmodel/collectives.hpp"
#include "costmodel/json_util.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/prediction.hpp"
#include "costmodel/process_groups.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/step_model.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(std::string(CTXPLAN_SOURCE_DIR) + "/profiles");
  return p;
}

TEST(CpKvQueryHeads, TorchtitanStatesItAndTheOthersDoNot) {
  EXPECT_TRUE(resolve_runtime(profiles(), "torchtitan").cp_kv_query_heads);
  for (const char* name : {"hf-deepspeed", "megatron", "ctxrun-cpu", "ctxrun-cuda"})
    EXPECT_FALSE(resolve_runtime(profiles(), name).cp_kv_query_heads) << name;
  json j = read_json_file(std::string(CTXPLAN_SOURCE_DIR) + "/profiles/runtimes/torchtitan.json");
  j["constants"].erase("cp_kv_query_heads");
  EXPECT_FALSE(runtime_from_json(j, "old.json").cp_kv_query_heads);
}

// Llama-3.1-8B, seq 65,536 over cp=2 (32,768 tokens per rank), bf16:
//   KV heads' K,V per rank: 2 x 32,768 x 8 x 128 x 2 B = 134,217,728 B
//   expanded to 32 query heads: x 4 = 536,870,912 B
constexpr double kKv = 134217728, kKvExpanded = 536870912;

TEST(CpKvQueryHeads, TheAllGatherAndTheRingHopsMoveTheQueryHeadsKV) {
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const ClusterSpec c = resolve_cluster(profiles(), "8xh100-96gb");
  const RuntimeProfile& tt = resolve_runtime(profiles(), "torchtitan");
  RuntimeProfile kv_heads = tt;
  kv_heads.cp_kv_query_heads = false;
  EXPECT_DOUBLE_EQ(kKvExpanded, 4 * kKv);
  {
    const Plan p = parse_plan("dp=4,cp=2,cp_kind=allgather,zero=3,recompute=full");
    const GroupPlacement g = group_placement(p, Group::cp, c.gpus_per_node);
    const StepCosts k = step_costs(m, c, tt, p, 65536, true, nullptr);
    // PyTorch's _AllGatherRotater: one all-gather of the whole sequence's expanded K,V (cp x per rank)
    EXPECT_DOUBLE_EQ(k.kv_ag, collective_seconds(Coll::all_gather, kKvExpanded * 2, g, c));
    // dK,dV of the expanded arguments, fp32 (allgather_dkv_fp32): x 4 / 2 bytes
    EXPECT_DOUBLE_EQ(k.dkv_rs, collective_seconds(Coll::reduce_scatter, kKvExpanded * 2 * 2, g, c));
    const StepCosts before = step_costs(m, c, kv_heads, p, 65536, true, nullptr);
    EXPECT_DOUBLE_EQ(before.kv_ag, collective_seconds(Coll::all_gather, kKv * 2, g, c));
    EXPECT_GT(k.kv_ag, before.kv_ag);
  }
  {
    const Plan p = parse_plan("dp=4,cp=2,cp_kind=zigzag,zero=3,recompute=full");
    GroupPlacement hop = group_placement(p, Group::ring, c.gpus_per_node);
    hop.size = 2;
    const StepCosts k = step_costs(m, c, tt, p, 65536, true, nullptr);
    // _AllToAllRotater: each ring step sends the expanded K,V block; the backward K,V and dK,dV
    EXPECT_DOUBLE_EQ(k.p2p_fwd, collective_seconds(Coll::p2p, kKvExpanded, hop, c));
    EXPECT_DOUBLE_EQ(k.p2p_bwd, collective_seconds(Coll::p2p, 2 * kKvExpanded, hop, c));
    EXPECT_DOUBLE_EQ(k.p2p_dkv, collective_seconds(Coll::p2p, kKvExpanded, hop, c));
  }
}

TEST(CpKvQueryHeads, TheAttentionBackwardsCpBuffersAreTheQueryHeadsSize) {
  // tt-8b-cp8's job: torchtitan, dp=1,cp=8 all-gather, recompute=full, 262,144 tokens (32,768 per
  // rank). The backward's high point is the attention backward, whose communication buffers hold
  //   the re-gathered K,V of the whole sequence, expanded: 2 x 262,144 x 32 x 128 x 2 B = 4,294,967,296
  //   three local-shard fp32 dK,dV buffers (accumulators, send, receive; allgather_dkv_full_sequence
  //   false), expanded: 3 x 2 x 32,768 x 32 x 128 x 4 B                                 = 3,221,225,472
  //   ZeRO-3's two unsharded blocks (zero3_prefetch_layers 2) of 218,112,000 bf16 parameters and the
  //   block's fp32 gradient before its reduce-scatter (unit_grads_fp32): 2 x 2 + 4 B x 218,112,000 = 1,744,896,000
  //   FSDP2's root unit (zero3_root_unit_unsharded): embedding, head and the head's bf16 gradient,
  //   3 x 128,256 x 4096 x 2 B                                                             = 3,152,019,456
  //   = 12,413,108,224 B, x 1.05 (fragmentation) as allocated. With the KV heads' K,V the first two are
  //   a quarter (1,879,048,192 B): the attention backward would hold 6,775,963,648 B x 1.05, below
  //   the MLP backward's (1,744,896,000 + 3,152,019,456) x 1.05 plus its rematerialised layer.
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const ClusterSpec c = resolve_cluster(profiles(), "8xh100-96gb");
  const RuntimeProfile& tt = resolve_runtime(profiles(), "torchtitan");
  RuntimeProfile kv_heads = tt;
  kv_heads.cp_kv_query_heads = false;
  ASSERT_DOUBLE_EQ(tt.fragmentation, 0.05);
  ASSERT_DOUBLE_EQ(tt.zero3_prefetch_layers, 2);
  ASSERT_DOUBLE_EQ(local_shapes(m, parse_plan("cp=8"), 262144).layer_params, 218112000);
  const Plan p = parse_plan("dp=1,cp=8,cp_kind=allgather,zero=3,recompute=full");
  const MemoryPrediction a = predict_memory(m, c, tt, p, 262144), b = predict_memory(m, c, kv_heads, p, 262144);
  const int bwd = static_cast<int>(Phase::backward);
  EXPECT_NEAR(a.phase_peak[bwd][Mem::comm_buffers], 12413108224.0 * 1.05, 1.0);
  EXPECT_LT(b.phase_peak[bwd][Mem::comm_buffers], 6775963648.0 * 1.05 + 1.0);
  EXPECT_GT(a.phase_peak[bwd].total(), b.phase_peak[bwd].total());
}

TEST(CpKvQueryHeads, WithoutGqaOrOnOtherRuntimesNothingChanges) {
  const ClusterSpec c = resolve_cluster(profiles(), "8xh100-96gb");
  const Plan p = parse_plan("dp=4,cp=2,cp_kind=allgather,zero=3,recompute=full");
  // Llama-2-7B has 32 KV heads for 32 query heads: repeat_kv repeats nothing
  const ModelSpec mha = resolve_model(profiles(), "Llama-2-7B");
  const RuntimeProfile& tt = resolve_runtime(profiles(), "torchtitan");
  RuntimeProfile off = tt;
  off.cp_kv_query_heads = false;
  EXPECT_DOUBLE_EQ(step_costs(mha, c, tt, p, 65536, true, nullptr).kv_ag, step_costs(mha, c, off, p, 65536, true, nullptr).kv_ag);
  EXPECT_DOUBLE_EQ(predict_memory(mha, c, tt, p, 65536).peak.total(), predict_memory(mha, c, off, p, 65536).peak.total());
  const LocalShapes s = local_shapes(resolve_model(profiles(), "Llama-3.1-8B"), p, 65536);
  EXPECT_DOUBLE_EQ(cp_kv_expansion(tt, s), 4);
  EXPECT_DOUBLE_EQ(cp_kv_expansion(off, s), 1);
}

}  // namespace
}  // namespace ctx
