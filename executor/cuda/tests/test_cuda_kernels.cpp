// The CUDA backend against the CPU reference backend (make_cpu_backend), op by op, on random
// inputs uploaded into both; then a few training steps of the tiny model on both backends. Label
// "gpu": without a CUDA device every test reports SKIPPED (GTEST_SKIP), and ctest shows them as
// skipped. Status: none of these has run yet (docs/CUDA.md: compiles, untested on GPU).
//
// Attention (f32 and bf16, two merged key blocks, documents, GQA 4:1 and 8:1, head dims 20, 64,
// 128, hulls, delta, dq/dk/dv) is tested against float64 by the op cases on this backend:
// test_backend_ops_gpu (executor/tests/op_cases.hpp, label gpu).
//
// Tolerances (float32 both sides; the only differences are summation order and FMA contraction):
//   elementwise kernels (SwiGLU, RoPE, AdamW, cross-entropy gradient): 1e-5 relative + 1e-6 absolute
//   row reductions (RMSNorm, sum-exp, delta, xent_finish): 1e-5 relative + 1e-6 absolute
//   step statistics (double sums rounded once to float on both sides): 1e-6 relative
//   GEMM (exact fp32 compute in cuBLASLt): 1e-5 * k * max|operand|^2 absolute
//   data movement, embedding (same additions in the same order): exact
//   training losses after 3 steps: 1e-4 relative
//
// bf16 (the *Bf16* tests): both backends hold the same bf16 values (upload rounds to nearest even
// on both sides), widen, compute in fp32 and round each output once, so a bf16 result is the fp32
// tolerance above plus at most 1 bf16 ulp of the result (fp32 values differing by summation order
// or FMA contraction can round to neighbouring bf16 numbers), 2 ulps where a bf16 output is read
// and updated by a second call. bf16 GEMMs: cuBLASLt's tensor cores multiply bf16 values exactly
// and accumulate in fp32 as Eigen does on the widened values, so the fp32 GEMM tolerance plus
// 1 ulp. Data movement of bf16 (copy_cols, embedding gather, conversions) is exact. Three bf16
// training steps of the tiny model: loss within 5e-3 relative, gradient norm within 5e-2 (a
// 1-ulp activation difference, 2^-8 relative, can appear at any op and propagates).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "executor/tests/kernel_test_util.hpp"
#include "executor/cuda/cuda_backend.hpp"
#include "executor/trainer.hpp"
#ifdef CTXPLAN_HAVE_NCCL
#include "executor/cuda/comm_nccl.hpp"
#endif

using namespace ctx;
using namespace ctx::exec;

