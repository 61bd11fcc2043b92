// Sequences over a range of integer steps that are linear between a few breakpoints, and the
// max-plus operations the ring schedule needs on them: add, subtract, max, min, a scan
// s(j) = max(s(j-1) + inc(j), z(j)), sums and searches. A rank's times over the steps of one
// ring pass (when its block arrives, when its compute starts, when its dK,dV hop leaves) are such
// sequences with a handful of pieces (4-6 at 128 and at 1024 ranks), so one rank's whole pass
// costs O(pieces) instead of O(steps) (costmodel/ring_backward.cpp).
//
// Values are closed forms v + (i - j) s from a piece's start; a task-by-task sweep adds the same
// numbers one by one, so the two agree up to rounding (exactly on dyadic numbers:
// tests/test_simulator_oracle.cpp). Outputs are written into a caller's Seq (cleared; its
// capacity kept) so that a sweep allocates nothing once warm.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ctx::pl {

struct Piece {
  int64_t j = 0;  // first step of the piece
  double v = 0;   // value at step j
  double s = 0;   // slope: value at step i (j <= i < the next piece's j) is v + (i - j) s
  double at(int64_t i) const { return s == 0 ? v : v + static_cast<double>(i - j) * s; }
};

// Equal up to rounding: a line continued from a piece's start and the same line computed from a
// later point differ by a few ulps; pieces that continue one line are merged (exact on dyadic
// numbers, where such values are equal)
// (1e-12: the sequences of a staircase carry a rounding-level alternation of ~2e-13 of their
// values; every point a merged piece absorbs is checked against its line, so a merged piece is
// within 1e-12 of every value it stands for.)
inline bool near(double a, double b) { return a == b || std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b)); }
// Slopes equal up to rounding of the values they move: a slope taken as the difference of two
// values of size |v| is off by a few ulps of v, not of the slope.
inline bool near_slope(double s1, double s2, double v) { return s1 == s2 || std::abs(s1 - s2) <= 1e-12 * std::abs(v); }

// A sequence over the steps [first(), end): pieces in order, the first starting at first().
struct Seq {
  std::vector<Piece> p;
  int64_t last = 0;  // one past its last step

  bool empty() const { return p.empty(); }
  int64_t first() const { return p.front().j; }
  int64_t end() const { return last; }
  void clear(int64_t end_step) { p.clear(); last = end_step; }
  // the piece holding step i (first() <= i < end())
  size_t piece_of(int64_t i) const {
    if (p.size() <= 8) {
      size_t k = 0;
      while (k + 1 < p.size() && p[k + 1].j <= i) ++k;
      return k;
    }
    return static_cast<size_t>(std::upper_bound(p.begin(), p.end(), i, [](int64_t x, const Piece& q) { return x < q.j; }) - p.begin()) - 1;
  }
  double at(int64_t i) const { return p[piece_of(i)].at(i); }
  double back() const { return at(last - 1); }
  // appends a piece starting at j (>= the last start); merged into the previous one when it
  // continues its line (to rounding), replacing it when the previous one would be empty. A
  // one-step piece has no slope of its own: it takes the one that reaches the new piece, so that
  // a run of one-step pieces on one line becomes that line.
  void push(int64_t j, double v, double s) {
    if (!p.empty() && p.back().j == j) p.pop_back();  // (the piece before starts earlier: starts increase)
    if (!p.empty()) {
      Piece& b = p.back();
      if (near_slope(b.s, s, v) && near(b.at(j), v)) return;
      if (j == b.j + 1) {
        b.s = v - b.v;
        if (p.size() >= 2) {
          const Piece& a = p[p.size() - 2];
          if (near_slope(a.s, b.s, b.v) && near(a.at(b.j), b.v)) p.pop_back();  // b continues a's line
        }
        Piece& c = p.back();
        if (near_slope(c.s, s, v) && near(c.at(j), v)) return;  // and so does the new piece
      }
    }
    p.push_back({j, v, s});
  }
  friend void swap(Seq& a, Seq& b) noexcept {
    a.p.swap(b.p);
    std::swap(a.last, b.last);
  }
};

