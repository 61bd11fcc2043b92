// CPU backend kernels against float64 references and central finite differences. Inputs go in
// through Backend::upload and results come out through Backend::download (tensors are opaque).
//
// Tolerances, and why:
//   finite differences (h = 1e-5..1e-6 in float64 references of float32 gradients): 1e-4
//   relative, 1e-5 absolute for the cross-entropy gradient (entries < 1).
//   The attention forward against float64 (blocks merged through the log-sum-exp) is the op case
//   attention_fwd_perm_mha_d8_f32 (op_cases.hpp, test_backend_ops); its geometry and inputs are
//   shared with the finite-difference test of the backward here.
//   The step statistics sum in double and round once to float: 1 float ulp of the result (2^-23
//   relative, written 2e-7) plus the float32 rounding of each term where the terms are floats.
//   bf16 rounding and data movement: exact (the result is a defined bit pattern).
//   GEMM with bf16 inputs into f32: products of two bf16 values are exact in float32 (8 + 8
//   significant bits), so the only error is float32 accumulation over k = 16 terms of size
//   <= 10: below 16 * 10 * 2^-24 ~ 1e-5 absolute.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "executor/backend.hpp"
#include "executor/tests/kernel_test_util.hpp"
#include "executor/tests/op_cases.hpp"
#include "executor/rope.hpp"

using namespace ctx;
using namespace ctx::exec;

namespace {

using ctx::exec::testing::download;
using ctx::exec::testing::randn;
using ctx::exec::testing::upload;
using ctx::exec::testing::zeros;

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// The op cases' small attention geometry (24 tokens in a permuted order, three documents, three
// key blocks of 8, GQA 2:1, head dim 8) with its seeded inputs, uploaded into `be`.
struct AttnCase {
  opcases::AttnGeom g = opcases::attn_geom_small();
  int64_t T = g.tq(), hq = g.hq, hkv = g.hkv, d = g.d;
  std::vector<float> q = opcases::randn(T * hq * d, 1), k = opcases::randn(T * hkv * d, 2),
                     v = opcases::randn(T * hkv * d, 3);
  AttnShape shape() const { return g.shape(); }
  // key block b (8 keys) as attention sees it, its tensors uploaded into `be`
  struct Block {
    Tensor ki, kd, range;
    KeyBlock kb() const { return {{ki, kd}, range}; }
  };
  Block block(Backend& be, size_t b) const {
    return {upload(be, g.ki[b]), upload(be, g.kd[b]), upload(be, opcases::kv_hulls(g.qi, g.qd, g.ki[b], g.kd[b]), T, 2)};
  }
};

// bf16 round to nearest even, computed independently of executor/bf16.hpp: the two bf16 values
// around f (truncation and the next one away from zero), the nearer in float64, ties to the one
// with an even last mantissa bit. NaN and infinities stay.
float ref_round_bf16(float f) {
  if (std::isnan(f) || std::isinf(f)) return f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t lo_bits = u & 0xffff0000u, hi_bits = lo_bits + 0x10000u;
  float lo, hi;
  std::memcpy(&lo, &lo_bits, 4);
  std::memcpy(&hi, &hi_bits, 4);
  // past the largest bf16 the next value up is 2^128 (IEEE rounding's overflow threshold): the
  // infinity bit pattern stands for it, its distance taken in float64
  const double hi_d = std::isinf(hi) ? std::copysign(std::ldexp(1.0, 128), hi) : static_cast<double>(hi);
  const double dl = std::fabs(static_cast<double>(f) - lo), dh = std::fabs(hi_d - f);
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo_bits & 0x10000u) ? hi : lo;
}

}  // namespace

