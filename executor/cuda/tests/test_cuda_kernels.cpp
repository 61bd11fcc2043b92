// The CUDA backend against the CPU reference backend (make_cpu_backend), kernel by kernel, on
// random inputs; then a few training steps of the tiny model on both backends. Label "gpu":
// without a CUDA device every test reports SKIPPED (GTEST_SKIP), and ctest shows them as skipped.
//
// Tolerances (float32 both sides; the only differences are summation order and FMA contraction):
//   elementwise kernels (SwiGLU, RoPE, AdamW, cross-entropy gradient): 1e-5 relative + 1e-6 absolute
//   row reductions (RMSNorm, sum-exp, delta): 1e-5 relative + 1e-6 absolute
//   GEMM (exact fp32 compute in cuBLASLt): 1e-5 * k * max|operand|^2 absolute
//   attention (tiles of 32 keys vs one key at a time in the online softmax): 1e-4 relative + 2e-5 absolute
//   training losses after 3 steps: 1e-4 relative
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

using ctx::exec::testing::expect_close;
using ctx::exec::testing::randn;


// One CUDA backend for the whole binary (cuBLASLt set-up costs a second); null without a device.
Backend* gpu() {
  static std::unique_ptr<Backend> be = cuda_device_count() > 0 ? make_cuda_backend(0) : nullptr;
  return be.get();
}

class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none): GPU test skipped";
    g_ = gpu();
    c_ = make_cpu_backend();
  }
  // A device tensor holding `v` (copied through the backend, as the strategy code does).
  Tensor up(const std::vector<float>& v) {
    Tensor t = g_->alloc(1, static_cast<int64_t>(v.size()), Mem::workspace);
    g_->copy(t.data(), v.data(), static_cast<int64_t>(v.size()));
    return t;
  }
  std::vector<float> down(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    g_->copy(v.data(), t.data(), t.numel());
    return v;
  }
  Backend* g_ = nullptr;
  std::unique_ptr<Backend> c_;
};

TEST_F(CudaVsCpu, DataMovementAndReductionsMatchCpu) {
  auto x = randn(5000, 1), y = randn(5000, 2);
  Tensor gx = up(x), gy = up(y);
  g_->axpy(gy.data(), 0.75f, gx.data(), 5000);
  c_->axpy(y.data(), 0.75f, x.data(), 5000);
  expect_close(y, down(gy), 1e-6, 1e-7, "axpy");
  g_->scale(gy.data(), -1.5f, 5000);
  c_->scale(y.data(), -1.5f, 5000);
  expect_close(y, down(gy), 1e-6, 1e-7, "scale");
  EXPECT_NEAR(g_->sum_squares(gx.data(), 5000), c_->sum_squares(x.data(), 5000), 1e-9 * c_->sum_squares(x.data(), 5000));
  EXPECT_TRUE(g_->all_finite(gx.data(), 5000));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto z = x;
    z[4321] = bad;
    Tensor gz = up(z);
    EXPECT_FALSE(g_->all_finite(gz.data(), 5000)) << bad;
  }
  g_->fill(gx.data(), 2.5f, 100);
  c_->fill(x.data(), 2.5f, 100);
  expect_close(x, down(gx), 0, 0, "fill");
  // blocks: a [7, 9] block out of a [7, 40] matrix into a [7, 13] one, then added back
  auto wide = randn(7 * 40, 3), narrow = randn(7 * 13, 4);
  Tensor gw = up(wide), gn = up(narrow);
  g_->copy_block(gn.data() + 2, 13, gw.data() + 5, 40, 7, 9);
  c_->copy_block(narrow.data() + 2, 13, wide.data() + 5, 40, 7, 9);
  expect_close(narrow, down(gn), 0, 0, "copy_block");
  g_->add_block(gw.data() + 30, 40, gn.data(), 13, 7, 10);
  c_->add_block(wide.data() + 30, 40, narrow.data(), 13, 7, 10);
  expect_close(wide, down(gw), 1e-7, 0, "add_block");
  // overlapping copy keeps memmove semantics
  g_->copy(gw.data() + 1, gw.data(), 200);
  c_->copy(wide.data() + 1, wide.data(), 200);
  expect_close(wide, down(gw), 0, 0, "overlapping copy");
}

