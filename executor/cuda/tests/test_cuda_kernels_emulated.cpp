// The CUDA backend's kernel source (executor/cuda/*_kernels.cuh) executed on the CPU by the
// emulator of the CUDA execution model (cuda_emulator.hpp) and compared with the CPU reference
// backend. Label "cpu": runs everywhere, in CI. It verifies the kernels' indexing, masking, GQA
// mapping, tiling, online-softmax merge and barrier uniformity; it says nothing about the GPU's
// memory model, shared-memory limits, cuBLASLt, or speed (those are test_cuda_kernels, label gpu).
// Launch geometry is the launchers' (row_blocks, key_blocks, *_smem, block sizes).
//
// Tolerances as in test_cuda_kernels.cpp (float32 on both sides; summation order differs).
#include "executor/cuda/tests/cuda_emulator.hpp"  // first: maps the CUDA spellings
//
#include "executor/cuda/attention_kernels.cuh"
#include "executor/cuda/elementwise_kernels.cuh"
#include "executor/cuda/embedding_rows.hpp"
#include "executor/cuda/reduce_kernels.cuh"
//
#include <gtest/gtest.h>

#include <random>

#include "executor/backend.hpp"
#include "executor/tests/kernel_test_util.hpp"

using namespace ctx;
using namespace ctx::exec;
namespace dev = ctx::exec::cuda::dev;
using ctx_emu::Idx;

namespace {

using ctx::exec::testing::expect_close;
using ctx::exec::testing::randn;


unsigned blocks(int64_t n, int64_t threads) { return static_cast<unsigned>(std::max<int64_t>(1, (n + threads - 1) / threads)); }

struct AttnInputs {
  int64_t hq = 8, hkv = 2, d = 20, tq = 40, tk = 45;
  std::vector<int64_t> qi, k0, k1;
  std::vector<int32_t> qd, d0, d1;
  std::vector<float> q, ka, va, kb, vb, dout;
  AttnShape shape() const { return {hq, hkv, d, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))}; }
  dev::Geo geo() const { return {hq, hkv, d, hq / hkv, shape().scale}; }
  // Default: queries at positions 40..79 in a zig-zag-like order, documents of 30 tokens, key
  // blocks at 0..44 and 50..94 (some rows see nothing in block 0). Small: 3 queries at 5..7 and
  // key blocks 0..4 and 5..9 in one document, GQA 4:1, tiles mostly empty.
  explicit AttnInputs(int64_t dim, bool small = false) : d(dim) {
    if (small) {
      hq = 4;
      hkv = 1;
      tq = 3;
      tk = 5;
    }
    qi.resize(tq);
    qd.resize(tq);
    for (int64_t i = 0; i < tq; ++i) {
      qi[i] = small ? 5 + i : i < 20 ? 40 + i : 60 + (tq - 1 - i);
      qd[i] = small ? 0 : static_cast<int32_t>(qi[i] / 30);
    }
    const int64_t second = small ? 5 : 50;
    for (int64_t j = 0; j < tk; ++j) {
      k0.push_back(j);
      k1.push_back(second + j);
      d0.push_back(small ? 0 : static_cast<int32_t>(j / 30));
      d1.push_back(small ? 0 : static_cast<int32_t>((second + j) / 30));
    }
    q = randn(tq * hq * d, 1 + d);
    ka = randn(tk * hkv * d, 2);
    va = randn(tk * hkv * d, 3);
    kb = randn(tk * hkv * d, 4);
    vb = randn(tk * hkv * d, 5);
    dout = randn(tq * hq * d, 6);
  }
};

// (head_dim, small case): head dims that fill 1, 2 and all 8 of a lane's slots, not multiples of 32
const std::pair<int64_t, bool> kAttnCases[] = {{20, false}, {64, false}, {16, true}, {256, true}};

