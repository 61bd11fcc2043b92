// Pipeline-parallel schedules: Megatron's 1F1B (PipeDream-Flush) and interleaved 1F1B, as the
// program order each stage runs (megatron/core/pipeline_parallel/schedules.py) and as an exact
// longest path over (stage, chunk, micro-batch, forward|backward) tasks with the point-to-point
// sends between stages on the edges. Pure arithmetic on given per-task seconds: what a stage's
// layers cost comes from the step model or the event simulator (pipeline_time.hpp).
#pragma once
#include <cstdint>
#include <vector>

namespace ctx {

// One task of a stage's program: the forward or backward of micro-batch `micro_batch` through
// the stage's model chunk `chunk` (virtual stage chunk * stages + stage).
struct PipelineOp {
  bool forward = true;
  int64_t chunk = 0;
  int64_t micro_batch = 0;
};

// The order stage `stage` (0-based, of `stages`) runs its tasks with `chunks` model chunks per
// stage (1 = 1F1B, >1 = interleaved) and `micro_batches` micro-batches. Megatron: warm-up
// forwards (stages - stage - 1 for 1F1B; 2 (stages - stage - 1) + (chunks - 1) stages for the
// interleaved schedule, at most all of them), then one forward and one backward alternately,
// then the remaining backwards. Interleaved: micro-batches go through the chunks in groups of
// `stages` (microbatch_group_size_per_vp_stage = pp), which needs micro_batches % stages == 0.
std::vector<PipelineOp> pipeline_stage_order(int64_t stages, int64_t chunks, int64_t micro_batches, int64_t stage);

// Megatron's warm-up forwards on `stage` (schedules.py): stages - stage - 1 for 1F1B
// (forward_backward_pipelining_without_interleaving); 2 (stages - stage - 1) + (chunks - 1) stages
// for the interleaved schedule (forward_backward_pipelining_with_interleaving, with
// microbatch_group_size_per_vp_stage = pp); at most micro_batches * chunks.
int64_t pipeline_warmup_forwards(int64_t stages, int64_t chunks, int64_t micro_batches, int64_t stage);

// The most (chunk, micro-batch) forwards a stage holds at once (forward done, backward not yet):
// what its activations must keep: the warm-up forwards plus the steady state's one, at most all
// (1F1B: min(stages - stage, micro_batches)). Allocation-free.
int64_t pipeline_in_flight(int64_t stages, int64_t chunks, int64_t micro_batches, int64_t stage);

// Seconds of one micro-batch's tasks. Virtual stage v = chunk * stages + stage runs its chunk's
// layers (pipeline_stages.hpp pipeline_chunk_layers: L/(stages*chunks) each when even).
struct PipelineTimes {
  int64_t stages = 1, chunks = 1, micro_batches = 1;
  std::vector<double> fwd_s, bwd_s;          // [virtual stage]: forward / backward of one micro-batch
  std::vector<double> p2p_fwd_s, p2p_bwd_s;  // [v]: activation v -> v+1 / its gradient v+1 -> v (size V-1)
};

struct PipelineSchedule {
  double step_s = 0;                 // the last backward's end
  std::vector<double> end_s;         // [stage]: when its last task ends
  std::vector<double> busy_s;        // [stage]: seconds its tasks run
  double bubble_s = 0;               // step_s minus the busiest stage's busy seconds
  int64_t tasks = 0;
};

// Exact: every task starts when its stage has finished the previous task of its program and its
// input has arrived (the previous virtual stage's forward plus the send, or the next virtual
// stage's backward plus the send; the last virtual stage's backward follows its own forward).
// Throws std::logic_error on a schedule that deadlocks (cannot happen for valid inputs).
PipelineSchedule schedule_pipeline(const PipelineTimes& t);

// Closed form (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
// Clusters Using Megatron-LM", sec. 2.2): m micro-batches of the slowest stage's time t = tf + tb,
// plus the fill and drain: the other stages' time, divided by v chunks per stage (the paper's
// bubble (p - 1) t / v for equal stages), and every send between stages once. 1F1B also bounds
// the period by a micro-batch's round trip (all stages and sends) over the p micro-batches the
// first stage holds. Exact without sends for equal stages and for heavier end stages (a head and
// loss on the last, the embedding on the first); with sends within their sum of schedule_pipeline
// (tests/test_pipeline_schedule.cpp). It assumes one bottleneck stage: with two or more heavy stages
// next to each other (an uneven split's middle stages, pp_first/pp_last) 1F1B runs them a
// micro-batch's round trip apart and the closed form is above the exact schedule (stages of 1, 4,
// 4, 1 layers, 4 micro-batches: 66 vs 63 layer-forwards, tests/test_pipeline_stages.cpp; the
// difference is at most the light stages' times). The search ranks with it; predict and the
// finalists run the exact schedule.
double pipeline_step_closed_form(const PipelineTimes& t);

}  // namespace ctx
