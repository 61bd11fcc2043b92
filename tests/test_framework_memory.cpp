// The framework memory terms (costmodel/framework_memory.hpp) against hand arithmetic from the
// frameworks' source: DeepSpeed ZeRO-3 offload host buffers (and the copy the data loader's forked
// workers keep of them), PyTorch's pinned power-of-two rounding,
// NCCL buffers per communicator and channel, the CUDA caching allocator's rounding, Megatron's
// distributed-optimizer buffer padding; and that ctxrun's profiles get none of them.
// shared/reference/memory_facts.jsonl states no host figure for these buffers (its one host figure,
// ALST's ~915 GiB of offloaded checkpoints per node, is test_memory_facts' and no term changes it).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "costmodel/framework_memory.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/prediction.hpp"
#include "costmodel/profile_store.hpp"
#include "planner/validation_points.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(default_profiles_dir());
  return p;
}

MemoryPrediction run(const std::string& plan_text, const std::string& runtime, const std::string& cluster = "8xh100",
                     const std::string& model = "Llama-3.1-8B", int64_t seq = 32768) {
  ModelSpec m = resolve_model(profiles(), model);
  ClusterSpec c = resolve_cluster(profiles(), cluster);
  Plan p = parse_plan(plan_text);
  PlanCheck chk = check_plan(p, m, c, seq);
  EXPECT_TRUE(chk.ok()) << plan_text << ": " << chk.message();
  return predict_memory(m, c, resolve_runtime(profiles(), runtime), p, seq);
}

double term(const MemoryPrediction& mp, const std::string& name) {
  for (int i = 0; i < mp.framework.count; ++i)
    if (name == mp.framework.terms[i].name) return mp.framework.terms[i].bytes;
  return 0;
}

double host(const MemoryPrediction& mp, HostMem c) { return mp.host_bytes_per_node[static_cast<int>(c)]; }

constexpr double kLlama31_8bParams = 8030261248.0;  // Llama-3.1-8B (test_memory_facts: 144 GB of model states / 18 B)
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

TEST(FrameworkMemory, DeepSpeedZero3OffloadHostBuffersFollowStage3) {
  // Llama-3.1-8B, hf-deepspeed, 8 x H100, dp=8 ZeRO-3 with optimizer and parameter offload.
  // Partition per rank: 8,030,261,248 / 8 = 1,003,782,656 parameters.
  //  - grad_partitions_flat_buffer (stage3.py _setup_for_real_optimizer), bf16 on the host:
  //    2 x 1,003,782,656 = 2,007,565,312 B per rank
  //  - the pinned flat bf16 weight partition (2,007,565,312 B) rounded up to 2^31 = 2,147,483,648 B
  //    by PyTorch's caching host allocator: +139,918,336 B per rank
  //  - the data loader's forked worker keeps the pre-fork pages of the fp32 master, fp32 gradient and
  //    bf16 gradient partitions (copy-on-write, the rank rewrites them every step):
  //    (4 + 4 + 2) x 1,003,782,656 = 10,037,826,560 B per rank
  //  - per node (8 ranks): optimizer 8P = 64,242,089,984, master 4P = 32,121,044,992, fp32 grads
  //    4P = 32,121,044,992, weights 2P = 16,060,522,496, runtime 8 x (8 GiB + 2,007,565,312 +
  //    139,918,336 + 10,037,826,560) = 8 x 20,775,244,800 = 166,201,958,400; total 310,746,660,864 B
  //    (230,444,048,384 before the copy-on-write term)
  MemoryPrediction mp = run("dp=8,zero=3,recompute=full,opt_offload=1,param_offload=1", "hf-deepspeed");
  EXPECT_DOUBLE_EQ(term(mp, "zero3_offload_grad_partitions"), 2007565312.0);
  EXPECT_DOUBLE_EQ(term(mp, "zero3_param_offload_pinned_rounding"), 139918336.0);
  EXPECT_DOUBLE_EQ(term(mp, "zero3_offload_buffers_copied_on_write"), 10037826560.0);
  EXPECT_DOUBLE_EQ(host(mp, HostMem::runtime), 166201958400.0);
  EXPECT_DOUBLE_EQ(host(mp, HostMem::optimizer), 8.0 * kLlama31_8bParams);
  EXPECT_DOUBLE_EQ(host(mp, HostMem::grads), 4.0 * kLlama31_8bParams);
  EXPECT_DOUBLE_EQ(mp.host_total_bytes_per_node, 310746660864.0);
}