namespace {

using ctx::exec::testing::download;
using ctx::exec::testing::expect_close;
using ctx::exec::testing::randn;
using ctx::exec::testing::upload;

// One CUDA backend for the whole binary (cuBLASLt set-up costs a second); null without a device.
Backend* gpu() {
  static std::unique_ptr<Backend> be = cuda_device_count() > 0 ? make_cuda_backend(0) : nullptr;
  return be.get();
}

// The same data in a CPU tensor ([0]) and a CUDA tensor ([1]).
struct Two {
  Tensor t[2];
  View operator[](int i) const { return t[i]; }
};

class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none): GPU test skipped";
    g_ = gpu();
    c_ = make_cpu_backend();
  }
  Backend& be(int i) { return i ? *g_ : *c_; }
  template <typename T>
  Two two(const std::vector<T>& v, int64_t rows = 0, int64_t cols = 0) {
    return {{upload(*c_, v, rows, cols), upload(*g_, v, rows, cols)}};
  }
  Two two_zeros(int64_t rows, int64_t cols) {
    Two r;
    for (int i = 0; i < 2; ++i) {
      r.t[i] = be(i).alloc(rows, cols, DType::f32, Mem::workspace);
      be(i).zero(r.t[i]);
    }
    return r;
  }
  // Runs `op(backend, side)` on the CPU (side 0) and the CUDA backend (side 1).
  template <typename Op>
  void both(Op op) {
    op(*c_, 0);
    op(*g_, 1);
  }
  // The CUDA result against the CPU's.
  void same(const Two& x, double rtol, double atol, const std::string& what) {
    expect_close(download(*c_, x[0]), download(*g_, x[1]), rtol, atol, what);
  }
  // bf16 tensors on both sides holding v (rounded by each backend's upload).
  Two two_bf16(const std::vector<float>& v, int64_t rows, int64_t cols) {
    return {{upload(*c_, v, rows, cols, DType::bf16), upload(*g_, v, rows, cols, DType::bf16)}};
  }
  Two two_zeros_as(int64_t rows, int64_t cols, DType dt) {
    Two r;
    for (int i = 0; i < 2; ++i) {
      r.t[i] = be(i).alloc(rows, cols, dt, Mem::workspace);
      be(i).zero(r.t[i]);
    }
    return r;
  }
  // |gpu - cpu| <= atol + rtol |cpu| + ulps bf16 ulps of the larger (see the tolerances above).
  void same_bf16(const Two& x, double rtol, double atol, int ulps, const std::string& what) {
    const auto want = download(*c_, x[0]), got = download(*g_, x[1]);
    ASSERT_EQ(want.size(), got.size()) << what;
    size_t identical = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double w = want[i], g = got[i];
      if (w == g || (std::isnan(w) && std::isnan(g))) {
        ++identical;
        continue;
      }
      int e = 0;
      std::frexp(std::max(std::fabs(w), std::fabs(g)), &e);
      const double ulp = std::isfinite(w) && std::isfinite(g) ? std::ldexp(1.0, e - 8) : 0.0;
      ASSERT_LE(std::fabs(g - w), atol + rtol * std::fabs(w) + ulps * ulp)
          << what << ": element " << i << " is " << g << ", reference " << w << " (" << ulps << " bf16 ulps)";
    }
    std::printf("[ bf16     ] %s: %zu of %zu bit-identical\n", what.c_str(), identical, want.size());
  }
  Backend* g_ = nullptr;
  std::unique_ptr<Backend> c_;
};

TEST_F(CudaVsCpu, DataMovementAndStepStatisticsMatchCpu) {
  auto x = randn(5000, 1), y = randn(5000, 2);
  Two tx = two(x), ty = two(y);
  both([&](Backend& b, int i) { b.axpy(ty[i], 0.75f, tx[i]); });
  same(ty, 1e-6, 1e-7, "axpy");
  both([&](Backend& b, int i) { b.scale(ty[i], -1.5f); });
  same(ty, 1e-6, 1e-7, "scale");
  Two stats = two(std::vector<float>{0.5f, 0.0f, 1.0f});
  both([&](Backend& b, int i) { b.sum_squares(stats[i], tx[i]); });
  same(stats, 1e-6, 0, "sum_squares into the statistics");
  both([&](Backend& b, int i) { b.flag_nonfinite(stats[i], tx[i], 3.0f); });
  same(stats, 0, 0, "a finite tensor flags nothing");
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto z = x;
    z[4321] = bad;
    Two tz = two(z);
    both([&](Backend& b, int i) { b.flag_nonfinite(stats[i], tz[i], 4.0f); });
    same(stats, 0, 0, "non-finite flag");
    EXPECT_EQ(download(*g_, stats[1])[kStatNonFinite], 4.0f) << bad;
  }
  both([&](Backend& b, int i) { b.fill(tx[i].flat(0, 100), 2.5f); });
  same(tx, 0, 0, "fill");
  both([&](Backend& b, int i) { b.zero(tx[i].flat(100, 50)); });
  same(tx, 0, 0, "zero");
  // column ranges: 9 columns of a [7, 40] matrix into a [7, 13] one, then 10 added back
  Two tw = two(randn(7 * 40, 3), 7, 40), tn = two(randn(7 * 13, 4), 7, 13);
  both([&](Backend& b, int i) { b.copy_cols(tn[i], 2, tw[i], 5, 9); });
  same(tn, 0, 0, "copy_cols");
  both([&](Backend& b, int i) { b.add_cols(tw[i], 30, tn[i], 0, 10); });
  same(tw, 1e-7, 0, "add_cols");
  // overlapping copy keeps memmove semantics
  both([&](Backend& b, int i) { b.copy(tw[i].flat(1, 200), tw[i].flat(0, 200)); });
  same(tw, 0, 0, "overlapping copy");
  // token data: an int32 column copied out of a [3, 2] tensor (a strided byte copy for i32),
  // then used as embedding ids, so the copy is read back through its use
  Two ti = two(std::vector<int32_t>{2, -1, 0, 9, 3, 13}, 3, 2), tj = two(std::vector<int32_t>(3, 0), 3, 1);
  both([&](Backend& b, int i) { b.copy_cols(tj[i], 0, ti[i], 1, 1); });  // ids -1, 9, 13
  Two table = two(randn(12 * 4, 5), 12, 4), emb = two_zeros(3, 4);
  both([&](Backend& b, int i) { b.embedding_forward(emb[i], table[i], tj[i], 1); });
  same(emb, 0, 0, "embedding rows picked by int32 ids moved with copy_cols");
  EXPECT_EQ(download(*g_, emb[1])[4], download(*g_, table[1])[8 * 4]) << "id 9 is row 8 of a table starting at 1";
}

