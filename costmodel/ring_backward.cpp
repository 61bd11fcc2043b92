#include "costmodel/ring_backward.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ctx {
namespace {

using pl::Seq;
using pl::Seq2;

// ---- the two representations behind one set of names (pl:: has the Seq2 ones) -------------------
size_t pieces(const Seq& s) { return s.p.size(); }
size_t pieces(const Seq2& s) { return s.pieces(); }
void scan(Seq& out, double init, const Seq& inc, const Seq& z, Seq*) { pl::scan(out, init, inc, z); }
// a one-step sequence at j followed by x (which starts at j + 1, or is empty)
void point_then(Seq& out, int64_t j, double v, const Seq& x, int64_t end) {
  out.clear(end);
  out.push(j, v, 0.0);
  for (const pl::Piece& q : x.p) out.push(q.j, q.v, q.s);
  out.last = end;
}
// x followed by a one-step sequence at j = x.end()
void then_point(Seq& out, const Seq& x, int64_t j, double v) {
  out.clear(j + 1);
  for (const pl::Piece& q : x.p) out.push(q.j, q.v, q.s);
  out.push(j, v, 0.0);
  out.last = j + 1;
}

// A cost vector as its runs of bitwise-equal raw values (each run's first step and value, in
// order; NaN a run of its own), found in one read of the vector per simulation (its ~R values at
// R ranks, read once for both representations instead of three times). A step's cost is max(0,
// the vector's value), 0 past its end (build_cost_steps).
const std::vector<std::pair<int64_t, double>>& cost_runs(RingBackwardWork& w, const std::vector<double>* cv) {
  auto it = w.cost_runs.find(cv);
  if (it != w.cost_runs.end()) return it->second;
  std::vector<std::pair<int64_t, double>> runs;
  run_starts(*cv, w.starts);
  for (int64_t j : w.starts) runs.emplace_back(j, (*cv)[static_cast<size_t>(j)]);
  return w.cost_runs.emplace(cv, std::move(runs)).first->second;
}
// The steps j = first, first + stride, ... < steps of cv pushed at index j / stride, one by one as
// push would take them, but a step whose cost equals the last piece's constant exactly (which push
// would merge into it, changing nothing) is skipped without the call, and once the last piece is
// that constant the rest of its run of equal raw costs at once: the same pieces (a plain ring's
// cost vector is a few runs over ~R steps).
void build_cost_steps(Seq& s, const std::vector<std::pair<int64_t, double>>& runs, int64_t n, int64_t first, int64_t steps, int64_t stride) {
  size_t k = 0;  // the run holding step j (j < n)
  for (int64_t j = first; j < steps;) {
    while (k + 1 < runs.size() && runs[k + 1].first <= j) ++k;
    const double v = std::max(0.0, j < n ? runs[k].second : 0.0);
    if (s.p.empty() || s.p.back().s != 0 || s.p.back().v != v) s.push(j / stride, v, 0.0);
    j += stride;
    if (s.p.back().s != 0 || s.p.back().v != v) continue;
    if (j - stride >= n) {  // past the vector: every cost is 0, as v
      j = steps;
    } else {  // to the run's end (equal raw costs have equal costs)
      const int64_t end = k + 1 < runs.size() ? runs[k + 1].first : n;
      if (j < end) j += (end - j + stride - 1) / stride * stride;
    }
  }
}
void build_cost(Seq& s, RingBackwardWork& w, const std::vector<double>* cv, int64_t j0, int64_t steps) {
  s.clear(steps);
  build_cost_steps(s, cost_runs(w, cv), static_cast<int64_t>(cv->size()), j0, steps, 1);
}
void build_cost(Seq2& s, RingBackwardWork& w, const std::vector<double>* cv, int64_t j0, int64_t steps) {
  s.clear(j0, steps);
  const auto& runs = cost_runs(w, cv);
  for (int par = 0; par < 2; ++par) {
    const int64_t first = j0 + ((j0 & 1) != par ? 1 : 0);
    if (first < steps) build_cost_steps(s.sub[par], runs, static_cast<int64_t>(cv->size()), first, steps, 2);
  }
}
template <class S>
const S& cost_seq(RingBackwardStore<S>& st, RingBackwardWork& w, const std::vector<double>* cv, int64_t j0, int64_t steps) {
  auto it = st.cost_seq.find(cv);
  if (it != st.cost_seq.end()) return it->second;
  S s;
  build_cost(s, w, cv, j0, steps);
  return st.cost_seq.emplace(cv, std::move(s)).first->second;
}

// x.lo, x.hi: the least and the largest value of re, ce and de at their pieces' first and last
// steps, as moved_by computes them (NaN when one is NaN)
void value_bounds(const Seq& a, double& lo, double& hi) {
  for (size_t k = 0; k < a.p.size(); ++k) {
    const pl::Piece& x = a.p[k];
    const int64_t e = (k + 1 < a.p.size() ? a.p[k + 1].j : a.last) - 1;
    for (const double v : {x.v, e > x.j ? x.at(e) : x.v}) {
      if (std::isnan(v)) lo = hi = v;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
  }
}
void value_bounds(const Seq2& a, double& lo, double& hi) {
  for (int par = 0; par < 2; ++par) value_bounds(a.sub[par], lo, hi);
}
template <class R>
void value_bounds(R& x) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  value_bounds(x.re, lo, hi);
  value_bounds(x.ce, lo, hi);
  value_bounds(x.de, lo, hi);
  x.lo = lo, x.hi = hi;
}

// Rank r's sequences from its upstream's (u): the recurrences of the sweep (simulator.cpp's
// ring_backward_sweep), per step j:
//   receive  rs(j) = max(de(j-1), re(j-1), re_u(j-1))          re = rs + p      (j < steps - 1)
//   hop      ds(j) = max(re(j) [last step: de(j-1)], ce_u(j), de_u(j-1))   de = ds + q
//   compute  cs(j) = max(ce(j-1), re(j-1))                       ce = cs + cost
// With y(j) = max(ce_u(j), de_u(j-1)) the receive is the scan
//   rs(j) = max(rs(j-1) + p + q, max(y(j-1) + q, re_u(j-1)))    (de(j-1) = max(re(j-1), y(j-1)) + q)
// and the compute the scan cs(j) = max(cs(j-1) + cost(j-1), re(j-1)).
template <class S>
void compute_rank(RingBackwardStore<S>& st, typename RingBackwardStore<S>::Rank& x, const RingBackwardRank& me,
                  const typename RingBackwardStore<S>::Rank& u, const RingBackwardRank& up, const S& cost, int64_t j0, int64_t steps, double p,
                  double q) {
  S* t = st.t;
  const int64_t last = steps - 1;
  // y = max(ce_u, de_u shifted one step) over [j0, steps); an unsent hop does not bind (0 <= ce_u)
  restrict_shift(t[1], u.de, j0, last, 1);
  point_then(t[2], j0, up.dkv_valid ? up.dkv_end : 0.0, t[1], steps);
  S& y = t[3];
  pl::max(y, u.ce, t[2]);
  // receives over [j0, last)
  const double ring0 = std::max(0.0, me.ring_end);
  if (last > j0) {
    const double rs0 = std::max({ring0, me.have_end, up.have_end});
    x.rr0 = std::max(ring0, me.have_end);
    if (last > j0 + 1) {
      restrict(t[0], y, j0, last - 1);
      add_constant(t[1], t[0], q);
      pl::max(t[4], t[1], u.re);  // (over t[1]'s steps: u.re is not cut to them, the same pieces)
      shift(t[1], t[4], 1);  // z over [j0 + 1, last)
      pl::constant(t[0], j0 + 1, last, p + q);
      scan(t[4], rs0, t[0], t[1], st.scratch);
      point_then(x.rs, j0, rs0, t[4], last);
    } else {
      point_then(x.rs, j0, rs0, S{}, last);
    }
    add_constant(x.re, x.rs, p);
    // hops over [j0, last): after the receive of the step
    pl::max(t[1], x.re, y);  // (over x.re's steps [j0, last))
  } else {
    x.rs = S{};
    x.re = S{};
    t[1] = S{};
  }
  // the last step's hop: after the previous hop (no receive)
  const double pv = last > j0 ? t[1].back() + q : me.ring_end;
  x.dr_last = std::max(0.0, pv);
  then_point(x.ds, t[1], last, std::max(x.dr_last, y.back()));
  add_constant(x.de, x.ds, q);
  // computes over [j0, steps)
  const double cs0 = std::max(std::max(0.0, me.compute_end), me.have_end);
  if (steps > j0 + 1) {
    restrict_shift(t[1], cost, j0, last, 1);
    shift(t[2], x.re, 1);
    scan(t[4], cs0, t[1], t[2], st.scratch);
    point_then(x.cs, j0, cs0, t[4], steps);
  } else {
    point_then(x.cs, j0, cs0, S{}, steps);
  }
  pl::add(x.ce, x.cs, cost);
  value_bounds(x);
}

// do a and b agree (to rounding) at every step?
bool same(const Seq& a, const Seq& b) {
  if (a.empty() || b.empty()) return a.empty() == b.empty();
  if (a.first() != b.first() || a.last != b.last) return false;
  auto close = [](double x, double y) { return x == y || std::abs(x - y) <= 1e-12 * std::max(std::abs(x), std::abs(y)); };
  for (const Seq* s : {&a, &b})
    for (const pl::Piece& c : s->p)
      if (!close(a.at(c.j), b.at(c.j))) return false;
  for (const Seq* s : {&a, &b})
    for (size_t k = 0; k < s->p.size(); ++k) {
      const int64_t e = (k + 1 < s->p.size() ? s->p[k + 1].j : s->last) - 1;
      if (!close(a.at(e), b.at(e))) return false;
    }
  return true;
}
bool same(const Seq2& a, const Seq2& b) {
  if (a.empty() || b.empty()) return a.empty() == b.empty();
  if (a.a != b.a || a.b != b.b) return false;
  for (int par = 0; par < 2; ++par)
    if (a.has(par) && !same(a.sub[par], b.sub[par])) return false;
  return true;
}

// bit for bit the same sequences
bool identical(const Seq& a, const Seq& b) {
  if (a.last != b.last || a.p.size() != b.p.size()) return false;
  for (size_t k = 0; k < a.p.size(); ++k)
    if (a.p[k].j != b.p[k].j || a.p[k].v != b.p[k].v || a.p[k].s != b.p[k].s) return false;
  return true;
}
bool identical(const Seq2& a, const Seq2& b) { return a.a == b.a && a.b == b.b && identical(a.sub[0], b.sub[0]) && identical(a.sub[1], b.sub[1]); }
template <class R>
bool identical(const R& a, const R& b) {
  return identical(a.rs, b.rs) && identical(a.re, b.re) && identical(a.cs, b.cs) && identical(a.ce, b.ce) && identical(a.ds, b.ds) &&
         identical(a.de, b.de) && a.rr0 == b.rr0 && a.dr_last == b.dr_last;
}

// ---- a rank moved by a constant from the previous call ----------------------------------------------
// Every recurrence of compute_rank and of the accumulation is a max or a sum of times and
// durations, except three maxima with 0 (a rank's ring stream and compute before j0, an upstream
// that has sent no hop yet), so when all of a rank's input times and its upstream's sequences are
// the previous call's moved by one constant d (its durations and neighbours the same, the maxima
// with 0 not binding), its sequences are the previous call's moved by d and so are its results'
// times (its sums and steps are the same). To rounding: inputs are "moved by d" when within
// pl::near of the previous value + d at every piece's first and last step (a piece is a line, so
// at every step), the tolerance of the check in solve and of Period in simulator.cpp.
// (an infinite value only as itself: pl::near takes any finite value for near an infinite one,
// and a rank with no task before, best_end -inf, would pass for moved to one with a finite end)
bool moved_by(double a, double b, double d) {
  const double m = b + d;
  return std::isfinite(a) && std::isfinite(m) ? pl::near(a, m) : a == m;
}
// a + oa is b + ob moved by d (oa, ob: the sequences' offs)
bool moved_by(const Seq& a, double oa, const Seq& b, double ob, double d) {
  if (a.last != b.last || a.p.size() != b.p.size()) return false;
  for (size_t k = 0; k < a.p.size(); ++k) {
    const pl::Piece &x = a.p[k], &y = b.p[k];
    if (x.j != y.j || !moved_by(x.v + oa, y.v + ob, d)) return false;
    const int64_t e = (k + 1 < a.p.size() ? a.p[k + 1].j : a.last) - 1;
    if (e > x.j && !moved_by(x.at(e) + oa, y.at(e) + ob, d)) return false;
  }
  return true;
}
bool moved_by(const Seq2& a, double oa, const Seq2& b, double ob, double d) {
  if (a.a != b.a || a.b != b.b) return false;
  for (int par = 0; par < 2; ++par)
    if (a.has(par) && !moved_by(a.sub[par], oa, b.sub[par], ob, d)) return false;
  return true;
}
}  // namespace

