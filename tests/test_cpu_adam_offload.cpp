// The host optimizer of optimizer offload (step_costs' opt_host, opt_d2h, opt_h2d) as DeepSpeed 0.17.0
// runs it under ZeRO-3 (runtime/zero/stage3.py), written out by hand from the plan, the profile's
// constants and the cluster's PCIe rate:
//  - CPU-Adam's rate is the node's, shared by the ranks on the node (every rank's OpenMP pool spans
//    the same host cores), so a rank's step takes its partition x ranks on the node / the node's rate;
//  - the gradient partitions go to the host inside backward (partition_grads, per reduce bucket) through
//    pageable buffers (offload_optimizer.pin_memory defaults to false; ALST's recipes leave it), so the
//    autograd thread waits for each bucket's reduce-scatter and copies: all of them are on the critical
//    path, the copies at the pageable rate: the pinned rate over DeepSpeed PR #5301's measured ratio
//    (6x on one GPU, 4-5x on an 8-GPU node with every rank copying; 4.5 taken);
//  - the fp32 -> bf16 parameter copy back is the unpinned, host-converted path DeepSpeed PR #5301
//    measured 6x (1 GPU) and 4-5x (8-GPU node) slower than a pinned fp32 copy; with offload_param the
//    copy stays on the host: a CPU fp32 -> bf16 copy_ of the partition at the profile's host rate
//    (PyTorch PR #103148's measurement), per node like CPU-Adam.
// Runtimes without DeepSpeed's ZeRO-3 gradient partition keep the plain price (copies after backward).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "costmodel/errors.hpp"
#include "costmodel/json_util.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/step_model.hpp"
#include "built_in_profiles.hpp"