TEST(ExecKernels, AttentionBackwardMatchesFiniteDifferences) {
  auto be = make_cpu_backend();
  AttnCase c;
  auto w = randn(c.T * c.hq * c.d, 9);  // loss = sum(w * o)
  auto loss = [&](const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v) {
    std::vector<double> o, l;
    opcases::attention_reference(c.g, q, k, v, o, l);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += w[i] * o[i];
    return s;
  };
  Tensor q = upload(*be, c.q, c.T, c.hq * c.d), k = upload(*be, c.k, c.T, c.hkv * c.d),
         v = upload(*be, c.v, c.T, c.hkv * c.d), qi = upload(*be, c.g.qi), qd = upload(*be, c.g.qd),
         dout = upload(*be, w, c.T, c.hq * c.d);
  Tensor o = zeros(*be, c.T, c.hq * c.d), lse = be->alloc(c.T, c.hq, DType::f32, Mem::workspace),
         delta = zeros(*be, c.T, c.hq);
  be->fill(lse, -INFINITY);
  Tensor all_range = upload(*be, opcases::kv_hulls(c.g.qi, c.g.qd, c.g.qi, c.g.qd), c.T, 2);
  be->attention_forward_block(o, lse, q, {qi, qd}, k, v, {{qi, qd}, all_range}, c.shape());
  be->attention_delta(delta, dout, o, c.shape());
  Tensor dq = zeros(*be, c.T, c.hq * c.d), dk = zeros(*be, c.T, c.hkv * c.d), dv = zeros(*be, c.T, c.hkv * c.d);
  for (size_t b = 0; b < 3; ++b) {  // backward block by block, as the ring does
    auto blk = c.block(*be, b);
    be->attention_backward_block(dq, dk.row_range(b * 8, 8), dv.row_range(b * 8, 8), q, {qi, qd},
                                 k.row_range(b * 8, 8), v.row_range(b * 8, 8), blk.kb(), dout, lse, delta,
                                 c.shape());
  }
  auto gdq = download(*be, dq), gdk = download(*be, dk), gdv = download(*be, dv);
  auto qd_ = to_double(c.q), kd_ = to_double(c.k), vd_ = to_double(c.v);
  const double h = 1e-5;
  auto check = [&](std::vector<double>& x, const std::vector<float>& g, const char* name) {
    double worst = 0;
    for (size_t i = 0; i < x.size(); i += 3) {
      double keep = x[i];
      x[i] = keep + h;
      double up = loss(qd_, kd_, vd_);
      x[i] = keep - h;
      double dn = loss(qd_, kd_, vd_);
      x[i] = keep;
      double fd = (up - dn) / (2 * h);
      worst = std::max(worst, std::fabs(fd - g[i]) / (1.0 + std::fabs(fd)));
    }
    EXPECT_LT(worst, 1e-4) << name;
  };
  check(qd_, gdq, "dq");
  check(kd_, gdk, "dk");
  check(vd_, gdv, "dv");
}

TEST(ExecKernels, RmsNormBackwardMatchesFiniteDifferences) {
  auto be = make_cpu_backend();
  const int64_t R = 5, H = 12;
  auto x = randn(R * H, 4), w = randn(H, 5), dy = randn(R * H, 6);
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
    double s = 0;
    for (int64_t r = 0; r < R; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < H; ++i) ss += xx[r * H + i] * xx[r * H + i];
      double rs = 1.0 / std::sqrt(ss / H + 1e-5);
      for (int64_t i = 0; i < H; ++i) s += dy[r * H + i] * xx[r * H + i] * rs * ww[i];
    }
    return s;
  };
  Tensor tx = upload(*be, x, R, H), tw = upload(*be, w), tdy = upload(*be, dy, R, H);
  Tensor y = zeros(*be, R, H), rstd = zeros(*be, R, 1), tdx = zeros(*be, R, H), tdw = zeros(*be, 1, H);
  be->rmsnorm_forward(y, rstd, tx, tw, 1e-5f);
  be->rmsnorm_backward(tdx, tdw, tdy, tx, rstd, tw);
  auto dx = download(*be, tdx), dw = download(*be, tdw);
  auto xd = to_double(x), wd = to_double(w);
  for (size_t i = 0; i < xd.size(); ++i) {
    double k = xd[i];
    xd[i] = k + 1e-6;
    double up = loss(xd, wd);
    xd[i] = k - 1e-6;
    double dn = loss(xd, wd);
    xd[i] = k;
    EXPECT_NEAR(dx[i], (up - dn) / 2e-6, 1e-4 * (1 + std::fabs(dx[i])));
  }
  for (size_t i = 0; i < wd.size(); ++i) {
    double k = wd[i];
    wd[i] = k + 1e-6;
    double up = loss(xd, wd);
    wd[i] = k - 1e-6;
    double dn = loss(xd, wd);
    wd[i] = k;
    EXPECT_NEAR(dw[i], (up - dn) / 2e-6, 1e-4 * (1 + std::fabs(dw[i])));
  }
}

