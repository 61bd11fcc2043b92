// Plan search: enumerate every plan the Plan schema can express for a model, cluster and
// sequence length; prune by device and host memory (the memory model, ~100 ns a plan); rank the
// survivors by the closed-form step time; refine the finalists with the event simulator; report
// the top K with why each wins and the Pareto frontier of step time vs peak memory.
// Deterministic: one thread, fixed enumeration order, ties broken by the plan's text.
#pragma once
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "costmodel/memory_model.hpp"
#include "costmodel/model_spec.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/runtime_profile.hpp"
#include "costmodel/step_model.hpp"

namespace ctx {

enum class Objective { time, memory };

struct SearchRequest {
  ModelSpec model;
  ClusterSpec cluster;
  RuntimeProfile runtime;
  int64_t seq = 0;
  int64_t global_batch_tokens = 0;  // 0: one sequence per data-parallel rank (mbs = ga = 1)
  Objective objective = Objective::time;
  Plan base;                        // mask, documents, packing and precision are taken from here
  json fixed_fields = json::object(); // plan_to_json fields every plan tried keeps (--plan of every search command;
                                      // fixed_plan_fields); base holds their values
  // constraints (empty = all allowed)
  std::vector<CpKind> cp_kinds;
  bool allow_offload = true;
  std::vector<int64_t> tp_values, cp_values;  // restrict degrees (empty = all valid)
  std::vector<int64_t> pp_values;   // pipeline stages to try (empty = 1 and the divisors of the layers up to 16)
  int top_k = 10;
  // Objective::time: a pipeline plan (pp > 1) whose tokens/s cannot reach the best max(refine,
  // top_k + 1) priced so far (pipeline_step_lower_bound_s) is not priced: it goes to
  // SearchResult::unpriced, unless it could stand on the Pareto frontier (then it is priced after
  // all). The ranking's first max(refine, top_k + 1) plans and the frontier are the same as without.
  bool prune_pipeline = true;
  int refine = 200;                 // finalists re-ranked by the event simulator (issue 15: tenfold the
                                    // 20 of the event-queue simulator, the 1024-GPU search still under 1 s);
                                    // beyond the first 20 only those whose ring attention is at most
                                    // 128 x 128 simulated (rank, step) pairs a layer (search.cpp)
};

struct Candidate {
  Plan plan;
  double peak_bytes = 0, capacity_bytes = 0, host_bytes_per_node = 0;
  bool fits = false;
  StepTime time;                    // closed form, or simulated for refined finalists
  bool simulated = false;
  std::string why;                  // for the top K: what makes it win or lose against its neighbour
  double tokens_per_second_bound = 0;  // unpriced plans (SearchResult::unpriced): at most this many tokens/s
  double tokens_per_step() const { return time.tokens_per_second * time.step_seconds; }
  double seconds_per_token() const { return time.tokens_per_second > 0 ? 1.0 / time.tokens_per_second : 1e300; }
};

struct SearchResult {
  std::vector<Candidate> ranked;    // fitting plans priced, best first (all of them unless pruned: unpriced)
  std::vector<Candidate> pareto;    // fitting plans no other beats on both step time and peak memory
  std::vector<Candidate> unpriced;  // fitting pipeline plans pruned by their time bound (prune_pipeline), no time
  Candidate closest;                // when nothing fits: the plan that comes nearest
  int64_t enumerated = 0, valid = 0, fitting = 0, simulated = 0;  // fitting: ranked and unpriced
  double seconds = 0;
  bool cancelled = false;
  std::string no_fit_reason;        // when nothing fits: the tightest constraint and what would help
  int64_t not_dividing = 0;         // plans refused because their layout does not divide req.seq (pad=1 would pad it)
  bool lower_precision = false;     // no plan fits at the runtime's own optimizer precision: the ranked plans are
                                    // each at the most precise lower variant that fits (lower_precision_variants)
};

// The optimizer precisions (master, grads, moments) the search tries beyond the runtime's own: every
// combination of the values the runtime's capabilities allow (a field --plan gives at its value),
// the runtime's own combination left out, most precise first (most model-state bytes per
// parameter). Empty for a runtime without capabilities. The search prices them only when no plan
// fits at the runtime's own precision; maxseq reports the longest they reach beside its answer.
std::vector<StateDtypes> lower_precision_variants(const SearchRequest& req);
// The longest sequence any plan of the search space trains at the least-bytes variant of
// lower_precision_variants (the longest any variant reaches: memory falls with the bytes); 0 when
// there is none or nothing fits. `best` receives the plan (its master/grads/moments set).
// at_least: as max_trainable_seq_any's (maxseq passes the answer at the runtime's own precision);
// seed: a plan of the space bisected first (maxseq's answer), which only makes it faster.
int64_t max_trainable_seq_lower_precision(const SearchRequest& req, int64_t hi, Plan* best, int64_t at_least = 0,
                                          const Plan* seed = nullptr);

// `progress(done_fraction)` is called now and then; returning false cancels (partial results kept).
SearchResult search_plans(const SearchRequest& req, const std::function<bool(double)>& progress = {});

// Every plan the search enumerates for a world size (valid or not), in search order.
std::vector<Plan> enumerate_plans(const SearchRequest& req);

// The longest sequence any plan of the search space trains on `cluster` (bisection per plan
// family); `best` receives the plan. 0 when nothing fits even at the smallest sequence.
// Plans it tries keep req.fixed_fields (every key the user gave).
// at_least > 0: only plans that train longer than it are bisected; returns at_least (and leaves
// `best` alone) when none does.
int64_t max_trainable_seq_any(const SearchRequest& req, int64_t hi, Plan* best, int64_t at_least = 0);

// The plan_to_json fields that the keys of `text` (key=value,...) fix: a key the JSON carries as
// such, else every field the key moves from the defaults (a shorthand such as cp_kind=ulysses).
json fixed_plan_fields(const std::string& text, const std::string& where);
// Whether the plan has every one of those fields at its value.
bool keeps_fixed_fields(const Plan& p, const json& fixed);
// Throws InputError(where, field, ...) when no plan of the search space keeps req.fixed_fields
// (valid at req.seq when req.seq > 0): the first key that alone leaves no plan, with the values the
// search's plans give it, else the keys no plan has together; with a plan check's reason.
void check_constraints(const SearchRequest& req, const std::string& where);

}  // namespace ctx

namespace ctx {
// When nothing fits: what would (the longest sequence that fits here, the fewest nodes that fit
// this sequence, whether allowing offload would), as sentences.
std::string no_fit_advice(const SearchRequest& req);
// The same cluster with `gpus` GPUs (whole nodes beyond one node).
ClusterSpec resized_cluster(const ClusterSpec& c, int64_t gpus);
}  // namespace ctx