// bf16 storage (issue 13): the host boundary, conversions, the elementwise ops and data movement,
// with mixed dtypes where the interface allows them.
TEST_F(CudaVsCpu, Bf16DataMovementAndElementwiseMatchCpuBf16) {
  auto x = randn(5001, 130, 3.0f), y = randn(5001, 131);
  x[0] = std::numeric_limits<float>::quiet_NaN();
  x[1] = -std::numeric_limits<float>::infinity();
  x[2] = 3.4e38f;  // rounds to infinity
  Two tx = two_bf16(x, 1, 5001), ty = two_bf16(y, 1, 5001), tf = two(y);
  same_bf16(tx, 0, 0, 0, "upload/download bf16 (round to nearest even on the host)");
  Two conv = two_zeros_as(1, 5001, DType::bf16), back = two_zeros(1, 5001);
  both([&](Backend& b, int i) { b.copy(conv[i], tf[i]); });
  same_bf16(conv, 0, 0, 0, "copy f32 -> bf16");
  both([&](Backend& b, int i) { b.copy(back[i], tx[i]); });
  same(back, 0, 0, "copy bf16 -> f32");
  both([&](Backend& b, int i) { b.copy(conv[i].flat(1, 2000), conv[i].flat(0, 2000)); });
  same_bf16(conv, 0, 0, 0, "overlapping bf16 copy");
  both([&](Backend& b, int i) { b.axpy(ty[i], 0.75f, tf[i]); });
  same_bf16(ty, 0, 0, 1, "axpy bf16 += f32");  // FMA contraction on the GPU: one rounding fewer before bf16
  both([&](Backend& b, int i) { b.axpy(tf[i], -0.5f, ty[i]); });
  same(tf, 1e-6, 1e-7, "axpy f32 += bf16");
  both([&](Backend& b, int i) { b.scale(ty[i], -1.5f); });
  same_bf16(ty, 0, 0, 0, "scale bf16");
  both([&](Backend& b, int i) { b.fill(ty[i].flat(0, 100), 0.1f); });
  both([&](Backend& b, int i) { b.zero(ty[i].flat(100, 51)); });  // odd element count and offset
  same_bf16(ty, 0, 0, 0, "fill and zero bf16");
  {
    Two stats = two(std::vector<float>{0, 0, 0});
    both([&](Backend& b, int i) { b.flag_nonfinite(stats[i], ty[i], 2.0f); });
    both([&](Backend& b, int i) { b.flag_nonfinite(stats[i], tx[i], 5.0f); });
    same(stats, 0, 0, "non-finite flag over bf16");
    EXPECT_EQ(download(*g_, stats[1])[kStatNonFinite], 5.0f);
  }
  Two tw = two_bf16(randn(7 * 40, 132), 7, 40), tn = two_bf16(randn(7 * 13, 133), 7, 13), twf = two(randn(7 * 40, 134), 7, 40);
  both([&](Backend& b, int i) { b.copy_cols(tn[i], 2, tw[i], 5, 9); });
  same_bf16(tn, 0, 0, 0, "copy_cols bf16");
  both([&](Backend& b, int i) { b.add_cols(tw[i], 30, tn[i], 0, 10); });
  same_bf16(tw, 0, 0, 0, "add_cols bf16 += bf16");
  both([&](Backend& b, int i) { b.add_cols(tw[i], 0, twf[i], 3, 11); });
  same_bf16(tw, 0, 0, 0, "add_cols bf16 += f32");
  both([&](Backend& b, int i) { b.add_cols(twf[i], 1, tn[i], 0, 13); });
  same(twf, 0, 0, "add_cols f32 += bf16");
  // a pinned host bf16 tensor (offloaded states) written by kernels
  Tensor h = g_->alloc_host(1, 11, DType::bf16, HostMem::optimizer);
  g_->zero(h);
  g_->fill(h.flat(0, 3), 1.5f);
  std::vector<float> want(11, 0.0f);
  std::fill(want.begin(), want.begin() + 3, 1.5f);
  EXPECT_EQ(download(*g_, h), want);
}

