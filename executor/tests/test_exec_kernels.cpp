// CPU backend kernels against float64 references and central finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "executor/backend.hpp"
#include "executor/tests/kernel_test_util.hpp"
#include "executor/rope.hpp"

using namespace ctx;
using namespace ctx::exec;

namespace {

using ctx::exec::testing::randn;

// float64 reference: masked softmax attention, GQA, returns o [T, hq*d] and lse [T, hq]
void attention_ref(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                   const std::vector<int64_t>& idx, const std::vector<int32_t>& doc, int64_t T, int64_t hq, int64_t hkv,
                   int64_t d, std::vector<double>& o, std::vector<double>& lse) {
  o.assign(T * hq * d, 0.0);
  lse.assign(T * hq, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t h = 0; h < hq; ++h) {
      int64_t g = h / (hq / hkv);
      std::vector<double> s(T, -INFINITY);
      double mx = -INFINITY;
      for (int64_t j = 0; j < T; ++j) {
        if (!(idx[j] <= idx[i] && doc[j] == doc[i])) continue;
        double acc = 0;
        for (int64_t e = 0; e < d; ++e) acc += q[(i * hq + h) * d + e] * k[(j * hkv + g) * d + e];
        s[j] = acc * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < T; ++j)
        if (s[j] > -INFINITY) sum += std::exp(s[j] - mx);
      lse[i * hq + h] = mx + std::log(sum);
      for (int64_t j = 0; j < T; ++j)
        if (s[j] > -INFINITY)
          for (int64_t e = 0; e < d; ++e)
            o[(i * hq + h) * d + e] += std::exp(s[j] - mx) / sum * v[(j * hkv + g) * d + e];
    }
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

struct AttnCase {
  int64_t T = 24, hq = 4, hkv = 2, d = 8;
  std::vector<int64_t> idx;
  std::vector<int32_t> doc;
  std::vector<float> q, k, v;
  AttnCase() {
    // a permuted token order (as zig-zag places them) and three documents
    for (int64_t i = 0; i < T; ++i) idx.push_back((i * 7) % T);
    for (int64_t i = 0; i < T; ++i) doc.push_back(idx[i] < 9 ? 0 : idx[i] < 17 ? 1 : 2);
    q = randn(T * hq * d, 1);
    k = randn(T * hkv * d, 2);
    v = randn(T * hkv * d, 3);
  }
  AttnShape shape() const { return {hq, hkv, d, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))}; }
};

}  // namespace

TEST(ExecKernels, BlockwiseAttentionWithLseMergeMatchesFloat64Reference) {
  auto be = make_cpu_backend();
  AttnCase c;
  std::vector<double> ro, rl;
  attention_ref(to_double(c.q), to_double(c.k), to_double(c.v), c.idx, c.doc, c.T, c.hq, c.hkv, c.d, ro, rl);
  std::vector<float> o(c.T * c.hq * c.d, 0.0f), lse(c.T * c.hq, -std::numeric_limits<float>::infinity());
  // three key blocks of 8 merged through the log-sum-exp, in an order that is not the causal one
  for (int64_t b : {2, 0, 1}) {
    TokenRefs kt{c.idx.data() + b * 8, c.doc.data() + b * 8};
    be->attention_forward_block(o.data(), lse.data(), c.q.data(), {c.idx.data(), c.doc.data()}, c.T,
                                c.k.data() + b * 8 * c.hkv * c.d, c.v.data() + b * 8 * c.hkv * c.d, kt, 8, c.shape());
  }
  for (size_t i = 0; i < o.size(); ++i) EXPECT_NEAR(o[i], ro[i], 2e-6) << i;
  for (size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse[i], rl[i], 2e-6) << i;
}

