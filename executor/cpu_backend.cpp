// The CPU reference backend: GEMMs on Eigen, the model's kernels as plain loops in float with
// double accumulation where a sum runs over a whole row. bf16 tensors are stored as bfloat16
// (round to nearest even) and computed in fp32: an op widens its bf16 inputs into scratch
// buffers, computes as for f32 and rounds its outputs once, as a bf16 GPU kernel with fp32
// arithmetic does. Three modes (backend.hpp): plain, guarded (cpu_guarded_arena.hpp), deferred
// (every op on a worker thread, in order).
#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <new>
#include <thread>

#include "executor/backend.hpp"
#include "executor/bf16.hpp"
#include "executor/cpu_guarded_arena.hpp"

namespace ctx::exec {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapC = Eigen::Map<const RowMat>;
using Map = Eigen::Map<RowMat>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kMaxHeadDim = 1024;
constexpr int kScratchSlots = 8;

[[noreturn]] void bad(const std::string& op, const std::string& what) {
  throw std::logic_error("cpu backend: " + op + ": " + what);
}
void need(bool ok, const char* op, const char* what) {
  if (!ok) bad(op, what);
}
bool is_float(DType t) { return t == DType::f32 || t == DType::bf16; }

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(bool guarded) : t0_(std::chrono::steady_clock::now()) {
    if (guarded) {
      arena_ = std::make_unique<GuardedArena>(guarded_arena_bytes());
      off_ = arena_->rw_offset();
    }
  }
  std::string name() const override { return arena_ ? "cpu-guarded" : "cpu"; }

  // ---- host boundary
  void upload(View dst, const float* src) override {
    need(is_float(dst.dtype()), "upload", "float data into a non-float tensor");
    if (dst.dtype() == DType::f32) std::memcpy(at<float>(dst), src, dst.bytes());
    else {
      uint16_t* d = at<uint16_t>(dst);
      for (int64_t i = 0; i < dst.numel(); ++i) d[i] = f32_to_bf16(src[i]);
    }
  }
  void upload(View dst, const int32_t* src) override {
    need(dst.dtype() == DType::i32, "upload", "int32 data into a non-i32 tensor");
    std::memcpy(at<int32_t>(dst), src, dst.bytes());
  }
  void upload(View dst, const int64_t* src) override {
    need(dst.dtype() == DType::i64, "upload", "int64 data into a non-i64 tensor");
    std::memcpy(at<int64_t>(dst), src, dst.bytes());
  }
  void download(float* dst, View src) override {
    synchronize();
    do_download(dst, src);
  }
  void synchronize() override {}

  // ---- data movement
  void copy(View dst, View src) override {
    need(dst.numel() == src.numel(), "copy", "element counts differ");
    if (dst.dtype() == src.dtype()) {
      if (!dst.same_memory(src)) std::memmove(at<char>(dst), at<char>(src), src.bytes());
      return;
    }
    need(is_float(dst.dtype()) && is_float(src.dtype()), "copy", "converts only between f32 and bf16");
    const float* s = in(src, 0);
    float* d = out(dst, 1, false);
    std::memcpy(d, s, src.numel() * sizeof(float));
    commit(dst, d);
  }
  void zero(View x) override { std::memset(at<char>(x), 0, x.bytes()); }
  void fill(View x, float value) override {
    float* p = out(x, 0, false);
    std::fill(p, p + x.numel(), value);
    commit(x, p);
  }
  void axpy(View y, float alpha, View x) override {
    need(x.numel() == y.numel(), "axpy", "element counts differ");
    const float* xs = in(x, 0);
    float* ys = out(y, 1, true);
    for (int64_t i = 0; i < y.numel(); ++i) ys[i] += alpha * xs[i];
    commit(y, ys);
  }
  void scale(View x, float alpha) override {
    float* p = out(x, 0, true);
    for (int64_t i = 0; i < x.numel(); ++i) p[i] *= alpha;
    commit(x, p);
  }
  void copy_cols(View dst, int64_t dc, View src, int64_t sc, int64_t n) override {
    check_cols("copy_cols", dst, dc, src, sc, n);
    need(dst.dtype() == src.dtype(), "copy_cols", "dtypes differ");
    const int64_t e = dtype_bytes(dst.dtype());
    for (int64_t r = 0; r < dst.rows(); ++r)
      std::memcpy(at<char>(dst) + (r * dst.cols() + dc) * e, at<char>(src) + (r * src.cols() + sc) * e, n * e);
  }
  void add_cols(View dst, int64_t dc, View src, int64_t sc, int64_t n) override {
    check_cols("add_cols", dst, dc, src, sc, n);
    const float* s = in(src, 0);
    float* d = out(dst, 1, true);
    for (int64_t r = 0; r < dst.rows(); ++r)
      for (int64_t c = 0; c < n; ++c) d[r * dst.cols() + dc + c] += s[r * src.cols() + sc + c];
    commit(dst, d);
  }