void emu_forward(const AttnInputs& a, std::vector<float>& o, std::vector<float>& lse, const std::vector<float>& k,
                 const std::vector<float>& v, const std::vector<int64_t>& ki, const std::vector<int32_t>& kd) {
  const dev::Geo G = a.geo();
  ctx_emu::launch({dev::row_blocks(a.tq, G.group), static_cast<unsigned>(a.hkv), 1}, {dev::kBlockThreads, 1, 1},
                  dev::fwd_smem(a.d), [&] {
                    dev::attn_fwd_kernel(o.data(), lse.data(), a.q.data(), a.qi.data(), a.qd.data(), a.tq, k.data(),
                                         v.data(), ki.data(), kd.data(), a.tk, G);
                  });
}

TEST(EmulatedCudaKernels, AttentionForwardMergesBlocksLikeCpuWithDocumentMaskAndGqa) {
  auto cpu = make_cpu_backend();
  for (auto [d, small] : kAttnCases) {
    AttnInputs a(d, small);
    const AttnShape s = a.shape();
    std::vector<float> o(a.tq * a.hq * d, 0.0f), lse(a.tq * a.hq, -INFINITY), eo = o, el = lse;
    cpu->attention_forward_block(o.data(), lse.data(), a.q.data(), {a.qi.data(), a.qd.data()}, a.tq, a.ka.data(),
                                 a.va.data(), {a.k0.data(), a.d0.data()}, a.tk, s);
    emu_forward(a, eo, el, a.ka, a.va, a.k0, a.d0);
    const std::string tag = " (head_dim " + std::to_string(d) + ")";
    expect_close(lse, el, 1e-4, 2e-5, "lse after block 0" + tag);
    expect_close(o, eo, 1e-4, 2e-5, "o after block 0" + tag);
    cpu->attention_forward_block(o.data(), lse.data(), a.q.data(), {a.qi.data(), a.qd.data()}, a.tq, a.kb.data(),
                                 a.vb.data(), {a.k1.data(), a.d1.data()}, a.tk, s);
    emu_forward(a, eo, el, a.kb, a.vb, a.k1, a.d1);
    expect_close(lse, el, 1e-4, 2e-5, "lse after merging block 1" + tag);
    expect_close(o, eo, 1e-4, 2e-5, "o after merging block 1" + tag);
  }
}

