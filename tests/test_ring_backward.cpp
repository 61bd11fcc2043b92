// costmodel/ring_backward.hpp against the step-by-step sweep it replaces, on random rings: every
// rank's added compute, waits for other ranks and for transfers, its last compute and dK,dV hop and
// the task ending last, in both representations (a few lines per rank, pl::Seq; lines on even and
// odd steps apart, pl::Seq2, the staircases of long rings without recompute). The sweep below is
// the recurrence of the simulator's generic loop written out step by step (receive, compute, hop
// per rank and step, seen() tracking the task ending last as finish() does); the inputs are small
// dyadic numbers (multiples of 1/4), so both must agree exactly. ring_backward_sweep (flat arrays,
// four ranks per operation, the last-ending task from each stream's last rise; on a plain ring after
// the first step two loops per step that read the upstream at x + r - 1) must equal it too. Rings of 2-12 ranks, one or two cycles (usp's rings), costs in runs (zero-cost steps
// included), hops of 0 to 1, a first hop sent or not.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "costmodel/piecewise_linear.hpp"
#include "costmodel/ring_backward.hpp"

namespace ctx {
namespace {

std::vector<RingBackwardResult> sweep(int64_t j0, int64_t steps, double p, double q, const std::vector<RingBackwardRank>& in) {
  const size_t n = in.size();
  std::vector<RingBackwardResult> out(n);
  std::vector<double> h_start(n), h_end(n), h_ready(n), d_end(n), c_end(n), ring_end(n), prev_end(n), best(n);
  std::vector<char> d_valid(n);
  for (size_t r = 0; r < n; ++r) {
    h_start[r] = in[r].have_start, h_end[r] = in[r].have_end, h_ready[r] = in[r].have_ready;
    d_end[r] = in[r].dkv_end, d_valid[r] = in[r].dkv_valid, c_end[r] = in[r].compute_end, ring_end[r] = in[r].ring_end;
    prev_end[r] = in[r].prev_end, best[r] = in[r].best_end;
  }
  auto seen = [&](size_t r, RingBackwardResult::Role role, int64_t j, double start, double end, double ready) {
    if (end > best[r]) {
      best[r] = end;
      out[r].best_role = role, out[r].best_j = j, out[r].best_start = start, out[r].best_end = end, out[r].best_ready = ready;
    }
  };
  for (int64_t j = j0; j < steps; ++j) {
    const bool has_recv = j + 1 < steps;
    std::vector<double> nr_start(n), nr_end(n), nr_ready(n), nd_end(n), c_now(n);
    for (size_t r = 0; r < n && has_recv; ++r) {
      const size_t u = static_cast<size_t>(in[r].prev);
      nr_ready[r] = std::max(std::max(0.0, ring_end[r]), h_end[r]);
      nr_start[r] = std::max(nr_ready[r], h_end[u]);
      if (u == r) nr_ready[r] = nr_start[r];  // its own upstream: ready when the whole receive is
      nr_end[r] = nr_start[r] + p;
      seen(r, RingBackwardResult::recv, j, nr_start[r], nr_end[r], nr_ready[r]);
    }
    for (size_t r = 0; r < n; ++r) {
      const std::vector<double>& cv = *in[r].cost;
      const double dur = std::max(0.0, static_cast<size_t>(j) < cv.size() ? cv[static_cast<size_t>(j)] : 0.0);
      const double start = std::max(std::max(0.0, c_end[r]), h_end[r]);
      const double gap = start - prev_end[r];
      if (gap > 0) {
        const double others = std::min(gap, std::max(0.0, h_start[r] - h_ready[r]));
        out[r].imbalance_s += others;
        out[r].exposed_s += gap - others;
      }
      out[r].busy_s += dur;
      c_end[r] = start + dur;
      prev_end[r] = c_end[r];
      out[r].c_start = start, out[r].c_end = c_end[r];
      seen(r, RingBackwardResult::compute, j, start, c_end[r], start);
    }
    for (size_t r = 0; r < n; ++r) {
      const size_t u = static_cast<size_t>(in[r].prev);
      double ready = std::max(0.0, has_recv ? nr_end[r] : ring_end[r]);
      double full = std::max(ready, c_end[u]);
      if (j > j0 || d_valid[u]) full = std::max(full, d_end[u]);
      if (u == r) ready = full;
      nd_end[r] = full + q;
      out[r].d_start = full, out[r].d_end = nd_end[r], out[r].d_ready = ready;
      seen(r, RingBackwardResult::dkv, j, full, nd_end[r], ready);
    }
    d_end = nd_end;
    ring_end = nd_end;
    if (has_recv) h_start = nr_start, h_end = nr_end, h_ready = nr_ready;
  }
  return out;
}

void expect_same(const std::vector<RingBackwardResult>& got, const std::vector<RingBackwardResult>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r < want.size(); ++r) {
    const RingBackwardResult &a = got[r], &b = want[r];
    const std::string wr = what + ", rank " + std::to_string(r);
    EXPECT_EQ(a.busy_s, b.busy_s) << wr;
    EXPECT_EQ(a.imbalance_s, b.imbalance_s) << wr;
    EXPECT_EQ(a.exposed_s, b.exposed_s) << wr;
    EXPECT_EQ(a.c_start, b.c_start) << wr;
    EXPECT_EQ(a.c_end, b.c_end) << wr;
    EXPECT_EQ(a.d_start, b.d_start) << wr;
    EXPECT_EQ(a.d_end, b.d_end) << wr;
    EXPECT_EQ(a.d_ready, b.d_ready) << wr;
    EXPECT_EQ(a.best_role, b.best_role) << wr;
    if (b.best_role != RingBackwardResult::none) {
      EXPECT_EQ(a.best_j, b.best_j) << wr;
      EXPECT_EQ(a.best_start, b.best_start) << wr;
      EXPECT_EQ(a.best_end, b.best_end) << wr;
      EXPECT_EQ(a.best_ready, b.best_ready) << wr;
    }
  }
}

// A rank's costs per step over `steps`: runs of 1 to `max_run` equal steps, each a quarter-grid
// cost below 3 or (one run in four) 0. `uni(lo, hi)` and `quarter(hi)` draw.
template <class Uni, class Quarter>
void random_cost_runs(std::vector<double>& cv, int64_t steps, int max_run, Uni& uni, Quarter& quarter) {
  while (static_cast<int64_t>(cv.size()) < steps) {
    const double c = quarter(3) * (uni(0, 3) == 0 ? 0 : 1);
    for (int k = uni(1, max_run); k > 0 && static_cast<int64_t>(cv.size()) < steps; --k) cv.push_back(c);
  }
}

// A rank's state entering the sweep's first step, at random on a quarter grid (ties likely): the
// block held (ready, start, end = start + the hop time p), the last hop (or none), the last compute,
// the ring stream's end and the best task so far (or none). `uni(lo, hi)` and `quarter(hi)` draw;
// the previous compute's end is the last compute's, or (prev_end_drawn) drawn apart half the time.
template <class Uni, class Quarter>
void random_rank_state(RingBackwardRank& x, double p, Uni& uni, Quarter& quarter, bool prev_end_drawn = true) {
  x.have_ready = quarter(8);
  x.have_start = x.have_ready + quarter(2);
  x.have_end = x.have_start + p;
  x.dkv_valid = uni(0, 1) == 1;
  x.dkv_end = x.dkv_valid ? quarter(10) : 0.0;
  x.compute_end = quarter(10);
  x.prev_end = !prev_end_drawn || uni(0, 1) ? x.compute_end : quarter(10);
  x.ring_end = uni(0, 3) == 0 ? 0.0 : quarter(10);
  x.best_end = uni(0, 2) == 0 ? -std::numeric_limits<double>::infinity() : quarter(14);
}

// A random plain ring of 3-12 ranks (rank r receives from r - 1), as many steps, hop times p and q
// on the quarter grid, in a later layer's state: every rank has sent a hop and has a ring and a
// compute task (in; its cost pointers point into costs, drawn as random_cost_runs and
// random_rank_state draw).
struct LaterLayerRing {
  int n = 0;
  int64_t steps = 0;
  double p = 0, q = 0;
  std::vector<std::vector<double>> costs;
  std::vector<RingBackwardRank> in;
};
template <class Uni, class Quarter>
void random_later_layer_ring(LaterLayerRing& g, Uni& uni, Quarter& quarter) {
  const int n = g.n = uni(3, 12);
  const int64_t steps = g.steps = n;
  const double p = g.p = uni(0, 4) / 4.0;
  g.q = uni(0, 4) / 4.0;
  std::vector<std::vector<double>>& costs = g.costs;
  std::vector<RingBackwardRank>& in = g.in;
  costs.assign(static_cast<size_t>(n), {});
  in.assign(static_cast<size_t>(n), RingBackwardRank{});
  for (int r = 0; r < n; ++r) {
    auto& cv = costs[static_cast<size_t>(r)];
    random_cost_runs(cv, steps, n, uni, quarter);
    RingBackwardRank& x = in[static_cast<size_t>(r)];
    x.cost = &cv;
    x.prev = (r + n - 1) % n;
    random_rank_state(x, p, uni, quarter, /*prev_end_drawn=*/false);
    x.dkv_valid = true;
    x.dkv_end = 0.25 + quarter(10);
    x.ring_end = 0.25 + quarter(10);
    x.compute_end = x.prev_end = 0.25 + quarter(10);
  }
}

// ring_backward_sweep against the written-out sweep: plain rings (the shifted-copy gather at the first step, then the two fused loops), random
// upstream permutations and ranks that are their own upstream (the indexed gather, the own-rank
// readiness), odd and even rank counts (the padding lane), any first step, and rings too large
// for the cached cost matrix (costs gathered per step). Exact: the same operations per rank.
TEST(RingBackward, FlatSweepEqualsTheStepByStepSweep) {
  std::mt19937 rng(20261126);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto quarter = [&](int hi) { return uni(0, 4 * hi) / 4.0; };
  int ties = 0, owns = 0, big = 0, compared = 0;
  for (int trial = 0; trial < 402; ++trial) {
    const bool large = trial >= 400;  // 1100 x 960 steps > the 2^20-entry matrix
    const int kind = trial % 3;       // 0: plain ring, 1: a random permutation, 2: with own ranks
    const int n = large ? 1100 + trial - 400 : uni(1, 13);
    const int64_t steps = large ? 960 : uni(2, 14), j0 = large ? 1 : uni(1, static_cast<int>(steps) - 1);
    const double p = uni(0, 4) / 4.0, q = uni(0, 4) / 4.0;
    std::vector<int> prev(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) prev[static_cast<size_t>(r)] = (r + n - 1) % n;
    if (kind >= 1) {
      std::vector<int> perm(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) perm[static_cast<size_t>(r)] = r;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int r = 0; r < n; ++r) prev[static_cast<size_t>(r)] = perm[static_cast<size_t>(r)];
    }
    if (kind == 2 && n >= 1) prev[static_cast<size_t>(uni(0, n - 1))] = -1;  // marked: made its own below
    std::vector<std::vector<double>> costs(static_cast<size_t>(n));
    std::vector<RingBackwardRank> in(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      auto& cv = costs[static_cast<size_t>(r)];
      const int64_t len = uni(0, 4) == 0 ? uni(0, static_cast<int>(steps)) : steps;  // shorter: 0 past its end
      while (static_cast<int64_t>(cv.size()) < len) {
        const double c = (uni(0, 3) == 0 ? 0 : 1) * quarter(3) - (uni(0, 9) == 0 ? 1.0 : 0.0);  // negative: 0
        for (int k = uni(1, 5); k > 0 && static_cast<int64_t>(cv.size()) < len; --k) cv.push_back(c);
      }
      RingBackwardRank& x = in[static_cast<size_t>(r)];
      x.cost = &cv;
      x.prev = prev[static_cast<size_t>(r)] < 0 ? r : prev[static_cast<size_t>(r)];
      owns += x.prev == r;
      random_rank_state(x, p, uni, quarter);
    }
    const std::vector<RingBackwardResult> want = sweep(j0, steps, p, q, in);
    for (const RingBackwardResult& b : want) {
      ties += b.best_role != RingBackwardResult::none && b.c_end == b.d_end && b.c_end == b.best_end;
      ++compared;
    }
    RingBackwardWork w;
    std::vector<RingBackwardResult> got;
    const std::string what = "trial " + std::to_string(trial) + " (" + std::to_string(n) + " ranks, kind " + std::to_string(kind) + ", steps " +
                             std::to_string(steps) + ", j0 " + std::to_string(j0) + ")";
    ring_backward_sweep(j0, steps, p, q, in, got, w.sweep);
    expect_same(got, want, what);
    ring_backward_sweep(j0, steps, p, q, in, got, w.sweep);  // again, with the cached costs
    expect_same(got, want, what + ", second call");
    big += large;
  }
  EXPECT_EQ(big, 2);
  EXPECT_GT(owns, 50);
  EXPECT_GT(ties, 20) << "ties between a rank's two streams decide which task ends last: the case must occur";
  EXPECT_GT(compared, 1500);
}

