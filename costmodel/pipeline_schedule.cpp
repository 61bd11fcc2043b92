#include "costmodel/pipeline_schedule.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

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

double pipeline_step_closed_form(const PipelineTimes& t, std::vector<double>* end_s) {
  const int64_t P = std::max<int64_t>(1, t.stages), C = std::max<int64_t>(1, t.chunks);
  const int64_t M = std::max<int64_t>(1, t.micro_batches), V = P * C;
  // interleaved programs small enough: the exact schedule (2 V M tasks; under ~0.1 ms)
  if (C > 1 && 2 * V * M <= kPipelineExactTasks && M % P == 0) {  // (schedule_pipeline refuses M % P != 0; plan_check too)
    PipelineSchedule exact = schedule_pipeline(t);
    if (end_s) *end_s = std::move(exact.end_s);
    return exact.step_s;
  }
  if (end_s) end_s->assign(static_cast<size_t>(P), 0.0);
  auto f = [&](int64_t v) { return v < static_cast<int64_t>(t.fwd_s.size()) ? t.fwd_s[static_cast<size_t>(v)] : 0.0; };
  auto b = [&](int64_t v) { return v < static_cast<int64_t>(t.bwd_s.size()) ? t.bwd_s[static_cast<size_t>(v)] : 0.0; };
  auto sends = [&](int64_t v) {  // boundary v -> v+1, forward and backward
    const size_t i = static_cast<size_t>(v);
    return (i < t.p2p_fwd_s.size() ? t.p2p_fwd_s[i] : 0.0) + (i < t.p2p_bwd_s.size() ? t.p2p_bwd_s[i] : 0.0);
  };
  const double m = static_cast<double>(M);
  // beyond[s]: (1F1B) a micro-batch's round trip past stage s: forward and backward of the stages
  // after it and the sends between s and the last stage, both ways
  std::vector<double> beyond(static_cast<size_t>(P) + 1, 0.0);
  if (C == 1)
    for (int64_t s = P - 2; s >= 0; --s) beyond[static_cast<size_t>(s)] = beyond[static_cast<size_t>(s) + 1] + f(s + 1) + b(s + 1) + sends(s);
  double step = 0, head = 0, tail = 0;  // head: micro-batch 0's forward reaching stage s (chunk 0); tail: the last backward leaving it
  for (int64_t s = 0; s < P; ++s) {
    double ts = 0;  // stage s's tasks of one micro-batch (all its chunks)
    for (int64_t c = 0; c < C; ++c) ts += f(c * P + s) + b(c * P + s);
    double span = m * ts;  // from its first task's start to its last task's end: at least its work
    if (C == 1) {
      // 1F1B on stage s: w warm-up forwards, then B0 waits for micro-batch 0's round trip past s;
      // at the end, B(M-1) waits for micro-batch M-1's round trip after F(M-1)
      const double fs = f(s), bs = b(s), D = beyond[static_cast<size_t>(s)];
      const int64_t w = pipeline_warmup_forwards(P, 1, M, s);
      const double wd = static_cast<double>(w);
      if (M - 1 <= w)  // every forward before B0: F0..F(M-1), then B0..B(M-1)
        span = std::max({span, std::max(m * fs, fs + D) + m * bs, m * fs + D + bs});
      else  // F0..Fw, B0 at max(F_w's end, F0's end + D), then M-1-w (F, B) pairs up to F(M-1), w B, B(M-1)
        span = std::max(span, fs + std::max(wd * fs, D) + (m - 1 - wd) * (fs + bs) + std::max(wd * bs, D) + bs);
      // the round-trip cycle: F(i + P - s) starts after B(i) ends (program order), B(i) ends at
      // least F(i)'s start + fs + D + bs: every P - s micro-batches cost a round trip
      const int64_t W = P - s, r = (M - 1) % W, q = (M - 1) / W + 1;
      span = std::max(span, static_cast<double>(r) * fs + static_cast<double>(q) * (fs + D + bs));
    }
    step = std::max(step, head + span + tail);
    if (end_s) (*end_s)[static_cast<size_t>(s)] = head + span;
    if (s + 1 < P) {
      head += f(s) + (s < static_cast<int64_t>(t.p2p_fwd_s.size()) ? t.p2p_fwd_s[static_cast<size_t>(s)] : 0.0);
      tail += b(s) + (s < static_cast<int64_t>(t.p2p_bwd_s.size()) ? t.p2p_bwd_s[static_cast<size_t>(s)] : 0.0);
    }
  }
  if (C == 1) {
    // Paths that switch stages: F(j) on stage s starts at least head_s + a_s(j) (its program:
    // j forwards and the backwards before F(j); or k = j / (pp - s) round-trip cycles after F(j - k (pp - s))),
    // micro-batch j's forwards and sends reach stage s2 >= s, whose program from F(j) to its last
    // task runs (M - j) forwards and the backwards from B(j - w_s2) on, then B(M-1)'s chain back
    // to stage 0. The value is linear in j within each residue class mod (pp - s) and each side of
    // w_s and w_s2: the ends of those ranges are the candidates.
    std::vector<double> heads(static_cast<size_t>(P), 0.0), backs(static_cast<size_t>(P), 0.0);
    for (int64_t s = 1; s < P; ++s) {
      heads[static_cast<size_t>(s)] = heads[static_cast<size_t>(s) - 1] + f(s - 1) +
                                      (s - 1 < static_cast<int64_t>(t.p2p_fwd_s.size()) ? t.p2p_fwd_s[static_cast<size_t>(s) - 1] : 0.0);
      backs[static_cast<size_t>(s)] = backs[static_cast<size_t>(s) - 1] + b(s - 1) +
                                      (s - 1 < static_cast<int64_t>(t.p2p_bwd_s.size()) ? t.p2p_bwd_s[static_cast<size_t>(s) - 1] : 0.0);
    }
    for (int64_t s = 0; s < P; ++s) {
      const int64_t W = P - s, w = pipeline_warmup_forwards(P, 1, M, s);
      const double fs = f(s), bs = b(s), R = fs + beyond[static_cast<size_t>(s)] + bs;
      auto a = [&](int64_t j) {
        const int64_t k = j / W;
        return std::max(static_cast<double>(j) * fs + static_cast<double>(std::max<int64_t>(0, j - w)) * bs,
                        static_cast<double>(j - k * W) * fs + static_cast<double>(k) * R);
      };
      for (int64_t s2 = s; s2 < P; ++s2) {
        const int64_t w2 = pipeline_warmup_forwards(P, 1, M, s2);
        auto path = [&](int64_t j) {
          if (j < 0 || j >= M) return;
          const double to_end = heads[static_cast<size_t>(s)] + a(j) + heads[static_cast<size_t>(s2)] - heads[static_cast<size_t>(s)] +
                                static_cast<double>(M - j) * f(s2) + static_cast<double>(M - std::max<int64_t>(0, j - w2)) * b(s2);
          if (end_s) (*end_s)[static_cast<size_t>(s2)] = std::max((*end_s)[static_cast<size_t>(s2)], to_end);
          step = std::max(step, to_end + backs[static_cast<size_t>(s2)]);
        };
        for (int64_t rho = 0; rho < W && rho < M; ++rho) {
          path(rho);
          path(rho + (M - 1 - rho) / W * W);
          for (int64_t edge : {w2, w + 1})
            if (edge > rho) {
              const int64_t j = rho + (edge - 1 - rho) / W * W;
              path(j);
              path(j + W);
            }
        }
      }
    }
  }
  if (end_s) (*end_s)[0] = step;  // stage 0's last backward is the schedule's last task
  if (C > 1 && M % P == 0) {
    // A long interleaved program: the exact schedules of the two longest programs under
    // kPipelineExactTasks, M2 and M1 = M2 - pp micro-batches, extrapolated by their difference per
    // group of pp micro-batches (the steady state repeats per group once the schedule has settled;
    // tests/test_pipeline_schedule.cpp checks it against the exact step), never below the paths.
    const int64_t M2 = kPipelineExactTasks / (2 * V) / P * P, M1 = M2 - P;
    if (M1 >= 2 * P && M2 < M) {
      PipelineTimes shorter = t;
      shorter.micro_batches = M2;
      const PipelineSchedule s2 = schedule_pipeline(shorter);
      shorter.micro_batches = M1;
      const PipelineSchedule s1 = schedule_pipeline(shorter);
      const double groups = static_cast<double>(M - M2) / static_cast<double>(P);
      step = std::max(step, s2.step_s + groups * (s2.step_s - s1.step_s));
      if (end_s)
        for (int64_t s = 0; s < P; ++s) {
          const size_t i = static_cast<size_t>(s);
          (*end_s)[i] = std::max((*end_s)[i], s2.end_s[i] + groups * (s2.end_s[i] - s1.end_s[i]));
        }
      if (end_s) (*end_s)[0] = step;
    }
  }
  return step;
}

}  // namespace ctx
