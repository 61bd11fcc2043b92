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
// numbers, where such values are equal).
inline bool near(double a, double b) { return a == b || std::abs(a - b) <= 1e-13 * std::max(std::abs(a), std::abs(b)); }

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
  // continues its line exactly, replacing it when the previous one would be empty
  void push(int64_t j, double v, double s) {
    if (!p.empty()) {
      Piece& b = p.back();
      if (b.j == j) {
        p.pop_back();
        push(j, v, s);
        return;
      }
      if (near(b.s, s) && near(b.at(j), v)) return;
    }
    p.push_back({j, v, s});
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
// out(a - 1) = init; inc is piecewise constant (slope 0).
inline void scan(Seq& out, double init, const Seq& inc, const Seq& z) {
  out.clear(std::min(inc.last, z.last));
  double prev = init;
  detail::for_intervals(inc, z, [&](int64_t u, int64_t v, double c, double, double zu, double zs) {
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
