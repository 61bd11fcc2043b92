// Notation as in memory_model.cpp: T = tokens per rank (mbs*seq/cp), Tsp = T/tp under SP,
// h = hidden, d = head_dim, a = activation bytes, F = ffn/tp, V = vocab/tp.
#include "costmodel/step_model.hpp"

#include <algorithm>
#include <cmath>

#include "costmodel/attention_kernels.hpp"
#include "costmodel/attention_work.hpp"
#include "costmodel/collectives.hpp"
#include "costmodel/cp_eager_merge.hpp"
#include "costmodel/errors.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/process_groups.hpp"
#include "costmodel/tp_overlap.hpp"
#include "costmodel/zero_comm.hpp"

namespace ctx {

const char* to_string(TimePhase p) {
  static const char* names[] = {"forward", "backward", "optimizer"};
  return names[static_cast<int>(p)];
}

namespace {

struct Pricer {
  const ClusterSpec& c;
  double peak;  // GEMM peak at the plan's precision
  const AttentionKernel* attn;
  AttentionMask mask;   // the plan's mask as the kernel runs it
  double head_dim;

  double gemm(double flops, double calls = 1) const {
    if (flops <= 0) return 0;
    double each = flops / calls;
    return calls * (each / (peak * gemm_scale * gemm_curve->at(each)) + c.gpu.kernels.launch_seconds);
  }
  double traffic = 1;  // runtime's memory_traffic_factor
  double gemm_scale = 1, attention_scale = 1;  // runtime's calibrated efficiency scales (1 = the curves)
  const Curve* gemm_curve = &c.gpu.kernels.gemm;  // the plan's precision's GEMM curve (kernels.gemm[_fp8]_gflop)
  double memory(double bytes) const {
    if (bytes <= 0) return 0;
    bytes *= traffic;
    return bytes / (c.gpu.hbm_bytes_per_second * c.gpu.kernels.memory.at(bytes)) + c.gpu.kernels.launch_seconds;
  }
  // `kernels` memory-bound kernels moving `bytes` in all, counted op by op (so without the runtime's
  // memory_traffic_factor, which scales the ops the step model counts as if fused)
  double counted_memory(double bytes, double kernels) const {
    if (bytes <= 0) return 0;
    const double each = bytes / std::max(1.0, kernels);
    return kernels * (each / (c.gpu.hbm_bytes_per_second * c.gpu.kernels.memory.at(each)) + c.gpu.kernels.launch_seconds);
  }
  // attention FLOPs run at the bf16 peak (fp8 plans keep attention in bf16, as TE and torchao do)
  // unmasked: a block of a causal plan no mask cuts (a ring step's other rank's keys), priced on the
  // kernel's no-mask curve where the hardware profile has one
  double attention(double flops, double tokens, bool backward, bool unmasked = false) const {
    if (flops <= 0) return 0;
    const AttentionMask m = unmasked && mask == AttentionMask::causal ? AttentionMask::full : mask;
    return flops / (c.gpu.peak_bf16_flops * attention_scale * efficiency(m, tokens, backward)) + c.gpu.kernels.launch_seconds;
  }
  // attention_efficiency, remembered per (direction, mask) for the last call length: a step prices
  // every CP rank's blocks at one call length, so most calls ask again what the last one asked (the
  // same value, looked up once; a Pricer lives in one step_costs call)
  struct Remembered {
    double tokens = -1, efficiency = 0;
  };
  mutable Remembered remembered[2][3] = {};  // [backward][AttentionMask]
  double efficiency(AttentionMask m, double tokens, bool backward) const {
    Remembered& e = remembered[backward ? 1 : 0][static_cast<int>(m)];
    if (e.tokens != tokens) e = {tokens, attention_efficiency(*attn, m, head_dim, tokens, backward)};
    return e.efficiency;
  }
};

// Ring steps of one rank: step j computes block j while block j+1's keys travel.
double ring_time(const std::vector<double>& steps, int64_t ring, double transfer) {
  if (steps.empty()) return 0;
  if (steps.size() == 1 && ring > 1) {  // per-rank total only: split evenly over the steps
    double each = steps[0] / static_cast<double>(ring);
    return static_cast<double>(ring - 1) * std::max(each, transfer) + each;
  }
  double t = 0;
  for (size_t j = 0; j < steps.size(); ++j) t += (j + 1 < steps.size()) ? std::max(steps[j], transfer) : steps[j];
  return t;
}

double sum(const std::vector<OpCost>& ops, size_t from, size_t to) {
  double t = 0;
  for (size_t i = from; i < to && i < ops.size(); ++i) t += ops[i].seconds;
  return t;
}

}  // namespace

AttentionWork attention_work(const Plan& p, int64_t seq_tokens, bool per_step) {
  const int64_t seq = padded_seq(p, seq_tokens);  // pad=1: the pad tokens attend like real ones
  AttentionWork w;
  if (per_step) {
    w.pairs = attention_pairs_per_step(p, seq);
  } else {
    for (double x : attention_pairs_per_rank(p, seq)) w.pairs.push_back({x});
  }
  w.packs = pack_attention_work(p, seq, std::max<int64_t>(1, p.dp));
  w.effective_length = effective_document_length(p, seq);
  const std::vector<std::vector<int64_t>> priced = priced_packs(p, seq);
  for (const auto& docs : priced)
    for (int64_t l : docs)
      w.pairs_per_sequence += static_cast<double>(l) * (static_cast<double>(l) + 1.0) / 2.0 / static_cast<double>(priced.size());
  w.calls = varlen_calls(p, seq, per_step);
  if (!per_step && p.mask == MaskKind::causal && p.cp > 1 && p.cp_comm != CpComm::a2a) w.own_keys = attention_pairs_own_keys(p, seq);
  return w;
}

StepCosts step_costs(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt, const Plan& p, int64_t seq,
                     bool per_step, const AttentionWork* pre) {
  // the plan's dtypes: precision=fp32 moves and sends 4-byte weights and activations; master, grads and
  // moments set the bytes the optimizer and the gradient reduction move (runtime_profile.hpp runtime_for_plan)
  if (plan_changes_runtime(rt, p)) return step_costs(m, c, runtime_for_plan(rt, p), p, seq, per_step, pre);
  // a calibrated communication efficiency: the same links at the fitted fraction of their bandwidth
  // (latencies as the cluster profile says); only calibrated profiles pay for the copies
  if (rt.comm_efficiency_scale != 1.0) {
    RuntimeProfile unscaled = rt;
    unscaled.comm_efficiency_scale = 1.0;
    ClusterSpec scaled = c;
    scaled.intra_bytes_per_second *= rt.comm_efficiency_scale;
    scaled.inter_bytes_per_second *= rt.comm_efficiency_scale;
    return step_costs(m, scaled, unscaled, p, seq, per_step, pre);
  }
  StepCosts k;
  // pad=1 (plan_check.hpp padded_seq): every cost at the padded length; tokens_per_step counts the
  // real tokens only (useful throughput), model and hardware FLOPs the padded ones (the GPUs run them)
  const int64_t priced = padded_seq(p, seq);
  const LocalShapes s = local_shapes(m, p, priced);
  const AttentionKernel& kernel = find_attention_kernel(c, rt);
  // GEMMs at the plan's precision. precision=fp32 is priced against the bf16 peak on the profile's fp32
  // curve where ctxrun-calibrate measured one (kernels.gemm_fp32_gflop: about 0.05 of the bf16 peak on an
  // H200), else on the bf16 curve, which makes an fp32 plan's compute time optimistic
  const double peak = p.precision == Precision::fp8 && c.gpu.peak_fp8_flops > 0 ? c.gpu.peak_fp8_flops : c.gpu.peak_bf16_flops;
  Pricer price{c, peak, &kernel, attention_mask(p, kernel, rt), static_cast<double>(m.head_dim), rt.memory_traffic_factor};
  // an FP8 GEMM's efficiency vs the fp8 peak from its own measured curve where the profile has one
  // (cuBLASLt FP8 reaches ~0.62-0.70 of the fp8 peak on H100 where bf16 reaches ~0.78-0.80 of its own)
  const bool fp8_gemm = p.precision == Precision::fp8 && c.gpu.peak_fp8_flops > 0;
  price.gemm_curve = fp8_gemm && !c.gpu.kernels.gemm_fp8.points.empty() ? &c.gpu.kernels.gemm_fp8 : &c.gpu.kernels.gemm;
  if (p.precision == Precision::fp32 && !c.gpu.kernels.gemm_fp32.points.empty()) price.gemm_curve = &c.gpu.kernels.gemm_fp32;
  price.gemm_scale = rt.gemm_efficiency_scale;
  price.attention_scale = rt.attention_efficiency_scale;
  k.layers = m.layers;
  k.ga = p.ga;
  k.cp = p.cp;
  k.tp = p.tp;
  k.ring = ring_degree(p);
  k.ulysses = ulysses_degree(p);
  k.cp_kind = cp_kind_of(p);  // the simulator reads the exchange from the shorthand (ring, zigzag, usp: p2p steps)
  k.recompute = p.recompute;
  k.sp = sp_enabled(p);
  k.world = plan_world(p);  // pp stages included
  k.peak_flops = peak;
  k.attention_kernel = kernel.name;

  const double h = static_cast<double>(m.hidden), d = static_cast<double>(m.head_dim), a = rt.activation_bytes;
  const double T = s.tokens, Tsp = s.tokens_sp, F = s.ffn, V = s.vocab, tp = static_cast<double>(p.tp);
  const double kv_tp = m.kv_heads >= p.tp ? static_cast<double>(m.kv_heads) / tp : 1.0;
  const double q_local = static_cast<double>(m.heads) / tp * d;  // q width per TP rank before Ulysses
  const double kv_local = kv_tp * d;
  const double chunks = mlp_chunks(m, p, s);

  // ---- one layer's forward ops, in order
  auto op = [](const char* name, double flops, double bytes, double sec) { return OpCost{name, flops, bytes, sec}; };
  std::vector<OpCost>& f = k.forward_ops;
  double qkv_flops = 2.0 * T * h * (q_local + 2.0 * kv_local);
  double o_flops = 2.0 * T * q_local * h;
  // SwiGLU has two input projections (gate, up), a GELU MLP one (up); both one down projection
  const double up_mats = m.activation == ActivationKind::swiglu ? 2.0 : 1.0;
  double up_flops = 2.0 * T * h * up_mats * F, down_flops = 2.0 * T * F * h;
  double norm_bytes = 2.0 * Tsp * h * a, resid_bytes = 3.0 * Tsp * h * a;
  f.push_back(op("attn_norm", 0, norm_bytes, price.memory(norm_bytes)));
  f.push_back(op("qkv_proj", qkv_flops, 0, price.gemm(qkv_flops)));
  double rope_bytes = 2.0 * T * (q_local + kv_local) * a;
  f.push_back(op("rope", 0, rope_bytes, price.memory(rope_bytes)));
  const size_t pre_end = f.size();
  f.push_back(op("o_proj", o_flops, 0, price.gemm(o_flops)));
  f.push_back(op("residual", 0, resid_bytes, price.memory(resid_bytes)));
  f.push_back(op("mlp_norm", 0, norm_bytes, price.memory(norm_bytes)));
  const size_t post_end = f.size();
  f.push_back(op("gate_up_proj", up_flops, 0, price.gemm(up_flops, chunks)));
  double act_bytes = (up_mats + 1.0) * T * F * a;  // the activation reads its inputs (gate and up, or up) and writes one output
  f.push_back(op("swiglu", 0, act_bytes, chunks * price.memory(act_bytes / chunks)));
  f.push_back(op("down_proj", down_flops, 0, price.gemm(down_flops, chunks)));
  f.push_back(op("residual", 0, resid_bytes, price.memory(resid_bytes)));
  k.pre_fwd = sum(f, 0, pre_end);
  k.post_fwd = sum(f, pre_end, post_end);
  k.mlp_fwd = sum(f, post_end, f.size());
  // backward: every GEMM twice (input and weight gradients), memory-bound ops read twice as much
  static const char* bwd_names[] = {"attn_norm_bwd", "qkv_proj_bwd", "rope_bwd", "o_proj_bwd", "residual_bwd", "mlp_norm_bwd",
                                     "gate_up_proj_bwd", "swiglu_bwd", "down_proj_bwd", "residual_bwd"};
  for (size_t i = 0; i < f.size(); ++i) {
    const OpCost& o = f[i];
    const char* n = bwd_names[i];
    if (o.flops > 0) {
      double calls = (i == 6 || i == 8) ? chunks : 1.0;  // the MLP's GEMMs run per tile
      k.backward_ops.push_back({n, 2.0 * o.flops, 0, 2.0 * price.gemm(o.flops, calls)});
    } else {
      k.backward_ops.push_back({n, 0, 2.0 * o.bytes, price.memory(2.0 * o.bytes)});
    }
  }
  k.pre_bwd = sum(k.backward_ops, 0, pre_end);
  k.post_bwd = sum(k.backward_ops, pre_end, post_end);
  k.mlp_bwd = sum(k.backward_ops, post_end, k.backward_ops.size());
  // torchtitan's selective recompute (per-op SAC, selective_recomputes_every_second_matmul): the block
  // saves the outputs of aten.mm and SDPA except every second mm of its forward (wq, wk, wv, wo, w1, w3,
  // w2: wk, wo and w3 recomputed) and recomputes every memory-bound op (norms, RoPE, residual, SiLU x
  // up); the attention core is saved, not rematerialised. Priced with each half's backward, where the
  // replayed forward runs (torchtitan distributed/activation_checkpoint.py _apply_op_sac; 9dec370
  // parallelisms/parallelize_llama.py _apply_ac_to_transformer_block: "Saves output of all compute ops,
  // except every second mm", _save_list = {mm, SDPA flash/efficient, reduce_scatter_tensor, max})
  double sac_mm_flops = 0;
  if (rt.selective_recomputes_every_second_matmul && p.recompute == Recompute::selective) {
    k.recompute = Recompute::none;  // no attention-core rematerialisation (simulator, closed form)
    const double wk_flops = 2.0 * T * h * kv_local, w3_flops = 2.0 * T * h * F;
    const double rec_pre = price.gemm(wk_flops) + price.memory(norm_bytes) + price.memory(rope_bytes);
    const double rec_post = price.gemm(o_flops) + price.memory(resid_bytes) + price.memory(norm_bytes);
    const double rec_mlp = price.gemm(w3_flops, chunks) + chunks * price.memory(act_bytes / chunks);
    k.backward_ops.push_back({"sac_recompute_wk_norm_rope", wk_flops, norm_bytes + rope_bytes, rec_pre});
    k.backward_ops.push_back({"sac_recompute_wo_residual_norm", o_flops, resid_bytes + norm_bytes, rec_post});
    k.backward_ops.push_back({"sac_recompute_w3_swiglu", w3_flops, act_bytes, rec_mlp});
    k.pre_bwd += rec_pre;
    k.post_bwd += rec_post;
    k.mlp_bwd += rec_mlp;
    sac_mm_flops = wk_flops + o_flops + w3_flops;
  }

  // ---- head, loss, embedding
  double head_flops = 2.0 * T * h * V;
  double loss_calls = p.tiled_loss != 0 ? std::max(1.0, std::ceil(T / loss_tile_tokens(p, s))) : 1.0;
  // fp32 logits: written and read once each per fp32 copy the stack materialises, plus the gradient
  double logits_bytes = (2.0 * std::max(1.0, rt.loss_fp32_copies) + 2.0) * T * V * 4.0;
  k.head_fwd = price.memory(norm_bytes) + price.gemm(head_flops, loss_calls) + loss_calls * price.memory(logits_bytes / loss_calls) +
               price.memory(T * h * a);  // embedding gather
  k.head_bwd = 2.0 * price.gemm(head_flops, loss_calls) + price.memory(2.0 * norm_bytes) + price.memory(2.0 * T * h * 4.0);

  // ---- attention core: [pack class][cp rank][step]
  AttentionWork own;
  if (!pre) {
    own = attention_work(p, priced, per_step);
    pre = &own;
  }
  const std::vector<std::vector<double>>& pairs = pre->pairs;
  const int64_t dp = std::max<int64_t>(1, p.dp);
  const std::vector<double>& packs = pre->packs;
  double mean = 0;
  for (double w : packs) mean += w;
  mean /= static_cast<double>(packs.size());
  auto heavy = std::max_element(packs.begin(), packs.end()), light = std::min_element(packs.begin(), packs.end());
  if (mean > 0 && (*heavy - *light) > 1e-9 * mean) {
    k.pack_work = {*heavy / mean, *light / mean};
    k.pack_dp_rank = {heavy - packs.begin(), light - packs.begin()};
  } else {
    k.pack_work = {1.0};
    k.pack_dp_rank = {0};
  }
  // a call spans the whole sequence's keys under Ulysses and TE's all-gather, one ring block otherwise
  // (PyTorch's all-gather runs the ring's loop over the gathered chunks: cp_allgather_step_loop)
  const double call_tokens =
      std::min((p.cp_comm == CpComm::a2a || (p.cp_comm == CpComm::allgather && !rt.cp_allgather_step_loop)) ? static_cast<double>(priced)
                                                                                : static_cast<double>(priced) / static_cast<double>(k.ring),
               pre->effective_length);
  const double flops_per_pair = 4.0 * d * static_cast<double>(m.heads) / tp * static_cast<double>(p.mbs);
  // A ring visits the other ranks' keys as blocks no causal mask cuts: Transformer Engine's
  // AttnFuncWithCPAndKVP2P runs step 0 causal and every later step with no mask (the whole KV chunk
  // for the queries, or the later half of the queries against it, under headtail), and PyTorch's
  // _templated_ring_attention calls SDPA with is_causal False after step 0, its all-gather rotater
  // included (rt.cp_allgather_step_loop). Those blocks run at the
  // kernel's no-mask efficiency, not the causal curve's (no diagonal tiles, no idle warps). TE's
  // all-gather CP runs two causal calls per rank (each query chunk against its key prefix): causal.
  // Documents keep the kernel's document mask on every block.
  const bool unmasked_blocks = p.mask == MaskKind::causal && price.mask == AttentionMask::causal && k.ring > 1 &&
                               (p.cp_comm == CpComm::p2p || p.cp_comm == CpComm::a2a_p2p ||
                                (p.cp_comm == CpComm::allgather && rt.cp_allgather_step_loop));
  // only ranks priced as one entry (per-rank totals) split their own keys from the rest; per-step ranks
  // know step 0 is their own keys, so the O(cp) span walk is skipped when no rank has a single entry
  const bool single_entry_ranks =
      unmasked_blocks && std::any_of(pairs.begin(), pairs.end(), [](const std::vector<double>& steps) { return steps.size() == 1; });
  std::vector<double> own_computed;  // unless the attention work carries them (attention_work, per rank)
  if (single_entry_ranks && pre->own_keys.empty()) own_computed = attention_pairs_own_keys(p, priced);
  const std::vector<double>& own_keys = pre->own_keys.empty() ? own_computed : pre->own_keys;
  for (double scale : k.pack_work) {
    std::vector<std::vector<double>> fw, bw;
    for (size_t rank = 0; rank < pairs.size(); ++rank) {
      const std::vector<double>& steps = pairs[rank];
      std::vector<double> fs, bs;
      for (size_t j = 0; j < steps.size(); ++j) {
        const double fl = flops_per_pair * steps[j] * scale;
        if (unmasked_blocks && steps.size() == 1) {  // one entry per rank: its own keys causal, the rest unmasked
          const double diag = flops_per_pair * std::min(steps[j], own_keys[rank]) * scale;
          fs.push_back(price.attention(diag, call_tokens, false) + price.attention(fl - diag, call_tokens, false, true));
          bs.push_back(price.attention(2.5 * diag, call_tokens, true) + price.attention(2.5 * (fl - diag), call_tokens, true, true));
          continue;
        }
        const bool unmasked = unmasked_blocks && j > 0;  // step 0: the rank's own keys
        fs.push_back(price.attention(fl, call_tokens, false, unmasked));
        bs.push_back(price.attention(2.5 * fl, call_tokens, true, unmasked));  // FlashAttention backward: 5 GEMMs vs 2
      }
      fw.push_back(std::move(fs));
      bw.push_back(std::move(bs));
    }
    // cp_varlen cycle / split:k: each step is the calls' kernels one after another, each at its own
    // block's efficiency and paying its own launch (price.attention adds one per call)
    if (!pre->calls.empty()) {
      for (size_t rank = 0; rank < fw.size(); ++rank)
        for (size_t j = 0; j < fw[rank].size(); ++j) {
          double f_s = 0, b_s = 0;
          for (const AttentionCall& call : pre->calls) {
            const double fl = flops_per_pair * call.pairs[rank][j] * scale;
            f_s += call.count * price.attention(fl, call.tokens, false);
            b_s += call.count * price.attention(2.5 * fl, call.tokens, true);
          }
          fw[rank][j] = f_s;
          bw[rank][j] = b_s;
        }
    }
    // PyTorch's eager CP (cp_eager_merge_fp32): each ring step's fp32 merge (forward) and fp32 gradient
    // accumulation (backward) follow that step's kernel on the compute stream; an all-gather exchange (or
    // a per-rank total) runs the same loop, so its one entry carries the sum (cp_eager_merge.hpp)
    if (rt.cp_eager_merge_fp32 && k.ring > 1 && k.ulysses == 1 && p.cp_comm != CpComm::a2a) {
      const double q_elems = s.attn_tokens * s.q_heads * d;
      const double kv_elems = s.attn_tokens * s.kv_heads * d * cp_kv_expansion(rt, s);
      const bool balanced = p.cp_layout != CpLayout::contiguous;
      for (size_t rank = 0; rank < fw.size(); ++rank) {
        const CpEagerMergeBytes mb = cp_eager_merge_bytes(q_elems, kv_elems, a, k.ring, static_cast<int64_t>(rank), balanced);
        for (size_t i = 0; i < mb.fwd_bytes.size(); ++i) {
          const size_t j = fw[rank].size() == mb.fwd_bytes.size() ? i : 0;
          fw[rank][j] += price.counted_memory(mb.fwd_bytes[i], mb.fwd_ops[i]);
          bw[rank][j] += price.counted_memory(mb.bwd_bytes[i], mb.bwd_ops[i]);
        }
      }
    }
    k.attn_fwd.push_back(std::move(fw));
    k.attn_bwd.push_back(std::move(bw));
  }

  // ---- communication
  const int64_t gpn = c.gpus_per_node;
  k.loss_tiles = static_cast<int64_t>(loss_calls);
  if (p.tp > 1) {
    GroupPlacement g = group_placement(p, Group::tp, gpn);
    double act = T * h * a;
    k.tp_ag = collective_seconds(Coll::all_gather, act, g, c);
    k.tp_rs = collective_seconds(Coll::reduce_scatter, act, g, c);
    k.tp_ar = collective_seconds(Coll::all_reduce, act, g, c);
    // around the layers (embedding, head): Megatron's VocabParallelEmbedding and output ColumnParallelLinear
    // are not Transformer Engine modules, so tp_overlap leaves them as they are
    k.tp_ag_ends = k.tp_ag;
    k.tp_rs_ends = k.tp_rs;
    k.tp_ar_ends = k.tp_ar;
    if (p.tp_overlap && k.sp) {
      // TE userbuffers (tp_overlap.hpp): every SP collective of a layer runs inside the GEMM beside it;
      // the fused operation's time beyond the GEMM alone is charged to the compute op holding that GEMM
      // (the layer's collectives leave the TP stream)
      const double sms = c.gpu.sm_count;
      const bool any_sms = rt.tp_overlap_proj_fprop_sms + rt.tp_overlap_fc2_fprop_sms + rt.tp_overlap_qkv_dgrad_sms +
                               rt.tp_overlap_qkv_wgrad_sms + rt.tp_overlap_fc1_dgrad_sms + rt.tp_overlap_fc1_wgrad_sms > 0;
      if (any_sms && sms <= 0)
        throw InputError("hardware profile " + c.gpu.name, "sm_count",
                         "tp_overlap=1 with runtime '" + rt.name + "' gives Transformer Engine's communication kernels SMs the GEMMs "
                         "lose; the GPU's streaming-multiprocessor count is needed (a whole number >= 1)");
      // TE sends all-gathered shards in FP8 when the GEMM runs in FP8 (initialize_ub: "AllGather buffers use
      // fp8 when using fp8 recipe", fp8_buf for the AG overlaps); the reduce-scatters carry the bf16 output
      const double ag_bytes = fp8_gemm ? 1.0 : a, rs_bytes = a;
      GroupPlacement hop = g;
      hop.size = 2;
      const double shard_ag = collective_seconds(Coll::p2p, Tsp * h * ag_bytes, hop, c);
      const double shard_rs = collective_seconds(Coll::p2p, Tsp * h * rs_bytes, hop, c);
      const int64_t n = p.tp;
      // ring exchange of an AG: the GEMM in tp chunks (each at its own size's efficiency), one shard per hop
      auto ring_ag = [&](double flops) { return ring_exchange_seconds(price.gemm(flops, tp) / tp, shard_ag, n) - price.gemm(flops); };
      // the RS after proj / FC2: pipeline (num_splits chunks on the SMs the margin leaves) or ring exchange
      // (the tp partial outputs summed by one memory-bound kernel: read tp shards, write one)
      auto rs = [&](double flops, double comm_sms) {
        const double splits = rt.tp_overlap_rs_splits;
        if (splits >= 1) {
          const double margin = sms > 0 ? sms / (sms - comm_sms) : 1.0;  // set_sm_margin: the GEMM on sm_count - num_sm
          const double chunk_rs = collective_seconds(Coll::reduce_scatter, act * rs_bytes / a / splits, g, c);
          return pipeline_rs_seconds(price.gemm(flops, splits) / splits * margin, chunk_rs, static_cast<int64_t>(splits)) -
                 price.gemm(flops);
        }
        const double reduce = price.memory((tp + 1.0) * Tsp * h * rs_bytes);
        return ring_exchange_seconds(price.gemm(flops, tp) / tp, shard_rs, n, reduce) - price.gemm(flops);
      };
      // bulk: the whole collective beside the whole GEMM, on num_sm of the SMs
      auto bulk = [&](double flops, Coll coll, double bytes_per_element, double comm_sms) {
        const double frac = sms > 0 ? comm_sms / sms : 0.0;
        return bulk_overlap_seconds(price.gemm(flops), collective_seconds(coll, act * bytes_per_element / a, g, c), frac) -
               price.gemm(flops);
      };
      const double qkv_fprop = ring_ag(qkv_flops), fc1_fprop = ring_ag(up_flops);
      const double proj_fprop = rs(o_flops, rt.tp_overlap_proj_fprop_sms), fc2_fprop = rs(down_flops, rt.tp_overlap_fc2_fprop_sms);
      // backward: d(out) gathered for the proj / FC2 input gradients (ring exchange); the saved norm output
      // gathered beside the QKV / FC1 input gradient and their reduce-scatter beside the weight gradient (bulk)
      const double proj_dgrad = ring_ag(o_flops), fc2_dgrad = ring_ag(down_flops);
      const double qkv_dgrad = bulk(qkv_flops, Coll::all_gather, ag_bytes, rt.tp_overlap_qkv_dgrad_sms);
      const double qkv_wgrad = bulk(qkv_flops, Coll::reduce_scatter, rs_bytes, rt.tp_overlap_qkv_wgrad_sms);
      const double fc1_dgrad = bulk(up_flops, Coll::all_gather, ag_bytes, rt.tp_overlap_fc1_dgrad_sms);
      const double fc1_wgrad = bulk(up_flops, Coll::reduce_scatter, rs_bytes, rt.tp_overlap_fc1_wgrad_sms);
      k.pre_fwd += qkv_fprop;
      k.post_fwd += proj_fprop;
      k.mlp_fwd += fc1_fprop + fc2_fprop;
      k.post_bwd += proj_dgrad;
      k.pre_bwd += qkv_dgrad + qkv_wgrad;
      k.mlp_bwd += fc2_dgrad + fc1_dgrad + fc1_wgrad;
      k.tp_overlap_fwd = qkv_fprop + proj_fprop + fc1_fprop + fc2_fprop;
      k.tp_overlap_bwd = proj_dgrad + fc2_dgrad + qkv_dgrad + qkv_wgrad + fc1_dgrad + fc1_wgrad;
      k.tp_overlap = true;
      k.tp_ag = k.tp_rs = 0;  // the layer's SP collectives: inside the fused GEMMs above
    }
    // the vocab-parallel cross-entropy's fp32 row statistics, per tile: the max, then sum of exp and target logit
    const double rows = T / loss_calls;
    k.loss_max_ar = collective_seconds(Coll::all_reduce, rows * 4.0, g, c);
    k.loss_sum_ar = collective_seconds(Coll::all_reduce, rows * 8.0, g, c);
    // gradients TP ranks hold partial sums of (fp32): SP's norm weights, and K/V projections shared by
    // replicated KV heads (summed over all the group's copies: the full [kv_dim, h])
    if (k.sp) {
      k.tp_fixup_norm = collective_seconds(Coll::all_reduce, h * 4.0, g, c);
      k.tp_fixups_norm_per_layer = 2;
      k.tp_fixups_norm_final = 1;
    }
    if (m.kv_heads < p.tp) {
      k.tp_fixup_kv = collective_seconds(Coll::all_reduce, static_cast<double>(m.kv_heads) * d * h * 4.0, g, c);
      k.tp_fixups_kv_per_layer = 2;
    }
  }
  if (k.ulysses > 1) {
    GroupPlacement g = group_placement(p, Group::ulysses, gpn);
    double kv_heads_total = std::max(kv_tp, static_cast<double>(k.ulysses));
    k.a2a_qkv = collective_seconds(Coll::all_to_all, T * d * a * (static_cast<double>(m.heads) / tp + 2.0 * kv_heads_total), g, c);
    k.a2a_out = collective_seconds(Coll::all_to_all, T * q_local * a, g, c);
    // the backward sends d(out) to the head layout, and q, k, v, o again where the forward kept
    // them in the sequence layout only
    k.a2a_bwd_in = k.a2a_out + (rt.ulysses_backward_resends_inputs ? k.a2a_qkv + k.a2a_out : 0.0);
  }
  if (k.ring > 1 && p.cp_comm != CpComm::a2a) {
    GroupPlacement g = group_placement(p, Group::ring, gpn);
    // K,V blocks as the runtime's CP moves them (cp_kv_expansion: torchtitan's are expanded to the query heads)
    double kv = ring_kv_bytes_per_step(m, s, a) * cp_kv_expansion(rt, s);
    if (p.cp_comm == CpComm::allgather) {
      GroupPlacement gc = group_placement(p, Group::cp, gpn);
      k.kv_ag = collective_seconds(Coll::all_gather, kv * static_cast<double>(p.cp), gc, c);
      // dK,dV reduce-scattered in the dtype the runtime accumulates them in (memory_model.cpp names each stack's)
      const double dkv_dtype = rt.allgather_dkv_fp32 ? 4.0 / a : 1.0;
      k.dkv_rs = collective_seconds(Coll::reduce_scatter, kv * dkv_dtype * static_cast<double>(p.cp), gc, c);
    } else {
      GroupPlacement hop = g;
      hop.size = 2;
      k.p2p_fwd = collective_seconds(Coll::p2p, kv, hop, c);
      k.p2p_bwd = collective_seconds(Coll::p2p, 2.0 * kv, hop, c);
      k.p2p_dkv = collective_seconds(Coll::p2p, kv, hop, c);  // dK,dV: K,V's shape and dtype
      if (!pre->calls.empty()) {  // cycle / split:k: one hop per call, each its share of the block (and its own latency)
        k.p2p_fwd = k.p2p_bwd = k.p2p_dkv = 0;
        for (const AttentionCall& call : pre->calls) {
          k.p2p_fwd += call.count * collective_seconds(Coll::p2p, kv * call.kv_share, hop, c);
          k.p2p_bwd += call.count * collective_seconds(Coll::p2p, 2.0 * kv * call.kv_share, hop, c);
          k.p2p_dkv += call.count * collective_seconds(Coll::p2p, kv * call.kv_share, hop, c);
        }
      }
    }
  }
  const double zdeg = s.zero_degree;  // the shard group: dp*cp, or HSDP's zero_shard
  const GroupPlacement zg = group_placement(p, Group::zero_shard, gpn);
  const GroupPlacement zgrad = group_placement(p, zero_grad_group(p), gpn);  // zero<=1 all-reduce over all dp*cp
  const GroupPlacement zrep = group_placement(p, Group::zero_replicate, gpn);
  // the parameter units besides the layers: the embedding [vocab/tp, h], and the final norm with
  // the head when untied (the rest of s.params)
  const double embed_params = s.vocab * h;
  const double final_params = s.params - static_cast<double>(m.layers) * s.layer_params - embed_params;
  k.tied_embeddings = m.tied_embeddings;
  if (p.zero >= 3 && zdeg > 1) {
    k.zero3_ag = collective_seconds(Coll::all_gather, s.layer_params * rt.weight_bytes, zg, c);
    k.zero3_embed_ag = collective_seconds(Coll::all_gather, embed_params * rt.weight_bytes, zg, c);
    k.zero3_head_ag = collective_seconds(Coll::all_gather, final_params * rt.weight_bytes, zg, c);
  }
  const double grad_comm = rt.grad_comm_bytes;  // the reduction's dtype on the wire (runtime_profile.hpp)
  if (zgrad.size > 1) {
    // the shard group's reduce-scatter (zero<=1: the all-reduce over dp*cp), plus under HSDP the
    // all-reduce of the 1/zdeg shard across the replicate groups, on the same stream after it (zero_comm.hpp)
    const Coll red = zero_grad_collective(p);
    const bool rep = zero_grad_replicated(p);
    auto reduce = [&](double params) {
      return collective_seconds(red, params * grad_comm, zgrad, c) +
             (rep ? collective_seconds(Coll::all_reduce, params * grad_comm / zdeg, zrep, c) : 0.0);
    };
    k.grad_reduce = reduce(s.layer_params);
    k.head_grad_reduce = reduce(final_params);
    k.embed_grad_reduce = reduce(embed_params);
  }
  k.grad_reduce_every_microbatch = p.zero >= 2;  // ZeRO-2/3 reduce (and fix up) every micro-batch
  if (p.param_offload) k.param_h2d = pcie_seconds(s.layer_params / zdeg * rt.weight_bytes, c);
  if (p.ckpt_offload && p.recompute == Recompute::full) {
    k.ckpt_d2h = pcie_seconds(Tsp * h * a, c);
    k.ckpt_h2d = k.ckpt_d2h;
  }

  // ---- optimizer
  const double shard = p.zero >= 1 ? s.params / zdeg : s.params;
  if (p.opt_offload && rt.optimizer_offload_on_device) {
    // the device's AdamW reads master weights and Adam states from pinned host memory and writes
    // them back (PCIe both ways at once, the slower direction bounds it), and reads the gradient
    // and writes the compute weight in device memory
    const double host_bytes = shard * (rt.master_bytes + rt.optimizer_bytes);
    k.opt_device = std::max(pcie_seconds(host_bytes, c), price.memory(shard * (rt.grad_bytes + rt.weight_bytes)));
  } else if (p.opt_offload) {
    // the host optimizer's rate is per node: each rank steps its own partition at once, every rank's
    // OpenMP pool over the same host cores (DeepSpeed's cpu_adam.h Step_AVX: omp parallel for, threads
    // limited only by --bind_cores_to_rank), so a rank gets the node's rate over the ranks on the node
    const double ranks_per_node = static_cast<double>(std::min<int64_t>(gpn, k.world));
    k.opt_host = shard / (rt.cpu_adam_params_per_second / ranks_per_node);
    k.opt_d2h = pcie_seconds(shard * rt.grad_bytes, c);
    k.opt_h2d = pcie_seconds(shard * rt.weight_bytes, c);
    if (p.zero == 3 && rt.zero3_grad_partition_bytes > 0) {
      // DeepSpeed's offload buffers are pageable unless offload_optimizer.pin_memory (default false,
      // DeepSpeed 0.17.0 runtime/zero/offload_config.py; ALST's recipes, e.g. ArcticTraining
      // projects/sequence-parallelism/run-h100-sp1-llama-8b-baseline.yml and run-h100-sp32-llama-8b-baseline.yml,
      // set only offload_*.device): the driver stages a pageable copy through its own pinned buffer
      // (CUDA Runtime API, "API synchronization behavior": a device-to-pageable copy returns only once
      // complete). DeepSpeed PR #5301 (7b5b066) measured the pinned copy 6x (1 GPU) and 4-5x (8-GPU node,
      // all ranks copying) faster than the pageable one; PR #8207 (7dfa67a, after 0.17) names the ZeRO-3
      // gradient offload's 'synchronous, low-bandwidth (staged pageable) path'. The ratio was measured
      // host-to-device; the device-to-host copies below are priced at it too (the same staging), an
      // assumption: the one device-to-pageable measurement found, PyTorch PR #138018 (A100, 1.4 GB/s vs
      // 12.6 GB/s pinned, 9x, into fresh buffers whose first-touch faults DeepSpeed's persistent ones pay
      // once), is larger
      const double pageable_slowdown = ranks_per_node > 1 ? 4.5 : 6.0;
      // DeepSpeed ZeRO-3 (0.17.0 runtime/zero/stage3.py, the flat gradient partition's runtime):
      // __reduce_and_partition_ipg_grads runs on the autograd thread when a reduce bucket fills: the
      // bucket's reduce-scatter on the reduce stream (which waited for the compute stream,
      // __add_grad_to_ipg_bucket), then partition_grads copies the partition to the host buffer (bf16),
      // back up as a device buffer, and into the optimizer's fp32 gradient (2 + 2 + 4 B per element; the
      // fp32 copy at the accumulation boundary only; grad_partitions_flat_buffer and the fp32 gradient
      // are pinned only under offload_optimizer.pin_memory: _setup_for_real_optimizer and
      // initialize_optimizer_states' subgroup_gradient_buffer). Those buffers are pageable (above): a
      // copy to or from them returns only when done, so the autograd thread, and with it every later
      // backward kernel, waits for the bucket's reduce-scatter and copies. Every bucket's reduction and copies are on the critical path:
      // priced here, after the backward (the simulator's grads_d2h), the copies at the pageable rate
      // (the pinned one over PR #5301's ratio). The simulator also places the reductions on the dp
      // stream, where a reduction it leaves exposed is counted twice (the last layers' at most)
      const double ga = static_cast<double>(k.ga);
      const double reductions = ga * (static_cast<double>(m.layers) * k.grad_reduce + k.head_grad_reduce + k.embed_grad_reduce);
      k.opt_d2h = reductions + pageable_slowdown * pcie_seconds(shard * (ga * 2.0 * rt.zero3_grad_partition_bytes + rt.grad_bytes), c);
      // step(): per sub-group, _reassign_or_swap_out_partitioned_parameters copies the fp32 partition
      // (unpinned: _create_fp32_partitions' .to(cpu).clone().float()) into the bf16 one with a blocking
      // copy_, which PyTorch converts on the host into a pageable buffer before the transfer. DeepSpeed
      // PR #5301 (ec16120d, stage_1_and_2.py) measured that path 6x (1 GPU) and 4-5x (8-GPU node) slower
      // than the pinned fp32 copy it put in its place; stage3.py kept it. With offload_param the bf16
      // partition is host memory (pinned flat buffer): the copy stays on the host, a PyTorch CPU
      // fp32 -> bf16 copy_ of the partition at the profile's host rate (shared by the node's ranks, as
      // CPU-Adam's), and the weights go up in the next forward's fetch (param_h2d)
      const double host_cast = rt.host_fp32_to_bf16_elems_per_second > 0
                                   ? shard / (rt.host_fp32_to_bf16_elems_per_second / ranks_per_node)
                                   : 0.0;
      k.opt_h2d = p.param_offload ? host_cast : pageable_slowdown * pcie_seconds(shard * rt.master_bytes, c);
    }
  } else {
    // read grad, master, m, v; write master, m, v, bf16 weight. Without a master copy (master=none)
    // the update reads and writes the compute weight itself: 2 x weight_bytes in place of
    // 2 x master + 1 x weight
    const double param_rw = rt.master_bytes > 0 ? 2.0 * rt.master_bytes + rt.weight_bytes : 2.0 * rt.weight_bytes;
    double bytes = shard * (rt.grad_bytes + param_rw + 2.0 * rt.optimizer_bytes);
    k.opt_device = price.memory(bytes);
  }
  if ((p.zero == 1 || p.zero == 2) && zdeg > 1)
    k.opt_param_ag = collective_seconds(Coll::all_gather, shard * zdeg * rt.weight_bytes, zg, c);
  // a fixed overhead fitted only on optimizer-offload runs says nothing of a plan without offload
  k.step_overhead_seconds = rt.step_overhead_optimizer_offload_only && !p.opt_offload ? 0 : rt.step_overhead_seconds;

  // ---- accounting
  double seqs = static_cast<double>(p.mbs * p.ga * dp);
  k.tokens_per_step = static_cast<double>(seq) * seqs;  // real tokens (pad=1: the pad tokens are not throughput)
  const double pairs_total = pre->pairs_per_sequence;
  k.model_flops = dense_train_flops_per_token(m) * static_cast<double>(priced) * seqs +
                  3.0 * 4.0 * d * static_cast<double>(m.heads) * pairs_total * static_cast<double>(m.layers) * seqs;
  double layer_fwd_flops = 0, layer_bwd_flops = 0;
  for (auto& o : k.forward_ops) layer_fwd_flops += o.flops;
  for (auto& o : k.backward_ops) layer_bwd_flops += o.flops;
  layer_bwd_flops -= sac_mm_flops;  // counted as recompute below
  double attn_rank = 0;
  for (auto& steps : pairs)
    for (double w : steps) attn_rank += flops_per_pair * w / static_cast<double>(pairs.size());
  double rec = p.recompute == Recompute::full        ? layer_fwd_flops + attn_rank
               : sac_mm_flops > 0                        ? sac_mm_flops
               : p.recompute == Recompute::selective ? attn_rank
                                                         : 0;
  k.hardware_flops = static_cast<double>(p.ga) *
                     (static_cast<double>(m.layers) * (layer_fwd_flops + layer_bwd_flops + 3.5 * attn_rank + rec) + 3.0 * head_flops);
  k.hardware_flops /= static_cast<double>(std::max<int64_t>(1, p.pp));  // a pipeline stage runs 1/pp of the layers (average rank)
  return k;
}

void finish_step_time(const StepCosts& k, StepTime& t) {
  if (t.step_seconds <= 0) return;
  t.tokens_per_second = k.tokens_per_step / t.step_seconds;
  t.model_tflops_per_gpu = k.model_flops / static_cast<double>(k.world) / t.step_seconds / 1e12;
  t.hardware_tflops_per_gpu = k.hardware_flops / t.step_seconds / 1e12;
  t.mfu = k.model_flops / (static_cast<double>(k.world) * k.peak_flops * t.step_seconds);
}

StepTime estimate_step(const StepCosts& k) {
  // One micro-batch on rank (pack class, cp rank); returns compute, exposed comm, offload stall.
  struct Parts { double compute = 0, comm = 0, offload = 0; double total() const { return compute + comm + offload; } };
  const bool ring_kind = k.cp_kind == CpKind::ring || k.cp_kind == CpKind::zigzag || k.cp_kind == CpKind::usp;
  auto micro_batch = [&](size_t cls, size_t rank, bool reduce_grads) {
    Parts out;
    const auto& af = k.attn_fwd[cls][rank];
    const auto& ab = k.attn_bwd[cls][rank];
    double af_sum = 0, ab_sum = 0;
    for (double x : af) af_sum += x;
    for (double x : ab) ab_sum += x;
    double attn_f = ring_kind ? ring_time(af, k.ring, k.p2p_fwd) : af_sum;
    // backward: K,V and the previous block's dK,dV share each hop; the last dK,dV go home after it
    double attn_b = ring_kind ? ring_time(ab, k.ring, k.p2p_bwd) + (k.ring > 1 ? k.p2p_dkv : 0.0) : ab_sum;
    double tp_comm = k.sp ? 2.0 * (k.tp_ag + k.tp_rs) : 2.0 * k.tp_ar;
    // the backward under SP gathers twice per half: d(out) and the recomputed norm output
    double tp_comm_bwd = k.sp ? 2.0 * (2.0 * k.tp_ag + k.tp_rs) : 2.0 * k.tp_ar;
    // TP fix-ups of partial gradients, on the TP stream before the unit's reduction
    double fixups = k.tp_fixups_norm_per_layer * k.tp_fixup_norm + k.tp_fixups_kv_per_layer * k.tp_fixup_kv;
    double a2a = k.a2a_qkv + k.a2a_out;
    double fwd_compute = k.pre_fwd + k.post_fwd + k.mlp_fwd + af_sum;
    double fwd_comm = tp_comm + a2a + k.kv_ag + (attn_f - af_sum);
    double fwd_layer = fwd_compute + fwd_comm;
    double rec_compute = 0, rec_comm = 0;
    if (k.recompute == Recompute::full) { rec_compute = fwd_compute; rec_comm = fwd_comm; }
    else if (k.recompute == Recompute::selective) { rec_compute = af_sum; rec_comm = attn_f - af_sum + a2a; }
    double bwd_compute = rec_compute + k.pre_bwd + k.post_bwd + k.mlp_bwd + ab_sum;
    double bwd_comm = rec_comm + tp_comm_bwd + k.a2a_bwd_in + k.a2a_qkv + k.kv_ag + k.dkv_rs + (attn_b - ab_sum) + (reduce_grads ? fixups : 0.0);
    double bwd_layer = bwd_compute + bwd_comm;
    double L = static_cast<double>(k.layers);
    // overlapped streams, exposed only where they outlast the layer they hide behind
    double f_prefetch = std::max(k.zero3_ag, k.param_h2d);
    double f_exposed_comm = std::max(0.0, k.zero3_ag - fwd_layer), f_exposed_host = std::max(0.0, std::max(k.param_h2d, k.ckpt_d2h) - fwd_layer);
    double red = reduce_grads ? k.grad_reduce : 0.0;
    double b_exposed_comm = std::max(0.0, k.zero3_ag + red - bwd_layer);
    double b_exposed_host = std::max(0.0, k.param_h2d + k.ckpt_h2d - bwd_layer);
    out.compute = L * (fwd_compute + bwd_compute) + k.head_fwd + k.head_bwd;
    // ZeRO-3's embedding gather (before the first layer) and the head's (after the last) have no
    // compute to hide behind; a tied head is the embedding, gathered again
    const double ends_gather = k.zero3_embed_ag * (k.tied_embeddings ? 2.0 : 1.0) + k.zero3_head_ag;
    // TP around the layers: the embedding's partial rows, the head's input gathered (SP), the loss's
    // per-tile statistics, d(final norm output) reduced, d(embedding output) gathered (SP), and
    // the final norm's fix-up
    const double tp_red = k.sp ? k.tp_rs_ends : k.tp_ar_ends;
    const double tp_ends = 2.0 * tp_red + (k.sp ? 2.0 * k.tp_ag_ends : 0.0) +
                           static_cast<double>(k.loss_tiles) * (k.loss_max_ar + k.loss_sum_ar) +
                           (reduce_grads ? k.tp_fixups_norm_final * k.tp_fixup_norm : 0.0);
    out.comm = L * (fwd_comm + bwd_comm + f_exposed_comm + b_exposed_comm) + f_prefetch /* first layer's gather */ +
               ends_gather + tp_ends +
               (reduce_grads ? red + k.embed_grad_reduce : 0.0) /* the last reduction has nothing to hide behind */;
    out.offload = L * (f_exposed_host + b_exposed_host) + k.ckpt_h2d;
    // tp_overlap: the fused GEMM+collective time beyond the GEMMs sits in the compute ops (the simulator
    // runs it there); the breakdown counts it as the exposed communication it is (recomputed with the forward)
    const double overlap = L * (k.tp_overlap_fwd * (k.recompute == Recompute::full ? 2.0 : 1.0) + k.tp_overlap_bwd);
    out.compute -= overlap;
    out.comm += overlap;
    return out;
  };
  // the slowest rank (heaviest pack, busiest cp rank) and the average rank
  auto step_of = [&](size_t cls, size_t rank, Parts* acc) {
    double t = 0;
    for (int64_t mb = 0; mb < k.ga; ++mb) {
      bool reduce = k.grad_reduce_every_microbatch || mb + 1 == k.ga;
      Parts p = micro_batch(cls, rank, reduce);
      if (acc) { acc->compute += p.compute; acc->comm += p.comm; acc->offload += p.offload; }
      t += p.total();
    }
    return t;
  };
  double worst = 0;
  for (size_t cls = 0; cls < k.attn_fwd.size(); ++cls)
    for (size_t r = 0; r < k.attn_fwd[cls].size(); ++r) worst = std::max(worst, step_of(cls, r, nullptr));
  // the average rank: mean over cp ranks of the mean pack (classes weighted evenly; one class if packs are equal)
  Parts mean_parts;
  double mean_t = 0, n = 0;
  for (size_t cls = 0; cls < k.attn_fwd.size(); ++cls)
    for (size_t r = 0; r < k.attn_fwd[cls].size(); ++r) {
      Parts p;
      mean_t += step_of(cls, r, &p);
      mean_parts.compute += p.compute;
      mean_parts.comm += p.comm;
      mean_parts.offload += p.offload;
      n += 1;
    }
  mean_t /= n;
  StepTime t;
  t.method = "closed-form";
  double opt = k.opt_device + k.opt_d2h + k.opt_host + k.opt_h2d;
  t.breakdown.compute = mean_parts.compute / n;
  t.breakdown.exposed_comm = mean_parts.comm / n + k.opt_param_ag;
  t.breakdown.offload_stall = mean_parts.offload / n;
  t.breakdown.optimizer = opt;
  t.breakdown.imbalance = worst - mean_t;
  t.step_seconds = worst + opt + k.opt_param_ag;
  // phases of the slowest rank: forward share of its micro-batches by the forward/backward compute ratio
  double fwd_share = 0;
  {
    double L = static_cast<double>(k.layers);
    double f = L * (k.pre_fwd + k.post_fwd + k.mlp_fwd) + k.head_fwd;
    double b = L * (k.pre_bwd + k.post_bwd + k.mlp_bwd) + k.head_bwd;
    double rec = k.recompute == Recompute::full ? L * (k.pre_fwd + k.post_fwd + k.mlp_fwd) : 0;
    fwd_share = f / std::max(1e-30, f + b + rec);
  }
  t.phase_seconds[static_cast<int>(TimePhase::forward)] = worst * fwd_share;
  t.phase_seconds[static_cast<int>(TimePhase::backward)] = worst * (1.0 - fwd_share);
  t.phase_seconds[static_cast<int>(TimePhase::optimizer)] = opt + k.opt_param_ag;
  finish_step_time(k, t);
  add_step_overhead(k, t);
  return t;
}

void add_step_overhead(const StepCosts& k, StepTime& t) {
  if (k.step_overhead_seconds == 0) return;
  t.step_seconds += k.step_overhead_seconds;
  t.phase_seconds[static_cast<int>(TimePhase::optimizer)] += k.step_overhead_seconds;
  t.breakdown.overhead += k.step_overhead_seconds;
  finish_step_time(k, t);
}

}  // namespace ctx