TEST(FrameworkMemory, ForkedDataLoaderWorkersKeepTheOffloadBuffersPreForkPages) {
  // ALST's 32-GPU Llama-3.1-70B recipe at its 4M tokens ("at the brink of cpu-oom!"), 4 nodes.
  // Llama-3.1-70B by hand: embedding and head 2 x 128,256 x 8,192 = 2,101,346,304; per layer q and o
  // 2 x 8,192^2 = 134,217,728, k and v 2 x 8,192 x 1,024 = 16,777,216, MLP 3 x 8,192 x 28,672 =
  // 704,643,072, two norms 16,384: 855,654,400; 80 layers 68,452,352,000; final norm 8,192:
  // P = 70,553,706,496; partition per rank P / 32 = 2,204,803,328; per node (8 ranks) 17,638,426,624.
  //  - copy-on-write term (the worker's copy of master 4 + fp32 grads 4 + bf16 grads 2 bytes per
  //    partition parameter): 10 x 2,204,803,328 = 22,048,033,280 B per rank
  //  - checkpoints: 80 layers x 8 ranks x (4,000,000 / 32 = 125,000 tokens) x 8,192 x 2 B = 1,310,720,000,000
  //  - optimizer 8 x 17,638,426,624 = 141,107,412,992; master and fp32 grads 4 x = 70,553,706,496 each
  //  - runtime 8 x (8 GiB 8,589,934,592 + bf16 grads 4,409,606,656 + 22,048,033,280) = 280,380,596,224
  //  total 1,873,315,422,208 B per node (1,696,931,155,968 = 1,580.39 GiB without the term)
  MemoryPrediction mp = run("cp=32,cp_kind=ulysses,zero=3,recompute=full,opt_offload=1,tiled_loss=4096,tiled_mlp=auto,ckpt_offload=1",
                            "hf-deepspeed", "aws-p5-4node", "Llama-3.1-70B", 4000000);
  EXPECT_DOUBLE_EQ(term(mp, "zero3_offload_buffers_copied_on_write"), 22048033280.0);
  EXPECT_DOUBLE_EQ(host(mp, HostMem::checkpoints), 1310720000000.0);
  EXPECT_DOUBLE_EQ(host(mp, HostMem::runtime), 280380596224.0);
  EXPECT_DOUBLE_EQ(mp.host_total_bytes_per_node, 1873315422208.0);
  // Adam's moments are created at the first step, after the fork: one copy (8 B per parameter)
  EXPECT_DOUBLE_EQ(host(mp, HostMem::optimizer), 8.0 * 17638426624.0);

  // the term follows the profile's constant: off, the host runtime is the 8 GiB and the bf16 partition
  const std::string path = default_profiles_dir() + "/runtimes/hf-deepspeed.json";
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  json j = parse_json_text(text.str(), path);
  EXPECT_TRUE(runtime_from_json(j, "test").dataloader_forks_after_offload_buffers);
  j["constants"]["dataloader_forks_after_offload_buffers"]["value"] = false;
  const RuntimeProfile off = runtime_from_json(j, "test");
  const Plan plan = parse_plan("cp=32,cp_kind=ulysses,zero=3,recompute=full,opt_offload=1,tiled_loss=4096,tiled_mlp=auto,ckpt_offload=1");
  const MemoryPrediction without = predict_memory(resolve_model(profiles(), "Llama-3.1-70B"),
                                                  resolve_cluster(profiles(), "aws-p5-4node"), off, plan, 4000000);
  EXPECT_DOUBLE_EQ(term(without, "zero3_offload_buffers_copied_on_write"), 0.0);
  EXPECT_DOUBLE_EQ(without.host_total_bytes_per_node, 1696931155968.0);
  // the device is untouched: only host memory moves
  EXPECT_DOUBLE_EQ(without.peak.total(), mp.peak.total());
}