// bf16 GEMMs: A, B bf16 into a bf16 C and into an f32 C (weight gradients, beta 1), A f32 x B bf16
// (the logits gradient times the head weights) into bf16 and f32 C, all four transposes.
TEST_F(CudaVsCpu, Bf16GemmsMatchCpuBf16) {
  const int64_t m = 37, n = 53, k = 29;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const std::string tag = " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb);
      auto av = randn(m * k, 140 + ta), bv = randn(k * n, 142 + tb), cv = randn(m * n, 144);
      const int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
      Two a = two_bf16(av, ar, ac), b = two_bf16(bv, br, bc), af = two(av, ar, ac);
      Two c = two_bf16(cv, m, n), cf = two(cv, m, n);
      const double atol = 1e-5 * k * 16;
      both([&](Backend& be_, int i) { be_.gemm(ta, tb, 0.7f, a[i], b[i], 0.0f, c[i]); });
      same_bf16(c, 1e-5, atol, 1, "gemm bf16 x bf16 -> bf16" + tag);
      both([&](Backend& be_, int i) { be_.gemm(ta, tb, 0.7f, a[i], b[i], 1.0f, cf[i]); });
      same(cf, 1e-5, atol, "gemm bf16 x bf16 += f32" + tag);
      both([&](Backend& be_, int i) { be_.gemm(ta, tb, 0.7f, af[i], b[i], 0.5f, c[i]); });
      same_bf16(c, 1e-5, atol, 1, "gemm f32 x bf16 -> bf16 (widened)" + tag);
      both([&](Backend& be_, int i) { be_.gemm(ta, tb, 0.7f, af[i], b[i], 1.0f, cf[i]); });
      same(cf, 1e-5, atol, "gemm f32 x bf16 += f32 (widened)" + tag);
    }
}

