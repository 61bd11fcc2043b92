// The gradient reduction's dtype on the wire (runtime constant grad_comm_bytes, issue 16): each
// stack reduces its gradients in its own communication dtype, which need not be the dtype it
// accumulates them in. DeepSpeed under bf16 reduce-scatters bf16 gradients (stage3.py
// __avg_scatter_grads, communication_data_type) into fp32 partitions; Megatron-LM (bf16 forces
// accumulate_allreduce_grads_in_fp32), torchtitan's FSDP2 (mixed_precision_reduce float32) and ctxrun
// (fp32 gradient buffers) reduce fp32. Proves, by hand arithmetic on the tiny model:
//   - the bytes each runtime's reduce-scatter moves, and that its gradient memory is unchanged;
//   - precision=fp32 makes every stack reduce fp32, a plan's grads= its own dtype;
//   - the per-layer reduce time is the collective priced on those bytes;
//   - a profile without the constant reduces its grad_bytes; a bad value is refused naming it.
#include <gtest/gtest.h>

#include <string>

#include "costmodel/collectives.hpp"
#include "costmodel/errors.hpp"
#include "costmodel/json_util.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/prediction.hpp"
#include "costmodel/process_groups.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/runtime_profile.hpp"
#include "costmodel/step_model.hpp"
#include "costmodel/zero_comm.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(std::string(CTXPLAN_SOURCE_DIR) + "/profiles");
  return p;
}

// tiny (profiles/models/tiny.json): 2 layers, hidden 64, 4 query heads and 2 KV heads of 16, SwiGLU
// FFN 172, vocabulary 256, untied, RMSNorm.
//   one layer: q 64x64 + k 64x32 + v 64x32 + o 64x64 = 12,288; gate, up, down 3 x 64 x 172 = 33,024;
//              two norms 2 x 64 = 128                                                  -> 45,440
//   model:     2 layers 90,880 + embedding 256 x 64 = 16,384 + head 16,384 + final norm 64 -> 123,712
constexpr double kTinyLayerParams = 45440;
constexpr double kTinyParams = 123712;

double reduce_scatter_bytes(const std::string& runtime, const std::string& plan) {
  const ModelSpec m = resolve_model(profiles(), "tiny");
  const ClusterSpec c = resolve_cluster(profiles(), "2xh100");
  const RuntimeProfile& rt = resolve_runtime(profiles(), runtime);
  const Prediction pr = predict(m, c, rt, parse_plan(plan), 512);
  for (const ZeroCommTerm& t : pr.zero_comm)
    if (t.name == "grad_reduce_scatter") return t.message_bytes;
  ADD_FAILURE() << runtime << " " << plan << ": no grad_reduce_scatter term";
  return -1;
}

TEST(GradCommDtype, EachRuntimeReducesInItsOwnCommunicationDtype) {
  // bytes on the wire per micro-batch's reduce-scatter of the whole model over dp=2, zero=3:
  // DeepSpeed bf16: 123,712 x 2 = 247,424 B; every fp32 stack: 123,712 x 4 = 494,848 B
  EXPECT_DOUBLE_EQ(reduce_scatter_bytes("hf-deepspeed", "dp=2,zero=3"), 247424);
  EXPECT_DOUBLE_EQ(kTinyParams * 2, 247424);
  for (const char* rt : {"megatron", "torchtitan", "ctxrun-cuda", "ctxrun-cpu"}) {
    SCOPED_TRACE(rt);
    EXPECT_DOUBLE_EQ(reduce_scatter_bytes(rt, rt == std::string("megatron") ? "dp=2,zero=2" : "dp=2,zero=3"), 494848);
  }
  EXPECT_DOUBLE_EQ(resolve_runtime(profiles(), "hf-deepspeed").grad_comm_bytes, 2);
}