TEST(FrameworkMemory, PinnedRoundingOnOneGpuIsTheNextPowerOfTwo) {
  // ALST's single-GPU baseline: the whole 16,060,522,496-byte bf16 partition is pinned and rounded to
  // 2^34 = 17,179,869,184 B: +1,119,346,688 B; the bf16 gradient partition is 16,060,522,496 B
  MemoryPrediction mp = run("dp=1,zero=3,recompute=full,opt_offload=1,param_offload=1", "hf-deepspeed", "1xh100");
  EXPECT_DOUBLE_EQ(term(mp, "zero3_param_offload_pinned_rounding"), 1119346688.0);
  EXPECT_DOUBLE_EQ(term(mp, "zero3_offload_grad_partitions"), 2.0 * kLlama31_8bParams);
  EXPECT_DOUBLE_EQ(term(mp, "nccl_buffers"), 0.0) << "one rank: no communicator";
}

TEST(FrameworkMemory, OffloadTermsNeedZero3AndTheirOffload) {
  // no optimizer offload: the flat gradient partition lives on the device (not a host term); no
  // parameter offload: no pinned weight copy; ZeRO-2's offload is stage_1_and_2.py, not stage3.py
  MemoryPrediction dev = run("dp=8,zero=3,recompute=full", "hf-deepspeed");
  EXPECT_DOUBLE_EQ(term(dev, "zero3_offload_grad_partitions"), 0.0);
  EXPECT_DOUBLE_EQ(term(dev, "zero3_param_offload_pinned_rounding"), 0.0);
  MemoryPrediction opt = run("dp=8,zero=3,recompute=full,opt_offload=1", "hf-deepspeed");
  EXPECT_GT(term(opt, "zero3_offload_grad_partitions"), 0.0);
  EXPECT_DOUBLE_EQ(term(opt, "zero3_param_offload_pinned_rounding"), 0.0);
  MemoryPrediction z2 = run("dp=8,zero=2,recompute=full,opt_offload=1", "hf-deepspeed");
  EXPECT_DOUBLE_EQ(term(z2, "zero3_offload_grad_partitions"), 0.0);
  // the forked workers' copy is of the host buffers: none without optimizer offload, none under
  // ZeRO-2 (stage_1_and_2.py's buffers not read), and no other runtime states the fork
  EXPECT_DOUBLE_EQ(term(dev, "zero3_offload_buffers_copied_on_write"), 0.0);
  EXPECT_GT(term(opt, "zero3_offload_buffers_copied_on_write"), 0.0);
  EXPECT_DOUBLE_EQ(term(z2, "zero3_offload_buffers_copied_on_write"), 0.0);
  for (const char* other : {"megatron", "torchtitan", "llm-foundry"})
    EXPECT_FALSE(resolve_runtime(profiles(), other).dataloader_forks_after_offload_buffers) << other;
}

TEST(FrameworkMemory, DeepSpeedZero3WithoutOffloadKeepsBf16GradientsAndStepsOneFp32SubGroup) {
  // Without optimizer offload the flat gradient partition lives on the device in bf16 (stage3.py
  // _setup_for_real_optimizer): 2 x 1,003,782,656 = 2,007,565,312 B per GPU at dp=8, where a persistent
  // fp32 gradient would be 4,015,130,624 B. The step flattens one sub-group (sub_group_size 1e9 elements
  // of the 1,003,782,656-element partition) in bf16 and converts it to fp32 (_prepare_fp32_grad_for_sub_group):
  // + 1e9 x (2 + 4) = 6,000,000,000 B in the optimizer phase: 8,007,565,312 B
  MemoryPrediction mp = run("dp=8,zero=3,recompute=full", "hf-deepspeed");
  EXPECT_DOUBLE_EQ(mp.phase_peak[static_cast<int>(Phase::backward)][Mem::grads], 2007565312.0);
  EXPECT_DOUBLE_EQ(mp.phase_peak[static_cast<int>(Phase::optimizer)][Mem::grads], 8007565312.0);
  // on 32 GPUs the partition (250,945,664 elements) is one sub-group: + 6 x 250,945,664 in the step
  MemoryPrediction wide = run("dp=32,zero=3,recompute=full", "hf-deepspeed", "4x8xh100");
  EXPECT_DOUBLE_EQ(wide.phase_peak[static_cast<int>(Phase::optimizer)][Mem::grads], 8.0 * 250945664.0);
  // megatron (not DeepSpeed) keeps its fp32 gradient shard under ZeRO-3: 4 x P / 8
  MemoryPrediction meg = run("dp=8,zero=3,recompute=full", "megatron");
  EXPECT_DOUBLE_EQ(meg.phase_peak[static_cast<int>(Phase::backward)][Mem::grads], 4.0 * 1003782656.0);
}

