// The backward ring's schedule in closed form, rank by rank. In the backward each ring step has,
// per rank r (upstream neighbour q): the receive of the next block (after r's previous hop on the
// shared ring stream, r's previous receive and q's previous receive), the step's compute (after r's
// previous compute and the block), and the dK,dV hop from q (after r's receive, q's compute of the
// step and q's previous hop). A rank's times over the steps are piecewise linear in the step with a
// handful of pieces (pl::Seq), so a rank costs O(pieces), not O(steps): O(ranks x pieces) per layer
// instead of the sweep's O(ranks x steps) (the 1024-rank plain ring: ~1M task triples per layer).
//
// Going around the ring, rank r's step j depends on rank r - k only at steps <= j - k + 1 (every
// hop to the next rank costs a step but the last, a hop's wait for the upstream compute of the
// same step). So the last rank of a cycle depends on the first only through the first's compute
// at the first step and its state before it: one pass around the cycle with the first rank's
// upstream taken as a lower bound makes the last rank exact, a second pass makes every rank exact,
// and a comparison of the last rank's times in the two passes checks it (more passes, or the
// caller's sweep, if it did not hold).
//
// The layers of a pass are alike, and after the first few most ranks' times move by a constant
// from one layer to the next (the ranks still catching up, a band shrinking like R/layer, do not):
// a rank whose inputs and upstream's sequences are the previous call's moved by one constant is
// the previous call's rank moved (every recurrence is a max or a sum, no maximum with 0 binds), so
// it costs a comparison of a few pieces instead of its closed form (RingBackwardStore::prev_rank).
#pragma once
#include <cstdint>
#include <limits>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "costmodel/piecewise_linear.hpp"

