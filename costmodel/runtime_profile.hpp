// What a training stack adds on top of the model's own tensors: dtypes of the model states,
// which tensors it saves for backward, how it materialises logits, and fixed overheads.
// One profile per stack (profiles/runtimes/): ctxrun-cpu, ctxrun-cuda, hf-deepspeed (ALST), megatron.
// Every field in the JSON carries its source ({"value": ..., "source": "..."}).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "costmodel/plan.hpp"
#include "costmodel/runtime_capabilities.hpp"

namespace ctx {

// One measured step time against its prediction: ln(measured / predicted), where it ran.
struct TimeResidual {
  std::string id;         // the run or the validation point
  std::string gpu;        // hardware profile name of the run's cluster
  double log_ratio = 0;
  double measured_step_seconds = 0;  // the run's measured step where the record states it (calibration.runs), else 0
};

struct RuntimeProfile {
  std::string name;
  std::string description;
  // ---- model states, bytes per parameter
  double weight_bytes = 2;        // compute copy of the weights (bf16)
  double grad_bytes = 4;          // gradient accumulation buffer (fp32 main grads)
  // bytes per gradient element the data-parallel reduction (reduce-scatter / all-reduce) puts on the
  // wire: the stack's communication dtype, which need not be its accumulation dtype (DeepSpeed under
  // bf16 reduces bf16 gradients into fp32 partitions; Megatron and FSDP2 reduce fp32). Optional in a
  // profile: absent = grad_bytes. precision=fp32 plans make it 4, a plan's grads=... its dtype.
  double grad_comm_bytes = 4;
  double master_bytes = 4;        // fp32 master weights
  double optimizer_bytes = 8;     // Adam m and v in fp32
  bool grads_persistent = true;   // gradient buffer lives across steps (not freed after the step)
  bool offload_grads_with_optimizer = false;  // optimizer offload moves fp32 grads to host too
  // ---- saved activations (bf16 tensors per layer unless named otherwise)
  double activation_bytes = 2;    // activation dtype
  bool saves_norm_outputs = true; // norm outputs saved as matmul inputs (else recomputed)
  double mlp_saved_ffn_tensors = 4;   // [tokens, ffn] tensors the MLP keeps for backward
  // The stack replaces the MLP by a fused SwiGLU kernel whenever the plan tiles the loss and not the
  // MLP (ArcticTraining: the fused loss is Liger's, model.type liger, whose LigerSwiGLUMLP is switched
  // off only by tiled_mlp_compute): the [tokens, ffn] tensors that MLP saves, and those its backward
  // allocates beyond them (else 3: d(act), d(gate), d(up)). 0 or absent: no such MLP. Compiled code
  // keeps the compiled constants (runtime_for_compile).
  double tiled_loss_mlp_saved_ffn_tensors = 0;
  double tiled_loss_mlp_backward_ffn_tensors = 0;
  // the most elements the kernels that come with the tiled loss index in a [tokens, hidden] tensor
  // (32-bit offsets: Liger-Kernel's RMSNorm/RoPE before its int64 fix); 0 or absent: no limit
  double tiled_loss_max_tensor_elements = 0;
  bool ulysses_saves_both_layouts = true;  // attention output kept head- and sequence-sharded
  bool ulysses_backward_resends_inputs = false;  // the backward sends q, k, v, o to the head layout again
  // ---- logits and loss
  double logits_bytes = 2;        // dtype of the head's output
  double loss_fp32_copies = 2;    // fp32 [tokens, vocab] copies alive at the loss (untiled)
  double tiled_loss_fp32_copies = 2;  // fp32 [chunk, vocab] copies per tile
  // fp32 [tokens, vocab / tp] copies at the loss under tensor parallelism where the stack computes a
  // vocabulary-parallel loss of its own (PyTorch's loss_parallel); optional, absent (< 0): loss_fp32_copies
  double loss_parallel_fp32_copies = -1;
  // [tokens, vocab] tensors in the logits' dtype (activation_bytes) at the loss's high point, where > 0
  // in place of logits_bytes and loss_fp32_copies: a compiled loss (runtime_for_compile sets it)
  double loss_logit_copies = 0;
  // ---- torch.compile (plan key compile, capability "compile"): what the compiled code keeps; the
  // memory model applies them (runtime_for_compile), the time model does not. Optional, absent (< 0):
  // the runtime's eager constants hold under compile too.
  double compiled_mlp_saved_ffn_tensors = -1;  // compile=model|model+loss: [T, F] tensors a compiled MLP saves (with
  bool compiled_saves_norm_outputs = true;     //   compiled_saves_norm_outputs: whether the norm output is saved)
  double compiled_loss_logit_copies = -1;      // compile=model+loss: loss_logit_copies
  // FSDP2 allocates each unit's reduced (sharded) gradient on its reduce-scatter stream, whose caching-
  // allocator pool keeps those bytes reserved after the gradients are freed (zero_grad): the sharded
  // gradient counts in every phase (a device limit and torch.cuda.max_memory_reserved). Optional, absent = false
  bool grad_shards_reserved_by_reduce_stream = false;
  // FSDP2's root unit (torchtitan: tok_embeddings, norm, output) is never resharded after the forward
  // (FSDPState._lazy_init sets the root's post_forward_mesh_info to None) and, its forward input (token
  // ids) needing no gradient, reshards only in the backward's final callback: under ZeRO-3 the embedding
  // and the head are unsharded from the forward's start through the whole backward, with the head's
  // unreduced gradient from its backward on. Optional, absent = false (embedding/head gathered at the loss only)
  bool zero3_root_unit_unsharded = false;
  // ZeRO-3: the last layer is not resharded after its forward (it is the backward's first): its
  // gathered weights are alive at the loss. Optional, absent = false
  bool zero3_last_layer_kept_after_forward = false;
  // ---- transients and overheads
  double zero3_prefetch_layers = 2;   // gathered layers alive at once under ZeRO-3
  double ckpt_offload_device_layers = 2;  // offloaded checkpoints in flight on the device (forward)
  double ckpt_offload_prefetch_layers = 2;  // offloaded checkpoints back on the device ahead of their backward
  bool recompute_keeps_checkpoint = true;  // full recompute: layer i's checkpoint stays while it is rematerialised
  // full recompute: the rematerialised layer's output [tokens, hidden] stays referenced through the
  // layer's backward (reentrant torch.utils.checkpoint's CheckpointFunction.backward holds `outputs`
  // while it runs torch.autograd.backward on them). Optional, absent = false
  bool recompute_keeps_output = false;
  // K,V repeated to the query heads before an SDPA call (Hugging Face transformers 4.51
  // sdpa_attention_forward: repeat_kv), where the plan's attention kernel is sdpa: SDPA saves the
  // repeated K,V and its backward returns their gradients at the query heads, which repeat_kv's
  // backward sums. Optional, absent = false (the core saves K,V at the KV heads)
  bool sdpa_repeat_kv = false;
  double backward_grad_tensors = 3;   // [tokens, hidden] activation-gradient tensors in flight
  double attention_backward_extra_q_tensors = 0;  // [tokens, q heads x d] copies the attention backward adds
  // the attention_backward_extra_q_tensors only where the rank's query heads outnumber its KV heads
  // (flash_attn's expanded dK, dV under GQA). Optional, absent = false (always)
  bool attention_backward_extra_gqa_only = false;
  double ring_dkv_fp32_buffers = 2;  // fp32 [K;V]-shaped dK,dV buffers of a ring backward (send, receive, ...)
  bool allgather_dkv_full_sequence = true;  // all-gather CP: dK,dV accumulated over the gathered sequence (else the local shard's)
  bool allgather_dkv_fp32 = true;           // all-gather CP: those dK,dV accumulators are fp32 (else the activation dtype)
  // context parallelism exchanges and holds K,V (and dK,dV) expanded to the query heads: the stack
  // repeats the KV heads before the attention call its CP wraps (torchtitan's repeat_kv before SDPA).
  // Scales the CP ring / all-gather bytes and buffers by q heads / KV heads; optional, absent = false
  bool cp_kv_query_heads = false;
  // context parallelism is PyTorch's eager ring-attention loop: each ring step's output is merged into
  // an fp32 accumulator, and the backward accumulates fp32 gradients, by separate elementwise kernels on
  // the compute stream (costmodel/cp_eager_merge.hpp counts them); optional, absent = false
  bool cp_eager_merge_fp32 = false;
  // the all-gather CP exchange still runs the ring's step loop over the gathered chunks, one attention call
  // per chunk, causal only on the rank's own keys (PyTorch's _AllGatherRotater inside
  // _templated_ring_attention), not one causal call per query chunk against its key prefix (Transformer
  // Engine's all-gather CP); step_model.cpp prices those chunks on the no-mask curve; optional, absent = false
  bool cp_allgather_step_loop = false;
  // recompute=selective is torchtitan's per-op SAC: each block saves its matmul and SDPA outputs except
  // every second matmul, whose output (and every memory-bound op) the backward recomputes; the attention
  // core is not recomputed (step_model.cpp). Optional, absent = false (Megatron-style: the attention core)
  bool selective_recomputes_every_second_matmul = false;
  bool unit_grads_fp32 = false;  // ZeRO-2/3's transient full gradient of a unit is fp32 (else the weights' dtype)
  bool attention_merges_in_place = false;  // ring steps merge into the output accumulator and saved LSE (no per-step copies)
  bool varlen_lse_padded = true;  // native varlen ring: the kernel's LSE is padded to [documents, heads, longest] (flash-attn 2; optional key)
  double reduce_bucket_bytes = 0;     // gradient reduce/reduce-scatter bucket
  double reserved_bytes = 0;          // NCCL buffers, cuBLAS workspace, allocator slack (fixed)
  double fragmentation = 0;           // fraction added to activations and transients
  double host_bytes_per_rank = 0;     // host memory a rank's process takes besides offload
  // ---- framework memory (costmodel/framework_memory.hpp): terms read from the stack's source, each
  // off by default (ctxrun's profiles: its ledger measures every allocation itself)
  // DeepSpeed ZeRO-3: bytes per parameter (over the ZeRO shards) of the flat gradient partition the
  // reduce-scatter lands in (the model dtype unless grad_accum_dtype is set). On the host under
  // optimizer offload, besides the optimizer's fp32 gradients (grad_bytes); on the device without
  // offload, where it is the persistent gradient and the fp32 one exists per optimizer sub-group
  // during the step only (framework_memory.hpp kDeepSpeedSubGroupElements). 0: not DeepSpeed ZeRO-3.
  double zero3_grad_partition_bytes = 0;
  // DeepSpeed ZeRO-3 parameter offload: the host copy of the weight partition is one pinned flat
  // buffer, which PyTorch's pinned-memory allocator rounds up to a power of two
  bool zero3_param_offload_pinned_pow2 = false;
  // DeepSpeed ZeRO-3 optimizer offload under a training loop whose data loader forks its worker
  // processes after deepspeed.initialize has allocated and filled the host buffers (fp32 master
  // partition, fp32 and bf16 gradient partitions) and whose rank writes them every step: copy-on-write
  // leaves the workers the pre-fork pages, so the node holds those buffers twice while a worker lives
  bool dataloader_forks_after_offload_buffers = false;
  double nccl_channels = 0;           // NCCL ring channels per communicator (0: no NCCL buffers)
  // the training loop also runs a collective on the Ulysses (all-to-all) group, so NCCL connects that
  // communicator's ring too (ArcticTraining's SFTTrainer.loss all-gathers the per-rank loss over sp_group)
  bool ulysses_group_collectives = false;
  // the training loop runs a collective on the default (world) process group besides the groups the
  // plan names, so NCCL connects that communicator's ring too (ArcticTraining's Metrics.print_summary
  // all_gather_object every iteration; DeepSpeed's data-parallel group is a clone of the world group)
  bool world_group_collectives = false;
  enum class CachingAllocator { none, segments, expandable_segments };
  CachingAllocator caching_allocator = CachingAllocator::none;  // PyTorch's CUDA caching allocator mode
  bool megatron_buffer_padding = false;  // Megatron's contiguous param/grad buffers with the distributed optimizer
  // ---- a micro-batch's token data on the device (never an s x s mask)
  double token_data_bytes = 0;        // per local token: ids, labels, positions
  double query_identity_bytes = 0;    // per attention query: what the mask needs of it (index, document)
  double key_block_bytes = 0;         // per key of each key block attention visits (identity, loop bounds)
  // ---- Transformer Engine userbuffers (plan key tp_overlap; tp_overlap.hpp): the configuration the
  // stack runs, in initialize_ub's names. RS after proj/fc2 in the forward: "pipeline" in
  // tp_overlap_rs_splits chunks, each chunk's reduce-scatter on proj/fc2_fprop_sms SMs and the GEMM on the
  // rest (set_sm_margin); 0 splits = "ring_exchange" (copy engines, 1 SM). The AGs before QKV/FC1 and
  // of d(out) are ring exchanges. Backward "bulk" overlaps: the collective on *_sms SMs beside the GEMM.
  double tp_overlap_rs_splits = 0;
  double tp_overlap_proj_fprop_sms = 0, tp_overlap_fc2_fprop_sms = 0;
  double tp_overlap_qkv_dgrad_sms = 0, tp_overlap_qkv_wgrad_sms = 0, tp_overlap_fc1_dgrad_sms = 0, tp_overlap_fc1_wgrad_sms = 0;
  // ---- time
  // which of the hardware profile's attention curves it runs by default ("a|b": the first with a
  // curve), the kernels it can run at all (--attention), and the input that chose the kernel in force
  std::string attention_kernel = "fa2";
  std::vector<std::string> attention_kernels;
  std::string attention_where, attention_field;
  double cpu_adam_params_per_second = 1e9;  // host AdamW rate per node (optimizer offload)
  // host fp32 -> bf16 copy_ rate per node, elements/s: DeepSpeed ZeRO-3's step() writes the updated
  // fp32 partition into the host bf16 one under offload_param; 0 (absent): not priced
  double host_fp32_to_bf16_elems_per_second = 0;
  // optimizer offload runs the update on the device over the offloaded states in pinned host
  // memory (read and written over PCIe), not on the host
  bool optimizer_offload_on_device = false;
  double memory_traffic_factor = 1;   // bytes memory-bound ops move relative to fused kernels (eager stacks > 1)
  // ---- calibration (ctxplan calibrate, docs/CALIBRATION.md): scales on the hardware profile's
  // curves fitted to measured runs; 1 and 0 (the defaults) leave every prediction as the curves say
  double gemm_efficiency_scale = 1;       // x the GEMM efficiency curve
  double attention_efficiency_scale = 1;  // x the attention kernel's efficiency curve
  double comm_efficiency_scale = 1;       // x the NVLink and network bandwidth of every collective and p2p hop
  double step_overhead_seconds = 0;       // added once per step (data loading, logging, host gaps)
  // the overhead was fitted only on runs that offload the optimizer (its host gaps): plans that keep
  // the optimizer on the device get none of it
  bool step_overhead_optimizer_offload_only = false;
  // measured vs predicted step times this profile was checked against: a calibrated profile's own
  // (leave-one-out), or the published points `ctxplan validate` predicts for a built-in one
  std::vector<TimeResidual> time_residuals;
  std::map<std::string, std::string> sources;  // field -> where the value comes from
  // what the stack can run (runtime_capabilities.hpp); undeclared: every plan
  RuntimeCapabilities capabilities;
};

// The profile as a plan of this precision runs on it. A profile states its stack's bf16 sizes; a
// precision=fp32 plan stores weights, activations and logits (and so sends communication) in 4 bytes
// (IEEE float32) instead, and reduces its gradients in fp32 (grad_comm_bytes 4: every stack's
// communication dtype follows the model dtype when it is not fp32 already). Gradients, master weights
// and optimizer states stay as the profile says (already fp32 in every profile). bf16 and fp8 plans get
// the profile unchanged (fp8 GEMMs keep bf16 storage).
RuntimeProfile runtime_for_precision(const RuntimeProfile& rt, Precision precision);
// True when runtime_for_precision(rt, precision) differs from rt; lets the hot path skip the copy.
bool precision_changes_runtime(const RuntimeProfile& rt, Precision precision);

// The optimizer-precision values the profile's model-state sizes stand for (Plan's master, grads,
// moments when unset): master_bytes 0 = none, else fp32 (torchtitan counts 2, the fp32 shard beyond
// the bf16 weights); grad_bytes 2 or less = bf16, else fp32; optimizer_bytes 8 or more = fp32,
// 4 or more = bf16, less = 8bit.
struct StateDtypes {
  StateDtype master = StateDtype::fp32, grads = StateDtype::fp32, moments = StateDtype::fp32;
};
StateDtypes runtime_state_dtypes(const RuntimeProfile& rt);

// The profile as the plan runs on it: runtime_for_precision, then each of master, grads, moments
// that the plan sets to a value other than the runtime's own replaces master_bytes, grad_bytes,
// optimizer_bytes (master fp32 4, none 0; grads fp32 4, bf16 2, and grad_comm_bytes with it: a plan's
// gradient dtype is what it accumulates and reduces; moments fp32 8, bf16 4, 8bit
// 2 + 2 x 4 / 256 = 2.03125: one int8 per element of m and of v plus an fp32 scale per 256-element
// block, torchao AdamW8bit's default block). The one place the cost model resolves a plan's dtypes.
RuntimeProfile runtime_for_plan(const RuntimeProfile& rt, const Plan& p);
// True when runtime_for_plan(rt, p) differs from rt; lets the hot path skip the copy.
bool plan_changes_runtime(const RuntimeProfile& rt, const Plan& p);
// The runtime as the plan's torch.compile (Plan::compile) leaves what its code saves: compile=model
// (and model+loss) sets mlp_saved_ffn_tensors and saves_norm_outputs from compiled_mlp_saved_ffn_tensors
// and compiled_saves_norm_outputs, model+loss sets loss_logit_copies from compiled_loss_logit_copies;
// absent constants leave the eager ones. For the memory model only (the time model prices eager
// kernels). compile_changes_runtime: whether that differs from rt (idempotent: false on its result).
RuntimeProfile runtime_for_compile(const RuntimeProfile& rt, const Plan& p);
bool compile_changes_runtime(const RuntimeProfile& rt, const Plan& p);

// The runtime profile (profiles/runtimes/) that describes a ctxrun backend: "ctxrun-cuda" for the
// CUDA backend and its emulation (cuda, cuda-emulated), "ctxrun-cpu" for the CPU backends (cpu, cpu-*).
std::string ctxrun_runtime_for_backend(const std::string& backend);

}  // namespace ctx