// Whether every value v in [lo, hi] passes moved_by(v + oa, v + ob, d) (the stored values of one
// sequence with two offs), from bounds alone: with u = 2^-53, |fl(v + oa) - fl(fl(v + ob) + d)| <=
// |oa - ob - d| + u (|v + oa| + |v + ob| + |v + ob + d|) (1 + u), each at most |v| + |oa| + |ob| + |d|;
// g, |oa - ob - d| computed in two roundings, is off by at most 2u (|oa| + |ob| + |d|); and
// pl::near accepts once that is at most 1e-12 |fl(v + oa)| >= 1e-12 (lo + oa) (1 - u) (1e-12 and
// its product rounded: 0.999e-12). False (then the values are compared one by one) where it cannot tell.
void run_starts(const std::vector<double>& v, std::vector<int64_t>& starts) {
  starts.clear();
  const size_t n = v.size();
  if (n == 0) return;
  const double* c = v.data();
  starts.push_back(0);
  // two doubles per compare (GCC's vector extension: SSE2's cmpeqpd on x86-64, NEON elsewhere)
  using v2d = double __attribute__((vector_size(16)));
  using v2m = long long __attribute__((vector_size(16)));  // a compare's lanes: -1 true, 0 false
  auto load = [c](size_t i) {
    v2d v;
    std::memcpy(&v, c + i, sizeof v);
    return v;
  };
  double x = c[0];  // the run's value
  size_t j = 1;
  while (j < n) {
    const v2d xx = {x, x};
    for (; j + 8 <= n; j += 8) {  // whole blocks equal to x
      const v2m same = (load(j) == xx) & (load(j + 2) == xx) & (load(j + 4) == xx) & (load(j + 6) == xx);
      if (!(same[0] & same[1])) break;
    }
    const size_t stop = std::min(n, j + 8);
    for (; j < stop && c[j] == x; ++j) {
    }
    if (j < stop) {  // a new run
      starts.push_back(static_cast<int64_t>(j));
      x = c[j++];
    }
  }
}

