#include "executor/model.hpp"

#include <cmath>
#include <limits>

namespace ctx::exec {
namespace {
// parameter indices inside a layer unit and the final unit (params.cpp adds them in this order)
enum LayerParam { kNorm1, kWq, kWk, kWv, kWo, kNorm2, kWg, kWu, kWd };
enum FinalParam { kNormF, kHead };
constexpr float kRmsEps = 1e-5f;
// mark_time slots of one micro-batch, relative to its first
enum TimeSlot { kTimeStart, kTimeForward, kTimeLoss, kTimeBackward };
}  // namespace

Model::Model(Backend& be, ParallelContext& pc, const ModelSpec& m, const Layout& l, ParamStore& ps)
    : be_(be), pc_(pc), m_(m), l_(l), ps_(ps), attn_(be, pc, l), rope_(make_rope_table(m.rope, m.head_dim)) {
  if (!rope_.inv_freq.empty()) {
    inv_freq_ = be_.alloc(1, static_cast<int64_t>(rope_.inv_freq.size()), DType::f32, Mem::runtime);
    be_.upload(inv_freq_, rope_.inv_freq.data());
  }
}

Tensor Model::linear(View x, View w, Mem cat) {
  Tensor y = be_.alloc(x.rows(), w.rows(), l_.act, cat);
  be_.gemm(false, true, 1.0f, x, w, 0.0f, y);  // y = x W^T, W [out, in]
  return y;
}

Tensor Model::gather_seq(View x, Mem cat) {
  pc_.trace.add("tp_all_gather", SimStream::tp);
  Tensor out = be_.alloc(l_.tokens, x.cols(), x.dtype(), cat);
  pc_.tp->allgather(x, out);
  return out;
}

Tensor Model::reduce_partial(Tensor y, Mem cat) {
  if (l_.sp) {
    pc_.trace.add("tp_reduce_scatter", SimStream::tp);
    Tensor out = be_.alloc(l_.tokens_sp, y.cols(), y.dtype(), cat);
    pc_.tp->reduce_scatter(y, out);
    return out;
  }
  if (pc_.plan.tp > 1) {
    pc_.trace.add("tp_all_reduce", SimStream::tp);
    pc_.tp->allreduce_sum(y);
  }
  y.retag(cat);
  return y;
}

void Model::qkv_rope(int64_t i, const DeviceBatch& b, View q, View k, bool inverse) {
  if (m_.layer_position[i] != PositionKind::rope) return;  // NoPE layer
  be_.rope(q, l_.q_heads, l_.head_dim, b.pos, inv_freq_, rope_.rot_dim, rope_.attn_scale, inverse);
  be_.rope(k, l_.kv_heads, l_.head_dim, b.pos, inv_freq_, rope_.rot_dim, rope_.attn_scale, inverse);
}

Tensor Model::attention_block_forward(int64_t i, const DeviceBatch& b, const Tensor& x, LayerActs& a, Keep keep) {
  const int64_t u = ps_.layer_unit(i), h = l_.hidden, Tsp = l_.tokens_sp;
  Tensor rstd = be_.alloc(Tsp, 1, DType::f32, Mem::activations);
  Tensor n1 = be_.alloc(Tsp, h, l_.act, Mem::workspace);
  be_.rmsnorm_forward(n1, rstd, x, ps_.weight(u, kNorm1), kRmsEps);
  if (l_.sp) n1 = gather_seq(n1, Mem::comm_buffers);
  pc_.trace.add("norm_qkv_rope", SimStream::compute);
  Tensor q = linear(n1, ps_.weight(u, kWq), Mem::activations);
  Tensor k = linear(n1, ps_.weight(u, kWk), Mem::activations);
  Tensor v = linear(n1, ps_.weight(u, kWv), Mem::activations);
  n1.reset();
  qkv_rope(i, b, q, k, false);
  Tensor o, lse;
  attn_.forward(b, q, k, v, o, lse);
  pc_.trace.add("o_proj_residual_norm", SimStream::compute);
  Tensor y = reduce_partial(linear(o, ps_.weight(u, kWo), Mem::workspace), Mem::workspace);
  Tensor x2 = be_.alloc(Tsp, h, l_.act, Mem::activations);
  be_.copy(x2, x);
  be_.axpy(x2, 1.0f, y);
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
  Tensor rstd = be_.alloc(Tsp, 1, DType::f32, Mem::activations);
  Tensor n2 = be_.alloc(Tsp, h, l_.act, Mem::workspace);
  be_.rmsnorm_forward(n2, rstd, x2, ps_.weight(u, kNorm2), kRmsEps);
  if (l_.sp) n2 = gather_seq(n2, Mem::comm_buffers);
  pc_.trace.add("mlp", SimStream::compute);
  const int64_t chunks = mlp_chunks();
  Tensor y;
  if (chunks == 1) {
    Tensor gate = linear(n2, ps_.weight(u, kWg), Mem::activations);
    Tensor up = linear(n2, ps_.weight(u, kWu), Mem::activations);
    Tensor act = be_.alloc(T, F, l_.act, Mem::activations);
    be_.swiglu_forward(act, gate, up);
    y = linear(act, ps_.weight(u, kWd), Mem::workspace);
    if (keep != Keep::checkpoint) {
      a.gate = std::move(gate);
      a.up = std::move(up);
      if (keep == Keep::all) a.act = std::move(act);
    }
  } else {  // tiled MLP: one chunk of rows at a time, nothing of the chunk kept
    y = be_.alloc(T, h, l_.act, Mem::workspace);
    const int64_t per = (T + chunks - 1) / chunks;
    for (int64_t r0 = 0; r0 < T; r0 += per) {
      const int64_t rows = std::min(per, T - r0);
      Tensor gate = linear(n2.row_range(r0, rows), ps_.weight(u, kWg), Mem::workspace);
      Tensor up = linear(n2.row_range(r0, rows), ps_.weight(u, kWu), Mem::workspace);
      Tensor act = be_.alloc(rows, F, l_.act, Mem::workspace);  // the chunk's three tensors, as the untiled MLP has
      be_.swiglu_forward(act, gate, up);
      be_.gemm(false, true, 1.0f, act, ps_.weight(u, kWd), 0.0f, y.row_range(r0, rows));
    }
  }
  n2.reset();
  Tensor out = reduce_partial(std::move(y), Mem::activations);
  be_.axpy(out, 1.0f, x2);
  if (keep != Keep::checkpoint) a.rstd2 = std::move(rstd);
  return out;
}

int64_t Model::mlp_chunks() const {
  const Plan& p = pc_.plan;
  if (p.tiled_mlp < 0) return std::max<int64_t>(1, (l_.tokens + l_.hidden - 1) / l_.hidden);  // ALST's ceil(T/h)
  return std::max<int64_t>(1, std::min(p.tiled_mlp, l_.tokens));
}

Tensor Model::layer_forward(int64_t i, const DeviceBatch& b, Tensor x, LayerActs& a, Keep keep) {
  pc_.trace.layer = static_cast<int>(i);
  Tensor x2 = attention_block_forward(i, b, x, a, keep);
  Tensor out = mlp_block_forward(i, x2, a, keep);
  if (keep == Keep::checkpoint) {
    if (pc_.plan.ckpt_offload) {  // to host memory on the copy stream, behind the next layer
      pc_.trace.add("ckpt_d2h", SimStream::host);
      a.x = be_.alloc_host(x.rows(), x.cols(), x.dtype(), HostMem::checkpoints);
      x.retag(Mem::checkpoints);
      a.copy = be_.copy_async(a.x, x);
      a.x_device = std::move(x);  // in flight until settle_offload
    } else {
      x.retag(Mem::checkpoints);
      a.x = std::move(x);
    }
  } else {
    a.x = std::move(x);
    a.x2 = std::move(x2);
  }
  if (static_cast<int>(i) == inject_nan_layer_) {
    be_.fill(out.flat(0, 1), std::numeric_limits<float>::quiet_NaN());
    inject_nan_layer_ = -1;
  }
  return out;
}

// The end of a block's backward: the gradient of the block's input norm output, reduced over TP
// (reduce-scatter under SP), through the RMSNorm into the residual stream's gradient dy; the
// block's saved input and 1/rms are released.
void Model::norm_backward_into(Tensor& dy, Tensor dnorm_partial, int64_t u, int norm_param, Tensor& x, Tensor& rstd) {
  Tensor dn = reduce_partial(std::move(dnorm_partial), Mem::workspace);
  Tensor dx = be_.alloc(l_.tokens_sp, l_.hidden, l_.act, Mem::workspace);
  be_.rmsnorm_backward(dx, ps_.grad(u, norm_param), dn, x, rstd, ps_.weight(u, norm_param));
  be_.axpy(dy, 1.0f, dx);
  x.reset();
  rstd.reset();
}

void Model::mlp_block_backward(int64_t i, LayerActs& a, Tensor& dy) {
  const int64_t u = ps_.layer_unit(i), h = l_.hidden, T = l_.tokens, Tsp = l_.tokens_sp, F = l_.ffn;
  Tensor dyf_hold;
  View dyf = dy;
  if (l_.sp) { dyf_hold = gather_seq(dy, Mem::comm_buffers); dyf = dyf_hold; }
  Tensor n2 = be_.alloc(Tsp, h, l_.act, Mem::workspace);  // recomputed norm output (not saved)
  be_.rmsnorm_forward(n2, a.rstd2, a.x2, ps_.weight(u, kNorm2), kRmsEps);
  if (l_.sp) n2 = gather_seq(n2, Mem::comm_buffers);
  Tensor dn2 = be_.alloc(T, h, l_.act, Mem::workspace);
  pc_.trace.add("mlp_bwd", SimStream::compute);
  const int64_t chunks = a.gate ? 1 : mlp_chunks();
  const int64_t per = (T + chunks - 1) / chunks;
  for (int64_t r0 = 0; r0 < T; r0 += per) {
    const int64_t rows = std::min(per, T - r0);
    Tensor gate_c, up_c, act_c;
    View gate, up, act;
    if (a.gate) {
      gate = a.gate;
      up = a.up;
      if (!a.act) {  // selective recompute: the SwiGLU product
        a.act = be_.alloc(T, F, l_.act, Mem::activations);
        be_.swiglu_forward(a.act, gate, up);
      }
      act = a.act;
    } else {  // tiled MLP: recompute this chunk
      gate_c = linear(n2.row_range(r0, rows), ps_.weight(u, kWg), Mem::workspace);
      up_c = linear(n2.row_range(r0, rows), ps_.weight(u, kWu), Mem::workspace);
      act_c = be_.alloc(rows, F, l_.act, Mem::workspace);
      be_.swiglu_forward(act_c, gate_c, up_c);
      gate = gate_c;
      up = up_c;
      act = act_c;
    }
    const View dyr = dyf.row_range(r0, rows);
    Tensor da = be_.alloc(rows, F, l_.act, Mem::workspace);
    be_.gemm(false, false, 1.0f, dyr, ps_.weight(u, kWd), 0.0f, da);  // dA = dY Wd
    be_.gemm(true, false, 1.0f, dyr, act, 1.0f, ps_.grad(u, kWd));    // dWd += dY^T A
    act_c.reset();
    Tensor dg = be_.alloc(rows, F, l_.act, Mem::workspace), du = be_.alloc(rows, F, l_.act, Mem::workspace);
    be_.swiglu_backward(dg, du, da, gate, up);
    da.reset();
    const View n2r = n2.row_range(r0, rows);
    be_.gemm(true, false, 1.0f, dg, n2r, 1.0f, ps_.grad(u, kWg));
    be_.gemm(true, false, 1.0f, du, n2r, 1.0f, ps_.grad(u, kWu));
    be_.gemm(false, false, 1.0f, dg, ps_.weight(u, kWg), 0.0f, dn2.row_range(r0, rows));
    be_.gemm(false, false, 1.0f, du, ps_.weight(u, kWu), 1.0f, dn2.row_range(r0, rows));
  }
  a.gate.reset();
  a.up.reset();
  a.act.reset();
  n2.reset();
  dyf_hold.reset();
  norm_backward_into(dy, std::move(dn2), u, kNorm2, a.x2, a.rstd2);
}

void Model::attention_block_backward(int64_t i, const DeviceBatch& b, LayerActs& a, Tensor& dy) {
  const int64_t u = ps_.layer_unit(i), h = l_.hidden, d = l_.head_dim, T = l_.tokens, Tsp = l_.tokens_sp;
  const int64_t qd = l_.q_heads * d, kvd = l_.kv_heads * d;
  Tensor dyf_hold;
  View dyf = dy;
  if (l_.sp) { dyf_hold = gather_seq(dy, Mem::comm_buffers); dyf = dyf_hold; }
  if (!a.o) {  // selective recompute of the attention core
    pc_.trace.pass = SimPass::recompute;
    attn_.forward(b, a.q, a.k, a.v, a.o, a.lse);
    pc_.trace.pass = SimPass::backward;
  }
  pc_.trace.add("o_proj_residual_norm_bwd", SimStream::compute);
  Tensor dout = be_.alloc(T, qd, l_.act, Mem::workspace);
  be_.gemm(false, false, 1.0f, dyf, ps_.weight(u, kWo), 0.0f, dout);  // dO = dY Wo
  be_.gemm(true, false, 1.0f, dyf, a.o, 1.0f, ps_.grad(u, kWo));      // dWo += dY^T O
  dyf_hold.reset();
  Tensor dq = be_.alloc(T, qd, l_.act, Mem::workspace), dk = be_.alloc(T, kvd, l_.act, Mem::workspace),
         dv = be_.alloc(T, kvd, l_.act, Mem::workspace);
  attn_.backward(b, a.q, a.k, a.v, a.o, a.lse, dout, dq, dk, dv);
  dout.reset();
  a.q.reset();
  a.k.reset();
  a.v.reset();
  a.o.reset();
  a.lse.reset();
  qkv_rope(i, b, dq, dk, true);  // gradient through the rotation: its transpose
  Tensor n1 = be_.alloc(Tsp, h, l_.act, Mem::workspace);
  be_.rmsnorm_forward(n1, a.rstd1, a.x, ps_.weight(u, kNorm1), kRmsEps);
  if (l_.sp) n1 = gather_seq(n1, Mem::comm_buffers);
  pc_.trace.add("norm_qkv_rope_bwd", SimStream::compute);
  be_.gemm(true, false, 1.0f, dq, n1, 1.0f, ps_.grad(u, kWq));
  be_.gemm(true, false, 1.0f, dk, n1, 1.0f, ps_.grad(u, kWk));
  be_.gemm(true, false, 1.0f, dv, n1, 1.0f, ps_.grad(u, kWv));
  n1.reset();
  Tensor dn1 = be_.alloc(T, h, l_.act, Mem::workspace);
  be_.gemm(false, false, 1.0f, dq, ps_.weight(u, kWq), 0.0f, dn1);
  be_.gemm(false, false, 1.0f, dk, ps_.weight(u, kWk), 1.0f, dn1);
  be_.gemm(false, false, 1.0f, dv, ps_.weight(u, kWv), 1.0f, dn1);
  dq.reset();
  dk.reset();
  dv.reset();
  norm_backward_into(dy, std::move(dn1), u, kNorm1, a.x, a.rstd1);
}

// Full recompute with offload: layer i's checkpoint back on the device (while layer i+1's backward
// runs: the prefetch the simulator prices).
void Model::fetch_checkpoint(int64_t i, LayerActs& a) {
  if (!a.x || !a.x.on_host() || a.x_device) return;
  pc_.trace.add_at("ckpt_h2d", SimStream::host, i);
  a.x_device = be_.alloc(a.x.rows(), a.x.cols(), a.x.dtype(), Mem::checkpoints);
  a.copy = be_.copy_async(a.x_device, a.x);
}

// A copy-stream transfer of a checkpoint is done: to the host (the device copy is released) or,
// `back`, to the device (the host copy is released and the device one is the checkpoint again).
void Model::settle_offload(LayerActs& a, bool back) {
  if (!a.x_device) return;
  be_.wait_copy(a.copy);
  a.copy = {};
  if (back) a.x = std::move(a.x_device);
  else a.x_device.reset();
}

Tensor Model::layer_backward(int64_t i, const DeviceBatch& b, LayerActs& a, Tensor dy) {
  pc_.trace.layer = static_cast<int>(i);
  if (!a.rstd1) {  // full recompute: rematerialise the layer from its checkpoint
    if (pc_.plan.ckpt_offload) pc_.trace.add("checkpoint_ready", SimStream::compute);
    fetch_checkpoint(i, a);  // a no-op when prefetched
    settle_offload(a, true);
    Tensor x = std::move(a.x);  // the checkpoint becomes the layer's input (freed with it)
    x.retag(Mem::activations);
    LayerActs full;
    int saved_inject = inject_nan_layer_;
    inject_nan_layer_ = -1;
    pc_.trace.pass = SimPass::recompute;
    layer_forward(i, b, std::move(x), full, Keep::all);
    pc_.trace.pass = SimPass::backward;
    pc_.trace.layer = static_cast<int>(i);
    inject_nan_layer_ = saved_inject;
    a = std::move(full);
  }
  mlp_block_backward(i, a, dy);          // dy <- dy + d(MLP block)/d(x2)^T dy
  attention_block_backward(i, b, a, dy);  // dy <- dy + d(attention block)/dx^T dy
  return dy;
}

void Model::loss_forward_backward(const DeviceBatch& b, const Tensor& xl, Tensor& dxl, float token_weight,
                                  View stats) {
  const int64_t fu = ps_.final_unit(), h = l_.hidden, T = l_.tokens, Tsp = l_.tokens_sp;
  const int64_t Vr = l_.vocab_rows;
  const bool tied = m_.tied_embeddings;
  const View head = tied ? ps_.weight(0, 0) : ps_.weight(fu, kHead);
  const View dhead = tied ? ps_.grad(0, 0) : ps_.grad(fu, kHead);
  Tensor rstd = be_.alloc(Tsp, 1, DType::f32, Mem::workspace);
  Tensor nf = be_.alloc(Tsp, h, l_.act, Mem::workspace);
  be_.rmsnorm_forward(nf, rstd, xl, ps_.weight(fu, kNormF), kRmsEps);
  if (l_.sp) nf = gather_seq(nf, Mem::comm_buffers);
  Tensor dnf = be_.alloc(T, h, l_.act, Mem::logits);  // gradient of the final hidden states, tile by tile
  // tiled_loss=auto: ALST's ~1 GiB fp32 tiles, as the memory model prices them (memory_model.hpp)
  const int64_t tile = static_cast<int64_t>(loss_tile_rows(pc_.plan.tiled_loss, static_cast<double>(T), static_cast<double>(Vr)));
  for (int64_t r0 = 0; r0 < T; r0 += tile) {
    const int64_t rows = std::min(tile, T - r0);
    const View target = b.labels.row_range(r0, rows);
    Tensor logits = be_.alloc(rows, Vr, DType::f32, Mem::logits);
    if (r0 == 0) pc_.trace.add("head_loss", SimStream::compute);  // pass: forward
    be_.gemm(false, true, 1.0f, nf.row_range(r0, rows), head, 0.0f, logits);
    // per-row statistics: max, [sumexp, target logit], lse (kLossRowStats = 4 floats per row)
    Tensor mx = be_.alloc(rows, 1, DType::f32, Mem::workspace), se = be_.alloc(rows, 2, DType::f32, Mem::workspace);
    Tensor lse = be_.alloc(rows, 1, DType::f32, Mem::workspace);
    be_.row_max(mx, logits, l_.vocab_valid);
    if (r0 > 0) pc_.trace.pass = SimPass::backward;  // later tiles' statistics follow the first tile's gradient
    if (pc_.plan.tp > 1) pc_.trace.add("loss_tp_all_reduce", SimStream::tp);
    pc_.tp->allreduce_max(mx);
    be_.sumexp_and_target(se, logits, mx, target, l_.vocab_valid, l_.vocab0);
    if (pc_.plan.tp > 1) pc_.trace.add("loss_tp_all_reduce", SimStream::tp);
    pc_.tp->allreduce_sum(se);
    be_.xent_finish(lse, stats, mx, se, target);
    be_.xent_grad_inplace(logits, lse, target, token_weight, l_.vocab_valid, l_.vocab0);
    if (r0 == 0) {
      pc_.trace.pass = SimPass::backward;
      pc_.trace.add("head_loss_bwd", SimStream::compute);
    }
    be_.gemm(false, false, 1.0f, logits, head, 0.0f, dnf.row_range(r0, rows));    // dX = dL W
    be_.gemm(true, false, 1.0f, logits, nf.row_range(r0, rows), 1.0f, dhead);     // dW += dL^T X
  }
  nf.reset();
  pc_.trace.pass = SimPass::backward;
  Tensor dn = reduce_partial(std::move(dnf), Mem::workspace);
  dxl = be_.alloc(Tsp, h, l_.act, Mem::workspace);
  be_.rmsnorm_backward(dxl, ps_.grad(fu, kNormF), dn, xl, rstd, ps_.weight(fu, kNormF));
}

void Model::forward_backward(const DeviceBatch& b, float token_weight, View stats, int time_slot0, bool last) {
  MemoryLedger& led = be_.ledger();
  ScheduleTrace& tr = pc_.trace;
  const int64_t L = m_.layers, h = l_.hidden, T = l_.tokens;
  be_.mark_time(time_slot0 + kTimeStart);
  led.set_phase(Phase::forward);
  be_.annotate_phase("forward");
  tr.pass = SimPass::forward;
  tr.layer = -1;
  ps_.acquire_weights(0);
  Tensor e = be_.alloc(T, h, l_.act, Mem::workspace);
  tr.add("embedding", SimStream::compute);
  be_.embedding_forward(e, ps_.weight(0, 0), b.tokens, l_.vocab0);
  ps_.release_weights(0);
  Tensor x = reduce_partial(std::move(e), Mem::activations);
  const Keep keep = pc_.plan.recompute == Recompute::none        ? Keep::all
                    : pc_.plan.recompute == Recompute::selective ? Keep::selective
                                                                 : Keep::checkpoint;
  std::vector<LayerActs> acts(static_cast<size_t>(L));
  ps_.acquire_weights(ps_.layer_unit(0));
  for (int64_t i = 0; i < L; ++i) {
    if (i + 1 < L) ps_.acquire_weights(ps_.layer_unit(i + 1));  // ZeRO-3: the next layer's gather behind this one
    x = layer_forward(i, b, std::move(x), acts[i], keep);
    if (i >= 1) settle_offload(acts[i - 1], false);  // the previous checkpoint's copy ran behind this layer
    ps_.release_weights(ps_.layer_unit(i));
    be_.flag_nonfinite(stats, x, nonfinite_code(i, L));  // on the device: no host read per layer
  }
  be_.mark_time(time_slot0 + kTimeForward);
  led.set_phase(Phase::loss);
  be_.annotate_phase("loss");
  tr.layer = -1;
  const int64_t fu = ps_.final_unit();
  ps_.acquire_weights(fu);
  ps_.acquire_grads(fu);
  if (m_.tied_embeddings) { ps_.acquire_weights(0); ps_.acquire_grads(0); }
  Tensor dx;
  loss_forward_backward(b, x, dx, token_weight, stats);
  be_.flag_nonfinite(stats, stats.flat(kStatLossSum, 1), nonfinite_code(L, L));
  ps_.release_weights(fu);
  if (m_.tied_embeddings) ps_.release_weights(0);
  tr.pass = SimPass::backward;
  ps_.finish_grads(fu, last);
  x.reset();
  settle_offload(acts[L - 1], false);  // the last checkpoint's copy ran behind the loss
  be_.mark_time(time_slot0 + kTimeLoss);
  led.set_phase(Phase::backward);
  be_.annotate_phase("backward");
  // the last layer's parameters and checkpoint; inside the loop, layer i-1's behind layer i
  ps_.acquire_weights(ps_.layer_unit(L - 1));
  fetch_checkpoint(L - 1, acts[L - 1]);
  for (int64_t i = L - 1; i >= 0; --i) {
    const int64_t u = ps_.layer_unit(i);
    if (i >= 1) {
      ps_.acquire_weights(ps_.layer_unit(i - 1));
      fetch_checkpoint(i - 1, acts[i - 1]);
    }
    ps_.acquire_grads(u);
    dx = layer_backward(i, b, acts[i], std::move(dx));
    ps_.release_weights(u);
    ps_.finish_grads(u, last);
  }
  tr.layer = -1;
  Tensor dxf_hold;
  View dxf = dx;
  if (l_.sp) { dxf_hold = gather_seq(dx, Mem::comm_buffers); dxf = dxf_hold; }
  ps_.acquire_grads(0);
  tr.add("embedding_bwd", SimStream::compute);
  be_.embedding_backward(ps_.grad(0, 0), dxf, b.tokens, l_.vocab0);
  ps_.finish_grads(0, last);
  be_.mark_time(time_slot0 + kTimeBackward);
}

}  // namespace ctx::exec
