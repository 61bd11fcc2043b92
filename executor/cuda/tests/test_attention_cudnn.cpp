// cuDNN fused SDPA against a float64 reference (label gpu; SKIPPED without a device). Forward O and
// the saved log-sum-exp, backward dQ, dK, dV, causal, GQA 4:1 and MHA, lengths that are and are not
// multiples of 64. Status: compiles, untested on GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>

#include "executor/cuda/attention_cudnn.hpp"

namespace ctx::exec::cuda {
namespace {

bool have_device() {
  int n = 0;  // cudaGetDeviceCount leaves n unchanged on failure
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 1)), cudaSuccess); }
  ~Dev() { cudaFree(p); }
};

// Row-major [tokens, heads * d] (BSHD) float64 reference for one shape.
struct Reference {
  SdpaShape s;
  std::vector<double> q, k, v, d_o;  // bf16 values, widened
  std::vector<double> o, lse, dq, dk, dv;
  double at(const std::vector<double>& x, int64_t b, int64_t t, int64_t h, int64_t heads, int64_t seq, int64_t j) const {
    return x[static_cast<size_t>(((b * seq + t) * heads + h) * s.head_dim + j)];
  }
  void run() {
    const int64_t B = s.batch, Hq = s.heads_q, Hk = s.heads_kv, Sq = s.seq_q, Sk = s.seq_kv, D = s.head_dim;
    const double scale = s.scale != 0 ? s.scale : 1.0 / std::sqrt(static_cast<double>(D));
    o.assign(static_cast<size_t>(B * Sq * Hq * D), 0);
    dq.assign(o.size(), 0);
    dk.assign(static_cast<size_t>(B * Sk * Hk * D), 0);
    dv.assign(dk.size(), 0);
    lse.assign(static_cast<size_t>(B * Hq * Sq), 0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t hk = h / (Hq / Hk);
        for (int64_t i = 0; i < Sq; ++i) {
          std::vector<double> p(static_cast<size_t>(Sk), 0);
          double mx = -1e300;
          for (int64_t j = 0; j < Sk; ++j) {
            if (s.causal && j > i) continue;
            double dot = 0;
            for (int64_t x = 0; x < D; ++x) dot += at(q, b, i, h, Hq, Sq, x) * at(k, b, j, hk, Hk, Sk, x);
            p[static_cast<size_t>(j)] = dot * scale;
            mx = std::max(mx, dot * scale);
          }
          double sum = 0;
          for (int64_t j = 0; j < Sk; ++j) {
            if (s.causal && j > i) {
              p[static_cast<size_t>(j)] = 0;
              continue;
            }
            p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx);
            sum += p[static_cast<size_t>(j)];
          }
          lse[static_cast<size_t>((b * Hq + h) * Sq + i)] = mx + std::log(sum);
          for (auto& x : p) x /= sum;
          // forward
          for (int64_t x = 0; x < D; ++x) {
            double acc = 0;
            for (int64_t j = 0; j < Sk; ++j) acc += p[static_cast<size_t>(j)] * at(v, b, j, hk, Hk, Sk, x);
            o[static_cast<size_t>(((b * Sq + i) * Hq + h) * D + x)] = acc;
          }
          // backward: dP = dO V^T, delta = sum dO * O, dS = P (dP - delta)
          double delta = 0;
          for (int64_t x = 0; x < D; ++x)
            delta += at(d_o, b, i, h, Hq, Sq, x) * o[static_cast<size_t>(((b * Sq + i) * Hq + h) * D + x)];
          for (int64_t j = 0; j < Sk; ++j) {
            const double pj = p[static_cast<size_t>(j)];
            if (pj == 0) continue;
            double dp = 0;
            for (int64_t x = 0; x < D; ++x) dp += at(d_o, b, i, h, Hq, Sq, x) * at(v, b, j, hk, Hk, Sk, x);
            const double ds = pj * (dp - delta) * scale;
            for (int64_t x = 0; x < D; ++x) {
              dq[static_cast<size_t>(((b * Sq + i) * Hq + h) * D + x)] += ds * at(k, b, j, hk, Hk, Sk, x);
              dk[static_cast<size_t>(((b * Sk + j) * Hk + hk) * D + x)] += ds * at(q, b, i, h, Hq, Sq, x);
              dv[static_cast<size_t>(((b * Sk + j) * Hk + hk) * D + x)] += pj * at(d_o, b, i, h, Hq, Sq, x);
            }
          }
        }
      }
  }
};

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, std::vector<double>& widened) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint16_t> out(n);
  widened.resize(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = to_bf16(dist(rng));
    widened[i] = from_bf16(out[i]);
  }
  return out;
}