bool ring_moved_by_bound(double lo, double hi, double oa, double ob, double d) {
  if (!(lo <= hi) || !(lo + oa > 0)) return false;  // (also NaN, and no values)
  const double u = std::ldexp(1.0, -53);
  const double mag = std::max(std::abs(lo), std::abs(hi)) + std::abs(oa) + std::abs(ob) + std::abs(d);
  const double g = std::abs((oa - ob) - d);
  const double slack = 8 * u * mag;  // 3u (1 + u) + 2u, generously
  return std::isfinite(mag) && g + slack <= 0.999e-12 * (lo + oa);
}

namespace {
// x's sequences and y's trade storage (their offs, rr0 and dr_last stay)
template <class R>
void swap_sequences(R& x, R& y) {
  using std::swap;  // (pl::swap: the pieces' storage, no copy)
  swap(x.rs, y.rs), swap(x.re, y.re), swap(x.cs, y.cs);
  swap(x.ce, y.ce), swap(x.ds, y.ds), swap(x.de, y.de);
  std::swap(x.lo, y.lo), std::swap(x.hi, y.hi);
}
// x's re, ce, de with its off added (x itself where it is 0; else written into `scratch`)
template <class R>
const R& actual(const R& x, R& scratch) {
  if (x.off == 0) return x;
  add_constant(scratch.re, x.re, x.off);
  add_constant(scratch.ce, x.ce, x.off);
  add_constant(scratch.de, x.de, x.off);
  scratch.off = 0;
  return scratch;
}
// Whether rank r (upstream u, whose sequences are `ur`) is the previous call's rank r moved by a
// constant, which it returns in d.
template <class S>
bool can_move(const RingBackwardStore<S>& st, size_t r, size_t u, const typename RingBackwardStore<S>::Rank& ur, const std::vector<RingBackwardRank>& in,
              double& d) {
  const RingBackwardRank &me = in[r], &pm = st.prev_in[r], &up = in[u], &pu = st.prev_in[u];
  d = me.have_end - pm.have_end;
  if (!std::isfinite(d) || me.cost != pm.cost || me.prev != pm.prev || up.cost != pu.cost || !up.dkv_valid || !pu.dkv_valid) return false;
  // (the maxima with 0: ring_end and compute_end are times, >= 0 where the rank has such a task)
  if (!(me.ring_end > 0 && pm.ring_end > 0 && me.compute_end > 0 && pm.compute_end > 0)) return false;
  if (!moved_by(me.have_start, pm.have_start, d) || !moved_by(me.have_ready, pm.have_ready, d) || !moved_by(me.compute_end, pm.compute_end, d) ||
      !moved_by(me.prev_end, pm.prev_end, d) || !moved_by(me.ring_end, pm.ring_end, d) || !moved_by(up.dkv_end, pu.dkv_end, d) ||
      !moved_by(up.have_end, pu.have_end, d))
    return false;
  // The latest end of the rank's earlier tasks decides only whether one of these steps' tasks ends
  // later (best_role none or not; the sequences do not read it): moved or not, it does not bind
  // where the previous call's steps ended later than it (a role) and the moved end is later than
  // the new one by more than rounding (1e-9 relative, far above the move's 1e-12).
  if (!moved_by(me.best_end, pm.best_end, d)) {
    const RingBackwardResult& po = st.prev_out[r];
    const double top = po.best_end + d;
    if (po.best_role == RingBackwardResult::none || !(top - me.best_end > 1e-9 * std::abs(top))) return false;
  }
  // The upstream's previous sequences: its storage now where it was moved in this call. Moved by
  // the same d, it is the previous one moved by d but for the order of two additions (stored +
  // (off + d) against (stored + off) + d: rounding), so its pieces need no comparison; moved by
  // another d (most often a d a few ulps away: two ranks' arrivals rounded apart), the comparison
  // of its stored values with themselves is decided from their bounds where those suffice
  // (ring_moved_by_bound: the same answer without reading a piece; a third of the 1,024-rank plain
  // ring's moved ranks went through the comparison, 0.2% now).
  const bool up_moved = st.moved[u] != 0;
  if (up_moved && &ur == st.rank[u] && (st.delta[u] == d || ring_moved_by_bound(ur.lo, ur.hi, ur.off, st.prev_off[u], d))) return true;
  const auto& pr = up_moved ? *st.rank[u] : *st.prev_rank[u];
  const double po = up_moved ? st.prev_off[u] : pr.off;
  return moved_by(ur.re, ur.off, pr.re, po, d) && moved_by(ur.ce, ur.off, pr.ce, po, d) && moved_by(ur.de, ur.off, pr.de, po, d);
}
// Rank r becomes the previous call's moved by d: it takes that call's object (rank r's own, stale,
// goes to prev_rank[r]), with its off, rr0 and dr_last + d.
template <class S>
void do_move(RingBackwardStore<S>& st, size_t r, double d) {
  std::swap(st.rank[r], st.prev_rank[r]);
  auto& x = *st.rank[r];
  st.prev_off[r] = x.off, st.prev_rr0[r] = x.rr0, st.prev_dr_last[r] = x.dr_last;
  x.off = x.off + d;
  x.rr0 = x.rr0 + d;
  x.dr_last = x.dr_last + d;
  st.moved[r] = 1;
  st.delta[r] = d;
}
// (undoes do_move: the previous call's object back in prev_rank[r], as it was)
template <class S>
void undo_move(RingBackwardStore<S>& st, size_t r) {
  std::swap(st.rank[r], st.prev_rank[r]);
  auto& b = *st.prev_rank[r];
  b.off = st.prev_off[r], b.rr0 = st.prev_rr0[r], b.dr_last = st.prev_dr_last[r];
  st.moved[r] = 0;
  ++st.undone;
}

// The passes and the accumulation in one representation; false when a rank's sequences take more
// than max_pieces or the check does not hold.
template <class S>
bool solve(RingBackwardStore<S>& st, RingBackwardWork& w, int64_t j0, int64_t steps, double p, double q, const std::vector<RingBackwardRank>& in,
           std::vector<RingBackwardResult>& out) {
  using Rank = typename RingBackwardStore<S>::Rank;
  const size_t n = in.size();
  // the previous call's ranks (can_move, do_move), kept (pass 1 below writes every rank's anew) when it
  // timed the same steps of as many ranks with the same hops and cost vectors: the cost caches
  // are cleared where the vectors may have changed (ring_backward_closed_form, or a caller reusing
  // the work area for other vectors), and the previous call's ranks go with them
  const bool memo = st.prev_valid && st.prev_j0 == j0 && st.prev_steps == steps && st.prev_p == p && st.prev_q == q && st.prev_in.size() == n &&
                    !st.cost_seq.empty() && st.cost_seq.size() == st.prev_cost_entries;
  if (memo) std::swap(st.rank, st.prev_rank);
  st.prev_valid = false;
  st.moved.assign(n, 0);
  st.delta.assign(n, 0.0);
  st.prev_off.resize(n);
  st.prev_rr0.resize(n);
  st.prev_dr_last.resize(n);
  st.reused = st.computed = st.undone = 0;
  while (st.rank.size() < n) {
    st.ranks.push_back(std::make_unique<Rank>());
    st.rank.push_back(st.ranks.back().get());
  }
  // the lower bound standing for a cycle's last rank in the first pass: nothing binds
  pl::constant(st.lower.re, j0, steps - 1, 0.0);
  pl::constant(st.lower.ce, j0, steps, 0.0);
  pl::constant(st.lower.de, j0, steps, 0.0);
  st.costs.resize(n);
  for (size_t r = 0; r < n; ++r)  // (a rank's cost vector as in the previous call: its sequence found then)
    if (!memo || in[r].cost != st.prev_in[r].cost) st.costs[r] = &cost_seq(st, w, in[r].cost, j0, steps);
  w.seen.assign(n, 0);
  w.passes = 0;
  const bool guessed = st.tails_j0 == j0 && st.tails_steps == steps && st.tail_known.size() == n;  // (the same steps, the same ranks)
  if (!guessed) {
    st.tail_before.resize(n);
    st.tail_have_before.assign(n, 0.0);
    st.tail_known.assign(n, 0);
    st.tails_j0 = j0;
    st.tails_steps = steps;
  }
  const int64_t max_passes = 2 + steps;  // (two when the lag argument holds)
  // A rank's three sequences in more pieces than this and the closed form gives way to the sweep
  // (a piece costs about what ten steps of the sweep do). Without recompute a long plain ring's
  // computes can alternate, compute-bound one step and waiting the next: a staircase of two-step
  // pieces, not a few lines.
  const int64_t max_pieces = std::max<int64_t>(48, (steps - j0) / 4);
  for (size_t s = 0; s < n; ++s) {
    if (w.seen[s]) continue;
    // the cycle through s, in the direction the blocks travel: order[0] = s, order[i+1] = next
    w.order.clear();
    for (int x = static_cast<int>(s); !w.seen[static_cast<size_t>(x)]; x = w.next[static_cast<size_t>(x)]) {
      w.seen[static_cast<size_t>(x)] = 1;
      w.order.push_back(x);
    }
    const size_t L = w.order.size();
    const int first = w.order.front(), tail = w.order.back();
    if (in[static_cast<size_t>(first)].prev != tail) return false;
    // false when a rank's times are not a few lines (then the sweep is faster). After the first
    // pass (`again`), a rank whose sequences come out bit for bit as in the pass before ends the
    // pass: every rank after it reads only its upstream's sequences (and its own input), so it
    // would come out as before too.
    // A rank moved again by the same d (d depends on its inputs only) is as before too.
    auto pass = [&](const Rank& upstream_of_first, bool again) {
      for (size_t i = 0; i < L; ++i) {
        const size_t r = static_cast<size_t>(w.order[i]);
        const size_t u = static_cast<size_t>(in[r].prev);
        const Rank& ur = i == 0 ? upstream_of_first : *st.rank[u];
        const bool was_moved = again && st.moved[r];
        double d = 0;
        // (the first rank of the first pass has a stand-in for its upstream: computed)
        if (memo && (i > 0 || again) && can_move(st, r, u, ur, in, d)) {
          if (was_moved) break;
          do_move(st, r, d);
          ++st.reused;
        } else {
          if (was_moved) undo_move(st, r);
          Rank& x = *st.rank[r];
          if (!was_moved && again) std::swap(x, st.before);
          st.moved[r] = 0;
          compute_rank(st, x, in[r], actual(ur, st.actual_up), in[u], *st.costs[r], j0, steps, p, q);
          x.off = 0;
          ++st.computed;
          if (again && !was_moved && identical(x, st.before)) break;
        }
        const Rank& x = *st.rank[r];
        if (static_cast<int64_t>(pieces(x.rs) + pieces(x.cs) + pieces(x.ds)) > max_pieces) return false;
      }
      ++w.passes;
      return true;
    };
    // the first pass from the lower bound, or from this cycle's last rank in the previous call
    // moved along: any guess gives the same result (one pass makes the last rank exact whatever
    // its upstream stood for, by the lag argument above: its step j depends on the first rank's
    // upstream at steps <= j - L + 1 only, none when the cycle is the ring), but a guess near the
    // truth makes the first pass nearly right, and the second ends where a rank comes out as before
    const Rank* first_upstream = &st.lower;
    if (guessed && st.tail_known[static_cast<size_t>(tail)]) {
      const Rank& b = st.tail_before[static_cast<size_t>(tail)];
      const double moved = in[static_cast<size_t>(tail)].have_end - st.tail_have_before[static_cast<size_t>(tail)];
      add_constant(st.guess.re, b.re, moved);
      add_constant(st.guess.ce, b.ce, moved);
      add_constant(st.guess.de, b.de, moved);
      first_upstream = &st.guess;
    }
    if (!pass(*first_upstream, false)) return false;
    for (int64_t k = 1;; ++k) {
      if (k >= max_passes) return false;
      {
        const Rank& tl = actual(*st.rank[static_cast<size_t>(tail)], st.actual_tail);
        st.check.re = tl.re, st.check.ce = tl.ce, st.check.de = tl.de;
      }
      if (!pass(st.check, true)) return false;
      const Rank& tl = actual(*st.rank[static_cast<size_t>(tail)], st.actual_tail);
      if (same(tl.re, st.check.re) && same(tl.ce, st.check.ce) && same(tl.de, st.check.de)) break;
    }
    Rank& kept = st.tail_before[static_cast<size_t>(tail)];
    const Rank& tl = actual(*st.rank[static_cast<size_t>(tail)], st.actual_tail);
    kept.re = tl.re, kept.ce = tl.ce, kept.de = tl.de;
    st.tail_have_before[static_cast<size_t>(tail)] = in[static_cast<size_t>(tail)].have_end;
    st.tail_known[static_cast<size_t>(tail)] = 1;
  }
  // what each rank's steps add, its last tasks and the task ending last
  out.resize(n);
  st.prev_out.resize(n);
  const int64_t last = steps - 1;
  for (size_t r = 0; r < n; ++r) {
    const RingBackwardRank& me = in[r];
    const Rank& x = *st.rank[r];
    const S& cost = *st.costs[r];
    RingBackwardResult& o = out[r];
    if (st.moved[r]) {  // the previous call's results moved (can_move, do_move), kept for the next call
      const double d = st.delta[r];
      RingBackwardResult& po = st.prev_out[r];
      po.c_start += d, po.c_end += d, po.d_start += d, po.d_end += d, po.d_ready += d;
      if (po.best_role != RingBackwardResult::none) po.best_start += d, po.best_end += d, po.best_ready += d;
      o = po;
      continue;
    }
    o = RingBackwardResult{};
    S* t = st.t;
    o.busy_s = pl::sum(cost);
    // waits: a compute's idle gap (after the previous compute) goes to the other ranks for as long
    // as its block's receive waited for the upstream, the rest to the transfer
    const double cs0 = x.cs.at(j0);
    const double gap0 = cs0 - me.prev_end;
    if (gap0 > 0) {
      const double others = std::min(gap0, std::max(0.0, me.have_start - me.have_ready));
      o.imbalance_s += others;
      o.exposed_s += gap0 - others;
    }
    if (last > j0) {
      // steps j > j0, indexed by j - 1 in [j0, last): gap = max(0, re - ce), the receive's wait rs - rr
      pl::sub(t[1], x.re, x.ce);  // (over x.re's steps)
      pl::max_constant(t[2], t[1], 0.0);  // gaps
      if (last > j0 + 1) {
        restrict(t[0], x.de, j0, last - 1);
        pl::max(t[3], t[0], x.re);  // (over t[0]'s steps)
        shift(t[0], t[3], 1);
        point_then(t[1], j0, x.rr0, t[0], last);
      } else {
        point_then(t[1], j0, x.rr0, S{}, last);
      }
      pl::sub(t[0], x.rs, t[1]);
      pl::max_constant(t[3], t[0], 0.0);  // the receives' waits for the upstream
      pl::min(t[4], t[2], t[3]);
      pl::sub(t[0], t[2], t[4]);
      o.imbalance_s += pl::sum(t[4]);
      o.exposed_s += pl::sum(t[0]);
    }
    // the last step's tasks, as the sweep times them (end = start + duration)
    const double c_last = cost.back();
    o.c_start = x.cs.back();
    o.c_end = o.c_start + c_last;
    o.d_start = x.ds.back();
    o.d_end = o.d_start + q;
    o.d_ready = x.dr_last;
    // the task ending last: every stream's ends never decrease, so the candidates are each
    // stream's first task reaching its final end; the first created among those with the
    // largest end (a receive before the compute before the hop of a step)
    auto e_r = [&](int64_t i) { return x.rs.at(i) + p; };
    auto e_c = [&](int64_t i) { return x.cs.at(i) + cost.at(i); };
    auto e_d = [&](int64_t i) { return x.ds.at(i) + q; };
    double top = me.best_end;
    const double fr = last > j0 ? e_r(last - 1) : -std::numeric_limits<double>::infinity();
    const double fc = o.c_end, fd = o.d_end;
    top = std::max({top, fr, fc, fd});
    if (top > me.best_end) {
      int64_t bj = steps;
      RingBackwardResult::Role role = RingBackwardResult::none;
      auto consider = [&](double final_end, RingBackwardResult::Role ro, int64_t a, int64_t b, auto&& value) {
        if (final_end != top) return;
        const int64_t i = pl::first_at_least(a, b, top, value);
        if (i < bj || (i == bj && ro < role)) bj = i, role = ro;
      };
      if (last > j0) consider(fr, RingBackwardResult::recv, j0, last, e_r);
      consider(fc, RingBackwardResult::compute, j0, steps, e_c);
      consider(fd, RingBackwardResult::dkv, j0, steps, e_d);
      o.best_role = role;
      o.best_j = bj;
      switch (role) {
        case RingBackwardResult::recv:
          o.best_start = x.rs.at(bj);
          o.best_end = e_r(bj);
          o.best_ready = bj == j0 ? x.rr0 : std::max(e_d(bj - 1), e_r(bj - 1));
          break;
        case RingBackwardResult::compute:
          o.best_start = x.cs.at(bj);
          o.best_end = e_c(bj);
          o.best_ready = o.best_start;
          break;
        case RingBackwardResult::dkv:
          o.best_start = x.ds.at(bj);
          o.best_end = e_d(bj);
          o.best_ready = bj < last ? e_r(bj) : x.dr_last;
          break;
        case RingBackwardResult::none: break;
      }
    }
  }
  st.prev_in = in;
  for (size_t r = 0; r < n; ++r)
    if (!st.moved[r]) st.prev_out[r] = out[r];
  st.prev_valid = true;
  st.prev_cost_entries = st.cost_seq.size();
  st.prev_j0 = j0;
  st.prev_steps = steps;
  st.prev_p = p;
  st.prev_q = q;
  return true;
}

}  // namespace