TEST(RingBackward, BothRepresentationsEqualTheSweepOnRandomRings) {
  std::mt19937 rng(20261125);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto quarter = [&](int hi) { return uni(0, 4 * hi) / 4.0; };
  int cases = 0, staircases_taken = 0, guessed = 0;
  // a work area kept from an earlier trial of the same size: its cycles' last ranks as that trial
  // left them stand for their upstreams in the first pass (a guess unrelated to this ring, which
  // must change nothing)
  std::map<std::pair<int, int>, RingBackwardWork> warm[2];
  for (int trial = 0; trial < 600; ++trial) {
    const int cycles = uni(1, 2);
    const int L = uni(2, 6 + 6 / cycles);
    const int n = cycles * L;
    const int64_t steps = L, j0 = 1;
    const double p = uni(0, 4) / 4.0, q = uni(0, 4) / 4.0;
    std::vector<std::vector<double>> costs(static_cast<size_t>(n));
    std::vector<RingBackwardRank> in(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      auto& cv = costs[static_cast<size_t>(r)];
      random_cost_runs(cv, steps, L, uni, quarter);
      RingBackwardRank& x = in[static_cast<size_t>(r)];
      x.cost = &cv;
      x.prev = (r + n - cycles) % n;  // cycles interleaved, as usp's rings
      random_rank_state(x, p, uni, quarter, /*prev_end_drawn=*/false);
    }
    const std::vector<RingBackwardResult> want = sweep(j0, steps, p, q, in);
    for (int period : {1, 2}) {
      RingBackwardWork w;
      w.period = period;  // 2: even and odd steps apart from the start
      std::vector<RingBackwardResult> got;
      const std::string what = "trial " + std::to_string(trial) + " (" + std::to_string(n) + " ranks, " + std::to_string(cycles) +
                               " cycles, p " + std::to_string(p) + ", q " + std::to_string(q) + ", period " + std::to_string(period) + ")";
      ASSERT_TRUE(ring_backward_closed_form(j0, steps, p, q, in, got, w)) << what;
      staircases_taken += period == 2;
      expect_same(got, want, what);
      RingBackwardWork& kept = warm[period - 1][{n, cycles}];
      kept.period = period;
      kept.lines.cost_seq.clear();  // (cached by the address of a cost vector: an earlier trial's are gone)
      kept.stairs.cost_seq.clear();
      kept.cost_runs.clear();
      const auto& known = period == 1 ? kept.lines.tail_known : kept.stairs.tail_known;
      guessed += std::count(known.begin(), known.end(), 1) > 0;
      ASSERT_TRUE(ring_backward_closed_form(j0, steps, p, q, in, got, kept)) << what << ", warm";
      expect_same(got, want, what + ", warm");
      ASSERT_TRUE(ring_backward_closed_form(j0, steps, p, q, in, got, kept)) << what << ", warm again";
      expect_same(got, want, what + ", warm again (the guess is this ring's own answer)");
    }
    ++cases;
  }
  EXPECT_EQ(cases, 600);
  EXPECT_EQ(staircases_taken, 600);
  EXPECT_GT(guessed, 1000) << "first passes that started from an earlier call's last ranks";
}

