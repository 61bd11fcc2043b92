// The CUDA backend's kernel source (executor/cuda/*_kernels.cuh) executed on the CPU by the
// emulator of the CUDA execution model (cuda_emulator.hpp) and compared with the CPU reference
// backend. Label "cpu": runs everywhere, in CI. It verifies the kernels' indexing, masking, GQA
// mapping, tiling, online-softmax merge and barrier uniformity, with the emulator's shared-memory
// race detector, randomised block/thread order and sm_90 launch limits on (the tests at the end
// prove each check with a planted bug, and the mma m16n8k16 fragment emulation); it says nothing
// about the GPU's memory model, cuBLASLt, or speed (those are test_cuda_kernels, label gpu).
// Launch geometry is the launchers' (row_blocks, key_blocks, *_smem, block sizes, the opt-in).
//
// Tolerances as in test_cuda_kernels.cpp (float32 on both sides; summation order differs).
// The CPU backend is driven through its interface (upload, ops, download); the kernels run on
// host vectors.
//
// bf16 (the *Bf16* tests): every kernel's bf16 instantiation (storage uint16_t) against the CPU
// backend driven with bf16 tensors, on the same bf16 inputs (both sides round the same floats to
// nearest even). Both widen, compute in fp32 and round each output once, so:
//   - kernels doing the reference's float operations in its order (fill, axpy, scale, the f32 <->
//     bf16 conversion, copy/add_cols, RoPE, SwiGLU, embedding): bit-identical (0 ulps);
//   - reductions and attention, whose fp32 sums run in another order: the fp32 tolerance of the
//     f32 test, then at most 1 bf16 ulp of the result (two fp32 values a few fp32 ulps apart can
//     round to neighbouring bf16 values); 2 ulps where a bf16 output is read back and updated by a
//     second call (o merged over two key blocks, dq/dk/dv accumulated over two), since the first
//     call's 1-ulp difference is carried into the second.
// Each check prints how many elements were bit-identical and the largest difference in ulps.
#include "executor/cuda/tests/cuda_emulator.hpp"  // first: maps the CUDA spellings
//
#include "executor/cuda/attention_kernels.cuh"
#include "executor/cuda/elementwise_kernels.cuh"
#include "executor/cuda/reduce_kernels.cuh"
#include "executor/cuda/tests/mma_emulator.hpp"
//
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <tuple>

#include "executor/backend.hpp"
#include "executor/bf16.hpp"
#include "executor/tests/kernel_test_util.hpp"

using namespace ctx;
using namespace ctx::exec;
namespace dev = ctx::exec::cuda::dev;
using ctx_emu::Idx;

namespace {

using ctx::exec::testing::download;
using ctx::exec::testing::expect_close;
using ctx::exec::testing::kv_hulls;
using ctx::exec::testing::randn;
using ctx::exec::testing::upload;
using ctx::exec::testing::zeros;

// ---- bf16 on the host: the values as the backends store them (executor/bf16.hpp)
using Bits = std::vector<uint16_t>;
Bits bits(const std::vector<float>& v) {
  Bits b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}
std::vector<float> wide(const Bits& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = bf16_to_f32(b[i]);
  return v;
}
// The spacing of bf16 numbers at |x| (2^(e-7) for |x| in [2^e, 2^(e+1)); 0 at 0).
double bf16_ulp(double x) {
  if (x == 0 || !std::isfinite(x)) return 0;
  int e = 0;
  std::frexp(std::fabs(x), &e);  // |x| in [2^(e-1), 2^e)
  return std::ldexp(1.0, e - 8);
}
// Element-wise |got - want| <= atol + rtol |want| + ulps * ulp(the larger of the two); prints how
// many elements are bit-identical and the largest difference in bf16 ulps.
void expect_bf16_close(const std::vector<float>& want, const std::vector<float>& got, double rtol, double atol,
                       int ulps, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  size_t identical = 0, at = 0;
  double worst = 0, worst_ulps = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double w = want[i], g = got[i];
    if (std::isinf(w) || std::isinf(g) || std::isnan(w)) {
      EXPECT_TRUE(w == g || (std::isnan(w) && std::isnan(g))) << what << " element " << i << ": " << g << " vs " << w;
      identical += w == g || (std::isnan(w) && std::isnan(g));
      continue;
    }
    if (w == g) {
      ++identical;
      continue;
    }
    const double u = bf16_ulp(std::max(std::fabs(w), std::fabs(g)));
    const double excess = std::fabs(g - w) - (atol + rtol * std::fabs(w) + ulps * u);
    worst_ulps = std::max(worst_ulps, u > 0 ? std::fabs(g - w) / u : INFINITY);
    if (excess > worst || std::isnan(g)) {
      worst = std::isnan(g) ? INFINITY : excess;
      at = i;
    }
  }
  std::printf("[ bf16     ] %s: %zu of %zu bit-identical, largest difference %.3g ulps\n", what.c_str(), identical,
              want.size(), worst_ulps);
  EXPECT_LE(worst, 0.0) << what << ": element " << at << " is " << got[at] << ", reference " << want[at] << " (rtol "
                        << rtol << ", atol " << atol << ", " << ulps << " bf16 ulps)";
}
// A bf16 tensor of the CPU backend holding v (rounded by upload).
Tensor upload_bf16(Backend& be, const std::vector<float>& v, int64_t rows, int64_t cols) {
  return upload(be, v, rows, cols, DType::bf16);
}

// The launcher's shared-memory opt-in (attention.cu, attention_init): the largest head dim's need,
// for each of the three attention kernels and each storage instantiation this file launches;
// launches above 48 KiB are refused without it.
const bool kAttentionOptIn = [] {
  const size_t most = std::max(dev::fwd_smem(dev::kMaxHeadDim), std::max(dev::dq_smem(dev::kMaxHeadDim), dev::dkdv_smem(dev::kMaxHeadDim)));
  for (const char* k : {"attn_fwd_kernel", "attn_dq_kernel", "attn_dkdv_kernel"})
    for (const char* t : {"", "<bf16,bf16>", "<bf16,f32>"}) ctx_emu::set_max_dynamic_smem(std::string(k) + t, most);
  return true;
}();

unsigned blocks(int64_t n, int64_t threads) { return static_cast<unsigned>(std::max<int64_t>(1, (n + threads - 1) / threads)); }

struct AttnInputs {
  int64_t hq = 8, hkv = 2, d = 20, tq = 40, tk = 45;
  std::vector<int64_t> qi, k0, k1;
  std::vector<int32_t> qd, d0, d1;
  std::vector<int32_t> r0, r1;  // kv_range hulls of the two key blocks
  std::vector<float> q, ka, va, kb, vb, dout;
  AttnShape shape() const { return {hq, hkv, d, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))}; }
  dev::Geo geo() const { return {hq, hkv, d, hq / hkv, shape().scale}; }
  // Default: queries at positions 40..79 in a zig-zag-like order, documents of 30 tokens, key
  // blocks at 0..44 and 50..94 (some rows see nothing in block 0). Small: 3 queries at 5..7 and
  // key blocks 0..4 and 5..9 in one document, GQA 4:1, tiles mostly empty.
  // Late: 10 queries at 150..159 (reversed) in a document that starts at 120, key block 0 at
  // 0..199 (every hull starts at key 120: the kernels start at tile 96, and stop at 160) and key
  // block 1 at 200..399 (after every query: empty hulls, nothing visited).
  explicit AttnInputs(int64_t dim, bool small = false, bool late = false) : d(dim) {
    if (small) {
      hq = 4;
      hkv = 1;
      tq = 3;
      tk = 5;
    }
    if (late) {
      hq = 4;
      tq = 10;
      tk = 200;
    }
    qi.resize(tq);
    qd.resize(tq);
    for (int64_t i = 0; i < tq; ++i) {
      qi[i] = late ? 159 - i : small ? 5 + i : i < 20 ? 40 + i : 60 + (tq - 1 - i);
      qd[i] = late ? 1 : small ? 0 : static_cast<int32_t>(qi[i] / 30);
    }
    const int64_t second = late ? 200 : small ? 5 : 50;
    auto doc_of = [&](int64_t pos) { return static_cast<int32_t>(late ? (pos < 120 ? 0 : pos < 170 ? 1 : 2) : small ? 0 : pos / 30); };
    for (int64_t j = 0; j < tk; ++j) {
      k0.push_back(j);
      k1.push_back(second + j);
      d0.push_back(doc_of(j));
      d1.push_back(doc_of(second + j));
    }
    r0 = kv_hulls(qi, qd, k0, d0);
    r1 = kv_hulls(qi, qd, k1, d1);
    q = randn(tq * hq * d, 1 + d);
    ka = randn(tk * hkv * d, 2);
    va = randn(tk * hkv * d, 3);
    kb = randn(tk * hkv * d, 4);
    vb = randn(tk * hkv * d, 5);
    dout = randn(tq * hq * d, 6);
  }
  const std::vector<float>& k(int b) const { return b ? kb : ka; }
  const std::vector<float>& v(int b) const { return b ? vb : va; }
  const std::vector<int64_t>& ki(int b) const { return b ? k1 : k0; }
  const std::vector<int32_t>& kd(int b) const { return b ? d1 : d0; }
  const std::vector<int32_t>& range(int b) const { return b ? r1 : r0; }
};

// The same inputs in the CPU backend's tensors.
// dt: the dtype of q, dout, k and v (bf16: rounded by upload, as bits() rounds them).
struct CpuAttn {
  Tensor q, qi, qd, dout, k[2], v[2], ki[2], kd[2], range[2];
  CpuAttn(Backend& be, const AttnInputs& a, DType dt = DType::f32) {
    q = upload(be, a.q, a.tq, a.hq * a.d, dt);
    dout = upload(be, a.dout, a.tq, a.hq * a.d, dt);
    qi = upload(be, a.qi);
    qd = upload(be, a.qd);
    for (int b = 0; b < 2; ++b) {
      k[b] = upload(be, a.k(b), a.tk, a.hkv * a.d, dt);
      v[b] = upload(be, a.v(b), a.tk, a.hkv * a.d, dt);
      ki[b] = upload(be, a.ki(b));
      kd[b] = upload(be, a.kd(b));
      range[b] = upload(be, a.range(b), a.tq, 2);
    }
  }
  TokenRefs qt() const { return {qi, qd}; }
  KeyBlock kb(int b) const { return {{ki[b], kd[b]}, range[b]}; }
};

// (head_dim, small case, late case): head dims that fill 1, 2 and all 8 of a lane's slots, not
// multiples of 32; the late case's hulls start past the first tiles and the second block's are empty
struct AttnCase {
  int64_t d;
  bool small, late;
};
const AttnCase kAttnCases[] = {{20, false, false}, {64, false, false}, {16, true, false}, {256, true, false},
                               {20, false, true}};