// ---- building ---------------------------------------------------------------------------------
inline void constant(Seq& out, int64_t a, int64_t b, double v) {
  out.clear(b);
  if (a < b) out.push(a, v, 0);
}
// out(i) = x(i - k) on [x.first() + k, x.end() + k)
inline void shift(Seq& out, const Seq& x, int64_t k) {
  out.clear(x.last + k);
  for (const Piece& q : x.p) out.p.push_back({q.j + k, q.v, q.s});
}
// out = x restricted to [a, b) (a >= x.first(), b <= x.end())
inline void restrict(Seq& out, const Seq& x, int64_t a, int64_t b) {
  out.clear(b);
  if (a >= b) return;
  for (size_t k = x.piece_of(a); k < x.p.size() && x.p[k].j < b; ++k) {
    const Piece& q = x.p[k];
    if (q.j < a) out.p.push_back({a, q.at(a), q.s});
    else out.p.push_back(q);
  }
}
// out(i) = x(i - k) on [a + k, b + k): restrict then shift in one copy (the same pieces)
inline void restrict_shift(Seq& out, const Seq& x, int64_t a, int64_t b, int64_t k) {
  out.clear(b + k);
  if (a >= b) return;
  for (size_t i = x.piece_of(a); i < x.p.size() && x.p[i].j < b; ++i) {
    const Piece& q = x.p[i];
    if (q.j < a) out.p.push_back({a + k, q.at(a), q.s});
    else out.p.push_back({q.j + k, q.v, q.s});
  }
}
// appends x (starting at out.end()) to out
inline void append(Seq& out, const Seq& x) {
  for (const Piece& q : x.p) out.push(q.j, q.v, q.s);
  out.last = x.last;
}
inline void add_constant(Seq& out, const Seq& x, double c) {
  out.clear(x.last);
  for (const Piece& q : x.p) out.p.push_back({q.j, q.v + c, q.s});
}

// ---- pointwise operations over the common steps of two sequences (equal ranges) --------------
namespace detail {
// Calls f(u, v, va, sa, vb, sb) for each maximal interval [u, v) on which both are one line,
// with their values at u.
template <class F>
void for_intervals(const Seq& a, const Seq& b, F&& f) {
  size_t ia = 0, ib = 0;
  int64_t u = std::max(a.first(), b.first());
  const int64_t end = std::min(a.last, b.last);
  ia = a.piece_of(u);
  ib = b.piece_of(u);
  while (u < end) {
    const int64_t na = ia + 1 < a.p.size() ? a.p[ia + 1].j : a.last;
    const int64_t nb = ib + 1 < b.p.size() ? b.p[ib + 1].j : b.last;
    const int64_t v = std::min({na, nb, end});
    f(u, v, a.p[ia].at(u), a.p[ia].s, b.p[ib].at(u), b.p[ib].s);
    u = v;
    if (u == na) ++ia;
    if (u == nb) ++ib;
  }
}
// The first step i in [u, v) where pred(i) holds (v: none), for a predicate false then true,
// from a guess near the change.
template <class P>
int64_t first_true(int64_t u, int64_t v, double guess, P&& pred) {
  int64_t i;
  if (!(guess > static_cast<double>(u))) i = u;  // (also NaN)
  else if (guess >= static_cast<double>(v)) i = v;
  else i = static_cast<int64_t>(std::ceil(guess));
  i = std::clamp(i, u, v);
  while (i > u && pred(i - 1)) --i;
  while (i < v && !pred(i)) ++i;
  return i;
}
// max (hi = true) or min of two lines on [u, v)
inline void extremum(Seq& out, bool hi, int64_t u, int64_t v, double va, double sa, double vb, double sb) {
  auto la = [&](int64_t i) { return va + static_cast<double>(i - u) * sa; };
  auto lb = [&](int64_t i) { return vb + static_cast<double>(i - u) * sb; };
  auto b_wins = [&](int64_t i) { return hi ? lb(i) > la(i) : lb(i) < la(i); };
  if (sa == sb) {
    out.push(u, (hi ? vb > va : vb < va) ? vb : va, sa);
    return;
  }
  // one line on the whole interval when it wins at both ends (the common case)
  const bool b_first = b_wins(u), b_last = b_wins(v - 1);
  if (b_first == b_last) {
    out.push(u, b_first ? vb : va, b_first ? sb : sa);
    return;
  }
  // b - a moves at sb - sa: b takes over from a once (toward b's side) or gives way to a once
  const bool b_gains = hi ? sb > sa : sb < sa;
  const double guess = static_cast<double>(u) + (va - vb) / (sb - sa);
  if (b_gains) {
    const int64_t i = first_true(u, v, guess, b_wins);
    if (i > u) out.push(u, va, sa);
    if (i < v) out.push(i, lb(i), sb);
  } else {
    const int64_t i = first_true(u, v, guess, [&](int64_t x) { return !b_wins(x); });
    if (i > u) out.push(u, vb, sb);
    if (i < v) out.push(i, la(i), sa);
  }
}
}  // namespace detail