TEST(ExecKernels, SwigluBackwardMatchesFiniteDifferences) {
  auto be = make_cpu_backend();
  const int64_t n = 64;
  auto g = randn(n, 7, 2.0f), u = randn(n, 8), da = randn(n, 10);
  Tensor tg = upload(*be, g), tu = upload(*be, u), tda = upload(*be, da), tdg = zeros(*be, 1, n), tdu = zeros(*be, 1, n);
  be->swiglu_backward(tdg, tdu, tda, tg, tu);
  auto dg = download(*be, tdg), du = download(*be, tdu);
  for (int64_t i = 0; i < n; ++i) {
    auto f = [&](double gg, double uu) { return da[i] * gg / (1.0 + std::exp(-gg)) * uu; };
    EXPECT_NEAR(dg[i], (f(g[i] + 1e-6, u[i]) - f(g[i] - 1e-6, u[i])) / 2e-6, 1e-4 * (1 + std::fabs(dg[i])));
    EXPECT_NEAR(du[i], (f(g[i], u[i] + 1e-6) - f(g[i], u[i] - 1e-6)) / 2e-6, 1e-4 * (1 + std::fabs(du[i])));
  }
}

TEST(ExecKernels, CrossEntropyGradientMatchesFiniteDifferences) {
  auto be = make_cpu_backend();
  const int64_t R = 4, V = 10;
  auto logits = randn(R * V, 11, 2.0f);
  std::vector<int32_t> target = {3, 9, -1, 0};  // -1: ignored
  auto loss = [&](const std::vector<double>& l) {
    double s = 0;
    for (int64_t r = 0; r < R; ++r) {
      if (target[r] < 0) continue;
      double mx = -INFINITY, se = 0;
      for (int64_t c = 0; c < V; ++c) mx = std::max(mx, l[r * V + c]);
      for (int64_t c = 0; c < V; ++c) se += std::exp(l[r * V + c] - mx);
      s += mx + std::log(se) - l[r * V + target[r]];
    }
    return s;
  };
  Tensor tl = upload(*be, logits, R, V), tt = upload(*be, target), mx = zeros(*be, R, 1), se = zeros(*be, R, 2),
         lse = zeros(*be, R, 1), stats = zeros(*be, 1, kStepStats);
  be->row_max(mx, tl, V);
  be->sumexp_and_target(se, tl, mx, tt, V, 0);
  be->xent_finish(lse, stats, mx, se, tt);
  be->xent_grad_inplace(tl, lse, tt, 1.0f, V, 0);
  auto g = download(*be, tl);
  auto ld = to_double(logits);
  for (size_t i = 0; i < ld.size(); ++i) {
    double k = ld[i];
    ld[i] = k + 1e-6;
    double up = loss(ld);
    ld[i] = k - 1e-6;
    double dn = loss(ld);
    ld[i] = k;
    EXPECT_NEAR(g[i], (up - dn) / 2e-6, 1e-5);
  }
}

