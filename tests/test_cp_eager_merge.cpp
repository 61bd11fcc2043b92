// PyTorch's eager context-parallel loop (runtime constant cp_eager_merge_fp32, issue 16):
// torch/distributed/tensor/experimental/_attention.py merges every ring step's output into an fp32
// accumulator (_SDPAMerger, convert_to_f32) and accumulates fp32 gradients in the backward
// (_templated_ring_attention_backward) with separate elementwise kernels. Proves:
//   - the bytes per step of a 2-position ring, both positions, with and without load balancing, equal
//     the op-by-op sums written out here from that source (the listing in costmodel/cp_eager_merge.hpp);
//   - on tt-8b-cp2's job (torchtitan, Llama-3.1-8B, 64K tokens, all-gather CP on the H100 96 GB) the
//     attention entries grow by exactly those bytes at the profile's stated large-stream bandwidth
//     (0.88 of 2,000 GB/s) plus one launch per counted kernel;
//   - only torchtitan states the constant, and a profile without it reads false.
#include <gtest/gtest.h>

#include <string>

#include "costmodel/cp_eager_merge.hpp"
#include "costmodel/json_util.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/step_model.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(std::string(CTXPLAN_SOURCE_DIR) + "/profiles");
  return p;
}

double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

// a = 2 (bf16), E = 1000 query elements, Ekv = 250 (GQA 4:1, not expanded). Per element, from the source:
// an a-byte -> fp32 cast 6, an fp32 += a-byte add 10, an fp32 += fp32 add 12, an fp32 torch.cat 8, an
// a-byte torch.cat or contiguous 4, an fp32 zeros 4, an fp32 -> a-byte cast 6.
TEST(CpEagerMerge, TwoPositionRingBytesAreTheSourcesOpsSummedByHand) {
  const double E = 1000, Ekv = 250;
  // position 0, load-balanced: step 1 is 'partial' (the second half of the queries, all keys)
  CpEagerMergeBytes p0 = cp_eager_merge_bytes(E, Ekv, 2.0, 2, 0, true);
  ASSERT_EQ(p0.fwd_bytes.size(), 2u);
  // fwd step 0: K,V contiguous 2 x 4 Ekv, out cast 6 E, results() cast 6 E, K,V cat 2 x 4 Ekv
  EXPECT_DOUBLE_EQ(p0.fwd_bytes[0], 8 * Ekv + 6 * E + 6 * E + 8 * Ekv);
  // fwd step 1 on E/2 outputs: cast 6, out - block_out 12, sigmoid * 8, out - that 12; cat of halves 8 E
  EXPECT_DOUBLE_EQ(p0.fwd_bytes[1], (6 + 12 + 8 + 12) * E / 2 + 8 * E);
  // bwd step 0: zeros 4 E + 2 x 4 Ekv, contiguous 8 Ekv, final casts 6 E + 2 x 6 Ekv, dK,dV += 2 x 10 Ekv,
  // dQ += 10 E, dK,dV cat 16 Ekv, K,V cat 8 Ekv
  EXPECT_DOUBLE_EQ(p0.bwd_bytes[0], 4 * E + 8 * Ekv + 8 * Ekv + 6 * E + 12 * Ekv + 20 * Ekv + 10 * E + 16 * Ekv + 8 * Ekv);
  // bwd step 1 (partial): dK,dV += 2 x 10 Ekv, dQ's half += 10 E / 2 and its torch.cat 8 E, dK,dV cat 16 Ekv
  EXPECT_DOUBLE_EQ(p0.bwd_bytes[1], 20 * Ekv + 5 * E + 8 * E + 16 * Ekv);
  // position 1: step 1 uses all queries (a full merge) and the first half of the keys
  CpEagerMergeBytes p1 = cp_eager_merge_bytes(E, Ekv, 2.0, 2, 1, true);
  EXPECT_DOUBLE_EQ(p1.fwd_bytes[0], p0.fwd_bytes[0]);
  EXPECT_DOUBLE_EQ(p1.fwd_bytes[1], (6 + 12 + 8 + 12) * E);
  // dK,dV first half += (10 Ekv / 2 each) and torch.cat (8 Ekv each), dQ += 10 E, dK,dV cat 16 Ekv
  EXPECT_DOUBLE_EQ(p1.bwd_bytes[1], 2 * (5 * Ekv + 8 * Ekv) + 10 * E + 16 * Ekv);
  // without load balancing position 0 skips step 1: no merge; the backward adds zero fp32 gradients
  CpEagerMergeBytes s0 = cp_eager_merge_bytes(E, Ekv, 2.0, 2, 0, false);
  EXPECT_DOUBLE_EQ(s0.fwd_bytes[1], 0.0);
  EXPECT_DOUBLE_EQ(s0.bwd_bytes[1], 4 * E + 8 * Ekv + 24 * Ekv + 12 * E + 16 * Ekv);
}