// Consecutive calls on one work area, as the layers of a backward pass make them: a rank whose
// inputs and upstream's sequences are the previous call's moved by a constant is the previous
// call's rank moved (the recurrences are max and + only), not computed again. Per random plain
// ring (both representations): call 1 from a state, call 2 from that state moved by d (every
// rank but the first pass's first, whose upstream is a stand-in, must be moved), call 3 from it
// moved again with one rank's input off its line by a quarter (that rank must be computed, and
// whatever it changes downstream), call 4 with the hop time changed (nothing moved). Every call
// must equal the written-out sweep of its own inputs exactly (quarter-grid inputs, dyadic moves).
TEST(RingBackward, RanksMovedByAConstantFromThePreviousCallEqualTheSweep) {
  std::mt19937 rng(20261127);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto quarter = [&](int hi) { return uni(0, 4 * hi) / 4.0; };
  int64_t moved_all = 0, moved_off = 0, computed_off = 0, changed_downstream = 0, undone = 0;
  for (int trial = 0; trial < 300; ++trial) {
    LaterLayerRing g;
    random_later_layer_ring(g, uni, quarter);
    const int n = g.n;
    const int64_t steps = g.steps, j0 = 1;
    const double p = g.p, q = g.q;
    const std::vector<RingBackwardRank>& in = g.in;
    auto moved = [&](const std::vector<RingBackwardRank>& a, double d) {
      std::vector<RingBackwardRank> b = a;
      for (RingBackwardRank& x : b)
        x.have_start += d, x.have_end += d, x.have_ready += d, x.dkv_end += d, x.compute_end += d, x.prev_end += d, x.ring_end += d,
            x.best_end += d;
      return b;
    };
    for (int period : {1, 2}) {
      RingBackwardWork w;
      w.period = period;
      const auto& st_reused = period == 1 ? w.lines.reused : w.stairs.reused;
      const auto& st_computed = period == 1 ? w.lines.computed : w.stairs.computed;
      const std::string what = "trial " + std::to_string(trial) + " (" + std::to_string(n) + " ranks, p " + std::to_string(p) + ", q " +
                               std::to_string(q) + ", period " + std::to_string(period) + ")";
      std::vector<RingBackwardResult> got;
      ASSERT_TRUE(ring_backward_closed_form(j0, steps, p, q, in, got, w)) << what;
      expect_same(got, sweep(j0, steps, p, q, in), what + ", call 1");
      EXPECT_EQ(st_reused, 0) << what << ": no previous call";
      const std::vector<RingBackwardRank> in2 = moved(in, 0.25 * uni(1, 40));
      ASSERT_TRUE(ring_backward_closed_form(j0, steps, p, q, in2, got, w)) << what;
      expect_same(got, sweep(j0, steps, p, q, in2), what + ", call 2 (moved)");
      EXPECT_GE(st_reused, n - 1) << what << ": every rank moved but the first pass's first";
      moved_all += st_reused >= n - 1;
      std::vector<RingBackwardRank> in3 = moved(in2, 0.25 * uni(1, 40));
      // (half the time the cycle's last rank: the first pass's guess for its upstream is then off
      // too, and ranks moved in the first pass may have to be computed in the second)
      const int off = uni(0, 1) ? n - 1 : uni(0, n - 1);
      switch (uni(0, 2)) {  // one input of one rank off the line
        case 0: in3[static_cast<size_t>(off)].compute_end += 0.25; break;
        case 1: in3[static_cast<size_t>(off)].have_end += 0.25, in3[static_cast<size_t>(off)].have_start += 0.25; break;
        default: in3[static_cast<size_t>(off)].dkv_end += 0.25; break;
      }
      const std::vector<RingBackwardResult> want3 = sweep(j0, steps, p, q, in3);
      ASSERT_TRUE(ring_backward_closed_form(j0, steps, p, q, in3, got, w)) << what;
      expect_same(got, want3, what + ", call 3 (rank " + std::to_string(off) + " off its line)");
      EXPECT_LT(st_reused, n) << what;
      moved_off += st_reused > 0;
      computed_off += st_computed;
      undone += period == 1 ? w.lines.undone : w.stairs.undone;
      const std::vector<RingBackwardResult> want_line = sweep(j0, steps, p, q, moved(in2, in3[0].have_end - in2[0].have_end));
      for (size_t r = 0; r < want3.size(); ++r) changed_downstream += want3[r].d_end != want_line[r].d_end && static_cast<int>(r) != off;
      const double p4 = p + 0.25;
      const std::vector<RingBackwardRank> in4 = moved(in3, 0.25);
      ASSERT_TRUE(ring_backward_closed_form(j0, steps, p4, q, in4, got, w)) << what;
      expect_same(got, sweep(j0, steps, p4, q, in4), what + ", call 4 (another hop time)");
      EXPECT_EQ(st_reused, 0) << what << ": the hop time changed";
    }
  }
  std::printf("%lld calls with every rank moved, %lld with a rank off its line that still moved others (%lld ranks computed, %lld "
              "moves undone by a later pass), %lld ranks downstream of it changed\n",
              static_cast<long long>(moved_all), static_cast<long long>(moved_off), static_cast<long long>(computed_off),
              static_cast<long long>(undone), static_cast<long long>(changed_downstream));
  EXPECT_EQ(moved_all, 600);
  EXPECT_GT(moved_off, 100) << "ranks that stayed on their line next to one that left it: the check must tell them apart";
  EXPECT_GT(changed_downstream, 100) << "a rank off its line must change ranks downstream of it (which then must not be moved)";
  EXPECT_GT(undone, 20) << "ranks moved in the first pass from a wrong guess and computed in the second: the case must occur";
}