TEST_F(CudaVsCpu, GemmMatchesCpuForAllTransposes) {
  struct Shape {
    int64_t m, n, k;
  };
  for (Shape s : {Shape{37, 53, 29}, Shape{128, 96, 256}, Shape{1, 200, 64}}) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.0f, 0.5f}) {
          auto a = randn(s.m * s.k, 10 + ta), b = randn(s.k * s.n, 20 + tb), c = randn(s.m * s.n, 30);
          Tensor ga = up(a), gb = up(b), gc = up(c);
          g_->gemm(ta, tb, s.m, s.n, s.k, 0.7f, ga.data(), gb.data(), beta, gc.data());
          c_->gemm(ta, tb, s.m, s.n, s.k, 0.7f, a.data(), b.data(), beta, c.data());
          expect_close(c, down(gc), 1e-5, 1e-5 * s.k * 16,
                       "gemm m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                           " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " beta=" + std::to_string(beta));
        }
  }
  // k = 0: C = beta C
  auto c = randn(12, 5);
  Tensor gc = up(c);
  g_->gemm(false, false, 3, 4, 0, 1.0f, gc.data(), gc.data(), 0.25f, gc.data());
  c_->gemm(false, false, 3, 4, 0, 1.0f, c.data(), c.data(), 0.25f, c.data());
  expect_close(c, down(gc), 1e-7, 0, "gemm k=0");
}

TEST_F(CudaVsCpu, RmsNormForwardBackwardMatchCpu) {
  const int64_t rows = 70, h = 300;
  auto x = randn(rows * h, 40), w = randn(h, 41), dy = randn(rows * h, 42), dw = randn(h, 43, 0.1f);
  std::vector<float> y(rows * h), rstd(rows), dx(rows * h);
  Tensor gx = up(x), gw = up(w), gdy = up(dy), gdw = up(dw), gy = up(y), gr = up(rstd), gdx = up(dx);
  g_->rmsnorm_forward(gy.data(), gr.data(), gx.data(), gw.data(), rows, h, 1e-5f);
  c_->rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, h, 1e-5f);
  expect_close(y, down(gy), 1e-5, 1e-6, "rmsnorm y");
  expect_close(rstd, down(gr), 1e-6, 0, "rmsnorm rstd");
  g_->rmsnorm_forward(nullptr, gr.data(), gx.data(), gw.data(), rows, h, 1e-5f);  // rstd only
  expect_close(rstd, down(gr), 1e-6, 0, "rmsnorm rstd (no y)");
  g_->rmsnorm_backward(gdx.data(), gdw.data(), gdy.data(), gx.data(), gr.data(), gw.data(), rows, h);
  c_->rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), rstd.data(), w.data(), rows, h);
  expect_close(dx, down(gdx), 1e-5, 1e-6, "rmsnorm dx");
  expect_close(dw, down(gdw), 1e-5, 1e-5, "rmsnorm dw (accumulated)");
}

TEST_F(CudaVsCpu, RopeMatchesCpuForwardAndInverseAtLargePositions) {
  const int64_t rows = 9, heads = 3, d = 16, rot = 12;
  auto x = randn(rows * heads * d, 50);
  std::vector<int32_t> pos = {0, 1, 7, 1000, 65535, 131071, 524287, 1000000, 3};
  std::vector<float> inv_freq(rot / 2);
  for (int64_t i = 0; i < rot / 2; ++i) inv_freq[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / rot));
  Tensor gx = up(x);
  for (bool inverse : {false, true}) {
    g_->rope(gx.data(), rows, heads, d, pos.data(), inv_freq.data(), rot, 1.1f, inverse);  // host pos/inv_freq
    c_->rope(x.data(), rows, heads, d, pos.data(), inv_freq.data(), rot, 1.1f, inverse);
    expect_close(x, down(gx), 1e-5, 1e-6, inverse ? "rope inverse" : "rope");
  }
}

TEST_F(CudaVsCpu, SwigluForwardBackwardMatchCpu) {
  const int64_t n = 4097;
  auto gate = randn(n, 60, 4.0f), upv = randn(n, 61), da = randn(n, 62);
  std::vector<float> a(n), dg(n), du(n);
  Tensor gg = up(gate), gu = up(upv), gda = up(da), ga = up(a), gdg = up(dg), gdu = up(du);
  g_->swiglu_forward(ga.data(), gg.data(), gu.data(), n);
  c_->swiglu_forward(a.data(), gate.data(), upv.data(), n);
  expect_close(a, down(ga), 1e-5, 1e-6, "swiglu forward");
  g_->swiglu_backward(gdg.data(), gdu.data(), gda.data(), gg.data(), gu.data(), n);
  c_->swiglu_backward(dg.data(), du.data(), da.data(), gate.data(), upv.data(), n);
  expect_close(dg, down(gdg), 1e-5, 1e-6, "swiglu dgate");
  expect_close(du, down(gdu), 1e-5, 1e-6, "swiglu dup");
}