// lse = max + log(sumexp) per row; the loss statistic gains the sum over rows with a target of
// lse - target logit (ignored rows add nothing), on top of what it held.
TEST(ExecKernels, XentFinishWritesLseAndAddsTheLossOfRowsWithATarget) {
  auto be = make_cpu_backend();
  const int64_t R = 6, V = 50;
  auto logits = randn(R * V, 60, 3.0f);
  std::vector<int32_t> target = {0, 49, -1, 17, -1, 3};
  Tensor tl = upload(*be, logits, R, V), tt = upload(*be, target), mx = zeros(*be, R, 1), se = zeros(*be, R, 2),
         lse = zeros(*be, R, 1), stats = upload(*be, std::vector<float>{2.5f, 0.0f, 7.0f});
  be->row_max(mx, tl, V);
  be->sumexp_and_target(se, tl, mx, tt, V, 0);
  be->xent_finish(lse, stats, mx, se, tt);
  auto gl = download(*be, lse), st = download(*be, stats);
  double want_loss = 2.5;
  for (int64_t r = 0; r < R; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < V; ++c) m = std::max<double>(m, logits[r * V + c]);
    for (int64_t c = 0; c < V; ++c) s += std::exp(logits[r * V + c] - m);
    const double l = m + std::log(s);
    EXPECT_NEAR(gl[r], l, 1e-6 * std::fabs(l) + 1e-6) << "lse row " << r;  // float32 log of a float sum
    if (target[r] >= 0) want_loss += l - logits[r * V + target[r]];
  }
  EXPECT_NEAR(st[kStatLossSum], want_loss, 1e-5 * std::fabs(want_loss)) << "loss sum";
  EXPECT_EQ(st[kStatNonFinite], 0.0f) << "other statistics untouched";
  EXPECT_EQ(st[kStatGradNorm2], 7.0f) << "other statistics untouched";
}

// The non-finite statistic keeps the largest code of a tensor that held a NaN or an infinity;
// finite tensors leave it alone whatever their code.
TEST(ExecKernels, FlagNonfiniteKeepsTheLargestCodeOfAFlaggedTensor) {
  auto be = make_cpu_backend();
  auto x = randn(1000, 61);
  Tensor stats = zeros(*be, 1, kStepStats);
  Tensor fine = upload(*be, x);
  be->flag_nonfinite(stats, fine, 9.0f);
  EXPECT_EQ(download(*be, stats)[kStatNonFinite], 0.0f) << "a finite tensor flags nothing";
  auto with = [&](float bad) {
    auto y = x;
    y[777] = bad;
    return upload(*be, y);
  };
  Tensor nan = with(std::numeric_limits<float>::quiet_NaN()), inf = with(-std::numeric_limits<float>::infinity());
  be->flag_nonfinite(stats, nan, 5.0f);
  EXPECT_EQ(download(*be, stats)[kStatNonFinite], 5.0f) << "NaN flagged with its code";
  be->flag_nonfinite(stats, inf, 2.0f);
  EXPECT_EQ(download(*be, stats)[kStatNonFinite], 5.0f) << "a smaller code does not lower it";
  be->flag_nonfinite(stats, inf, 7.0f);
  be->flag_nonfinite(stats, fine, 11.0f);
  auto st = download(*be, stats);
  EXPECT_EQ(st[kStatNonFinite], 7.0f) << "-inf flagged, the larger code kept, finite code 11 ignored";
  EXPECT_EQ(st[kStatLossSum], 0.0f);
  EXPECT_EQ(st[kStatGradNorm2], 0.0f);
}

// sum_squares accumulates: two tensors' squares add into the norm statistic (double sums, one
// float rounding per call).
TEST(ExecKernels, SumSquaresAccumulatesIntoTheGradNormStatistic) {
  auto be = make_cpu_backend();
  auto a = randn(3000, 62), b = randn(777, 63, 0.01f);
  Tensor stats = zeros(*be, 1, kStepStats), ta = upload(*be, a), tb = upload(*be, b);
  be->sum_squares(stats, ta);
  be->sum_squares(stats, tb);
  double want = 0;
  for (float x : a) want += static_cast<double>(x) * x;
  for (float x : b) want += static_cast<double>(x) * x;
  auto st = download(*be, stats);
  EXPECT_NEAR(st[kStatGradNorm2], want, 4e-7 * want);  // two float roundings of the running value
  EXPECT_EQ(st[kStatLossSum], 0.0f);
  EXPECT_EQ(st[kStatNonFinite], 0.0f);
}

