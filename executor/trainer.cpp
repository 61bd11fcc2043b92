#include "executor/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace ctx::exec {

Trainer::Trainer(Backend& be, CommWorld& w, const TrainOptions& o, const Dataset& data)
    : be_(be), o_(o), data_(data), pc_(make_parallel_context(w, o.plan)) {
  layout_ = make_layout(o_.model, o_.plan, pc_.coord.tp, o_.seq);
  params_ = std::make_unique<ParamStore>(be_, pc_, o_.model, layout_, o_.seed);
  model_ = std::make_unique<Model>(be_, pc_, o_.model, layout_, *params_);
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
  StepStats st;
  double loss_sum = 0;
  int bad_layer = -1;
  for (size_t b0 = 0; b0 < mine.size(); b0 += static_cast<size_t>(p.mbs)) {
    std::vector<const Sequence*> batch;
    for (size_t b = b0; b < std::min(mine.size(), b0 + static_cast<size_t>(p.mbs)); ++b) batch.push_back(&mine[b]);
    SequenceMeta meta = make_sequence_meta(pc_, batch);
    MicroResult r = model_->forward_backward(meta, weight);
    loss_sum += r.loss_sum;
    if (bad_layer < 0) bad_layer = r.first_bad_layer;
    for (int i = 0; i < kPhases; ++i) st.phase_seconds[i] += r.phase_seconds[i];
  }
  const auto t_opt = Clock::now();
  be_.ledger().set_phase(Phase::optimizer);
  // divergence: the smallest bad layer over all ranks (encoded so that max picks it)
  int code = bad_layer < 0 ? 0 : static_cast<int>(o_.model.layers) + 1 - bad_layer;
  pc_.world_comm->allreduce_max(&code, 1);
  if (code > 0) {
    int layer = static_cast<int>(o_.model.layers) + 1 - code;
    std::string where = layer == static_cast<int>(o_.model.layers) ? "the loss" : "layer " + std::to_string(layer);
    throw DivergedError(steps_done_ + 1, layer,
                        "non-finite values at step " + std::to_string(steps_done_ + 1) + ", first produced by " + where +
                            " (" + (layer == static_cast<int>(o_.model.layers) ? "cross-entropy" : "its output") + ")");
  }
  params_->reduce_grads();
  double total = loss_sum;
  pc_.zero->allreduce_sum(&total, 1);  // TP ranks hold the same loss: sum over dp x cp only
  st.loss = total / static_cast<double>(std::max<int64_t>(1, n_tokens));
  st.tokens = n_tokens;
  st.grad_norm = params_->grad_norm();
  float scale = 1.0f;
  if (o_.opt.clip > 0 && st.grad_norm > o_.opt.clip) scale = static_cast<float>(o_.opt.clip / (st.grad_norm + 1e-6));
  ++steps_done_;
  st.step = steps_done_;
  st.lr = learning_rate(o_.opt, steps_done_);
  params_->optimizer_step(o_.opt, steps_done_, scale);
  const auto t_end = Clock::now();
  st.phase_seconds[static_cast<int>(Phase::optimizer)] = std::chrono::duration<double>(t_end - t_opt).count();
  st.seconds = std::chrono::duration<double>(t_end - t_start).count();
  be_.ledger().set_phase(Phase::forward);
  return st;
}

}  // namespace ctx::exec