// A rank's latest earlier end (best_end) decides only whether one of the steps' tasks ends later:
// where it did not move along with the rest (the layer before ended with another task) but stays
// below the tasks the moved rank would report, the rank is still moved, and where it is later than
// all of them the result has no such task; both as the sweep says. Per random plain ring (both
// representations): call 1, then call 2 with every input moved by d but best_end, which is set
// (per rank, at random) to -inf, to its old value (not moved) or past every task of the ring.
TEST(RingBackward, RanksWhoseEarlierEndDoesNotBindAreMoved) {
  std::mt19937 rng(20261128);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto quarter = [&](int hi) { return uni(0, 4 * hi) / 4.0; };
  int64_t moved_unbound = 0, late = 0, calls_all_moved = 0;
  for (int trial = 0; trial < 200; ++trial) {
    LaterLayerRing g;
    random_later_layer_ring(g, uni, quarter);
    const int n = g.n;
    const int64_t steps = g.steps, j0 = 1;
    const double p = g.p, q = g.q;
    const std::vector<RingBackwardRank>& in = g.in;
    const double d = 0.25 * uni(1, 40);
    std::vector<RingBackwardRank> in2 = in;
    std::vector<int> kind(static_cast<size_t>(n));
    for (size_t r = 0; r < in2.size(); ++r) {
      RingBackwardRank& x = in2[r];
      x.have_start += d, x.have_end += d, x.have_ready += d, x.dkv_end += d, x.compute_end += d, x.prev_end += d, x.ring_end += d;
      kind[r] = uni(0, 2);
      x.best_end = kind[r] == 0 ? -std::numeric_limits<double>::infinity() : kind[r] == 1 ? in[r].best_end : 1000.0;
    }
    for (int period : {1, 2}) {
      RingBackwardWork w;
      w.period = period;
      const auto& st_reused = period == 1 ? w.lines.reused : w.stairs.reused;
      const std::string what = "trial " + std::to_string(trial) + " (" + std::to_string(n) + " ranks, period " + std::to_string(period) + ")";
      std::vector<RingBackwardResult> got1, got;
      ASSERT_TRUE(ring_backward_closed_form(j0, steps, p, q, in, got1, w)) << what;
      expect_same(got1, sweep(j0, steps, p, q, in), what + ", call 1");
      ASSERT_TRUE(ring_backward_closed_form(j0, steps, p, q, in2, got, w)) << what;
      const std::vector<RingBackwardResult> want = sweep(j0, steps, p, q, in2);
      expect_same(got, want, what + ", call 2");
      const auto& moved = period == 1 ? w.lines.moved : w.stairs.moved;
      for (size_t r = 0; r < in2.size(); ++r) {
        // (a rank whose best_end changed to something other than the old one moved by d, moved all the same)
        moved_unbound += moved[r] && in2[r].best_end != in[r].best_end + d;
        late += kind[r] == 2 && want[r].best_role == RingBackwardResult::none;
      }
      calls_all_moved += st_reused >= n - 1;
    }
  }
  std::printf("%lld ranks moved whose earlier end did not move along, %lld with no task ending later, %lld calls with every rank moved\n",
              static_cast<long long>(moved_unbound), static_cast<long long>(late), static_cast<long long>(calls_all_moved));
  EXPECT_GT(moved_unbound, 500) << "ranks whose earlier end does not bind must be moved";
  EXPECT_GT(late, 300) << "an earlier end past every task must occur (and give no task, as the sweep)";
}