namespace {
// float64 AdamW of one element with the gradient scaled by `gs`
void adamw_ref(double& w, double& m, double& v, double g, double gs, const AdamWArgs& a) {
  g *= gs;
  m = a.beta1 * m + (1 - a.beta1) * g;
  v = a.beta2 * v + (1 - a.beta2) * g * g;
  const double mh = m / (1 - std::pow(double(a.beta1), double(a.step)));
  const double vh = v / (1 - std::pow(double(a.beta2), double(a.step)));
  w -= a.lr * (mh / (std::sqrt(vh) + a.eps) + a.weight_decay * a.decay * w);
}
// AdamW's inputs: weights, first and second moments (non-negative), gradient; seeds seed..seed+3.
struct AdamwInputs {
  std::vector<float> w, m, v, g;
};
AdamwInputs adamw_inputs(int64_t n, uint64_t seed) {
  AdamwInputs in{randn(n, seed), randn(n, seed + 1, 0.01f), randn(n, seed + 2, 0.01f), randn(n, seed + 3)};
  for (auto& e : in.v) e = std::fabs(e);
  return in;
}
}  // namespace

// The clip decision is taken from the statistics tensor: a norm above clip scales the gradient by
// clip / (norm + 1e-6), a norm below it leaves the gradient alone. Reference: float64 AdamW.
TEST(ExecKernels, AdamwClipsFromTheNormInTheStatistics) {
  auto be = make_cpu_backend();
  const int64_t n = 200;
  const auto [w0, m0, v0, g] = adamw_inputs(n, 64);
  AdamWArgs a;
  a.lr = 1e-2f;
  a.weight_decay = 0.1f;
  a.clip = 1.0f;
  a.step = 3;
  for (double norm : {4.0, 0.5}) {  // clipped (scale 1/4), not clipped
    Tensor w = upload(*be, w0), m = upload(*be, m0), v = upload(*be, v0), tg = upload(*be, g);
    Tensor stats = upload(*be, std::vector<float>{0.0f, 0.0f, static_cast<float>(norm * norm)});
    be->adamw(w, m, v, tg, stats, a);
    auto gw = download(*be, w), gm = download(*be, m), gv = download(*be, v);
    const double gs = norm > a.clip ? a.clip / (norm + 1e-6) : 1.0;
    for (int64_t i = 0; i < n; ++i) {
      double rw = w0[i], rm = m0[i], rv = v0[i];
      adamw_ref(rw, rm, rv, g[i], gs, a);
      // float32 arithmetic of O(1) values over ~10 operations: 1e-6 relative
      EXPECT_NEAR(gm[i], rm, 1e-6 * (std::fabs(rm) + 1e-3)) << "m, norm " << norm << " element " << i;
      EXPECT_NEAR(gv[i], rv, 1e-6 * (std::fabs(rv) + 1e-6)) << "v, norm " << norm << " element " << i;
      EXPECT_NEAR(gw[i], rw, 1e-6 * (std::fabs(rw) + 1.0)) << "master, norm " << norm << " element " << i;
    }
  }
}