void emu_forward(const AttnInputs& a, std::vector<float>& o, std::vector<float>& lse, int b,
                 const std::vector<int32_t>& range) {
  const dev::Geo G = a.geo();
  ctx_emu::launch("attn_fwd_kernel", {dev::row_blocks(a.tq, G.group), static_cast<unsigned>(a.hkv), 1}, {dev::kBlockThreads, 1, 1},
                  dev::fwd_smem(a.d), [&] {
                    dev::attn_fwd_kernel(o.data(), lse.data(), a.q.data(), a.qi.data(), a.qd.data(), a.tq,
                                         a.k(b).data(), a.v(b).data(), a.ki(b).data(), a.kd(b).data(), a.tk,
                                         range.data(), G);
                  });
}

TEST(EmulatedCudaKernels, AttentionForwardMergesBlocksLikeCpuWithDocumentMaskAndGqa) {
  auto cpu = make_cpu_backend();
  for (auto [d, small, late] : kAttnCases) {
    AttnInputs a(d, small, late);
    CpuAttn c(*cpu, a);
    const AttnShape s = a.shape();
    Tensor o = zeros(*cpu, a.tq, a.hq * d), lse = cpu->alloc(a.tq, a.hq, DType::f32, Mem::workspace);
    cpu->fill(lse, -INFINITY);
    std::vector<float> eo(a.tq * a.hq * d, 0.0f), el(a.tq * a.hq, -INFINITY);
    const std::string tag = " (head_dim " + std::to_string(d) + ")";
    for (int b = 0; b < 2; ++b) {
      cpu->attention_forward_block(o, lse, c.q, c.qt(), c.k[b], c.v[b], c.kb(b), s);
      emu_forward(a, eo, el, b, a.range(b));
      expect_close(download(*cpu, lse), el, 1e-4, 2e-5, "lse after block " + std::to_string(b) + tag);
      expect_close(download(*cpu, o), eo, 1e-4, 2e-5, "o after block " + std::to_string(b) + tag);
    }
  }
}

// kv_range bounds what a query row sees, as on the CPU: with every hull cut to its first half the
// kernels agree with the CPU backend given the same hulls (keys outside a hull are never
// counted, even when the mask would show them), forward and backward.
TEST(EmulatedCudaKernels, AttentionHonoursNarrowedKeyHullsLikeCpu) {
  auto cpu = make_cpu_backend();
  AttnInputs a(20);
  std::vector<int32_t> half = a.r1;
  for (int64_t i = 0; i < a.tq; ++i) half[2 * i + 1] = half[2 * i] + (half[2 * i + 1] - half[2 * i]) / 2;
  ASSERT_NE(half, a.r1) << "the case must narrow some hull";
  CpuAttn c(*cpu, a);
  c.range[1] = upload(*cpu, half, a.tq, 2);
  const AttnShape s = a.shape();
  const dev::Geo G = a.geo();
  Tensor o = zeros(*cpu, a.tq, a.hq * a.d), lse = cpu->alloc(a.tq, a.hq, DType::f32, Mem::workspace);
  cpu->fill(lse, -INFINITY);
  cpu->attention_forward_block(o, lse, c.q, c.qt(), c.k[1], c.v[1], c.kb(1), s);
  std::vector<float> eo(a.tq * a.hq * a.d, 0.0f), el(a.tq * a.hq, -INFINITY);
  emu_forward(a, eo, el, 1, half);
  expect_close(download(*cpu, lse), el, 1e-4, 2e-5, "lse over half hulls");
  expect_close(download(*cpu, o), eo, 1e-4, 2e-5, "o over half hulls");
  // backward over the same half hulls
  Tensor delta = zeros(*cpu, a.tq, a.hq), dq = zeros(*cpu, a.tq, a.hq * a.d), dk = zeros(*cpu, a.tk, a.hkv * a.d),
         dv = zeros(*cpu, a.tk, a.hkv * a.d);
  cpu->attention_delta(delta, c.dout, o, s);
  cpu->attention_backward_block(dq, dk, dv, c.q, c.qt(), c.k[1], c.v[1], c.kb(1), c.dout, lse, delta, s);
  auto hd = download(*cpu, delta), hl = download(*cpu, lse);
  std::vector<float> edq(a.tq * a.hq * a.d, 0.0f), edk(a.tk * a.hkv * a.d, 0.0f), edv(edk);
  ctx_emu::launch("attn_dq_kernel", {dev::row_blocks(a.tq, G.group), static_cast<unsigned>(a.hkv), 1}, {dev::kBlockThreads, 1, 1},
                  dev::dq_smem(a.d), [&] {
                    dev::attn_dq_kernel(edq.data(), a.q.data(), a.qi.data(), a.qd.data(), a.tq, a.kb.data(),
                                        a.vb.data(), a.k1.data(), a.d1.data(), a.tk, half.data(), a.dout.data(),
                                        hl.data(), hd.data(), G);
                  });
  ctx_emu::launch("attn_dkdv_kernel", {dev::key_blocks(a.tk), static_cast<unsigned>(a.hkv), 1}, {dev::kBlockThreads, 1, 1},
                  dev::dkdv_smem(a.d), [&] {
                    dev::attn_dkdv_kernel(edk.data(), edv.data(), a.q.data(), a.qi.data(), a.qd.data(), a.tq,
                                          a.kb.data(), a.vb.data(), a.k1.data(), a.d1.data(), a.tk, half.data(),
                                          a.dout.data(), hl.data(), hd.data(), G);
                  });
  expect_close(download(*cpu, dq), edq, 1e-4, 2e-5, "dq over half hulls");
  expect_close(download(*cpu, dk), edk, 1e-4, 2e-5, "dk over half hulls");
  expect_close(download(*cpu, dv), edv, 1e-4, 2e-5, "dv over half hulls");
}

TEST(EmulatedCudaKernels, AttentionBackwardMatchesCpu) {
  auto cpu = make_cpu_backend();
  for (auto [d, small, late] : kAttnCases) {
    AttnInputs a(d, small, late);
    CpuAttn c(*cpu, a);
    const AttnShape s = a.shape();
    const dev::Geo G = a.geo();
    Tensor o = zeros(*cpu, a.tq, a.hq * d), lse = cpu->alloc(a.tq, a.hq, DType::f32, Mem::workspace),
           delta = zeros(*cpu, a.tq, a.hq);
    cpu->fill(lse, -INFINITY);
    for (int b = 0; b < 2; ++b) cpu->attention_forward_block(o, lse, c.q, c.qt(), c.k[b], c.v[b], c.kb(b), s);
    cpu->attention_delta(delta, c.dout, o, s);
    const auto ho = download(*cpu, o), hl = download(*cpu, lse), hd = download(*cpu, delta);
    const int64_t rows = a.tq * a.hq;
    std::vector<float> edelta(rows);
    ctx_emu::launch("attention_delta_kernel", {blocks(rows * 32, 256), 1, 1}, {256, 1, 1}, 0,
                    [&] { dev::attention_delta_kernel(edelta.data(), a.dout.data(), ho.data(), rows, d); });
    expect_close(hd, edelta, 1e-5, 1e-6, "attention delta");
    auto dq0 = randn(a.tq * a.hq * d, 10, 0.1f), dk0 = randn(a.tk * a.hkv * d, 11, 0.1f),
         dv0 = randn(a.tk * a.hkv * d, 12, 0.1f);
    Tensor dq = upload(*cpu, dq0, a.tq, a.hq * d), dk = upload(*cpu, dk0, a.tk, a.hkv * d),
           dv = upload(*cpu, dv0, a.tk, a.hkv * d);
    auto edq = dq0, edk = dk0, edv = dv0;
    for (int b = 0; b < 2; ++b) {
      cpu->attention_backward_block(dq, dk, dv, c.q, c.qt(), c.k[b], c.v[b], c.kb(b), c.dout, lse, delta, s);
      ctx_emu::launch("attn_dq_kernel", {dev::row_blocks(a.tq, G.group), static_cast<unsigned>(a.hkv), 1}, {dev::kBlockThreads, 1, 1},
                      dev::dq_smem(d), [&] {
                        dev::attn_dq_kernel(edq.data(), a.q.data(), a.qi.data(), a.qd.data(), a.tq, a.k(b).data(),
                                            a.v(b).data(), a.ki(b).data(), a.kd(b).data(), a.tk, a.range(b).data(),
                                            a.dout.data(), hl.data(), hd.data(), G);
                      });
      ctx_emu::launch("attn_dkdv_kernel", {dev::key_blocks(a.tk), static_cast<unsigned>(a.hkv), 1}, {dev::kBlockThreads, 1, 1},
                      dev::dkdv_smem(d), [&] {
                        dev::attn_dkdv_kernel(edk.data(), edv.data(), a.q.data(), a.qi.data(), a.qd.data(), a.tq,
                                              a.k(b).data(), a.v(b).data(), a.ki(b).data(), a.kd(b).data(), a.tk,
                                              a.range(b).data(), a.dout.data(), hl.data(), hd.data(), G);
                      });
      // dk/dv of block 0 are compared before block 1 accumulates into the same buffers
      if (b == 0) {
        expect_close(download(*cpu, dk), edk, 1e-4, 2e-5, "dk block 0 (head_dim " + std::to_string(d) + ")");
        expect_close(download(*cpu, dv), edv, 1e-4, 2e-5, "dv block 0 (head_dim " + std::to_string(d) + ")");
      }
    }
    const std::string tag = " (head_dim " + std::to_string(d) + ")";
    expect_close(download(*cpu, dq), edq, 1e-4, 2e-5, "dq" + tag);
    expect_close(download(*cpu, dk), edk, 1e-4, 2e-5, "dk after both blocks" + tag);
    expect_close(download(*cpu, dv), edv, 1e-4, 2e-5, "dv after both blocks" + tag);
  }
}

