#include "executor/model.hpp"

#include <chrono>
#include <cmath>
#include <limits>

namespace ctx::exec {
namespace {
// parameter indices inside a layer unit and the final unit (params.cpp adds them in this order)
enum LayerParam { kNorm1, kWq, kWk, kWv, kWo, kNorm2, kWg, kWu, kWd };
enum FinalParam { kNormF, kHead };
constexpr float kRmsEps = 1e-5f;
}  // namespace

Model::Model(Backend& be, ParallelContext& pc, const ModelSpec& m, const Layout& l, ParamStore& ps)
    : be_(be), pc_(pc), m_(m), l_(l), ps_(ps), attn_(be, pc, l), rope_(make_rope_table(m.rope, m.head_dim)) {}

Tensor Model::linear(const float* x, int64_t rows, const float* w, int64_t out, int64_t in, Mem cat) {
  Tensor y = be_.alloc(rows, out, cat);
  be_.gemm(false, true, rows, out, in, 1.0f, x, w, 0.0f, y.data());  // y = x W^T, W [out, in]
  return y;
}

Tensor Model::gather_seq(const Tensor& x, Mem cat) {
  Tensor out = be_.alloc(l_.tokens, x.cols(), cat);
  pc_.tp->allgather(x.data(), out.data(), x.numel());
  return out;
}

Tensor Model::reduce_partial(Tensor y, Mem cat) {
  if (l_.sp) {
    Tensor out = be_.alloc(l_.tokens_sp, y.cols(), cat);
    pc_.tp->reduce_scatter(y.data(), out.data(), out.numel());
    return out;
  }
  if (pc_.plan.tp > 1) pc_.tp->allreduce_sum(y.data(), y.numel());
  y.retag(cat);
  return y;
}

void Model::qkv_rope(int64_t i, const SequenceMeta& s, Tensor& q, Tensor& k, bool inverse) {
  if (m_.layer_position[i] != PositionKind::rope) return;  // NoPE layer
  be_.rope(q.data(), l_.tokens, l_.q_heads, l_.head_dim, s.pos.data(), rope_.inv_freq.data(), rope_.rot_dim,
           rope_.attn_scale, inverse);
  be_.rope(k.data(), l_.tokens, l_.kv_heads, l_.head_dim, s.pos.data(), rope_.inv_freq.data(), rope_.rot_dim,
           rope_.attn_scale, inverse);
}

Tensor Model::attention_block_forward(int64_t i, const SequenceMeta& s, const Tensor& x, LayerActs& a, Keep keep) {
  const int64_t u = ps_.layer_unit(i), h = l_.hidden, d = l_.head_dim, T = l_.tokens, Tsp = l_.tokens_sp;
  Tensor rstd = be_.alloc(Tsp, 1, Mem::activations);
  Tensor n1 = be_.alloc(Tsp, h, Mem::workspace);
  be_.rmsnorm_forward(n1.data(), rstd.data(), x.data(), ps_.weight(u, kNorm1), Tsp, h, kRmsEps);
  if (l_.sp) n1 = gather_seq(n1, Mem::comm_buffers);
  Tensor q = linear(n1.data(), T, ps_.weight(u, kWq), l_.q_heads * d, h, Mem::activations);
  Tensor k = linear(n1.data(), T, ps_.weight(u, kWk), l_.kv_heads * d, h, Mem::activations);
  Tensor v = linear(n1.data(), T, ps_.weight(u, kWv), l_.kv_heads * d, h, Mem::activations);
  n1.reset();
  qkv_rope(i, s, q, k, false);
  Tensor o, lse;
  attn_.forward(s, q, k, v, o, lse);
  Tensor y = reduce_partial(linear(o.data(), T, ps_.weight(u, kWo), h, l_.q_heads * d, Mem::workspace), Mem::workspace);
  Tensor x2 = be_.alloc(Tsp, h, Mem::activations);
  be_.copy(x2.data(), x.data(), x.numel());
  be_.axpy(x2.data(), 1.0f, y.data(), y.numel());
  if (keep != Keep::checkpoint) {
    a.rstd1 = std::move(rstd);
    a.q = std::move(q);
    a.k = std::move(k);
    a.v = std::move(v);
    if (keep == Keep::all) {  // selective recompute drops the attention core's output and LSE
      a.o = std::move(o);
      a.lse = std::move(lse);
    }
  }
  return x2;
}

Tensor Model::mlp_block_forward(int64_t i, const Tensor& x2, LayerActs& a, Keep keep) {
  const int64_t u = ps_.layer_unit(i), h = l_.hidden, T = l_.tokens, Tsp = l_.tokens_sp, F = l_.ffn;
  Tensor rstd = be_.alloc(Tsp, 1, Mem::activations);
  Tensor n2 = be_.alloc(Tsp, h, Mem::workspace);
  be_.rmsnorm_forward(n2.data(), rstd.data(), x2.data(), ps_.weight(u, kNorm2), Tsp, h, kRmsEps);
  if (l_.sp) n2 = gather_seq(n2, Mem::comm_buffers);
  const int64_t chunks = mlp_chunks();
  Tensor y;
  if (chunks == 1) {
    Tensor gate = linear(n2.data(), T, ps_.weight(u, kWg), F, h, Mem::activations);
    Tensor up = linear(n2.data(), T, ps_.weight(u, kWu), F, h, Mem::activations);
    Tensor act = be_.alloc(T, F, Mem::activations);
    be_.swiglu_forward(act.data(), gate.data(), up.data(), act.numel());
    y = linear(act.data(), T, ps_.weight(u, kWd), h, F, Mem::workspace);
    if (keep != Keep::checkpoint) {
      a.gate = std::move(gate);
      a.up = std::move(up);
      if (keep == Keep::all) a.act = std::move(act);
    }
  } else {  // tiled MLP: one chunk of rows at a time, nothing of the chunk kept
    y = be_.alloc(T, h, Mem::workspace);
    const int64_t per = (T + chunks - 1) / chunks;
    for (int64_t r0 = 0; r0 < T; r0 += per) {
      const int64_t rows = std::min(per, T - r0);
      Tensor gate = linear(n2.row(r0), rows, ps_.weight(u, kWg), F, h, Mem::workspace);
      Tensor up = linear(n2.row(r0), rows, ps_.weight(u, kWu), F, h, Mem::workspace);
      Tensor act = be_.alloc(rows, F, Mem::workspace);  // the chunk's three tensors, as the untiled MLP has
      be_.swiglu_forward(act.data(), gate.data(), up.data(), act.numel());
      be_.gemm(false, true, rows, h, F, 1.0f, act.data(), ps_.weight(u, kWd), 0.0f, y.row(r0));
    }
  }
  n2.reset();
  Tensor out = reduce_partial(std::move(y), Mem::activations);
  be_.axpy(out.data(), 1.0f, x2.data(), x2.numel());
  if (keep != Keep::checkpoint) a.rstd2 = std::move(rstd);
  return out;
}

int64_t Model::mlp_chunks() const {
  const Plan& p = pc_.plan;
  if (p.tiled_mlp < 0) return std::max<int64_t>(1, (l_.tokens + l_.hidden - 1) / l_.hidden);  // ALST's ceil(T/h)
  return std::max<int64_t>(1, std::min(p.tiled_mlp, l_.tokens));
}

Tensor Model::layer_forward(int64_t i, const SequenceMeta& s, Tensor x, LayerActs& a, Keep keep) {
  Tensor x2 = attention_block_forward(i, s, x, a, keep);
  Tensor out = mlp_block_forward(i, x2, a, keep);
  if (keep == Keep::checkpoint) {
    if (pc_.plan.ckpt_offload) {  // the checkpoint goes to host memory until the backward needs it
      a.x = be_.alloc_host(x.rows(), x.cols(), HostMem::checkpoints);
      be_.copy(a.x.data(), x.data(), x.numel());
      x.reset();
    } else {
      x.retag(Mem::checkpoints);
      a.x = std::move(x);
    }
  } else {
    a.x = std::move(x);
    a.x2 = std::move(x2);
  }
  if (static_cast<int>(i) == inject_nan_layer_) {
    out.data()[0] = std::numeric_limits<float>::quiet_NaN();
    inject_nan_layer_ = -1;
  }
  return out;
}

// The end of a block's backward: the gradient of the block's input norm output, reduced over TP
// (reduce-scatter under SP), through the RMSNorm into the residual stream's gradient dy; the
// block's saved input and 1/rms are released.
void Model::norm_backward_into(Tensor& dy, Tensor dnorm_partial, int64_t u, int norm_param, Tensor& x, Tensor& rstd) {
  const int64_t h = l_.hidden, Tsp = l_.tokens_sp;
  Tensor dn = reduce_partial(std::move(dnorm_partial), Mem::workspace);
  Tensor dx = be_.alloc(Tsp, h, Mem::workspace);
  be_.rmsnorm_backward(dx.data(), ps_.grad(u, norm_param), dn.data(), x.data(), rstd.data(), ps_.weight(u, norm_param),
                       Tsp, h);
  be_.axpy(dy.data(), 1.0f, dx.data(), dx.numel());
  x.reset();
  rstd.reset();
}

void Model::mlp_block_backward(int64_t i, LayerActs& a, Tensor& dy) {
  const int64_t u = ps_.layer_unit(i), h = l_.hidden, T = l_.tokens, Tsp = l_.tokens_sp, F = l_.ffn;
  Tensor dyf_hold;
  const float* dyf = dy.data();
  if (l_.sp) { dyf_hold = gather_seq(dy, Mem::comm_buffers); dyf = dyf_hold.data(); }
  Tensor n2 = be_.alloc(Tsp, h, Mem::workspace);  // recomputed norm output (not saved)
  be_.rmsnorm_forward(n2.data(), a.rstd2.data(), a.x2.data(), ps_.weight(u, kNorm2), Tsp, h, kRmsEps);
  if (l_.sp) n2 = gather_seq(n2, Mem::comm_buffers);
  Tensor dn2 = be_.alloc(T, h, Mem::workspace);
  const int64_t chunks = a.gate ? 1 : mlp_chunks();
  const int64_t per = (T + chunks - 1) / chunks;
  for (int64_t r0 = 0; r0 < T; r0 += per) {
    const int64_t rows = std::min(per, T - r0);
    Tensor gate_c, up_c, act_c;
    const float *gate, *up, *act;
    if (a.gate) {
      gate = a.gate.data();
      up = a.up.data();
      if (!a.act) {  // selective recompute: the SwiGLU product
        a.act = be_.alloc(T, F, Mem::activations);
        be_.swiglu_forward(a.act.data(), gate, up, a.act.numel());
      }
      act = a.act.data();
    } else {  // tiled MLP: recompute this chunk
      gate_c = linear(n2.row(r0), rows, ps_.weight(u, kWg), F, h, Mem::workspace);
      up_c = linear(n2.row(r0), rows, ps_.weight(u, kWu), F, h, Mem::workspace);
      act_c = be_.alloc(rows, F, Mem::workspace);
      be_.swiglu_forward(act_c.data(), gate_c.data(), up_c.data(), act_c.numel());
      gate = gate_c.data();
      up = up_c.data();
      act = act_c.data();
    }
    const float* dyr = dyf + r0 * h;
    Tensor da = be_.alloc(rows, F, Mem::workspace);
    be_.gemm(false, false, rows, F, h, 1.0f, dyr, ps_.weight(u, kWd), 0.0f, da.data());        // dA = dY Wd
    be_.gemm(true, false, h, F, rows, 1.0f, dyr, act, 1.0f, ps_.grad(u, kWd));                  // dWd += dY^T A
    act_c.reset();
    Tensor dg = be_.alloc(rows, F, Mem::workspace), du = be_.alloc(rows, F, Mem::workspace);
    be_.swiglu_backward(dg.data(), du.data(), da.data(), gate, up, dg.numel());
    da.reset();
    const float* n2r = n2.row(r0);
    be_.gemm(true, false, F, h, rows, 1.0f, dg.data(), n2r, 1.0f, ps_.grad(u, kWg));
    be_.gemm(true, false, F, h, rows, 1.0f, du.data(), n2r, 1.0f, ps_.grad(u, kWu));
    be_.gemm(false, false, rows, h, F, 1.0f, dg.data(), ps_.weight(u, kWg), 0.0f, dn2.row(r0));
    be_.gemm(false, false, rows, h, F, 1.0f, du.data(), ps_.weight(u, kWu), 1.0f, dn2.row(r0));
  }
  a.gate.reset();
  a.up.reset();
  a.act.reset();
  n2.reset();
  dyf_hold.reset();
  norm_backward_into(dy, std::move(dn2), u, kNorm2, a.x2, a.rstd2);
}

void Model::attention_block_backward(int64_t i, const SequenceMeta& s, LayerActs& a, Tensor& dy) {
  const int64_t u = ps_.layer_unit(i), h = l_.hidden, d = l_.head_dim, T = l_.tokens, Tsp = l_.tokens_sp;
  const int64_t qd = l_.q_heads * d, kvd = l_.kv_heads * d;
  Tensor dyf_hold;
  const float* dyf = dy.data();
  if (l_.sp) { dyf_hold = gather_seq(dy, Mem::comm_buffers); dyf = dyf_hold.data(); }
  if (!a.o) attn_.forward(s, a.q, a.k, a.v, a.o, a.lse);  // selective recompute of the attention core
  Tensor dout = be_.alloc(T, qd, Mem::workspace);
  be_.gemm(false, false, T, qd, h, 1.0f, dyf, ps_.weight(u, kWo), 0.0f, dout.data());  // dO = dY Wo
  be_.gemm(true, false, h, qd, T, 1.0f, dyf, a.o.data(), 1.0f, ps_.grad(u, kWo));      // dWo += dY^T O
  dyf_hold.reset();
  Tensor dq = be_.alloc(T, qd, Mem::workspace), dk = be_.alloc(T, kvd, Mem::workspace),
         dv = be_.alloc(T, kvd, Mem::workspace);
  attn_.backward(s, a.q, a.k, a.v, a.o, a.lse, dout, dq, dk, dv);
  dout.reset();
  a.q.reset();
  a.k.reset();
  a.v.reset();
  a.o.reset();
  a.lse.reset();
  qkv_rope(i, s, dq, dk, true);  // gradient through the rotation: its transpose
  Tensor n1 = be_.alloc(Tsp, h, Mem::workspace);
  be_.rmsnorm_forward(n1.data(), a.rstd1.data(), a.x.data(), ps_.weight(u, kNorm1), Tsp, h, kRmsEps);
  if (l_.sp) n1 = gather_seq(n1, Mem::comm_buffers);
  be_.gemm(true, false, qd, h, T, 1.0f, dq.data(), n1.data(), 1.0f, ps_.grad(u, kWq));
  be_.gemm(true, false, kvd, h, T, 1.0f, dk.data(), n1.data(), 1.0f, ps_.grad(u, kWk));
  be_.gemm(true, false, kvd, h, T, 1.0f, dv.data(), n1.data(), 1.0f, ps_.grad(u, kWv));
  n1.reset();
  Tensor dn1 = be_.alloc(T, h, Mem::workspace);
  be_.gemm(false, false, T, h, qd, 1.0f, dq.data(), ps_.weight(u, kWq), 0.0f, dn1.data());
  be_.gemm(false, false, T, h, kvd, 1.0f, dk.data(), ps_.weight(u, kWk), 1.0f, dn1.data());
  be_.gemm(false, false, T, h, kvd, 1.0f, dv.data(), ps_.weight(u, kWv), 1.0f, dn1.data());
  dq.reset();
  dk.reset();
  dv.reset();
  norm_backward_into(dy, std::move(dn1), u, kNorm1, a.x, a.rstd1);
}

Tensor Model::layer_backward(int64_t i, const SequenceMeta& s, LayerActs& a, Tensor dy) {
  if (!a.rstd1) {  // full recompute: rematerialise the layer from its checkpoint
    Tensor x = be_.alloc(a.x.rows(), a.x.cols(), Mem::checkpoints);
    be_.copy(x.data(), a.x.data(), x.numel());
    a.x.reset();
    x.retag(Mem::activations);
    LayerActs full;
    int saved_inject = inject_nan_layer_;
    inject_nan_layer_ = -1;
    layer_forward(i, s, std::move(x), full, Keep::all);
    inject_nan_layer_ = saved_inject;
    a = std::move(full);
  }
  mlp_block_backward(i, a, dy);        // dy <- dy + d(MLP block)/d(x2)^T dy
  attention_block_backward(i, s, a, dy);  // dy <- dy + d(attention block)/dx^T dy
  return dy;
}

double Model::loss_forward_backward(const SequenceMeta& s, const Tensor& xl, Tensor& dxl, float token_weight) {
  const int64_t fu = ps_.final_unit(), h = l_.hidden, T = l_.tokens, Tsp = l_.tokens_sp;
  const int64_t Vr = l_.vocab_rows;
  const bool tied = m_.tied_embeddings;
  const float* head = tied ? ps_.weight(0, 0) : ps_.weight(fu, kHead);
  float* dhead = tied ? ps_.grad(0, 0) : ps_.grad(fu, kHead);
  Tensor rstd = be_.alloc(Tsp, 1, Mem::workspace);
  Tensor nf = be_.alloc(Tsp, h, Mem::workspace);
  be_.rmsnorm_forward(nf.data(), rstd.data(), xl.data(), ps_.weight(fu, kNormF), Tsp, h, kRmsEps);
  if (l_.sp) nf = gather_seq(nf, Mem::comm_buffers);
  Tensor dnf = be_.alloc(T, h, Mem::logits);  // gradient of the final hidden states, tile by tile
  const int64_t tile = pc_.plan.tiled_loss > 0 ? std::min(pc_.plan.tiled_loss, T) : T;
  double loss = 0;
  for (int64_t r0 = 0; r0 < T; r0 += tile) {
    const int64_t rows = std::min(tile, T - r0);
    Tensor logits = be_.alloc(rows, Vr, Mem::logits);
    be_.gemm(false, true, rows, Vr, h, 1.0f, nf.row(r0), head, 0.0f, logits.data());
    Tensor mx = be_.alloc(rows, 1, Mem::workspace), se = be_.alloc(rows, 2, Mem::workspace);
    Tensor lse = be_.alloc(rows, 1, Mem::workspace), wt = be_.alloc(rows, 1, Mem::workspace);
    be_.row_max(mx.data(), logits.data(), rows, Vr, l_.vocab_valid);
    pc_.tp->allreduce_max(mx.data(), rows);
    be_.sumexp_and_target(se.data(), logits.data(), mx.data(), s.labels.data() + r0, rows, Vr, l_.vocab_valid,
                          l_.vocab0);
    pc_.tp->allreduce_sum(se.data(), 2 * rows);
    for (int64_t r = 0; r < rows; ++r) {
      lse.data()[r] = mx.data()[r] + std::log(se.data()[2 * r]);
      const bool valid = s.labels[r0 + r] >= 0;
      wt.data()[r] = valid ? token_weight : 0.0f;
      if (valid) loss += static_cast<double>(lse.data()[r]) - se.data()[2 * r + 1];
    }
    be_.xent_grad_inplace(logits.data(), lse.data(), s.labels.data() + r0, wt.data(), rows, Vr, l_.vocab_valid,
                          l_.vocab0);
    be_.gemm(false, false, rows, h, Vr, 1.0f, logits.data(), head, 0.0f, dnf.row(r0));     // dX = dL W
    be_.gemm(true, false, Vr, h, rows, 1.0f, logits.data(), nf.row(r0), 1.0f, dhead);      // dW += dL^T X
  }
  nf.reset();
  Tensor dn = reduce_partial(std::move(dnf), Mem::workspace);
  dxl = be_.alloc(Tsp, h, Mem::workspace);
  be_.rmsnorm_backward(dxl.data(), ps_.grad(fu, kNormF), dn.data(), xl.data(), rstd.data(), ps_.weight(fu, kNormF),
                       Tsp, h);
  return loss;
}

MicroResult Model::forward_backward(const SequenceMeta& s, float token_weight) {
  MicroResult r;
  MemoryLedger& led = be_.ledger();
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  auto lap = [&](Phase p) {
    auto t1 = Clock::now();
    r.phase_seconds[static_cast<int>(p)] += std::chrono::duration<double>(t1 - t0).count();
    t0 = t1;
  };
  const int64_t L = m_.layers, h = l_.hidden, T = l_.tokens;
  led.set_phase(Phase::forward);
  ps_.acquire_weights(0);
  Tensor e = be_.alloc(T, h, Mem::workspace);
  be_.embedding_forward(e.data(), ps_.weight(0, 0), s.tokens.data(), T, h, l_.vocab0, l_.vocab_rows);
  ps_.release_weights(0);
  Tensor x = reduce_partial(std::move(e), Mem::activations);
  const Keep keep = pc_.plan.recompute == Recompute::none        ? Keep::all
                    : pc_.plan.recompute == Recompute::selective ? Keep::selective
                                                                 : Keep::checkpoint;
  std::vector<LayerActs> acts(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i) {
    ps_.acquire_weights(ps_.layer_unit(i));
    x = layer_forward(i, s, std::move(x), acts[i], keep);
    ps_.release_weights(ps_.layer_unit(i));
    if (r.first_bad_layer < 0 && !be_.all_finite(x.data(), x.numel())) r.first_bad_layer = static_cast<int>(i);
  }
  lap(Phase::forward);
  led.set_phase(Phase::loss);
  const int64_t fu = ps_.final_unit();
  ps_.acquire_weights(fu);
  ps_.acquire_grads(fu);
  if (m_.tied_embeddings) { ps_.acquire_weights(0); ps_.acquire_grads(0); }
  Tensor dx;
  r.loss_sum = loss_forward_backward(s, x, dx, token_weight);
  if (r.first_bad_layer < 0 && !std::isfinite(r.loss_sum)) r.first_bad_layer = static_cast<int>(L);
  ps_.release_weights(fu);
  if (m_.tied_embeddings) ps_.release_weights(0);
  ps_.finish_grads(fu);
  x.reset();
  lap(Phase::loss);
  led.set_phase(Phase::backward);
  for (int64_t i = L - 1; i >= 0; --i) {
    const int64_t u = ps_.layer_unit(i);
    ps_.acquire_weights(u);
    ps_.acquire_grads(u);
    dx = layer_backward(i, s, acts[i], std::move(dx));
    ps_.release_weights(u);
    ps_.finish_grads(u);
  }
  Tensor dxf_hold;
  const float* dxf = dx.data();
  if (l_.sp) { dxf_hold = gather_seq(dx, Mem::comm_buffers); dxf = dxf_hold.data(); }
  ps_.acquire_grads(0);
  be_.embedding_backward(ps_.grad(0, 0), dxf, s.tokens.data(), T, h, l_.vocab0, l_.vocab_rows);
  ps_.finish_grads(0);
  lap(Phase::backward);
  return r;
}

}  // namespace ctx::exec