TEST(FrameworkMemory, NcclBuffersFollowNcclsConnectionSetup) {
  // NCCL 2.26.5 (the version PyTorch 2.7 wheels and the 2.8 nightlies of ALST's runs ship), by hand:
  // - one P2P-transport connection on H100 (write mode: graph/paths.cc ncclTopoCheckP2p turns P2P
  //   read on for compute capability 80 only): the receiver holds sizeof(ncclRecvMem) (< 4 KiB) +
  //   LL 524,288 + LL128 4,915,200 + SIMPLE 4,194,304 = 9,633,792 B + < 4 KiB, ALIGN_SIZE'd to
  //   CUDA_IPC_MIN 2 MiB -> 10 MiB (transport/p2p.cc p2pRecvSetup); the sender sizeof(ncclSendMem)
  //   -> 2 MiB (p2pSendSetup). NCCL's docs log the pair as 'size 10485760' / 'size 2097152'.
  EXPECT_DOUBLE_EQ(kNcclConnectionBytes, 9633792.0);
  EXPECT_DOUBLE_EQ(kNcclP2pRecvBytes, 10.0 * kMiB);
  EXPECT_DOUBLE_EQ(kNcclP2pSendBytes, 2.0 * kMiB);
  const double connection = 12.0 * kMiB;
  // - a collective group's ring: 24 channels (hf-deepspeed.json nccl_channels: a p5 node's NCCL log)
  //   x one received and one sent connection = 288 MiB = 301,989,888 B
  const double ring = 24.0 * connection;
  EXPECT_DOUBLE_EQ(ring, 301989888.0);
  // - NVLS on an 8-GPU H100 node (nvls.cc: NVLS_NCHANNELS_SM90 16, chunk 128 KiB x NCCL_STEPS 8 =
  //   1 MiB, x 2, x 8 heads): 16 x 2 x 1 MiB x 8 = 256 MiB (a multiple of the 2 MiB granularity),
  //   + credits 24 coll channels x 2 x 64 B x 8 heads = 24,576 B (NCCL's docs log 'inputsize 24576')
  //   -> aligned to 2 MiB: 258 MiB
  const double nvls8 = 256.0 * kMiB + 2.0 * kMiB;
  // dp=8 ZeRO-3: the ZeRO group's ring and NVLS, and the default group's ring (hf-deepspeed
  // world_group_collectives: ArcticTraining's metrics all_gather_object on it; DeepSpeed's ZeRO group
  // is a clone of the world group, a communicator of its own): 288 + 258 + 288 = 834 MiB
  ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const RuntimeProfile ds = resolve_runtime(profiles(), "hf-deepspeed");
  NcclBuffers b = nccl_buffers(resolve_cluster(profiles(), "8xh100"), ds, parse_plan("dp=8,zero=3"));
  EXPECT_DOUBLE_EQ(b.ring, 2.0 * ring);
  EXPECT_DOUBLE_EQ(b.nvls, nvls8);
  EXPECT_DOUBLE_EQ(b.p2p, 0.0);
  EXPECT_DOUBLE_EQ(term(run("dp=8,zero=3,recompute=full", "hf-deepspeed"), "nccl_buffers"), 834.0 * kMiB);
  // without the default group's collectives: the ZeRO group alone, 546 MiB
  RuntimeProfile ds_no_world = ds;
  ds_no_world.world_group_collectives = false;
  EXPECT_DOUBLE_EQ(nccl_buffers(resolve_cluster(profiles(), "8xh100"), ds_no_world, parse_plan("dp=8,zero=3")).total(), 546.0 * kMiB);
  // ALST's Ulysses SP=8 on one node (dp=1): the ZeRO group as above; the SP group's all-to-all:
  // 7 peers x p2pnChannelsPerPeer 32 (graph/paths.cc ncclTopoComputeP2pChannels: min(coll channels
  // 24, 2 x NVLink paths) rounded up to a power of two; the p5 log's '32 p2p channels per peer') x
  // 12 MiB = 2,688 MiB; and the SP group's ring for ArcticTraining's loss all-gather
  // (ulysses_group_collectives; no NVLS at 4 bytes): 288 MiB; and the default group's ring, 288 MiB.
  // Total 288 + 258 + 2,688 + 288 + 288 = 3,810 MiB
  b = nccl_buffers(resolve_cluster(profiles(), "8xh100"), ds, parse_plan("cp=8,cp_kind=ulysses,zero=3"));
  EXPECT_DOUBLE_EQ(b.p2p, 7.0 * 32.0 * connection);
  EXPECT_DOUBLE_EQ(b.ring, 3.0 * ring);
  EXPECT_DOUBLE_EQ(b.nvls, nvls8);
  EXPECT_DOUBLE_EQ(b.total(), 3810.0 * kMiB);
  EXPECT_DOUBLE_EQ(term(run("cp=8,cp_kind=ulysses,zero=3,recompute=full", "hf-deepspeed"), "nccl_buffers"), 3810.0 * kMiB);
  // without a collective on the Ulysses group (the flag off) only its all-to-all peers: 3,522 MiB
  RuntimeProfile ds_a2a_only = ds;
  ds_a2a_only.ulysses_group_collectives = false;
  EXPECT_DOUBLE_EQ(nccl_buffers(resolve_cluster(profiles(), "8xh100"), ds_a2a_only, parse_plan("cp=8,cp_kind=ulysses,zero=3")).total(),
                   3522.0 * kMiB);
  // Ulysses SP=32 over 4 nodes: the default group's ring, the ZeRO group's ring (it spans nodes and only all-gathers and
  // reduce-scatters: graph/tuning.cc turns the NVLS algorithm off across nodes without CollNet, and
  // NVLS_TREE is all-reduce only: no NVLS buffers), the SP group's ring, and its all-to-all: the
  // group spans nodes, so every peer gets 2 channels (NCCL_NCHANNELS_PER_NET_PEER's start, the
  // minimum over all peers); the 7 peers on the node use P2P: 7 x 2 x 12 MiB = 168 MiB
  b = nccl_buffers(resolve_cluster(profiles(), "aws-p5-4node"), ds, parse_plan("cp=32,cp_kind=ulysses,zero=3"));
  EXPECT_DOUBLE_EQ(b.ring, 3.0 * ring);
  EXPECT_DOUBLE_EQ(b.nvls, 0.0);
  EXPECT_DOUBLE_EQ(b.p2p, 168.0 * kMiB);
  // DDP over 2 nodes (zero=0) all-reduces: NVLS_TREE needs the NVLS buffers, 8 heads on the node
  EXPECT_DOUBLE_EQ(nccl_buffers(resolve_cluster(profiles(), "aws-p5-2node"), ds, parse_plan("dp=16")).nvls, nvls8);
  // dp=2, tp=2, cp=2 zigzag (megatron): the tp group (2 GPUs: ring, no NVLS, ncclNvlsInit needs > 2),
  // the cp group's neighbour exchange (one peer: pow2(24) = 32 x 12 MiB), the dp x cp group (4 GPUs:
  // ring + NVLS with 4 heads: 16 x 2 x 1 MiB x 4 = 128 MiB + credits 12 KiB -> 2 MiB)
  b = nccl_buffers(resolve_cluster(profiles(), "8xh100"), resolve_runtime(profiles(), "megatron"),
                   parse_plan("dp=2,tp=2,cp=2,cp_kind=zigzag,zero=1"));
  EXPECT_DOUBLE_EQ(b.ring, 2.0 * ring);
  EXPECT_DOUBLE_EQ(b.p2p, 32.0 * connection);
  EXPECT_DOUBLE_EQ(b.nvls, 130.0 * kMiB);
  // no NVLS below compute capability 90 (A100: graph/search.cc), nor without NVSwitch (H100 PCIe)
  EXPECT_DOUBLE_EQ(nccl_buffers(resolve_cluster(profiles(), "8xa100"), ds, parse_plan("dp=8,zero=3")).nvls, 0.0);
  EXPECT_DOUBLE_EQ(nccl_buffers(resolve_cluster(profiles(), "8xh100-pcie"), ds, parse_plan("dp=8,zero=3")).nvls, 0.0);
  // B200: NVLS_NCHANNELS_SM100 32: 32 x 2 x 1 MiB x 8 = 512 MiB + 2 MiB of credits
  EXPECT_DOUBLE_EQ(nccl_buffers(resolve_cluster(profiles(), "8xb200"), ds, parse_plan("dp=8,zero=3")).nvls, 514.0 * kMiB);
  // the device runtime category is the cuBLAS workspace (32 MiB) + NCCL + the caching allocator's
  // expected unfilled pages under expandable segments ((20 MiB + 2 MiB) / 2 = 11 MiB) + DeepSpeed
  // ZeRO-3's flat IPG bucket, DeepSpeed 0.17.0's default reduce_bucket_size of 5e8 bf16 elements
  // (zero/config.py; stage3.py __ipg_bucket_flat_buffer): 1,000,000,000 B, in every phase
  MemoryPrediction mp = run("dp=8,zero=3,recompute=full", "hf-deepspeed");
  EXPECT_DOUBLE_EQ(mp.peak[Mem::runtime], 32.0 * kMiB + 834.0 * kMiB + 11.0 * kMiB + 1e9);
  for (int ph = 0; ph < kPhases; ++ph) EXPECT_GE(mp.phase_peak[ph][Mem::runtime], 1e9) << ph;
  (void)m;
}