// RMSNorm, RoPE, SwiGLU and the embedding on bf16 activations and weights (rstd, dw, dtable f32).
TEST_F(CudaVsCpu, Bf16ModelKernelsMatchCpuBf16) {
  const int64_t rows = 70, h = 300;
  Two x = two_bf16(randn(rows * h, 150), rows, h), w = two_bf16(randn(h, 151), 1, h),
      dy = two_bf16(randn(rows * h, 152), rows, h), dw = two(randn(h, 153, 0.1f)),
      y = two_zeros_as(rows, h, DType::bf16), rstd = two_zeros(rows, 1), dx = two_zeros_as(rows, h, DType::bf16);
  both([&](Backend& b, int i) { b.rmsnorm_forward(y[i], rstd[i], x[i], w[i], 1e-5f); });
  same_bf16(y, 1e-5, 1e-6, 1, "rmsnorm y bf16");
  same(rstd, 1e-6, 0, "rmsnorm rstd from bf16 x");
  both([&](Backend& b, int i) { b.rmsnorm_backward(dx[i], dw[i], dy[i], x[i], rstd[i], w[i]); });
  same_bf16(dx, 1e-5, 1e-6, 1, "rmsnorm dx bf16");
  same(dw, 1e-5, 1e-5, "rmsnorm dw (f32) from bf16");
  Two wf = two(randn(h, 151));  // an f32 weight with bf16 x, y: the widening path
  both([&](Backend& b, int i) { b.rmsnorm_forward(y[i], rstd[i], x[i], wf[i], 1e-5f); });
  same_bf16(y, 1e-5, 1e-6, 1, "rmsnorm y bf16 with an f32 weight (widened)");
  const int64_t rrows = 9, heads = 3, d = 16, rot = 12;
  std::vector<int32_t> pos = {0, 1, 7, 1000, 65535, 131071, 524287, 1000000, 3};
  std::vector<float> inv_freq(rot / 2);
  for (int64_t i = 0; i < rot / 2; ++i) inv_freq[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / rot));
  Two r = two_bf16(randn(rrows * heads * d, 154), rrows, heads * d), p = two(pos), f = two(inv_freq);
  for (bool inverse : {false, true}) {
    both([&](Backend& b, int i) { b.rope(r[i], heads, d, p[i], f[i], rot, 1.1f, inverse); });
    same_bf16(r, 1e-5, 1e-6, 1, inverse ? "rope bf16 inverse" : "rope bf16");
  }
  const int64_t n = 4097;
  Two g = two_bf16(randn(n, 155, 4.0f), 1, n), u = two_bf16(randn(n, 156), 1, n), da = two_bf16(randn(n, 157), 1, n),
      a = two_zeros_as(1, n, DType::bf16), dg = two_zeros_as(1, n, DType::bf16), du = two_zeros_as(1, n, DType::bf16);
  both([&](Backend& b, int i) { b.swiglu_forward(a[i], g[i], u[i]); });
  same_bf16(a, 1e-5, 1e-6, 1, "swiglu forward bf16");
  both([&](Backend& b, int i) { b.swiglu_backward(dg[i], du[i], da[i], g[i], u[i]); });
  same_bf16(dg, 1e-5, 1e-6, 1, "swiglu dgate bf16");
  same_bf16(du, 1e-5, 1e-6, 1, "swiglu dup bf16");
  const int64_t eh = 33, v0 = 10, vrows = 50, tokens = 200;
  std::mt19937 rng(158);
  std::vector<int32_t> tok(tokens);
  for (auto& t : tok) t = static_cast<int32_t>(rng() % 80);
  Two tt = two(tok), table = two_bf16(randn(vrows * eh, 159), vrows, eh), dout = two_bf16(randn(tokens * eh, 160), tokens, eh),
      dtable = two(randn(vrows * eh, 161), vrows, eh), out = two_zeros_as(tokens, eh, DType::bf16);
  both([&](Backend& b, int i) { b.embedding_forward(out[i], table[i], tt[i], v0); });
  same_bf16(out, 0, 0, 0, "embedding forward bf16");
  both([&](Backend& b, int i) { b.embedding_backward(dtable[i], dout[i], tt[i], v0); });
  same(dtable, 0, 0, "embedding backward from bf16 dout (bit-identical)");
}

TEST_F(CudaVsCpu, GemmMatchesCpuForAllTransposes) {
  struct Shape {
    int64_t m, n, k;
  };
  for (Shape s : {Shape{37, 53, 29}, Shape{128, 96, 256}, Shape{1, 200, 64}}) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.0f, 0.5f}) {
          Two a = two(randn(s.m * s.k, 10 + ta), ta ? s.k : s.m, ta ? s.m : s.k);
          Two b = two(randn(s.k * s.n, 20 + tb), tb ? s.n : s.k, tb ? s.k : s.n);
          Two c = two(randn(s.m * s.n, 30), s.m, s.n);
          both([&](Backend& be_, int i) { be_.gemm(ta, tb, 0.7f, a[i], b[i], beta, c[i]); });
          same(c, 1e-5, 1e-5 * s.k * 16,
               "gemm m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                   " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " beta=" + std::to_string(beta));
        }
  }
  // k = 0: C = beta C
  Two c = two(randn(12, 5), 3, 4), a = two(std::vector<float>{}, 3, 0), b = two(std::vector<float>{}, 4, 0);
  both([&](Backend& be_, int i) { be_.gemm(false, true, 1.0f, a[i], b[i], 0.25f, c[i]); });
  same(c, 1e-7, 0, "gemm k=0");
}