TEST(EmulatedCudaKernels, RmsNormAndStepStatisticsMatchCpu) {
  auto cpu = make_cpu_backend();
  const int64_t rows = 9, h = 300;
  auto x = randn(rows * h, 20), w = randn(h, 21), dy = randn(rows * h, 22), dw0 = randn(h, 23, 0.1f);
  Tensor tx = upload(*cpu, x, rows, h), tw = upload(*cpu, w), tdy = upload(*cpu, dy, rows, h),
         tdw = upload(*cpu, dw0), ty = zeros(*cpu, rows, h), tr = zeros(*cpu, rows, 1), tdx = zeros(*cpu, rows, h);
  std::vector<float> ey(rows * h), er(rows), edx(rows * h), edw = dw0;
  cpu->rmsnorm_forward(ty, tr, tx, tw, 1e-5f);
  ctx_emu::launch("rmsnorm_fwd_kernel", {static_cast<unsigned>(rows), 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::rmsnorm_fwd_kernel(ey.data(), er.data(), x.data(), w.data(), h, 1e-5f); });
  expect_close(download(*cpu, ty), ey, 1e-5, 1e-6, "rmsnorm y");
  expect_close(download(*cpu, tr), er, 1e-6, 0, "rmsnorm rstd");
  cpu->rmsnorm_backward(tdx, tdw, tdy, tx, tr, tw);
  ctx_emu::launch("rmsnorm_bwd_dx_kernel", {static_cast<unsigned>(rows), 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::rmsnorm_bwd_dx_kernel(edx.data(), dy.data(), x.data(), er.data(), w.data(), h); });
  expect_close(download(*cpu, tdx), edx, 1e-5, 1e-6, "rmsnorm dx");
  const int64_t chunks = std::min<int64_t>(rows, dev::kDwChunks), per = (rows + chunks - 1) / chunks;
  std::vector<float> scratch(chunks * h);
  ctx_emu::launch("rmsnorm_dw_partial", {blocks(h, dev::kRowThreads), static_cast<unsigned>(chunks), 1}, {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::rmsnorm_dw_partial(scratch.data(), dy.data(), x.data(), er.data(), rows, h, per); });
  ctx_emu::launch("rmsnorm_dw_finish", {blocks(h, dev::kRowThreads), 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::rmsnorm_dw_finish(edw.data(), scratch.data(), chunks, h); });
  expect_close(download(*cpu, tdw), edw, 1e-5, 1e-5, "rmsnorm dw");

  // sum of squares into the statistic (on top of what it holds): partial sums per block, then one
  // block adds; double sums rounded once to float on both sides
  const std::vector<float> st0 = {1.0f, 0.0f, 2.5f};
  Tensor stats = upload(*cpu, st0);
  cpu->sum_squares(stats, tx);
  std::vector<float> est = st0;
  std::vector<double> partials(8);
  ctx_emu::launch("sum_squares_partial", {8, 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::sum_squares_partial(partials.data(), x.data(), rows * h); });
  ctx_emu::launch("sum_partials_into", {1, 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::sum_partials_into(&est[dev::kStatGradNorm2], partials.data(), 8); });
  expect_close(download(*cpu, stats), est, 2e-7, 0, "sum_squares into the statistics");
  // the non-finite flag: a finite tensor leaves it, a NaN raises it to the code
  for (bool nan : {false, true}) {
    auto z = x;
    if (nan) z[777] = std::numeric_limits<float>::quiet_NaN();
    Tensor tz = upload(*cpu, z);
    cpu->flag_nonfinite(stats, tz, 4.0f);
    int flag = 0;
    ctx_emu::launch("nonfinite_kernel", {2, 1, 1}, {dev::kRowThreads, 1, 1}, 0, [&] { dev::nonfinite_kernel(&flag, z.data(), rows * h); });
    ctx_emu::launch("flag_finish_kernel", {1, 1, 1}, {32, 1, 1}, 0,
                    [&] { dev::flag_finish_kernel(&est[dev::kStatNonFinite], &flag, 4.0f); });
    expect_close(download(*cpu, stats), est, 0, 0, nan ? "non-finite flag raised" : "non-finite flag left");
    EXPECT_EQ(est[dev::kStatNonFinite], nan ? 4.0f : 0.0f);
  }
}

TEST(EmulatedCudaKernels, CrossEntropyPiecesMatchCpu) {
  auto cpu = make_cpu_backend();
  const int64_t rows = 6, cols = 700, valid = 690, v0 = 2000;
  auto logits = randn(rows * cols, 30, 3.0f);
  auto el = logits;
  std::vector<int32_t> target = {2000, 2689, 2690, 1999, -1, 2300};
  Tensor tl = upload(*cpu, logits, rows, cols), tt = upload(*cpu, target), mx = zeros(*cpu, rows, 1),
         se = zeros(*cpu, rows, 2), lse = zeros(*cpu, rows, 1), stats = upload(*cpu, std::vector<float>{0.5f, 0, 0});
  std::vector<float> emx(rows), ese(2 * rows), else_(rows), est = {0.5f, 0, 0};
  cpu->row_max(mx, tl, valid);
  ctx_emu::launch("row_max_kernel", {static_cast<unsigned>(rows), 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::row_max_kernel(emx.data(), el.data(), cols, valid); });
  expect_close(download(*cpu, mx), emx, 0, 0, "row_max");
  cpu->sumexp_and_target(se, tl, mx, tt, valid, v0);
  ctx_emu::launch("sumexp_target_kernel", {static_cast<unsigned>(rows), 1, 1}, {dev::kRowThreads, 1, 1}, 0, [&] {
    dev::sumexp_target_kernel(ese.data(), el.data(), emx.data(), target.data(), cols, valid, v0);
  });
  expect_close(download(*cpu, se), ese, 1e-6, 0, "sumexp_and_target");
  cpu->xent_finish(lse, stats, mx, se, tt);
  ctx_emu::launch("xent_finish_kernel", {1, 1, 1}, {dev::kRowThreads, 1, 1}, 0, [&] {
    dev::xent_finish_kernel(else_.data(), &est[dev::kStatLossSum], emx.data(), ese.data(), target.data(), rows);
  });
  expect_close(download(*cpu, lse), else_, 1e-6, 1e-6, "xent_finish lse");
  expect_close(download(*cpu, stats), est, 1e-6, 1e-6, "xent_finish loss statistic");
  const auto hl = download(*cpu, lse);
  cpu->xent_grad_inplace(tl, lse, tt, 0.25f, valid, v0);
  ctx_emu::launch("xent_grad_kernel", {blocks(rows * cols, 256), 1, 1}, {256, 1, 1}, 0, [&] {
    dev::xent_grad_kernel(el.data(), hl.data(), target.data(), 0.25f, rows, cols, valid, v0);
  });
  expect_close(download(*cpu, tl), el, 1e-5, 1e-7, "xent_grad_inplace");
}

TEST(EmulatedCudaKernels, ElementwiseAndEmbeddingKernelsMatchCpu) {
  auto cpu = make_cpu_backend();
  // RoPE at large positions, partial rotation, YaRN scale, forward then inverse
  const int64_t rows = 9, heads = 3, d = 16, rot = 12;
  auto x = randn(rows * heads * d, 40);
  auto ex = x;
  std::vector<int32_t> pos = {0, 1, 7, 1000, 65535, 131071, 524287, 1000000, 3};
  std::vector<float> inv_freq(rot / 2);
  for (int64_t i = 0; i < rot / 2; ++i) inv_freq[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / rot));
  Tensor tx = upload(*cpu, x, rows, heads * d), tp = upload(*cpu, pos), tf = upload(*cpu, inv_freq);
  for (bool inverse : {false, true}) {
    cpu->rope(tx, heads, d, tp, tf, rot, 1.1f, inverse);
    ctx_emu::launch("rope_kernel", {1, 1, 1}, {32, 1, 1}, 0, [&] {
      dev::rope_kernel(ex.data(), rows, heads, d, pos.data(), inv_freq.data(), rot / 2, 1.1f, inverse ? -1.0f : 1.0f);
    });
    expect_close(download(*cpu, tx), ex, 1e-5, 1e-6, inverse ? "rope inverse" : "rope");
  }
  // SwiGLU
  const int64_t n = 300;
  auto gate = randn(n, 41, 4.0f), up = randn(n, 42), da = randn(n, 43);
  Tensor tg = upload(*cpu, gate), tu = upload(*cpu, up), tda = upload(*cpu, da), ta = zeros(*cpu, 1, n),
         tdg = zeros(*cpu, 1, n), tdu = zeros(*cpu, 1, n);
  std::vector<float> ea(n), edg(n), edu(n);
  cpu->swiglu_forward(ta, tg, tu);
  ctx_emu::launch("swiglu_fwd_kernel", {2, 1, 1}, {64, 1, 1}, 0, [&] { dev::swiglu_fwd_kernel(ea.data(), gate.data(), up.data(), n); });
  expect_close(download(*cpu, ta), ea, 1e-5, 1e-6, "swiglu forward");
  cpu->swiglu_backward(tdg, tdu, tda, tg, tu);
  ctx_emu::launch("swiglu_bwd_kernel", {2, 1, 1}, {64, 1, 1}, 0,
                  [&] { dev::swiglu_bwd_kernel(edg.data(), edu.data(), da.data(), gate.data(), up.data(), n); });
  expect_close(download(*cpu, tdg), edg, 1e-5, 1e-6, "swiglu dgate");
  expect_close(download(*cpu, tdu), edu, 1e-5, 1e-6, "swiglu dup");
  // AdamW, three steps, the statistics deciding: clipped (norm 4 > clip 1), unclipped, skipped
  auto master = randn(n, 44), m = randn(n, 45, 0.01f), v = randn(n, 46, 0.01f), grad = randn(n, 47);
  for (auto& e : v) e = std::fabs(e);
  Tensor tmaster = upload(*cpu, master), tm = upload(*cpu, m), tv = upload(*cpu, v), tgrad = upload(*cpu, grad);
  auto em = master, emm = m, ev = v;
  const std::vector<std::vector<float>> stats_per_step = {{0, 0, 16.0f}, {0, 0, 0.25f}, {0, 2.0f, 0.25f}};
  for (int64_t step = 1; step <= 3; ++step) {
    const auto& st = stats_per_step[step - 1];
    Tensor tst = upload(*cpu, st);
    AdamWArgs a;
    a.lr = 1e-3f;
    a.weight_decay = 0.1f;
    a.clip = 1.0f;
    a.step = step;
    cpu->adamw(tmaster, tm, tv, tgrad, tst, a);
    // bias corrections as the launcher computes them: from the float betas, in double
    ctx_emu::launch("adamw_kernel", {2, 1, 1}, {64, 1, 1}, 0, [&] {
      dev::adamw_kernel(em.data(), emm.data(), ev.data(), grad.data(), st.data(), 1.0f, n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                        0.1f, 1.0f, 1.0 - std::pow(static_cast<double>(0.9f), static_cast<double>(step)),
                        1.0 - std::pow(static_cast<double>(0.95f), static_cast<double>(step)));
    });
  }
  expect_close(download(*cpu, tmaster), em, 1e-6, 1e-7, "adamw master");
  expect_close(download(*cpu, tm), emm, 1e-6, 1e-9, "adamw m");
  expect_close(download(*cpu, tv), ev, 1e-6, 1e-10, "adamw v");
  // AdamW on bf16 weights and bf16 moments (master=none, moments=bf16): the kernel reads each as
  // float and rounds once on store, as the CPU reference; the two may differ by float contraction
  // (fma) before the rounding, which moves a value by at most one bf16 ulp (2^-7 relative)
  {
    const Bits bw = bits(master), bm = bits(m), bv = bits(v);
    Tensor tw = upload(*cpu, wide(bw), 1, n, DType::bf16), tm16 = upload(*cpu, wide(bm), 1, n, DType::bf16),
           tv16 = upload(*cpu, wide(bv), 1, n, DType::bf16), tg = upload(*cpu, grad);
    Bits ew = bw, em16 = bm, ev16 = bv;
    const std::vector<float> st = {0, 0, 16.0f};
    Tensor tst = upload(*cpu, st);
    AdamWArgs a;
    a.lr = 1e-3f;
    a.weight_decay = 0.1f;
    a.clip = 1.0f;
    a.step = 2;
    cpu->adamw(tw, tm16, tv16, tg, tst, a);
    ctx_emu::launch("adamw_kernel", {2, 1, 1}, {64, 1, 1}, 0, [&] {
      dev::adamw_kernel(ew.data(), em16.data(), ev16.data(), grad.data(), st.data(), 1.0f, n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                        0.1f, 1.0f, 1.0 - std::pow(static_cast<double>(0.9f), 2.0), 1.0 - std::pow(static_cast<double>(0.95f), 2.0));
    });
    expect_close(download(*cpu, tw), wide(ew), 1.0 / 128, 0, "adamw bf16 weights");
    expect_close(download(*cpu, tm16), wide(em16), 1.0 / 128, 0, "adamw bf16 m");
    expect_close(download(*cpu, tv16), wide(ev16), 1.0 / 128, 0, "adamw bf16 v");
    EXPECT_NE(wide(ew), wide(bw)) << "the step moved the bf16 weights";
  }
  // embedding: forward gather; backward keyed by row, stably sorted (the launcher uses CUB's
  // radix sort; std::stable_sort is the same permutation), summed per run in token order
  const int64_t hh = 33, v0 = 10, vrows = 50, tokens = 200;
  std::mt19937 r(48);
  std::vector<int32_t> tok(tokens);
  for (auto& t : tok) t = static_cast<int32_t>(r() % 80);
  auto table = randn(vrows * hh, 49), dout = randn(tokens * hh, 50), dtable = randn(vrows * hh, 51);
  Tensor ttok = upload(*cpu, tok), ttable = upload(*cpu, table, vrows, hh), tdout = upload(*cpu, dout, tokens, hh),
         tdtable = upload(*cpu, dtable, vrows, hh), tout = zeros(*cpu, tokens, hh);
  std::vector<float> eout(tokens * hh);
  auto edtable = dtable;
  cpu->embedding_forward(tout, ttable, ttok, v0);
  ctx_emu::launch("embedding_fwd_kernel", {4, 1, 1}, {64, 1, 1}, 0,
                  [&] { dev::embedding_fwd_kernel(eout.data(), table.data(), tok.data(), tokens, hh, v0, vrows); });
  expect_close(download(*cpu, tout), eout, 0, 0, "embedding forward");
  cpu->embedding_backward(tdtable, tdout, ttok, v0);
  std::vector<int32_t> keys(tokens), positions(tokens);
  ctx_emu::launch("embedding_keys_kernel", {2, 1, 1}, {64, 1, 1}, 0, [&] {
    dev::embedding_keys_kernel(keys.data(), positions.data(), tok.data(), tokens, v0, vrows);
  });
  std::vector<std::pair<int32_t, int32_t>> kp(tokens);
  for (int64_t t = 0; t < tokens; ++t) kp[t] = {keys[t], positions[t]};
  std::stable_sort(kp.begin(), kp.end(), [](auto& p, auto& q) { return p.first < q.first; });
  for (int64_t t = 0; t < tokens; ++t) std::tie(keys[t], positions[t]) = kp[t];
  ctx_emu::launch("embedding_bwd_sorted_kernel", {16, 1, 1}, {32, 1, 1}, 0, [&] {  // fewer blocks than runs: blocks stride
    dev::embedding_bwd_sorted_kernel(edtable.data(), dout.data(), keys.data(), positions.data(), tokens, hh, vrows);
  });
  expect_close(download(*cpu, tdtable), edtable, 0, 0, "embedding backward (bit-identical)");
  // copy_cols / add_cols on column ranges of matrices of different widths
  auto wide = randn(7 * 40, 52), narrow = randn(7 * 13, 53);
  Tensor twide = upload(*cpu, wide, 7, 40), tnarrow = upload(*cpu, narrow, 7, 13);
  auto ewide = wide, enarrow = narrow;
  cpu->add_cols(twide, 30, tnarrow, 2, 10);
  ctx_emu::launch("copy_cols_kernel", {1, 1, 1}, {64, 1, 1}, 0,
                  [&] { dev::copy_cols_kernel(ewide.data() + 30, 40, narrow.data() + 2, 13, 7, 10, true); });
  expect_close(download(*cpu, twide), ewide, 0, 0, "add_cols");
  cpu->copy_cols(tnarrow, 0, twide, 5, 4);
  ctx_emu::launch("copy_cols_kernel", {1, 1, 1}, {64, 1, 1}, 0,
                  [&] { dev::copy_cols_kernel(enarrow.data(), 13, ewide.data() + 5, 40, 7, 4, false); });
  expect_close(download(*cpu, tnarrow), enarrow, 0, 0, "copy_cols");
}

