// Simulation of one training step. Every simulated rank has five in-order streams:
// compute, tp (TP and Ulysses collectives, on the critical path), ring (context-parallel p2p),
// dp (ZeRO-3 parameter gathers and gradient reductions, overlapped with compute) and host
// (offload copies and the CPU optimizer). Tasks carry the dependencies a real runtime has; a
// collective starts when every simulated member has reached it; a ring transfer starts when the
// sender has the block. Ranks of a CP group are all simulated unless their attention work is
// identical (then one stands for all); TP ranks are symmetric and collapsed; data-parallel ranks
// are represented by the heaviest and the lightest pack when document packing makes them differ.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "costmodel/json_util.hpp"
#include "costmodel/step_model.hpp"

namespace ctx {

enum class SimStream : uint8_t { compute, tp, ring, dp, host, count };
constexpr int kSimStreams = static_cast<int>(SimStream::count);
const char* to_string(SimStream s);

enum class SimPass : uint8_t { forward, recompute, backward, optimizer };
enum class SimCategory : uint8_t { compute, comm, host, optimizer };

struct SimTask {
  const char* name = "";    // static string
  double duration = 0;
  double ready = 0;         // when its own rank's dependencies were met
  double start = -1, end = -1;
  int32_t rep = 0;
  int32_t layer = -1;
  int32_t micro_batch = 0;
  int32_t collective = -1;  // tasks sharing an id start together (a collective across simulated ranks)
  SimStream stream = SimStream::compute;
  SimPass pass = SimPass::forward;
  SimCategory category = SimCategory::compute;
};

struct SimRep {
  int64_t rank = 0;         // a global rank it stands for
  int64_t cp_index = 0;
  int pack_class = 0;       // 0: heaviest pack (or all packs equal), 1: lightest
  int64_t stands_for = 1;   // how many ranks share its schedule
  std::string label;
  double compute_stream_busy_s = 0;  // summed durations of its compute-stream tasks (optimizer included)
  double end_s = 0;                  // when its last task ends
};

struct SimStats {
  int64_t tasks = 0;
  int64_t events = 0;            // finish events processed
  int64_t started_twice = 0;     // must be 0
  int64_t never_ran = 0;         // must be 0 (a dependency cycle or a collective missing a member)
  int64_t time_regressions = 0;  // events popped earlier than the previous one; must be 0
  int64_t periodic_jumps = 0;    // layer loops cut short by periodicity (without a recording)
  int64_t layers_extrapolated = 0;  // layer iterations taken on the line of the previous ones, not swept
  int64_t micro_batches_extrapolated = 0;  // whole micro-batches taken on the line of the previous ones
  int64_t jump_misses = 0;       // jumps whose check failed (each cost one swept iteration)
  int64_t far_first_misses = 0;  // of those, checks at the farthest distance first, every rank at one pace (Period::jump)
  int64_t partial_jumps = 0;     // forward layer stretches where only the ranks off their lines were swept
  int64_t layers_partially_swept = 0;  // layer iterations in them (the others' ranks moved along their lines)
  int64_t partial_misses = 0;    // such stretches undone by their far-end check
  int64_t partial_rank_layers = 0;  // ranks swept in them, summed over their layer iterations
  int64_t rise_searches = 0;     // stretches of a forward ring's rises taken at once (ring_forward_by_rank's compute-bound runs)
  int64_t kinks_predicted = 0;   // jumps whose first check went where the margin tape put a line's end (Period::jump)
  int64_t kink_misses = 0;       // of those, checks that failed (a maximum the tape does not see flipped first)
  double wall_seconds = 0;       // how long the simulation itself took
};

struct SimResult {
  StepTime time;
  std::vector<SimRep> reps;
  std::vector<SimTask> tasks;    // in creation order (program order per stream)
  std::vector<std::vector<int32_t>> deps;  // deps[i]: tasks i waited for (kept for tests and the GUI)
  SimStats stats;
  int critical_rep = 0;          // finishes last
  int breakdown_rep = 0;         // the rank the breakdown is taken on (the one that waits most)
};

// Where one simulation's time went, layer iteration by layer iteration (opt-in: simulate_step's
// `profile`; `bench_simulator --one` prints it with CTX_BENCH_LAYERS=1). What runs between the
// iterations (Period's snapshots and checks, the loss, the optimizer) is not in it.
struct SimLayerRun {
  enum Kind : uint8_t {
    swept,    // a layer iteration of the loop, every simulated rank swept
    probe,    // a jump's check at its far end (Period::jump; partial_jump's verifying sweep), or a layer of a micro-batch's check
    partial,  // a layer of a forward partial sweep: only the ranks off their lines swept (swept_ranks)
  };
  Kind kind = swept;
  SimPass pass = SimPass::forward;  // the loop: forward or backward (its recompute pass included)
  int32_t layer = 0;
  int64_t micro_batch = 0;
  double cpu_s = 0;            // the simulating thread's CPU time for the iteration
  int64_t swept_ranks = 0;     // ranks swept
  int64_t ring_computed = 0;   // backward ring ranks computed in closed form (ring_backward.hpp; a failed attempt's too)
  int64_t ring_moved = 0;      // backward ring ranks moved from the layer before instead
  int64_t ring_gave_way = 0;   // backward ring closed forms that gave way to the step-by-step sweep
};
struct SimProfile {
  std::vector<SimLayerRun> runs;  // in the order they ran
};
// The calling thread's CPU time in seconds (SimLayerRun::cpu_s; bench_simulator's measurements).
double thread_cpu_seconds();

// What simulate_step keeps besides the step time and its breakdown.
enum class SimRecord : uint8_t {
  none,   // nothing per task: a single sweep in creation order, memory independent of the task count
  tasks,  // every task and its dependencies (SimResult::tasks, ::deps): the trace, the GUI, the tests
};

// True when every CP rank's attention work is the same (then one simulated rank stands for all).
bool cp_ranks_alike(const StepCosts& k);
// (simulated ranks) x (ring steps): what one layer's attention costs the sweep. A plain ring of R
// unequal ranks costs R^2 per layer and pass, and dominates the simulation time (seconds at R = 1024).
int64_t ring_steps_per_layer(const StepCosts& k);

// Simulates one step of `k` (from step_costs with per_step = true) under plan `p`. Tasks are created
// in dependency order, so one pass in creation order gives every start and end (a task starts when
// its dependencies have ended; the members of a collective, created together, when the last of them
// is ready); per stream only the last task is kept unless `record` asks for the tasks. Without a
// recording, ring steps run on flat arrays and layer iterations and micro-batches whose state moves
// along a line are jumped (checked at the far end; see Period in simulator.cpp): equal to the full
// sweep up to rounding (3.8e-13 relative on tests/test_simulator_oracle.cpp's 106 plans). With a
// recording every task is swept, bit-identical to simulate_step_reference.
//
// Without a recording, a backward ring of at least `ring_closed_form_min_ranks` simulated ranks
// runs rank by rank in closed form (costmodel/ring_backward.hpp: O(ranks x pieces) per layer
// instead of O(ranks x steps)); smaller ones are swept step by step on flat arrays, four ranks per
// operation (ring_backward_sweep), which is faster there (whole simulations of the 70B/1M plain
// rings with recompute, thread CPU time, same runs: the sweep 1.6x faster at 128 ranks, the closed
// form 1.4x faster at 256, 2.6x at 512 and 3.6x at 1024; bench/bench_simulator.cpp). The tests pass
// 2 to take the closed form on small rings too.
//
// Without a recording, the forward layer loop of a plain ring of at least `partial_sweep_min_ranks`
// unequal ranks sweeps only the ranks that leave their lines where the whole state does not move on
// one: the others move along their lines, which a full sweep at the far end checks, as Period checks
// a jump (partial_jump in simulator.cpp states the argument). Below 128 ranks the bookkeeping costs
// more than it saves (the space's plain rings, thread CPU, all plans of a class summed, partial
// against whole-layer sweeps: cp=8 1.5x, cp=16 1.3x, cp=32 1.15x, cp=64 1.0x the time; cp=128
// 0.92-0.96x, cp=256-512 0.88-0.98x). The tests pass 4 to take it on small rings too.
//
// Without a recording, `predict_line_ends` tapes how far each maximum's losing arguments are
// below it in the swept layer iterations; where two of them lie on a line, the jump is checked
// first at the last distance before a closing margin would flip its maximum (Margins in
// simulator.cpp): a guess checked like any probe, so the results do not depend on it beyond
// rounding, only the number of swept iterations does. false: the search without the guess
// (bench_simulator --one measures both; a test needs the search's own far-first probe).
constexpr int kRingClosedFormMinRanks = 256;
constexpr int kPartialSweepMinRanks = 128;
// `profile` (given): every layer iteration's kind, CPU time and ranks, appended (the results are
// the same with and without it).
SimResult simulate_step(const StepCosts& k, const Plan& p, SimRecord record = SimRecord::tasks,
                        int ring_closed_form_min_ranks = kRingClosedFormMinRanks, int partial_sweep_min_ranks = kPartialSweepMinRanks,
                        bool predict_line_ends = true, SimProfile* profile = nullptr);

// The event-queue implementation it replaced (every task stored, a priority queue): the oracle of
// tests/test_simulator_oracle.cpp and the baseline of bench/bench_simulator.cpp. Same results.
SimResult simulate_step_reference(const StepCosts& k, const Plan& p);

// Chrome trace (chrome://tracing, Perfetto): one process per simulated rank, one thread per stream.
json chrome_trace(const SimResult& r, const std::string& title);

}  // namespace ctx