// max |got - want| / max(1, max |want|): bf16 outputs carry ~3 significant digits
double rel_err(const std::vector<uint16_t>& got, const std::vector<double>& want) {
  double num = 0, den = 1;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, std::abs(from_bf16(got[i]) - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return num / den;
}

void check(const SdpaShape& s) {
  SCOPED_TRACE("b " + std::to_string(s.batch) + " hq " + std::to_string(s.heads_q) + " hk " +
               std::to_string(s.heads_kv) + " s " + std::to_string(s.seq_q) + " d " + std::to_string(s.head_dim));
  CudnnSdpa sdpa;
  std::string why;
  ASSERT_TRUE(sdpa.supports(s, &why)) << why;
  std::mt19937 rng(7);
  Reference ref{s, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  const size_t nq = static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim);
  const size_t nk = static_cast<size_t>(s.batch * s.seq_kv * s.heads_kv * s.head_dim);
  auto hq = random_bf16(nq, rng, ref.q), hk = random_bf16(nk, rng, ref.k), hv = random_bf16(nk, rng, ref.v);
  auto hdo = random_bf16(nq, rng, ref.d_o);
  ref.run();
  Dev q(nq * 2), k(nk * 2), v(nk * 2), o(nq * 2), d_o(nq * 2), dq(nq * 2), dk(nk * 2), dv(nk * 2);
  Dev stats(ref.lse.size() * 4);
  Dev ws_f(static_cast<size_t>(sdpa.forward_workspace_bytes(s)));
  Dev ws_b(static_cast<size_t>(sdpa.backward_workspace_bytes(s)));
  ASSERT_EQ(cudaMemcpy(q.p, hq.data(), nq * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(k.p, hk.data(), nk * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(v.p, hv.data(), nk * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_o.p, hdo.data(), nq * 2, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
  sdpa.forward(s, {q.p, k.p, v.p, o.p, static_cast<float*>(stats.p)}, ws_f.p, st);
  sdpa.backward(s, {q.p, k.p, v.p, o.p, d_o.p, static_cast<float*>(stats.p), dq.p, dk.p, dv.p}, ws_b.p, st);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  cudaStreamDestroy(st);
  std::vector<uint16_t> ho(nq), hdq(nq), hdk(nk), hdv(nk);
  std::vector<float> hl(ref.lse.size());
  ASSERT_EQ(cudaMemcpy(ho.data(), o.p, nq * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(hdq.data(), dq.p, nq * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(hdk.data(), dk.p, nk * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(hdv.data(), dv.p, nk * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(hl.data(), stats.p, hl.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  double lse_err = 0;
  for (size_t i = 0; i < hl.size(); ++i) lse_err = std::max(lse_err, std::abs(hl[i] - ref.lse[i]));
  EXPECT_LT(lse_err, 1e-3) << "log-sum-exp";
  EXPECT_LT(rel_err(ho, ref.o), 2e-2) << "O";
  EXPECT_LT(rel_err(hdq, ref.dq), 3e-2) << "dQ";
  EXPECT_LT(rel_err(hdk, ref.dk), 3e-2) << "dK";
  EXPECT_LT(rel_err(hdv, ref.dv), 3e-2) << "dV";
  EXPECT_EQ(sdpa.cached_graphs(), 2u);  // one forward and one backward graph for the shape
}

TEST(CudnnSdpa, CausalMhaMatchesFloat64Reference) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  check({1, 4, 4, 128, 128, 64, true, 0});
}

TEST(CudnnSdpa, CausalGqaMatchesFloat64Reference) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  check({2, 8, 2, 200, 200, 128, true, 0});  // 4:1 groups, a length that is not a multiple of 64
}

TEST(CudnnSdpa, ShapesAreCachedOncePerDirection) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  CudnnSdpa sdpa;
  const SdpaShape s{1, 2, 1, 64, 64, 64, true, 0};
  ASSERT_TRUE(sdpa.supports(s));
  const int64_t w = sdpa.backward_workspace_bytes(s);
  EXPECT_EQ(sdpa.backward_workspace_bytes(s), w);
  EXPECT_EQ(sdpa.cached_graphs(), 2u);
}

}  // namespace
}  // namespace ctx::exec::cuda