// Optimizer precision (plan keys master=none, moments=bf16): AdamW steps bf16 weights (no master
// copy) and bf16 moments by widening them to fp32, updating as for fp32 and rounding each once on
// store. Reference: float64 AdamW from the same bf16 inputs, each result rounded to bf16
// (ref_round_bf16 above). Tolerance: one bf16 ulp, 2^(e-7) for a value in [2^e, 2^(e+1)) (7 stored
// mantissa bits): the kernel's float32 arithmetic differs from float64 by ~1e-6 relative, which can
// move a value across a bf16 rounding boundary by at most one ulp, never more.
TEST(ExecKernels, AdamwStepsBf16WeightsAndMomentsRoundedOnce) {
  auto be = make_cpu_backend();
  const int64_t n = 256;
  auto [w0, m0, v0, g] = adamw_inputs(n, 80);
  for (auto* x : {&w0, &m0, &v0})
    for (float& e : *x) e = ref_round_bf16(e);  // what bf16 tensors hold
  AdamWArgs a;
  a.lr = 1e-2f;
  a.weight_decay = 0.1f;
  a.clip = 0.0f;
  a.step = 5;
  Tensor w = upload(*be, w0, 1, n, DType::bf16), m = upload(*be, m0, 1, n, DType::bf16), v = upload(*be, v0, 1, n, DType::bf16),
         tg = upload(*be, g);
  Tensor stats = upload(*be, std::vector<float>{0.0f, 0.0f, 1.0f});
  be->adamw(w, m, v, tg, stats, a);
  auto gw = download(*be, w), gm = download(*be, m), gv = download(*be, v);
  int64_t moved = 0;
  for (int64_t i = 0; i < n; ++i) {
    double rw = w0[i], rm = m0[i], rv = v0[i];
    adamw_ref(rw, rm, rv, g[i], 1.0, a);
    auto ulp = [](double x) { return std::ldexp(1.0, std::ilogb(std::fabs(x) + 1e-30) - 7); };
    EXPECT_NEAR(gw[i], ref_round_bf16(static_cast<float>(rw)), ulp(rw)) << "weight element " << i;
    EXPECT_NEAR(gm[i], ref_round_bf16(static_cast<float>(rm)), ulp(rm)) << "m element " << i;
    EXPECT_NEAR(gv[i], ref_round_bf16(static_cast<float>(rv)), ulp(rv)) << "v element " << i;
    EXPECT_EQ(gw[i], ref_round_bf16(gw[i])) << "stored as bf16, element " << i;
    moved += gw[i] != w0[i];
  }
  EXPECT_GT(moved, n / 2) << "lr 1e-2 moves most bf16 weights of magnitude ~1 by more than half an ulp";
}

// A flagged non-finite tensor, or a norm that is not finite, skips the step: master weights and
// both moments stay bit for bit what they were.
TEST(ExecKernels, AdamwSkipsTheStepWhenFlaggedOrTheNormIsNotFinite) {
  auto be = make_cpu_backend();
  const int64_t n = 64;
  const auto [w0, m0, v0, g] = adamw_inputs(n, 68);
  AdamWArgs a;
  a.lr = 1e-2f;
  a.clip = 1.0f;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> skipping = {{0, 3.0f, 1.0f}, {0, 0, inf}, {0, 0, nan}};
  for (const auto& st : skipping) {
    Tensor w = upload(*be, w0), m = upload(*be, m0), v = upload(*be, v0), tg = upload(*be, g),
           stats = upload(*be, st);
    be->adamw(w, m, v, tg, stats, a);
    EXPECT_EQ(download(*be, w), w0) << "flag " << st[1] << ", norm^2 " << st[2];
    EXPECT_EQ(download(*be, m), m0) << "flag " << st[1] << ", norm^2 " << st[2];
    EXPECT_EQ(download(*be, v), v0) << "flag " << st[1] << ", norm^2 " << st[2];
  }
}

// copy_cols/add_cols move a column range between matrices of different widths, row by row, and
// leave every other column alone (exact: data movement and one float add per element).
TEST(ExecKernels, CopyColsAndAddColsMoveOneColumnRange) {
  auto be = make_cpu_backend();
  const int64_t R = 7, W = 40, N = 13;
  auto wide = randn(R * W, 72), narrow = randn(R * N, 73);
  Tensor tw = upload(*be, wide, R, W), tn = upload(*be, narrow, R, N);
  be->add_cols(tw, 30, tn, 2, 10);
  auto want = wide;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < 10; ++c) want[r * W + 30 + c] += narrow[r * N + 2 + c];
  EXPECT_EQ(download(*be, tw), want) << "add_cols";
  be->copy_cols(tn, 0, tw, 5, 4);
  auto want_n = narrow;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < 4; ++c) want_n[r * N + c] = want[r * W + 5 + c];
  EXPECT_EQ(download(*be, tn), want_n) << "copy_cols";
  EXPECT_THROW(be->copy_cols(tn, 10, tw, 0, 4), std::exception) << "a range past the last column is refused";
}