TEST(FrameworkMemory, CtxrunProfilesGetNoNcclTerm) {
  // ctxrun's memory is its own ledger's (docs/CUDA.md: NCCL's internal buffers are not in it), and the
  // prediction is compared with the ledger: its profiles set no nccl_channels, so no NCCL term on
  // any plan, even one whose groups would create every kind of buffer on a node with NVLS
  for (const char* rt_name : {"ctxrun-cuda", "ctxrun-cpu"}) {
    const RuntimeProfile rt = resolve_runtime(profiles(), rt_name);
    EXPECT_EQ(rt.nccl_channels, 0.0) << rt_name;
    for (const char* plan : {"dp=8,zero=3", "cp=8,cp_kind=ulysses,zero=3", "dp=2,tp=2,cp=2,cp_kind=zigzag,zero=1"}) {
      EXPECT_DOUBLE_EQ(nccl_buffers(resolve_cluster(profiles(), "8xh100"), rt, parse_plan(plan)).total(), 0.0) << rt_name << " " << plan;
      ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
      ClusterSpec c = resolve_cluster(profiles(), "8xh100");
      Plan p = parse_plan(plan);
      if (!check_plan(p, m, c, 8192).ok()) continue;
      EXPECT_DOUBLE_EQ(term(predict_memory(m, c, rt, p, 8192), "nccl_buffers"), 0.0) << rt_name << " " << plan;
    }
  }
}