bool ring_backward_closed_form(int64_t j0, int64_t steps, double p2p_s, double p2p_dkv_s, const std::vector<RingBackwardRank>& in,
                               std::vector<RingBackwardResult>& out, RingBackwardWork& w) {
  const size_t n = in.size();
  if (j0 < 1 || steps <= j0 || n < 2) return false;
  const double p = std::max(0.0, p2p_s), q = std::max(0.0, p2p_dkv_s);
  w.next.assign(n, -1);
  for (size_t r = 0; r < n; ++r) {
    const int pr = in[r].prev;
    if (pr < 0 || static_cast<size_t>(pr) >= n || static_cast<size_t>(pr) == r || w.next[static_cast<size_t>(pr)] >= 0) return false;
    w.next[static_cast<size_t>(pr)] = static_cast<int>(r);
  }
  if (w.cost_j0 != j0 || w.cost_steps != steps) {
    w.lines.cost_seq.clear();
    w.cost_runs.clear();
    w.stairs.cost_seq.clear();
    w.cost_j0 = j0;
    w.cost_steps = steps;
  }
  // lines first; staircases (even and odd steps apart) once lines took too many pieces, from then
  // on (the later layers of a step are alike). A staircase costs about twice as much as lines: on
  // the 70B/1M plain rings without recompute it was 1.6x slower than the sweep at 256 steps and
  // 1.3x faster at 512 (bench_simulator, same run), so below 384 steps the sweep took it until
  // session 16; with the ranks moved from the layer before (can_move, do_move) the staircases are
  // 0.80-0.97x the sweep's CPU time at 256 steps too (the space's cp=256 rings without recompute,
  // `bench_simulator --one`, both builds interleaved).
  if (w.period == 1) {
    if (solve(w.lines, w, j0, steps, p, q, in, out)) return true;
    w.period = 2;
  }
  return solve(w.stairs, w, j0, steps, p, q, in, out);
}

