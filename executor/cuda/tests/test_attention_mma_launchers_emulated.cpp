// The tensor-core attention's launchers (attention_mma.cu, compiled as C++ into the emulated CUDA
// backend, ctxplan_cuda_emulated) on the CPU test double of the CUDA runtime: device memory the
// host cannot touch, launches queued on a stream and checked against sm_90's limits with the
// launchers' own shared-memory opt-in (cudaFuncSetAttribute), kernels run by the emulator with
// its race detector. Checks the dispatch by head dim, the launch geometry, the 16-byte and 4-byte
// copy paths (a q/k/v/dout 4 bytes past a 16-byte boundary), the refusals, and the results
// against a float64 reference (tolerance derived in test_attention_mma_emulated.cpp: c u A with
// u = 2^-8, A the sum of the reference's absolute terms; c = 4 here for margin). Label cpu.
// Compiled with emu_prelude.hpp like the emulated backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "executor/cuda/attention_mma.hpp"
#include "executor/cuda/bf16_device.cuh"

namespace {

namespace k = ctx::exec::cuda::k;
namespace dev = ctx::exec::cuda::dev;
using bf16 = uint16_t;
constexpr double kU = 1.0 / 256;

void check(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// device copy of a host vector, `offset` bytes past a 256-byte aligned allocation
template <typename T>
T* upload(const std::vector<T>& h, size_t offset, std::vector<void*>& owned) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, h.size() * sizeof(T) + offset + 16), cudaSuccess);
  owned.push_back(p);
  T* d = reinterpret_cast<T*>(static_cast<char*>(p) + offset);
  EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}
template <typename T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

struct Inputs {
  int64_t hq = 4, hkv = 1, d = 64, tq = 37, tk = 50;
  float scale = 0.125f;
  std::vector<bf16> q, k, v, dout;
  std::vector<int64_t> qi, ki;
  std::vector<int32_t> qd, kd, range;
  explicit Inputs(int64_t dim) : d(dim) {
    scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    std::mt19937_64 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto fill = [&](std::vector<bf16>& x, size_t n) {
      x.resize(n);
      for (auto& e : x) e = dev::float_to_bf16(nd(rng));
    };
    fill(q, tq * hq * d);
    fill(dout, tq * hq * d);
    fill(k, tk * hkv * d);
    fill(v, tk * hkv * d);
    for (int64_t i = 0; i < tq; ++i) qi.push_back(20 + i), qd.push_back(static_cast<int32_t>((20 + i) / 30));
    for (int64_t j = 0; j < tk; ++j) ki.push_back(j), kd.push_back(static_cast<int32_t>(j / 30));
    for (int64_t i = 0; i < tq; ++i) {  // hulls: [first, last] visible key of the query's document
      int32_t lo = -1, hi = -1;
      for (int64_t j = 0; j < tk; ++j)
        if (ki[j] <= qi[i] && kd[j] == qd[i]) {
          if (lo < 0) lo = static_cast<int32_t>(j);
          hi = static_cast<int32_t>(j + 1);
        }
      range.push_back(lo < 0 ? 0 : lo);
      range.push_back(lo < 0 ? 0 : hi);
    }
  }
  float f(const std::vector<bf16>& x, int64_t n) const { return dev::bf16_to_float(x[n]); }
  bool vis(int64_t i, int64_t j) const {
    return j >= range[2 * i] && j < range[2 * i + 1] && ki[j] <= qi[i] && kd[j] == qd[i];
  }
};