  // ---- GEMM
  void gemm(bool ta, bool tb, float alpha, View a, View b, float beta, View c) override {
    const int64_t m = c.rows(), n = c.cols(), k = ta ? a.rows() : a.cols();
    need((ta ? a.cols() : a.rows()) == m, "gemm", "op(A) rows differ from C rows");
    need(tb ? (b.rows() == n && b.cols() == k) : (b.rows() == k && b.cols() == n), "gemm", "op(B) is not [k, n]");
    const float* A = in(a, 0);
    const float* B = in(b, 1);
    float* Cp = out(c, 2, beta != 0.0f);
    Map C(Cp, m, n);
    if (beta == 0.0f) C.setZero();
    else if (beta != 1.0f) C *= beta;
    if (m > 0 && n > 0 && k > 0) {
      if (!ta && !tb) C.noalias() += alpha * (MapC(A, m, k) * MapC(B, k, n));
      else if (!ta && tb) C.noalias() += alpha * (MapC(A, m, k) * MapC(B, n, k).transpose());
      else if (ta && !tb) C.noalias() += alpha * (MapC(A, k, m).transpose() * MapC(B, k, n));
      else C.noalias() += alpha * (MapC(A, k, m).transpose() * MapC(B, n, k).transpose());
    }
    commit(c, Cp);
  }