TEST(FrameworkMemory, TorchMaxReservedLeavesOutNcclBuffers) {
  // torchtitan's logged memory is torch.cuda.max_memory_reserved; NCCL allocates its buffers with
  // cuMem outside PyTorch's caching allocator, so the validation metric is the device peak minus
  // them: dp=8 on the 96 GB H100 hosts (NVLS: 16 channels) is the ZeRO group's ring (288 MiB) and
  // NVLS (258 MiB): 546 MiB = 572,522,496 B
  ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  ClusterSpec c = resolve_cluster(profiles(), "8xh100-96gb");
  Prediction p = predict(m, c, resolve_runtime(profiles(), "torchtitan"), parse_plan("dp=8,zero=3,recompute=selective,mbs=2"), 8192);
  EXPECT_DOUBLE_EQ(metric_from("torch_max_reserved_gib", m, c.gpu, p) * kGiB, p.memory.peak.total() - 572522496.0);
}

TEST(FrameworkMemory, NvmlReadingIsTheWholePeakPlusTheCudaContext) {
  // ArcticTraining's "NV" figure is NVML's used memory of the card: everything mapped on it, NCCL's
  // buffers included, plus the CUDA context the hardware profile leaves out of the usable memory.
  // h100-sxm-80gb.json: hbm_mib 81559, usable_mib 81000 -> 559 MiB = 586,153,984 B of context.
  // Against torch's max_reserved the NVML reading adds exactly NCCL's buffers (hf-deepspeed dp=8:
  // 834 MiB = 874,512,384 B, NcclBuffersFollowNcclsConnectionSetup) and the context.
  ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  ClusterSpec c = resolve_cluster(profiles(), "8xh100");
  Prediction p = predict(m, c, resolve_runtime(profiles(), "hf-deepspeed"), parse_plan("dp=8,zero=3,recompute=full,opt_offload=1"), 32768);
  EXPECT_DOUBLE_EQ(metric_from("nvml_used_gib", m, c.gpu, p) * kGiB, p.memory.peak.total() + 586153984.0);
  EXPECT_NEAR((metric_from("nvml_used_gib", m, c.gpu, p) - metric_from("torch_max_reserved_gib", m, c.gpu, p)) * kGiB,
              874512384.0 + 586153984.0, 1e-3);
  // an unknown definition names the valid ones
  try {
    metric_from("nvidia_smi_gib", m, c.gpu, p);
    FAIL() << "accepted an unknown definition";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("nvml_used_gib"), std::string::npos) << e.what();
  }
}