namespace ctx {

// One rank's state when the closed form takes over (after step j0 - 1).
struct RingBackwardRank {
  const std::vector<double>* cost = nullptr;  // its compute per ring step (negative: 0; past its end: 0)
  int prev = 0;                  // the rank it receives from
  double have_start = 0, have_end = 0, have_ready = 0;  // the receive that delivered step j0's block
  bool dkv_valid = false;        // whether it already sent a dK,dV hop (step j0 - 1)
  double dkv_end = 0;            // that hop's end
  double compute_end = 0;        // its last compute (step j0 - 1)
  double prev_end = 0;           // end of its previous compute-stream task
  double ring_end = 0;           // its ring stream's last task's end (0: none)
  double best_end = -std::numeric_limits<double>::infinity();  // the latest end of its tasks so far
};

// What the steps [j0, steps) add to the rank.
struct RingBackwardResult {
  double busy_s = 0, imbalance_s = 0, exposed_s = 0;  // compute time; waits for other ranks; waits for transfers
  double c_start = 0, c_end = 0;                  // the last step's compute
  double d_start = 0, d_end = 0, d_ready = 0;     // the last step's dK,dV hop
  enum Role : char { none, recv, compute, dkv };
  Role best_role = none;     // the first-created task ending later than best_end and than every other (none: no such task)
  int64_t best_j = 0;
  double best_start = 0, best_end = 0, best_ready = 0;
};

// Per-rank sequences and scratch space, kept between calls (nothing is allocated once warm), for
// sequences that are a few lines (pl::Seq) and for staircases, a few lines on even and on odd
// steps (pl::Seq2).
template <class S>
struct RingBackwardStore {
  struct Rank {
    S rs, re, cs, ce, ds, de;  // receive start/end (steps [j0, steps-1)), compute and hop start/end ([j0, steps))
    double rr0 = 0;            // the first receive's readiness
    double dr_last = 0;        // the last hop's readiness
    // every sequence's values are its stored values + off (0 where computed; a rank moved from
    // the previous call holds that call's storage and its off + the move: nothing is copied)
    double off = 0;
    // the least and the largest of re's, ce's and de's stored values at their pieces' first and
    // last steps (what moved_by compares; lo > hi or NaN: not known), kept with the storage
    double lo = 1, hi = 0;
  };
  // Per rank, the rank object of this call (and below, of the previous one): a rank moved from the
  // previous call takes that call's object, the two pointers swapped (its ~0.5 KB of sequence
  // headers are not touched); the objects are owned by `ranks`.
  std::vector<Rank*> rank;
  std::vector<std::unique_ptr<Rank>> ranks;
  Rank lower, check, before;  // (before: a rank's sequences in the pass before, while it is computed again)
  // Each cycle's last rank as the previous call left it (by rank; the layers of a pass are alike):
  // its sequences and its block's arrival then. Moved by how much later its block arrives now, they
  // stand for its upstream's sequences in the first pass instead of the lower bound.
  Rank guess;
  std::vector<Rank> tail_before;
  std::vector<double> tail_have_before;
  std::vector<char> tail_known;
  int64_t tails_j0 = -1, tails_steps = -1;
  S t[8];
  S scratch[4];
  std::unordered_map<const std::vector<double>*, S> cost_seq;  // per cost vector, over [j0, steps)
  std::vector<const S*> costs;                                 // per rank
  // The previous call's ranks (the layer before: their inputs, sequences and results), and per
  // rank of this call whether it is that rank moved by a constant (`moved`, by `delta`): a rank
  // whose inputs and upstream's sequences are the previous call's moved by one constant has the
  // previous call's sequences and results moved by it (the recurrences are max and + only), so
  // it is not computed again (can_move, do_move in ring_backward.cpp).
  std::vector<Rank*> prev_rank;
  // a rank moved in this call: the previous call's off, rr0 and dr_last (its object is rank[r] now,
  // moved along; put back where the move is undone)
  std::vector<double> prev_off, prev_rr0, prev_dr_last;
  Rank actual_up, actual_tail;   // a moved upstream's or cycle's last rank's sequences with their off added
  std::vector<RingBackwardRank> prev_in;
  std::vector<RingBackwardResult> prev_out;
  std::vector<char> moved;
  std::vector<double> delta;
  bool prev_valid = false;
  int64_t prev_j0 = -1, prev_steps = -1;
  double prev_p = 0, prev_q = 0;
  size_t prev_cost_entries = 0;  // cost_seq's size after the previous call
  int64_t reused = 0, computed = 0;  // ranks moved instead of computed, and computed, by the last call (statistics)
  int64_t undone = 0;                 // moves of a pass undone in a later one, by the last call (statistics)
};
// Flat per-rank arrays of the sweep (ring_backward_sweep), kept between calls, and the costs as a
// (steps, ranks) matrix, transposed once per set of cost vectors.
struct RingSweepWork {
  std::vector<double> v;                          // the per-rank arrays, back to back
  std::vector<int> prev;
  std::vector<double> cost;                       // (steps, ranks), when small enough
  std::vector<const std::vector<double>*> cost_of;  // what `cost` was built from
  int64_t cost_steps = -1;
};
struct RingBackwardWork {
  RingSweepWork sweep;
  RingBackwardStore<pl::Seq> lines;
  RingBackwardStore<pl::Seq2> stairs;
  std::vector<int> next, order;
  std::vector<char> seen;
  int64_t cost_j0 = -1, cost_steps = -1;
  // per cost vector its runs of equal values (ring_backward.cpp, cost_runs), cleared with the
  // representations' cost sequences (a caller reusing the work area for other vectors at the same
  // addresses clears all three)
  std::unordered_map<const std::vector<double>*, std::vector<std::pair<int64_t, double>>> cost_runs;
  std::vector<int64_t> starts;  // (run_starts' scratch)
  int period = 1;      // 1: a few lines; 2: staircases (after lines took too many pieces once)
  int64_t passes = 0;  // passes taken by the last call (statistics)
};

// Times the steps [j0, steps) (1 <= j0 < steps) of every rank. Returns false, leaving `out` unspecified,
// when the closed form does not apply (a rank that is its own upstream, `prev` not a permutation),
// when a rank's times take more than a few pieces even on even and odd steps apart (document
// masks' many cost runs) or its check did not hold: the caller sweeps the steps instead. Times
// that are not a few lines but a staircase (computes that alternate between waiting and not, step
// by step: long plain rings without recompute) are tried on even and odd steps apart.
// The same steps [j0, steps) (1 <= j0 < steps) swept one at a time across all ranks (every rank's
// receive, then compute, then hop: a hop needs its upstream's compute of the same step), O(ranks)
// per step on flat arrays that the compiler vectorises; any `prev` (a rank may be its own
// upstream). The rank's last-ending task follows from the two streams' last strict rises (each
// stream's ends never decrease). The exact recurrences; the closed form equals it up to rounding.
void ring_backward_sweep(int64_t j0, int64_t steps, double p2p_s, double p2p_dkv_s, const std::vector<RingBackwardRank>& in,
                         std::vector<RingBackwardResult>& out, RingSweepWork& w);

// Where a vector's value changes: the indices j > 0 with !(v[j] == v[j - 1]), after 0 (none for an
// empty vector; a NaN is a run of its own, 0.0 and -0.0 one run), into `starts`. Runs of equal
// values are compared 8 at a time against their first value, without a branch per value: a cost
// vector of a plain ring is a few runs over R steps, read once per simulation (R^2 values).
void run_starts(const std::vector<double>& v, std::vector<int64_t>& starts);

// Whether every value v in [lo, hi] satisfies pl::near(v + oa, (v + ob) + d), as computed in
// doubles, decided from the bounds alone (false where they do not suffice): a moved rank's check
// of an upstream moved by another constant than its own (costmodel/ring_backward.cpp, can_move).
bool ring_moved_by_bound(double lo, double hi, double oa, double ob, double d);

bool ring_backward_closed_form(int64_t j0, int64_t steps, double p2p_s, double p2p_dkv_s, const std::vector<RingBackwardRank>& in,
                               std::vector<RingBackwardResult>& out, RingBackwardWork& w);

}  // namespace ctx
