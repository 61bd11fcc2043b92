#include "costmodel/pipeline_time.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include "costmodel/collectives.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/pipeline_stages.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/simulator.hpp"

namespace ctx {

bool pipeline_send_inter_node(const Plan& p, int64_t gpus_per_node, int64_t from, int64_t to) {
  // stage k's ranks are k * S .. k * S + S - 1 (process_groups.hpp: pp outermost); rank r of one
  // stage sends to rank r of the other
  const int64_t S = std::max<int64_t>(1, p.dp) * p.tp * p.cp, G = std::max<int64_t>(1, gpus_per_node);
  if (S >= G) return true;  // peers are S >= G ranks apart
  for (int64_t r = 0; r < S; ++r)
    if ((from * S + r) / G != (to * S + r) / G) return true;
  return false;
}

namespace {

// One micro-batch through `layers` layers of the model on one rank of a stage: the costs of the
// plan's stage (ga = 1, no pipeline) restricted to what that stage holds.
struct Part {
  double fwd_s = 0, bwd_s = 0;  // one micro-batch, nothing reduced, no optimizer
  StepBreakdown breakdown;      // of that micro-batch
  double tail_s = 0;            // a whole stage: exposed gradient reduction + optimizer after the last backward
  double tail_optimizer_s = 0;
};

StepTime run(const StepCosts& k, const Plan& p, bool simulate) {
  return simulate ? simulate_step(k, p, SimRecord::none).time : estimate_step(k);
}

}  // namespace

StepTime pipeline_step_time(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt0, const Plan& p,
                            int64_t seq, bool simulate, const AttentionWork* pre, PipelineStepDetail* detail) {
  const RuntimeProfile& rt = plan_changes_runtime(rt0, p) ? runtime_for_plan(rt0, p) : rt0;
  const int64_t P = std::max<int64_t>(1, p.pp), C = std::max<int64_t>(1, p.vpp), V = P * C;
  const int64_t M = std::max<int64_t>(1, p.ga);
  // one stage as a plan of its own: the same tp, cp, dp and layout, one micro-batch, no pipeline
  Plan ps = p;
  ps.pp = 1;
  ps.vpp = 1;
  ps.ga = 1;
  const LocalShapes shapes = local_shapes(m, p, padded_seq(p, seq));  // pad=1: sends carry the pad tokens (step_costs pads the rest)

  // Costs of `layers` layers with the embedding (first) and the head and loss (last) only where
  // held; `whole_stage`: with the stage's gradient reduction and optimizer (its parameters).
  auto costs = [&](int64_t layers, bool first, bool last, bool whole_stage) {
    ModelSpec ms = m;
    ms.layers = layers;
    ms.layer_position.resize(static_cast<size_t>(layers));
    StepCosts k = step_costs(ms, c, rt, ps, seq, simulate, pre);
    k.step_overhead_seconds = 0;  // the runtime's fixed overhead is once per step, added at the end
    if (!last) {  // the final norm, head and loss live on the last stage
      k.head_fwd = k.head_bwd = 0;
      k.loss_max_ar = k.loss_sum_ar = 0;
      k.tp_fixups_norm_final = 0;
      k.head_grad_reduce = 0;
      k.zero3_head_ag = 0;
    }
    if (!first) {  // the embedding lives on the first stage
      k.embed_grad_reduce = 0;
      k.zero3_embed_ag = 0;
    }
    if (!whole_stage) {  // one micro-batch that reduces nothing: the gradients accumulate
      k.grad_reduce = k.head_grad_reduce = k.embed_grad_reduce = 0;
      k.tp_fixup_norm = k.tp_fixup_kv = 0;
      k.opt_device = k.opt_host = k.opt_d2h = k.opt_h2d = k.opt_param_ag = 0;
    } else {
      // a tied embedding's copy on the last stage (pipeline_stages.hpp: Megatron builds the head
      // there) is reduced over data parallel like the embedding it copies
      if (last && !first && m.tied_embeddings) k.head_grad_reduce += k.embed_grad_reduce;
      // the optimizer's terms are linear in the parameters it updates (up to a launch): scaled
      // from what step_costs priced for `layers` layers with embedding and head to what the stage holds
      PipelineStage st;
      st.layers = layers;
      st.first = first;
      st.last = last;
      PipelineStage both = st;
      both.first = both.last = true;
      const double held = pipeline_stage_params(m, st, shapes.layer_params, shapes.vocab);
      const double priced = pipeline_stage_params(m, both, shapes.layer_params, shapes.vocab);
      const double f = priced > 0 ? held / priced : 1.0;
      k.opt_device *= f;
      k.opt_host *= f;
      k.opt_d2h *= f;
      k.opt_h2d *= f;
      k.opt_param_ag *= f;
    }
    return k;
  };
  // each virtual stage's layers (even, or Megatron's uneven split: pipeline_stages.hpp)
  const std::vector<int64_t> chunk_layers = pipeline_chunk_layers(m.layers, p);
  auto stage_layers = [&](int64_t s) {
    int64_t n = 0;
    for (int64_t ch = 0; ch < C; ++ch) n += chunk_layers[static_cast<size_t>(ch * P + s)];
    return n;
  };
  // chunk kinds: (layers, first, last); chunks (stages) of one kind cost the same
  using Kind = std::tuple<int64_t, bool, bool>;
  std::map<Kind, Part> chunk_part, stage_part;
  auto chunk = [&](int64_t v) -> const Part& {
    const bool first = v == 0, last = v == V - 1;
    const int64_t layers = chunk_layers[static_cast<size_t>(v)];
    const Kind key{layers, first, last};
    auto it = chunk_part.find(key);
    if (it != chunk_part.end()) return it->second;
    const StepCosts k = costs(layers, first, last, false);
    const StepTime t = run(k, ps, simulate);
    Part part;
    part.fwd_s = t.phase_seconds[static_cast<int>(TimePhase::forward)];
    part.bwd_s = t.step_seconds - part.fwd_s;
    part.breakdown = t.breakdown;
    return chunk_part.emplace(key, part).first->second;
  };
  // A tied embedding under pp > 1: Megatron all-reduces the embedding's and the last stage's head
  // copy's gradients over the embedding group (the first and last stage's ranks at the same tp, cp,
  // dp coordinates) after the data-parallel reduction (megatron/core/distributed/finalize_model_grads.py
  // _allreduce_word_embedding_grads), exposed at the end of both stages' steps: [vocab/tp, h] in the
  // reduction's dtype on the link the two stages' ranks share
  double embedding_group_s = 0;
  if (P > 1 && m.tied_embeddings) {
    const bool inter = pipeline_send_inter_node(p, c.gpus_per_node, 0, P - 1);
    GroupPlacement pair;
    pair.size = 2;
    pair.nodes = inter ? 2 : 1;
    pair.per_node = inter ? 1 : 2;
    embedding_group_s = collective_seconds(Coll::all_reduce, shapes.vocab * static_cast<double>(m.hidden) * rt.grad_comm_bytes, pair, c);
  }
  auto stage_tail = [&](int64_t s) -> const Part& {
    const bool first = s == 0, last = s == P - 1;
    const int64_t layers = stage_layers(s);
    const Kind key{layers, first, last};
    auto it = stage_part.find(key);
    if (it != stage_part.end()) return it->second;
    const StepTime full = run(costs(layers, first, last, true), ps, simulate);
    const StepTime bare = run(costs(layers, first, last, false), ps, simulate);
    Part part;
    part.tail_s = std::max(0.0, full.step_seconds - bare.step_seconds);
    part.tail_optimizer_s = std::min(part.tail_s, full.breakdown.optimizer);
    if ((first || last) && P > 1 && m.tied_embeddings) part.tail_s += embedding_group_s;
    return stage_part.emplace(key, part).first->second;
  };

  PipelineStepDetail d;
  d.times.stages = P;
  d.times.chunks = C;
  d.times.micro_batches = M;
  for (int64_t v = 0; v < V; ++v) {
    const Part& part = chunk(v);
    d.times.fwd_s.push_back(part.fwd_s);
    d.times.bwd_s.push_back(part.bwd_s);
  }
  // the activation [mbs * seq / cp tokens (/ tp under SP), h] and, backward, its gradient
  d.p2p_bytes = shapes.tokens_sp * static_cast<double>(m.hidden) * rt.activation_bytes;
  for (int64_t v = 0; v + 1 < V; ++v) {
    const bool inter = pipeline_send_inter_node(p, c.gpus_per_node, v % P, (v + 1) % P);
    GroupPlacement hop;
    hop.size = 2;
    hop.nodes = inter ? 2 : 1;
    hop.per_node = inter ? 1 : 2;
    const double s = collective_seconds(Coll::p2p, d.p2p_bytes, hop, c);
    d.p2p_inter_node.push_back(inter);
    d.times.p2p_fwd_s.push_back(s);
    d.times.p2p_bwd_s.push_back(s);
  }
  for (int64_t s = 0; s < P; ++s) d.tail_s.push_back(stage_tail(s).tail_s);

  double step = 0;
  if (simulate) {
    d.schedule = schedule_pipeline(d.times);
    for (int64_t s = 0; s < P; ++s) {
      const double end = d.schedule.end_s[static_cast<size_t>(s)] + d.tail_s[static_cast<size_t>(s)];
      if (end > step) { step = end; d.critical_stage = static_cast<int>(s); }
    }
  } else {
    // the closed form: each stage's end from the schedule's closed form (a lower bound of the
    // exact one's, pipeline_schedule.hpp), then its tail, as the exact branch above
    d.schedule.step_s = pipeline_step_closed_form(d.times, &d.schedule.end_s);
    for (int64_t s = 0; s < P; ++s) {
      const double end = d.schedule.end_s[static_cast<size_t>(s)] + d.tail_s[static_cast<size_t>(s)];
      if (end > step) { step = end; d.critical_stage = static_cast<int>(s); }
    }
  }

  // where the critical stage's step goes: M micro-batches of its chunks, its tail (reductions and
  // the optimizer), and waiting for the other stages (the bubble and the sends)
  const int64_t cs = d.critical_stage;
  StepTime t;
  t.method = simulate ? "simulated" : "closed-form";
  t.step_seconds = step;
  double fwd = 0, busy = 0;
  for (int64_t ch = 0; ch < C; ++ch) {
    const int64_t v = ch * P + cs;
    const Part& part = chunk(v);
    const double mb = static_cast<double>(M);
    fwd += mb * part.fwd_s;
    busy += mb * (part.fwd_s + part.bwd_s);
    t.breakdown.compute += mb * part.breakdown.compute;
    t.breakdown.exposed_comm += mb * part.breakdown.exposed_comm;
    t.breakdown.offload_stall += mb * part.breakdown.offload_stall;
    t.breakdown.imbalance += mb * part.breakdown.imbalance;
  }
  const Part& tail = stage_tail(cs);
  t.breakdown.optimizer = tail.tail_optimizer_s;
  t.breakdown.exposed_comm += tail.tail_s - tail.tail_optimizer_s;
  t.breakdown.imbalance += std::max(0.0, step - busy - tail.tail_s);  // the pipeline bubble and exposed sends
  t.phase_seconds[static_cast<int>(TimePhase::forward)] = std::min(fwd, step);
  t.phase_seconds[static_cast<int>(TimePhase::optimizer)] = tail.tail_optimizer_s;
  t.phase_seconds[static_cast<int>(TimePhase::backward)] = std::max(0.0, step - t.phase_seconds[0] - tail.tail_optimizer_s);
  // tokens, model FLOPs and the world (pp included) from the whole plan's costs
  const StepCosts whole = step_costs(m, c, rt, p, seq, false, simulate ? nullptr : pre);
  finish_step_time(whole, t);
  add_step_overhead(whole, t);  // a calibrated runtime's fixed per-step overhead, once
  if (detail) *detail = std::move(d);
  return t;
}

double pipeline_step_lower_bound_s(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt0, const Plan& p,
                                   int64_t seq, const AttentionWork* pre) {
  const RuntimeProfile& rt = plan_changes_runtime(rt0, p) ? runtime_for_plan(rt0, p) : rt0;
  const double P = static_cast<double>(std::max<int64_t>(1, p.pp)), C = static_cast<double>(std::max<int64_t>(1, p.vpp));
  const double M = static_cast<double>(std::max<int64_t>(1, p.ga));
  Plan ps = p;  // one micro-batch through every layer, no pipeline (as pipeline_step_time prices a stage)
  ps.pp = 1;
  ps.vpp = 1;
  ps.ga = 1;
  const double compute_s = estimate_step(step_costs(m, c, rt, ps, seq, false, pre)).breakdown.compute;
  if (C > 1) return compute_s * M / P;
  // 1F1B: max_s (sum_{j<s} t_j + M t_s) >= T / (1 - (1 - 1/M)^P) (pipeline_time.hpp)
  return compute_s / (1.0 - std::pow(1.0 - 1.0 / M, P));
}

}  // namespace ctx