TEST(ExecKernels, AttentionBackwardMatchesFiniteDifferences) {
  auto be = make_cpu_backend();
  AttnCase c;
  auto w = randn(c.T * c.hq * c.d, 9);  // loss = sum(w * o)
  auto loss = [&](const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v) {
    std::vector<double> o, l;
    attention_ref(q, k, v, c.idx, c.doc, c.T, c.hq, c.hkv, c.d, o, l);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += w[i] * o[i];
    return s;
  };
  std::vector<float> o(c.T * c.hq * c.d, 0.0f), lse(c.T * c.hq, -INFINITY), delta(c.T * c.hq);
  TokenRefs t{c.idx.data(), c.doc.data()};
  be->attention_forward_block(o.data(), lse.data(), c.q.data(), t, c.T, c.k.data(), c.v.data(), t, c.T, c.shape());
  be->attention_delta(delta.data(), w.data(), o.data(), c.T, c.shape());
  std::vector<float> dq(c.q.size(), 0.0f), dk(c.k.size(), 0.0f), dv(c.v.size(), 0.0f);
  for (int64_t b = 0; b < 3; ++b)  // backward block by block, as the ring does
    be->attention_backward_block(dq.data(), dk.data() + b * 8 * c.hkv * c.d, dv.data() + b * 8 * c.hkv * c.d,
                                 c.q.data(), t, c.T, c.k.data() + b * 8 * c.hkv * c.d, c.v.data() + b * 8 * c.hkv * c.d,
                                 {c.idx.data() + b * 8, c.doc.data() + b * 8}, 8, w.data(), lse.data(), delta.data(),
                                 c.shape());
  auto qd = to_double(c.q), kd = to_double(c.k), vd = to_double(c.v);
  const double h = 1e-5;
  auto check = [&](std::vector<double>& x, const std::vector<float>& g, const char* name) {
    double worst = 0;
    for (size_t i = 0; i < x.size(); i += 3) {
      double keep = x[i];
      x[i] = keep + h;
      double up = loss(qd, kd, vd);
      x[i] = keep - h;
      double dn = loss(qd, kd, vd);
      x[i] = keep;
      double fd = (up - dn) / (2 * h);
      worst = std::max(worst, std::fabs(fd - g[i]) / (1.0 + std::fabs(fd)));
    }
    EXPECT_LT(worst, 1e-4) << name;
  };
  check(qd, dq, "dq");
  check(kd, dk, "dk");
  check(vd, dv, "dv");
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
  std::vector<float> y(R * H), rstd(R), dx(R * H), dw(H, 0.0f);
  be->rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), R, H, 1e-5f);
  be->rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), rstd.data(), w.data(), R, H);
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
  std::vector<float> dg(n), du(n);
  be->swiglu_backward(dg.data(), du.data(), da.data(), g.data(), u.data(), n);
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
  std::vector<float> mx(R), se(2 * R), lse(R), wt(R);
  be->row_max(mx.data(), logits.data(), R, V, V);
  be->sumexp_and_target(se.data(), logits.data(), mx.data(), target.data(), R, V, V, 0);
  for (int64_t r = 0; r < R; ++r) { lse[r] = mx[r] + std::log(se[2 * r]); wt[r] = target[r] >= 0 ? 1.0f : 0.0f; }
  auto ld = to_double(logits);
  std::vector<float> g = logits;
  be->xent_grad_inplace(g.data(), lse.data(), target.data(), wt.data(), R, V, V, 0);
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

TEST(ExecKernels, GemmTransposesMatchFloat64Reference) {
  auto be = make_cpu_backend();
  const int64_t M = 5, N = 7, K = 6;
  auto a = randn(M * K, 12), b = randn(K * N, 13), c0 = randn(M * N, 14);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      std::vector<float> c = c0;
      be->gemm(ta, tb, M, N, K, 0.5f, a.data(), b.data(), 2.0f, c.data());
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
    auto rx = x;
    be->rope(rx.data(), rows, heads, d, pos.data(), t.inv_freq.data(), t.rot_dim, 1.0f, false);
    auto ry = y;
    be->rope(ry.data(), rows, heads, d, pos.data(), t.inv_freq.data(), t.rot_dim, 1.0f, true);
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

TEST(ExecKernels, LedgerTracksCategoriesAndPeakInstant) {
  auto be = make_cpu_backend();
  {
    Tensor a = be->alloc(10, 10, Mem::weights);
    Tensor b = be->alloc(5, 10, Mem::activations);
    b.reset();
    Tensor c = be->alloc(2, 10, Mem::logits);
    EXPECT_EQ(be->ledger().current(Mem::weights), 400);
    EXPECT_EQ(be->ledger().current(Mem::activations), 0);
    EXPECT_EQ(be->ledger().peak_total(), 600);  // a + b, before b was freed
    EXPECT_EQ(be->ledger().at_peak()[Mem::activations], 200);
    EXPECT_EQ(be->ledger().at_peak()[Mem::logits], 0);
  }
  EXPECT_EQ(be->ledger().current_total(), 0);
}