// ring_moved_by_bound against the comparison it stands for: wherever it says yes, pl::near(v + oa,
// (v + ob) + d) holds at both bounds and at random values between them, for offs that differ from
// ob + d by 0 to 2e-11 relative (around pl::near's 1e-12) and values from 1e-3 to 100 s; and it
// says yes for a few ulps' difference on the simulator's scale (the case it exists for), no for NaN,
// for no values (lo > hi) and for a difference past the tolerance.
TEST(RingBackward, MovedByBoundImpliesTheComparison) {
  std::mt19937 rng(20261128);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  int64_t yes = 0, no = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const double lo = std::pow(10.0, -3 + 5 * unit(rng)), hi = lo + 100 * unit(rng) * unit(rng);
    const double ob = 50 * unit(rng), d = 10 * unit(rng);
    const double rel = (unit(rng) - 0.5) * 4e-11 * (unit(rng) < 0.5 ? 1.0 : 1e-3);
    const double oa = (ob + d) + rel * (lo + ob + d);
    if (!ring_moved_by_bound(lo, hi, oa, ob, d)) {
      ++no;
      continue;
    }
    ++yes;
    for (int k = 0; k < 34; ++k) {
      const double v = k == 0 ? lo : k == 1 ? hi : lo + (hi - lo) * unit(rng);
      ASSERT_TRUE(pl::near(v + oa, (v + ob) + d)) << "lo " << lo << " hi " << hi << " oa " << oa << " ob " << ob << " d " << d << " v " << v;
    }
  }
  std::printf("%lld said yes, %lld no\n", static_cast<long long>(yes), static_cast<long long>(no));
  EXPECT_GT(yes, 5000);
  EXPECT_GT(no, 2000);
  // the 1,024-rank ring's case: stored values 8-37 s, offs of 0.35 s per layer, two ranks' moves
  // 4e-12 s apart
  const double ob = 20 * 0.34697722621260141, d = 0.34697722621260141;
  EXPECT_TRUE(ring_moved_by_bound(8.7, 36.6, ob + 0.34697722621623939, ob, d));
  EXPECT_TRUE(ring_moved_by_bound(8.7, 36.6, std::nextafter(ob + d, 100.0), ob, d));
  EXPECT_FALSE(ring_moved_by_bound(8.7, 36.6, ob + d + 1e-9, ob, d));
  EXPECT_FALSE(ring_moved_by_bound(1.0, 0.0, ob + d, ob, d));
  EXPECT_FALSE(ring_moved_by_bound(std::nan(""), 36.6, ob + d, ob, d));
}