TEST_F(CudaVsCpu, EmbeddingForwardBackwardMatchCpuInTokenOrder) {
  const int64_t h = 33, v0 = 10, vrows = 50, tokens = 200;
  std::mt19937 r(70);
  std::vector<int32_t> tok(tokens);
  for (auto& t : tok) t = static_cast<int32_t>(r() % 80);  // some below v0, some past v0 + vrows, many repeats
  auto table = randn(vrows * h, 71), dout = randn(tokens * h, 72), dtable = randn(vrows * h, 73);
  std::vector<float> out(tokens * h);
  Tensor gt = up(table), gdo = up(dout), gdt = up(dtable), go = up(out);
  g_->embedding_forward(go.data(), gt.data(), tok.data(), tokens, h, v0, vrows);
  c_->embedding_forward(out.data(), table.data(), tok.data(), tokens, h, v0, vrows);
  expect_close(out, down(go), 0, 0, "embedding forward");
  g_->embedding_backward(gdt.data(), gdo.data(), tok.data(), tokens, h, v0, vrows);
  c_->embedding_backward(dtable.data(), dout.data(), tok.data(), tokens, h, v0, vrows);
  expect_close(dtable, down(gdt), 0, 0, "embedding backward (same order of additions: bit-identical)");
}

// Two key blocks merged into one running (o, lse): documents, a zig-zag-like query order, GQA 4:1,
// head dims that are and are not multiples of 32, lengths that are not multiples of the tile.
TEST_F(CudaVsCpu, AttentionBlocksMatchCpuWithDocumentMaskAndGqa) {
  for (int64_t d : {int64_t(20), int64_t(64), int64_t(128)}) {
    const int64_t hq = 8, hkv = 2, tq = 70, tk = 45;
    AttnShape s{hq, hkv, d, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))};
    // queries: global positions 40..109 in reverse-chunk order; documents of length 30
    std::vector<int64_t> qi(tq), k0(tk), k1(tk);
    std::vector<int32_t> qd(tq), d0(tk), d1(tk);
    for (int64_t i = 0; i < tq; ++i) {
      qi[i] = i < 35 ? 40 + i : 75 + (tq - 1 - i);
      qd[i] = static_cast<int32_t>(qi[i] / 30);
    }
    for (int64_t j = 0; j < tk; ++j) {
      k0[j] = j;           // keys 0..44: visible to early documents only
      k1[j] = 60 + j;      // keys 60..104
      d0[j] = static_cast<int32_t>(k0[j] / 30);
      d1[j] = static_cast<int32_t>(k1[j] / 30);
    }
    auto q = randn(tq * hq * d, 80 + d), ka = randn(tk * hkv * d, 81), va = randn(tk * hkv * d, 82),
         kb = randn(tk * hkv * d, 83), vb = randn(tk * hkv * d, 84), dout = randn(tq * hq * d, 85);
    std::vector<float> o(tq * hq * d, 0.0f), lse(tq * hq, -INFINITY);
    Tensor gq = up(q), gka = up(ka), gva = up(va), gkb = up(kb), gvb = up(vb), go = up(o), gl = up(lse), gdo = up(dout);
    const std::string tag = " (head_dim " + std::to_string(d) + ")";
    g_->attention_forward_block(go.data(), gl.data(), gq.data(), {qi.data(), qd.data()}, tq, gka.data(), gva.data(),
                                {k0.data(), d0.data()}, tk, s);
    c_->attention_forward_block(o.data(), lse.data(), q.data(), {qi.data(), qd.data()}, tq, ka.data(), va.data(),
                                {k0.data(), d0.data()}, tk, s);
    expect_close(lse, down(gl), 1e-4, 2e-5, "lse after block 0" + tag);  // rows with no visible key stay -inf
    expect_close(o, down(go), 1e-4, 2e-5, "o after block 0" + tag);
    g_->attention_forward_block(go.data(), gl.data(), gq.data(), {qi.data(), qd.data()}, tq, gkb.data(), gvb.data(),
                                {k1.data(), d1.data()}, tk, s);
    c_->attention_forward_block(o.data(), lse.data(), q.data(), {qi.data(), qd.data()}, tq, kb.data(), vb.data(),
                                {k1.data(), d1.data()}, tk, s);
    expect_close(lse, down(gl), 1e-4, 2e-5, "lse after merging block 1" + tag);
    expect_close(o, down(go), 1e-4, 2e-5, "o after merging block 1" + tag);

    // backward over both blocks from the CPU's final o and lse (so only the backward is compared)
    Tensor go2 = up(o), gl2 = up(lse);
    std::vector<float> delta(tq * hq);
    Tensor gdelta = up(delta);
    g_->attention_delta(gdelta.data(), gdo.data(), go2.data(), tq, s);
    c_->attention_delta(delta.data(), dout.data(), o.data(), tq, s);
    expect_close(delta, down(gdelta), 1e-5, 1e-6, "attention delta" + tag);
    auto dq = randn(tq * hq * d, 90, 0.1f), dka = randn(tk * hkv * d, 91, 0.1f), dva = randn(tk * hkv * d, 92, 0.1f),
         dkb = randn(tk * hkv * d, 93, 0.1f), dvb = randn(tk * hkv * d, 94, 0.1f);  // accumulated into
    Tensor gdq = up(dq), gdka = up(dka), gdva = up(dva), gdkb = up(dkb), gdvb = up(dvb), gd2 = up(delta);
    g_->attention_backward_block(gdq.data(), gdka.data(), gdva.data(), gq.data(), {qi.data(), qd.data()}, tq,
                                 gka.data(), gva.data(), {k0.data(), d0.data()}, tk, gdo.data(), gl2.data(), gd2.data(), s);
    g_->attention_backward_block(gdq.data(), gdkb.data(), gdvb.data(), gq.data(), {qi.data(), qd.data()}, tq,
                                 gkb.data(), gvb.data(), {k1.data(), d1.data()}, tk, gdo.data(), gl2.data(), gd2.data(), s);
    c_->attention_backward_block(dq.data(), dka.data(), dva.data(), q.data(), {qi.data(), qd.data()}, tq, ka.data(),
                                 va.data(), {k0.data(), d0.data()}, tk, dout.data(), lse.data(), delta.data(), s);
    c_->attention_backward_block(dq.data(), dkb.data(), dvb.data(), q.data(), {qi.data(), qd.data()}, tq, kb.data(),
                                 vb.data(), {k1.data(), d1.data()}, tk, dout.data(), lse.data(), delta.data(), s);
    expect_close(dq, down(gdq), 1e-4, 2e-5, "dq" + tag);
    expect_close(dka, down(gdka), 1e-4, 2e-5, "dk block 0" + tag);
    expect_close(dva, down(gdva), 1e-4, 2e-5, "dv block 0" + tag);
    expect_close(dkb, down(gdkb), 1e-4, 2e-5, "dk block 1" + tag);
    expect_close(dvb, down(gdvb), 1e-4, 2e-5, "dv block 1" + tag);
  }
}