TEST_F(CudaVsCpu, RmsNormForwardBackwardMatchCpu) {
  const int64_t rows = 70, h = 300;
  Two x = two(randn(rows * h, 40), rows, h), w = two(randn(h, 41)), dy = two(randn(rows * h, 42), rows, h),
      dw = two(randn(h, 43, 0.1f)), y = two_zeros(rows, h), rstd = two_zeros(rows, 1), dx = two_zeros(rows, h);
  both([&](Backend& b, int i) { b.rmsnorm_forward(y[i], rstd[i], x[i], w[i], 1e-5f); });
  same(y, 1e-5, 1e-6, "rmsnorm y");
  same(rstd, 1e-6, 0, "rmsnorm rstd");
  both([&](Backend& b, int i) { b.rmsnorm_forward(View{}, rstd[i], x[i], w[i], 1e-5f); });  // rstd only
  same(rstd, 1e-6, 0, "rmsnorm rstd (no y)");
  both([&](Backend& b, int i) { b.rmsnorm_backward(dx[i], dw[i], dy[i], x[i], rstd[i], w[i]); });
  same(dx, 1e-5, 1e-6, "rmsnorm dx");
  same(dw, 1e-5, 1e-5, "rmsnorm dw (accumulated)");
}

TEST_F(CudaVsCpu, RopeMatchesCpuForwardAndInverseAtLargePositions) {
  const int64_t rows = 9, heads = 3, d = 16, rot = 12;
  std::vector<int32_t> pos = {0, 1, 7, 1000, 65535, 131071, 524287, 1000000, 3};
  std::vector<float> inv_freq(rot / 2);
  for (int64_t i = 0; i < rot / 2; ++i) inv_freq[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / rot));
  Two x = two(randn(rows * heads * d, 50), rows, heads * d), p = two(pos), f = two(inv_freq);
  for (bool inverse : {false, true}) {
    both([&](Backend& b, int i) { b.rope(x[i], heads, d, p[i], f[i], rot, 1.1f, inverse); });
    same(x, 1e-5, 1e-6, inverse ? "rope inverse" : "rope");
  }
}

TEST_F(CudaVsCpu, SwigluForwardBackwardMatchCpu) {
  const int64_t n = 4097;
  Two g = two(randn(n, 60, 4.0f)), u = two(randn(n, 61)), da = two(randn(n, 62)), a = two_zeros(1, n),
      dg = two_zeros(1, n), du = two_zeros(1, n);
  both([&](Backend& b, int i) { b.swiglu_forward(a[i], g[i], u[i]); });
  same(a, 1e-5, 1e-6, "swiglu forward");
  both([&](Backend& b, int i) { b.swiglu_backward(dg[i], du[i], da[i], g[i], u[i]); });
  same(dg, 1e-5, 1e-6, "swiglu dgate");
  same(du, 1e-5, 1e-6, "swiglu dup");
}

TEST_F(CudaVsCpu, EmbeddingForwardBackwardMatchCpuInTokenOrder) {
  const int64_t h = 33, v0 = 10, vrows = 50, tokens = 200;
  std::mt19937 r(70);
  std::vector<int32_t> tok(tokens);
  for (auto& t : tok) t = static_cast<int32_t>(r() % 80);  // some below v0, some past v0 + vrows, many repeats
  Two tt = two(tok), table = two(randn(vrows * h, 71), vrows, h), dout = two(randn(tokens * h, 72), tokens, h),
      dtable = two(randn(vrows * h, 73), vrows, h), out = two_zeros(tokens, h);
  both([&](Backend& b, int i) { b.embedding_forward(out[i], table[i], tt[i], v0); });
  same(out, 0, 0, "embedding forward");
  both([&](Backend& b, int i) { b.embedding_backward(dtable[i], dout[i], tt[i], v0); });
  same(dtable, 0, 0, "embedding backward (same order of additions: bit-identical)");
}

