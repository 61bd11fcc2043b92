// The memory model. Every term names the tensor it counts; dtypes and "which tensors a stack
// keeps" come from the runtime profile, shapes from the plan (local_shapes). Notation below:
// T = tokens per rank, Tsp = T under sequence parallel, Ta = attention tokens, h = hidden,
// d = head_dim, a = activation bytes, F = ffn/tp, V = vocab/tp.
#include "costmodel/memory_model.hpp"

#include "costmodel/attention_work.hpp"

#include "costmodel/pipeline_stages.hpp"
#include "costmodel/plan_check.hpp"

#include <algorithm>
#include <cmath>

namespace ctx {

const char* to_string(Mem m) {
  static const char* names[] = {"weights",     "grads",     "master_weights", "optimizer", "activations", "checkpoints",
                                "workspace",   "comm_buffers", "logits",      "mask",      "runtime"};
  return names[static_cast<int>(m)];
}
const char* to_string(HostMem m) {
  static const char* names[] = {"optimizer", "master_weights", "grads", "weights", "checkpoints", "runtime"};
  return names[static_cast<int>(m)];
}
const char* to_string(Phase p) {
  static const char* names[] = {"forward", "loss", "backward", "optimizer"};
  return names[static_cast<int>(p)];
}

double MemorySnapshot::total() const {
  double t = 0;
  for (double b : bytes) t += b;
  return t;
}

LocalShapes local_shapes(const ModelSpec& m, const Plan& p, int64_t seq) {
  LocalShapes s;
  const double b = static_cast<double>(p.mbs), tp = static_cast<double>(p.tp), cp = static_cast<double>(p.cp);
  const double u = static_cast<double>(ulysses_degree(p)), r = static_cast<double>(ring_degree(p));
  s.tokens = b * static_cast<double>(seq) / cp;
  s.tokens_sp = sp_enabled(p) ? s.tokens / tp : s.tokens;
  s.attn_tokens = u > 1 ? b * static_cast<double>(seq) / r : s.tokens;   // Ulysses gathers the sequence
  s.q_heads = static_cast<double>(m.heads) / (tp * u);
  // KV heads per TP rank; beyond the KV-head count a head is replicated (one per rank)
  double kv_tp = m.kv_heads >= p.tp ? static_cast<double>(m.kv_heads) / tp : 1.0;
  s.kv_heads_tp = kv_tp;
  s.kv_heads = u > kv_tp ? 1.0 : kv_tp / u;
  s.ffn = static_cast<double>(m.ffn) / tp;
  s.vocab = std::ceil(static_cast<double>(m.vocab) / tp);   // vocab-parallel embedding and head
  const double h = static_cast<double>(m.hidden), d = static_cast<double>(m.head_dim);
  const double qd = static_cast<double>(q_dim(m));
  double attn = h * qd / tp            // Wq column-parallel
                + 2.0 * h * d * kv_tp  // Wk, Wv: kv_tp heads each
                + qd * h / tp;         // Wo row-parallel
  if (m.qkv_bias) attn += qd / tp + 2.0 * d * kv_tp;
  if (m.qk_norm) attn += 2.0 * d;
  s.layer_params = attn + static_cast<double>(mlp_params_per_layer(m)) / tp + static_cast<double>(norm_params_per_layer(m));
  s.params = static_cast<double>(m.layers) * s.layer_params + s.vocab * h /* embedding */ +
             (m.tied_embeddings ? 0.0 : s.vocab * h) /* head */ + h /* final norm */;
  s.zero_degree = static_cast<double>(zero_shard_degree(p));  // dp*cp, or HSDP's zero_shard
  return s;
}

double mlp_chunks(const ModelSpec& m, const Plan& p, const LocalShapes& s) {
  if (p.tiled_mlp < 0) return std::ceil(s.tokens / static_cast<double>(m.hidden));  // auto: ALST's ceil(seq/hidden)
  return p.tiled_mlp > 1 ? static_cast<double>(p.tiled_mlp) : 1.0;
}

double loss_tile_rows(int64_t tiled_loss, double tokens, double vocab) {
  if (tiled_loss > 0) return std::min(static_cast<double>(tiled_loss), tokens);
  if (tiled_loss == 0) return tokens;
  constexpr double kAlstTileBytes = 1024.0 * 1024.0 * 1024.0;  // ArcticTraining: slice_size_in_gb = 1 (2^30 bytes)
  const double shards = std::max(1.0, std::ceil(tokens * vocab * 4.0 / kAlstTileBytes));  // fp32 logits
  return std::ceil(tokens / shards);
}

double loss_tile_tokens(const Plan& p, const LocalShapes& s) { return loss_tile_rows(p.tiled_loss, s.tokens, s.vocab); }

double ring_kv_bytes_per_step(const ModelSpec& m, const LocalShapes& s, double elem_bytes) {
  return 2.0 * s.attn_tokens * s.kv_heads * static_cast<double>(m.head_dim) * elem_bytes;  // K and V blocks
}

double cp_kv_expansion(const RuntimeProfile& rt, const LocalShapes& s) {
  return rt.cp_kv_query_heads && s.q_heads > s.kv_heads ? s.q_heads / s.kv_heads : 1.0;
}

LossWorkingSet loss_working_set(const ModelSpec& m, const RuntimeProfile& rt, const Plan& p, const LocalShapes& s) {
  if (plan_changes_runtime(rt, p)) return loss_working_set(m, runtime_for_plan(rt, p), p, s);
  if (compile_changes_runtime(rt, p)) return loss_working_set(m, runtime_for_compile(rt, p), p, s);
  // rows = tokens after the SP gather; columns = this rank's vocabulary shard
  LossWorkingSet w;
  const double fp32 = 4.0;
  double rows = s.tokens;
  double copies = rt.loss_fp32_copies;
  if (p.tp > 1 && rt.loss_parallel_fp32_copies >= 0) copies = rt.loss_parallel_fp32_copies;  // vocabulary-parallel loss
  if (p.tiled_loss != 0) {
    rows = loss_tile_tokens(p, s);                                             // one tile at a time
    copies = rt.tiled_loss_fp32_copies;
  }
  // d(final hidden) [T, h]: produced from the logits' gradient while it is alive (tile by tile when tiled)
  w.hidden_grad_bytes = s.tokens * static_cast<double>(m.hidden) * rt.activation_bytes;
  w.logits_bytes = rows * s.vocab * rt.logits_bytes;
  w.fp32_bytes = rows * s.vocab * copies * fp32;
  if (rt.loss_logit_copies > 0) {
    // a compiled loss (runtime_for_compile): [tokens, vocab] tensors in the logits' dtype only (the
    // logits its graph saves, the gradient its fused backward writes), no fp32 copy
    w.logits_bytes = rows * s.vocab * rt.loss_logit_copies * rt.activation_bytes;
    w.fp32_bytes = 0;
  }
  return w;
}

MemoryPrediction predict_stage_memory(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt, const Plan& p,
                                      int64_t seq, const PipelineStage& stage) {
  // the plan's dtypes: precision=fp32 stores weights, activations and logits in 4 bytes; master,
  // grads and moments set the model states' bytes per parameter (runtime_profile.hpp runtime_for_plan)
  if (plan_changes_runtime(rt, p))
    return predict_stage_memory(m, c, runtime_for_plan(rt, p), p, seq, stage);
  // torch.compile: what the compiled blocks and loss save (runtime_profile.hpp runtime_for_compile)
  if (compile_changes_runtime(rt, p)) return predict_stage_memory(m, c, runtime_for_compile(rt, p), p, seq, stage);
  if (p.pad) seq = padded_seq(p, seq);  // pad=1: the pad tokens are stored like real ones (plan_check.hpp)
  const LocalShapes S = local_shapes(m, p, seq);
  const double a = rt.activation_bytes;
  const double h = static_cast<double>(m.hidden), d = static_cast<double>(m.head_dim);
  // The layers one micro-batch runs through on this rank (a model chunk under pipeline
  // parallelism; all the layers without), and the layers' saved tensors of the other micro-batches
  // (chunks) the pipeline schedule keeps in flight (pipeline_stages.hpp: 1F1B keeps up to pp on
  // the first stage). pp = 1: L and 0.
  const double L = static_cast<double>(stage.chunk_layers);
  const double others = static_cast<double>(std::max<int64_t>(0, stage.in_flight_layers - stage.chunk_layers));
  const double Z = S.zero_degree;
  const double u = static_cast<double>(ulysses_degree(p)), r = static_cast<double>(ring_degree(p));
  const double fp32 = 4.0;

  // ---- model states (bytes per parameter from the runtime profile; ZeRO shards over dp*cp)
  const double P = pipeline_stage_params(m, stage, S.layer_params, S.vocab);  // S.params when pp = 1
  const double w_dev = p.param_offload ? 0.0 : rt.weight_bytes * P / (p.zero == 3 ? Z : 1.0);
  const bool grads_on_host = p.opt_offload && rt.offload_grads_with_optimizer;
  // DeepSpeed ZeRO-3 keeps the gradient partition in its flat buffer's dtype (zero3_grad_partition_bytes;
  // stage3.py _setup_for_real_optimizer); the fp32 gradient exists per sub-group in the step only
  const double grad_bytes_kept = p.zero == 3 && rt.zero3_grad_partition_bytes > 0 ? rt.zero3_grad_partition_bytes : rt.grad_bytes;
  const double g_full = grads_on_host ? 0.0 : grad_bytes_kept * P / (p.zero >= 2 ? Z : 1.0);
  const double opt_shard = p.zero >= 1 ? Z : 1.0;
  const double m_dev = p.opt_offload ? 0.0 : rt.master_bytes * P / opt_shard;
  const double o_dev = p.opt_offload ? 0.0 : rt.optimizer_bytes * P / opt_shard;

  // ---- one layer's tensors (recompute none)
  const double x_in = S.tokens_sp * h * a;                    // layer input / residual [Tsp, h]
  const double rstd = S.tokens_sp * fp32;                     // RMSNorm 1/rms per token, fp32
  const double norm_out = rt.saves_norm_outputs ? x_in : 0.0; // norm output kept as the next matmul's input
  const double q = S.attn_tokens * S.q_heads * d * a;         // q after RoPE [Ta, q_heads*d]
  const double kv = 2.0 * S.attn_tokens * S.kv_heads * d * a; // k and v in the attention core's layout [Ta, kv_heads*d]
  // k and v as the projections produce and the layer saves them: [T, kv heads per TP rank]; equal to
  // kv except under Ulysses with replicated KV heads (degree above the KV heads), where the core's
  // head layout holds the sequence's copy of one head
  const double kv_seq = u > 1 ? 2.0 * S.tokens * S.kv_heads_tp * d * a : kv;
  // K,V as the attention core saves them: kv_seq, except where the runtime repeats them to the query
  // heads before an SDPA call (sdpa_repeat_kv; Hugging Face transformers 4.51
  // integrations/sdpa_attention.py sdpa_attention_forward calls repeat_kv(key/value,
  // module.num_key_value_groups) unconditionally, the code transformers PR #39412 replaced in July
  // 2025): torch's SDPA saves its inputs, two [Ta, q heads x d] tensors
  // (the kernel is attention_kernel's first name; compared in place: this function allocates nothing)
  const bool sdpa_kernel = rt.attention_kernel.compare(0, rt.attention_kernel.find('|'), "sdpa") == 0;
  const bool kv_repeated = rt.sdpa_repeat_kv && sdpa_kernel && S.q_heads > S.kv_heads;
  const double kv_saved = kv_repeated ? 2.0 * q : kv_seq;
  const double o = q;                                          // attention output, same shape as q
  const double lse = S.attn_tokens * S.q_heads * fp32;        // log-sum-exp per query and head, fp32
  const double o_seq = (u > 1 && rt.ulysses_saves_both_layouts)
                           ? S.tokens * (static_cast<double>(m.heads) / p.tp) * d * a  // o_proj input, seq layout
                           : 0.0;
  const double qk_pre = m.qk_norm ? S.attn_tokens * (S.q_heads + S.kv_heads) * d * a : 0.0;  // q,k before qk-norm
  const double ffn_t = S.tokens * S.ffn * a;                  // one [T, F] tensor
  const double chunks = mlp_chunks(m, p, S);
  const bool tiled_mlp = chunks > 1;
  // a fused SwiGLU MLP that comes with the stack's tiled loss (tiled_loss_mlp_*: ArcticTraining's Liger
  // model, whose LigerSwiGLUMLP only TiledMLP switches off): it saves gate and up (LigerSiLUMulFunction
  // save_for_backward) and the product (down_proj's input), and its backward adds d(product) only
  // (swiglu_backward writes d(gate), d(up) into the saved gate and up; Liger-Kernel ops/swiglu.py)
  const bool fused_mlp = rt.tiled_loss_mlp_saved_ffn_tensors > 0 && p.tiled_loss != 0 && !tiled_mlp &&
                         m.activation == ActivationKind::swiglu;
  const double mlp_tensors = fused_mlp ? rt.tiled_loss_mlp_saved_ffn_tensors
                                       : rt.mlp_saved_ffn_tensors * (m.activation == ActivationKind::swiglu ? 1.0 : 0.5);
  const double mlp_saved = tiled_mlp ? 0.0 : mlp_tensors * ffn_t;  // TiledMLP saves only its input

  const double attn_side = x_in + rstd + norm_out + q + kv_saved + o + lse + o_seq + qk_pre;
  const double mlp_side = x_in + rstd + norm_out + mlp_saved;
  const double layer_none = attn_side + mlp_side;

  // torchtitan's per-op selective checkpointing (selective_recomputes_every_second_matmul): a block keeps
  // its input (the checkpoint's argument) and the outputs of the ops of the policy's _save_list (aten.mm,
  // SDPA, reduce_scatter_tensor, aten.max) except every second aten.mm (torchtitan/models/llama3/infra/
  // parallelize.py _apply_ac_to_transformer_block at 000204a4; parallelisms/parallelize_llama.py at
  // 9dec370). The block's mms in forward order (model.py Attention.forward, FeedForward.forward) are
  // wq, wk, wv, wo, w1, w3, w2 (SwiGLU) or ..., fc1, fc2: kept are wq's output (q before RoPE), wv's (v),
  // w1's [T, F] and, with SwiGLU, w2's [T, h] (before its TP reduce-scatter); SDPA's output and LSE; under
  // TP the reduce-scatter outputs of wo and w2 ([Tsp, h] each). torch.compile keeps the same set: the
  // AOT partitioner saves the MUST_SAVE nodes and recomputes the PREFER_RECOMPUTE ones
  // (torch/_functorch/partitioners.py must_recompute). Not modelled: per-ring-step SDPA outputs under CP.
  const bool op_sac = p.recompute == Recompute::selective && rt.selective_recomputes_every_second_matmul;
  const bool swiglu = m.activation == ActivationKind::swiglu;
  const double op_sac_saved = x_in + q + kv_seq / 2.0 + o + lse + (tiled_mlp ? 0.0 : ffn_t) +
                              (swiglu ? S.tokens * h * a : 0.0) + (p.tp > 1 ? 2.0 * x_in : 0.0);
  double saved_per_layer = 0, recomputed = 0;
  switch (p.recompute) {
    case Recompute::none:
      saved_per_layer = layer_none;
      break;
    case Recompute::selective:
      if (op_sac) {
        saved_per_layer = op_sac_saved;
      } else {
        // keep matmul outputs and norm inputs; recompute norms, the attention core and the activation
        saved_per_layer = 2 * x_in + 2 * rstd + q + kv_seq + qk_pre +
                          (tiled_mlp ? 0.0 : (m.activation == ActivationKind::swiglu ? 2.0 : 1.0) * ffn_t);
      }
      recomputed = layer_none - saved_per_layer;
      break;
    case Recompute::full:
      saved_per_layer = x_in;  // the layer input is the checkpoint
      recomputed = layer_none;
      break;
  }
  const bool full = p.recompute == Recompute::full;

  // ---- attention transients
  const bool fp32_acts = a >= fp32;                       // fp32 activations: accumulators are the outputs
  const double q_fp32 = fp32_acts ? 0.0 : q / a * fp32;   // a separate fp32 accumulator of q's shape
  // K,V as the runtime's context parallelism exchanges them: the query heads' where it expands them
  // before its attention call (cp_kv_query_heads: torchtitan's repeat_kv), else the KV heads'
  const double cp_x = cp_kv_expansion(rt, S);
  const double kv_cp = kv * cp_x;
  const double kv_full = 2.0 * static_cast<double>(p.mbs) * static_cast<double>(seq) * S.kv_heads * d * a * cp_x;
  double fwd_comm = 0, bwd_attn_comm = 0, bwd_mlp_comm = 0, fwd_ws = 0;
  if (p.cp_comm == CpComm::allgather && p.cp > 1) {
    fwd_comm = kv_full;                                   // all-gathered K,V of the whole sequence
    fwd_ws += q_fp32;                                     // fp32 output accumulator: cp blocks merge into it
    // the backward gathers K,V again and accumulates dK,dV, as each implementation holds them:
    //   Transformer Engine (AttnFuncWithCPAndKVAllGather.backward, context_parallel.py): dk, dv zeros of
    //     the gathered [cp*s] shape in the forward's dtype, then reduce_scatter_along_first_dim
    //   ctxrun (executor/context_parallel.cpp, core_backward): gathered-shape fp32 dK,dV, reduce-scattered
    //   PyTorch context_parallel (_templated_ring_attention_backward, _attention.py): dK,dV of the local
    //     shard's shape in fp32 (convert_to_f32, default) or the input dtype, passed around the ring by
    //     the all-to-all rotater: the accumulators, the concatenated send buffer and the received one
    const double dkv_bytes = rt.allgather_dkv_fp32 ? fp32 : a;
    const double dkv = rt.allgather_dkv_full_sequence ? kv_full / a * dkv_bytes : 3.0 * kv_cp / a * dkv_bytes;
    bwd_attn_comm = kv_full + dkv;
  } else if (r > 1) {
    fwd_comm = 2.0 * kv_cp;                               // double-buffered K,V receive for the ring
    bwd_attn_comm = 2.0 * kv_cp + rt.ring_dkv_fp32_buffers * kv_cp / a * fp32;  // K,V receive + travelling fp32 dK,dV
    // fp32 output accumulator and (unless the kernel merges each block into it and the saved LSE in
    // place) a running LSE for the merge
    fwd_ws += q_fp32 + (fp32_acts || rt.attention_merges_in_place ? 0.0 : lse);
  }
  // native varlen ring: the padded fp32 LSE of the step and of the running merge (attention_work.hpp,
  // varlen_padded_lse_rows: why it grows when document lengths differ widely), where the runtime's
  // kernel pads it (varlen_lse_padded: flash-attn 2's varlen LSE; ctxrun's is [query rows, heads])
  const double varlen_lse = rt.varlen_lse_padded
                                ? 2.0 * varlen_padded_lse_rows(p, seq) * static_cast<double>(p.mbs) * S.q_heads * fp32
                                : 0.0;
  fwd_ws += varlen_lse;
  if (u > 1) {
    fwd_comm += q + kv + o;                               // all-to-all staging of q,k,v in and of the output back
    bwd_attn_comm += q + kv + o;                          // the same for dq,dk,dv and d(out)
  }
  const bool sp = sp_enabled(p) && p.tp > 1;
  const double sp_gather = sp ? S.tokens * h * a : 0.0;  // an all-gathered [T, h] under SP
  if (sp) {
    fwd_comm += sp_gather;                                // all-gathered norm output feeding the column-parallel GEMM
    bwd_mlp_comm += 2.0 * sp_gather;                      // all-gathered d(out) of the row-parallel GEMM, and the
                                                          // re-gathered norm output for the weight gradient
  }
  // The attention backward's working set: d(out) [Ta, q], dq, dk, dv, the softmax delta (one fp32
  // per query and head, like lse), an fp32 dq accumulator (bf16 runtimes) and, under Ulysses, the
  // head-layout dq, dk, dv before the all-to-all back; plus what the runtime's kernel adds (e.g.
  // flash-attn 2 expanding dK, dV to the query heads under GQA). With K,V repeated for SDPA
  // (kv_repeated) SDPA's own dK, dV are at the query heads (2 q) and repeat_kv's backward sums them
  // into the KV heads' (kv_seq); SDPA's flash backward copies neither d(out) nor the output here (torch
  // aten/src/ATen/native/transformers/cuda/attention_backward.cu _flash_attention_backward calls
  // .contiguous() on them, a no-op on the transposed views of contiguous tensors it receives from
  // transformers' sdpa_attention_forward), so the kernel's extras are those 2.
  // attention_backward_extra_gqa_only: the runtime's extras are GQA expansions, absent where the rank
  // keeps as many KV heads as query heads (flash_attn 2.7.4 flash_api.cpp mha_varlen_bwd dk_expanded)
  const double kernel_extra_q = rt.attention_backward_extra_gqa_only && !(S.q_heads > S.kv_heads)
                                    ? 0.0 : rt.attention_backward_extra_q_tensors;
  const double bwd_extra_q = kv_repeated ? 2.0 : kernel_extra_q;
  const double bwd_attn_ws = o + q + kv_seq + lse + q_fp32 + (u > 1 ? q + kv : 0.0) + bwd_extra_q * q + varlen_lse;

  // ---- MLP transients
  double fwd_mlp = 0;
  if (tiled_mlp) fwd_mlp = mlp_tensors * ffn_t / chunks;                 // one chunk's intermediates
  else if (full) fwd_mlp = 0;                                                // counted in the layer's own tensors
  else if (op_sac) fwd_mlp = (mlp_tensors - 1.0) * ffn_t;                   // all but w1's output: recomputed later
  else if (p.recompute == Recompute::selective) fwd_mlp = (mlp_tensors - 2.0) * ffn_t;  // act, product: recomputed later
  // d(act), d(gate), d(up); a tiled chunk also recomputes its own tensors, of which the product is
  // consumed by the down projection's weight gradient before d(gate), d(up) exist
  const double bwd_mlp = tiled_mlp   ? (mlp_tensors + 2.0) * ffn_t / chunks
                         : fused_mlp ? rt.tiled_loss_mlp_backward_ffn_tensors * ffn_t
                                     : 3.0 * ffn_t;
  // Activation gradients in flight at the MLP backward: backward_grad_tensors [tokens, hidden]
  // tensors, of which the row-parallel input gradient is [T, h] before its TP reduce, and under SP
  // a recomputed norm output lives gathered among the communication buffers instead.
  const double dy = S.tokens_sp * h * a;                 // the residual stream's gradient
  const double grad_tensors = (rt.backward_grad_tensors - 1.0) * dy + S.tokens * h * a -
                              (sp && !rt.saves_norm_outputs ? dy : 0.0);

  // ---- parameter transients
  const double zero3_gather = p.zero == 3 ? rt.zero3_prefetch_layers * S.layer_params * rt.weight_bytes : 0.0;
  // the forward's high point is its last layer: no next layer to prefetch (the head is gathered at the loss)
  const double zero3_gather_last = p.zero == 3 ? std::min(rt.zero3_prefetch_layers, 1.0) * S.layer_params * rt.weight_bytes : 0.0;
  const double head_gather = p.zero == 3 ? S.vocab * h * rt.weight_bytes : 0.0;  // embedding/head gathered at the ends
  // ZeRO-2/3: a unit's full gradient lives until its reduce-scatter, in the weights' dtype or, where
  // the runtime accumulates weight gradients in fp32 buffers, in fp32
  const double unit_grad_bytes = rt.unit_grads_fp32 ? fp32 : rt.weight_bytes;
  const double grad_reduce = p.zero >= 2 ? S.layer_params * unit_grad_bytes : 0.0;
  // FSDP2's root unit (zero3_root_unit_unsharded): the embedding (first stage) and the head (last stage)
  // unsharded from the forward's start to the backward's end, the head's gradient through the backward
  const bool root_unsharded = p.zero == 3 && rt.zero3_root_unit_unsharded;
  const double root_embedding = root_unsharded && stage.first && !(m.tied_embeddings && stage.last) ? S.vocab * h * rt.weight_bytes : 0.0;
  const double root_head = root_unsharded && stage.last ? S.vocab * h * rt.weight_bytes : 0.0;
  const double root_fwd = root_embedding + root_head;
  // + the head's gradient, in the unsharded parameter's dtype (autograd's; reduced to fp32 only at the end)
  const double root_bwd = root_fwd + (root_head > 0 ? S.vocab * h * rt.weight_bytes : 0.0);
  // the last layer's weights, not resharded after its forward, at the loss
  const double last_layer_kept = p.zero == 3 && rt.zero3_last_layer_kept_after_forward ? S.layer_params * rt.weight_bytes : 0.0;

  // ---- an explicit mask: [attention query rows, seq] for the whole step; otherwise the micro-batch's
  // token data: ids/labels/positions per local token, the queries' identities, and per key block
  // (each ring step's block, or each CP rank's under all-gather) its keys' identities and bounds
  const double key_blocks = p.cp_comm == CpComm::allgather ? static_cast<double>(p.cp) : static_cast<double>(ring_degree(p));
  const double token_data = S.tokens * rt.token_data_bytes +
                            S.attn_tokens * (rt.query_identity_bytes + key_blocks * rt.key_block_bytes);
  const double mask = p.mask == MaskKind::explicit_mask ? S.attn_tokens * static_cast<double>(seq) * a : token_data;

  const double frag = 1.0 + rt.fragmentation;  // allocator slack on dynamically allocated tensors
  // ---- the stack's own buffers (framework_memory.hpp): NCCL, the caching allocator's rounding of
  // the saved [T, *] tensors (per layer: without recompute x, norm output, q, k, v, o, lse and the
  // MLP's input norm output and saved [T, F] tensors; selective: two layer inputs, q, k, v and the
  // MLP's kept [T, F]; full: the checkpoint), Megatron's buffer padding, DeepSpeed's host buffers
  const double saved_tensors_per_layer =
      p.recompute == Recompute::full ? 1.0
      : op_sac ? 5.0 + (tiled_mlp ? 0.0 : 1.0) + (swiglu ? 1.0 : 0.0) + (p.tp > 1 ? 2.0 : 0.0)
      : p.recompute == Recompute::selective ? 5.0 + (tiled_mlp ? 0.0 : (m.activation == ActivationKind::swiglu ? 2.0 : 1.0))
                                            : 9.0 + (tiled_mlp ? 0.0 : mlp_tensors);
  const double layers_on_device = full && p.ckpt_offload ? std::min(L + others, rt.ckpt_offload_device_layers) : L + others;
  const FrameworkMemory fw = framework_memory(m, c, rt, p, stage, P, layers_on_device * saved_tensors_per_layer, S.tokens);
  // the gradient reduction bucket is allocated once with the optimizer and kept (DeepSpeed ZeRO-3's
  // flat IPG buffer, stage3.py __init__ .. destroy; reduce_bucket_mib): in every phase
  const double runtime_device_bytes = rt.reserved_bytes + fw.device_bytes() + rt.reduce_bucket_bytes;
  auto base = [&](double grads_bytes) {
    MemorySnapshot s;
    s[Mem::weights] = w_dev;
    s[Mem::grads] = grads_bytes;
    s[Mem::master_weights] = m_dev;
    s[Mem::optimizer] = o_dev;
    s[Mem::mask] = mask * frag;
    s[Mem::runtime] = runtime_device_bytes;
    return s;
  };
  // the sharded gradient's bytes in every phase: a persistent buffer, accumulation over micro-batches,
  // or (grad_shards_reserved_by_reduce_stream) FSDP2's reduce-scatter stream holding them reserved:
  // foreach_reduce (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py) allocates each unit's
  // reduce-scatter output, which becomes the sharded .grad, under reduce_scatter_stream, and the CUDA
  // caching allocator reuses a freed block only for its own stream (c10/cuda/CUDACachingAllocator.cpp:
  // BlockPool ordered by stream, get_free_block; expandable segments are per stream), so after
  // zero_grad the compute stream cannot use them
  const bool grads_always = rt.grads_persistent || p.ga > 1 ||
                            (rt.grad_shards_reserved_by_reduce_stream && p.zero >= 2 && !grads_on_host);
  // saved layers on the device; offloaded checkpoints: those in flight in the forward, those
  // prefetched back in the backward
  auto saved_layers = [&](MemorySnapshot& s, double n_layers, bool backward = false) {
    if (!full) {
      s[Mem::activations] += n_layers * saved_per_layer * frag;
    } else {
      const double in_flight = backward ? rt.ckpt_offload_prefetch_layers : rt.ckpt_offload_device_layers;
      double on_device = p.ckpt_offload ? std::min(n_layers, in_flight) : n_layers;
      s[Mem::checkpoints] += on_device * saved_per_layer * frag;
    }
  };

  MemoryPrediction out;
  // forward, at the last layer (saved tensors only grow during the forward). Two high points: the
  // attention core (layer L-1's attention tensors, the context-parallel buffers) and the MLP (layer
  // L-1's attention side kept, the MLP's tensors, its input norm and the down projection's output
  // [T, h] before its TP reduce).
  const double norm_ws = rt.saves_norm_outputs || sp_gather > 0 ? 0.0 : x_in;   // a norm output recomputed, not saved
  {
    const double before = L - 1.0 + others;
    MemorySnapshot att = base(grads_always ? g_full : 0.0);
    saved_layers(att, before);
    att[Mem::activations] += (attn_side - o_seq - qk_pre) * frag;  // x, 1/rms, q, k, v, the output and lse being written
    att[Mem::workspace] += fwd_ws * frag;
    att[Mem::comm_buffers] += (fwd_comm + zero3_gather_last + root_fwd) * frag;
    // layer L-1 at its MLP: what the recompute kind keeps of the attention side, plus the MLP's
    // input (the checkpoint under full recompute) and its tensors
    double cur = 0;
    if (p.recompute == Recompute::none) cur = layer_none;
    else if (p.recompute == Recompute::selective) cur = saved_per_layer + fwd_mlp;
    else cur = x_in + mlp_side;
    MemorySnapshot mlp = base(grads_always ? g_full : 0.0);
    saved_layers(mlp, before);
    mlp[Mem::activations] += cur * frag;
    mlp[Mem::workspace] += (norm_ws + S.tokens * h * a + (tiled_mlp ? fwd_mlp : 0.0)) * frag;
    mlp[Mem::comm_buffers] += (sp_gather + zero3_gather_last + root_fwd) * frag;
    out.phase_peak[static_cast<int>(Phase::forward)] = att.total() > mlp.total() ? att : mlp;
  }
  // loss: every layer's saved tensors and the last layer's output, the logits working set with the
  // gradient of the final hidden states, the final norm's output (gathered under SP) and per-row
  // statistics, the head (gathered under ZeRO-3)
  {
    MemorySnapshot s = base(grads_always ? g_full : 0.0);
    saved_layers(s, L + others);
    const LossWorkingSet lw = loss_working_set(m, rt, p, S);
    const double rows = loss_tile_tokens(p, S);
    s[Mem::activations] += x_in * frag;
    s[Mem::logits] = lw.total() * frag;
    const double final_norm = sp_gather > 0 ? 0.0 : x_in;  // the head's input (gathered under SP)
    s[Mem::workspace] += (final_norm + rstd + rows * kLossRowStats * fp32) * frag;
    // the head gathered under ZeRO-3, its unreduced gradient before the reduce-scatter under ZeRO-2/3
    const double head_grad = p.zero >= 2 ? S.vocab * h * unit_grad_bytes : 0.0;
    s[Mem::comm_buffers] = (head_gather + head_grad + sp_gather + root_embedding + last_layer_kept) * frag;
    if (!stage.last) {  // a stage without the head: its output [Tsp, h] waits for the send, no loss
      s[Mem::logits] = s[Mem::workspace] = s[Mem::comm_buffers] = 0;
    }
    out.phase_peak[static_cast<int>(Phase::loss)] = s;
  }
  // backward: evaluate the first and the last layer (everything in between is linear in the layer).
  // Inside layer i the backward has two high points. The MLP backward: layers 0..i-1 saved, layer
  // i complete (saved or rematerialised), the MLP's gradients and the activation gradients. Then
  // the attention backward: the MLP's tensors of layer i are gone, the attention side of layer i
  // is alive (the attention core rematerialised under selective recompute), with the attention
  // gradients and the context-parallel buffers.
  {
    // layer i's own tensors at the MLP backward beyond what saved_layers counts, by recompute kind
    // (Megatron-style selective recomputes the attention core later, in the attention backward; op-SAC keeps it)
    const double rematerialised = full ? layer_none : recomputed - (p.recompute == Recompute::selective && !op_sac ? o + lse : 0.0);
    MemorySnapshot best;
    int64_t best_layer = -1;
    for (int64_t i : {stage.chunk_layers - 1, int64_t(0)}) {
      const double before = static_cast<double>(i);  // layers 0..i-1 keep their saved tensors
      double grads = grads_always ? g_full : g_full * (L - before) / L;
      // a checkpoint of layer i the runtime keeps while the layer is rematerialised
      const double kept_ckpt = full && rt.recompute_keeps_checkpoint && !p.ckpt_offload ? saved_per_layer : 0.0;
      // the rematerialised layer's output, held by a reentrant checkpoint through the layer's backward
      const double kept_out = full && rt.recompute_keeps_output ? x_in : 0.0;
      MemorySnapshot mlp = base(grads);
      saved_layers(mlp, before + others, true);
      if (!full) saved_layers(mlp, 1.0);
      mlp[Mem::checkpoints] += kept_ckpt * frag;
      mlp[Mem::activations] += (rematerialised + kept_out) * frag;
      mlp[Mem::workspace] += (bwd_mlp + grad_tensors) * frag;
      mlp[Mem::comm_buffers] += (bwd_mlp_comm + zero3_gather + grad_reduce + root_bwd) * frag;
      MemorySnapshot att = base(grads);
      saved_layers(att, before + others, true);
      att[Mem::checkpoints] += kept_ckpt * frag;
      att[Mem::activations] += (attn_side + kept_out) * frag;
      att[Mem::workspace] += (bwd_attn_ws + dy) * frag;
      att[Mem::comm_buffers] += (bwd_attn_comm + zero3_gather + grad_reduce + root_bwd) * frag;
      for (const MemorySnapshot* s : {&mlp, &att})
        if (best_layer < 0 || s->total() > best.total()) { best = *s; best_layer = i; }
    }
    out.phase_peak[static_cast<int>(Phase::backward)] = best;
    out.peak_layer = best_layer;
  }
  // optimizer: model states with every gradient; the micro-batch's token data is released
  {
    MemorySnapshot s = base(g_full);
    s[Mem::mask] = 0;
    s[Mem::grads] += zero3_step_grad_bytes(rt, p, P / Z);  // DeepSpeed ZeRO-3: one sub-group's fp32 gradient
    // ZeRO-1/2: each parameter unit's updated shard is staged for the all-gather that rebuilds the
    // full weights; the largest unit is a layer or the vocabulary matrix (with the final norm)
    if (p.zero >= 1 && p.zero < 3 && Z > 1) {
      const double unit = std::max(S.layer_params, S.vocab * h + (m.tied_embeddings ? 0.0 : h));
      s[Mem::comm_buffers] += unit / Z * rt.weight_bytes;
    }
    out.phase_peak[static_cast<int>(Phase::optimizer)] = s;
  }
  for (int i = 0; i < kPhases; ++i) {
    if (out.phase_peak[i].total() > out.peak.total()) {
      out.peak = out.phase_peak[i];
      out.peak_phase = static_cast<Phase>(i);
    }
  }
  if (out.peak_phase == Phase::forward) out.peak_layer = stage.chunk_layers - 1;
  else if (out.peak_phase != Phase::backward) out.peak_layer = -1;
  if (out.peak_layer >= 0) out.peak_layer += stage.first_layer;  // the model's layer index (first chunk)

  // ---- host memory per node
  const int64_t world = plan_world(p);
  out.ranks_per_node = std::min<int64_t>(world, c.gpus_per_node);
  const double rpn = static_cast<double>(out.ranks_per_node);
  auto& hb = out.host_bytes_per_node;
  if (p.opt_offload) {
    hb[static_cast<int>(HostMem::optimizer)] = rpn * rt.optimizer_bytes * P / opt_shard;
    hb[static_cast<int>(HostMem::master_weights)] = rpn * rt.master_bytes * P / opt_shard;
    if (grads_on_host) hb[static_cast<int>(HostMem::grads)] = rpn * rt.grad_bytes * P / (p.zero >= 2 ? Z : 1.0);
  }
  if (p.param_offload) hb[static_cast<int>(HostMem::weights)] = rpn * rt.weight_bytes * P / Z;
  if (full && p.ckpt_offload) hb[static_cast<int>(HostMem::checkpoints)] = rpn * (L + others) * saved_per_layer;
  hb[static_cast<int>(HostMem::runtime)] = rpn * (rt.host_bytes_per_rank + fw.host_bytes_per_rank());
  out.framework = fw;
  for (double v : hb) out.host_total_bytes_per_node += v;

  out.device_capacity_bytes = static_cast<double>(c.gpu.usable_bytes);
  out.host_capacity_bytes_per_node = static_cast<double>(c.host_bytes_per_node);
  out.fits_device = out.peak.total() <= out.device_capacity_bytes;
  out.fits_host = out.host_total_bytes_per_node <= out.host_capacity_bytes_per_node;
  // the rank's [tokens, hidden] tensors against the most its tiled-loss kernels index
  out.tensor_elements = S.tokens * h;
  out.max_tensor_elements = p.tiled_loss != 0 && rt.tiled_loss_max_tensor_elements > 0 ? rt.tiled_loss_max_tensor_elements : 0.0;
  out.fits_index = out.max_tensor_elements <= 0 || out.tensor_elements <= out.max_tensor_elements;
  return out;
}

MemoryPrediction predict_memory(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt, const Plan& p,
                                int64_t seq) {
  const int64_t pp = std::max<int64_t>(1, p.pp);
  if (pp == 1) return predict_stage_memory(m, c, rt, p, seq, pipeline_stage(m, p, 0));
  // The first stage (embedding, the most micro-batches in flight), the second (the most of the
  // middle stages: in-flight counts fall with the stage, and an uneven split gives the middle
  // stages equal layers, pipeline_stages.hpp) and the last (head and loss); the device
  // peak is the highest stage's, the host figure the highest stage's as if a node held only it.
  MemoryPrediction best, most_host;
  for (int64_t s : {int64_t(0), std::min<int64_t>(1, pp - 1), pp - 1}) {
    MemoryPrediction one = predict_stage_memory(m, c, rt, p, seq, pipeline_stage(m, p, s));
    one.peak_stage = s;
    if (s == 0 || one.peak.total() > best.peak.total()) best = one;
    if (s == 0 || one.host_total_bytes_per_node > most_host.host_total_bytes_per_node) most_host = one;
  }
  best.host_bytes_per_node = most_host.host_bytes_per_node;
  best.host_total_bytes_per_node = most_host.host_total_bytes_per_node;
  best.fits_host = best.host_total_bytes_per_node <= best.host_capacity_bytes_per_node;
  return best;
}

}  // namespace ctx

namespace ctx {

int64_t max_trainable_seq(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt, const Plan& p0,
                          int64_t hi) {
  const int64_t g = std::max<int64_t>(1, seq_granule(p0));
  auto fits = [&](int64_t seq) {
    return predict_memory(m, c, rt, p0, seq).fits();
  };
  int64_t lo = 0, up = hi / g;  // in granules: lo fits (0 = nothing), up+1 does not
  if (up < 1 || !fits(g)) return 0;
  lo = 1;
  if (fits(up * g)) return up * g;
  while (up - lo > 1) {
    int64_t mid = lo + (up - lo) / 2;
    if (fits(mid * g)) lo = mid; else up = mid;
  }
  return lo * g;
}

}  // namespace ctx