inline void add(Seq& out, const Seq& a, const Seq& b) {
  out.clear(std::min(a.last, b.last));
  detail::for_intervals(a, b, [&](int64_t u, int64_t, double va, double sa, double vb, double sb) { out.push(u, va + vb, sa + sb); });
}
inline void sub(Seq& out, const Seq& a, const Seq& b) {
  out.clear(std::min(a.last, b.last));
  detail::for_intervals(a, b, [&](int64_t u, int64_t, double va, double sa, double vb, double sb) { out.push(u, va - vb, sa - sb); });
}
inline void max(Seq& out, const Seq& a, const Seq& b) {
  out.clear(std::min(a.last, b.last));
  detail::for_intervals(a, b, [&](int64_t u, int64_t v, double va, double sa, double vb, double sb) {
    detail::extremum(out, true, u, v, va, sa, vb, sb);
  });
}
inline void min(Seq& out, const Seq& a, const Seq& b) {
  out.clear(std::min(a.last, b.last));
  detail::for_intervals(a, b, [&](int64_t u, int64_t v, double va, double sa, double vb, double sb) {
    detail::extremum(out, false, u, v, va, sa, vb, sb);
  });
}
// out(i) = max(x(i), c)
inline void max_constant(Seq& out, const Seq& x, double c) {
  out.clear(x.last);
  for (size_t k = 0; k < x.p.size(); ++k) {
    const Piece& q = x.p[k];
    const int64_t v = k + 1 < x.p.size() ? x.p[k + 1].j : x.last;
    detail::extremum(out, true, q.j, v, q.v, q.s, c, 0.0);
  }
}

// out(i) = max(out(i - 1) + inc(i), z(i)) on the common steps [a, b) of inc and z, with
// out(a - 1) = init. Closed form where inc is constant; where it is not (push makes a run of
// one-step constants on a line one sloped piece), step by step.
inline void scan(Seq& out, double init, const Seq& inc, const Seq& z) {
  out.clear(std::min(inc.last, z.last));
  double prev = init;
  detail::for_intervals(inc, z, [&](int64_t u, int64_t v, double c, double cs, double zu, double zs) {
    if (cs != 0) {
      for (int64_t i = u; i < v; ++i) {
        const double x = std::max(prev + (c + static_cast<double>(i - u) * cs), zu + static_cast<double>(i - u) * zs);
        out.push(i, x, 0.0);
        prev = x;
      }
      return;
    }
    const double a0 = prev + c;  // the carried line: a0 + (i - u) c
    if (zs <= c) {
      // z cannot gain on the carried line: one line from the larger start
      const double start = std::max(a0, zu);
      out.push(u, start, c);
      prev = start + static_cast<double>(v - 1 - u) * c;
      return;
    }
    // z gains: the carried line until z passes it, then z
    auto zl = [&](int64_t i) { return zu + static_cast<double>(i - u) * zs; };
    auto al = [&](int64_t i) { return a0 + static_cast<double>(i - u) * c; };
    const int64_t i = detail::first_true(u, v, static_cast<double>(u) + (a0 - zu) / (zs - c), [&](int64_t x) { return zl(x) > al(x); });
    if (i > u) out.push(u, a0, c);
    if (i < v) out.push(i, zl(i), zs);
    prev = i < v ? zl(v - 1) : al(v - 1);
  });
}

// the sum of x over its steps
inline double sum(const Seq& x) {
  double total = 0;
  for (size_t k = 0; k < x.p.size(); ++k) {
    const Piece& q = x.p[k];
    const double n = static_cast<double>((k + 1 < x.p.size() ? x.p[k + 1].j : x.last) - q.j);
    total += n * q.v + (q.s == 0 ? 0.0 : q.s * n * (n - 1) / 2);
  }
  return total;
}