struct Ref {
  std::vector<double> o, lse, dq, dk, dv, to, tdq, tdk, tdv;
};
Ref reference(const Inputs& in) {
  const int64_t d = in.d, group = in.hq / in.hkv;
  Ref R;
  R.o.assign(in.tq * in.hq * d, 0), R.to.assign(R.o.size(), 1e-5), R.lse.assign(in.tq * in.hq, 0);
  R.dq.assign(R.o.size(), 0), R.tdq.assign(R.o.size(), 1e-5);
  R.dk.assign(in.tk * in.hkv * d, 0), R.dv = R.dk, R.tdk.assign(R.dk.size(), 1e-5), R.tdv = R.tdk;
  for (int64_t i = 0; i < in.tq; ++i)
    for (int64_t h = 0; h < in.hq; ++h) {
      const int64_t row = i * in.hq + h, g = h / group;
      std::vector<double> s(in.tk, 0), dp(in.tk, 0);
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < in.tk; ++j) {
        if (!in.vis(i, j)) continue;
        for (int64_t e = 0; e < d; ++e) {
          s[j] += static_cast<double>(in.f(in.q, row * d + e)) * in.f(in.k, (j * in.hkv + g) * d + e);
          dp[j] += static_cast<double>(in.f(in.dout, row * d + e)) * in.f(in.v, (j * in.hkv + g) * d + e);
        }
        s[j] *= in.scale;
        mx = std::max(mx, s[j]);
      }
      double l = 0;
      for (int64_t j = 0; j < in.tk; ++j)
        if (in.vis(i, j)) l += std::exp(s[j] - mx);
      R.lse[row] = mx + std::log(l);
      const float lse32 = static_cast<float>(R.lse[row]);
      for (int64_t e = 0; e < d; ++e) {
        double a = 0, A = 0;
        for (int64_t j = 0; j < in.tk; ++j)
          if (in.vis(i, j)) {
            const double p = std::exp(s[j] - R.lse[row]), vv = in.f(in.v, (j * in.hkv + g) * d + e);
            a += p * vv, A += std::fabs(p * vv);
          }
        R.o[row * d + e] = a, R.to[row * d + e] += 4 * kU * A;
      }
      double delta = 0;
      for (int64_t e = 0; e < d; ++e) delta += static_cast<double>(in.f(in.dout, row * d + e)) * R.o[row * d + e];
      const float delta32 = static_cast<float>(delta);
      for (int64_t j = 0; j < in.tk; ++j) {
        if (!in.vis(i, j)) continue;
        const double p = std::exp(s[j] - lse32), ds = p * (dp[j] - delta32) * in.scale;
        for (int64_t e = 0; e < d; ++e) {
          const int64_t kr = (j * in.hkv + g) * d + e;
          const double qe = in.f(in.q, row * d + e), ke = in.f(in.k, kr), oe = in.f(in.dout, row * d + e);
          R.dq[row * d + e] += ds * ke, R.tdq[row * d + e] += 4 * kU * std::fabs(ds * ke);
          R.dk[kr] += ds * qe, R.tdk[kr] += 4 * kU * std::fabs(ds * qe);
          R.dv[kr] += p * oe, R.tdv[kr] += 4 * kU * std::fabs(p * oe);
        }
      }
    }
  return R;
}

template <typename T>
double as_d(T x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else
    return dev::bf16_to_float(x);
}
template <typename T>
void expect_within(const std::vector<T>& got, const std::vector<double>& ref, const std::vector<double>& tol,
                   const char* what) {
  size_t bad = 0;
  double worst = 0;
  for (size_t n = 0; n < got.size(); ++n) {
    const double err = std::fabs(as_d(got[n]) - ref[n]);
    bad += !(err <= tol[n] + (std::is_same_v<T, float> ? 0.0 : kU * std::fabs(ref[n])));
    worst = std::max(worst, err / tol[n]);
  }
  std::printf("  %-28s max err/tol %.3f\n", what, worst);
  EXPECT_EQ(bad, 0u) << what;
}

