// The time of one training step: what each operation costs on one rank (FLOPs and bytes from the
// shapes the plan leaves there, priced with the hardware profile's throughput curves), what each
// collective costs (collectives.hpp), and a closed-form estimate of how they overlap. The event
// simulator (simulator.hpp) runs the same costs as a schedule; the search uses the closed form to
// rank plans and the simulator to refine the finalists.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "costmodel/attention_work.hpp"
#include "costmodel/hardware_spec.hpp"
#include "costmodel/model_spec.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/runtime_profile.hpp"

namespace ctx {

// FLOPs and bytes of one operation of one layer (or the head) for one micro-batch on one rank.
struct OpCost {
  const char* name = "";
  double flops = 0;       // matmul FLOPs the kernel runs (2*M*N*K per GEMM)
  double bytes = 0;       // bytes a memory-bound kernel moves
  double seconds = 0;     // priced with the hardware curves
};

// Everything the schedule needs, in seconds, per layer and micro-batch unless said otherwise.
struct StepCosts {
  int64_t layers = 0, ga = 1, cp = 1, ring = 1, ulysses = 1, tp = 1;
  CpKind cp_kind = CpKind::zigzag;
  Recompute recompute = Recompute::none;
  bool sp = false;
  // ---- compute stream
  std::vector<OpCost> forward_ops;    // one layer's forward, attention core excluded
  std::vector<OpCost> backward_ops;   // one layer's backward, attention core excluded
  double pre_fwd = 0, post_fwd = 0, mlp_fwd = 0;   // norm+QKV(+rope) | o-proj+residual+norm | MLP
  double pre_bwd = 0, post_bwd = 0, mlp_bwd = 0;
  double head_fwd = 0, head_bwd = 0;               // output head + loss (+ embedding)
  // attention core, [pack class][cp rank][step]; pack classes: the heaviest and the lightest
  // data-parallel pack (one class when every pack is equal)
  std::vector<std::vector<std::vector<double>>> attn_fwd, attn_bwd;
  std::vector<double> pack_work;      // relative attention work of each pack class (mean pack = 1)
  std::vector<int64_t> pack_dp_rank;  // which DP rank holds each pack class
  // ---- communication
  double tp_ag = 0, tp_rs = 0, tp_ar = 0;  // one TP collective on a layer's activation (0 under tp_overlap: in the GEMMs)
  double tp_ag_ends = 0, tp_rs_ends = 0, tp_ar_ends = 0;  // the same around the layers (embedding, head): never overlapped
  // tp_overlap (tp_overlap.hpp): per layer and pass, the fused GEMM+collective operations' time beyond their
  // GEMMs (exposed hops, the last chunk's reduction, the SMs the communication takes), already inside
  // pre/post/mlp_fwd/bwd; the closed form's breakdown reports it as exposed communication
  bool tp_overlap = false;
  double tp_overlap_fwd = 0, tp_overlap_bwd = 0;
  int64_t loss_tiles = 1;                  // logits tiles of the loss (tiled_loss)
  double loss_max_ar = 0, loss_sum_ar = 0; // vocab-parallel loss, per tile: row max, then sum of exp and target logit
  double tp_fixup_norm = 0;                // an SP norm's partial gradient summed over TP
  double tp_fixup_kv = 0;                  // a K or V projection's gradient summed over the TP ranks sharing its heads
  int tp_fixups_norm_per_layer = 0, tp_fixups_kv_per_layer = 0, tp_fixups_norm_final = 0;
  double a2a_qkv = 0, a2a_out = 0;         // Ulysses all-to-all before / after attention
  double a2a_bwd_in = 0;                   // Ulysses backward: q, k, v, o and d(out) to the head layout
  double p2p_fwd = 0, p2p_bwd = 0;         // one ring step: K,V (forward) / K,V,dK,dV (backward), worst hop
  double kv_ag = 0, dkv_rs = 0;            // all-gather-KV: gather K,V / reduce-scatter dK,dV
  double p2p_dkv = 0;                      // one ring hop of a block's dK,dV (backward, after its compute)
  double zero3_ag = 0;                     // gather one layer's parameters
  double zero3_embed_ag = 0;               // gather the embedding (ZeRO-3)
  double zero3_head_ag = 0;                // gather the final norm (+ the head when untied) (ZeRO-3)
  bool tied_embeddings = false;            // the head is the embedding: gathered again for the loss
  double grad_reduce = 0;                  // one layer's gradients (reduce-scatter or all-reduce)
  bool grad_reduce_every_microbatch = false;
  double head_grad_reduce = 0;             // final norm (+ head when untied) gradients, after the loss
  double embed_grad_reduce = 0;            // embedding gradients, after the backward
  double param_h2d = 0;                    // parameter offload: one layer's shard to the device
  double ckpt_d2h = 0, ckpt_h2d = 0;       // checkpoint offload, one layer
  // ---- optimizer (once per step)
  double opt_device = 0, opt_host = 0, opt_d2h = 0, opt_h2d = 0, opt_param_ag = 0;
  double step_overhead_seconds = 0;  // the runtime's fixed per-step overhead (a calibrated profile's)
  // ---- accounting
  double model_flops = 0;      // per step, whole cluster: 6N per token + masked attention (no recompute)
  double hardware_flops = 0;   // per step, one (average) rank, as the kernels run them (recompute included)
  double tokens_per_step = 0;  // global
  int64_t world = 1;
  double peak_flops = 0;       // per GPU, at the plan's precision
  std::string attention_kernel;
};

// The plan's attention work: [cp rank][ring step] pairs (or one entry per rank), the relative
// work of the data-parallel packs, and the effective document length. Depends only on the
// sequence, mask, CP layout and dp, so a search computes it once per layout.
struct AttentionWork {
  std::vector<std::vector<double>> pairs;
  std::vector<double> packs;
  double effective_length = 0;
  double pairs_per_sequence = 0;  // whole sequence, for model FLOPs
  std::vector<AttentionCall> calls;  // cp_varlen cycle / split:k: the calls that replace `pairs` (attention_work.hpp)
  // per-rank work (per_step false) of a causal CP plan: attention_pairs_own_keys, which step_costs
  // reads for ranks priced as one entry (a search prices many plans on one layout's work); empty:
  // step_costs computes it where it needs it
  std::vector<double> own_keys;
};
AttentionWork attention_work(const Plan& p, int64_t seq, bool per_step);

// How detailed the attention work is: per ring step (for the simulator) or per rank (for the search).
// `pre`, when given, must come from attention_work on the same layout.
StepCosts step_costs(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt, const Plan& p, int64_t seq,
                     bool per_step = true, const AttentionWork* pre = nullptr);

// Where a step's time goes on its slowest rank.
struct StepBreakdown {
  double compute = 0;         // the compute stream busy
  double exposed_comm = 0;    // compute waiting for a collective or a ring transfer
  double offload_stall = 0;   // compute waiting for a host<->device copy
  double imbalance = 0;       // waiting for slower ranks (zig-zag vs ring, packing spread)
  double optimizer = 0;       // the optimizer step on the critical path (device or host)
  double overhead = 0;        // the runtime's fixed per-step overhead (step_overhead_seconds)
};
enum class TimePhase : int { forward, backward, optimizer, count };
struct StepTime {
  double step_seconds = 0;
  std::array<double, static_cast<int>(TimePhase::count)> phase_seconds{};  // forward, backward (incl. recompute and loss backward), optimizer
  StepBreakdown breakdown;
  double tokens_per_second = 0;
  double mfu = 0;                     // model FLOPs / (world * peak * step)
  double model_tflops_per_gpu = 0;
  double hardware_tflops_per_gpu = 0;
  std::string method;                 // "closed-form" or "simulated"
};
const char* to_string(TimePhase p);

// Closed form: per layer, the slowest rank's ring steps take max(compute, transfer); prefetches,
// gradient reductions and offload copies are exposed only where they outlast the compute they
// overlap. Cheap (no allocation beyond the costs), for ranking many plans.
StepTime estimate_step(const StepCosts& k);

// Fills the derived fields (tokens/s, MFU, TFLOPS) from step_seconds.
void finish_step_time(const StepCosts& k, StepTime& t);

// Adds the runtime's fixed per-step overhead (k.step_overhead_seconds) to a step timed without it:
// the step, the optimizer phase (the step's boundary) and the breakdown, then the derived fields.
// estimate_step includes it; simulate_step does not, so its callers add it (prediction.cpp, search.cpp).
void add_step_overhead(const StepCosts& k, StepTime& t);

}  // namespace ctx