// ---------------------------------------------------------------- bf16 storage
// The bf16 instantiations (uint16_t storage) against the CPU backend with bf16 tensors; the
// tolerances are explained at the top of this file.

TEST(EmulatedCudaKernels, ElementwiseAndEmbeddingKernelsBf16MatchCpuBf16) {
  auto cpu = make_cpu_backend();
  const int64_t n = 300;
  auto xv = randn(n, 140), yv = randn(n, 141);
  Bits x = bits(xv), y = bits(yv);
  // fill (the value rounded once), axpy and scale on bf16, axpy with mixed dtypes
  Tensor ty = upload_bf16(*cpu, yv, 1, n), tx = upload_bf16(*cpu, xv, 1, n), tyf = upload(*cpu, yv);
  cpu->axpy(ty, 0.75f, tx);
  ctx_emu::launch("axpy_kernel<bf16,bf16>", {2, 1, 1}, {64, 1, 1}, 0, [&] { dev::axpy_kernel(y.data(), 0.75f, x.data(), n); });
  expect_bf16_close(download(*cpu, ty), wide(y), 0, 0, 0, "axpy bf16 += bf16");
  std::vector<float> yf = yv;
  cpu->axpy(tyf, -0.3f, tx);
  ctx_emu::launch("axpy_kernel<f32,bf16>", {2, 1, 1}, {64, 1, 1}, 0, [&] { dev::axpy_kernel(yf.data(), -0.3f, x.data(), n); });
  expect_close(download(*cpu, tyf), yf, 0, 0, "axpy f32 += bf16");
  cpu->axpy(ty, 1.5f, tyf);
  ctx_emu::launch("axpy_kernel<bf16,f32>", {2, 1, 1}, {64, 1, 1}, 0, [&] { dev::axpy_kernel(y.data(), 1.5f, yf.data(), n); });
  expect_bf16_close(download(*cpu, ty), wide(y), 0, 0, 0, "axpy bf16 += f32");
  cpu->scale(ty, -1.7f);
  ctx_emu::launch("scale_kernel<bf16>", {2, 1, 1}, {64, 1, 1}, 0, [&] { dev::scale_kernel(y.data(), -1.7f, n); });
  expect_bf16_close(download(*cpu, ty), wide(y), 0, 0, 0, "scale bf16");
  cpu->fill(ty.flat(10, 20), 0.1f);
  ctx_emu::launch("fill_kernel<bf16>", {1, 1, 1}, {32, 1, 1}, 0, [&] { dev::fill_kernel(y.data() + 10, 0.1f, 20); });
  expect_bf16_close(download(*cpu, ty), wide(y), 0, 0, 0, "fill bf16");
  // copy between dtypes: f32 -> bf16 rounds (ties, NaN and infinities included), bf16 -> f32 widens
  std::vector<float> special = randn(n, 142, 100.0f);
  special[0] = bf16_to_f32(0x3f80) + std::ldexp(1.0f, -8);  // 1 + half an ulp: a tie, to even (1)
  special[1] = bf16_to_f32(0x3f81) + std::ldexp(1.0f, -8);  // a tie, to even (0x3f82)
  special[2] = std::numeric_limits<float>::quiet_NaN();
  special[3] = -std::numeric_limits<float>::infinity();
  special[4] = 3.4e38f;  // rounds up to infinity
  special[5] = 1e-40f;   // subnormal
  Tensor tsf = upload(*cpu, special), tsb = zeros(*cpu, 1, n, DType::bf16), tback = zeros(*cpu, 1, n);
  Bits eb(n);
  std::vector<float> eback(n);
  cpu->copy(tsb, tsf);
  ctx_emu::launch("convert_kernel<bf16,f32>", {2, 1, 1}, {64, 1, 1}, 0, [&] { dev::convert_kernel(eb.data(), special.data(), n); });
  expect_bf16_close(download(*cpu, tsb), wide(eb), 0, 0, 0, "copy f32 -> bf16");
  EXPECT_EQ(eb[0], 0x3f80);
  EXPECT_EQ(eb[1], 0x3f82);
  cpu->copy(tback, tsb);
  ctx_emu::launch("convert_kernel<f32,bf16>", {2, 1, 1}, {64, 1, 1}, 0, [&] { dev::convert_kernel(eback.data(), eb.data(), n); });
  expect_bf16_close(download(*cpu, tback), eback, 0, 0, 0, "copy bf16 -> f32");
  // add_cols into bf16 from bf16 and from f32, into f32 from bf16; copy_cols of bf16
  auto wv = randn(7 * 40, 143), nv = randn(7 * 13, 144);
  Bits w = bits(wv), nb = bits(nv);
  std::vector<float> wf = wv;
  Tensor tw = upload_bf16(*cpu, wv, 7, 40), tn = upload_bf16(*cpu, nv, 7, 13), twf = upload(*cpu, wv, 7, 40);
  cpu->add_cols(tw, 30, tn, 2, 10);
  ctx_emu::launch("copy_cols_kernel<bf16,bf16>", {1, 1, 1}, {64, 1, 1}, 0,
                  [&] { dev::copy_cols_kernel(w.data() + 30, 40, nb.data() + 2, 13, 7, 10, true); });
  expect_bf16_close(download(*cpu, tw), wide(w), 0, 0, 0, "add_cols bf16 += bf16");
  cpu->add_cols(tw, 0, twf, 5, 12);
  ctx_emu::launch("copy_cols_kernel<bf16,f32>", {1, 1, 1}, {64, 1, 1}, 0,
                  [&] { dev::copy_cols_kernel(w.data(), 40, wf.data() + 5, 40, 7, 12, true); });
  expect_bf16_close(download(*cpu, tw), wide(w), 0, 0, 0, "add_cols bf16 += f32");
  cpu->add_cols(twf, 1, tn, 0, 13);
  ctx_emu::launch("copy_cols_kernel<f32,bf16>", {1, 1, 1}, {64, 1, 1}, 0,
                  [&] { dev::copy_cols_kernel(wf.data() + 1, 40, nb.data(), 13, 7, 13, true); });
  expect_close(download(*cpu, twf), wf, 0, 0, "add_cols f32 += bf16");
  cpu->copy_cols(tn, 0, tw, 5, 4);
  ctx_emu::launch("copy_cols_kernel<bf16,bf16>", {1, 1, 1}, {64, 1, 1}, 0,
                  [&] { dev::copy_cols_kernel(nb.data(), 13, w.data() + 5, 40, 7, 4, false); });
  expect_bf16_close(download(*cpu, tn), wide(nb), 0, 0, 0, "copy_cols bf16");
  // RoPE on bf16 at large positions, forward then inverse (each call rounds once)
  const int64_t rows = 9, heads = 3, d = 16, rot = 12;
  auto rv = randn(rows * heads * d, 145);
  Bits r = bits(rv);
  std::vector<int32_t> pos = {0, 1, 7, 1000, 65535, 131071, 524287, 1000000, 3};
  std::vector<float> inv_freq(rot / 2);
  for (int64_t i = 0; i < rot / 2; ++i) inv_freq[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / rot));
  Tensor tr = upload_bf16(*cpu, rv, rows, heads * d), tp = upload(*cpu, pos), tf = upload(*cpu, inv_freq);
  for (bool inverse : {false, true}) {
    cpu->rope(tr, heads, d, tp, tf, rot, 1.1f, inverse);
    ctx_emu::launch("rope_kernel<bf16>", {1, 1, 1}, {32, 1, 1}, 0, [&] {
      dev::rope_kernel(r.data(), rows, heads, d, pos.data(), inv_freq.data(), rot / 2, 1.1f, inverse ? -1.0f : 1.0f);
    });
    expect_bf16_close(download(*cpu, tr), wide(r), 0, 0, 0, inverse ? "rope bf16 inverse" : "rope bf16");
  }
  // SwiGLU on bf16
  auto gv = randn(n, 146, 4.0f), uv = randn(n, 147), dav = randn(n, 148);
  Bits g = bits(gv), u = bits(uv), da = bits(dav), a(n), dg(n), du(n);
  Tensor tg = upload_bf16(*cpu, gv, 1, n), tu = upload_bf16(*cpu, uv, 1, n), tda = upload_bf16(*cpu, dav, 1, n),
         ta = zeros(*cpu, 1, n, DType::bf16), tdg = zeros(*cpu, 1, n, DType::bf16), tdu = zeros(*cpu, 1, n, DType::bf16);
  cpu->swiglu_forward(ta, tg, tu);
  ctx_emu::launch("swiglu_fwd_kernel<bf16>", {2, 1, 1}, {64, 1, 1}, 0, [&] { dev::swiglu_fwd_kernel(a.data(), g.data(), u.data(), n); });
  expect_bf16_close(download(*cpu, ta), wide(a), 0, 0, 0, "swiglu forward bf16");
  cpu->swiglu_backward(tdg, tdu, tda, tg, tu);
  ctx_emu::launch("swiglu_bwd_kernel<bf16>", {2, 1, 1}, {64, 1, 1}, 0,
                  [&] { dev::swiglu_bwd_kernel(dg.data(), du.data(), da.data(), g.data(), u.data(), n); });
  expect_bf16_close(download(*cpu, tdg), wide(dg), 0, 0, 0, "swiglu dgate bf16");
  expect_bf16_close(download(*cpu, tdu), wide(du), 0, 0, 0, "swiglu dup bf16");
  // embedding: a bf16 table gathered as stored; the f32 table gradient from a bf16 dout
  const int64_t hh = 33, v0 = 10, vrows = 50, tokens = 200;
  std::mt19937 rng(148);
  std::vector<int32_t> tok(tokens);
  for (auto& t : tok) t = static_cast<int32_t>(rng() % 80);
  auto tablev = randn(vrows * hh, 149), doutv = randn(tokens * hh, 150), dtable = randn(vrows * hh, 151);
  Bits table = bits(tablev), dout = bits(doutv), eout(tokens * hh);
  Tensor ttok = upload(*cpu, tok), ttable = upload_bf16(*cpu, tablev, vrows, hh),
         tdout = upload_bf16(*cpu, doutv, tokens, hh), tdtable = upload(*cpu, dtable, vrows, hh),
         tout = zeros(*cpu, tokens, hh, DType::bf16);
  cpu->embedding_forward(tout, ttable, ttok, v0);
  ctx_emu::launch("embedding_fwd_kernel<bf16>", {4, 1, 1}, {64, 1, 1}, 0,
                  [&] { dev::embedding_fwd_kernel(eout.data(), table.data(), tok.data(), tokens, hh, v0, vrows); });
  expect_bf16_close(download(*cpu, tout), wide(eout), 0, 0, 0, "embedding forward bf16");
  cpu->embedding_backward(tdtable, tdout, ttok, v0);
  std::vector<int32_t> keys(tokens), positions(tokens);
  ctx_emu::launch("embedding_keys_kernel", {2, 1, 1}, {64, 1, 1}, 0,
                  [&] { dev::embedding_keys_kernel(keys.data(), positions.data(), tok.data(), tokens, v0, vrows); });
  std::vector<std::pair<int32_t, int32_t>> kp(tokens);
  for (int64_t t = 0; t < tokens; ++t) kp[t] = {keys[t], positions[t]};
  std::stable_sort(kp.begin(), kp.end(), [](auto& p, auto& q) { return p.first < q.first; });
  for (int64_t t = 0; t < tokens; ++t) std::tie(keys[t], positions[t]) = kp[t];
  auto edtable = dtable;
  ctx_emu::launch("embedding_bwd_sorted_kernel<bf16>", {16, 1, 1}, {32, 1, 1}, 0, [&] {
    dev::embedding_bwd_sorted_kernel(edtable.data(), dout.data(), keys.data(), positions.data(), tokens, hh, vrows);
  });
  expect_close(download(*cpu, tdtable), edtable, 0, 0, "embedding backward from bf16 dout (bit-identical)");
}