// The first step i in [a, b) with value(i) >= target, for a non-decreasing value (b: none).
template <class F>
int64_t first_at_least(int64_t a, int64_t b, double target, F&& value) {
  while (a < b) {
    const int64_t m = a + (b - a) / 2;
    if (value(m) >= target) b = m;
    else a = m + 1;
  }
  return a;
}

}  // namespace ctx::pl

// ---- sequences piecewise linear on even and on odd steps ------------------------------------------
// A staircase (two steps compute-bound, then a wait; two steps, a wait ...) is not a few lines but
// its even and odd steps each are. Seq2 keeps them apart: sub[0] holds step 2i at index i, sub[1]
// step 2i + 1. The same operations; the scan runs in its two-step form on each parity.
namespace ctx::pl {

struct Seq2 {
  Seq sub[2];
  int64_t a = 0, b = 0;  // the steps [a, b)
  static int64_t lo(int64_t x, int par) { return (x - par + 1) >> 1; }  // first index of parity par at or after step x
  bool empty() const { return a >= b; }
  int64_t first() const { return a; }
  int64_t end() const { return b; }
  double at(int64_t j) const { return sub[j & 1].at(j >> 1); }
  double back() const { return at(b - 1); }
  size_t pieces() const { return sub[0].p.size() + sub[1].p.size(); }
  void clear(int64_t first_step, int64_t end_step) {
    a = first_step, b = std::max(first_step, end_step);
    for (int par = 0; par < 2; ++par) sub[par].clear(lo(b, par));
  }
  bool has(int par) const { return lo(a, par) < lo(b, par); }
  friend void swap(Seq2& x, Seq2& y) noexcept {
    swap(x.sub[0], y.sub[0]);
    swap(x.sub[1], y.sub[1]);
    std::swap(x.a, y.a);
    std::swap(x.b, y.b);
  }
};

inline void constant(Seq2& out, int64_t a, int64_t b, double v) {
  out.clear(a, b);
  for (int par = 0; par < 2; ++par) constant(out.sub[par], Seq2::lo(a, par), Seq2::lo(b, par), v);
}
inline void restrict(Seq2& out, const Seq2& x, int64_t a, int64_t b) {
  out.clear(a, b);
  for (int par = 0; par < 2; ++par)
    if (out.has(par)) restrict(out.sub[par], x.sub[par], Seq2::lo(a, par), Seq2::lo(b, par));
}
// out(j) = x(j - k), for k = 1 only (the ring's one-step delays: a shift by one swaps the even and
// odd sub-sequences; another k is a programming error, refused in every build)
inline void shift(Seq2& out, const Seq2& x, int64_t k) {
  if (k != 1) throw std::logic_error("pl::shift of an even/odd sequence by " + std::to_string(k) + " steps: only 1 is supported");
  out.clear(x.a + 1, x.b + 1);
  if (x.has(1)) shift(out.sub[0], x.sub[1], 1);
  if (x.has(0)) out.sub[1] = x.sub[0];
}
// restrict then shift by 1 in one copy (the same pieces): out(j) = x(j - 1) on [a + 1, b + 1)
inline void restrict_shift(Seq2& out, const Seq2& x, int64_t a, int64_t b, int64_t k) {
  if (k != 1) throw std::logic_error("pl::restrict_shift of an even/odd sequence by " + std::to_string(k) + " steps: only 1 is supported");
  out.clear(a, b);  // (the restricted steps [a, max(a, b)); which parities they hold)
  const bool odd = out.has(1), even = out.has(0);
  out.clear(out.a + 1, out.b + 1);
  // the odd steps become the even ones, index + 1; the even ones the odd ones, same index
  if (odd) restrict_shift(out.sub[0], x.sub[1], Seq2::lo(a, 1), Seq2::lo(b, 1), 1);
  if (even) restrict(out.sub[1], x.sub[0], Seq2::lo(a, 0), Seq2::lo(b, 0));
}
// out = a point at step j, then x (over [j + 1, end), or empty)
inline void point_then(Seq2& out, int64_t j, double v, const Seq2& x, int64_t end) {
  out.clear(j, end);
  const int pj = static_cast<int>(j & 1);
  out.sub[pj].push(j >> 1, v, 0.0);
  if (!x.empty()) {
    for (const Piece& q : x.sub[pj].p) out.sub[pj].push(q.j, q.v, q.s);
    if (x.has(1 - pj)) out.sub[1 - pj] = x.sub[1 - pj];
  }
  for (int par = 0; par < 2; ++par) out.sub[par].last = Seq2::lo(end, par);
}
// out = x, then a point at step x.end()
inline void then_point(Seq2& out, const Seq2& x, int64_t j, double v) {
  out = x;
  if (x.empty()) out.clear(j, j);
  out.b = j + 1;
  const int pj = static_cast<int>(j & 1);
  out.sub[pj].push(j >> 1, v, 0.0);
  for (int par = 0; par < 2; ++par) out.sub[par].last = Seq2::lo(out.b, par);
}
namespace detail {
template <class F>
void per_parity(Seq2& out, const Seq2& x, const Seq2& y, F&& f) {
  out.clear(std::max(x.a, y.a), std::min(x.b, y.b));
  for (int par = 0; par < 2; ++par)
    if (out.has(par)) f(out.sub[par], x.sub[par], y.sub[par]);
}
}  // namespace detail
inline void max(Seq2& out, const Seq2& x, const Seq2& y) { detail::per_parity(out, x, y, [](Seq& o, const Seq& u, const Seq& v) { max(o, u, v); }); }
inline void min(Seq2& out, const Seq2& x, const Seq2& y) { detail::per_parity(out, x, y, [](Seq& o, const Seq& u, const Seq& v) { min(o, u, v); }); }
inline void add(Seq2& out, const Seq2& x, const Seq2& y) { detail::per_parity(out, x, y, [](Seq& o, const Seq& u, const Seq& v) { add(o, u, v); }); }
inline void sub(Seq2& out, const Seq2& x, const Seq2& y) { detail::per_parity(out, x, y, [](Seq& o, const Seq& u, const Seq& v) { sub(o, u, v); }); }
inline void add_constant(Seq2& out, const Seq2& x, double c) {
  out.clear(x.a, x.b);
  for (int par = 0; par < 2; ++par)
    if (out.has(par)) add_constant(out.sub[par], x.sub[par], c);
}
inline void max_constant(Seq2& out, const Seq2& x, double c) {
  out.clear(x.a, x.b);
  for (int par = 0; par < 2; ++par)
    if (out.has(par)) max_constant(out.sub[par], x.sub[par], c);
}
inline double sum(const Seq2& x) {
  double total = 0;
  for (int par = 0; par < 2; ++par)
    if (x.has(par)) total += sum(x.sub[par]);
  return total;
}
// out(j) = max(out(j-1) + inc(j), z(j)) on [a, b), out(a - 1) = init, in its two-step form on each
// parity: out(j) = max(out(j-2) + inc(j-1) + inc(j), max(z(j-1) + inc(j), z(j))).
inline void scan(Seq2& out, double init, const Seq2& inc, const Seq2& z, Seq2* scratch /* 4 */) {
  const int64_t a = std::max(inc.a, z.a), b = std::min(inc.b, z.b);
  out.clear(a, b);
  if (a >= b) return;
  const int pa = static_cast<int>(a & 1);
  const double s_a = std::max(init + inc.at(a), z.at(a));
  Seq2 &c2 = scratch[0], &z2 = scratch[1], &t = scratch[2], &u = scratch[3];
  if (b > a + 1) {
    shift(t, inc, 1);
    add(c2, t, inc);  // [a + 1, b)
    shift(t, z, 1);
    add(u, t, inc);
    max(z2, u, z);
  }
  // parity of a: s(a), then the steps a + 2, a + 4, ...; the other parity from init at a - 1
  for (int par = 0; par < 2; ++par) {
    Seq& o = out.sub[par];
    const int64_t i0 = par == pa ? (a >> 1) + 1 : Seq2::lo(a + 1, par), i1 = Seq2::lo(b, par);
    o.clear(i1);
    if (par == pa) o.push(a >> 1, s_a, 0.0);
    if (i0 < i1) {
      Seq& tmp = u.sub[par];  // (u and t are free again: their storage is kept between calls)
      Seq &cc = t.sub[0], &zz = t.sub[1];
      restrict(cc, c2.sub[par], i0, i1);
      restrict(zz, z2.sub[par], i0, i1);
      scan(tmp, par == pa ? s_a : init, cc, zz);
      for (const Piece& q : tmp.p) o.push(q.j, q.v, q.s);
    }
    o.last = i1;
  }
}

}  // namespace ctx::pl