TEST_F(CudaVsCpu, CrossEntropyPiecesMatchCpu) {
  const int64_t rows = 6, cols = 1000, valid = 990, v0 = 2000;
  std::vector<int32_t> target = {2000, 2989, 2990, 1999, -1, 2500};  // first, last, past valid, below shard, ignored
  Two logits = two(randn(rows * cols, 100, 3.0f), rows, cols), tt = two(target), mx = two_zeros(rows, 1),
      se = two_zeros(rows, 2), lse = two_zeros(rows, 1), stats = two(std::vector<float>{0.25f, 0, 0});
  both([&](Backend& b, int i) { b.row_max(mx[i], logits[i], valid); });
  same(mx, 0, 0, "row_max");
  both([&](Backend& b, int i) { b.sumexp_and_target(se[i], logits[i], mx[i], tt[i], valid, v0); });
  same(se, 1e-6, 0, "sumexp_and_target");
  both([&](Backend& b, int i) { b.xent_finish(lse[i], stats[i], mx[i], se[i], tt[i]); });
  same(lse, 1e-6, 1e-6, "xent_finish lse");
  same(stats, 1e-6, 1e-6, "xent_finish loss statistic");
  both([&](Backend& b, int i) { b.xent_grad_inplace(logits[i], lse[i], tt[i], 0.125f, valid, v0); });
  same(logits, 1e-5, 1e-7, "xent_grad_inplace");
}

// AdamW with the decisions on the device: a clipped step, an unclipped one, a skipped one (flag),
// a skipped one (non-finite norm).
TEST_F(CudaVsCpu, AdamwClipsAndSkipsLikeCpu) {
  const int64_t n = 3001;
  auto vv = randn(n, 112, 0.01f);
  for (auto& x : vv) x = std::fabs(x);
  Two master = two(randn(n, 110)), m = two(randn(n, 111, 0.01f)), v = two(vv), grad = two(randn(n, 113));
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> stats = {{0, 0, 9.0f}, {0, 0, 0.01f}, {0, 1.0f, 0.01f}, {0, 0, inf}};
  for (int64_t step = 1; step <= 4; ++step) {
    Two st = two(stats[step - 1]);
    AdamWArgs a;
    a.lr = 1e-3f;
    a.weight_decay = 0.1f;
    a.clip = 1.0f;
    a.step = step;
    both([&](Backend& b, int i) { b.adamw(master[i], m[i], v[i], grad[i], st[i], a); });
    same(master, 1e-6, 1e-7, "adamw master, step " + std::to_string(step));
  }
  same(m, 1e-6, 1e-9, "adamw m");
  same(v, 1e-6, 1e-10, "adamw v");
}

// mark_time records stream order: later slots are later, unset slots read -1.
TEST_F(CudaVsCpu, PhaseTimesAreStreamOrdered) {
  Two x = two(randn(1 << 20, 120));
  g_->mark_time(0);
  for (int r = 0; r < 20; ++r) g_->scale(x[1], 1.0001f);
  g_->mark_time(2);
  g_->synchronize();
  auto t = g_->read_times();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_GE(t[0], 0.0);
  EXPECT_EQ(t[1], -1.0);
  EXPECT_GE(t[2], t[0]);
}

TEST_F(CudaVsCpu, CachingAllocatorReusesBlocksAndLedgerIsUnchanged) {
  const int64_t before = g_->ledger().current_total();
  { Tensor t = g_->alloc(1000, 1000, DType::f32, Mem::activations); }
  const CudaMemoryReport r1 = cuda_memory_report(*g_);
  {
    Tensor t = g_->alloc(1000, 1000, DType::f32, Mem::activations);
    EXPECT_EQ(g_->ledger().current(Mem::activations), 4000000);
  }
  const CudaMemoryReport r2 = cuda_memory_report(*g_);
  EXPECT_EQ(r2.allocator_cuda_calls, r1.allocator_cuda_calls) << "the second block of the same size came from the cache";
  EXPECT_EQ(g_->ledger().current_total(), before);
  EXPECT_GE(r2.allocator_cached_bytes, 4000000);
  EXPECT_GT(r2.driver_total_bytes, 0);
  EXPECT_GE(r2.driver_used_bytes(), r2.allocator_reserved_bytes - r2.allocator_cached_bytes);
  Tensor h = g_->alloc_host(10, 10, DType::f32, HostMem::optimizer);  // pinned host tensors: kernels reach them
  g_->zero(h);
  g_->fill(h.flat(0, 10), 1.5f);
  std::vector<float> want(100, 0.0f);
  std::fill(want.begin(), want.begin() + 10, 1.5f);
  EXPECT_EQ(download(*g_, h), want);
  std::printf("%s\n", to_string(r2).c_str());
}