TEST(FrameworkMemory, CachingAllocatorRoundingWithoutExpandableSegments) {
  // megatron (default segments), Llama-2-7B, 32 layers, full recompute: 32 live checkpoints, each
  // expected to keep kRoundLarge / 8 = 262,144 B of unsplit remainder: 8,388,608 B
  MemoryPrediction mp = run("dp=8,zero=1,recompute=full", "megatron", "8xh100", "Llama-2-7B", 4096);
  EXPECT_DOUBLE_EQ(term(mp, "caching_allocator_rounding"), 32.0 * 262144.0);
}

TEST(FrameworkMemory, MegatronBufferPaddingBound) {
  // Llama-2-7B (6,738,415,616 parameters), dp=8 with the distributed optimizer: buckets of
  // max(40M, 8M) = 40,000,000 elements -> ceil(168.46) = 169 buckets, each end padded by at most
  // lcm(8, 128) - 1 = 127; 32 layers x 6 TE weight tensors + 3 = 195 parameters, each start padded by
  // at most 63: 169 x 127 + 195 x 63 = 21,463 + 12,285 = 33,748 elements x (2 + 4) bytes = 202,488 B
  EXPECT_DOUBLE_EQ(megatron_buffer_padding_elements(6738415616.0, 195.0, 8), 33748.0);
  MemoryPrediction mp = run("dp=8,zero=1,recompute=full", "megatron", "8xh100", "Llama-2-7B", 4096);
  EXPECT_DOUBLE_EQ(term(mp, "megatron_buffer_padding"), 202488.0);
  // without the distributed optimizer (zero=0) Megatron does not pad
  EXPECT_DOUBLE_EQ(term(run("dp=8,zero=0,recompute=full", "megatron", "8xh100", "Llama-2-7B", 4096), "megatron_buffer_padding"), 0.0);
}