TEST(GradCommDtype, Fp32PlansReduceFp32AndAPlansGradsDtypeIsWhatItReduces) {
  // precision=fp32: fp32 weights have fp32 gradients, DeepSpeed's communication_data_type is then fp32
  EXPECT_DOUBLE_EQ(reduce_scatter_bytes("hf-deepspeed", "dp=2,zero=3,precision=fp32"), 494848);
  // grads=bf16 on a stack that reduces fp32: the bf16 gradient buffer is what is reduced (Megatron's
  // --main-grads-dtype bf16 leaves grad_reduce_in_fp32 off)
  EXPECT_DOUBLE_EQ(reduce_scatter_bytes("ctxrun-cuda", "dp=2,zero=3,grads=bf16"), 247424);
  const RuntimeProfile& mg = resolve_runtime(profiles(), "megatron");
  const RuntimeProfile bf = runtime_for_plan(mg, parse_plan("dp=2,zero=1,grads=bf16"));
  EXPECT_DOUBLE_EQ(bf.grad_comm_bytes, 2);
  EXPECT_DOUBLE_EQ(bf.grad_bytes, 2);
}

TEST(GradCommDtype, TheGradientMemoryKeepsItsAccumulationDtype) {
  // the communication dtype changes bytes on the wire only: DeepSpeed's optimizer still keeps its
  // fp32 gradient partition (grad_bytes 4), here offloaded with the optimizer: 4 x 123,712 / 2 per rank
  const RuntimeProfile& rt = resolve_runtime(profiles(), "hf-deepspeed");
  EXPECT_DOUBLE_EQ(rt.grad_bytes, 4);
  const ModelSpec m = resolve_model(profiles(), "tiny");
  const ClusterSpec c = resolve_cluster(profiles(), "2xh100");
  RuntimeProfile as_before = rt;
  as_before.grad_comm_bytes = rt.grad_bytes;
  for (const char* plan : {"dp=2,zero=3", "dp=2,zero=3,opt_offload=1", "dp=2,zero=2"}) {
    SCOPED_TRACE(plan);
    const Prediction a = predict(m, c, rt, parse_plan(plan), 512), b = predict(m, c, as_before, parse_plan(plan), 512);
    EXPECT_DOUBLE_EQ(a.memory.peak.total(), b.memory.peak.total());
    EXPECT_DOUBLE_EQ(a.memory.host_total_bytes_per_node, b.memory.host_total_bytes_per_node);
  }
}

TEST(GradCommDtype, TheLayersReduceTimeIsTheCollectiveOnThoseBytes) {
  const ModelSpec m = resolve_model(profiles(), "tiny");
  const ClusterSpec c = resolve_cluster(profiles(), "2xh100");
  const Plan p = parse_plan("dp=2,zero=3");
  const GroupPlacement g = group_placement(p, Group::zero_shard, c.gpus_per_node);
  ASSERT_EQ(g.size, 2);
  for (auto [name, bytes] : {std::pair<const char*, double>{"hf-deepspeed", 2}, {"torchtitan", 4}}) {
    SCOPED_TRACE(name);
    const StepCosts k = step_costs(m, c, resolve_runtime(profiles(), name), p, 512, true, nullptr);
    // one layer's 45,440 gradients: 90,880 B in bf16, 181,760 B in fp32
    EXPECT_DOUBLE_EQ(k.grad_reduce, collective_seconds(Coll::reduce_scatter, kTinyLayerParams * bytes, g, c));
  }
}

TEST(GradCommDtype, AProfileWithoutItReducesItsGradBytesAndABadValueIsRefused) {
  json j = read_json_file(std::string(CTXPLAN_SOURCE_DIR) + "/profiles/runtimes/hf-deepspeed.json");
  j["constants"].erase("grad_comm_bytes");
  const RuntimeProfile old = runtime_from_json(j, "old.json");
  EXPECT_DOUBLE_EQ(old.grad_comm_bytes, 4);
  EXPECT_NE(old.sources.at("grad_comm_bytes").find("grad_bytes"), std::string::npos);
  j["constants"]["grad_comm_bytes"] = {{"value", 3}, {"source", "a test"}};
  try {
    runtime_from_json(j, "bad.json");
    FAIL() << "grad_comm_bytes 3 accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("grad_comm_bytes"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ctx
