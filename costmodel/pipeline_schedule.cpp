#include "costmodel/pipeline_schedule.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ctx {

int64_t pipeline_warmup_forwards(int64_t stages, int64_t chunks, int64_t micro_batches, int64_t stage) {
  const int64_t total = micro_batches * chunks;
  const int64_t w = chunks == 1 ? stages - stage - 1 : 2 * (stages - stage - 1) + (chunks - 1) * stages;
  return std::min(w, total);
}

namespace {

// The k-th forward (or backward) of a stage: which chunk and micro-batch (schedules.py:
// get_model_chunk_id, get_microbatch_id_in_model_chunk with groups of `stages` micro-batches).
PipelineOp kth_op(int64_t stages, int64_t chunks, int64_t k, bool forward) {
  PipelineOp op;
  op.forward = forward;
  const int64_t group = stages * chunks;
  const int64_t in_group = k % group;
  op.chunk = in_group / stages;
  if (!forward) op.chunk = chunks - 1 - op.chunk;  // backwards run the chunks in reverse
  op.micro_batch = k / group * stages + k % stages;
  return op;
}

}  // namespace

std::vector<PipelineOp> pipeline_stage_order(int64_t stages, int64_t chunks, int64_t micro_batches, int64_t stage) {
  const int64_t total = micro_batches * chunks;
  const int64_t w = pipeline_warmup_forwards(stages, chunks, micro_batches, stage);
  std::vector<PipelineOp> order;
  order.reserve(static_cast<size_t>(2 * total));
  for (int64_t k = 0; k < w; ++k) order.push_back(kth_op(stages, chunks, k, true));
  for (int64_t i = 0; i < total - w; ++i) {  // steady state: one forward, one backward
    order.push_back(kth_op(stages, chunks, w + i, true));
    order.push_back(kth_op(stages, chunks, i, false));
  }
  for (int64_t k = total - w; k < total; ++k) order.push_back(kth_op(stages, chunks, k, false));  // drain
  return order;
}

int64_t pipeline_in_flight(int64_t stages, int64_t chunks, int64_t micro_batches, int64_t stage) {
  return std::min(pipeline_warmup_forwards(stages, chunks, micro_batches, stage) + 1, micro_batches * chunks);
}

PipelineSchedule schedule_pipeline(const PipelineTimes& t) {
  const int64_t P = std::max<int64_t>(1, t.stages), C = std::max<int64_t>(1, t.chunks), M = std::max<int64_t>(1, t.micro_batches);
  const int64_t V = P * C;
  if (static_cast<int64_t>(t.fwd_s.size()) != V || static_cast<int64_t>(t.bwd_s.size()) != V ||
      static_cast<int64_t>(t.p2p_fwd_s.size()) != V - 1 || static_cast<int64_t>(t.p2p_bwd_s.size()) != V - 1)
    throw std::logic_error("schedule_pipeline: times for " + std::to_string(V) + " virtual stages expected");
  if (C > 1 && M % P != 0) throw std::logic_error("schedule_pipeline: interleaving needs micro_batches % stages == 0");
  // end times of every task, [virtual stage][micro-batch]; -1 = not run yet
  std::vector<double> f_end(static_cast<size_t>(V * M), -1.0), b_end(static_cast<size_t>(V * M), -1.0);
  auto at = [M](int64_t v, int64_t mb) { return static_cast<size_t>(v * M + mb); };
  std::vector<std::vector<PipelineOp>> order(static_cast<size_t>(P));
  for (int64_t s = 0; s < P; ++s) order[static_cast<size_t>(s)] = pipeline_stage_order(P, C, M, s);
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  PipelineSchedule out;
  out.end_s.assign(static_cast<size_t>(P), 0.0);
  out.busy_s.assign(static_cast<size_t>(P), 0.0);
  size_t remaining = 0;
  for (auto& o : order) remaining += o.size();
  out.tasks = static_cast<int64_t>(remaining);
  // Sweep the stages, running each stage's next tasks while their inputs are there; every sweep
  // that runs nothing would mean a cycle.
  while (remaining > 0) {
    size_t ran = 0;
    for (int64_t s = 0; s < P; ++s) {
      auto& o = order[static_cast<size_t>(s)];
      size_t& i = next[static_cast<size_t>(s)];
      double& free_at = out.end_s[static_cast<size_t>(s)];
      while (i < o.size()) {
        const PipelineOp& op = o[i];
        const int64_t v = op.chunk * P + s;
        double ready = 0;
        if (op.forward) {
          if (v > 0) {
            const double e = f_end[at(v - 1, op.micro_batch)];
            if (e < 0) break;
            ready = e + t.p2p_fwd_s[static_cast<size_t>(v - 1)];
          }
        } else if (v + 1 < V) {
          const double e = b_end[at(v + 1, op.micro_batch)];
          if (e < 0) break;
          ready = e + t.p2p_bwd_s[static_cast<size_t>(v)];
        } else {
          const double e = f_end[at(v, op.micro_batch)];  // the loss stage turns around
          if (e < 0) break;
          ready = e;
        }
        const double dur = op.forward ? t.fwd_s[static_cast<size_t>(v)] : t.bwd_s[static_cast<size_t>(v)];
        const double start = std::max(free_at, ready);
        free_at = start + dur;
        (op.forward ? f_end : b_end)[at(v, op.micro_batch)] = free_at;
        out.busy_s[static_cast<size_t>(s)] += dur;
        ++i;
        ++ran;
      }
    }
    if (ran == 0) throw std::logic_error("schedule_pipeline: the stage programs wait on each other");
    remaining -= ran;
  }
  out.step_s = *std::max_element(out.end_s.begin(), out.end_s.end());
  out.bubble_s = out.step_s - *std::max_element(out.busy_s.begin(), out.busy_s.end());
  return out;
}

double pipeline_step_closed_form(const PipelineTimes& t) {
  const int64_t P = std::max<int64_t>(1, t.stages), C = std::max<int64_t>(1, t.chunks);
  const int64_t M = std::max<int64_t>(1, t.micro_batches);
  // a stage's time per micro-batch (all its chunks, forward and backward): the slowest, and the
  // sum over stages; the sends of every boundary, forward and backward
  double t_max = 0, t_sum = 0, sends = 0;
  for (int64_t s = 0; s < P; ++s) {
    double ts = 0;
    for (int64_t c = 0; c < C; ++c) {
      const size_t v = static_cast<size_t>(c * P + s);
      if (v < t.fwd_s.size() && v < t.bwd_s.size()) ts += t.fwd_s[v] + t.bwd_s[v];
    }
    t_max = std::max(t_max, ts);
    t_sum += ts;
  }
  for (size_t v = 0; v < t.p2p_fwd_s.size() && v < t.p2p_bwd_s.size(); ++v) sends += t.p2p_fwd_s[v] + t.p2p_bwd_s[v];
  // Fill and drain: the other stages' work, 1/C of it with C chunks (for equal stages the paper's
  // (p - 1) t / v), and every send once. 1F1B: the first stage holds min(p, m) micro-batches, and
  // each later one waits for the round trip of the one p before it (every stage's work and every
  // send), so it costs max(t_max, round trip / p).
  const double m = static_cast<double>(M);
  const double fill = (t_sum - t_max) / static_cast<double>(C) + sends;
  if (C > 1) return m * t_max + fill;
  const double window = static_cast<double>(pipeline_in_flight(P, 1, M, 0));
  const double period = std::max(t_max, (t_sum + sends) / window);
  return std::min(m, window) * t_max + std::max(0.0, m - window) * period + fill;
}

}  // namespace ctx
