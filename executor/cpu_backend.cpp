// The CPU reference backend: GEMMs on Eigen, the model's kernels as plain loops in float with
// double accumulation where a sum runs over a whole row. Allocation-free inside every kernel.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "executor/backend.hpp"

namespace ctx::exec {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapC = Eigen::Map<const RowMat>;
using Map = Eigen::Map<RowMat>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kMaxHeadDim = 1024;

inline bool visible(const TokenRefs& q, int64_t i, const TokenRefs& k, int64_t j) {
  return k.index[j] <= q.index[i] && k.doc[j] == q.doc[i];
}

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }

  void copy(float* dst, const float* src, int64_t n) override {
    if (n > 0 && dst != src) std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
  void fill(float* dst, float value, int64_t n) override { std::fill(dst, dst + n, value); }
  void axpy(float* y, float alpha, const float* x, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
  }
  void scale(float* x, float alpha, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
  }
  double sum_squares(const float* x, int64_t n) override {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
    return s;
  }
  bool all_finite(const float* x, int64_t n) override {
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(x[i])) return false;
    return true;
  }
  void copy_block(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * dst_ld, src + r * src_ld, cols * sizeof(float));
  }
  void add_block(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) dst[r * dst_ld + c] += src[r * src_ld + c];
  }

  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
            float beta, float* c) override {
    Map C(c, m, n);
    if (beta == 0.0f) C.setZero();
    else if (beta != 1.0f) C *= beta;
    if (m == 0 || n == 0 || k == 0) return;
    if (!ta && !tb) C.noalias() += alpha * (MapC(a, m, k) * MapC(b, k, n));
    else if (!ta && tb) C.noalias() += alpha * (MapC(a, m, k) * MapC(b, n, k).transpose());
    else if (ta && !tb) C.noalias() += alpha * (MapC(a, k, m).transpose() * MapC(b, k, n));
    else C.noalias() += alpha * (MapC(a, k, m).transpose() * MapC(b, n, k).transpose());
  }

  void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t rows, int64_t h,
                       float eps) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * h;
      double ss = 0;
      for (int64_t i = 0; i < h; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      float s = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(h) + eps));
      rstd[r] = s;
      if (y)
        for (int64_t i = 0; i < h; ++i) y[r * h + i] = xr[i] * s * w[i];
    }
  }

  void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* rstd, const float* w,
                        int64_t rows, int64_t h) override {
    // y_i = w_i x_i s, s = (mean(x^2)+eps)^-1/2: dx_i = s (w_i dy_i) - x_i s^3 / h * sum_j w_j dy_j x_j
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * h;
      const float* dyr = dy + r * h;
      float s = rstd[r];
      double dot = 0;
      for (int64_t i = 0; i < h; ++i) {
        dot += static_cast<double>(w[i]) * dyr[i] * xr[i];
        dw[i] += dyr[i] * xr[i] * s;
      }
      float c = static_cast<float>(dot) * s * s * s / static_cast<float>(h);
      for (int64_t i = 0; i < h; ++i) dx[r * h + i] = s * w[i] * dyr[i] - xr[i] * c;
    }
  }

  void rope(float* x, int64_t rows, int64_t heads, int64_t d, const int32_t* pos, const float* inv_freq,
            int64_t rot, float attn_scale, bool inverse) override {
    const int64_t half = rot / 2;
    const float sign = inverse ? -1.0f : 1.0f;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < half; ++i) {
        double ang = static_cast<double>(pos[r]) * inv_freq[i];
        float c = static_cast<float>(std::cos(ang)) * attn_scale;
        float s = static_cast<float>(std::sin(ang)) * attn_scale * sign;
        for (int64_t hh = 0; hh < heads; ++hh) {
          float* xh = x + (r * heads + hh) * d;
          float x1 = xh[i], x2 = xh[i + half];
          xh[i] = x1 * c - x2 * s;
          xh[i + half] = x2 * c + x1 * s;
        }
      }
    }
  }

  void swiglu_forward(float* a, const float* gate, const float* up, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) {
      float g = gate[i];
      float sig = 1.0f / (1.0f + std::exp(-g));
      a[i] = g * sig * up[i];
    }
  }
  void swiglu_backward(float* dgate, float* dup, const float* da, const float* gate, const float* up,
                       int64_t n) override {
    for (int64_t i = 0; i < n; ++i) {
      float g = gate[i];
      float sig = 1.0f / (1.0f + std::exp(-g));
      float silu = g * sig;
      dup[i] = da[i] * silu;
      dgate[i] = da[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    }
  }

  void embedding_forward(float* out, const float* table, const int32_t* tok, int64_t tokens, int64_t h, int64_t v0,
                         int64_t vrows) override {
    for (int64_t t = 0; t < tokens; ++t) {
      int64_t r = tok[t] - v0;
      if (r >= 0 && r < vrows) std::memcpy(out + t * h, table + r * h, h * sizeof(float));
      else std::fill(out + t * h, out + (t + 1) * h, 0.0f);
    }
  }
  void embedding_backward(float* dtable, const float* dout, const int32_t* tok, int64_t tokens, int64_t h,
                          int64_t v0, int64_t vrows) override {
    for (int64_t t = 0; t < tokens; ++t) {
      int64_t r = tok[t] - v0;
      if (r >= 0 && r < vrows)
        for (int64_t i = 0; i < h; ++i) dtable[r * h + i] += dout[t * h + i];
    }
  }

  void attention_forward_block(float* o, float* lse, const float* q, TokenRefs qt, int64_t tq, const float* k,
                               const float* v, TokenRefs kt, int64_t tk, const AttnShape& s) override {
    const int64_t d = s.head_dim, hq = s.q_heads, hkv = s.kv_heads, group = hq / hkv;
    float acc[kMaxHeadDim];
    for (int64_t i = 0; i < tq; ++i) {
      for (int64_t h = 0; h < hq; ++h) {
        const float* qi = q + (i * hq + h) * d;
        const int64_t kvh = h / group;
        float mx = kNegInf, sum = 0;
        std::fill(acc, acc + d, 0.0f);
        for (int64_t j = 0; j < tk; ++j) {
          if (!visible(qt, i, kt, j)) continue;
          const float* kj = k + (j * hkv + kvh) * d;
          float sc = 0;
          for (int64_t e = 0; e < d; ++e) sc += qi[e] * kj[e];
          sc *= s.scale;
          if (sc > mx) {  // online softmax: rescale what was accumulated under the old maximum
            float f = std::exp(mx - sc);
            sum *= f;
            for (int64_t e = 0; e < d; ++e) acc[e] *= f;
            mx = sc;
          }
          float p = std::exp(sc - mx);
          sum += p;
          const float* vj = v + (j * hkv + kvh) * d;
          for (int64_t e = 0; e < d; ++e) acc[e] += p * vj[e];
        }
        if (sum == 0) continue;  // no visible key in this block
        float blk_lse = mx + std::log(sum);
        float* oi = o + (i * hq + h) * d;
        float& l = lse[i * hq + h];
        if (l == kNegInf) {
          for (int64_t e = 0; e < d; ++e) oi[e] = acc[e] / sum;
          l = blk_lse;
        } else {
          // stable merge: new = max + log1p(exp(-|a-b|)); weights exp(a-new), exp(b-new) <= 1
          float hi = std::max(l, blk_lse), lo = std::min(l, blk_lse);
          float nl = hi + std::log1p(std::exp(lo - hi));
          float w_old = std::exp(l - nl), w_new = std::exp(blk_lse - nl) / sum;
          for (int64_t e = 0; e < d; ++e) oi[e] = oi[e] * w_old + acc[e] * w_new;
          l = nl;
        }
      }
    }
  }

  void attention_delta(float* delta, const float* dout, const float* o, int64_t tq, const AttnShape& s) override {
    const int64_t d = s.head_dim;
    for (int64_t r = 0; r < tq * s.q_heads; ++r) {
      double acc = 0;
      for (int64_t e = 0; e < d; ++e) acc += static_cast<double>(dout[r * d + e]) * o[r * d + e];
      delta[r] = static_cast<float>(acc);
    }
  }

  void attention_backward_block(float* dq, float* dk, float* dv, const float* q, TokenRefs qt, int64_t tq,
                                const float* k, const float* v, TokenRefs kt, int64_t tk, const float* dout,
                                const float* lse, const float* delta, const AttnShape& s) override {
    const int64_t d = s.head_dim, hq = s.q_heads, hkv = s.kv_heads, group = hq / hkv;
    for (int64_t i = 0; i < tq; ++i) {
      for (int64_t h = 0; h < hq; ++h) {
        const float* qi = q + (i * hq + h) * d;
        const float* doi = dout + (i * hq + h) * d;
        float* dqi = dq + (i * hq + h) * d;
        const float l = lse[i * hq + h], D = delta[i * hq + h];
        const int64_t kvh = h / group;
        for (int64_t j = 0; j < tk; ++j) {
          if (!visible(qt, i, kt, j)) continue;
          const float* kj = k + (j * hkv + kvh) * d;
          const float* vj = v + (j * hkv + kvh) * d;
          float sc = 0, dp = 0;
          for (int64_t e = 0; e < d; ++e) {
            sc += qi[e] * kj[e];
            dp += doi[e] * vj[e];
          }
          float p = std::exp(sc * s.scale - l);
          float ds = p * (dp - D) * s.scale;
          float* dkj = dk + (j * hkv + kvh) * d;
          float* dvj = dv + (j * hkv + kvh) * d;
          for (int64_t e = 0; e < d; ++e) {
            dvj[e] += p * doi[e];
            dqi[e] += ds * kj[e];
            dkj[e] += ds * qi[e];
          }
        }
      }
    }
  }

  void row_max(float* out, const float* logits, int64_t rows, int64_t cols, int64_t valid) override {
    for (int64_t r = 0; r < rows; ++r) {
      float m = kNegInf;
      for (int64_t c = 0; c < valid; ++c) m = std::max(m, logits[r * cols + c]);
      out[r] = m;
    }
  }
  void sumexp_and_target(float* out, const float* logits, const float* mx, const int32_t* target, int64_t rows,
                         int64_t cols, int64_t valid, int64_t v0) override {
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < valid; ++c) s += std::exp(static_cast<double>(logits[r * cols + c]) - mx[r]);
      out[2 * r] = static_cast<float>(s);
      int64_t t = static_cast<int64_t>(target[r]) - v0;
      out[2 * r + 1] = (target[r] >= 0 && t >= 0 && t < valid) ? logits[r * cols + t] : 0.0f;
    }
  }
  void xent_grad_inplace(float* logits, const float* lse, const int32_t* target, const float* weight, int64_t rows,
                         int64_t cols, int64_t valid, int64_t v0) override {
    for (int64_t r = 0; r < rows; ++r) {
      float* lr = logits + r * cols;
      float w = weight[r];
      for (int64_t c = 0; c < cols; ++c) lr[c] = c < valid ? w * std::exp(lr[c] - lse[r]) : 0.0f;
      int64_t t = static_cast<int64_t>(target[r]) - v0;
      if (target[r] >= 0 && t >= 0 && t < valid) lr[t] -= w;
    }
  }

  void adamw(float* master, float* m, float* v, const float* grad, float decay, int64_t n, float lr,
             float beta1, float beta2, float eps, float weight_decay, float grad_scale, int64_t step) override {
    const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
    const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
    for (int64_t i = 0; i < n; ++i) {
      float g = grad[i] * grad_scale;
      m[i] = beta1 * m[i] + (1.0f - beta1) * g;
      v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
      float mhat = static_cast<float>(m[i] / bc1), vhat = static_cast<float>(v[i] / bc2);
      master[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * decay * master[i]);
    }
  }

 protected:
  float* raw_alloc(int64_t bytes, bool) override {
    if (bytes <= 0) bytes = sizeof(float);
    void* p = std::aligned_alloc(64, (static_cast<size_t>(bytes) + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return static_cast<float*>(p);
  }
  void raw_free(float* p, bool) override { std::free(p); }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace ctx::exec