namespace ctx {
namespace {

using Job = testing::PricedJob;

// Llama-3.1-8B at ALST's 32K tokens
Job job(const std::string& plan_text, const std::string& cluster, const std::string& runtime = "hf-deepspeed") {
  return testing::built_in_job(plan_text, 32000, "Llama-3.1-8B", cluster, runtime);
}

StepCosts costs(const Job& j) { return step_costs(j.m, j.c, j.rt, j.p, j.seq, true); }

// collectives.cpp pcie_seconds: 5 us per copy plus the bytes at the pinned rate
double pcie(double bytes, const ClusterSpec& c) { return bytes <= 0 ? 0.0 : 5e-6 + bytes / c.gpu.pcie_bytes_per_second; }

// the rank's optimizer partition: all parameters over the ZeRO-3 shard group (dp x cp)
double shard_params(const Job& j) {
  return local_shapes(j.m, j.p, j.seq).params / static_cast<double>(j.p.dp * j.p.cp);
}

TEST(CpuAdamOffload, TheNodesRateIsSharedByItsRanks) {
  const Job node = job("dp=8,zero=3,recompute=full,opt_offload=1", "8xh100");
  const Job one = job("dp=1,zero=3,recompute=full,opt_offload=1,param_offload=1", "1xh100");
  const Job four = job("dp=32,zero=3,recompute=full,opt_offload=1", "aws-p5-4node");
  const double rate = node.rt.cpu_adam_params_per_second;
  ASSERT_GT(rate, 0);
  EXPECT_NEAR(costs(node).opt_host, shard_params(node) * 8 / rate, 1e-9);
  EXPECT_NEAR(costs(one).opt_host, shard_params(one) / rate, 1e-9);
  EXPECT_NEAR(costs(four).opt_host, shard_params(four) * 8 / rate, 1e-9);
  // the same model on one node takes the same optimizer time whether 1 or 8 ranks step it; 4 nodes a quarter
  EXPECT_NEAR(costs(node).opt_host / costs(one).opt_host, 1.0, 1e-9);
  EXPECT_NEAR(costs(four).opt_host / costs(node).opt_host, 0.25, 1e-9);
}

TEST(CpuAdamOffload, DeepSpeedZero3BlocksBackwardOnEveryBucketsReductionAndPageableCopies) {
  // one GPU: no reduction; the whole gradient goes down bf16, back up, down fp32 (2 + 2 + 4 B per
  // parameter), through pageable buffers: PR #5301's single-GPU ratio, 6x the pinned time
  const Job one = job("dp=1,zero=3,recompute=full,opt_offload=1,param_offload=1", "1xh100");
  EXPECT_NEAR(costs(one).opt_d2h, 6.0 * pcie(shard_params(one) * (2 + 2 + 4), one.c), 1e-12);
  // 8 GPUs: each bucket's reduce-scatter waits with the copies (every layer's, the head's, the
  // embedding's); the copies at the 8-GPU node's ratio (4-5x: 4.5)
  const Job j = job("dp=8,zero=3,recompute=full,opt_offload=1", "8xh100");
  const StepCosts k = costs(j);
  ASSERT_GT(k.grad_reduce, 0);
  const double reductions = static_cast<double>(j.m.layers) * k.grad_reduce + k.head_grad_reduce + k.embed_grad_reduce;
  EXPECT_NEAR(k.opt_d2h, reductions + 4.5 * pcie(shard_params(j) * (2 + 2 + 4), j.c), 1e-12);
  // with ga=2 the reductions and the bf16 copies happen every micro-batch, the fp32 copy once
  const Job ga2 = job("dp=8,ga=2,zero=3,recompute=full,opt_offload=1", "8xh100");
  EXPECT_NEAR(costs(ga2).opt_d2h, 2 * reductions + 4.5 * pcie(shard_params(ga2) * (2 * (2 + 2) + 4), ga2.c), 1e-12);
  // the same 8B model on one GPU moves 8x a rank's bytes of the 8-GPU node over its one link: the
  // copies alone (no reductions) are 8 x 6 / 4.5 of the node rank's, the gap between ALST's 1-GPU
  // and 8-GPU 32K steps the model used to leave to the fitted overhead
  const double node_copies = k.opt_d2h - reductions;
  EXPECT_NEAR(costs(one).opt_d2h / node_copies, 8.0 * 6.0 / 4.5, 1e-3);
}

TEST(CpuAdamOffload, TheParameterCopyBackIsTheUnpinnedPath) {
  const Job node = job("dp=8,zero=3,recompute=full,opt_offload=1", "8xh100");
  const Job one = job("dp=1,zero=3,recompute=full,opt_offload=1", "1xh100");
  const Job one_params = job("dp=1,zero=3,recompute=full,opt_offload=1,param_offload=1", "1xh100");
  // PR #5301: the pinned fp32 copy was 4-5x faster on an 8-GPU node, 6x on one GPU
  EXPECT_NEAR(costs(node).opt_h2d, 4.5 * pcie(shard_params(node) * 4, node.c), 1e-12);
  EXPECT_NEAR(costs(one).opt_h2d, 6.0 * pcie(shard_params(one) * 4, one.c), 1e-12);
  // offload_param: the bf16 partition is host memory; the copy never crosses PCIe in the step, it is a
  // host cast of the rank's partition at the node's rate shared by the node's ranks
  const double cast_rate = one_params.rt.host_fp32_to_bf16_elems_per_second;
  ASSERT_GT(cast_rate, 0);
  EXPECT_NEAR(costs(one_params).opt_h2d, shard_params(one_params) / cast_rate, 1e-12);
  const Job node_params = job("dp=8,zero=3,recompute=full,opt_offload=1,param_offload=1", "8xh100");
  EXPECT_NEAR(costs(node_params).opt_h2d, shard_params(node_params) * 8 / cast_rate, 1e-12);
  // the same 8B parameters cast on one node take the same time whether 1 or 8 ranks hold them
  EXPECT_NEAR(costs(node_params).opt_h2d / costs(one_params).opt_h2d, 1.0, 1e-9);
  EXPECT_GT(costs(one_params).param_h2d, 0.0) << "the weights go up in the next forward's fetch";
}

TEST(CpuAdamOffload, AProfileWithoutTheHostCastRateDoesNotPriceItAndANegativeOneIsRefused) {
  json j = read_json_file(std::string(CTXPLAN_SOURCE_DIR) + "/profiles/runtimes/hf-deepspeed.json");
  j["constants"].erase("host_fp32_to_bf16_gelems_per_s");
  const RuntimeProfile old = runtime_from_json(j, "old.json");
  EXPECT_EQ(old.host_fp32_to_bf16_elems_per_second, 0.0);
  const Job one_params = job("dp=1,zero=3,recompute=full,opt_offload=1,param_offload=1", "1xh100");
  EXPECT_EQ(step_costs(one_params.m, one_params.c, old, one_params.p, one_params.seq, true).opt_h2d, 0.0);
  j["constants"]["host_fp32_to_bf16_gelems_per_s"] = {{"value", -1}, {"source", "a test"}};
  try {
    runtime_from_json(j, "bad.json");
    FAIL() << "a negative host cast rate accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("host_fp32_to_bf16_gelems_per_s"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
  }
}

TEST(CpuAdamOffload, OtherRuntimesKeepTheCopiesAfterBackward) {
  const Job j = job("dp=8,zero=1,recompute=full,opt_offload=1", "8xh100", "megatron");
  ASSERT_FALSE(j.rt.optimizer_offload_on_device);
  const StepCosts k = costs(j);
  EXPECT_NEAR(k.opt_d2h, pcie(shard_params(j) * j.rt.grad_bytes, j.c), 1e-12);
  EXPECT_NEAR(k.opt_h2d, pcie(shard_params(j) * j.rt.weight_bytes, j.c), 1e-12);
}

}  // namespace
}  // namespace ctx