// f32 -> bf16 copies round to nearest, ties to even (and overflow to infinity, NaN stays NaN);
// bf16 -> f32 widens exactly. Reference: ref_round_bf16 above, not executor/bf16.hpp.
TEST(ExecKernels, CopyF32ToBf16RoundsToNearestEvenAndBackIsExact) {
  auto be = make_cpu_backend();
  const float e8 = std::ldexp(1.0f, -8), e7 = std::ldexp(1.0f, -7);
  std::vector<float> x = {1.0f + e8,                     // tie between 1 and 1 + 2^-7: even is 1
                          1.0f + 3 * e8,                 // tie between 1 + 2^-7 (odd) and 1 + 2^-6: up
                          1.0f + e8 + std::ldexp(1.0f, -20),  // just above the tie: up
                          -(1.0f + 3 * e8),              // negative ties mirror
                          1.0f + e7,                     // exactly representable
                          std::numeric_limits<float>::max(),  // rounds up to infinity
                          std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::denorm_min(),
                          0.0f,
                          -0.0f,
                          std::numeric_limits<float>::quiet_NaN()};
  auto r = randn(500, 74, 100.0f);
  x.insert(x.end(), r.begin(), r.end());
  const int64_t n = static_cast<int64_t>(x.size());
  Tensor f = upload(*be, x), h = be->alloc(1, n, DType::bf16, Mem::workspace), back = zeros(*be, 1, n);
  be->copy(h, f);
  be->copy(back, h);
  auto got = download(*be, back), widened = download(*be, h);
  for (int64_t i = 0; i < n; ++i) {
    const float want = ref_round_bf16(x[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[i])) << "NaN stays NaN";
      continue;
    }
    uint32_t gb, wb;
    std::memcpy(&gb, &got[i], 4);
    std::memcpy(&wb, &want, 4);
    EXPECT_EQ(gb, wb) << "element " << i << " (" << x[i] << "): got " << got[i] << ", want " << want;
    EXPECT_EQ(widened[i], got[i]) << "download of a bf16 tensor widens exactly";
  }
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], 1.0f + 2 * e7);
  EXPECT_EQ(got[5], std::numeric_limits<float>::infinity());
}

// gemm with bf16 A and B accumulating into an f32 C (the gradient GEMMs of precision=bf16): the
// result is the float64 product of the bf16-rounded inputs, up to float32 accumulation.
TEST(ExecKernels, GemmWithBf16InputsIntoF32MatchesFloat64OfRoundedInputs) {
  auto be = make_cpu_backend();
  const int64_t M = 5, N = 7, K = 16;
  auto a = randn(M * K, 75, 3.0f), b = randn(K * N, 76, 3.0f), c0 = randn(M * N, 77);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Tensor A = upload(*be, a, ta ? K : M, ta ? M : K, DType::bf16), B = upload(*be, b, tb ? N : K, tb ? K : N, DType::bf16);
      Tensor C = upload(*be, c0, M, N);
      be->gemm(ta, tb, 0.5f, A, B, 2.0f, C);
      auto c = download(*be, C);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k) {
            double av = ref_round_bf16(ta ? a[k * M + i] : a[i * K + k]);
            double bv = ref_round_bf16(tb ? b[j * K + k] : b[k * N + j]);
            s += av * bv;
          }
          EXPECT_NEAR(c[i * N + j], 0.5 * s + 2.0 * c0[i * N + j], 1e-5 * (1 + std::fabs(s)))
              << "ta " << ta << " tb " << tb << " (" << i << ", " << j << ")";
        }
    }
}

TEST(ExecKernels, GemmTransposesMatchFloat64Reference) {
  auto be = make_cpu_backend();
  const int64_t M = 5, N = 7, K = 6;
  auto a = randn(M * K, 12), b = randn(K * N, 13), c0 = randn(M * N, 14);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Tensor A = upload(*be, a, ta ? K : M, ta ? M : K), B = upload(*be, b, tb ? N : K, tb ? K : N),
             C = upload(*be, c0, M, N);
      be->gemm(ta, tb, 0.5f, A, B, 2.0f, C);
      auto c = download(*be, C);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k) {
            double av = ta ? a[k * M + i] : a[i * K + k];
            double bv = tb ? b[j * K + k] : b[k * N + j];
            s += av * bv;
          }
          EXPECT_NEAR(c[i * N + j], 0.5 * s + 2.0 * c0[i * N + j], 1e-5);
        }
    }
}

