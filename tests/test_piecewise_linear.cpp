// costmodel/piecewise_linear.hpp against step-by-step evaluation: random piecewise-linear sequences
// of small dyadic numbers (multiples of 1/8, slopes multiples of 1/4), so every value, sum and
// product is exact in binary floating point and each operation must equal its definition at every
// step exactly: max, min, add, sub, max with a constant, shift, restrict, the scan
// s(i) = max(s(i-1) + inc(i), z(i)), the sum and the first step reaching a value. Crossings of two
// lines inside a piece (where max and min split it) and the scan's takeover points are the cases
// a closed form gets wrong; random slopes put them anywhere, also between two integer steps. The
// even/odd sequences (pl::Seq2) get the same checks.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "costmodel/piecewise_linear.hpp"

namespace ctx {
namespace {

using pl::Seq;

struct Rng {
  std::mt19937 g{20261125};
  int uni(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g); }
};

// a random sequence over [a, b): pieces of random length, start values and slopes
Seq random_seq(Rng& r, int64_t a, int64_t b, bool constant_pieces = false) {
  Seq s;
  s.clear(b);
  for (int64_t j = a; j < b;) {
    const double v = r.uni(0, 400) / 8.0;
    const double slope = constant_pieces ? 0.0 : r.uni(-8, 12) / 4.0;
    s.push(j, v, slope);
    j += r.uni(1, 9);
  }
  return s;
}

std::vector<double> values(const Seq& s) {
  std::vector<double> v;
  for (int64_t i = s.first(); i < s.end(); ++i) v.push_back(s.at(i));
  return v;
}

TEST(PiecewiseLinear, PointwiseOperationsEqualTheirDefinitionAtEveryStep) {
  Rng r;
  int crossings = 0;
  for (int trial = 0; trial < 500; ++trial) {
    const int64_t a = r.uni(0, 5), b = a + r.uni(1, 60);
    const Seq x = random_seq(r, a, b), y = random_seq(r, a, b);
    const double c = r.uni(0, 300) / 8.0;
    Seq mx, mn, sm, df, mc;
    pl::max(mx, x, y);
    pl::min(mn, x, y);
    pl::add(sm, x, y);
    pl::sub(df, x, y);
    pl::max_constant(mc, x, c);
    const std::string w = "trial " + std::to_string(trial);
    ASSERT_EQ(mx.first(), a) << w;
    ASSERT_EQ(mx.end(), b) << w;
    bool crossed = false;
    for (int64_t i = a; i < b; ++i) {
      const double xi = x.at(i), yi = y.at(i);
      EXPECT_EQ(mx.at(i), std::max(xi, yi)) << w << " step " << i;
      EXPECT_EQ(mn.at(i), std::min(xi, yi)) << w << " step " << i;
      EXPECT_EQ(sm.at(i), xi + yi) << w << " step " << i;
      EXPECT_EQ(df.at(i), xi - yi) << w << " step " << i;
      EXPECT_EQ(mc.at(i), std::max(xi, c)) << w << " step " << i;
      if (i > a && (x.at(i - 1) > y.at(i - 1)) != (xi > yi)) crossed = true;
    }
    crossings += crossed;
    // sums: the closed form per piece against the step-by-step sum
    double total = 0;
    for (double v : values(x)) total += v;
    EXPECT_EQ(pl::sum(x), total) << w;
    // shift and restrict
    Seq sh, rs;
    pl::shift(sh, x, 3);
    for (int64_t i = a; i < b; ++i) EXPECT_EQ(sh.at(i + 3), x.at(i)) << w;
    const int64_t lo = a + r.uni(0, static_cast<int>(b - a - 1)), hi = lo + 1 + r.uni(0, static_cast<int>(b - lo - 1));
    pl::restrict(rs, x, lo, hi);
    ASSERT_EQ(rs.first(), lo) << w;
    ASSERT_EQ(rs.end(), hi) << w;
    for (int64_t i = lo; i < hi; ++i) EXPECT_EQ(rs.at(i), x.at(i)) << w;
  }
  EXPECT_GE(crossings, 100) << "trials where the two sequences cross inside the range";
}

TEST(PiecewiseLinear, ScanEqualsItsRecurrenceAtEveryStep) {
  Rng r;
  int takeovers = 0;
  for (int trial = 0; trial < 500; ++trial) {
    const int64_t a = r.uni(1, 5), b = a + r.uni(1, 80);
    const Seq inc = random_seq(r, a, b, true), z = random_seq(r, a, b);
    const double init = r.uni(0, 200) / 8.0;
    Seq s;
    pl::scan(s, init, inc, z);
    ASSERT_EQ(s.first(), a);
    ASSERT_EQ(s.end(), b);
    double prev = init;
    bool from_z = false, from_carry = false;
    for (int64_t i = a; i < b; ++i) {
      const double carried = prev + inc.at(i);
      const double want = std::max(carried, z.at(i));
      (z.at(i) > carried ? from_z : from_carry) = true;
      EXPECT_EQ(s.at(i), want) << "trial " << trial << " step " << i;
      prev = want;
    }
    takeovers += from_z && from_carry;
  }
  EXPECT_GE(takeovers, 100) << "trials where the scan follows both the carried line and z";
}

TEST(PiecewiseLinear, FirstStepReachingAValue) {
  // a non-decreasing sequence: 1, 1, 1, 2, 3, 4, 4, 4 over [10, 18)
  Seq s;
  s.clear(18);
  s.push(10, 1, 0);
  s.push(13, 2, 1);
  s.push(16, 4, 0);
  auto at = [&](int64_t i) { return s.at(i); };
  EXPECT_EQ(pl::first_at_least(10, 18, 1.0, at), 10);
  EXPECT_EQ(pl::first_at_least(10, 18, 2.0, at), 13);
  EXPECT_EQ(pl::first_at_least(10, 18, 3.5, at), 15);
  EXPECT_EQ(pl::first_at_least(10, 18, 4.0, at), 15);
  EXPECT_EQ(pl::first_at_least(10, 18, 5.0, at), 18);  // none
  EXPECT_EQ(s.p.size(), 3u);
  // a piece continuing the previous line exactly is merged into it; one changing the slope is not
  Seq m;
  m.clear(9);
  m.push(0, 1, 1);
  m.push(3, 4, 1);
  EXPECT_EQ(m.p.size(), 1u);
  m.push(6, 7, 2);
  EXPECT_EQ(m.p.size(), 2u);
  EXPECT_EQ(m.at(8), 11);
}

// pl::Seq2 (even and odd steps apart, the staircases of long rings without recompute): the same
// operations against their definitions step by step, on staircase-like random sequences (each
// step a new value or the last plus a dyadic increment), ranges of every length and parity.
TEST(PiecewiseLinear, EvenOddSequencesEqualTheirDefinitionAtEveryStep) {
  Rng r;
  auto seq2 = [&](int64_t a, int64_t b, bool constant, std::vector<double>& v) {
    pl::Seq2 s;
    s.clear(a, b);
    v.assign(static_cast<size_t>(b), 0.0);
    double x = r.uni(0, 40) / 4.0;
    for (int64_t j = a; j < b; ++j) {
      if (r.uni(0, 3) == 0) x = r.uni(0, 40) / 4.0;
      else if (!constant) x += r.uni(0, 4) / 4.0;
      v[static_cast<size_t>(j)] = x;
      s.sub[j & 1].push(j >> 1, x, 0.0);
    }
    return s;
  };
  for (int trial = 0; trial < 1000; ++trial) {
    const int64_t a = r.uni(1, 4), b = a + r.uni(1, 24);
    std::vector<double> iv, zv;
    const pl::Seq2 inc = seq2(a, b, true, iv), z = seq2(a, b, false, zv);
    const double init = r.uni(0, 40) / 4.0;
    const std::string w = "trial " + std::to_string(trial) + " [" + std::to_string(a) + ", " + std::to_string(b) + ")";
    pl::Seq2 s, scratch[4], sh, mx, tp;
    pl::scan(s, init, inc, z, scratch);
    double prev = init;
    for (int64_t j = a; j < b; ++j) {
      const double want = std::max(prev + iv[static_cast<size_t>(j)], zv[static_cast<size_t>(j)]);
      EXPECT_EQ(s.at(j), want) << w << " scan step " << j;
      prev = want;
    }
    pl::shift(sh, z, 1);
    pl::max(mx, inc, z);
    pl::then_point(tp, z, b, 99.0);
    for (int64_t j = a; j < b; ++j) {
      EXPECT_EQ(sh.at(j + 1), zv[static_cast<size_t>(j)]) << w << " shift step " << j;
      EXPECT_EQ(mx.at(j), std::max(iv[static_cast<size_t>(j)], zv[static_cast<size_t>(j)])) << w << " max step " << j;
      EXPECT_EQ(tp.at(j), zv[static_cast<size_t>(j)]) << w << " then_point step " << j;
    }
    EXPECT_EQ(tp.at(b), 99.0) << w;
    if (b > a + 1) {
      pl::Seq2 rs, pt;
      pl::restrict(rs, z, a + 1, b);
      pl::point_then(pt, a, 77.0, rs, b);
      EXPECT_EQ(pt.at(a), 77.0) << w;
      for (int64_t j = a + 1; j < b; ++j) EXPECT_EQ(pt.at(j), zv[static_cast<size_t>(j)]) << w << " point_then step " << j;
    }
    double total = 0;
    for (int64_t j = a; j < b; ++j) total += zv[static_cast<size_t>(j)];
    EXPECT_EQ(pl::sum(z), total) << w;
  }
}

// restrict_shift (one copy) against its definition, restrict then shift: the same pieces bit for
// bit and the same ends, for ranges that start inside a piece, at one, before the sequence's end
// and empty, on lines and on even/odd sequences; and the values at every step.
bool same_pieces(const Seq& a, const Seq& b) {
  if (a.last != b.last || a.p.size() != b.p.size()) return false;
  for (size_t k = 0; k < a.p.size(); ++k)
    if (a.p[k].j != b.p[k].j || a.p[k].v != b.p[k].v || a.p[k].s != b.p[k].s) return false;
  return true;
}
TEST(PiecewiseLinear, RestrictThenShiftInOneCopy) {
  Rng r;
  int inside = 0, empty = 0;
  for (int trial = 0; trial < 500; ++trial) {
    const int64_t f = r.uni(0, 5), e = f + r.uni(1, 60);
    const Seq x = random_seq(r, f, e);
    const int64_t a = f + r.uni(0, static_cast<int>(e - f)), b = r.uni(0, 3) == 0 ? a - r.uni(0, 2) : a + r.uni(0, static_cast<int>(e - a));
    const int64_t k = r.uni(0, 3);
    Seq t, want, got;
    pl::restrict(t, x, a, b);
    pl::shift(want, t, k);
    pl::restrict_shift(got, x, a, b, k);
    const std::string w = "trial " + std::to_string(trial) + " [" + std::to_string(a) + ", " + std::to_string(b) + ") by " + std::to_string(k);
    EXPECT_TRUE(same_pieces(got, want)) << w;
    for (int64_t i = a; i < b; ++i) EXPECT_EQ(got.at(i + k), x.at(i)) << w << " step " << i;
    empty += a >= b;
    inside += a < b && x.p[x.piece_of(a)].j < a;
  }
  EXPECT_GT(inside, 50) << "ranges starting inside a piece (its value there computed) must occur";
  EXPECT_GT(empty, 20);
  for (int trial = 0; trial < 1000; ++trial) {
    const int64_t f = r.uni(1, 4), e = f + r.uni(1, 24);
    pl::Seq2 x;
    x.clear(f, e);
    for (int64_t j = f; j < e; ++j) x.sub[j & 1].push(j >> 1, r.uni(0, 40) / 4.0, r.uni(0, 2) == 0 ? r.uni(-4, 4) / 4.0 : 0.0);
    const int64_t a = f + r.uni(0, static_cast<int>(e - f)), b = r.uni(0, 4) == 0 ? a - r.uni(0, 2) : a + r.uni(0, static_cast<int>(e - a));
    pl::Seq2 t, want, got;
    pl::restrict(t, x, a, b);
    pl::shift(want, t, 1);
    pl::restrict_shift(got, x, a, b, 1);
    const std::string w = "even/odd trial " + std::to_string(trial) + " [" + std::to_string(a) + ", " + std::to_string(b) + ")";
    EXPECT_EQ(got.a, want.a) << w;
    EXPECT_EQ(got.b, want.b) << w;
    EXPECT_TRUE(same_pieces(got.sub[0], want.sub[0])) << w;
    EXPECT_TRUE(same_pieces(got.sub[1], want.sub[1])) << w;
    for (int64_t i = a; i < b; ++i) EXPECT_EQ(got.at(i + 1), x.at(i)) << w << " step " << i;
  }
}

TEST(PiecewiseLinear, EvenOddShiftRefusesAnythingButOneStep) {
  pl::Seq2 x, out;
  x.clear(0, 6);
  for (int64_t j = 0; j < 6; ++j) x.sub[j & 1].push(j >> 1, static_cast<double>(j), 0.0);
  EXPECT_NO_THROW(pl::shift(out, x, 1));
  EXPECT_THROW(pl::shift(out, x, 2), std::logic_error);
  EXPECT_THROW(pl::shift(out, x, 0), std::logic_error);
  EXPECT_NO_THROW(pl::restrict_shift(out, x, 1, 5, 1));
  EXPECT_THROW(pl::restrict_shift(out, x, 1, 5, 2), std::logic_error);
}

}  // namespace
}  // namespace ctx
