#include "costmodel/framework_memory.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "costmodel/memory_model.hpp"
#include "costmodel/pipeline_stages.hpp"
#include "costmodel/process_groups.hpp"

namespace ctx {

double FrameworkMemory::device_bytes() const {
  double b = 0;
  for (int i = 0; i < count; ++i) b += terms[i].host ? 0.0 : terms[i].bytes;
  return b;
}

double FrameworkMemory::host_bytes_per_rank() const {
  double b = 0;
  for (int i = 0; i < count; ++i) b += terms[i].host ? terms[i].bytes : 0.0;
  return b;
}

namespace {

double align_up(double bytes, double granularity) { return std::ceil(bytes / granularity) * granularity; }
double pow2_ceil_channels(double x) { return x <= 1.0 ? 1.0 : std::exp2(std::ceil(std::log2(x))); }

struct GroupShape {
  int64_t size = 1;       // ranks in the group
  int64_t local = 1;      // of them on rank 0's node (rank 0 included)
  bool spans_nodes = false;
};

// rank 0's group of kind g, without listing it (nothing allocated on this hot path: predict_memory)
GroupShape group_shape(const Plan& p, Group g, int64_t gpus_per_node) {
  GroupShape s;
  s.size = group_size(p, g);
  s.local = group_members_below(p, g, gpus_per_node);
  s.spans_nodes = s.local < s.size;
  return s;
}

}  // namespace

NcclBuffers nccl_buffers(const ClusterSpec& c, const RuntimeProfile& rt, const Plan& plan) {
  NcclBuffers b;
  if (rt.nccl_channels <= 0) return b;
  // an unset dp (0) is one replica; copied only then (a Plan copy allocates: this is predict_memory's hot path)
  Plan with_dp;
  if (plan.dp < 1) with_dp = plan, with_dp.dp = 1;
  const Plan& p = plan.dp < 1 ? with_dp : plan;
  const int64_t gpn = std::max<int64_t>(1, c.gpus_per_node);
  const double coll_channels = rt.nccl_channels;
  const double connection = kNcclP2pRecvBytes + kNcclP2pSendBytes;  // one received + one sent, per channel
  // a group running collectives: its ring channels, and NVLS where the node has it
  // (`nvls`: its collectives are large enough for the tuner to pick NVLS; a loss all-gather of a
  // few bytes is not. `allreduce`: the group all-reduces; across nodes without CollNet (none on
  // these clusters) graph/tuning.cc ncclTopoTuneModel disables the NVLS algorithm and leaves
  // NVLS_TREE, which is all-reduce only, so a group spanning nodes gets NVLS buffers only then)
  auto collectives = [&](Group g, bool nvls, bool allreduce) {
    const GroupShape s = group_shape(p, g, gpn);
    if (s.size <= 1) return;
    b.ring += coll_channels * connection;
    if (nvls && (allreduce || !s.spans_nodes) && c.gpu.nccl_nvls_channels > 0 && s.local > 2) {
      const double heads = static_cast<double>(s.local);
      const double nvls_channels = static_cast<double>(c.gpu.nccl_nvls_channels);
      b.nvls += align_up(nvls_channels * 2.0 * kNcclNvlsChunkBytes * kNcclSteps * heads, kNcclNvlsGranularityBytes) +
                align_up(coll_channels * 2.0 * kNcclNvlsCreditBytes * heads, kNcclNvlsGranularityBytes);
    }
  };
  // a group exchanging point to point: the peers on the node, p2pnChannelsPerPeer connections each way
  auto point_to_point = [&](Group g, bool all_peers) {
    const GroupShape s = group_shape(p, g, gpn);
    if (s.size <= 1) return;
    double local_peers = 0;
    if (all_peers) {
      local_peers = static_cast<double>(s.local - 1);
    } else {  // the previous and the next rank of the group (one peer when the group has two)
      const int64_t next = group_member(p, g, 0, 1), prev = group_member(p, g, 0, s.size - 1);
      local_peers += (next / gpn == 0) ? 1.0 : 0.0;
      if (prev != next) local_peers += (prev / gpn == 0) ? 1.0 : 0.0;
    }
    const double per_peer = s.spans_nodes ? kNcclNetPeerChannels : pow2_ceil_channels(coll_channels);
    b.p2p += local_peers * per_peer * connection;
  };
  if (p.tp > 1) collectives(Group::tp, true, true);  // all-reduce (all-gather/reduce-scatter under SP)
  if (p.cp > 1) {
    switch (p.cp_comm) {
      case CpComm::a2a:  // Ulysses: all-to-all over the CP group (+ the loss all-gather where the stack runs it)
        point_to_point(Group::cp, true);
        if (rt.ulysses_group_collectives) collectives(Group::cp, false, false);
        break;
      case CpComm::a2a_p2p:  // USP: Ulysses all-to-all, ring exchange
        point_to_point(Group::ulysses, true);
        if (rt.ulysses_group_collectives) collectives(Group::ulysses, false, false);
        point_to_point(Group::ring, false);
        break;
      case CpComm::allgather: collectives(Group::cp, true, false); break;     // all-gather K,V, reduce-scatter dK,dV
      case CpComm::p2p: point_to_point(Group::cp, false); break; // ring / zigzag: send/recv to the neighbours
    }
  }
  if (zero_replicate_degree(p) > 1 && zero_shard_degree(p) > 1) {
    collectives(Group::zero_shard, true, false);     // all-gather / reduce-scatter
    collectives(Group::zero_replicate, true, true);  // all-reduce of the shards' gradients
  } else {
    collectives(Group::zero, true, p.zero == 0);     // DDP all-reduces; ZeRO all-gathers and reduce-scatters
  }
  if (p.pp > 1) point_to_point(Group::pp, false);
  // the default group: every rank, a few bytes (ring, no NVLS)
  if (rt.world_group_collectives && p.dp * p.tp * p.cp * std::max<int64_t>(1, p.pp) > 1) b.ring += coll_channels * connection;
  return b;
}

double megatron_buffer_padding_elements(double stage_params, double param_tensors, int64_t dp_cp) {
  const double bucket_elements = std::max(kMegatronMinBucketElements, kMegatronBucketElementsPerDpRank * static_cast<double>(dp_cp));
  const double buckets = std::ceil(stage_params / bucket_elements);
  const double bucket_align = static_cast<double>(std::lcm(std::max<int64_t>(1, dp_cp), kMegatronBucketAlignElements));
  return buckets * (bucket_align - 1.0) + param_tensors * static_cast<double>(kMegatronParamAlignElements - 1);
}

double zero3_step_grad_bytes(const RuntimeProfile& rt, const Plan& p, double partition_params) {
  if (p.zero != 3 || p.opt_offload || rt.zero3_grad_partition_bytes <= 0) return 0.0;
  // flatten(averaged_gradients) in the partition's dtype, then .to(fp32) for the optimizer
  return std::min(partition_params, kDeepSpeedSubGroupElements) * (rt.zero3_grad_partition_bytes + rt.grad_bytes);
}

namespace {

// the next power of two at or above x (x > 0), as c10::llvm::PowerOf2Ceil
double pow2_ceil(double x) { return x <= 1.0 ? 1.0 : std::exp2(std::ceil(std::log2(x))); }

// weight tensors Megatron's GPT layer registers with Transformer Engine's fused layers: linear_qkv
// (+ its fused input layer-norm weight), linear_proj, linear_fc1 (+ its fused pre-MLP norm
// weight), linear_fc2; a qkv bias adds one (megatron/core/models/gpt/gpt_layer_specs.py,
// get_gpt_layer_with_transformer_engine_spec)
double megatron_tensors_per_layer(const ModelSpec& m) { return 6.0 + (m.qkv_bias ? 1.0 : 0.0); }

}  // namespace

double megatron_stage_param_tensors(const ModelSpec& m, const PipelineStage& stage) {
  // its layers' tensors, the embedding on the first stage, the final norm and output layer on the last
  return static_cast<double>(stage.layers) * megatron_tensors_per_layer(m) + (stage.first ? 1.0 : 0.0) +
         (stage.last ? 2.0 : 0.0);
}

double te_userbuffer_bytes(const ModelSpec& m, const RuntimeProfile& rt, const Plan& p, double local_tokens) {
  if (!p.tp_overlap || p.tp <= 1 || local_tokens <= 0) return 0;
  const double rows_x_hidden = local_tokens * static_cast<double>(m.hidden);
  const double ag = p.precision == Precision::fp8 ? 1.0 : rt.activation_bytes, rs = rt.activation_bytes;
  const double tp = static_cast<double>(p.tp);
  const double proj_fc2_rs = rt.tp_overlap_rs_splits >= 1 ? 1.0 : (2.0 * tp - 1.0) / tp;  // pipeline, or ring exchange
  return rows_x_hidden * (6.0 * ag + 2.0 * proj_fc2_rs * rs + 2.0 * rs);
}

FrameworkMemory framework_memory(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt, const Plan& p, const PipelineStage& stage,
                                 double stage_params, double live_large_tensors, double local_tokens) {
  FrameworkMemory f;
  auto add = [&f](const char* name, const char* source, double bytes, bool host) {
    if (bytes <= 0 || f.count >= kMaxFrameworkTerms) return;
    f.terms[f.count++] = FrameworkTerm{name, source, bytes, host};
  };
  const double Z = static_cast<double>(zero_shard_degree(p));

  // DeepSpeed ZeRO-3 with the optimizer offloaded to the CPU keeps, besides the optimizer's fp32
  // gradient partition (initialize_optimizer_states: subgroup_gradient_buffer, counted as the host
  // grads), the flat partition the reduce-scatter lands in: grad_partitions_flat_buffer, one element
  // per parameter of the rank's partition, on self.device = cpu, in gradient_accumulation_dtype
  // (bf16 for a bf16 model under ZeRO when data_types.grad_accum_dtype is unset, engine.get_data_types).
  // NVMe swap buffers (buffer_count x buffer_size, PartitionedOptimizerSwapper, AsyncPartitionedParameterSwapper)
  // exist only with device "nvme"; CPU offload allocates none.
  if (p.zero == 3 && p.opt_offload && rt.zero3_grad_partition_bytes > 0)
    add("zero3_offload_grad_partitions",
        "deepspeed/runtime/zero/stage3.py DeepSpeedZeroOptimizer_Stage3._setup_for_real_optimizer (grad_partitions_flat_buffer on the offload device); dtype from runtime/engine.py get_data_types",
        rt.zero3_grad_partition_bytes * stage_params / Z, true);

  // DeepSpeed ZeRO-3 parameter offload pins the flat host copy of the weight partition
  // unconditionally (_create_param_groups_fp16_flat_cpu_memory: get_accelerator().pin_memory), and
  // PyTorch's pinned memory comes from the caching host allocator, which rounds every request up to
  // the next power of two (aten/src/ATen/core/CachingHostAllocator.h, allocate: PowerOf2Ceil). The
  // term is the rounding beyond the partition's bytes (counted as the host weights).
  if (p.zero == 3 && p.param_offload && rt.zero3_param_offload_pinned_pow2) {
    const double partition = rt.weight_bytes * stage_params / Z;
    add("zero3_param_offload_pinned_rounding",
        "deepspeed/runtime/zero/stage3.py _create_param_groups_fp16_flat_cpu_memory (pinned flat buffer); aten/src/ATen/core/CachingHostAllocator.h CachingHostAllocatorImpl::allocate (PowerOf2Ceil)",
        pow2_ceil(partition) - partition, true);
  }

  // The same host buffers a second time, in the data loader's worker processes. DeepSpeed 0.17.0
  // allocates and fills them in deepspeed.initialize (stage3.py DeepSpeedZeroOptimizer_Stage3.__init__
  // -> _setup_for_real_optimizer: _create_fp32_partitions' fp32 master partition
  // (.to(cpu).clone().float()), initialize_optimizer_states' subgroup_gradient_buffer (torch.zeros,
  // the host grads), grad_partitions_flat_buffer (torch.zeros, the term above)); ArcticTraining
  // 9d33fd2 (trainer/trainer.py Trainer.__init__) wraps its DataLoader (data/sft_factory.py
  // create_dataloader: num_workers = dl_num_workers, 1 in every ALST recipe, 2 by default) in
  // UlyssesSPDataLoaderAdapter after deepspeed.initialize, whose __init__ calls iter(dl) (DeepSpeed
  // runtime/sequence_parallel/ulysses_sp.py; without SP the first iter() is Trainer.epoch's loop),
  // and PyTorch starts the workers with multiprocessing_context.Process (torch/utils/data/dataloader.py
  // _MultiProcessingDataLoaderIter.__init__; default context torch.multiprocessing: fork on Linux
  // before Python 3.14). fork(2) shares the parent's pages copy-on-write: when the rank then writes a
  // shared page, the kernel gives the rank a new copy and the worker keeps the old one while it lives
  // (the whole epoch). The rank writes all three every step (partition_grads: grad_buffer.copy_,
  // fp32_grad_tensor.copy_; unscale_and_clip_grads: mul_; DeepSpeedCPUAdam.step updates the master in
  // place), so from the second step on the node holds them twice; one copy however many workers
  // share the old pages. Not doubled: Adam's moments (ops/adam/cpu_adam.py step creates exp_avg and
  // exp_avg_sq at the first step, after the fork; DeepSpeed PR #5104 removed the step at
  // initialization), the checkpoints offloaded during the step, and the pinned weight partition of
  // offload_param (whether the CUDA driver keeps pinned pages out of the child is not read: not counted).
  if (p.zero == 3 && p.opt_offload && rt.dataloader_forks_after_offload_buffers && rt.zero3_grad_partition_bytes > 0) {
    const double host_grads = rt.offload_grads_with_optimizer ? rt.grad_bytes : 0.0;
    add("zero3_offload_buffers_copied_on_write",
        "deepspeed/runtime/zero/stage3.py _setup_for_real_optimizer (_create_fp32_partitions, initialize_optimizer_states, "
        "grad_partitions_flat_buffer) before ArcticTraining trainer/trainer.py Trainer.__init__'s UlyssesSPDataLoaderAdapter "
        "(iter(dl)) forks torch/utils/data/dataloader.py _MultiProcessingDataLoaderIter's workers; fork(2) copy-on-write",
        (rt.master_bytes + host_grads + rt.zero3_grad_partition_bytes) * stage_params / Z, true);
  }

  // NCCL's buffers (nccl_buffers above): cuMem allocations outside PyTorch's caching allocator
  if (rt.nccl_channels > 0)
    add("nccl_buffers",
        "NCCL 2.26.5 src/transport/p2p.cc p2pRecvSetup/p2pSendSetup (DEFAULT_BUFFSIZE + DEFAULT_LL_BUFFSIZE + DEFAULT_LL128_BUFFSIZE, "
        "ALIGN_SIZE CUDA_IPC_MIN) x ring channels per collective group and x p2pnChannelsPerPeer per all-to-all/neighbour peer "
        "(graph/paths.cc ncclTopoComputeP2pChannels); src/transport/nvls.cc ncclNvlsBufferSetup/ncclNvlsSetup where the GPU has NVLS",
        nccl_buffers(c, rt, p).total(), false);

  // PyTorch's CUDA caching allocator. Without expandable segments a large block is carved from a
  // segment rounded up to kRoundLarge (2 MiB) and keeps its remainder r when r <= kSmallSize
  // (1 MiB; larger remainders are split off and reused): with r uniform on [0, 2 MiB) the expected
  // waste per live large tensor is the integral of r over [0, 1 MiB] / 2 MiB = kRoundLarge / 8.
  // With expandable segments blocks are split down to 512 bytes and the segments grow in pages of
  // kLargeBuffer (20 MiB, large pool) and kSmallBuffer (2 MiB, small pool): the expected unfilled
  // part of the last page of each is half a page.
  if (rt.caching_allocator == RuntimeProfile::CachingAllocator::segments)
    add("caching_allocator_rounding",
        "c10/cuda/CUDACachingAllocator.cpp get_allocation_size (kRoundLarge) and should_split (kSmallSize): kRoundLarge / 8 expected per live large block",
        live_large_tensors * kCudaRoundLargeBytes / 8.0, false);
  else if (rt.caching_allocator == RuntimeProfile::CachingAllocator::expandable_segments)
    add("caching_allocator_rounding",
        "c10/cuda/CUDACachingAllocator.cpp ExpandableSegment (pages of kLargeBuffer / kSmallBuffer): half a page per pool expected",
        (kCudaLargeBufferBytes + kCudaSmallBufferBytes) / 2.0, false);

  // Megatron's distributed optimizer: the contiguous bf16 parameter buffer and fp32 gradient buffer
  // (the weights and main grads already counted) are padded per parameter and per bucket
  if (rt.megatron_buffer_padding && p.zero >= 1) {
    const double tensors = megatron_stage_param_tensors(m, stage);
    const int64_t dp_cp = std::max<int64_t>(1, p.dp) * p.cp;
    add("megatron_buffer_padding",
        "megatron/core/distributed/param_and_grad_buffer.py _ParamAndGradBuffer.__init__ (_pad_start_of_param_if_needed, _pad_end_of_bucket_if_needed), an upper bound",
        megatron_buffer_padding_elements(stage_params, tensors, dp_cp) * (rt.weight_bytes + rt.grad_bytes), false);
  }

  // Transformer Engine's userbuffers (tp_overlap): registered at start-up, outside the caching allocator
  add("te_userbuffers",
      "transformer_engine/pytorch/module/base.py initialize_ub (one buffer per overlapped GEMM, fp8 for the all-gathers under FP8) "
      "with megatron/training/initialize.py _initialize_tp_communicators' shape [seq x mbs / cp, hidden]; "
      "transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp CommOverlapBase/CommOverlapP2PBase::initialize",
      te_userbuffer_bytes(m, rt, p, local_tokens), false);
  return f;
}

}  // namespace ctx
