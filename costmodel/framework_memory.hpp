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

#include "costmodel/model_spec.hpp"
#include "costmodel/pipeline_stages.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/runtime_profile.hpp"

namespace ctx {

// ---- constants from the sources (each names where it is defined)
// NCCL src/init.cc: DEFAULT_BUFFSIZE (1 << 22), the SIMPLE protocol's buffer per connection
// (NCCL_BUFFSIZE, docs "Environment Variables": default 4194304)
constexpr double kNcclSimpleBufferBytes = 4194304;
// NCCL src/init.cc DEFAULT_LL_BUFFSIZE = NCCL_LL_LINES_PER_THREAD (8) x NCCL_LL_MAX_NTHREADS (512) x
// NCCL_STEPS (8) x sizeof(union ncclLLFifoLine) (16) (src/include/device.h)
constexpr double kNcclLlBufferBytes = 8.0 * 512.0 * 8.0 * 16.0;
// NCCL src/init.cc DEFAULT_LL128_BUFFSIZE = NCCL_LL128_ELEMS_PER_THREAD (120) x NCCL_LL128_MAX_NTHREADS
// (640) x NCCL_STEPS (8) x sizeof(uint64_t) (src/include/device.h)
constexpr double kNcclLl128BufferBytes = 120.0 * 640.0 * 8.0 * 8.0;
// one connection's buffers, all three protocols
constexpr double kNcclConnectionBytes = kNcclSimpleBufferBytes + kNcclLlBufferBytes + kNcclLl128BufferBytes;
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

// NCCL communicators a rank of this plan joins: one per process group of more than one rank that
// the plan communicates on (tp; the CP group, or Ulysses and ring groups under USP; the dp x cp
// gradient/ZeRO group, or HSDP's shard and replicate groups; the pipeline group).
int64_t nccl_communicators(const Plan& p);

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
FrameworkMemory framework_memory(const ModelSpec& m, const RuntimeProfile& rt, const Plan& p, const PipelineStage& stage,
                                 double stage_params, double live_large_tensors, double local_tokens = 0);

}  // namespace ctx