TEST_F(CudaVsCpu, CrossEntropyPiecesMatchCpu) {
  const int64_t rows = 6, cols = 1000, valid = 990, v0 = 2000;
  auto logits = randn(rows * cols, 100, 3.0f);
  std::vector<int32_t> target = {2000, 2989, 2990, 1999, -1, 2500};  // first, last, past valid, below shard, ignored
  std::vector<float> weight = {0.5f, 0.25f, 1.0f, 1.0f, 0.0f, 0.125f};
  std::vector<float> mx(rows), se(2 * rows);
  Tensor gl = up(logits), gm = up(mx), gs = up(se);
  g_->row_max(gm.data(), gl.data(), rows, cols, valid);
  c_->row_max(mx.data(), logits.data(), rows, cols, valid);
  expect_close(mx, down(gm), 0, 0, "row_max");
  g_->sumexp_and_target(gs.data(), gl.data(), gm.data(), target.data(), rows, cols, valid, v0);
  c_->sumexp_and_target(se.data(), logits.data(), mx.data(), target.data(), rows, cols, valid, v0);
  expect_close(se, down(gs), 1e-6, 0, "sumexp_and_target");
  std::vector<float> lse(rows);
  for (int64_t r = 0; r < rows; ++r) lse[r] = mx[r] + std::log(se[2 * r]);
  Tensor glse = up(lse), gwt = up(weight);
  g_->xent_grad_inplace(gl.data(), glse.data(), target.data(), gwt.data(), rows, cols, valid, v0);
  c_->xent_grad_inplace(logits.data(), lse.data(), target.data(), weight.data(), rows, cols, valid, v0);
  expect_close(logits, down(gl), 1e-5, 1e-7, "xent_grad_inplace");
}