TEST(EmulatedCudaKernels, AttentionBackwardMatchesCpu) {
  auto cpu = make_cpu_backend();
  for (auto [d, small] : kAttnCases) {
    AttnInputs a(d, small);
    const AttnShape s = a.shape();
    const dev::Geo G = a.geo();
    std::vector<float> o(a.tq * a.hq * d, 0.0f), lse(a.tq * a.hq, -INFINITY), delta(a.tq * a.hq), edelta(delta);
    for (int b = 0; b < 2; ++b)
      cpu->attention_forward_block(o.data(), lse.data(), a.q.data(), {a.qi.data(), a.qd.data()}, a.tq,
                                   (b ? a.kb : a.ka).data(), (b ? a.vb : a.va).data(),
                                   {(b ? a.k1 : a.k0).data(), (b ? a.d1 : a.d0).data()}, a.tk, s);
    cpu->attention_delta(delta.data(), a.dout.data(), o.data(), a.tq, s);
    const int64_t rows = a.tq * a.hq;
    ctx_emu::launch({blocks(rows * 32, 256), 1, 1}, {256, 1, 1}, 0,
                    [&] { dev::attention_delta_kernel(edelta.data(), a.dout.data(), o.data(), rows, d); });
    expect_close(delta, edelta, 1e-5, 1e-6, "attention delta");
    auto dq = randn(a.tq * a.hq * d, 10, 0.1f), dk = randn(a.tk * a.hkv * d, 11, 0.1f),
         dv = randn(a.tk * a.hkv * d, 12, 0.1f);
    auto edq = dq, edk = dk, edv = dv;
    for (int b = 0; b < 2; ++b) {
      const auto& k = b ? a.kb : a.ka;
      const auto& v = b ? a.vb : a.va;
      const auto& ki = b ? a.k1 : a.k0;
      const auto& kd = b ? a.d1 : a.d0;
      cpu->attention_backward_block(dq.data(), dk.data(), dv.data(), a.q.data(), {a.qi.data(), a.qd.data()}, a.tq,
                                    k.data(), v.data(), {ki.data(), kd.data()}, a.tk, a.dout.data(), lse.data(),
                                    delta.data(), s);
      ctx_emu::launch({dev::row_blocks(a.tq, G.group), static_cast<unsigned>(a.hkv), 1}, {dev::kBlockThreads, 1, 1},
                      dev::dq_smem(d), [&] {
                        dev::attn_dq_kernel(edq.data(), a.q.data(), a.qi.data(), a.qd.data(), a.tq, k.data(), v.data(),
                                            ki.data(), kd.data(), a.tk, a.dout.data(), lse.data(), delta.data(), G);
                      });
      ctx_emu::launch({dev::key_blocks(a.tk), static_cast<unsigned>(a.hkv), 1}, {dev::kBlockThreads, 1, 1},
                      dev::dkdv_smem(d), [&] {
                        dev::attn_dkdv_kernel(edk.data(), edv.data(), a.q.data(), a.qi.data(), a.qd.data(), a.tq,
                                              k.data(), v.data(), ki.data(), kd.data(), a.tk, a.dout.data(), lse.data(),
                                              delta.data(), G);
                      });
      // dk/dv of block 0 are compared before block 1 accumulates into the same buffers
      if (b == 0) {
        expect_close(dk, edk, 1e-4, 2e-5, "dk block 0 (head_dim " + std::to_string(d) + ")");
        expect_close(dv, edv, 1e-4, 2e-5, "dv block 0 (head_dim " + std::to_string(d) + ")");
      }
    }
    const std::string tag = " (head_dim " + std::to_string(d) + ")";
    expect_close(dq, edq, 1e-4, 2e-5, "dq" + tag);
    expect_close(dk, edk, 1e-4, 2e-5, "dk after both blocks" + tag);
    expect_close(dv, edv, 1e-4, 2e-5, "dv after both blocks" + tag);
  }
}

TEST(EmulatedCudaKernels, RmsNormAndScalarReductionsMatchCpu) {
  auto cpu = make_cpu_backend();
  const int64_t rows = 9, h = 300;
  auto x = randn(rows * h, 20), w = randn(h, 21), dy = randn(rows * h, 22), dw = randn(h, 23, 0.1f);
  std::vector<float> y(rows * h), rstd(rows), dx(rows * h);
  auto ey = y, er = rstd, edx = dx, edw = dw;
  cpu->rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, h, 1e-5f);
  ctx_emu::launch({static_cast<unsigned>(rows), 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::rmsnorm_fwd_kernel(ey.data(), er.data(), x.data(), w.data(), h, 1e-5f); });
  expect_close(y, ey, 1e-5, 1e-6, "rmsnorm y");
  expect_close(rstd, er, 1e-6, 0, "rmsnorm rstd");
  cpu->rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), rstd.data(), w.data(), rows, h);
  ctx_emu::launch({static_cast<unsigned>(rows), 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::rmsnorm_bwd_dx_kernel(edx.data(), dy.data(), x.data(), er.data(), w.data(), h); });
  expect_close(dx, edx, 1e-5, 1e-6, "rmsnorm dx");
  const int64_t chunks = std::min<int64_t>(rows, dev::kDwChunks), per = (rows + chunks - 1) / chunks;
  std::vector<float> scratch(chunks * h);
  ctx_emu::launch({blocks(h, dev::kRowThreads), static_cast<unsigned>(chunks), 1}, {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::rmsnorm_dw_partial(scratch.data(), dy.data(), x.data(), er.data(), rows, h, per); });
  ctx_emu::launch({blocks(h, dev::kRowThreads), 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::rmsnorm_dw_finish(edw.data(), scratch.data(), chunks, h); });
  expect_close(dw, edw, 1e-5, 1e-5, "rmsnorm dw");

  // sum of squares: partial sums per block, then one block; non-finite flag
  std::vector<double> partials(8), total(1);
  ctx_emu::launch({8, 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::sum_squares_partial(partials.data(), x.data(), rows * h); });
  ctx_emu::launch({1, 1, 1}, {dev::kRowThreads, 1, 1}, 0, [&] { dev::sum_partials(total.data(), partials.data(), 8); });
  EXPECT_NEAR(total[0], cpu->sum_squares(x.data(), rows * h), 1e-9 * total[0]);
  int flag = 0;
  ctx_emu::launch({2, 1, 1}, {dev::kRowThreads, 1, 1}, 0, [&] { dev::nonfinite_kernel(&flag, x.data(), rows * h); });
  EXPECT_EQ(flag, 0);
  x[777] = std::numeric_limits<float>::quiet_NaN();
  ctx_emu::launch({2, 1, 1}, {dev::kRowThreads, 1, 1}, 0, [&] { dev::nonfinite_kernel(&flag, x.data(), rows * h); });
  EXPECT_EQ(flag, 1);
}