// Forward from an empty (o, lse), then the backward with the reference's lse and delta, through
// the launchers on emulated device memory; `offset` bytes shift q, k, v, dout off 16-byte alignment.
// T: o and dq; TKV: dk and dv (the trainer's bf16 plans keep dq in f32 and dk, dv in bf16).
template <typename T, typename TKV = T>
void run_case(int64_t d, size_t offset) {
  const Inputs in(d);
  const Ref R = reference(in);
  std::vector<void*> owned;
  const bf16 *q = upload(in.q, offset, owned), *kk = upload(in.k, offset, owned), *v = upload(in.v, offset, owned),
             *dout = upload(in.dout, offset, owned);
  const int64_t* qi = upload(in.qi, 0, owned);
  const int64_t* ki = upload(in.ki, 0, owned);
  const int32_t *qd = upload(in.qd, 0, owned), *kd = upload(in.kd, 0, owned), *range = upload(in.range, 0, owned);
  const size_t nq = in.q.size(), nk = in.k.size(), rows = in.tq * in.hq;
  T* o = upload(std::vector<T>(nq, T{}), 0, owned);
  float* lse = upload(std::vector<float>(rows, -INFINITY), 0, owned);
  std::vector<float> lse_ref(rows), delta(rows);
  for (size_t r = 0; r < rows; ++r) {
    lse_ref[r] = static_cast<float>(R.lse[r]);
    double s = 0;
    for (int64_t e = 0; e < d; ++e) s += static_cast<double>(in.f(in.dout, r * d + e)) * R.o[r * d + e];
    delta[r] = static_cast<float>(s);
  }
  const float* lse_b = upload(lse_ref, 0, owned);
  const float* delta_b = upload(delta, 0, owned);
  T* dq = upload(std::vector<T>(nq, T{}), 0, owned);
  TKV* dk = upload(std::vector<TKV>(nk, TKV{}), 0, owned);
  TKV* dv = upload(std::vector<TKV>(nk, TKV{}), 0, owned);
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const k::AttnTokens t{qi, qd, in.tq, ki, kd, in.tk, range};
  const k::AttnDims sh{in.hq, in.hkv, in.d, in.scale};
  ASSERT_TRUE(k::attention_mma_supported(sh));
  k::attention_mma_forward(o, lse, q, kk, v, t, sh, s);
  k::attention_mma_backward(dq, dk, dv, q, kk, v, t, dout, lse_b, delta_b, sh, s);
  check(cudaStreamSynchronize(s));
  check(cudaGetLastError());
  std::vector<double> tl(rows);
  for (size_t r = 0; r < rows; ++r) tl[r] = 1e-4;
  const std::string tag = " d " + std::to_string(d) + (offset ? " (4-byte copies)" : "");
  std::printf("%s, %s o and dq, %s dk and dv\n", tag.c_str(), std::is_same_v<T, float> ? "f32" : "bf16",
              std::is_same_v<TKV, float> ? "f32" : "bf16");
  expect_within(download(lse, rows), R.lse, tl, "lse");
  expect_within(download(o, nq), R.o, R.to, "o");
  expect_within(download(dq, nq), R.dq, R.tdq, "dq");
  expect_within(download(dk, nk), R.dk, R.tdk, "dk");
  expect_within(download(dv, nk), R.dv, R.tdv, "dv");
  check(cudaStreamDestroy(s));
  for (void* p : owned) check(cudaFree(p));
}

}  // namespace

TEST(AttentionMmaLaunchersEmulated, ForwardAndBackwardMatchTheFloat64Reference) {
  run_case<float>(64, 0);
  run_case<bf16>(128, 0);
  run_case<float>(32, 4);  // 4 bytes past 16-byte alignment: the 4-byte copy path
  run_case<float, bf16>(128, 0);  // the trainer's bf16 backward: f32 dq, bf16 dk and dv
}

TEST(AttentionMmaLaunchersEmulated, UnsupportedShapesAreRefused) {
  for (int64_t d : {8, 20, 100, 144, 256}) EXPECT_FALSE(k::attention_mma_supported({8, 2, d, 0.1f})) << d;
  for (int64_t d : {16, 48, 64, 80, 128}) EXPECT_TRUE(k::attention_mma_supported({8, 2, d, 0.1f})) << d;
  EXPECT_FALSE(k::attention_mma_supported({6, 4, 64, 0.1f}));  // q_heads not a multiple of kv_heads
  const k::AttnTokens t{};
  float o = 0, lse = 0;
  alignas(16) bf16 x[8] = {};
  EXPECT_THROW(k::attention_mma_forward(&o, &lse, x, x, x, t, {8, 2, 20, 0.1f}, nullptr), std::invalid_argument);
  const bf16* odd = reinterpret_cast<const bf16*>(reinterpret_cast<const char*>(x) + 2);  // 2-byte aligned
  EXPECT_THROW(k::attention_mma_forward(&o, &lse, odd, x, x, t, {8, 2, 64, 0.1f}, nullptr), std::invalid_argument);
}