TEST(ExecKernels, RopeIsARotationAndInverseIsItsTranspose) {
  auto be = make_cpu_backend();
  for (RopeScaling sc : {RopeScaling::none, RopeScaling::linear, RopeScaling::ntk, RopeScaling::yarn, RopeScaling::llama3}) {
    RopeSpec r;
    r.scaling = sc;
    r.factor = sc == RopeScaling::none ? 1.0 : 4.0;
    r.original_max_positions = 64;
    RopeTable t = make_rope_table(r, 16);
    ASSERT_EQ(t.rot_dim, 16);
    const int64_t rows = 6, heads = 2, d = 16;
    std::vector<int32_t> pos = {0, 1, 5, 17, 100, 1000};
    auto x = randn(rows * heads * d, 15), y = randn(rows * heads * d, 16);
    Tensor tp = upload(*be, pos), tf = upload(*be, t.inv_freq);
    Tensor tx = upload(*be, x, rows, heads * d), ty = upload(*be, y, rows, heads * d);
    be->rope(tx, heads, d, tp, tf, t.rot_dim, 1.0f, false);
    be->rope(ty, heads, d, tp, tf, t.rot_dim, 1.0f, true);
    auto rx = download(*be, tx), ry = download(*be, ty);
    double a = 0, b = 0, nx = 0, nrx = 0;  // <Rx, y> == <x, R^T y>, |Rx| == |x|
    for (size_t i = 0; i < x.size(); ++i) { a += rx[i] * y[i]; b += x[i] * ry[i]; nx += x[i] * x[i]; nrx += rx[i] * rx[i]; }
    EXPECT_NEAR(a, b, 1e-4) << to_string(sc);
    EXPECT_NEAR(nx, nrx, 1e-3) << to_string(sc);
    for (int64_t i = 0; i < heads * d; ++i) EXPECT_FLOAT_EQ(rx[i], x[i]);  // position 0 is the identity
    // scaled variants slow the lowest frequency down by the factor (PI, YaRN, llama3 all interpolate it)
    RopeTable base = make_rope_table(RopeSpec{}, 16);
    if (sc == RopeScaling::linear || sc == RopeScaling::yarn || sc == RopeScaling::llama3) {
      EXPECT_NEAR(t.inv_freq.back(), base.inv_freq.back() / 4.0, 1e-9) << to_string(sc);
    }
    if (sc == RopeScaling::none) {
      EXPECT_EQ(t.inv_freq, base.inv_freq);
    }
  }
}

TEST(ExecKernels, LedgerTracksCategoriesDtypeBytesAndPeakInstant) {
  auto be = make_cpu_backend();
  {
    Tensor a = be->alloc(10, 10, DType::f32, Mem::weights);
    Tensor b = be->alloc(5, 10, DType::f32, Mem::activations);
    b.reset();
    Tensor c = be->alloc(2, 10, DType::f32, Mem::logits);
    EXPECT_EQ(be->ledger().current(Mem::weights), 400);
    EXPECT_EQ(be->ledger().current(Mem::activations), 0);
    EXPECT_EQ(be->ledger().peak_total(), 600);  // a + b, before b was freed
    EXPECT_EQ(be->ledger().at_peak()[Mem::activations], 200);
    EXPECT_EQ(be->ledger().at_peak()[Mem::logits], 0);
    Tensor h = be->alloc(10, 10, DType::bf16, Mem::weights);
    EXPECT_EQ(be->ledger().current(Mem::weights), 600) << "a bf16 tensor is accounted at 2 bytes an element";
  }
  EXPECT_EQ(be->ledger().current_total(), 0);
}