TEST(EmulatedCudaKernels, CrossEntropyPiecesMatchCpu) {
  auto cpu = make_cpu_backend();
  const int64_t rows = 6, cols = 700, valid = 690, v0 = 2000;
  auto logits = randn(rows * cols, 30, 3.0f);
  auto el = logits;
  std::vector<int32_t> target = {2000, 2689, 2690, 1999, -1, 2300};
  std::vector<float> weight = {0.5f, 0.25f, 1.0f, 1.0f, 0.0f, 0.125f};
  std::vector<float> mx(rows), se(2 * rows), emx(rows), ese(2 * rows);
  cpu->row_max(mx.data(), logits.data(), rows, cols, valid);
  ctx_emu::launch({static_cast<unsigned>(rows), 1, 1}, {dev::kRowThreads, 1, 1}, 0,
                  [&] { dev::row_max_kernel(emx.data(), el.data(), cols, valid); });
  expect_close(mx, emx, 0, 0, "row_max");
  cpu->sumexp_and_target(se.data(), logits.data(), mx.data(), target.data(), rows, cols, valid, v0);
  ctx_emu::launch({static_cast<unsigned>(rows), 1, 1}, {dev::kRowThreads, 1, 1}, 0, [&] {
    dev::sumexp_target_kernel(ese.data(), el.data(), emx.data(), target.data(), cols, valid, v0);
  });
  expect_close(se, ese, 1e-6, 0, "sumexp_and_target");
  std::vector<float> lse(rows);
  for (int64_t r = 0; r < rows; ++r) lse[r] = mx[r] + std::log(se[2 * r]);
  cpu->xent_grad_inplace(logits.data(), lse.data(), target.data(), weight.data(), rows, cols, valid, v0);
  ctx_emu::launch({blocks(rows * cols, 256), 1, 1}, {256, 1, 1}, 0, [&] {
    dev::xent_grad_kernel(el.data(), lse.data(), target.data(), weight.data(), rows, cols, valid, v0);
  });
  expect_close(logits, el, 1e-5, 1e-7, "xent_grad_inplace");
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
  for (bool inverse : {false, true}) {
    cpu->rope(x.data(), rows, heads, d, pos.data(), inv_freq.data(), rot, 1.1f, inverse);
    ctx_emu::launch({1, 1, 1}, {32, 1, 1}, 0, [&] {
      dev::rope_kernel(ex.data(), rows, heads, d, pos.data(), inv_freq.data(), rot / 2, 1.1f, inverse ? -1.0f : 1.0f);
    });
    expect_close(x, ex, 1e-5, 1e-6, inverse ? "rope inverse" : "rope");
  }
  // SwiGLU, with the output aliasing the gate as the tiled MLP calls it
  const int64_t n = 300;
  auto gate = randn(n, 41, 4.0f), up = randn(n, 42), da = randn(n, 43);
  std::vector<float> a(n), dg(n), du(n), ea(n), edg(n), edu(n);
  cpu->swiglu_forward(a.data(), gate.data(), up.data(), n);
  ctx_emu::launch({2, 1, 1}, {64, 1, 1}, 0, [&] { dev::swiglu_fwd_kernel(ea.data(), gate.data(), up.data(), n); });
  expect_close(a, ea, 1e-5, 1e-6, "swiglu forward");
  cpu->swiglu_backward(dg.data(), du.data(), da.data(), gate.data(), up.data(), n);
  ctx_emu::launch({2, 1, 1}, {64, 1, 1}, 0,
                  [&] { dev::swiglu_bwd_kernel(edg.data(), edu.data(), da.data(), gate.data(), up.data(), n); });
  expect_close(dg, edg, 1e-5, 1e-6, "swiglu dgate");
  expect_close(du, edu, 1e-5, 1e-6, "swiglu dup");
  // AdamW, three steps
  auto master = randn(n, 44), m = randn(n, 45, 0.01f), v = randn(n, 46, 0.01f), grad = randn(n, 47);
  for (auto& e : v) e = std::fabs(e);
  auto em = master, emm = m, ev = v;
  for (int64_t step = 1; step <= 3; ++step) {
    cpu->adamw(master.data(), m.data(), v.data(), grad.data(), 1.0f, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, step);
    // bias corrections as the launcher computes them: from the float betas, in double
    ctx_emu::launch({2, 1, 1}, {64, 1, 1}, 0, [&] {
      dev::adamw_kernel(em.data(), emm.data(), ev.data(), grad.data(), 1.0f, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f,
                        1.0 - std::pow(static_cast<double>(0.9f), static_cast<double>(step)),
                        1.0 - std::pow(static_cast<double>(0.95f), static_cast<double>(step)));
    });
  }
  expect_close(master, em, 1e-6, 1e-7, "adamw master");
  expect_close(m, emm, 1e-6, 1e-9, "adamw m");
  expect_close(v, ev, 1e-6, 1e-10, "adamw v");
  // embedding: forward gather, backward grouped by row in token order (bit-identical sums)
  const int64_t hh = 33, v0 = 10, vrows = 50, tokens = 200;
  std::mt19937 r(48);
  std::vector<int32_t> tok(tokens);
  for (auto& t : tok) t = static_cast<int32_t>(r() % 80);
  auto table = randn(vrows * hh, 49), dout = randn(tokens * hh, 50), dtable = randn(vrows * hh, 51);
  std::vector<float> out(tokens * hh), eout(tokens * hh);
  auto edtable = dtable;
  cpu->embedding_forward(out.data(), table.data(), tok.data(), tokens, hh, v0, vrows);
  ctx_emu::launch({4, 1, 1}, {64, 1, 1}, 0,
                  [&] { dev::embedding_fwd_kernel(eout.data(), table.data(), tok.data(), tokens, hh, v0, vrows); });
  expect_close(out, eout, 0, 0, "embedding forward");
  cpu->embedding_backward(dtable.data(), dout.data(), tok.data(), tokens, hh, v0, vrows);
  cuda::TokenRows g;
  cuda::group_tokens_by_row(tok.data(), tokens, v0, vrows, g);
  ctx_emu::launch({static_cast<unsigned>(g.rows.size()), 1, 1}, {32, 1, 1}, 0, [&] {
    dev::embedding_bwd_kernel(edtable.data(), dout.data(), g.rows.data(), g.offsets.data(), g.positions.data(), hh);
  });
  expect_close(dtable, edtable, 0, 0, "embedding backward");
  // data movement: add_block on a strided block
  auto wide = randn(7 * 40, 52), narrow = randn(7 * 13, 53);
  auto ewide = wide;
  cpu->add_block(wide.data() + 30, 40, narrow.data(), 13, 7, 10);
  ctx_emu::launch({1, 1, 1}, {64, 1, 1}, 0,
                  [&] { dev::add_block_kernel(ewide.data() + 30, 40, narrow.data(), 13, 7, 10); });
  expect_close(wide, ewide, 0, 0, "add_block");
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

}  // namespace