// run_starts (8 values at a time against the run's first) against the one-at-a-time definition:
// random vectors of 0-200 values in runs of 1-20 drawn from a few values, NaN (a run of its own
// per value), 0.0 and -0.0 (one run) among them, so blocks of 8 straddle run ends everywhere.
TEST(RingBackward, RunStartsAreWhereTheValueChanges) {
  std::mt19937 rng(20261128);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> values{0.5, 0.25, 0.0, -0.0, nan, -1.0, 3.0};
  std::vector<int64_t> got;
  int64_t runs = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<double> v;
    const size_t n = std::uniform_int_distribution<size_t>(0, 200)(rng);
    while (v.size() < n) {
      const double x = values[std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng)];
      for (int k = std::uniform_int_distribution<int>(1, 20)(rng); k > 0 && v.size() < n; --k) v.push_back(x);
    }
    std::vector<int64_t> want;
    for (size_t j = 0; j < v.size(); ++j)
      if (j == 0 || !(v[j] == v[j - 1])) want.push_back(static_cast<int64_t>(j));
    run_starts(v, got);
    ASSERT_EQ(got, want) << "trial " << trial << ", " << n << " values";
    runs += static_cast<int64_t>(want.size());
  }
  EXPECT_GT(runs, 10000);
}

TEST(RingBackward, RefusesWhatItCannotTime) {
  std::vector<double> cost{1, 1, 1};
  std::vector<RingBackwardRank> in(3);
  for (int r = 0; r < 3; ++r) in[static_cast<size_t>(r)].cost = &cost, in[static_cast<size_t>(r)].prev = (r + 2) % 3;
  RingBackwardWork w;
  std::vector<RingBackwardResult> out;
  EXPECT_TRUE(ring_backward_closed_form(1, 3, 0.5, 0.5, in, out, w));
  in[1].prev = 1;  // its own upstream (one simulated rank standing for a symmetric ring): the sweep's case
  EXPECT_FALSE(ring_backward_closed_form(1, 3, 0.5, 0.5, in, out, w));
  in[1].prev = 2;  // two ranks with the same upstream: not a ring
  EXPECT_FALSE(ring_backward_closed_form(1, 3, 0.5, 0.5, in, out, w));
  in[1].prev = 0;
  EXPECT_FALSE(ring_backward_closed_form(0, 3, 0.5, 0.5, in, out, w)) << "step 0 is the generic loop's";
  EXPECT_FALSE(ring_backward_closed_form(3, 3, 0.5, 0.5, in, out, w)) << "no steps";
}

}  // namespace
}  // namespace ctx
