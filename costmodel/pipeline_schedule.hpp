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

// Interleaved programs of at most this many tasks (2 * stages * chunks * micro_batches) are
// scheduled exactly by pipeline_step_closed_form (schedule_pipeline: ~0.1 ms at 4096 tasks, ~1 ms
// here on the build machine).
constexpr int64_t kPipelineExactTasks = 16384;

// The search's fast step (no task list): the longest of these paths of the exact schedule, each a
// lower bound of schedule_pipeline's step (so never above it), for every stage s:
//   micro-batch 0's forward reaching stage s (chunk 0: the forwards and sends of stages < s)
//   + stage s's span from its first task's start to its last task's end
//   + micro-batch M-1's backward leaving stage s (chunk 0: backwards and sends of stages < s).
// The span is at least M t_s (t_s: stage s's forward and backward of one micro-batch, all its
// chunks). With one chunk (1F1B) also: B0 waits for micro-batch 0's round trip past s (D_s: the
// later stages' forward and backward and the sends between, both ways) after F0, while the stage
// runs its w_s = pp - s - 1 warm-up forwards; B(M-1) waits for D_s after F(M-1) while it runs w_s
// backwards: span >= f_s + max(w_s f_s, D_s) + (M - 1 - w_s) t_s + max(w_s b_s, D_s) + b_s; and
// F(i + pp - s) follows B(i) in the program, which ends at least f_s + D_s + b_s after F(i) starts.
// And paths through two stages s <= s2: stage s's program (or those round-trip cycles) up to F(j),
// micro-batch j's forwards down to s2, s2's program from F(j) to its last task, the chain back.
// The bubble is then set by the slowest stage and the fill and drain path to it, not by the sum of
// the other stages: a middle-heavy split (stages 1, 4, 4, 1 layers) pays the light first stage
// and the heavy stages before the last heavy one, not the light last stage
// (tests/test_pipeline_stages.cpp derives 63 by hand). Narayanan et al. 2021 (sec. 2.2)'s
// (m + p - 1) t for equal stages is the case s = p - 1. Measured against schedule_pipeline
// (tests/test_pipeline_schedule.cpp; 90,000 random Megatron splits of 32-128 layers, pp 2-8, a
// head of 0-4 layers): 1F1B without sends exact; with sends up to half a layer's forward per
// boundary at most 4.1% below (0.6% for even splits). Interleaved (chunks > 1): the exact
// schedule up to kPipelineExactTasks tasks. Beyond, the M t_s path alone is up to 25% below for
// pp_first/pp_last splits with vpp whose first and last stages are about equally the slowest
// (interleaving then runs a steady period above t_max: 32.2 vs 24 per micro-batch for chunks
// 2,2,2,2,2,2,2,1 layers and a 4-layer head, pp=8, vpp=4, a cycle through both ends these paths
// do not price), so the two longest exact programs under the limit are extrapolated per group of
// pp micro-batches (exact once the schedule repeats itself per group): equal to the exact step
// (1e-13) over 545 random Megatron splits with vpp 2-4, pp 2-16 and up to 40 groups more than the
// limit. Never above schedule_pipeline but for that extrapolation; never below the
// paths (the search's lower bound, pipeline_time.hpp, rests on that).
// `end_s`, when given, gets [stage]: a lower bound of when its last task ends (head + span; stage
// 0's is the step: its last backward ends the schedule), exact where the schedule is run.
double pipeline_step_closed_form(const PipelineTimes& t, std::vector<double>* end_s = nullptr);

}  // namespace ctx