TEST_F(CudaVsCpu, AdamwMatchesCpu) {
  const int64_t n = 3001;
  auto master = randn(n, 110), m = randn(n, 111, 0.01f), v = randn(n, 112, 0.01f), grad = randn(n, 113);
  for (auto& x : v) x = std::fabs(x);
  Tensor gmaster = up(master), gm = up(m), gv = up(v), gg = up(grad);
  for (int64_t step = 1; step <= 3; ++step) {
    g_->adamw(gmaster.data(), gm.data(), gv.data(), gg.data(), 1.0f, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, step);
    c_->adamw(master.data(), m.data(), v.data(), grad.data(), 1.0f, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, step);
  }
  expect_close(master, down(gmaster), 1e-6, 1e-7, "adamw master");
  expect_close(m, down(gm), 1e-6, 1e-9, "adamw m");
  expect_close(v, down(gv), 1e-6, 1e-10, "adamw v");
}

TEST_F(CudaVsCpu, CachingAllocatorReusesBlocksAndLedgerIsUnchanged) {
  const int64_t before = g_->ledger().current_total();
  { Tensor t = g_->alloc(1000, 1000, Mem::activations); }
  const CudaMemoryReport r1 = cuda_memory_report(*g_);
  {
    Tensor t = g_->alloc(1000, 1000, Mem::activations);
    EXPECT_EQ(g_->ledger().current(Mem::activations), 4000000);
  }
  const CudaMemoryReport r2 = cuda_memory_report(*g_);
  EXPECT_EQ(r2.allocator_cuda_calls, r1.allocator_cuda_calls) << "the second block of the same size came from the cache";
  EXPECT_EQ(g_->ledger().current_total(), before);
  EXPECT_GE(r2.allocator_cached_bytes, 4000000);
  EXPECT_GT(r2.driver_total_bytes, 0);
  EXPECT_GE(r2.driver_used_bytes(), r2.allocator_reserved_bytes - r2.allocator_cached_bytes);
  Tensor h = g_->alloc_host(10, 10, HostMem::optimizer);  // pinned host tensors: zero-filled, kernels reach them
  std::vector<float> zeros(100, 0.0f), got(100);
  g_->copy(got.data(), h.data(), 100);
  EXPECT_EQ(got, zeros);
  std::printf("%s\n", to_string(r2).c_str());
}

#ifdef CTXPLAN_HAVE_NCCL
TEST_F(CudaVsCpu, NcclSingleRankWorldCollectivesAndSelfP2p) {
  auto world = make_nccl_single_rank_world(*g_);
  Comm& c = world->world();
  EXPECT_EQ(c.size(), 1);
  auto x = randn(1000, 120);
  Tensor gx = up(x);
  c.allreduce_sum(gx.data(), 1000);
  expect_close(x, down(gx), 0, 0, "allreduce over one rank");
  double host_scalar = 3.5;  // a host pointer: staged through the device
  c.allreduce_sum(&host_scalar, 1);
  EXPECT_EQ(host_scalar, 3.5);
  int code = 7;
  c.allreduce_max(&code, 1);
  EXPECT_EQ(code, 7);
  std::vector<float> recv(1000, 0.0f);
  Tensor gr = up(recv);
  auto rr = c.irecv(gr.data(), 1000, 0, 11);
  auto rs = c.isend(gx.data(), 1000, 0, 11);
  rr->wait();
  rs->wait();
  expect_close(x, down(gr), 0, 0, "send to self");
  auto sub = world->split({0});
  sub->barrier();
  EXPECT_EQ(sub->size(), 1);
}
#endif

// Three optimizer steps of the tiny model on both backends (same data, same initialisation).
void train_both(const std::string& plan_text, int64_t seq, bool use_nccl) {
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
  std::unique_ptr<CommWorld> gpu_world;
#ifdef CTXPLAN_HAVE_NCCL
  if (use_nccl) gpu_world = make_nccl_single_rank_world(*gpu());
#endif
  if (!gpu_world) gpu_world = make_self_world();
  Trainer tc(*cpu, *cpu_world, o, *data), tg(*gpu(), *gpu_world, o, *data);
  for (int s = 0; s < 3; ++s) {
    StepStats a = tc.step(), b = tg.step();
    EXPECT_NEAR(b.loss, a.loss, 1e-4 * std::fabs(a.loss)) << plan_text << " step " << s + 1;
    EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-3 * a.grad_norm + 1e-6) << plan_text << " step " << s + 1;
  }
}

TEST_F(CudaVsCpu, TinyModelTrainingMatchesCpuBackend) {
  train_both("dp=1", 128, false);
  train_both("dp=1,mask=doc:32,recompute=full", 128, false);
}

TEST_F(CudaVsCpu, TinyModelTrainsOnTheNcclSingleRankWorld) {
#ifndef CTXPLAN_HAVE_NCCL
  GTEST_SKIP() << "built without NCCL";
#endif
  train_both("dp=1", 128, true);
}

}  // namespace
