// What a training stack allocates for itself beyond the model's tensors, term by term, each read
// from the framework's source: DeepSpeed ZeRO-3's offload buffers on the host, PyTorch's pinned
// host allocator, NCCL's buffers per communicator and channel, the CUDA caching allocator's
// rounding, Megatron's distributed-optimizer buffer padding. A runtime profile switches each term
// on with its own constants (runtime_profile.hpp, "framework memory"); all are off by default, so
// ctxrun's profiles (whose memory is measured by its own ledger) get none.
// The memory model adds the device terms to the `runtime` category and the host terms to the
// host `runtime` category, and keeps the list for the breakdown (predict, its JSON).
#pragma once
#include <array>
#include <cstdint>

#include "costmodel/hardware_spec.hpp"
#include "costmodel/model_spec.hpp"
#include "costmodel/pipeline_stages.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/runtime_profile.hpp"

namespace ctx {

// ---- constants from the sources (each names where it is defined). NCCL: the version PyTorch's
// wheels of the validated runs ship (torch 2.7 / the 2.8 nightlies of May 2025: NCCL 2.26.x), read at
// NVIDIA/nccl tag v2.26.5-1; v2.21.5-1 (torch 2.6) differs where noted.
// src/init.cc DEFAULT_BUFFSIZE (1 << 22), the SIMPLE protocol's buffer per connection
// (NCCL_BUFFSIZE, docs "Environment Variables": default 4194304)
constexpr double kNcclSimpleBufferBytes = 4194304;
// src/init.cc DEFAULT_LL_BUFFSIZE = NCCL_LL_LINES_PER_THREAD (8) x NCCL_LL_MAX_NTHREADS (512) x
// NCCL_STEPS (8) x sizeof(union ncclLLFifoLine) (16) (src/include/device.h)
constexpr double kNcclLlBufferBytes = 8.0 * 512.0 * 8.0 * 16.0;
// src/init.cc DEFAULT_LL128_BUFFSIZE = NCCL_LL128_ELEMS_PER_THREAD (120) x NCCL_LL128_MAX_NTHREADS
// (640) x NCCL_STEPS (8) x sizeof(uint64_t) (src/include/device.h)
constexpr double kNcclLl128BufferBytes = 120.0 * 640.0 * 8.0 * 8.0;
// the three protocols' buffers of one connection
constexpr double kNcclConnectionBytes = kNcclSimpleBufferBytes + kNcclLlBufferBytes + kNcclLl128BufferBytes;
// src/include/comm.h CUDA_IPC_MIN (2097152): src/transport/p2p.cc p2pRecvSetup sizes the receiver's
// buffer as sizeof(struct ncclRecvMem) (< 4 KiB, src/include/device.h) + every protocol's buffer
// (all three: the SIMPLE one moves to the sender only under P2P read, which graph/paths.cc
// ncclTopoCheckP2p turns on for compute capability 80 alone), ALIGN_SIZE'd to CUDA_IPC_MIN;
// p2pSendSetup gives the sender sizeof(struct ncclSendMem) aligned the same way. NCCL's docs
// (troubleshooting, NCCL_DEBUG_SUBSYS=P2P example) log the pair: 'Allocated shareable buffer ...
// size 10485760' and '... size 2097152' per channel.
constexpr double kNcclCudaIpcMinBytes = 2097152;
constexpr double kNcclRecvMemMaxBytes = 4096;  // sizeof(struct ncclRecvMem) is under 4 KiB
constexpr double kNcclP2pRecvBytes =  // ALIGN_SIZE(sizeof(ncclRecvMem) + the three buffers, CUDA_IPC_MIN): 5 x 2 MiB
    kNcclCudaIpcMinBytes * static_cast<double>(static_cast<int64_t>(
                               (kNcclConnectionBytes + kNcclRecvMemMaxBytes + kNcclCudaIpcMinBytes - 1) / kNcclCudaIpcMinBytes));
constexpr double kNcclP2pSendBytes = kNcclCudaIpcMinBytes;
// src/transport/nvls.cc: NCCL_NVLS_CHUNKSIZE default 128 KiB; ncclNvlsBufferSetup maps
// nvlsChannels x 2 x (chunk x NCCL_STEPS) x nHeads; ncclNvlsSetup's credits nChannels x 2 x 64 B x
// nHeads; nvlsAllocateMem ALIGN_SIZEs each to the multicast granularity
// (cuMulticastGetGranularity RECOMMENDED) and the unicast one (cuMemGetAllocationGranularity):
// NCCL's docs (troubleshooting, NVLS example, nranks 8) log 'ucgran 2097152 ... mcgran 2097152'.
constexpr double kNcclNvlsChunkBytes = 131072;
constexpr double kNcclSteps = 8;
constexpr double kNcclNvlsCreditBytes = 64;
constexpr double kNcclNvlsGranularityBytes = 2097152;
// src/graph/paths.cc ncclTopoGetNchannels: a peer on another node starts at 2 channels
// (NCCL_NCHANNELS_PER_NET_PEER unset), raised to the NICs the GPU needs for its bandwidth
// (getLocalNetCountByBw); ncclTopoComputeP2pChannels takes the minimum over all peers, so a
// communicator that spans nodes gives every peer that many p2p channels. The lower figure.
constexpr double kNcclNetPeerChannels = 2;

// PyTorch c10/cuda/CUDACachingAllocator.cpp: large allocations are mapped in multiples of kRoundLarge;
// a block keeps an unsplit remainder up to kSmallSize (should_split: remaining > kSmallSize);
// expandable segments grow in pages of kLargeBuffer (large pool) and kSmallBuffer (small pool)
constexpr double kCudaRoundLargeBytes = 2097152;   // kRoundLarge
constexpr double kCudaSmallSizeBytes = 1048576;    // kSmallSize
constexpr double kCudaLargeBufferBytes = 20971520; // kLargeBuffer
constexpr double kCudaSmallBufferBytes = 2097152;  // kSmallBuffer
// Megatron-LM megatron/core/distributed/param_and_grad_buffer.py _ParamAndGradBuffer.__init__ with
// the distributed optimizer: each parameter starts at a multiple of 64 elements
// (_pad_start_of_param_if_needed) and each bucket ends at a multiple of lcm(dp x cp, 128)
// (_pad_end_of_bucket_if_needed); default bucket_size max(40,000,000, 1,000,000 x dp x cp) elements
// (megatron/core/distributed/distributed_data_parallel_config.py bucket_size docstring)
constexpr int64_t kMegatronParamAlignElements = 64;
constexpr int64_t kMegatronBucketAlignElements = 128;
constexpr double kMegatronMinBucketElements = 40000000;
constexpr double kMegatronBucketElementsPerDpRank = 1000000;

// DeepSpeed deepspeed/runtime/zero/config.py DeepSpeedZeroConfig.sub_group_size default 1e9 elements:
// ZeRO-3 steps the optimizer one sub-group of the rank's partition at a time
// (stage3.py _prepare_fp32_grad_for_sub_group ... _release_sub_group)
constexpr double kDeepSpeedSubGroupElements = 1e9;

// DeepSpeed ZeRO-3 without optimizer offload: the bytes the optimizer step adds for the sub-group it
// steps (the bf16 flattened copy and its fp32 gradient, _prepare_fp32_grad_for_sub_group), given the
// rank's partition; 0 for other runtimes and plans.
double zero3_step_grad_bytes(const RuntimeProfile& rt, const Plan& p, double partition_params);

struct FrameworkTerm {
  const char* name = "";    // what it counts
  const char* source = "";  // the file and function it comes from
  double bytes = 0;         // per rank
  bool host = false;        // host memory of the rank's process (else device memory)
};

constexpr int kMaxFrameworkTerms = 8;
struct FrameworkMemory {
  std::array<FrameworkTerm, kMaxFrameworkTerms> terms{};
  int count = 0;
  double device_bytes() const;
  double host_bytes_per_rank() const;
};

// NCCL's device buffers of one rank (rank 0's groups; groups of one kind are congruent), by what
// creates them. NCCL 2.26 connects lazily (src/init.cc NCCL_RUNTIME_CONNECT default 1 with cuMem:
// src/group.cc ncclPrepareTasks/ncclCollPreconnect connect an algorithm's channels at its first use;
// src/enqueue.cc marks a p2p peer's channels at its first send/recv), so each kind is counted on the
// communicators whose operations create it:
// - ring: the collectives' groups (tp, the dp x cp ZeRO/gradient group, HSDP's shard and replicate
//   groups, the CP group under all-gather): channels x (one received + one sent connection:
//   kNcclP2pRecvBytes + kNcclP2pSendBytes);
//   and the Ulysses group's ring where the stack also runs a collective on it
//   (RuntimeProfile::ulysses_group_collectives; ring only: a few bytes never pick NVLS), and the
//   default (world) group where the loop runs a collective on it (world_group_collectives; ring only);
// - p2p: all-to-all (the Ulysses group: every member is a peer) and neighbour exchange (ring and
//   zigzag CP, pipeline stages: the previous and next rank) over NVLink: per peer on the node,
//   p2pnChannelsPerPeer connections each way (graph/paths.cc ncclTopoComputeP2pChannels: the
//   collective channels rounded up to a power of two on one node, kNcclNetPeerChannels when the
//   group spans nodes); peers on other nodes use the network transport, not counted;
// - nvls: where the hardware has NVLS (HardwareSpec::nccl_nvls_channels) and the collective group
//   has more than 2 GPUs on the node (nvls.cc ncclNvlsInit: gpuCount <= 2 disables it): the NVLS
//   buffer with nHeads = the group's GPUs on the node (one node: search.cc forces every GPU to be a
//   head; across nodes at most that) and its credits. Across nodes only for an all-reducing group
//   (graph/tuning.cc: without CollNet the NVLS algorithm is off there and NVLS_TREE is all-reduce
//   only). Lazily, where the tuner picks NVLS; an upper figure for groups whose collectives never do.
struct NcclBuffers {
  double ring = 0, p2p = 0, nvls = 0;
  double total() const { return ring + p2p + nvls; }
};
NcclBuffers nccl_buffers(const ClusterSpec& c, const RuntimeProfile& rt, const Plan& p);

// Megatron's padding of the contiguous parameter and gradient buffers (elements, an upper bound:
// every parameter start and every bucket end padded by the most its alignment can add).
// `stage_params` the parameters of this rank's buffers, `param_tensors` their tensor count.
double megatron_buffer_padding_elements(double stage_params, double param_tensors, int64_t dp_cp);

// The parameter tensors of a pipeline stage's buffers (pipeline_stage: uneven splits
// pp_first/pp_last/pp_embed/pp_loss give each stage its own layers): its layers x the TE weight
// tensors per layer, + the embedding on the first stage, + the final norm and output layer on the
// last (pp = 1: all layers + 3).
double megatron_stage_param_tensors(const ModelSpec& m, const PipelineStage& stage);

// Transformer Engine's userbuffers under tp_overlap (transformer_engine/pytorch/module/base.py
// initialize_ub: one registered buffer per overlapped GEMM, Megatron's shape [seq x mbs / cp, hidden],
// megatron/training/initialize.py _initialize_tp_communicators): the six all-gather buffers
// (layers_all_gather_overlap: qkv_fprop, qkv_dgrad, proj_dgrad, fc1_fprop, fc1_dgrad, fc2_dgrad) in FP8
// under an FP8 plan, the four reduce-scatter ones (proj_fprop, fc2_fprop, qkv_wgrad, fc1_wgrad) in the
// activation dtype; a ring-exchange RS holds 2 tp - 1 shards (CommOverlapP2PBase::initialize).
// `local_tokens` = seq x mbs / cp. 0 without tp_overlap.
double te_userbuffer_bytes(const ModelSpec& m, const RuntimeProfile& rt, const Plan& p, double local_tokens);

// The terms for one rank of pipeline stage `stage`. `stage_params`: the parameters that stage's
// model chunks hold on one TP rank (pipeline_stage_params, before ZeRO sharding); `live_large_tensors`: activations and transients alive at the device peak that
// the caching allocator placed in its large pool (> 1 MiB); `local_tokens`: seq x mbs / cp (the
// userbuffers' rows; 0: no userbuffers term).
FrameworkMemory framework_memory(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt, const Plan& p, const PipelineStage& stage,
                                 double stage_params, double live_large_tensors, double local_tokens = 0);

}  // namespace ctx