#ifdef CTXPLAN_HAVE_NCCL
// One-rank NCCL communicator bootstrapped from the self world's HostComm.
TEST_F(CudaVsCpu, NcclSingleRankCollectivesHostPathAndSelfP2p) {
  auto world = make_self_world();
  auto c = make_nccl_comm(*g_, world->split({0}));
  EXPECT_EQ(c->size(), 1);
  auto x = randn(1000, 120);
  Tensor gx = upload(*g_, x), gr = upload(*g_, std::vector<float>(1000, 0.0f)), ga = upload(*g_, std::vector<float>(1000, 0.0f));
  c->allreduce_sum(gx);
  expect_close(x, download(*g_, gx), 0, 0, "allreduce over one rank");
  c->allgather(gx, ga);
  expect_close(x, download(*g_, ga), 0, 0, "allgather over one rank");
  double host_scalar = 3.5;
  c->host_allreduce_sum(&host_scalar, 1);
  EXPECT_EQ(host_scalar, 3.5);
  int code = 7;
  c->host_allreduce_max(&code, 1);
  EXPECT_EQ(code, 7);
  auto rr = c->irecv(gr, 0, 11);
  auto rs = c->isend(gx, 0, 11);
  rr->wait();
  rs->wait();
  expect_close(x, download(*g_, gr), 0, 0, "send to self");
  c->barrier();
}
#endif

// Three optimizer steps of the tiny model on both backends (same data, same initialisation).
// (The NCCL communicator is not wired into the trainer yet: both run on the self world.)
void train_both(const std::string& plan_text, int64_t seq, double loss_rtol = 1e-4, double norm_rtol = 1e-3) {
  Profiles prof = load_profiles(default_profiles_dir());
  ModelSpec m = resolve_model(prof, "tiny");
  Plan plan = parse_plan(plan_text);
  ASSERT_EQ(executor_plan_problem(m, plan, seq), "");
  TrainOptions o;
  o.model = m;
  o.plan = plan;
  o.seq = seq;
  o.opt.lr = 1e-3f;
  o.opt.warmup = 0;
  o.opt.total_steps = 100;
  DataOptions d;
  d.seq = seq;
  d.vocab = m.vocab;
  d.doc_mask = plan.mask == MaskKind::document;
  if (d.doc_mask && !plan.docs.tokens.empty()) d.doc_min = d.doc_max = plan.docs.tokens[0];
  auto data = make_synthetic(d);
  auto cpu = make_cpu_backend();
  auto cpu_world = make_self_world();
  auto gpu_world = make_self_world();
  Trainer tc(*cpu, *cpu_world, o, *data), tg(*gpu(), *gpu_world, o, *data);
  for (int s = 0; s < 3; ++s) {
    StepStats a = tc.step(), b = tg.step();
    EXPECT_NEAR(b.loss, a.loss, loss_rtol * std::fabs(a.loss)) << plan_text << " step " << s + 1;
    EXPECT_NEAR(b.grad_norm, a.grad_norm, norm_rtol * a.grad_norm + 1e-6) << plan_text << " step " << s + 1;
  }
}

TEST_F(CudaVsCpu, TinyModelTrainingMatchesCpuBackend) {
  train_both("dp=1,precision=fp32", 128);
  train_both("dp=1,mask=doc:32,recompute=full,precision=fp32", 128);
}

TEST_F(CudaVsCpu, TinyModelBf16TrainingMatchesCpuBackend) {
  train_both("dp=1,precision=bf16", 128, 5e-3, 5e-2);
  train_both("dp=1,mask=doc:32,recompute=full,precision=bf16", 128, 5e-3, 5e-2);
}

}  // namespace