// ---- the sweep ------------------------------------------------------------------------------------
// Each loop below is one task kind for every rank at one step, on arrays that do not alias (the
// compiler vectorises them); `up` is the upstream's value of some array, gathered before the loop.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CTX_SWEEP_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CTX_SWEEP_CLONES
#endif
namespace {
namespace sweep {
// Four ranks per operation, in the compilers' vector extensions (GCC and Clang): the loops select
// on the same comparison several times, which GCC's vectoriser does not do by itself. On x86-64
// the three loops are built twice, for AVX2 and for the baseline (two SSE2 halves), and the
// loader picks one (target_clones); the operations are the same IEEE ones (no FMA), so both
// give the same bits. CTX_VMAX and CTX_VMIN are std::max and std::min lane by lane (the same values, NaN
// and signed zeros included); arrays are padded to a multiple of four.
typedef double v2 __attribute__((vector_size(32)));
typedef double v2u __attribute__((vector_size(32), aligned(8), may_alias));  // for loads and stores at any double
typedef long long m2 __attribute__((vector_size(32)));
constexpr size_t kLanes = 4;
// (macros, not functions: no 32-byte vector crosses a call in the baseline build)
#define CTX_LD(p) (*reinterpret_cast<const v2u*>(p))
#define CTX_ST(p, v) (*reinterpret_cast<v2u*>(p) = (v))
#define CTX_SEL(m, a, b) ((v2)(((m2)(m) & (m2)(a)) | (~(m2)(m) & (m2)(b))))
#define CTX_VMAX(a, b) CTX_SEL((a) < (b), (b), (a))
#define CTX_VMIN(a, b) CTX_SEL((b) < (a), (b), (a))
// a stream's top becomes the task just timed where `rise` holds
#define CTX_RISE_TO(top, r, rise, role_v, j_v, start_v, ready_v)                \
  do {                                                                          \
    const v2 role_ = zero + (role_v), j_ = zero + (j_v);                        \
    CTX_ST((top).role + (r), CTX_SEL(rise, role_, CTX_LD((top).role + (r))));   \
    CTX_ST((top).j + (r), CTX_SEL(rise, j_, CTX_LD((top).j + (r))));           \
    CTX_ST((top).start + (r), CTX_SEL(rise, start_v, CTX_LD((top).start + (r)))); \
    CTX_ST((top).ready + (r), CTX_SEL(rise, ready_v, CTX_LD((top).ready + (r)))); \
  } while (0)

void gather(double* up, const double* x, const int* prev, size_t n, bool shift) {
  if (shift) {  // prev[r] = r - 1 (mod n): the plain ring
    up[0] = x[n - 1];
    std::copy(x, x + n - 1, up + 1);
  } else {
    for (size_t r = 0; r < n; ++r) up[r] = x[prev[r]];
  }
}

// The top of a stream: the step, role, start and readiness of its last strict rise.
struct Top {
  double *role, *j, *start, *ready;
};

// the receive of the next block: after r's ring stream, r's block and the upstream's block (a
// rank that is its own upstream is ready only when the whole receive is)
CTX_SWEEP_CLONES void receive(size_t n, double j, double p, const double* ring_end, const double* h_end, const double* up_h_end, const double* own,
             double* nr_start, double* nr_end, double* nr_ready, const Top& top, bool first) {
  const v2 zero = {0.0, 0.0, 0.0, 0.0}, pv = zero + p;
  const m2 force = {-first, -first, -first, -first};  // all ones: every lane rises
  for (size_t r = 0; r < n; r += kLanes) {
    const v2 re = CTX_LD(ring_end + r);
    const v2 ready = CTX_VMAX(CTX_VMAX(zero, re), CTX_LD(h_end + r));
    const v2 full = CTX_VMAX(ready, CTX_LD(up_h_end + r));
    const v2 rd = CTX_SEL(CTX_LD(own + r) != zero, full, ready);
    const v2 end = full + pv;
    CTX_ST(nr_start + r, full);
    CTX_ST(nr_end + r, end);
    CTX_ST(nr_ready + r, rd);
    CTX_RISE_TO(top, r, (m2)(end > re) | force, 0.0, j, full, rd);
  }
}

// the step's compute: after r's previous compute and its block; a wait is for other ranks as far
// as the block's receive waited for them (attribute() in simulator.cpp), the rest for the transfer
// The step's compute for the lanes r .. r + kLanes - 1 (compute() and receive_compute_shift();
// inlined into each clone: only pointers and scalars cross it, no vector)
[[gnu::always_inline]] inline void compute_lanes(size_t r, double j, const double* cost, const double* h_start, const double* h_end,
                                                 const double* h_ready, double* c_start, double* c_end, double* prev_end, double* busy,
                                                 double* imbalance, double* exposed, const Top& top, bool first) {
  const v2 zero = {0.0, 0.0, 0.0, 0.0};
  const m2 force = {-first, -first, -first, -first};  // all ones: every lane rises
  const v2 dur = CTX_LD(cost + r), ce = CTX_LD(c_end + r);
  const v2 start = CTX_VMAX(CTX_VMAX(zero, ce), CTX_LD(h_end + r));
  const v2 end = start + dur;
  const v2 gap = start - CTX_LD(prev_end + r);
  const v2 g = CTX_SEL(gap > zero, gap, zero);
  const v2 others = CTX_VMIN(g, CTX_VMAX(zero, CTX_LD(h_start + r) - CTX_LD(h_ready + r)));
  CTX_ST(busy + r, CTX_LD(busy + r) + dur);
  CTX_ST(imbalance + r, CTX_LD(imbalance + r) + others);
  CTX_ST(exposed + r, CTX_LD(exposed + r) + (g - others));
  const m2 rise = (m2)(end > ce) | force;
  CTX_ST(top.j + r, CTX_SEL(rise, zero + j, CTX_LD(top.j + r)));
  CTX_ST(top.start + r, CTX_SEL(rise, start, CTX_LD(top.start + r)));
  CTX_ST(prev_end + r, end);
  CTX_ST(c_start + r, start);
  CTX_ST(c_end + r, end);
}
CTX_SWEEP_CLONES void compute(size_t n, double j, const double* cost, const double* h_start, const double* h_end, const double* h_ready, double* c_start,
             double* c_end, double* prev_end, double* busy, double* imbalance, double* exposed, const Top& top, bool first) {
  for (size_t r = 0; r < n; r += kLanes)
    compute_lanes(r, j, cost, h_start, h_end, h_ready, c_start, c_end, prev_end, busy, imbalance, exposed, top, first);
}

// the dK,dV hop from the upstream: after r's ring stream (this step's receive, or the last hop),
// the upstream's compute of the step and the upstream's previous hop
CTX_SWEEP_CLONES void hop(size_t n, double j, double q, const double* ring_prev, const double* up_c_end, const double* up_d_end, const double* own,
         double* d_start, double* d_end, double* d_ready, const Top& top, bool first) {
  const v2 zero = {0.0, 0.0, 0.0, 0.0}, qv = zero + q;
  const m2 force = {-first, -first, -first, -first};  // all ones: every lane rises
  for (size_t r = 0; r < n; r += kLanes) {
    const v2 rp = CTX_LD(ring_prev + r);
    const v2 ready = CTX_VMAX(zero, rp);
    const v2 full = CTX_VMAX(CTX_VMAX(ready, CTX_LD(up_c_end + r)), CTX_LD(up_d_end + r));
    const v2 rd = CTX_SEL(CTX_LD(own + r) != zero, full, ready);
    const v2 end = full + qv;
    CTX_ST(d_start + r, full);
    CTX_ST(d_end + r, end);
    CTX_ST(d_ready + r, rd);
    CTX_RISE_TO(top, r, (m2)(end > rp) | force, 2.0, j, full, rd);
  }
}

// The plain ring (prev[r] = r - 1, mod n, n >= 2: no rank is its own upstream) after the first
// step, in two loops per step instead of three and no gathers: every array the upstream's value is
// read from has a slot before its first element holding the last rank's value (x[-1] = x[n-1]), so
// the upstream's values are x + r - 1. The receive and the compute of a step read nothing the
// other writes (the receive writes the next block's arrays, the compute reads the current block's),
// so they run in one loop, each lane as receive() then compute() would: the same operations, the
// same bits.
CTX_SWEEP_CLONES void receive_compute_shift(size_t n, double j, double p, const double* ring_end, const double* h_end, double* nr_start, double* nr_end,
                                             double* nr_ready, const Top& rtop, const double* cost, const double* h_start, const double* h_ready,
                                             double* c_start, double* c_end, double* prev_end, double* busy, double* imbalance, double* exposed,
                                             const Top& ctop) {
  const v2 zero = {0.0, 0.0, 0.0, 0.0}, pv = zero + p;
  for (size_t r = 0; r < n; r += kLanes) {
    const v2 he = CTX_LD(h_end + r);
    {  // receive (own = 0: the readiness is the rank's own)
      const v2 re = CTX_LD(ring_end + r);
      const v2 ready = CTX_VMAX(CTX_VMAX(zero, re), he);
      const v2 full = CTX_VMAX(ready, CTX_LD(h_end + r - 1));
      const v2 end = full + pv;
      CTX_ST(nr_start + r, full);
      CTX_ST(nr_end + r, end);
      CTX_ST(nr_ready + r, ready);
      CTX_RISE_TO(rtop, r, (m2)(end > re), 0.0, j, full, ready);
    }
    compute_lanes(r, j, cost, h_start, h_end, h_ready, c_start, c_end, prev_end, busy, imbalance, exposed, ctop, false);
  }
}

// The plain ring's hops after the first step (as hop(), own = 0), from the last block down: a
// block's lanes read the upstream's previous hop (d_end + r - 1) before anything below them is
// overwritten, and d_end[-1] holds the last rank's previous hop; c_end[-1] the last rank's compute
// of this step. `ring_prev` may be d_end itself (the last step): each lane reads it before writing.
CTX_SWEEP_CLONES void hop_shift(size_t n, double j, double q, const double* ring_prev, const double* c_end, double* d_start, double* d_end, double* d_ready,
                                const Top& top) {
  const v2 zero = {0.0, 0.0, 0.0, 0.0}, qv = zero + q;
  for (size_t r = n; r > 0;) {
    r -= kLanes;
    const v2 rp = CTX_LD(ring_prev + r);
    const v2 ready = CTX_VMAX(zero, rp);
    const v2 full = CTX_VMAX(CTX_VMAX(ready, CTX_LD(c_end + r - 1)), CTX_LD(d_end + r - 1));
    const v2 end = full + qv;
    CTX_ST(d_start + r, full);
    CTX_ST(d_end + r, end);
    CTX_ST(d_ready + r, ready);
    CTX_RISE_TO(top, r, (m2)(end > rp), 2.0, j, full, ready);
  }
}
#undef CTX_LD
#undef CTX_ST
#undef CTX_SEL
#undef CTX_VMAX
#undef CTX_VMIN
#undef CTX_RISE_TO
}  // namespace sweep

// One rank's values at the sweep's end, as the sweep keeps them per rank (its arrays).
struct SweepRankEnd {
  double busy, imbalance, exposed, c_start, c_end, d_start, d_end, d_ready;
  double ct_j, ct_start, rt_role, rt_j, rt_start, rt_ready;  // the last strict rise of each stream
};

// The rank's result: the sums, the last compute and hop, and the last-ending task. Each stream's ends
// never decrease, so a stream's latest end is first reached at its last strict rise (its first task in
// these steps counting as one); of the two streams the later end, on a tie the task created first
// (within a step: receive, compute, hop); none unless it ends after every earlier task.
void write_rank_result(const SweepRankEnd& v, const RingBackwardRank& in, RingBackwardResult& o) {
  o.busy_s = v.busy, o.imbalance_s = v.imbalance, o.exposed_s = v.exposed;
  o.c_start = v.c_start, o.c_end = v.c_end;
  o.d_start = v.d_start, o.d_end = v.d_end, o.d_ready = v.d_ready;
  const double ec = o.c_end, er = o.d_end, top = std::max(ec, er);
  if (!(top > in.best_end)) return;
  const bool ring_first = er == ec ? (v.rt_j < v.ct_j || (v.rt_j == v.ct_j && v.rt_role == 0.0)) : er > ec;
  if (ring_first) {
    o.best_role = v.rt_role == 0.0 ? RingBackwardResult::recv : RingBackwardResult::dkv;
    o.best_j = static_cast<int64_t>(v.rt_j);
    o.best_start = v.rt_start, o.best_end = er, o.best_ready = v.rt_ready;
  } else {
    o.best_role = RingBackwardResult::compute;
    o.best_j = static_cast<int64_t>(v.ct_j);
    o.best_start = v.ct_start, o.best_end = ec, o.best_ready = v.ct_start;
  }
}

}  // namespace

