// The training loop of one rank: data assignment, micro-batches, gradient reduction, clipping,
// AdamW with warm-up + cosine, measurement of per-phase time and per-category memory.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "costmodel/model_spec.hpp"
#include "costmodel/plan.hpp"
#include "executor/data.hpp"
#include "executor/model.hpp"

namespace ctx::exec {

struct TrainOptions {
  ModelSpec model;
  Plan plan;             // dp resolved
  int64_t seq = 256;
  OptimizerConfig opt;
  uint64_t seed = 1234;  // parameter initialisation
  bool sorted_packing = false;
};

struct StepStats {
  int64_t step = 0;      // 1-based number of the step just taken
  double loss = 0;       // token-weighted mean over the global batch
  double grad_norm = 0;  // before clipping
  float lr = 0;
  double seconds = 0;
  std::array<double, kPhases> phase_seconds{};
  int64_t tokens = 0;    // valid labels in the global batch
};

// Non-finite loss or activations: names the step and the first layer that produced them.
struct DivergedError : std::runtime_error {
  int64_t step;
  int layer;  // layers count from 0; == layers: the loss
  DivergedError(int64_t s, int l, const std::string& what) : std::runtime_error(what), step(s), layer(l) {}
};

class Trainer {
 public:
  // Collective over the world. The dataset is shared by reference and must outlive the trainer.
  Trainer(Backend& be, CommWorld& w, const TrainOptions& o, const Dataset& data);
  StepStats step();
  int64_t steps_done() const { return steps_done_; }
  void set_steps_done(int64_t s) { steps_done_ = s; }
  ParamStore& params() { return *params_; }
  ParallelContext& context() { return pc_; }
  Model& model() { return *model_; }
  const Layout& layout() const { return layout_; }
  const TrainOptions& options() const { return o_; }
  // Records the next step's schedule (the simulator's task names, executor/schedule_trace.hpp).
  void trace_next_step() { trace_next_step_ = true; }
  const std::vector<ScheduleEvent>& schedule() const { return schedule_; }

 private:
  Backend& be_;
  TrainOptions o_;
  const Dataset& data_;
  ParallelContext pc_;
  Layout layout_;
  std::unique_ptr<ParamStore> params_;
  std::unique_ptr<Model> model_;
  Tensor stats_;  // f32 [1, kStepStats]: loss sum, non-finite flag, gradient norm squared
  int64_t steps_done_ = 0;
  bool trace_next_step_ = false;
  std::vector<ScheduleEvent> schedule_;
};

}  // namespace ctx::exec