  // ---- model kernels
  void rmsnorm_forward(View y, View rstd, View x, View w, float eps) override {
    const int64_t rows = x.rows(), h = x.cols();
    need(rstd.dtype() == DType::f32 && rstd.numel() == rows, "rmsnorm_forward", "rstd must be f32 [rows]");
    need(w.numel() == h && (!y || y.numel() == x.numel()), "rmsnorm_forward", "shapes differ");
    const float* X = in(x, 0);
    const float* W = in(w, 1);
    float* Y = y ? out(y, 2, false) : nullptr;
    float* S = at<float>(rstd);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = X + r * h;
      double ss = 0;
      for (int64_t i = 0; i < h; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      float s = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(h) + eps));
      S[r] = s;
      if (Y)
        for (int64_t i = 0; i < h; ++i) Y[r * h + i] = xr[i] * s * W[i];
    }
    if (y) commit(y, Y);
  }

  void rmsnorm_backward(View dx, View dw, View dy, View x, View rstd, View w) override {
    // y_i = w_i x_i s, s = (mean(x^2)+eps)^-1/2: dx_i = s (w_i dy_i) - x_i s^3 / h * sum_j w_j dy_j x_j
    const int64_t rows = x.rows(), h = x.cols();
    need(dw.dtype() == DType::f32 && dw.numel() == h, "rmsnorm_backward", "dw must be f32 [h]");
    const float* X = in(x, 0);
    const float* DY = in(dy, 1);
    const float* W = in(w, 2);
    float* DX = out(dx, 3, false);
    float* DW = at<float>(dw);
    const float* S = at<float>(rstd);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = X + r * h;
      const float* dyr = DY + r * h;
      float s = S[r];
      double dot = 0;
      for (int64_t i = 0; i < h; ++i) {
        dot += static_cast<double>(W[i]) * dyr[i] * xr[i];
        DW[i] += dyr[i] * xr[i] * s;
      }
      float c = static_cast<float>(dot) * s * s * s / static_cast<float>(h);
      for (int64_t i = 0; i < h; ++i) DX[r * h + i] = s * W[i] * dyr[i] - xr[i] * c;
    }
    commit(dx, DX);
  }

  void rope(View x, int64_t heads, int64_t d, View pos, View inv_freq, int64_t rot, float attn_scale,
            bool inverse) override {
    const int64_t rows = x.rows(), half = rot / 2;
    need(x.cols() == heads * d && pos.numel() == rows, "rope", "x must be [rows, heads*head_dim], pos [rows]");
    float* X = out(x, 0, true);
    const int32_t* P = i32(pos, "rope");
    const float* F = at<float>(inv_freq);
    const float sign = inverse ? -1.0f : 1.0f;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < half; ++i) {
        double ang = static_cast<double>(P[r]) * F[i];
        float c = static_cast<float>(std::cos(ang)) * attn_scale;
        float s = static_cast<float>(std::sin(ang)) * attn_scale * sign;
        for (int64_t hh = 0; hh < heads; ++hh) {
          float* xh = X + (r * heads + hh) * d;
          float x1 = xh[i], x2 = xh[i + half];
          xh[i] = x1 * c - x2 * s;
          xh[i + half] = x2 * c + x1 * s;
        }
      }
    }
    commit(x, X);
  }

  void swiglu_forward(View a, View gate, View up) override {
    const float* G = in(gate, 0);
    const float* U = in(up, 1);
    float* A = out(a, 2, false);
    for (int64_t i = 0; i < a.numel(); ++i) {
      float g = G[i];
      float sig = 1.0f / (1.0f + std::exp(-g));
      A[i] = g * sig * U[i];
    }
    commit(a, A);
  }
  void swiglu_backward(View dgate, View dup, View da, View gate, View up) override {
    const float* G = in(gate, 0);
    const float* U = in(up, 1);
    const float* DA = in(da, 2);
    float* DG = out(dgate, 3, false);
    float* DU = out(dup, 4, false);
    for (int64_t i = 0; i < da.numel(); ++i) {
      float g = G[i];
      float sig = 1.0f / (1.0f + std::exp(-g));
      float silu = g * sig;
      DU[i] = DA[i] * silu;
      DG[i] = DA[i] * U[i] * sig * (1.0f + g * (1.0f - sig));
    }
    commit(dgate, DG);
    commit(dup, DU);
  }

  void embedding_forward(View out_v, View table, View tok, int64_t v0) override {
    const int64_t h = table.cols(), vrows = table.rows(), tokens = tok.numel();
    need(out_v.rows() == tokens && out_v.cols() == h && out_v.dtype() == table.dtype(), "embedding_forward",
         "out must be [tokens, h] of the table's dtype");
    const int32_t* T = i32(tok, "embedding_forward");
    const int64_t e = dtype_bytes(table.dtype());
    for (int64_t t = 0; t < tokens; ++t) {
      int64_t r = T[t] - v0;
      char* dst = at<char>(out_v) + t * h * e;
      if (r >= 0 && r < vrows) std::memcpy(dst, at<char>(table) + r * h * e, h * e);
      else std::memset(dst, 0, h * e);
    }
  }
  void embedding_backward(View dtable, View dout, View tok, int64_t v0) override {
    const int64_t h = dtable.cols(), vrows = dtable.rows(), tokens = tok.numel();
    need(dtable.dtype() == DType::f32, "embedding_backward", "dtable must be f32");
    const int32_t* T = i32(tok, "embedding_backward");
    const float* D = in(dout, 0);
    float* DT = at<float>(dtable);
    for (int64_t t = 0; t < tokens; ++t) {
      int64_t r = T[t] - v0;
      if (r >= 0 && r < vrows)
        for (int64_t i = 0; i < h; ++i) DT[r * h + i] += D[t * h + i];
    }
  }

  // ---- attention
  void attention_forward_block(View o, View lse, View q, TokenRefs qt, View k, View v, const KeyBlock& kb,
                               const AttnShape& s) override {
    const int64_t d = s.head_dim, hq = s.q_heads, hkv = s.kv_heads, group = hq / hkv, tq = q.rows();
    need(d <= kMaxHeadDim && lse.dtype() == DType::f32, "attention_forward_block", "head_dim > 1024 or lse not f32");
    need(kb.kv_range.numel() == 2 * tq, "attention_forward_block", "kv_range must be [tq, 2]");
    const float* Q = in(q, 0);
    const float* K = in(k, 1);
    const float* V = in(v, 2);
    float* O = out(o, 3, true);
    float* L = at<float>(lse);
    const int64_t* qi_idx = i64(qt.index, "attention");
    const int32_t* qi_doc = i32(qt.doc, "attention");
    const int64_t* k_idx = i64(kb.keys.index, "attention");
    const int32_t* k_doc = i32(kb.keys.doc, "attention");
    const int32_t* range = i32(kb.kv_range, "attention");
    float acc[kMaxHeadDim];
    int64_t pairs = 0;  // pairs the mask keeps, counted once (on the first head) as they are evaluated
    for (int64_t i = 0; i < tq; ++i) {
      const int64_t lo = range[2 * i], hi = range[2 * i + 1];
      if (lo >= hi) continue;  // no visible key in this block
      for (int64_t h = 0; h < hq; ++h) {
        const float* qv = Q + (i * hq + h) * d;
        const int64_t kvh = h / group;
        float mx = kNegInf, sum = 0;
        std::fill(acc, acc + d, 0.0f);
        for (int64_t j = lo; j < hi; ++j) {
          if (k_idx[j] > qi_idx[i] || k_doc[j] != qi_doc[i]) continue;
          pairs += (h == 0);
          const float* kj = K + (j * hkv + kvh) * d;
          float sc = 0;
          for (int64_t e = 0; e < d; ++e) sc += qv[e] * kj[e];
          sc *= s.scale;
          if (sc > mx) {  // online softmax: rescale what was accumulated under the old maximum
            float f = std::exp(mx - sc);
            sum *= f;
            for (int64_t e = 0; e < d; ++e) acc[e] *= f;
            mx = sc;
          }
          float p = std::exp(sc - mx);
          sum += p;
          const float* vj = V + (j * hkv + kvh) * d;
          for (int64_t e = 0; e < d; ++e) acc[e] += p * vj[e];
        }
        if (sum == 0) continue;
        float blk_lse = mx + std::log(sum);
        float* oi = O + (i * hq + h) * d;
        float& l = L[i * hq + h];
        if (l == kNegInf) {
          for (int64_t e = 0; e < d; ++e) oi[e] = acc[e] / sum;
          l = blk_lse;
        } else {
          // stable merge: new = max + log1p(exp(-|a-b|)); weights exp(a-new), exp(b-new) <= 1
          float top = std::max(l, blk_lse), low = std::min(l, blk_lse);
          float nl = top + std::log1p(std::exp(low - top));
          float w_old = std::exp(l - nl), w_new = std::exp(blk_lse - nl) / sum;
          for (int64_t e = 0; e < d; ++e) oi[e] = oi[e] * w_old + acc[e] * w_new;
          l = nl;
        }
      }
    }
    commit(o, O);
    attention_pairs_.fetch_add(pairs, std::memory_order_relaxed);
  }
  int64_t attention_forward_pairs() const override { return attention_pairs_.load(std::memory_order_relaxed); }

  void attention_delta(View delta, View dout, View o, const AttnShape& s) override {
    const int64_t d = s.head_dim, n = dout.rows() * s.q_heads;
    need(delta.dtype() == DType::f32 && delta.numel() == n, "attention_delta", "delta must be f32 [tq, q_heads]");
    const float* DO = in(dout, 0);
    const float* O = in(o, 1);
    float* D = at<float>(delta);
    for (int64_t r = 0; r < n; ++r) {
      double acc = 0;
      for (int64_t e = 0; e < d; ++e) acc += static_cast<double>(DO[r * d + e]) * O[r * d + e];
      D[r] = static_cast<float>(acc);
    }
  }

  void attention_backward_block(View dq, View dk, View dv, View q, TokenRefs qt, View k, View v, const KeyBlock& kb,
                                View dout, View lse, View delta, const AttnShape& s) override {
    const int64_t d = s.head_dim, hq = s.q_heads, hkv = s.kv_heads, group = hq / hkv, tq = q.rows();
    need(lse.dtype() == DType::f32 && delta.dtype() == DType::f32, "attention_backward_block", "lse, delta must be f32");
    const float* Q = in(q, 0);
    const float* K = in(k, 1);
    const float* V = in(v, 2);
    const float* DO = in(dout, 3);
    // dq, dk, dv accumulate in fp32 within the call; bf16 ones are rounded once at its end
    float *DQ = out(dq, 4, true), *DK = out(dk, 5, true), *DV = out(dv, 6, true);
    const float *L = at<float>(lse), *DL = at<float>(delta);
    const int64_t* qi_idx = i64(qt.index, "attention");
    const int32_t* qi_doc = i32(qt.doc, "attention");
    const int64_t* k_idx = i64(kb.keys.index, "attention");
    const int32_t* k_doc = i32(kb.keys.doc, "attention");
    const int32_t* range = i32(kb.kv_range, "attention");
    for (int64_t i = 0; i < tq; ++i) {
      const int64_t lo = range[2 * i], hi = range[2 * i + 1];
      for (int64_t h = 0; h < hq; ++h) {
        const float* qv = Q + (i * hq + h) * d;
        const float* doi = DO + (i * hq + h) * d;
        float* dqi = DQ + (i * hq + h) * d;
        const float l = L[i * hq + h], D = DL[i * hq + h];
        const int64_t kvh = h / group;
        for (int64_t j = lo; j < hi; ++j) {
          if (k_idx[j] > qi_idx[i] || k_doc[j] != qi_doc[i]) continue;
          const float* kj = K + (j * hkv + kvh) * d;
          const float* vj = V + (j * hkv + kvh) * d;
          float sc = 0, dp = 0;
          for (int64_t e = 0; e < d; ++e) {
            sc += qv[e] * kj[e];
            dp += doi[e] * vj[e];
          }
          float p = std::exp(sc * s.scale - l);
          float ds = p * (dp - D) * s.scale;
          float* dkj = DK + (j * hkv + kvh) * d;
          float* dvj = DV + (j * hkv + kvh) * d;
          for (int64_t e = 0; e < d; ++e) {
            dvj[e] += p * doi[e];
            dqi[e] += ds * kj[e];
            dkj[e] += ds * qv[e];
          }
        }
      }
    }
    commit(dq, DQ);
    commit(dk, DK);
    commit(dv, DV);
  }

  // ---- cross-entropy
  void row_max(View out_v, View logits, int64_t valid) override {
    const int64_t rows = logits.rows(), cols = logits.cols();
    const float* Lg = f32(logits, "row_max");
    float* O = f32(out_v, "row_max");
    for (int64_t r = 0; r < rows; ++r) {
      float m = kNegInf;
      for (int64_t c = 0; c < valid; ++c) m = std::max(m, Lg[r * cols + c]);
      O[r] = m;
    }
  }
  void sumexp_and_target(View out_v, View logits, View mx, View target, int64_t valid, int64_t v0) override {
    const int64_t rows = logits.rows(), cols = logits.cols();
    const float* Lg = f32(logits, "sumexp_and_target");
    const float* M = f32(mx, "sumexp_and_target");
    const int32_t* T = i32(target, "sumexp_and_target");
    float* O = f32(out_v, "sumexp_and_target");
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < valid; ++c) s += std::exp(static_cast<double>(Lg[r * cols + c]) - M[r]);
      O[2 * r] = static_cast<float>(s);
      int64_t t = static_cast<int64_t>(T[r]) - v0;
      O[2 * r + 1] = (T[r] >= 0 && t >= 0 && t < valid) ? Lg[r * cols + t] : 0.0f;
    }
  }
  void xent_finish(View lse, View stats, View mx, View se, View target) override {
    const int64_t rows = lse.numel();
    float* L = f32(lse, "xent_finish");
    const float* M = f32(mx, "xent_finish");
    const float* SE = f32(se, "xent_finish");
    const int32_t* T = i32(target, "xent_finish");
    double loss = 0;
    for (int64_t r = 0; r < rows; ++r) {
      L[r] = M[r] + std::log(SE[2 * r]);
      if (T[r] >= 0) loss += static_cast<double>(L[r]) - SE[2 * r + 1];
    }
    f32(stats, "xent_finish")[kStatLossSum] += static_cast<float>(loss);
  }
  void xent_grad_inplace(View logits, View lse, View target, float w, int64_t valid, int64_t v0) override {
    const int64_t rows = logits.rows(), cols = logits.cols();
    float* Lg = f32(logits, "xent_grad_inplace");
    const float* L = f32(lse, "xent_grad_inplace");
    const int32_t* T = i32(target, "xent_grad_inplace");
    for (int64_t r = 0; r < rows; ++r) {
      float* lr = Lg + r * cols;
      const float wr = T[r] >= 0 ? w : 0.0f;
      for (int64_t c = 0; c < cols; ++c) lr[c] = c < valid ? wr * std::exp(lr[c] - L[r]) : 0.0f;
      int64_t t = static_cast<int64_t>(T[r]) - v0;
      if (T[r] >= 0 && t >= 0 && t < valid) lr[t] -= wr;
    }
  }

  // ---- step statistics and the optimizer
  void flag_nonfinite(View stats, View x, float code) override {
    const float* X = in(x, 0);
    bool bad_value = false;
    for (int64_t i = 0; i < x.numel() && !bad_value; ++i) bad_value = !std::isfinite(X[i]);
    float& f = f32(stats, "flag_nonfinite")[kStatNonFinite];
    if (bad_value) f = std::max(f, code);
  }
  void sum_squares(View stats, View x) override {
    const float* X = f32(x, "sum_squares");
    double s = 0;
    for (int64_t i = 0; i < x.numel(); ++i) s += static_cast<double>(X[i]) * X[i];
    f32(stats, "sum_squares")[kStatGradNorm2] += static_cast<float>(s);
  }
  void adamw(View master, View mv, View vv, View grad, View stats, const AdamWArgs& a) override {
    const float* st = f32(stats, "adamw");
    const double norm = std::sqrt(static_cast<double>(st[kStatGradNorm2]));
    if (st[kStatNonFinite] != 0.0f || !std::isfinite(norm)) return;  // the step is skipped
    const float gscale = (a.clip > 0 && norm > a.clip) ? static_cast<float>(a.clip / (norm + 1e-6)) : 1.0f;
    // the weights stepped (master, or the compute weights with master=none), m and v (moments=bf16)
    // and the gradient may be bf16: widened into scratch, updated in fp32, each rounded once on store
    float* P = out(master, 0, true);
    float* M = out(mv, 1, true);
    float* Vv = out(vv, 2, true);
    const float* G = in(grad, 3);
    const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step));
    const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step));
    for (int64_t i = 0; i < master.numel(); ++i) {
      float g = G[i] * gscale;
      M[i] = a.beta1 * M[i] + (1.0f - a.beta1) * g;
      Vv[i] = a.beta2 * Vv[i] + (1.0f - a.beta2) * g * g;
      float mhat = static_cast<float>(M[i] / bc1), vhat = static_cast<float>(Vv[i] / bc2);
      P[i] -= a.lr * (mhat / (std::sqrt(vhat) + a.eps) + a.weight_decay * a.decay * P[i]);
    }
    commit(master, P);
    commit(mv, M);
    commit(vv, Vv);
  }

  void mark_time(int slot) override {
    if (slot < 0) return;
    if (static_cast<size_t>(slot) >= times_.size()) times_.resize(slot + 1, -1.0);
    times_[slot] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  std::vector<double> read_times() override {
    synchronize();
    return times_;
  }

 protected:
  void* raw_alloc(int64_t bytes, bool) override {
    if (bytes <= 0) bytes = 64;
    if (arena_) return arena_->allocate(bytes);
    void* p = std::aligned_alloc(64, (static_cast<size_t>(bytes) + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void raw_free(void* p, bool) override {
    if (arena_) arena_->release(p);
    else std::free(p);
  }
  void* host_address(const View& v) override { return static_cast<char*>(raw(v)) + off_; }

  void do_download(float* dst, View src) {
    need(is_float(src.dtype()), "download", "only float tensors download");
    const float* s = in(src, 0);
    std::memcpy(dst, s, src.numel() * sizeof(float));
  }

 private:
  template <class T>
  T* at(const View& v) {
    return reinterpret_cast<T*>(static_cast<char*>(raw(v)) + off_);
  }
  float* f32(const View& v, const char* op) {
    need(v.dtype() == DType::f32, op, "expects an f32 tensor");
    return at<float>(v);
  }
  const int32_t* i32(const View& v, const char* op) {
    need(v.dtype() == DType::i32, op, "expects an i32 tensor");
    return at<int32_t>(v);
  }
  const int64_t* i64(const View& v, const char* op) {
    need(v.dtype() == DType::i64, op, "expects an i64 tensor");
    return at<int64_t>(v);
  }
  // f32 views are used in place; bf16 views are widened into a scratch slot (loaded when asked).
  const float* in(const View& v, int slot) { return out(v, slot, true); }
  float* out(const View& v, int slot, bool load) {
    if (v.dtype() == DType::f32) return at<float>(v);
    need(v.dtype() == DType::bf16, "op", "expects a float tensor (f32 or bf16)");
    auto& s = scratch_[slot];
    if (static_cast<int64_t>(s.size()) < v.numel()) s.resize(static_cast<size_t>(v.numel()));
    if (load) {
      const uint16_t* p = at<uint16_t>(v);
      for (int64_t i = 0; i < v.numel(); ++i) s[i] = bf16_to_f32(p[i]);
    }
    return s.data();
  }
  void commit(const View& v, const float* p) {
    if (v.dtype() != DType::bf16) return;
    uint16_t* d = at<uint16_t>(v);
    for (int64_t i = 0; i < v.numel(); ++i) d[i] = f32_to_bf16(p[i]);
  }
  void check_cols(const char* op, const View& dst, int64_t dc, const View& src, int64_t sc, int64_t n) {
    need(dst.rows() == src.rows() && dc >= 0 && sc >= 0 && dc + n <= dst.cols() && sc + n <= src.cols(), op,
         "column ranges out of bounds or row counts differ");
  }

  std::chrono::steady_clock::time_point t0_;
  std::unique_ptr<GuardedArena> arena_;
  std::ptrdiff_t off_ = 0;
  std::vector<float> scratch_[kScratchSlots];
  std::vector<double> times_;
  std::atomic<int64_t> attention_pairs_{0};  // attention_forward_pairs (the deferred worker adds to it)
};

// Every op is queued and run by one worker thread in issue order; the host continues at once.
// synchronize() drains the queue and rethrows the first error a queued op raised. Frees are
// queued too (stream-ordered), so a tensor released right after an op that reads it stays valid.
class DeferredCpuBackend final : public CpuBackend {
 public:
  DeferredCpuBackend() : CpuBackend(true), worker_([this] { run(); }), copier_([this] { run_copies(); }) {}
  ~DeferredCpuBackend() override {
    try {
      synchronize();
    } catch (...) {
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    {
      std::lock_guard<std::mutex> lk(copy_mu_);
      copy_stop_ = true;
    }
    cv_.notify_all();
    copy_cv_.notify_all();
    worker_.join();
    copier_.join();
  }

  // The copy thread: a copy starts once the compute stream has reached the point where it was
  // issued (a fence the compute worker passes), and the compute stream waits for it only where
  // wait_copy says so.
  CopyEvent copy_async(View dst, View src) override {
    const uint64_t id = ++copies_issued_;
    submit([this, id] {  // the fence: everything issued before the copy has run
      std::lock_guard<std::mutex> lk(copy_mu_);
      fence_reached_ = id;
      copy_cv_.notify_all();
    });
    {
      std::lock_guard<std::mutex> lk(copy_mu_);
      copies_.push_back({id, dst, src});
    }
    copy_cv_.notify_all();
    return {id};
  }
  void wait_copy(CopyEvent e) override {
    if (e.id == 0) return;
    submit([this, e] {
      std::unique_lock<std::mutex> lk(copy_mu_);
      copy_cv_.wait(lk, [&] { return copies_done_ >= e.id; });
      if (copy_error_) std::rethrow_exception(copy_error_);
    });
  }
  std::string name() const override { return "cpu-deferred"; }

  void upload(View dst, const float* src) override {
    auto buf = std::make_shared<std::vector<float>>(src, src + dst.numel());
    submit([this, dst, buf] { CpuBackend::upload(dst, buf->data()); });
  }
  void upload(View dst, const int32_t* src) override {
    auto buf = std::make_shared<std::vector<int32_t>>(src, src + dst.numel());
    submit([this, dst, buf] { CpuBackend::upload(dst, buf->data()); });
  }
  void upload(View dst, const int64_t* src) override {
    auto buf = std::make_shared<std::vector<int64_t>>(src, src + dst.numel());
    submit([this, dst, buf] { CpuBackend::upload(dst, buf->data()); });
  }
  void download(float* dst, View src) override {
    synchronize();
    do_download(dst, src);
  }
  void synchronize() override {
    {
      std::unique_lock<std::mutex> lk(mu_);
      idle_cv_.wait(lk, [this] { return queue_.empty() && !busy_; });
    }
    {  // every copy's fence has passed: the copy stream drains too
      std::unique_lock<std::mutex> lk(copy_mu_);
      copy_cv_.wait(lk, [this] { return copies_done_ >= copies_issued_; });
    }
    std::lock_guard<std::mutex> lk(mu_);
    if (error_) {
      auto e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }
#define CTX_DEFER(call) submit([=, this] { CpuBackend::call; })
  void copy(View d, View s) override { CTX_DEFER(copy(d, s)); }
  void zero(View x) override { CTX_DEFER(zero(x)); }
  void fill(View x, float v) override { CTX_DEFER(fill(x, v)); }
  void axpy(View y, float a, View x) override { CTX_DEFER(axpy(y, a, x)); }
  void scale(View x, float a) override { CTX_DEFER(scale(x, a)); }
  void copy_cols(View d, int64_t dc, View s, int64_t sc, int64_t n) override { CTX_DEFER(copy_cols(d, dc, s, sc, n)); }
  void add_cols(View d, int64_t dc, View s, int64_t sc, int64_t n) override { CTX_DEFER(add_cols(d, dc, s, sc, n)); }
  void gemm(bool ta, bool tb, float al, View a, View b, float be, View c) override {
    CTX_DEFER(gemm(ta, tb, al, a, b, be, c));
  }
  void rmsnorm_forward(View y, View r, View x, View w, float eps) override { CTX_DEFER(rmsnorm_forward(y, r, x, w, eps)); }
  void rmsnorm_backward(View dx, View dw, View dy, View x, View r, View w) override {
    CTX_DEFER(rmsnorm_backward(dx, dw, dy, x, r, w));
  }
  void rope(View x, int64_t h, int64_t d, View p, View f, int64_t rot, float sc, bool inv) override {
    CTX_DEFER(rope(x, h, d, p, f, rot, sc, inv));
  }
  void swiglu_forward(View a, View g, View u) override { CTX_DEFER(swiglu_forward(a, g, u)); }
  void swiglu_backward(View dg, View du, View da, View g, View u) override { CTX_DEFER(swiglu_backward(dg, du, da, g, u)); }
  void embedding_forward(View o, View t, View tok, int64_t v0) override { CTX_DEFER(embedding_forward(o, t, tok, v0)); }
  void embedding_backward(View dt, View d, View tok, int64_t v0) override {
    CTX_DEFER(embedding_backward(dt, d, tok, v0));
  }
  void attention_forward_block(View o, View l, View q, TokenRefs qt, View k, View v, const KeyBlock& kb,
                               const AttnShape& s) override {
    KeyBlock b = kb;
    AttnShape sh = s;
    submit([=, this] { CpuBackend::attention_forward_block(o, l, q, qt, k, v, b, sh); });
  }
  void attention_backward_block(View dq, View dk, View dv, View q, TokenRefs qt, View k, View v, const KeyBlock& kb,
                                View dout, View l, View delta, const AttnShape& s) override {
    KeyBlock b = kb;
    AttnShape sh = s;
    submit([=, this] { CpuBackend::attention_backward_block(dq, dk, dv, q, qt, k, v, b, dout, l, delta, sh); });
  }
  void attention_delta(View delta, View dout, View o, const AttnShape& s) override {
    AttnShape sh = s;
    submit([=, this] { CpuBackend::attention_delta(delta, dout, o, sh); });
  }
  void row_max(View o, View lg, int64_t valid) override { CTX_DEFER(row_max(o, lg, valid)); }
  void sumexp_and_target(View o, View lg, View m, View t, int64_t valid, int64_t v0) override {
    CTX_DEFER(sumexp_and_target(o, lg, m, t, valid, v0));
  }
  void xent_finish(View l, View st, View m, View se, View t) override { CTX_DEFER(xent_finish(l, st, m, se, t)); }
  void xent_grad_inplace(View lg, View l, View t, float w, int64_t valid, int64_t v0) override {
    CTX_DEFER(xent_grad_inplace(lg, l, t, w, valid, v0));
  }
  void flag_nonfinite(View st, View x, float code) override { CTX_DEFER(flag_nonfinite(st, x, code)); }
  void sum_squares(View st, View x) override { CTX_DEFER(sum_squares(st, x)); }
  void adamw(View p, View m, View v, View g, View st, const AdamWArgs& a) override {
    AdamWArgs args = a;
    submit([=, this] { CpuBackend::adamw(p, m, v, g, st, args); });
  }
  void mark_time(int slot) override { CTX_DEFER(mark_time(slot)); }
#undef CTX_DEFER

 protected:
  void raw_free(void* p, bool host) override {
    submit([this, p, host] { CpuBackend::raw_free(p, host); });
  }
  void submit(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        fn = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      try {
        fn();
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!error_) error_ = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        busy_ = false;
        if (queue_.empty()) idle_cv_.notify_all();
      }
    }
  }
  void run_copies() {
    for (;;) {
      PendingCopy c;
      {
        std::unique_lock<std::mutex> lk(copy_mu_);
        copy_cv_.wait(lk, [&] { return copy_stop_ || (!copies_.empty() && fence_reached_ >= copies_.front().id); });
        if (copies_.empty() || fence_reached_ < copies_.front().id) return;  // stopping
        c = copies_.front();
        copies_.pop_front();
      }
      try {
        CpuBackend::copy(c.dst, c.src);
      } catch (...) {
        std::lock_guard<std::mutex> lk(copy_mu_);
        if (!copy_error_) copy_error_ = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lk(copy_mu_);
        copies_done_ = c.id;
      }
      copy_cv_.notify_all();
    }
  }
  struct PendingCopy {
    uint64_t id = 0;
    View dst, src;
  };
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::mutex copy_mu_;
  std::condition_variable copy_cv_;
  std::deque<PendingCopy> copies_;
  uint64_t copies_issued_ = 0, fence_reached_ = 0, copies_done_ = 0;
  bool copy_stop_ = false;
  std::exception_ptr copy_error_;
  std::thread worker_;
  std::thread copier_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(CpuMode mode) {
  switch (mode) {
    case CpuMode::plain: return std::make_unique<CpuBackend>(false);
    case CpuMode::guarded: return std::make_unique<CpuBackend>(true);
    case CpuMode::deferred: return std::make_unique<DeferredCpuBackend>();
  }
  return nullptr;
}

bool parse_cpu_mode(const std::string& name, CpuMode* mode) {
  if (name == "cpu") *mode = CpuMode::plain;
  else if (name == "cpu-guarded") *mode = CpuMode::guarded;
  else if (name == "cpu-deferred") *mode = CpuMode::deferred;
  else return false;
  return true;
}

}  // namespace ctx::exec