void ring_backward_sweep(int64_t j0, int64_t steps, double p2p_s, double p2p_dkv_s, const std::vector<RingBackwardRank>& in,
                         std::vector<RingBackwardResult>& out, RingSweepWork& w) {
  const size_t n = in.size(), np = (n + sweep::kLanes - 1) / sweep::kLanes * sweep::kLanes;
  const double p = std::max(0.0, p2p_s), q = std::max(0.0, p2p_dkv_s);
  // the per-rank arrays (np each; the padding lanes compute on zeros and are never read)
  enum : size_t {
    kHStart, kHEnd, kHReady, kNrStart, kNrEnd, kNrReady, kCStart, kCEnd, kPrevEnd, kDStart, kDEnd, kDReady, kRingEnd, kBusy,
    kImbalance, kExposed, kCtJ, kCtStart, kRtRole, kRtJ, kRtStart, kRtReady, kUp1, kUp2, kCostRow, kOwn, kArrays
  };
  // (each array has kLanes slots before it: the plain ring's kernels read x[-1])
  w.v.assign(kArrays * (np + sweep::kLanes), 0.0);
  auto a = [&](size_t k) { return w.v.data() + k * (np + sweep::kLanes) + sweep::kLanes; };
  w.prev.resize(n);
  bool shift = n >= 2;
  for (size_t r = 0; r < n; ++r) {
    const RingBackwardRank& x = in[r];
    w.prev[r] = x.prev;
    a(kOwn)[r] = x.prev == static_cast<int>(r) ? 1.0 : 0.0;
    shift = shift && static_cast<size_t>(x.prev) == (r + n - 1) % n;
    a(kHStart)[r] = x.have_start, a(kHEnd)[r] = x.have_end, a(kHReady)[r] = x.have_ready;
    a(kCEnd)[r] = x.compute_end, a(kPrevEnd)[r] = x.prev_end;
    a(kDEnd)[r] = x.dkv_end, a(kRingEnd)[r] = x.ring_end;
    a(kCtJ)[r] = -1, a(kRtRole)[r] = -1, a(kRtJ)[r] = -1;
  }
  const sweep::Top ctop{nullptr, a(kCtJ), a(kCtStart), nullptr}, rtop{a(kRtRole), a(kRtJ), a(kRtStart), a(kRtReady)};
  // the costs: a (steps, ranks) matrix built once per set of cost vectors when it is small, else
  // gathered per step
  auto cost_at = [&](size_t r, int64_t j) {
    const std::vector<double>& cv = *in[r].cost;
    return std::max(0.0, static_cast<size_t>(j) < cv.size() ? cv[static_cast<size_t>(j)] : 0.0);
  };
  const bool matrix = static_cast<double>(steps) * static_cast<double>(np) <= static_cast<double>(1 << 20);
  if (matrix) {
    bool same = w.cost_steps == steps && w.cost_of.size() == n;
    for (size_t r = 0; same && r < n; ++r) same = w.cost_of[r] == in[r].cost;
    if (!same) {
      w.cost_steps = steps;
      w.cost_of.resize(n);
      for (size_t r = 0; r < n; ++r) w.cost_of[r] = in[r].cost;
      w.cost.assign(static_cast<size_t>(steps) * np, 0.0);
      for (int64_t j = 0; j < steps; ++j)
        for (size_t r = 0; r < n; ++r) w.cost[static_cast<size_t>(j) * np + r] = cost_at(r, j);
    }
  }
  const int* prev = w.prev.data();
  // the block held and the next one received swap roles after every step with a receive; the
  // ring stream's last task is the previous step's hop after the first step
  size_t have[3] = {kHStart, kHEnd, kHReady}, recv[3] = {kNrStart, kNrEnd, kNrReady};
  for (int64_t j = j0; j < steps; ++j) {
    const double jd = static_cast<double>(j);
    const bool has_recv = j + 1 < steps;
    const double* ring_end = j == j0 ? a(kRingEnd) : a(kDEnd);
    if (shift && j > j0) {  // the plain ring after the first step: two loops, no gathers
      const double* cost = a(kCostRow);
      if (matrix) {
        cost = w.cost.data() + static_cast<size_t>(j) * np;
      } else {
        for (size_t r = 0; r < n; ++r) a(kCostRow)[r] = cost_at(r, j);
      }
      double* h_end = a(have[1]);
      if (has_recv) {
        h_end[-1] = h_end[n - 1];
        sweep::receive_compute_shift(np, jd, p, ring_end, h_end, a(recv[0]), a(recv[1]), a(recv[2]), rtop, cost, a(have[0]), a(have[2]),
                                     a(kCStart), a(kCEnd), a(kPrevEnd), a(kBusy), a(kImbalance), a(kExposed), ctop);
      } else {
        sweep::compute(np, jd, cost, a(have[0]), h_end, a(have[2]), a(kCStart), a(kCEnd), a(kPrevEnd), a(kBusy), a(kImbalance), a(kExposed), ctop,
                       false);
      }
      a(kCEnd)[-1] = a(kCEnd)[n - 1];
      a(kDEnd)[-1] = a(kDEnd)[n - 1];
      sweep::hop_shift(np, jd, q, has_recv ? a(recv[1]) : ring_end, a(kCEnd), a(kDStart), a(kDEnd), a(kDReady), rtop);
      if (has_recv) std::swap(have, recv);
      continue;
    }
    if (has_recv) {
      sweep::gather(a(kUp1), a(have[1]), prev, n, shift);
      sweep::receive(np, jd, p, ring_end, a(have[1]), a(kUp1), a(kOwn), a(recv[0]), a(recv[1]), a(recv[2]), rtop, j == j0);
    }
    const double* cost = a(kCostRow);
    if (matrix) {
      cost = w.cost.data() + static_cast<size_t>(j) * np;
    } else {
      for (size_t r = 0; r < n; ++r) a(kCostRow)[r] = cost_at(r, j);
    }
    sweep::compute(np, jd, cost, a(have[0]), a(have[1]), a(have[2]), a(kCStart), a(kCEnd), a(kPrevEnd), a(kBusy), a(kImbalance), a(kExposed),
                   ctop, j == j0);
    sweep::gather(a(kUp1), a(kCEnd), prev, n, shift);
    if (j == j0) {  // a rank that has sent no hop yet has none to wait for
      for (size_t r = 0; r < n; ++r)
        a(kUp2)[r] = in[static_cast<size_t>(prev[r])].dkv_valid ? a(kDEnd)[prev[r]] : -std::numeric_limits<double>::infinity();
    } else {
      sweep::gather(a(kUp2), a(kDEnd), prev, n, shift);
    }
    // the hop's ring stream before it: this step's receive, or (the last step) the previous hop
    // (read before it is overwritten, lane by lane)
    sweep::hop(np, jd, q, has_recv ? a(recv[1]) : ring_end, a(kUp1), a(kUp2), a(kOwn), a(kDStart), a(kDEnd), a(kDReady), rtop,
               j == j0 && !has_recv);
    if (has_recv) std::swap(have, recv);
  }
  out.resize(n);
  for (size_t r = 0; r < n; ++r) {
    RingBackwardResult& o = out[r];
    o = RingBackwardResult{};
    write_rank_result({a(kBusy)[r], a(kImbalance)[r], a(kExposed)[r], a(kCStart)[r], a(kCEnd)[r], a(kDStart)[r], a(kDEnd)[r],
                       a(kDReady)[r], a(kCtJ)[r], a(kCtStart)[r], a(kRtRole)[r], a(kRtJ)[r], a(kRtStart)[r], a(kRtReady)[r]},
                      in[r], o);
  }
}

}  // namespace ctx