TEST(EmulatedCudaKernels, RmsNormDeltaAndNonFiniteFlagBf16MatchCpuBf16) {
  auto cpu = make_cpu_backend();
  const int64_t rows = 9, h = 300;
  auto xv = randn(rows * h, 160), wv = randn(h, 161), dyv = randn(rows * h, 162), dw0 = randn(h, 163, 0.1f);
  Bits x = bits(xv), w = bits(wv), dy = bits(dyv), y(rows * h), dx(rows * h);
  Tensor tx = upload_bf16(*cpu, xv, rows, h), tw = upload_bf16(*cpu, wv, 1, h), tdy = upload_bf16(*cpu, dyv, rows, h),
         tdw = upload(*cpu, dw0), ty = zeros(*cpu, rows, h, DType::bf16), tr = zeros(*cpu, rows, 1),
         tdx = zeros(*cpu, rows, h, DType::bf16);
  std::vector<float> er(rows), edw = dw0;
  cpu->rmsnorm_forward(ty, tr, tx, tw, 1e-5f);
  ctx_emu::launch("rmsnorm_fwd_kernel<bf16>", {static_cast<unsigned>(rows), 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::rmsnorm_fwd_kernel(y.data(), er.data(), x.data(), w.data(), h, 1e-5f); });
  expect_bf16_close(download(*cpu, ty), wide(y), 1e-5, 1e-6, 1, "rmsnorm y bf16");
  expect_close(download(*cpu, tr), er, 1e-6, 0, "rmsnorm rstd (f32) from bf16 x");
  cpu->rmsnorm_backward(tdx, tdw, tdy, tx, tr, tw);
  ctx_emu::launch("rmsnorm_bwd_dx_kernel<bf16>", {static_cast<unsigned>(rows), 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::rmsnorm_bwd_dx_kernel(dx.data(), dy.data(), x.data(), er.data(), w.data(), h); });
  expect_bf16_close(download(*cpu, tdx), wide(dx), 1e-5, 1e-6, 1, "rmsnorm dx bf16");
  const int64_t chunks = std::min<int64_t>(rows, dev::kDwChunks), per = (rows + chunks - 1) / chunks;
  std::vector<float> scratch(chunks * h);
  ctx_emu::launch("rmsnorm_dw_partial<bf16>", {blocks(h, dev::kRowThreads), static_cast<unsigned>(chunks), 1},
                  {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::rmsnorm_dw_partial(scratch.data(), dy.data(), x.data(), er.data(), rows, h, per); });
  ctx_emu::launch("rmsnorm_dw_finish", {blocks(h, dev::kRowThreads), 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::rmsnorm_dw_finish(edw.data(), scratch.data(), chunks, h); });
  expect_close(download(*cpu, tdw), edw, 1e-5, 1e-5, "rmsnorm dw (f32) from bf16 dy, x");
  // attention delta from bf16 dout with a bf16 o, and with an f32 o (a merged fp32 accumulator)
  const int64_t arows = 40, d = 20;
  auto dov = randn(arows * d, 164), ov = randn(arows * d, 165);
  Bits dob = bits(dov), ob = bits(ov);
  Tensor tdo = upload_bf16(*cpu, dov, arows, d), to = upload_bf16(*cpu, ov, arows, d), tof = upload(*cpu, ov, arows, d),
         tdelta = zeros(*cpu, arows, 1);
  const AttnShape s1{1, 1, d, 1.0f};
  std::vector<float> edelta(arows);
  cpu->attention_delta(tdelta, tdo, to, s1);
  ctx_emu::launch("attention_delta_kernel<bf16,bf16>", {blocks(arows * 32, 256), 1, 1}, {256, 1, 1}, 0,
                  [&] { dev::attention_delta_kernel(edelta.data(), dob.data(), ob.data(), arows, d); });
  expect_close(download(*cpu, tdelta), edelta, 1e-5, 1e-6, "attention delta (bf16 dout, bf16 o)");
  cpu->attention_delta(tdelta, tdo, tof, s1);
  ctx_emu::launch("attention_delta_kernel<bf16,f32>", {blocks(arows * 32, 256), 1, 1}, {256, 1, 1}, 0,
                  [&] { dev::attention_delta_kernel(edelta.data(), dob.data(), ov.data(), arows, d); });
  expect_close(download(*cpu, tdelta), edelta, 1e-5, 1e-6, "attention delta (bf16 dout, f32 o)");
  // the non-finite flag over bf16 values: finite, then a NaN, then an infinity (bf16 keeps both)
  std::vector<float> st = {0, 0, 0};
  Tensor stats = upload(*cpu, st);
  for (int kind = 0; kind < 3; ++kind) {
    auto z = xv;
    if (kind == 1) z[777] = std::numeric_limits<float>::quiet_NaN();
    if (kind == 2) z[5] = std::numeric_limits<float>::infinity();
    Bits zb = bits(z);
    Tensor tz = upload_bf16(*cpu, z, rows, h);
    cpu->flag_nonfinite(stats, tz, 2.0f + kind);
    int flag = 0;
    ctx_emu::launch("nonfinite_kernel<bf16>", {2, 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                    [&] { dev::nonfinite_kernel(&flag, zb.data(), rows * h); });
    ctx_emu::launch("flag_finish_kernel", {1, 1, 1}, {32, 1, 1}, 0,
                    [&] { dev::flag_finish_kernel(&st[dev::kStatNonFinite], &flag, 2.0f + kind); });
    expect_close(download(*cpu, stats), st, 0, 0, "non-finite flag over bf16, case " + std::to_string(kind));
  }
  EXPECT_EQ(st[dev::kStatNonFinite], 4.0f);
}

// Attention with bf16 q, k, v, dout: o, dq, dk, dv in bf16 (rounded once per call), and in f32
// (the context-parallel accumulators under bf16); lse and delta f32. Forward over two key blocks
// merged; backward over both blocks into the same outputs.
TEST(EmulatedCudaKernels, AttentionBf16MatchesCpuBf16) {
  auto cpu = make_cpu_backend();
  const AttnCase cases[] = {{20, false, false}, {256, true, false}, {20, false, true}};
  for (auto [d, small, late] : cases) {
    AttnInputs a(d, small, late);
    CpuAttn c(*cpu, a, DType::bf16);
    const AttnShape s = a.shape();
    const dev::Geo G = a.geo();
    const std::string tag = " (head_dim " + std::to_string(d) + (late ? ", late" : "") + ")";
    const Bits q = bits(a.q), dout = bits(a.dout), kk[2] = {bits(a.ka), bits(a.kb)}, vv[2] = {bits(a.va), bits(a.vb)};
    // forward, bf16 o and (on the same inputs) an f32 o
    Tensor o = zeros(*cpu, a.tq, a.hq * d, DType::bf16), of = zeros(*cpu, a.tq, a.hq * d),
           lse = cpu->alloc(a.tq, a.hq, DType::f32, Mem::workspace), lsef = cpu->alloc(a.tq, a.hq, DType::f32, Mem::workspace);
    cpu->fill(lse, -INFINITY);
    cpu->fill(lsef, -INFINITY);
    Bits eo(a.tq * a.hq * d, 0);
    std::vector<float> eof(eo.size(), 0.0f), el(a.tq * a.hq, -INFINITY), elf = el;
    for (int b = 0; b < 2; ++b) {
      cpu->attention_forward_block(o, lse, c.q, c.qt(), c.k[b], c.v[b], c.kb(b), s);
      cpu->attention_forward_block(of, lsef, c.q, c.qt(), c.k[b], c.v[b], c.kb(b), s);
      const Idx grid{dev::row_blocks(a.tq, G.group), static_cast<unsigned>(a.hkv), 1};
      ctx_emu::launch("attn_fwd_kernel<bf16,bf16>", grid, {dev::kBlockThreads, 1, 1}, dev::fwd_smem(d), [&] {
        dev::attn_fwd_kernel(eo.data(), el.data(), q.data(), a.qi.data(), a.qd.data(), a.tq, kk[b].data(), vv[b].data(),
                             a.ki(b).data(), a.kd(b).data(), a.tk, a.range(b).data(), G);
      });
      ctx_emu::launch("attn_fwd_kernel<bf16,f32>", grid, {dev::kBlockThreads, 1, 1}, dev::fwd_smem(d), [&] {
        dev::attn_fwd_kernel(eof.data(), elf.data(), q.data(), a.qi.data(), a.qd.data(), a.tq, kk[b].data(),
                             vv[b].data(), a.ki(b).data(), a.kd(b).data(), a.tk, a.range(b).data(), G);
      });
      const std::string blk = " after block " + std::to_string(b) + tag;
      expect_close(download(*cpu, lse), el, 1e-4, 2e-5, "lse (bf16 inputs)" + blk);
      expect_bf16_close(download(*cpu, o), wide(eo), 1e-4, 2e-5, b + 1, "o bf16" + blk);
      expect_close(download(*cpu, lsef), elf, 1e-4, 2e-5, "lse (f32 o)" + blk);
      expect_close(download(*cpu, of), eof, 1e-4, 2e-5, "o f32 from bf16 inputs" + blk);
    }
    // backward from the CPU's lse and delta (so only the backward is compared)
    Tensor delta = zeros(*cpu, a.tq, a.hq);
    cpu->attention_delta(delta, c.dout, o, s);
    const auto hl = download(*cpu, lse), hd = download(*cpu, delta);
    auto dq0 = randn(a.tq * a.hq * d, 170, 0.1f), dk0 = randn(a.tk * a.hkv * d, 171, 0.1f),
         dv0 = randn(a.tk * a.hkv * d, 172, 0.1f);
    Tensor dq = upload_bf16(*cpu, dq0, a.tq, a.hq * d), dk = upload_bf16(*cpu, dk0, a.tk, a.hkv * d),
           dv = upload_bf16(*cpu, dv0, a.tk, a.hkv * d), dqf = upload(*cpu, dq0, a.tq, a.hq * d),
           dkf = upload(*cpu, dk0, a.tk, a.hkv * d), dvf = upload(*cpu, dv0, a.tk, a.hkv * d);
    Bits edq = bits(dq0), edk = bits(dk0), edv = bits(dv0);
    std::vector<float> edqf = dq0, edkf = dk0, edvf = dv0;
    for (int b = 0; b < 2; ++b) {
      cpu->attention_backward_block(dq, dk, dv, c.q, c.qt(), c.k[b], c.v[b], c.kb(b), c.dout, lse, delta, s);
      cpu->attention_backward_block(dqf, dkf, dvf, c.q, c.qt(), c.k[b], c.v[b], c.kb(b), c.dout, lse, delta, s);
      const Idx gq{dev::row_blocks(a.tq, G.group), static_cast<unsigned>(a.hkv), 1},
          gk{dev::key_blocks(a.tk), static_cast<unsigned>(a.hkv), 1};
      ctx_emu::launch("attn_dq_kernel<bf16,bf16>", gq, {dev::kBlockThreads, 1, 1}, dev::dq_smem(d), [&] {
        dev::attn_dq_kernel(edq.data(), q.data(), a.qi.data(), a.qd.data(), a.tq, kk[b].data(), vv[b].data(),
                            a.ki(b).data(), a.kd(b).data(), a.tk, a.range(b).data(), dout.data(), hl.data(), hd.data(), G);
      });
      ctx_emu::launch("attn_dkdv_kernel<bf16,bf16>", gk, {dev::kBlockThreads, 1, 1}, dev::dkdv_smem(d), [&] {
        dev::attn_dkdv_kernel(edk.data(), edv.data(), q.data(), a.qi.data(), a.qd.data(), a.tq, kk[b].data(),
                              vv[b].data(), a.ki(b).data(), a.kd(b).data(), a.tk, a.range(b).data(), dout.data(),
                              hl.data(), hd.data(), G);
      });
      ctx_emu::launch("attn_dq_kernel<bf16,f32>", gq, {dev::kBlockThreads, 1, 1}, dev::dq_smem(d), [&] {
        dev::attn_dq_kernel(edqf.data(), q.data(), a.qi.data(), a.qd.data(), a.tq, kk[b].data(), vv[b].data(),
                            a.ki(b).data(), a.kd(b).data(), a.tk, a.range(b).data(), dout.data(), hl.data(), hd.data(), G);
      });
      ctx_emu::launch("attn_dkdv_kernel<bf16,f32>", gk, {dev::kBlockThreads, 1, 1}, dev::dkdv_smem(d), [&] {
        dev::attn_dkdv_kernel(edkf.data(), edvf.data(), q.data(), a.qi.data(), a.qd.data(), a.tq, kk[b].data(),
                              vv[b].data(), a.ki(b).data(), a.kd(b).data(), a.tk, a.range(b).data(), dout.data(),
                              hl.data(), hd.data(), G);
      });
      const std::string blk = " after block " + std::to_string(b) + tag;
      expect_bf16_close(download(*cpu, dq), wide(edq), 1e-4, 2e-5, b + 1, "dq bf16" + blk);
      expect_bf16_close(download(*cpu, dk), wide(edk), 1e-4, 2e-5, b + 1, "dk bf16" + blk);
      expect_bf16_close(download(*cpu, dv), wide(edv), 1e-4, 2e-5, b + 1, "dv bf16" + blk);
      expect_close(download(*cpu, dqf), edqf, 1e-4, 2e-5, "dq f32 from bf16 inputs" + blk);
      expect_close(download(*cpu, dkf), edkf, 1e-4, 2e-5, "dk f32 from bf16 inputs" + blk);
      expect_close(download(*cpu, dvf), edvf, 1e-4, 2e-5, "dv f32 from bf16 inputs" + blk);
    }
  }
}

TEST(EmulatedCudaKernels, EmulatorReportsDivergentBarriers) {
  // half a warp at __syncthreads, the other half at __syncwarp: the emulator must refuse, not hang
  EXPECT_THROW(ctx_emu::launch({1, 1, 1}, {64, 1, 1}, 0,
                               [] {
                                 if (threadIdx.x < 16) __syncthreads();
                                 else __syncwarp();
                               }),
               std::logic_error);
}

// ---------------------------------------------------------------- what the emulator itself checks
// Each check is proven by a planted bug it must report.

// Options for one test, restored after it.
struct WithOptions {
  ctx_emu::Options saved = ctx_emu::options();
  ~WithOptions() { ctx_emu::options() = saved; }
};

// Each thread writes its slot, then reads its neighbour's: racy without the barrier.
void neighbour_kernel(float* out, bool barrier) {
  CTX_DYNAMIC_SMEM(sh);
  const unsigned t = threadIdx.x, n = blockDim.x;
  sh[t] = static_cast<float>(t) + 1.0f;
  if (barrier) __syncthreads();
  out[blockIdx.x * n + t] = sh[(t + 1) % n];
}
// The same through a static __shared__ array.
void neighbour_static_kernel(float* out, bool barrier) {
  __shared__ float buf[64];
  const unsigned t = threadIdx.x;
  buf[t] = static_cast<float>(t) + 1.0f;
  if (barrier) __syncthreads();
  out[t] = buf[(t + 1) % 64];
}
// Lanes of one warp exchanging through shared memory: ordered by __syncwarp, racy without it.
void warp_exchange_kernel(float* out, bool fence) {
  CTX_DYNAMIC_SMEM(sh);
  const unsigned t = threadIdx.x;
  sh[t] = static_cast<float>(t);
  if (fence) __syncwarp();
  out[t] = sh[t ^ 1u];
}
// Every thread writes the same word: write-after-write.
void same_word_kernel(float* out) {
  CTX_DYNAMIC_SMEM(sh);
  sh[0] = static_cast<float>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = sh[0];
}

TEST(EmulatedCudaKernels, RaceDetectorReportsANeighbourReadWithoutBarrier) {
  if (!ctx_emu::race::available()) GTEST_SKIP() << "the race detector needs Linux on x86-64";
  WithOptions keep;
  ctx_emu::options().race_blocks = 0;  // every block
  for (uint64_t seed : {uint64_t{0}, uint64_t{7}}) {  // in index order and shuffled: the verdict is the same
    ctx_emu::options().seed = seed;
    SCOPED_TRACE("schedule seed " + std::to_string(seed));
    std::vector<float> out(2 * 64);
    try {
      ctx_emu::launch("neighbour_race", {2, 1, 1}, {64, 1, 1}, 64 * sizeof(float),
                      [&] { neighbour_kernel(out.data(), false); });
      ADD_FAILURE() << "the race was not reported";
    } catch (const ctx_emu::race::RaceError& e) {
      EXPECT_NE(std::string(e.what()).find("neighbour_race"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("between threads"), std::string::npos) << e.what();
      ASSERT_EQ(e.reports.size(), 2u * 64) << e.what();  // every word, in both blocks
      for (const auto& r : e.reports) {
        EXPECT_EQ(r.kernel, "neighbour_race");
        EXPECT_EQ(r.region, "dynamic");
        // word w is written by thread w and read by thread w - 1
        const unsigned reader = static_cast<unsigned>((r.word + 63) % 64);
        EXPECT_TRUE((r.first == r.word && r.second == reader) || (r.first == reader && r.second == r.word))
            << r.str();
      }
    }
    // the same kernel with the barrier is clean, and reads what the neighbour wrote
    EXPECT_NO_THROW(ctx_emu::launch("neighbour_race", {2, 1, 1}, {64, 1, 1}, 64 * sizeof(float),
                                    [&] { neighbour_kernel(out.data(), true); }));
    for (unsigned t = 0; t < 128; ++t) EXPECT_EQ(out[t], static_cast<float>((t % 64 + 1) % 64) + 1.0f);
  }
}

TEST(EmulatedCudaKernels, RaceDetectorCoversStaticSharedArraysWarpFencesAndWriteWrite) {
  if (!ctx_emu::race::available()) GTEST_SKIP() << "the race detector needs Linux on x86-64";
  WithOptions keep;
  std::vector<float> out(64);
  EXPECT_NO_THROW(ctx_emu::launch("neighbour_static", {1, 1, 1}, {64, 1, 1}, 0,
                                  [&] { neighbour_static_kernel(out.data(), true); }));
  ASSERT_TRUE(ctx_emu::static_checked()) << "the static __shared__ arrays' section is not laid out as expected";
  try {
    ctx_emu::launch("neighbour_static", {1, 1, 1}, {64, 1, 1}, 0, [&] { neighbour_static_kernel(out.data(), false); });
    ADD_FAILURE() << "the race on the static array was not reported";
  } catch (const ctx_emu::race::RaceError& e) {
    EXPECT_EQ(e.reports.front().region, "static") << e.what();
    EXPECT_EQ(e.reports.size(), 64u) << e.what();
  }
  EXPECT_NO_THROW(ctx_emu::launch("warp_exchange", {1, 1, 1}, {64, 1, 1}, 64 * sizeof(float),
                                  [&] { warp_exchange_kernel(out.data(), true); }));
  EXPECT_THROW(ctx_emu::launch("warp_exchange", {1, 1, 1}, {64, 1, 1}, 64 * sizeof(float),
                               [&] { warp_exchange_kernel(out.data(), false); }),
               ctx_emu::race::RaceError);
  try {
    ctx_emu::launch("same_word", {1, 1, 1}, {32, 1, 1}, sizeof(float), [&] { same_word_kernel(out.data()); });
    ADD_FAILURE() << "the write-after-write race was not reported";
  } catch (const ctx_emu::race::RaceError& e) {
    ASSERT_EQ(e.reports.size(), 1u) << e.what();
    EXPECT_STREQ(e.reports[0].kind, "write-after-write");
    EXPECT_EQ(e.reports[0].word, 0u);
  }
}

// sm_90 launch limits: over-limit launches are refused naming the kernel and the limit; the
// launchers' own configurations pass.
TEST(EmulatedCudaKernels, LaunchLimitsOfSm90AreChecked) {
  auto refused = [](const std::function<void()>& f, const std::string& kernel, const std::string& limit) {
    try {
      f();
      ADD_FAILURE() << "not refused: " << kernel << " (" << limit << ")";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(kernel), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(limit), std::string::npos) << e.what();
    }
  };
  auto nothing = [] {};
  refused([&] { ctx_emu::launch("too_many_threads", {1, 1, 1}, {2048, 1, 1}, 0, nothing); }, "too_many_threads",
          "2048 threads per block > 1024");
  refused([&] { ctx_emu::launch("deep_block", {1, 1, 1}, {1, 1, 128}, 0, nothing); }, "deep_block", "(1024,1024,64)");
  refused([&] { ctx_emu::launch("tall_grid", {1, 65536, 1}, {32, 1, 1}, 0, nothing); }, "tall_grid",
          "(2^31-1,65535,65535)");
  refused([&] { ctx_emu::check_launch("wide_grid", {0x80000000u, 1, 1}, {32, 1, 1}, 0); }, "wide_grid",
          "(2^31-1,65535,65535)");
  // more than 48 KiB of dynamic shared memory needs the opt-in; 227 KiB is the most there is
  refused([&] { ctx_emu::launch("no_opt_in", {1, 1, 1}, {32, 1, 1}, 64 * 1024, nothing); }, "no_opt_in",
          "65536 bytes of dynamic shared memory > 49152");
  refused([&] { ctx_emu::check_launch("static_and_dynamic", {1, 1, 1}, {32, 1, 1}, 48 * 1024, 256); },
          "static_and_dynamic", "> 48896");
  ctx_emu::set_max_dynamic_smem("opted_in", 100 * 1024);
  EXPECT_NO_THROW(ctx_emu::launch("opted_in", {1, 1, 1}, {32, 1, 1}, 100 * 1024, nothing));
  refused([&] { ctx_emu::launch("opted_in", {1, 1, 1}, {32, 1, 1}, 100 * 1024 + 4, nothing); }, "opted_in",
          "the kernel's MaxDynamicSharedMemorySize");
  refused([&] { ctx_emu::set_max_dynamic_smem("greedy", 227 * 1024 + 1); }, "greedy", "232448 bytes");
  EXPECT_NO_THROW(ctx_emu::set_max_dynamic_smem("greedy", 227 * 1024));
  // the attention launchers' geometry at head dim 256 (attention.cu), with the opt-in that
  // attention_init makes (kAttentionOptIn here), for 1M query and key tokens and 8 KV heads
  ASSERT_TRUE(kAttentionOptIn);
  const int64_t t = 1 << 20, hkv = 8, d = dev::kMaxHeadDim;
  EXPECT_NO_THROW(ctx_emu::check_launch("attn_fwd_kernel", {dev::row_blocks(t, 8), hkv, 1}, {dev::kBlockThreads, 1, 1},
                                        dev::fwd_smem(d)));
  EXPECT_NO_THROW(ctx_emu::check_launch("attn_dq_kernel", {dev::row_blocks(t, 8), hkv, 1}, {dev::kBlockThreads, 1, 1},
                                        dev::dq_smem(d)));
  EXPECT_NO_THROW(ctx_emu::check_launch("attn_dkdv_kernel", {dev::key_blocks(t), hkv, 1}, {dev::kBlockThreads, 1, 1},
                                        dev::dkdv_smem(d)));
  // without that opt-in, head dim 256 would be refused
  EXPECT_GT(dev::dkdv_smem(d), size_t{48 * 1024});
  refused([&] { ctx_emu::check_launch("attn_dkdv_kernel (no opt-in)", {1, 1, 1}, {dev::kBlockThreads, 1, 1}, dev::dkdv_smem(d)); },
          "attn_dkdv_kernel (no opt-in)", "dynamic shared memory");
  // the elementwise and reduce launchers (kernels_*.cu): 256-thread blocks, grids capped below 2^31
  EXPECT_NO_THROW(ctx_emu::check_launch("xent_grad_kernel", {65535u * 16, 1, 1}, {dev::kRowThreads, 1, 1}, 0));
  EXPECT_NO_THROW(ctx_emu::check_launch("attention_delta_kernel", {0x7fffffffu, 1, 1}, {dev::kRowThreads, 1, 1}, 0));
}

// Randomised schedules: a result that depends on the order blocks or threads run in changes
// under some seed; the real kernels give bit-identical results under every seed.
void block_order_kernel(float* acc) {  // planted: non-atomic accumulation across blocks
  if (threadIdx.x == 0) acc[0] = acc[0] * 3.0f + static_cast<float>(blockIdx.x);
}
void thread_order_kernel(float* last) { last[0] = static_cast<float>(threadIdx.x); }  // planted: last writer wins

TEST(EmulatedCudaKernels, RandomisedScheduleExposesOrderDependence) {
  WithOptions keep;
  auto run = [](uint64_t seed, auto kernel, Idx grid, Idx block) {
    ctx_emu::options().seed = seed;
    float v = 0.0f;
    ctx_emu::launch("order_dependent", grid, block, 0, [&] { kernel(&v); });
    return v;
  };
  // in index order the planted kernels give what their author expected ...
  const float blocks_in_order = run(0, block_order_kernel, {6, 1, 1}, {32, 1, 1});
  float expect = 0.0f;
  for (int b = 0; b < 6; ++b) expect = expect * 3.0f + static_cast<float>(b);
  ASSERT_EQ(blocks_in_order, expect);
  ASSERT_EQ(run(0, thread_order_kernel, {1, 1, 1}, {64, 1, 1}), 63.0f);
  // ... and a check of that expectation fails under randomised order (seed in the message)
  int block_failures = 0, thread_failures = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    block_failures += run(seed, block_order_kernel, {6, 1, 1}, {32, 1, 1}) != expect;
    thread_failures += run(seed, thread_order_kernel, {1, 1, 1}, {64, 1, 1}) != 63.0f;
  }
  EXPECT_GE(block_failures, 4) << "block order is not randomised";
  EXPECT_GE(thread_failures, 4) << "thread order is not randomised";
  // the same seed gives the same schedule (a failure can be replayed with CTX_EMU_SEED)
  EXPECT_EQ(run(5, block_order_kernel, {6, 1, 1}, {32, 1, 1}), run(5, block_order_kernel, {6, 1, 1}, {32, 1, 1}));
  // the seed is in the emulator's errors
  ctx_emu::options().seed = 1234;
  try {
    ctx_emu::launch("divergent", {1, 1, 1}, {64, 1, 1}, 0, [] {
      if (threadIdx.x < 16) __syncthreads();
      else __syncwarp();
    });
    ADD_FAILURE() << "not refused";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("schedule seed 1234"), std::string::npos) << e.what();
  }
}