TEST(FrameworkMemory, MegatronBufferPaddingCountsTheStagesOwnTensors) {
  // Llama-3.1-8B at tp = 2 (one layer per TP rank 109,060,096 parameters; embedding and head rows
  // 128256 / 2 = 64,128 x 4096 = 262,668,288 each; tests/test_pipeline_stages.cpp), pp = 4 with
  // pp_first = pp_last = 4: the middle stages hold (32 - 8) / 2 = 12 layers. Per stage:
  //   first  4 x 109,060,096 + 262,668,288             =   698,908,672 parameters, 4 x 6 + 1 = 25 tensors
  //   middle 12 x 109,060,096                          = 1,308,721,152,            12 x 6    = 72
  //   last   4 x 109,060,096 + 4,096 + 262,668,288     =   698,912,768,            4 x 6 + 2 = 26
  // (6 TE weight tensors a layer; the embedding; the final norm and the output layer). The
  // layers / pp rule gave every stage 32 / 4 x 6 + 3 = 51.
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  Plan p = parse_plan("tp=2,pp=4,pp_first=4,pp_last=4,dp=2,zero=1");
  EXPECT_DOUBLE_EQ(megatron_stage_param_tensors(m, pipeline_stage(m, p, 0)), 25.0);
  EXPECT_DOUBLE_EQ(megatron_stage_param_tensors(m, pipeline_stage(m, p, 1)), 72.0);
  EXPECT_DOUBLE_EQ(megatron_stage_param_tensors(m, pipeline_stage(m, p, 2)), 72.0);
  EXPECT_DOUBLE_EQ(megatron_stage_param_tensors(m, pipeline_stage(m, p, 3)), 26.0);
  // the middle stage's padding, dp = 2: buckets of max(40M, 2 x 1M) elements -> ceil(32.72) = 33,
  // each end padded by at most lcm(2, 128) - 1 = 127; 72 starts by at most 63:
  // 33 x 127 + 72 x 63 = 4,191 + 4,536 = 8,727 elements x (2 + 4) bytes (bf16 weight, fp32 grad)
  const RuntimeProfile rt = resolve_runtime(profiles(), "megatron");
  ASSERT_EQ(rt.weight_bytes + rt.grad_bytes, 6.0);
  const FrameworkMemory f = framework_memory(m, resolve_cluster(profiles(), "8xh100"), rt, p, pipeline_stage(m, p, 1), 1308721152.0, 0);
  double padding = 0;
  for (int i = 0; i < f.count; ++i)
    if (std::string(f.terms[i].name) == "megatron_buffer_padding") padding = f.terms[i].bytes;
  EXPECT_DOUBLE_EQ(padding, 8727.0 * 6.0);
  // the plan's memory: its peak stage is a middle one, with that term
  const MemoryPrediction mp = run("tp=2,pp=4,pp_first=4,pp_last=4,dp=2,zero=1,ga=4,recompute=full", "megatron", "2x8xh100", "Llama-3.1-8B", 8192);
  EXPECT_TRUE(mp.peak_stage == 1 || mp.peak_stage == 2) << mp.peak_stage;
  EXPECT_DOUBLE_EQ(term(mp, "megatron_buffer_padding"), 8727.0 * 6.0);
  // even split (pp = 4: 8 layers a stage): first 8 x 6 + 1 = 49, middle 48, last 50
  p = parse_plan("tp=2,pp=4,dp=2,zero=1");
  EXPECT_DOUBLE_EQ(megatron_stage_param_tensors(m, pipeline_stage(m, p, 0)), 49.0);
  EXPECT_DOUBLE_EQ(megatron_stage_param_tensors(m, pipeline_stage(m, p, 1)), 48.0);
  EXPECT_DOUBLE_EQ(megatron_stage_param_tensors(m, pipeline_stage(m, p, 3)), 50.0);
  // pp = 1: every layer, the embedding, the final norm and the output layer: 32 x 6 + 3
  EXPECT_DOUBLE_EQ(megatron_stage_param_tensors(m, pipeline_stage(m, parse_plan("tp=2,dp=8,zero=1"), 0)), 195.0);
}

TEST(FrameworkMemory, CtxrunProfilesHaveNoFrameworkTerms) {
  // ctxrun's memory is its ledger's (docs/VALIDATION.md memory fidelity): no modelled framework terms
  for (const char* rt : {"ctxrun-cpu", "ctxrun-cuda"})
    for (const char* plan : {"dp=8,zero=3,opt_offload=1,param_offload=1", "tp=2,cp=4,cp_kind=ring", "dp=2,cp=4,cp_kind=usp,ulysses=2,zero=1"}) {
      SCOPED_TRACE(std::string(rt) + " " + plan);
      MemoryPrediction mp = run(plan, rt, "8xh100", "Llama-3.1-8B", 8192);
      EXPECT_EQ(mp.framework.count, 0);
    }
}

TEST(FrameworkMemory, ProfileRejectsAnUnknownAllocatorMode) {
  // a real profile with one constant changed
  const std::string path = default_profiles_dir() + "/runtimes/hf-deepspeed.json";
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  json real = parse_json_text(text.str(), path);
  real["constants"]["caching_allocator"]["value"] = "buddy";
  try {
    runtime_from_json(real, "test");
    FAIL() << "an unknown caching_allocator must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("expandable_segments"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ctx