const StepCosts costs(const RuntimeProfile& rt) {
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const ClusterSpec c = resolve_cluster(profiles(), "8xh100-96gb");
  return step_costs(m, c, rt, parse_plan("cp=2,cp_kind=allgather,zero=3,recompute=full,precision=fp8", "test"), 65536, true);
}

// tt-8b-cp2: 32,768 local tokens x 32 heads x 128 = 134,217,728 query elements; torchtitan expands K,V to
// the 32 query heads (cp_kv_query_heads), so Ekv = E. Every counted kernel moves over 256 MiB, where the
// H100 96 GB profile states 0.88 of its 2,400 GB/s (kernels.memory_mib). The all-gather exchange has one
// attention entry per rank: it carries both steps' bytes.
TEST(CpEagerMerge, Tt8bCp2AttentionEntriesGrowByTheCountedBytes) {
  const RuntimeProfile on = resolve_runtime(profiles(), "torchtitan");
  ASSERT_TRUE(on.cp_eager_merge_fp32);
  RuntimeProfile off = on;
  off.cp_eager_merge_fp32 = false;  // the merge only: the step loop (cp_allgather_step_loop) prices the same blocks
  const StepCosts a = costs(on), b = costs(off);
  const double E = 32768.0 * 32 * 128, bw = 0.88 * 2400e9, launch = 4e-6;
  ASSERT_EQ(a.attn_fwd.size(), 1u);
  ASSERT_EQ(a.attn_fwd[0].size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(a.attn_fwd[0][rank].size(), 1u);
    const CpEagerMergeBytes mb = cp_eager_merge_bytes(E, E, 2.0, 2, rank, true);
    // by hand, E = Ekv: fwd 28 E at step 0 (8 + 6 + 6 + 8) plus 27 E (rank 0, partial) or 38 E (rank 1)
    const double fwd_bytes = 28 * E + (rank == 0 ? 27 : 38) * E;
    EXPECT_DOUBLE_EQ(sum(mb.fwd_bytes), fwd_bytes);
    const double fwd_ops = sum(mb.fwd_ops);
    EXPECT_NEAR(a.attn_fwd[0][rank][0] - b.attn_fwd[0][rank][0], fwd_bytes / bw + fwd_ops * launch, 1e-9 * fwd_bytes / bw) << rank;
    // bwd: step 0 4+8+8+6+12+20+10+16+8 = 92 E; step 1 rank 0 20+5+8+16 = 49 E, rank 1 26+10+16 = 52 E
    const double bwd_bytes = 92 * E + (rank == 0 ? 49 : 52) * E;
    EXPECT_DOUBLE_EQ(sum(mb.bwd_bytes), bwd_bytes);
    EXPECT_NEAR(a.attn_bwd[0][rank][0] - b.attn_bwd[0][rank][0], bwd_bytes / bw + sum(mb.bwd_ops) * launch, 1e-9 * bwd_bytes / bw)
        << rank;
  }
}

TEST(CpEagerMerge, OnlyTorchtitanStatesItAndAnAbsentKeyReadsFalse) {
  EXPECT_TRUE(resolve_runtime(profiles(), "torchtitan").cp_eager_merge_fp32);
  // the all-gather's step loop: PyTorch's and ctxrun's (one call per gathered chunk); Transformer Engine
  // (megatron) calls per query chunk against its key prefix; the others run no all-gather CP
  for (const char* name : {"torchtitan", "ctxrun-cpu", "ctxrun-cuda"}) EXPECT_TRUE(resolve_runtime(profiles(), name).cp_allgather_step_loop) << name;
  for (const char* name : {"hf-deepspeed", "megatron", "llm-foundry"}) EXPECT_FALSE(resolve_runtime(profiles(), name).cp_allgather_step_loop) << name;
  for (const char* name : {"hf-deepspeed", "megatron", "llm-foundry", "ctxrun-cpu", "ctxrun-cuda"})
    EXPECT_FALSE(resolve_runtime(profiles(), name).cp_eager_merge_fp32) << name;
  json j = read_json_file(std::string(CTXPLAN_SOURCE_DIR) + "/profiles/runtimes/torchtitan.json");
  j["constants"].erase("cp_eager_merge_fp32");
  j["constants"].erase("cp_allgather_step_loop");
  EXPECT_FALSE(runtime_from_json(j, "old.json").cp_eager_merge_fp32);
  EXPECT_FALSE(runtime_from_json(j, "old.json").cp_allgather_step_loop);
}

}  // namespace
}  // namespace ctx