TEST(EmulatedCudaKernels, RealKernelsAreBitIdenticalUnderRandomisedSchedules) {
  WithOptions keep;
  AttnInputs a(16, true);
  const dev::Geo G = a.geo();
  const int64_t rows = 9, h = 300, tokens = 200, hh = 33, vrows = 50;
  auto x = randn(rows * h, 20), w = randn(h, 21);
  std::vector<int32_t> keys(tokens), positions(tokens);
  std::mt19937 r(48);
  for (int64_t t = 0; t < tokens; ++t) keys[t] = static_cast<int32_t>(r() % vrows), positions[t] = static_cast<int32_t>(t);
  std::stable_sort(positions.begin(), positions.end(), [&](int32_t p, int32_t q) { return keys[p] < keys[q]; });
  std::sort(keys.begin(), keys.end());
  auto dout = randn(tokens * hh, 50);
  auto run_all = [&](uint64_t seed) {
    ctx_emu::options().seed = seed;
    std::vector<std::vector<float>> out;
    std::vector<float> o(a.tq * a.hq * a.d, 0.0f), lse(a.tq * a.hq, -INFINITY);
    for (int b = 0; b < 2; ++b) emu_forward(a, o, lse, b, a.range(b));
    std::vector<float> delta(a.tq * a.hq, 0.5f), dq(o.size(), 0.0f), dk(a.tk * a.hkv * a.d, 0.0f), dv(dk);
    ctx_emu::launch("attn_dq_kernel", {dev::row_blocks(a.tq, G.group), static_cast<unsigned>(a.hkv), 1},
                    {dev::kBlockThreads, 1, 1}, dev::dq_smem(a.d), [&] {
                      dev::attn_dq_kernel(dq.data(), a.q.data(), a.qi.data(), a.qd.data(), a.tq, a.ka.data(),
                                          a.va.data(), a.k0.data(), a.d0.data(), a.tk, a.r0.data(), a.dout.data(),
                                          lse.data(), delta.data(), G);
                    });
    ctx_emu::launch("attn_dkdv_kernel", {dev::key_blocks(a.tk), static_cast<unsigned>(a.hkv), 1},
                    {dev::kBlockThreads, 1, 1}, dev::dkdv_smem(a.d), [&] {
                      dev::attn_dkdv_kernel(dk.data(), dv.data(), a.q.data(), a.qi.data(), a.qd.data(), a.tq,
                                            a.ka.data(), a.va.data(), a.k0.data(), a.d0.data(), a.tk, a.r0.data(),
                                            a.dout.data(), lse.data(), delta.data(), G);
                    });
    std::vector<float> y(rows * h), rstd(rows);
    ctx_emu::launch("rmsnorm_fwd_kernel", {static_cast<unsigned>(rows), 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                    [&] { dev::rmsnorm_fwd_kernel(y.data(), rstd.data(), x.data(), w.data(), h, 1e-5f); });
    std::vector<double> partials(8);
    ctx_emu::launch("sum_squares_partial", {8, 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                    [&] { dev::sum_squares_partial(partials.data(), x.data(), rows * h); });
    std::vector<float> stat(3, 0.0f), dtable(vrows * hh, 0.0f);
    ctx_emu::launch("sum_partials_into", {1, 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                    [&] { dev::sum_partials_into(&stat[dev::kStatGradNorm2], partials.data(), 8); });
    ctx_emu::launch("embedding_bwd_sorted_kernel", {16, 1, 1}, {32, 1, 1}, 0, [&] {
      dev::embedding_bwd_sorted_kernel(dtable.data(), dout.data(), keys.data(), positions.data(), tokens, hh, vrows);
    });
    return std::vector<std::vector<float>>{o, lse, dq, dk, dv, y, rstd, stat, dtable};
  };
  const auto in_order = run_all(0);
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("schedule seed " + std::to_string(seed));
    const auto shuffled = run_all(seed);
    for (size_t k = 0; k < in_order.size(); ++k) EXPECT_EQ(in_order[k], shuffled[k]) << "output " << k;
  }
}

// mma.sync m16n8k16 (bf16 in, fp32 accumulate): fragments loaded with the PTX ISA's index
// formulas give A*B + C; a planted fragment-index bug does not.
struct MmaCase {
  std::vector<uint16_t> A, B;  // A [16][16] row-major; B [16][8]: B[k * 8 + n]
  std::vector<float> C;        // [16][8]
  MmaCase() : A(256), B(128), C(128) {
    auto a = randn(256, 60), b = randn(128, 61), c = randn(128, 62);
    for (int i = 0; i < 256; ++i) A[i] = ctx_emu::mma::to_bf16(a[i]);
    for (int i = 0; i < 128; ++i) B[i] = ctx_emu::mma::to_bf16(b[i]), C[i] = c[i];
  }
  // |D - reference| must be within 17 fp32 roundings (16 products added to C; the bf16 products
  // are exact in fp32): 17 * 2^-24 * (|C| + sum |A B|), for any order of the additions
  void expect_matches(const std::vector<float>& D, const std::string& what, bool want_match = true) const {
    int bad = 0;
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) {
        double ref = C[m * 8 + n], mag = std::fabs(C[m * 8 + n]);
        for (int k = 0; k < 16; ++k) {
          const double p = static_cast<double>(ctx_emu::mma::from_bf16(A[m * 16 + k])) *
                           static_cast<double>(ctx_emu::mma::from_bf16(B[k * 8 + n]));
          ref += p;
          mag += std::fabs(p);
        }
        const double tol = 17.0 * std::ldexp(1.0, -24) * mag;
        if (std::fabs(D[m * 8 + n] - ref) > tol) {
          ++bad;
          if (want_match) ADD_FAILURE() << what << ": D[" << m << "][" << n << "] = " << D[m * 8 + n] << ", reference " << ref;
        }
      }
    if (!want_match) {
      EXPECT_GT(bad, 0) << what << ": the planted bug went unnoticed";
    }
  }
};

TEST(EmulatedCudaKernels, MmaM16n8k16Bf16FragmentsComputeTheProduct) {
  namespace mma = ctx_emu::mma;
  const MmaCase t;
  // every element of A, B and C is held by exactly one (lane, index)
  std::vector<int> seen_a(256), seen_b(128), seen_c(128);
  for (unsigned lane = 0; lane < 32; ++lane) {
    for (unsigned i = 0; i < 8; ++i) ++seen_a[mma::a_row(lane, i) * 16 + mma::a_col(lane, i)];
    for (unsigned i = 0; i < 4; ++i) ++seen_b[mma::b_row(lane, i) * 8 + mma::b_col(lane, i)];
    for (unsigned i = 0; i < 4; ++i) ++seen_c[mma::c_row(lane, i) * 8 + mma::c_col(lane, i)];
  }
  for (int v : seen_a) ASSERT_EQ(v, 1);
  for (int v : seen_b) ASSERT_EQ(v, 1);
  for (int v : seen_c) ASSERT_EQ(v, 1);
  // spot checks against the PTX ISA's figures: lane 5 (group 1, thread 1) holds A[1][2], A[1][3]
  // in register 0, A[9][2..3] in register 1, A[1][10..11] in register 2, A[9][10..11] in register 3
  EXPECT_EQ(mma::a_row(5, 0), 1u);
  EXPECT_EQ(mma::a_col(5, 1), 3u);
  EXPECT_EQ(mma::a_row(5, 2), 9u);
  EXPECT_EQ(mma::a_col(5, 4), 10u);
  EXPECT_EQ(mma::a_row(5, 7), 9u);
  EXPECT_EQ(mma::b_row(5, 3), 11u);
  EXPECT_EQ(mma::b_col(5, 0), 1u);
  EXPECT_EQ(mma::c_row(5, 3), 9u);
  EXPECT_EQ(mma::c_col(5, 3), 3u);
  // (a) host side: the 32 lanes' fragments through the warp-collective operation
  mma::FragA fa[32];
  mma::FragB fb[32];
  mma::FragC fc[32], fd[32];
  for (unsigned lane = 0; lane < 32; ++lane) {
    fa[lane] = mma::load_a_fragment(t.A.data(), 16, lane);
    fb[lane] = mma::load_b_fragment(t.B.data(), 8, lane);
    fc[lane] = mma::load_c_fragment(t.C.data(), 8, lane);
  }
  mma::mma_m16n8k16_bf16(fa, fb, fc, fd);
  std::vector<float> D(128);
  for (unsigned lane = 0; lane < 32; ++lane) mma::store_c_fragment(D.data(), 8, lane, fd[lane]);
  t.expect_matches(D, "host fragments");
  // ... and inside an emulated kernel: one warp, each lane loading its own fragments
  std::vector<float> Dk(128, 0.0f);
  ctx_emu::launch("mma_tile", {1, 1, 1}, {32, 1, 1}, 0, [&] {
    const unsigned lane = threadIdx.x % 32;
    const mma::FragC d = mma::mma_sync(mma::load_a_fragment(t.A.data(), 16, lane),
                                       mma::load_b_fragment(t.B.data(), 8, lane),
                                       mma::load_c_fragment(t.C.data(), 8, lane));
    mma::store_c_fragment(Dk.data(), 8, lane, d);
  });
  t.expect_matches(Dk, "kernel fragments");
  // (b) planted: the two k-halves of A's registers swapped (registers 0,1 <-> 2,3)
  mma::FragA swapped[32];
  for (unsigned lane = 0; lane < 32; ++lane) {
    swapped[lane] = fa[lane];
    std::swap(swapped[lane].r[0], swapped[lane].r[2]);
    std::swap(swapped[lane].r[1], swapped[lane].r[3]);
  }
  mma::mma_m16n8k16_bf16(swapped, fb, fc, fd);
  for (unsigned lane = 0; lane < 32; ++lane) mma::store_c_fragment(D.data(), 8, lane, fd[lane]);
  t.expect_matches(D, "A's k-halves swapped", false);
  // planted: B's column taken from threadID_in_group instead of groupID
  mma::FragB bad_b[32];
  for (unsigned lane = 0; lane < 32; ++lane)
    for (unsigned i = 0; i < 4; ++i)
      mma::set_half(bad_b[lane].r, i, t.B[mma::b_row(lane, i) * 8 + (lane % 4)]);
  mma::mma_m16n8k16_bf16(fa, bad_b, fc, fd);
  for (unsigned lane = 0; lane < 32; ++lane) mma::store_c_fragment(D.data(), 8, lane, fd[lane]);
  t.expect_matches(D, "B's column from threadID_in_group", false);
}

// On any failure, the schedule seed the emulator ran with (CTX_EMU_SEED replays it).
struct PrintSeedOnFailure : ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) std::printf("[ emulator ] schedule seed %llu (CTX_EMU_SEED=%llu replays it)\n",
                                static_cast<unsigned long long>(ctx_emu::options().seed),
                                static_cast<unsigned long long>(ctx_emu::options().seed));
  }
};
const bool kSeedPrinter = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new PrintSeedOnFailure);
  return true;
}();

}  // namespace
