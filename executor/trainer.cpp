#include "executor/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace ctx::exec {

Trainer::Trainer(Backend& be, CommWorld& w, const TrainOptions& o, const Dataset& data)
    : be_(be), o_(o), data_(data), pc_(make_parallel_context(w, be, o.plan)) {
  if (be.annotates())  // only backends that name profiler ranges pay for the labels
    pc_.trace.on_task = [&be](const ScheduleEvent& e) {
      std::string label = e.layer >= 0 ? std::string("L") + std::to_string(e.layer) + " " : std::string();
      label += std::string(to_string(e.pass)) + " " + e.name + " mb" + std::to_string(e.micro_batch);
      be.annotate_task(label, e.stream != SimStream::compute);
    };
  layout_ = make_layout(o_.model, o_.plan, pc_.coord.tp, o_.seq);
  params_ = std::make_unique<ParamStore>(be_, pc_, o_.model, layout_, o_.seed);
  model_ = std::make_unique<Model>(be_, pc_, o_.model, layout_, *params_);
  stats_ = be_.alloc(1, kStepStats, DType::f32, Mem::runtime);
}

StepStats Trainer::step() {
  using Clock = std::chrono::steady_clock;
  const auto t_start = Clock::now();
  const Plan& p = pc_.plan;
  const int64_t per_rank = p.ga * p.mbs;
  auto assign = step_assignment(data_, steps_done_, p.dp, per_rank, o_.sorted_packing);
  // every rank counts the valid labels of the whole global batch: the loss is a token-weighted mean
  int64_t n_tokens = 0;
  std::vector<Sequence> mine;
  for (int64_t r = 0; r < p.dp; ++r)
    for (int64_t idx : assign[r]) {
      Sequence s = data_.sequence(idx);
      for (int32_t l : s.labels) n_tokens += (l >= 0);
      if (r == pc_.coord.dp) mine.push_back(std::move(s));
    }
  const float weight = 1.0f / static_cast<float>(std::max<int64_t>(1, n_tokens));
  params_->zero_grads();
  be_.zero(stats_);
  int slot = 0;
  pc_.trace.enabled = trace_next_step_;
  for (size_t b0 = 0; b0 < mine.size(); b0 += static_cast<size_t>(p.mbs)) {
    std::vector<const Sequence*> batch;
    for (size_t b = b0; b < std::min(mine.size(), b0 + static_cast<size_t>(p.mbs)); ++b) batch.push_back(&mine[b]);
    DeviceBatch dev = upload_batch(be_, make_sequence_meta(pc_, batch));  // the micro-batch's one upload
    pc_.trace.micro_batch = slot / 4;
    const bool last = b0 + static_cast<size_t>(p.mbs) >= mine.size();
    model_->forward_backward(dev, weight, stats_, slot, last);
    slot += 4;
  }
  be_.mark_time(slot);
  be_.ledger().set_phase(Phase::optimizer);
  be_.annotate_phase("optimizer");
  // on the device: the non-finite flag over all ranks (AdamW skips on it), the norm (gradients
  // were reduced behind the backward), clipping and AdamW, the loss summed over dp x cp (TP ranks
  // hold the same loss)
  pc_.trace.pass = SimPass::optimizer;
  pc_.world_comm->allreduce_max(stats_.flat(kStatNonFinite, 1));
  params_->grad_norm2(stats_);
  params_->optimizer_step(o_.opt, steps_done_ + 1, stats_);
  pc_.zero->allreduce_sum(stats_.flat(kStatLossSum, 1));
  be_.mark_time(slot + 1);
  if (trace_next_step_) {
    schedule_ = std::move(pc_.trace.events);
    pc_.trace.events.clear();
    pc_.trace.enabled = trace_next_step_ = false;
  }
  float host_stats[kStepStats];
  be_.download(host_stats, stats_);  // the one scalar read of the step
  const auto t_end = Clock::now();
  const std::vector<double> times = be_.read_times();
  be_.ledger().set_phase(Phase::forward);

  const int64_t L = o_.model.layers;
  if (host_stats[kStatNonFinite] != 0.0f) {
    const int64_t layer = nonfinite_layer(host_stats[kStatNonFinite], L);
    std::string where = layer == L ? "the loss" : "layer " + std::to_string(layer);
    throw DivergedError(steps_done_ + 1, static_cast<int>(layer),
                        "non-finite values at step " + std::to_string(steps_done_ + 1) + ", first produced by " + where +
                            " (" + (layer == L ? "cross-entropy" : "its output") + "); the update was skipped");
  }
  const double norm2 = host_stats[kStatGradNorm2];
  if (!std::isfinite(norm2))
    throw DivergedError(steps_done_ + 1, -1,
                        "non-finite gradient norm at step " + std::to_string(steps_done_ + 1) +
                            " with finite activations and loss; the update was skipped");
  StepStats st;
  st.loss = host_stats[kStatLossSum] / static_cast<double>(std::max<int64_t>(1, n_tokens));
  st.tokens = n_tokens;
  st.grad_norm = std::sqrt(norm2);
  ++steps_done_;
  st.step = steps_done_;
  st.lr = learning_rate(o_.opt, steps_done_);
  auto span = [&](int a, int b) {
    return (a < static_cast<int>(times.size()) && b < static_cast<int>(times.size()) && times[a] >= 0 && times[b] >= 0)
               ? times[b] - times[a]
               : 0.0;
  };
  for (int s0 = 0; s0 < slot; s0 += 4) {
    st.phase_seconds[static_cast<int>(Phase::forward)] += span(s0, s0 + 1);
    st.phase_seconds[static_cast<int>(Phase::loss)] += span(s0 + 1, s0 + 2);
    st.phase_seconds[static_cast<int>(Phase::backward)] += span(s0 + 2, s0 + 3);
  }
  st.phase_seconds[static_cast<int>(Phase::optimizer)] = span(slot, slot + 1);
  st.seconds = std::chrono::duration<double>(t_end - t_start).count();
  return st;
}

}  // namespace ctx::exec
