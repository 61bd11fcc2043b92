// The op cases (op_cases.hpp): builders, float64 references with derived tolerances, the lists.
#include "executor/tests/op_cases.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>

#include "executor/bf16.hpp"

namespace ctx::exec::opcases {
namespace {

constexpr double kU = 0x1p-24;    // float32 unit roundoff
constexpr double kBf = 0x1p-8;    // one bf16 rounding: half an ulp, at most 2^-8 |value|
constexpr double kSafety = 2.0;   // on every first-order float32 bound
constexpr double kInf = std::numeric_limits<double>::infinity();

const char* dt_name(DType t) { return t == DType::bf16 ? "bf16" : "f32"; }
int64_t esz(DType t) { return dtype_bytes(t); }

std::vector<float> stored(std::vector<float> v, DType dt) {
  if (dt == DType::bf16)
    for (auto& x : v) x = round_bf16(x);
  return v;
}

Tensor up(Backend& be, const std::vector<float>& v, int64_t rows, int64_t cols, DType dt) {
  Tensor t = be.alloc(rows, cols, dt, Mem::workspace);
  if (static_cast<int64_t>(v.size()) != t.numel()) throw std::logic_error("op_cases: upload size mismatch");
  be.upload(t, v.data());
  return t;
}
template <typename I>
Tensor up_int(Backend& be, const std::vector<I>& v, int64_t rows = 1) {
  const int64_t n = static_cast<int64_t>(v.size());
  Tensor t = be.alloc(rows, n / rows, sizeof(I) == 8 ? DType::i64 : DType::i32, Mem::workspace);
  be.upload(t, v.data());
  return t;
}
std::vector<float> down(Backend& be, View v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  be.download(out.data(), v);
  return out;
}

// A reference output: value, first-order float32 error bound, and the magnitude of its terms
// (the sum of their absolute values, the initial value of an accumulated output included).
struct Ref {
  std::vector<double> val, err, mag;
  explicit Ref(size_t n = 0) : val(n, 0.0), err(n, 0.0), mag(n, 0.0) {}
};

// tol = 2 err (+ for a bf16 output written by `calls` calls: 2^-8 (|val| + (calls - 1) mag))
std::vector<double> tol_of(const Ref& r, DType out, int calls = 1) {
  std::vector<double> t(r.val.size());
  for (size_t i = 0; i < t.size(); ++i) {
    t[i] = kSafety * r.err[i];
    if (out == DType::bf16) t[i] += kBf * (std::fabs(r.val[i]) + (calls - 1) * r.mag[i]);
  }
  return t;
}

Check compare(const std::string& what, const std::vector<float>& got, const std::vector<double>& want,
              const std::vector<double>& tol) {
  Check c;
  c.what = what;
  if (got.size() != want.size()) {
    c.worst = kInf;
    c.what += " (size " + std::to_string(got.size()) + " vs reference " + std::to_string(want.size()) + ")";
    return c;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    double ratio;
    if (std::isnan(w) || std::isnan(g)) ratio = (std::isnan(w) && std::isnan(g)) ? 0 : kInf;
    else if (std::isinf(w) || std::isinf(g)) ratio = g == w ? 0 : kInf;
    else {
      const double e = std::fabs(g - w);
      c.max_abs_err = std::max(c.max_abs_err, e);
      ratio = e == 0 ? 0 : tol[i] > 0 ? e / tol[i] : kInf;
    }
    if (ratio > c.worst || c.at < 0) {
      c.worst = std::max(c.worst, ratio);
      c.at = static_cast<int64_t>(i);
      c.got = g;
      c.want = w;
      c.tol = tol[i];
    }
  }
  return c;
}
Check compare(const std::string& what, const std::vector<float>& got, const Ref& r, DType out, int calls = 1) {
  return compare(what, got, r.val, tol_of(r, out, calls));
}
Check exact(const std::string& what, const std::vector<float>& got, const std::vector<double>& want) {
  return compare(what, got, want, std::vector<double>(want.size(), 0.0));
}

struct FnInstance : Instance {
  std::function<void()> r;
  std::function<std::vector<Check>()> c;
  void run() override { r(); }
  std::vector<Check> check() override { return c(); }
};
template <typename S, typename R, typename C>
std::unique_ptr<Instance> instance(std::shared_ptr<S> s, R r, C c) {
  auto in = std::make_unique<FnInstance>();
  in->r = [s, r] { r(*s); };
  in->c = [s, c] { return c(*s); };
  return in;
}

std::string dims(std::initializer_list<int64_t> d) {
  std::string s;
  for (int64_t x : d) s += std::string(s.empty() ? "" : "x") + std::to_string(x);
  return s;
}

// ================================================================ GEMM
OpCase gemm_case(const std::string& tag, int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType da, DType db,
                 DType dc, float alpha, float beta, bool emulated) {
  OpCase c;
  c.name = std::string("gemm_") + (ta ? "t" : "n") + (tb ? "t" : "n") + (tag.empty() ? "" : "_" + tag) + "_" +
           (da == db && db == dc ? dt_name(da)
                                 : std::string(dt_name(da)) + "x" + dt_name(db) + "_to_" + dt_name(dc));
  c.op = "gemm";
  c.shape = "m" + std::to_string(m) + " n" + std::to_string(n) + " k" + std::to_string(k) + " alpha " +
            std::to_string(alpha).substr(0, 4) + " beta " + std::to_string(beta).substr(0, 3);
  c.dtype = da == db && db == dc ? dt_name(da) : std::string(dt_name(da)) + "x" + dt_name(db) + ">" + dt_name(dc);
  c.tolerance = "(k + 2) u (|alpha| sum|a b| + |beta c|): fp32 accumulation of k products in any order" +
                std::string(dc == DType::bf16 ? "; + 2^-8 |c| for the bf16 C" : "");
  c.flops = 2.0 * m * n * k;
  c.bytes = double(m * k * esz(da) + k * n * esz(db) + m * n * esz(dc) * (beta != 0 ? 2 : 1));
  c.ref_cost = double(m) * n * k;
  c.emulated = emulated;
  c.make = [=](Backend& be) {
    struct S {
      Backend* be;
      Tensor a, b, c;
      std::vector<float> ha, hb, hc;
    };
    auto s = std::make_shared<S>();
    s->be = &be;
    s->ha = stored(randn(m * k, 11 + m), da);
    s->hb = stored(randn(k * n, 12 + n), db);
    s->hc = stored(randn(m * n, 13), dc);
    s->a = up(be, s->ha, ta ? k : m, ta ? m : k, da);
    s->b = up(be, s->hb, tb ? n : k, tb ? k : n, db);
    s->c = up(be, s->hc, m, n, dc);
    return instance(
        s, [=](S& s) { s.be->gemm(ta, tb, alpha, s.a, s.b, beta, s.c); },
        [=](S& s) {
          Ref r(m * n);
          std::vector<double> arow(k);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t p = 0; p < k; ++p) arow[p] = ta ? s.ha[p * m + i] : s.ha[i * k + p];
            for (int64_t j = 0; j < n; ++j) {
              double acc = 0, mag = 0;
              for (int64_t p = 0; p < k; ++p) {
                const double x = arow[p] * (tb ? s.hb[j * k + p] : s.hb[p * n + j]);
                acc += x;
                mag += std::fabs(x);
              }
              const double c0 = beta != 0 ? beta * double(s.hc[i * n + j]) : 0.0;
              r.val[i * n + j] = alpha * acc + c0;
              r.mag[i * n + j] = std::fabs(alpha) * mag + std::fabs(c0);
              r.err[i * n + j] = (k + 2) * kU * r.mag[i * n + j];
            }
          }
          return std::vector<Check>{compare("C", down(*s.be, s.c), r, dc)};
        });
  };
  return c;
}

// ================================================================ RMSNorm
OpCase rmsnorm_fwd_case(int64_t rows, int64_t h, DType dt, bool emulated) {
  OpCase c;
  c.name = std::string("rmsnorm_fwd_") + dt_name(dt);
  c.op = "rmsnorm_forward";
  c.shape = dims({rows, h});
  c.dtype = dt_name(dt);
  c.tolerance = "y: 8 u |y| (rstd from a double sum, 3 fp32 roundings); rstd: 4 u" +
                std::string(dt == DType::bf16 ? "; + 2^-8 |y| for the bf16 y" : "");
  c.flops = 4.0 * rows * h;
  c.bytes = double(2 * rows * h * esz(dt) + h * esz(dt) + rows * 4);
  c.ref_cost = double(rows) * h;
  c.emulated = emulated;
  c.make = [=](Backend& be) {
    struct S {
      Backend* be;
      Tensor x, w, y, rstd;
      std::vector<float> hx, hw;
    };
    auto s = std::make_shared<S>();
    s->be = &be;
    s->hx = stored(randn(rows * h, 21, 2.0f), dt);
    s->hw = stored(randn(h, 22), dt);
    s->x = up(be, s->hx, rows, h, dt);
    s->w = up(be, s->hw, 1, h, dt);
    s->y = be.alloc(rows, h, dt, Mem::workspace);
    s->rstd = be.alloc(rows, 1, DType::f32, Mem::workspace);
    return instance(
        s, [](S& s) { s.be->rmsnorm_forward(s.y, s.rstd, s.x, s.w, 1e-5f); },
        [=](S& s) {
          Ref y(rows * h), rs(rows);
          for (int64_t r = 0; r < rows; ++r) {
            double ss = 0;
            for (int64_t i = 0; i < h; ++i) ss += double(s.hx[r * h + i]) * s.hx[r * h + i];
            const double sc = 1.0 / std::sqrt(ss / h + double(1e-5f));
            rs.val[r] = sc;
            rs.err[r] = 4 * kU * sc;
            for (int64_t i = 0; i < h; ++i) {
              const double v = s.hx[r * h + i] * sc * s.hw[i];
              y.val[r * h + i] = v;
              y.mag[r * h + i] = std::fabs(v);
              y.err[r * h + i] = 8 * kU * std::fabs(v);
            }
          }
          return std::vector<Check>{compare("y", down(*s.be, s.y), y, dt),
                                    compare("rstd", down(*s.be, s.rstd), rs, DType::f32)};
        });
  };
  return c;
}

OpCase rmsnorm_bwd_case(int64_t rows, int64_t h, DType dt, bool emulated) {
  OpCase c;
  c.name = std::string("rmsnorm_bwd_") + dt_name(dt);
  c.op = "rmsnorm_backward";
  c.shape = dims({rows, h});
  c.dtype = dt == DType::bf16 ? "bf16 (dw f32)" : "f32";
  c.tolerance = "dx: 8 u (|s w dy| + |x| s^3/h sum|w dy x|) (row dot in double); dw (f32 +=): (rows + 4) u sum|terms|" +
                std::string(dt == DType::bf16 ? "; + 2^-8 |dx| for the bf16 dx" : "");
  c.flops = 7.0 * rows * h;
  c.bytes = double(3 * rows * h * esz(dt) + h * esz(dt) + rows * 4 + 2 * h * 4);
  c.ref_cost = 2.0 * rows * h;
  c.emulated = emulated;
  c.make = [=](Backend& be) {
    struct S {
      Backend* be;
      Tensor x, dy, w, rstd, dx, dw;
      std::vector<float> hx, hdy, hw, hr, hdw;
    };
    auto s = std::make_shared<S>();
    s->be = &be;
    s->hx = stored(randn(rows * h, 31, 2.0f), dt);
    s->hdy = stored(randn(rows * h, 32), dt);
    s->hw = stored(randn(h, 33), dt);
    s->hdw = randn(h, 34);
    s->hr.resize(rows);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < h; ++i) ss += double(s->hx[r * h + i]) * s->hx[r * h + i];
      s->hr[r] = static_cast<float>(1.0 / std::sqrt(ss / h + 1e-5));
    }
    s->x = up(be, s->hx, rows, h, dt);
    s->dy = up(be, s->hdy, rows, h, dt);
    s->w = up(be, s->hw, 1, h, dt);
    s->rstd = up(be, s->hr, rows, 1, DType::f32);
    s->dw = up(be, s->hdw, 1, h, DType::f32);
    s->dx = be.alloc(rows, h, dt, Mem::workspace);
    return instance(
        s, [](S& s) { s.be->rmsnorm_backward(s.dx, s.dw, s.dy, s.x, s.rstd, s.w); },
        [=](S& s) {
          Ref dx(rows * h), dw(h);
          for (int64_t i = 0; i < h; ++i) dw.val[i] = s.hdw[i], dw.mag[i] = std::fabs(s.hdw[i]);
          for (int64_t r = 0; r < rows; ++r) {
            const double sc = s.hr[r];
            double dot = 0, adot = 0;
            for (int64_t i = 0; i < h; ++i) {
              const double t = double(s.hw[i]) * s.hdy[r * h + i] * s.hx[r * h + i];
              dot += t;
              adot += std::fabs(t);
              const double g = double(s.hdy[r * h + i]) * s.hx[r * h + i] * sc;
              dw.val[i] += g;
              dw.mag[i] += std::fabs(g);
            }
            const double cc = dot * sc * sc * sc / h, ca = adot * sc * sc * sc / h;
            for (int64_t i = 0; i < h; ++i) {
              const int64_t e = r * h + i;
              dx.val[e] = sc * s.hw[i] * s.hdy[e] - s.hx[e] * cc;
              dx.mag[e] = std::fabs(sc * s.hw[i] * s.hdy[e]) + std::fabs(s.hx[e]) * ca;
              dx.err[e] = 8 * kU * dx.mag[e];
            }
          }
          for (int64_t i = 0; i < h; ++i) dw.err[i] = (rows + 4) * kU * dw.mag[i];
          return std::vector<Check>{compare("dx", down(*s.be, s.dx), dx, dt),
                                    compare("dw", down(*s.be, s.dw), dw, DType::f32)};
        });
  };
  return c;
}

// ================================================================ RoPE
OpCase rope_case(int64_t rows, int64_t heads, int64_t d, int64_t rot, DType dt, bool inverse, bool emulated) {
  OpCase c;
  c.name = std::string("rope_") + (inverse ? "inv_" : "fwd_") + dt_name(dt);
  c.op = "rope";
  c.shape = dims({rows, heads, d}) + " rot " + std::to_string(rot) + " pos<=1e6";
  c.dtype = dt_name(dt);
  c.tolerance = "8 u (|x1 cos| + |x2 sin|) (angle in double, cos/sin, scale, 2 products, 1 add in fp32); unrotated dims exact" +
                std::string(dt == DType::bf16 ? "; + 2^-8 |x'| for bf16" : "");
  c.flops = 3.0 * rows * heads * rot;
  c.bytes = double(2 * rows * heads * d * esz(dt) + rows * 4 + rot / 2 * 4);
  c.ref_cost = double(rows) * heads * rot;
  c.emulated = emulated;
  c.make = [=](Backend& be) {
    struct S {
      Backend* be;
      Tensor x, pos, freq;
      std::vector<float> hx, hf;
      std::vector<int32_t> hp;
    };
    auto s = std::make_shared<S>();
    s->be = &be;
    s->hx = stored(randn(rows * heads * d, 41), dt);
    for (int64_t r = 0; r < rows; ++r)  // small and large positions (the angle is computed in double)
      s->hp.push_back(static_cast<int32_t>(r % 3 == 0 ? r : r % 3 == 1 ? 1000003 - 7 * r : 65536 + 31 * r));
    for (int64_t i = 0; i < rot / 2; ++i)
      s->hf.push_back(static_cast<float>(std::pow(500000.0, -2.0 * i / static_cast<double>(rot))));
    s->x = up(be, s->hx, rows, heads * d, dt);
    s->pos = up_int(be, s->hp);
    s->freq = up(be, s->hf, 1, rot / 2, DType::f32);
    const float attn_scale = 1.1f;
    return instance(
        s, [=](S& s) { s.be->rope(s.x, heads, d, s.pos, s.freq, rot, attn_scale, inverse); },
        [=](S& s) {
          Ref y(rows * heads * d);
          const int64_t half = rot / 2;
          for (int64_t e = 0; e < rows * heads * d; ++e) y.val[e] = s.hx[e];
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t i = 0; i < half; ++i) {
              const double ang = double(s.hp[r]) * s.hf[i];
              const double cs = std::cos(ang) * attn_scale, sn = std::sin(ang) * attn_scale * (inverse ? -1 : 1);
              for (int64_t hh = 0; hh < heads; ++hh) {
                const int64_t b = (r * heads + hh) * d;
                const double x1 = s.hx[b + i], x2 = s.hx[b + i + half];
                y.val[b + i] = x1 * cs - x2 * sn;
                y.val[b + i + half] = x2 * cs + x1 * sn;
                y.err[b + i] = 8 * kU * (std::fabs(x1 * cs) + std::fabs(x2 * sn));
                y.err[b + i + half] = 8 * kU * (std::fabs(x2 * cs) + std::fabs(x1 * sn));
              }
            }
          auto t = tol_of(y, dt);
          for (int64_t e = 0; e < rows * heads * d; ++e)
            if ((e % d) >= rot) t[e] = 0;  // not rotated: untouched
          return std::vector<Check>{compare("x", down(*s.be, s.x), y.val, t)};
        });
  };
  return c;
}

// ================================================================ SwiGLU
OpCase swiglu_case(int64_t rows, int64_t cols, DType dt, bool backward, bool emulated) {
  OpCase c;
  c.name = std::string("swiglu_") + (backward ? "bwd_" : "fwd_") + dt_name(dt);
  c.op = backward ? "swiglu_backward" : "swiglu_forward";
  c.shape = dims({rows, cols});
  c.dtype = dt_name(dt);
  c.tolerance = std::string(backward ? "dup: 16 u |dup|; dgate: 16 u |da up sig| (1 + |g|)" : "16 u |a|") +
                " (expf within 2 ulps, a division, 3-4 products)" +
                (dt == DType::bf16 ? "; + 2^-8 |value| for bf16" : "");
  const int64_t n = rows * cols;
  c.flops = (backward ? 10.0 : 5.0) * n;
  c.bytes = double((backward ? 5 : 3) * n * esz(dt));
  c.ref_cost = double(n);
  c.emulated = emulated;
  c.make = [=](Backend& be) {
    struct S {
      Backend* be;
      Tensor g, u, da, a, dg, du;
      std::vector<float> hg, hu, hda;
    };
    auto s = std::make_shared<S>();
    s->be = &be;
    s->hg = stored(randn(n, 51, 3.0f), dt);
    s->hu = stored(randn(n, 52), dt);
    s->g = up(be, s->hg, rows, cols, dt);
    s->u = up(be, s->hu, rows, cols, dt);
    if (backward) {
      s->hda = stored(randn(n, 53), dt);
      s->da = up(be, s->hda, rows, cols, dt);
      s->dg = be.alloc(rows, cols, dt, Mem::workspace);
      s->du = be.alloc(rows, cols, dt, Mem::workspace);
    } else {
      s->a = be.alloc(rows, cols, dt, Mem::workspace);
    }
    return instance(
        s,
        [=](S& s) {
          if (backward) s.be->swiglu_backward(s.dg, s.du, s.da, s.g, s.u);
          else s.be->swiglu_forward(s.a, s.g, s.u);
        },
        [=](S& s) {
          Ref a(n), dg(n), du(n);
          for (int64_t i = 0; i < n; ++i) {
            const double g = s.hg[i], u = s.hu[i], sig = 1.0 / (1.0 + std::exp(-g));
            if (!backward) {
              a.val[i] = g * sig * u;
              a.err[i] = 16 * kU * std::fabs(a.val[i]);
            } else {
              const double da = s.hda[i];
              du.val[i] = da * g * sig;
              du.err[i] = 16 * kU * std::fabs(du.val[i]);
              dg.val[i] = da * u * sig * (1.0 + g * (1.0 - sig));
              dg.err[i] = 16 * kU * std::fabs(da * u * sig) * (1.0 + std::fabs(g));
            }
          }
          if (!backward) return std::vector<Check>{compare("a", down(*s.be, s.a), a, dt)};
          return std::vector<Check>{compare("dgate", down(*s.be, s.dg), dg, dt),
                                    compare("dup", down(*s.be, s.du), du, dt)};
        });
  };
  return c;
}

// ================================================================ embedding
OpCase embedding_case(int64_t vrows, int64_t h, int64_t tokens, int64_t v0, DType dt, bool backward, bool emulated) {
  OpCase c;
  c.name = std::string("embedding_") + (backward ? "bwd_" : "fwd_") + dt_name(dt);
  c.op = backward ? "embedding_backward" : "embedding_forward";
  c.shape = "shard " + dims({vrows, h}) + " from " + std::to_string(v0) + ", " + std::to_string(tokens) + " tokens";
  c.dtype = backward ? std::string(dt_name(dt)) + " dout, f32 dtable" : dt_name(dt);
  c.tolerance = backward ? "(count + 1) u (|dtable| + sum|dout|) per row (fp32 sums of the tokens hitting a row)"
                         : "exact (a gather; tokens outside the shard give 0)";
  c.flops = backward ? double(tokens * h) : 0.0;
  c.bytes = double(tokens * 4 + (backward ? tokens * h * (esz(dt) + 8) : tokens * h * 2 * esz(dt)));
  c.ref_cost = double(tokens) * h;
  c.emulated = emulated;
  c.make = [=](Backend& be) {
    struct S {
      Backend* be;
      Tensor table, tok, out, dout;
      std::vector<float> ht, hd;
      std::vector<int32_t> hk;
    };
    auto s = std::make_shared<S>();
    s->be = &be;
    std::mt19937_64 rng(61);
    // tokens within the shard (repeats) and outside it on both sides
    std::uniform_int_distribution<int64_t> pick(v0 - vrows / 8 - 1, v0 + vrows + vrows / 8);
    for (int64_t t = 0; t < tokens; ++t) s->hk.push_back(static_cast<int32_t>(pick(rng)));
    s->tok = up_int(be, s->hk);
    if (!backward) {
      s->ht = stored(randn(vrows * h, 62), dt);
      s->table = up(be, s->ht, vrows, h, dt);
      s->out = be.alloc(tokens, h, dt, Mem::workspace);
    } else {
      s->ht = randn(vrows * h, 63);
      s->table = up(be, s->ht, vrows, h, DType::f32);
      s->hd = stored(randn(tokens * h, 64), dt);
      s->dout = up(be, s->hd, tokens, h, dt);
    }
    return instance(
        s,
        [=](S& s) {
          if (backward) s.be->embedding_backward(s.table, s.dout, s.tok, v0);
          else s.be->embedding_forward(s.out, s.table, s.tok, v0);
        },
        [=](S& s) {
          if (!backward) {
            std::vector<double> want(tokens * h, 0.0);
            for (int64_t t = 0; t < tokens; ++t) {
              const int64_t r = s.hk[t] - v0;
              if (r >= 0 && r < vrows)
                for (int64_t i = 0; i < h; ++i) want[t * h + i] = s.ht[r * h + i];
            }
            return std::vector<Check>{exact("out", down(*s.be, s.out), want)};
          }
          Ref dt_(vrows * h);
          std::vector<int64_t> count(vrows, 0);
          for (int64_t e = 0; e < vrows * h; ++e) dt_.val[e] = s.ht[e], dt_.mag[e] = std::fabs(s.ht[e]);
          for (int64_t t = 0; t < tokens; ++t) {
            const int64_t r = s.hk[t] - v0;
            if (r < 0 || r >= vrows) continue;
            ++count[r];
            for (int64_t i = 0; i < h; ++i) {
              dt_.val[r * h + i] += s.hd[t * h + i];
              dt_.mag[r * h + i] += std::fabs(s.hd[t * h + i]);
            }
          }
          for (int64_t e = 0; e < vrows * h; ++e) dt_.err[e] = (count[e / h] + 1) * kU * dt_.mag[e];
          return std::vector<Check>{compare("dtable", down(*s.be, s.table), dt_, DType::f32)};
        });
  };
  return c;
}

}  // namespace

// ================================================================ attention geometry
int64_t AttnGeom::tk_all() const {
  int64_t n = 0;
  for (auto& b : ki) n += static_cast<int64_t>(b.size());
  return n;
}
AttnShape AttnGeom::shape() const { return {hq, hkv, d, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))}; }

AttnGeom attn_geom_doc(int64_t hq, int64_t hkv, int64_t d) {
  AttnGeom g;
  g.hq = hq, g.hkv = hkv, g.d = d;
  const int64_t tq = 70, tk = 45;
  for (int64_t i = 0; i < tq; ++i) {
    g.qi.push_back(i < 35 ? 40 + i : 75 + (tq - 1 - i));
    g.qd.push_back(static_cast<int32_t>(g.qi.back() / 30));
  }
  g.ki.resize(2);
  g.kd.resize(2);
  for (int64_t j = 0; j < tk; ++j)
    for (int b = 0; b < 2; ++b) {
      g.ki[b].push_back(b * tk + j);
      g.kd[b].push_back(static_cast<int32_t>(g.ki[b].back() / 30));
    }
  return g;
}

AttnGeom attn_geom_small() {
  AttnGeom g;
  g.hq = 4, g.hkv = 2, g.d = 8;
  const int64_t T = 24;
  for (int64_t i = 0; i < T; ++i) g.qi.push_back((i * 7) % T);
  for (int64_t i = 0; i < T; ++i) g.qd.push_back(g.qi[i] < 9 ? 0 : g.qi[i] < 17 ? 1 : 2);
  for (int64_t b = 0; b < 3; ++b) {
    g.ki.emplace_back(g.qi.begin() + b * 8, g.qi.begin() + b * 8 + 8);
    g.kd.emplace_back(g.qd.begin() + b * 8, g.qd.begin() + b * 8 + 8);
  }
  return g;
}

AttnGeom attn_geom_late_hull(int64_t hq, int64_t hkv, int64_t d) {
  AttnGeom g;
  g.hq = hq, g.hkv = hkv, g.d = d;
  for (int64_t i = 0; i < 64; ++i) {
    g.qi.push_back(136 + i);
    g.qd.push_back(1);
  }
  g.ki.resize(1);
  g.kd.resize(1);
  for (int64_t j = 0; j < 200; ++j) {
    g.ki[0].push_back(j);
    g.kd[0].push_back(j < 120 ? 0 : 1);
  }
  return g;
}

AttnGeom attn_geom_packed(int64_t T, int64_t doc_len, int64_t hq, int64_t hkv, int64_t d) {
  AttnGeom g;
  g.hq = hq, g.hkv = hkv, g.d = d;
  for (int64_t i = 0; i < T; ++i) {
    g.qi.push_back(i);
    g.qd.push_back(static_cast<int32_t>(doc_len > 0 ? i / doc_len : 0));
  }
  g.ki = {g.qi};
  g.kd = {g.qd};
  return g;
}

std::vector<int32_t> kv_hulls(const std::vector<int64_t>& q_index, const std::vector<int32_t>& q_doc,
                              const std::vector<int64_t>& k_index, const std::vector<int32_t>& k_doc) {
  std::vector<int32_t> r(2 * q_index.size(), 0);
  // keys in position order with contiguous documents (every packed geometry): binary searches
  bool sorted = true;
  for (size_t j = 1; j < k_index.size() && sorted; ++j) sorted = k_index[j] > k_index[j - 1] && k_doc[j] >= k_doc[j - 1];
  for (size_t i = 0; i < q_index.size(); ++i) {
    int64_t lo = -1, hi = -1;
    if (sorted) {
      // visible: doc == q_doc and index <= q_index, a contiguous run
      auto first = std::lower_bound(k_doc.begin(), k_doc.end(), q_doc[i]) - k_doc.begin();
      auto last = std::upper_bound(k_doc.begin(), k_doc.end(), q_doc[i]) - k_doc.begin();
      auto end = std::upper_bound(k_index.begin() + first, k_index.begin() + last, q_index[i]) - k_index.begin();
      if (end > first) lo = first, hi = end;
    } else {
      for (size_t j = 0; j < k_index.size(); ++j)
        if (k_index[j] <= q_index[i] && k_doc[j] == q_doc[i]) {
          if (lo < 0) lo = static_cast<int64_t>(j);
          hi = static_cast<int64_t>(j) + 1;
        }
    }
    r[2 * i] = lo < 0 ? 0 : static_cast<int32_t>(lo);
    r[2 * i + 1] = lo < 0 ? 0 : static_cast<int32_t>(hi);
  }
  return r;
}

std::vector<float> randn(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 r(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(r);
  return v;
}

namespace {

// Visible (query, key) pairs of g over all blocks, and the global key list.
struct Keys {
  std::vector<int64_t> idx;
  std::vector<int32_t> doc;
};
Keys all_keys(const AttnGeom& g) {
  Keys k;
  for (size_t b = 0; b < g.ki.size(); ++b) {
    k.idx.insert(k.idx.end(), g.ki[b].begin(), g.ki[b].end());
    k.doc.insert(k.doc.end(), g.kd[b].begin(), g.kd[b].end());
  }
  return k;
}
double visible_pairs(const AttnGeom& g) {
  double n = 0;
  for (size_t b = 0; b < g.ki.size(); ++b) {
    auto r = kv_hulls(g.qi, g.qd, g.ki[b], g.kd[b]);
    bool sorted = true;  // keys in position order, documents contiguous: the hull is all visible
    for (size_t j = 1; j < g.ki[b].size() && sorted; ++j)
      sorted = g.ki[b][j] > g.ki[b][j - 1] && g.kd[b][j] >= g.kd[b][j - 1];
    for (int64_t i = 0; i < g.tq(); ++i)
      if (sorted) n += r[2 * i + 1] - r[2 * i];
      else
        for (int64_t j = r[2 * i]; j < r[2 * i + 1]; ++j)
          n += (g.ki[b][j] <= g.qi[i] && g.kd[b][j] == g.qd[i]) ? 1 : 0;
  }
  return n;
}

// The float64 forward with its bounds. Per (query i, head h) and visible key j: the score's error
// E_j = u (d scale sum|q k| + |s| + |s - m| + 2) (dot product, exp argument, expf); then
// o_e: sum_j p_j |v_je - o_e| E_j + (n + 16) u sum_j p_j |v_je| (n keys summed, the rescales of
// the online softmax and the merge); lse: sum_j p_j E_j + (n + 8) u + 2 u |lse|.
void attn_fwd_ref(const AttnGeom& g, const std::vector<float>& q, const std::vector<float>& k,
                  const std::vector<float>& v, Ref& o, Ref& lse) {
  const int64_t tq = g.tq(), hq = g.hq, hkv = g.hkv, d = g.d, group = hq / hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const Keys K = all_keys(g);
  const int64_t tk = static_cast<int64_t>(K.idx.size());
  o = Ref(tq * hq * d);
  lse = Ref(tq * hq);
  std::vector<double> s(tk), es(tk);
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = h / group;
      const float* qv = &q[(i * hq + h) * d];
      double mx = -kInf;
      int64_t n = 0;
      for (int64_t j = 0; j < tk; ++j) {
        s[j] = -kInf;
        if (!(K.idx[j] <= g.qi[i] && K.doc[j] == g.qd[i])) continue;
        const float* kv = &k[(j * hkv + kh) * d];
        double acc = 0, mag = 0;
        for (int64_t e = 0; e < d; ++e) {
          acc += double(qv[e]) * kv[e];
          mag += std::fabs(double(qv[e]) * kv[e]);
        }
        s[j] = acc * scale;
        es[j] = mag * scale * d;
        mx = std::max(mx, s[j]);
        ++n;
      }
      const int64_t r = i * hq + h;
      if (n == 0) {
        lse.val[r] = -kInf;
        continue;
      }
      double sum = 0;
      for (int64_t j = 0; j < tk; ++j)
        if (s[j] > -kInf) sum += std::exp(s[j] - mx);
      lse.val[r] = mx + std::log(sum);
      double lerr = 0;
      for (int64_t j = 0; j < tk; ++j) {
        if (s[j] == -kInf) continue;
        const double p = std::exp(s[j] - mx) / sum;
        es[j] = kU * (es[j] + std::fabs(s[j]) + std::fabs(s[j] - mx) + 2);
        lerr += p * es[j];
        const float* vv = &v[(j * hkv + kh) * d];
        for (int64_t e = 0; e < d; ++e) o.val[r * d + e] += p * vv[e];
      }
      lse.err[r] = lerr + (n + 8) * kU + 2 * kU * std::fabs(lse.val[r]);
      for (int64_t j = 0; j < tk; ++j) {
        if (s[j] == -kInf) continue;
        const double p = std::exp(s[j] - mx) / sum;
        const float* vv = &v[(j * hkv + kh) * d];
        for (int64_t e = 0; e < d; ++e) {
          o.mag[r * d + e] += p * std::fabs(vv[e]);
          o.err[r * d + e] += p * std::fabs(vv[e] - o.val[r * d + e]) * es[j];
        }
      }
      for (int64_t e = 0; e < d; ++e) o.err[r * d + e] += (n + 16) * kU * o.mag[r * d + e];
    }
}

// The float64 backward from the stored o and lse (what the backend is given), with bounds:
// p = exp(s - lse) off by p E (E as in the forward, with |s - lse|); dp = do.v_j and D = do.o
// off by d u sum|do v| and d u sum|do o|; ds = p (dp - D) scale off by
// scale (p E |dp - D| + p (edp + eD)) + 3 u |ds|; each gradient element's error is the sum of its
// terms' errors plus (n + 2) u times its magnitude (n terms accumulated).
void attn_bwd_ref(const AttnGeom& g, const std::vector<float>& q, const std::vector<float>& k,
                  const std::vector<float>& v, const std::vector<float>& dout, const std::vector<float>& o,
                  const std::vector<float>& lse, const std::vector<float>& dq0, const std::vector<float>& dk0,
                  const std::vector<float>& dv0, Ref& dq, Ref& dk, Ref& dv, Ref& delta) {
  const int64_t tq = g.tq(), hq = g.hq, hkv = g.hkv, d = g.d, group = hq / hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const Keys K = all_keys(g);
  const int64_t tk = static_cast<int64_t>(K.idx.size());
  dq = Ref(tq * hq * d);
  dk = Ref(tk * hkv * d);
  dv = Ref(tk * hkv * d);
  delta = Ref(tq * hq);
  std::vector<int64_t> nq(tq, 0), nk(tk, 0);
  for (size_t e = 0; e < dq0.size(); ++e) dq.val[e] = dq0[e], dq.mag[e] = std::fabs(dq0[e]);
  for (size_t e = 0; e < dk0.size(); ++e) dk.val[e] = dk0[e], dk.mag[e] = std::fabs(dk0[e]);
  for (size_t e = 0; e < dv0.size(); ++e) dv.val[e] = dv0[e], dv.mag[e] = std::fabs(dv0[e]);
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t r = i * hq + h, kh = h / group;
      const float* qv = &q[r * d];
      const float* dov = &dout[r * d];
      const float* ov = &o[r * d];
      double D = 0, Da = 0;
      for (int64_t e = 0; e < d; ++e) {
        D += double(dov[e]) * ov[e];
        Da += std::fabs(double(dov[e]) * ov[e]);
      }
      delta.val[r] = D;
      delta.err[r] = d * kU * Da;
      const double eD = d * kU * Da;
      for (int64_t j = 0; j < tk; ++j) {
        if (!(K.idx[j] <= g.qi[i] && K.doc[j] == g.qd[i])) continue;
        const float* kv = &k[(j * hkv + kh) * d];
        const float* vv = &v[(j * hkv + kh) * d];
        double sc = 0, sa = 0, dp = 0, dpa = 0;
        for (int64_t e = 0; e < d; ++e) {
          sc += double(qv[e]) * kv[e];
          sa += std::fabs(double(qv[e]) * kv[e]);
          dp += double(dov[e]) * vv[e];
          dpa += std::fabs(double(dov[e]) * vv[e]);
        }
        sc *= scale;
        const double x = sc - lse[r], p = std::exp(x);
        const double E = kU * (d * sa * scale + std::fabs(sc) + std::fabs(x) + 2);
        const double ds = p * (dp - D) * scale;
        const double eds = scale * (p * E * std::fabs(dp - D) + p * (d * kU * dpa + eD)) + 3 * kU * std::fabs(ds);
        ++nq[i];
        ++nk[j];
        for (int64_t e = 0; e < d; ++e) {
          const int64_t qe = r * d + e, ke = (j * hkv + kh) * d + e;
          dq.val[qe] += ds * kv[e];
          dq.mag[qe] += std::fabs(ds * kv[e]);
          dq.err[qe] += eds * std::fabs(kv[e]);
          dk.val[ke] += ds * qv[e];
          dk.mag[ke] += std::fabs(ds * qv[e]);
          dk.err[ke] += eds * std::fabs(qv[e]);
          dv.val[ke] += p * dov[e];
          dv.mag[ke] += std::fabs(p * dov[e]);
          dv.err[ke] += p * E * std::fabs(dov[e]);
        }
      }
    }
  for (int64_t e = 0; e < tq * hq * d; ++e) dq.err[e] += (nq[e / (hq * d)] + 2) * kU * dq.mag[e];
  for (int64_t e = 0; e < tk * hkv * d; ++e) {
    dk.err[e] += (nk[e / (hkv * d)] + 2) * kU * dk.mag[e];
    dv.err[e] += (nk[e / (hkv * d)] + 2) * kU * dv.mag[e];
  }
}

// bf16 attention inputs run on tensor cores on the CUDA backends (attention_mma, the
// FlashAttention-2 convention): P (o, dv) and dS (dq, dk) are rounded to bf16 before the second
// product, which moves a sum_j w_j x_j by at most 2^-8 sum_j |w_j x_j| (the terms' magnitude,
// the accumulated output's initial value excluded).
Ref with_rounded_weights(Ref r, const std::vector<float>& init) {
  for (size_t i = 0; i < r.err.size(); ++i) r.err[i] += kBf * (r.mag[i] - (init.empty() ? 0.0 : std::fabs(init[i])));
  return r;
}

// Rows [r0, r0 + n) of a Ref with `cols` columns.
Ref rows_of(const Ref& r, int64_t r0, int64_t n, int64_t cols) {
  Ref o;
  o.val.assign(r.val.begin() + r0 * cols, r.val.begin() + (r0 + n) * cols);
  o.err.assign(r.err.begin() + r0 * cols, r.err.begin() + (r0 + n) * cols);
  o.mag.assign(r.mag.begin() + r0 * cols, r.mag.begin() + (r0 + n) * cols);
  return o;
}

std::string attn_shape_str(const AttnGeom& g) {
  std::string s = "tq " + std::to_string(g.tq()) + " tk";
  for (size_t b = 0; b < g.ki.size(); ++b) s += std::string(b ? "+" : " ") + std::to_string(g.tk(b));
  return s + " hq " + std::to_string(g.hq) + " hkv " + std::to_string(g.hkv) + " d " + std::to_string(g.d);
}

// The attention tensors of one geometry on one backend: inputs stored as `din`, outputs `dout_t`.
struct AttnTensors {
  Backend* be = nullptr;
  AttnGeom g;
  std::vector<float> hq, hk, hv;  // k, v: all blocks' rows
  Tensor q, k, v, qi, qd;
  std::vector<Tensor> ki, kd, range;
  int64_t row0(size_t b) const {
    int64_t r = 0;
    for (size_t c = 0; c < b; ++c) r += g.tk(c);
    return r;
  }
  KeyBlock kb(size_t b) const { return {{ki[b], kd[b]}, range[b]}; }
  void init(Backend& be_, const AttnGeom& geom, DType din, uint64_t seed) {
    be = &be_;
    g = geom;
    const int64_t tk = g.tk_all();
    hq = stored(randn(g.tq() * g.hq * g.d, seed), din);
    hk = stored(randn(tk * g.hkv * g.d, seed + 1), din);
    hv = stored(randn(tk * g.hkv * g.d, seed + 2), din);
    q = up(be_, hq, g.tq(), g.hq * g.d, din);
    k = up(be_, hk, tk, g.hkv * g.d, din);
    v = up(be_, hv, tk, g.hkv * g.d, din);
    qi = up_int(be_, g.qi);
    qd = up_int(be_, g.qd);
    for (size_t b = 0; b < g.ki.size(); ++b) {
      ki.push_back(up_int(be_, g.ki[b]));
      kd.push_back(up_int(be_, g.kd[b]));
      range.push_back(up_int(be_, kv_hulls(g.qi, g.qd, g.ki[b], g.kd[b]), g.tq()));
    }
  }
  View kblk(size_t b) const { return View(k).row_range(row0(b), g.tk(b)); }
  View vblk(size_t b) const { return View(v).row_range(row0(b), g.tk(b)); }
};

std::string attn_name(const std::string& pass, const std::string& tag, DType din, DType dout) {
  return "attention_" + pass + "_" + tag + "_" + dt_name(din) + (din != dout ? std::string("_to_") + dt_name(dout) : "");
}

OpCase attention_fwd_case(const std::string& tag, const AttnGeom& geom, DType din, DType dout, bool emulated) {
  OpCase c;
  c.name = attn_name("fwd", tag, din, dout);
  c.op = "attention_forward_block x" + std::to_string(geom.ki.size());
  c.shape = attn_shape_str(geom);
  c.dtype = din == dout ? dt_name(din) : std::string(dt_name(din)) + ">" + dt_name(dout);
  c.tolerance = "per element: sum_j p_j |v_j - o| E_j + (n + 16) u sum_j p_j |v_j|, E_j = u (d scale sum|q k| + |s| + 2) "
                "(score rounding through the softmax, n keys summed); bf16 inputs: + 2^-8 sum_j p_j |v_j| (P rounded to bf16 "
                "for the tensor cores)" +
                std::string(dout == DType::bf16 ? "; + 2^-8 (|o| + sum p|v|) for the bf16 o rounded at each of 2 merges" : "");
  const double pairs = visible_pairs(geom);
  c.flops = 4.0 * geom.d * geom.hq * pairs;
  c.bytes = double(esz(din) * (geom.tq() * geom.hq + 2 * geom.tk_all() * geom.hkv) * geom.d +
                   esz(dout) * geom.tq() * geom.hq * geom.d * 2 * geom.ki.size() + 8.0 * geom.tq() * geom.hq * geom.ki.size());
  c.ref_cost = 2.0 * geom.d * geom.hq * pairs;
  c.emulated = emulated;
  c.make = [=](Backend& be) {
    struct S {
      AttnTensors t;
      Tensor o, lse;
    };
    auto s = std::make_shared<S>();
    s->t.init(be, geom, din, 80 + geom.d);
    s->o = be.alloc(geom.tq(), geom.hq * geom.d, dout, Mem::workspace);
    s->lse = be.alloc(geom.tq(), geom.hq, DType::f32, Mem::workspace);
    be.zero(s->o);
    be.fill(s->lse, -std::numeric_limits<float>::infinity());
    return instance(
        s,
        [](S& s) {
          // the key blocks in reverse order: the merge must not depend on the causal one
          for (size_t b = s.t.g.ki.size(); b-- > 0;)
            s.t.be->attention_forward_block(s.o, s.lse, s.t.q, {s.t.qi, s.t.qd}, s.t.kblk(b), s.t.vblk(b), s.t.kb(b),
                                            s.t.g.shape());
        },
        [=](S& s) {
          Ref o, lse;
          attn_fwd_ref(s.t.g, s.t.hq, s.t.hk, s.t.hv, o, lse);
          const int calls = static_cast<int>(s.t.g.ki.size());
          if (din == DType::bf16) o = with_rounded_weights(o, {});
          return std::vector<Check>{compare("o", down(*s.t.be, s.o), o, dout, calls),
                                    compare("lse", down(*s.t.be, s.lse), lse, DType::f32)};
        });
  };
  return c;
}

OpCase attention_bwd_case(const std::string& tag, const AttnGeom& geom, DType din, DType dout, bool emulated,
                          bool backend_forward) {
  OpCase c;
  c.name = attn_name("bwd", tag, din, dout);
  c.op = "attention_delta + attention_backward_block x" + std::to_string(geom.ki.size());
  c.shape = attn_shape_str(geom);
  c.dtype = din == dout ? dt_name(din) : std::string(dt_name(din)) + ">" + dt_name(dout);
  c.tolerance = "per element: the errors of ds = p (dp - D) scale (score, dp and D dot products) times |k|, |q|, |do|, plus "
                "(n + 2) u sum|terms|; bf16 inputs: + 2^-8 sum|terms| (P, dS rounded to bf16 for the tensor cores)" +
                std::string(dout == DType::bf16 ? "; + 2^-8 (|g| + (calls-1) sum|terms|) for bf16 dq (2 calls), dk, dv" : "");
  const double pairs = visible_pairs(geom);
  c.flops = 10.0 * geom.d * geom.hq * pairs;
  c.bytes = double(esz(din) * (3 * geom.tq() * geom.hq + 2 * geom.tk_all() * geom.hkv) * geom.d +
                   esz(dout) * 2 * (geom.tq() * geom.hq * geom.ki.size() + 2 * geom.tk_all() * geom.hkv) * geom.d +
                   12.0 * geom.tq() * geom.hq);
  c.ref_cost = 4.0 * geom.d * geom.hq * pairs;
  c.emulated = emulated;
  c.make = [=](Backend& be) {
    struct S {
      AttnTensors t;
      std::vector<float> hdo, ho, hl, hdq, hdk, hdv;
      Tensor dout_, o, lse, delta, dq;
      std::vector<Tensor> dk, dv;
    };
    auto s = std::make_shared<S>();
    AttnTensors& t = s->t;
    t.init(be, geom, din, 80 + geom.d);
    const int64_t tq = geom.tq(), tk = geom.tk_all(), qw = geom.hq * geom.d, kw = geom.hkv * geom.d;
    s->hdo = stored(randn(tq * qw, 85), din);
    s->dout_ = up(be, s->hdo, tq, qw, din);
    s->o = be.alloc(tq, qw, din, Mem::workspace);
    s->lse = be.alloc(tq, geom.hq, DType::f32, Mem::workspace);
    if (!backend_forward) {
      // o and lse from the float64 forward, stored as the backend would hold them
      Ref o, lse;
      attn_fwd_ref(geom, t.hq, t.hk, t.hv, o, lse);
      s->ho.assign(o.val.begin(), o.val.end());
      s->ho = stored(s->ho, din);
      s->hl.assign(lse.val.begin(), lse.val.end());
      be.upload(s->o, s->ho.data());
      be.upload(s->lse, s->hl.data());
    } else {  // perf shapes: the backend's own forward (the float64 one would take hours)
      be.zero(s->o);
      be.fill(s->lse, -std::numeric_limits<float>::infinity());
      for (size_t b = 0; b < geom.ki.size(); ++b)
        be.attention_forward_block(s->o, s->lse, t.q, {t.qi, t.qd}, t.kblk(b), t.vblk(b), t.kb(b), geom.shape());
    }
    s->delta = be.alloc(tq, geom.hq, DType::f32, Mem::workspace);
    s->hdq = stored(randn(tq * qw, 90, 0.1f), dout);
    s->hdk = stored(randn(tk * kw, 91, 0.1f), dout);
    s->hdv = stored(randn(tk * kw, 92, 0.1f), dout);
    s->dq = up(be, s->hdq, tq, qw, dout);
    for (size_t b = 0; b < geom.ki.size(); ++b) {
      const int64_t r0 = t.row0(b), n = geom.tk(b);
      s->dk.push_back(up(be, std::vector<float>(s->hdk.begin() + r0 * kw, s->hdk.begin() + (r0 + n) * kw), n, kw, dout));
      s->dv.push_back(up(be, std::vector<float>(s->hdv.begin() + r0 * kw, s->hdv.begin() + (r0 + n) * kw), n, kw, dout));
    }
    return instance(
        s,
        [](S& s) {
          const AttnShape sh = s.t.g.shape();
          s.t.be->attention_delta(s.delta, s.dout_, s.o, sh);
          for (size_t b = 0; b < s.t.g.ki.size(); ++b)  // block by block, as the ring does
            s.t.be->attention_backward_block(s.dq, s.dk[b], s.dv[b], s.t.q, {s.t.qi, s.t.qd}, s.t.kblk(b),
                                             s.t.vblk(b), s.t.kb(b), s.dout_, s.lse, s.delta, sh);
        },
        [=](S& s) {
          if (s.ho.empty()) {
            s.ho = down(*s.t.be, s.o);
            s.hl = down(*s.t.be, s.lse);
          }
          Ref dq, dk, dv, delta;
          attn_bwd_ref(s.t.g, s.t.hq, s.t.hk, s.t.hv, s.hdo, s.ho, s.hl, s.hdq, s.hdk, s.hdv, dq, dk, dv, delta);
          const int calls = static_cast<int>(s.t.g.ki.size());
          if (din == DType::bf16) {
            dq = with_rounded_weights(dq, s.hdq);
            dk = with_rounded_weights(dk, s.hdk);
            dv = with_rounded_weights(dv, s.hdv);
          }
          std::vector<Check> out{compare("delta", down(*s.t.be, s.delta), delta, DType::f32),
                                 compare("dq", down(*s.t.be, s.dq), dq, dout, calls)};
          for (size_t b = 0; b < s.t.g.ki.size(); ++b) {
            const int64_t r0 = s.t.row0(b), n = s.t.g.tk(b);
            const std::string sfx = s.t.g.ki.size() > 1 ? " block " + std::to_string(b) : "";
            out.push_back(compare("dk" + sfx, down(*s.t.be, s.dk[b]), rows_of(dk, r0, n, kw), dout));
            out.push_back(compare("dv" + sfx, down(*s.t.be, s.dv[b]), rows_of(dv, r0, n, kw), dout));
          }
          return out;
        });
  };
  return c;
}

// ================================================================ cross-entropy
OpCase xent_case(int64_t rows, int64_t cols, int64_t valid, int64_t v0, std::vector<int32_t> targets, bool emulated) {
  OpCase c;
  c.name = "xent_pieces_f32";
  c.op = "row_max + sumexp_and_target + xent_finish + copy + xent_grad_inplace";
  c.shape = dims({rows, cols}) + " valid " + std::to_string(valid) + " from " + std::to_string(v0);
  c.dtype = "f32";
  c.tolerance = "max, target logit exact; sumexp 4 u (positive terms, double sum); lse 4 u (|max| + |log se|) + 4 u; "
                "loss sum_rows of those; grad 8 u (|g| + w) + |g| tol(lse)";
  c.flops = 5.0 * rows * valid;
  c.bytes = double(rows * cols * 4 * 4 + rows * 24);
  c.ref_cost = double(rows) * cols;
  c.emulated = emulated;
  c.make = [=](Backend& be) {
    struct S {
      Backend* be;
      std::vector<float> hl;
      std::vector<int32_t> ht;
      Tensor logits, grad, mx, se, lse, stats, target;
    };
    auto s = std::make_shared<S>();
    s->be = &be;
    s->hl = randn(rows * cols, 71, 3.0f);
    s->ht = targets;
    if (s->ht.empty()) {
      std::mt19937_64 rng(72);
      std::uniform_int_distribution<int64_t> pick(-1, valid - 1);
      for (int64_t r = 0; r < rows; ++r) s->ht.push_back(static_cast<int32_t>(pick(rng) < 0 ? -1 : v0 + pick(rng)));
    }
    s->logits = up(be, s->hl, rows, cols, DType::f32);
    s->grad = be.alloc(rows, cols, DType::f32, Mem::workspace);
    s->target = up_int(be, s->ht);
    s->mx = be.alloc(rows, 1, DType::f32, Mem::workspace);
    s->se = be.alloc(rows, 2, DType::f32, Mem::workspace);
    s->lse = be.alloc(rows, 1, DType::f32, Mem::workspace);
    s->stats = up(be, {0.5f, 0.0f, 0.0f}, 1, kStepStats, DType::f32);
    const float w = 0.25f;
    return instance(
        s,
        [=](S& s) {
          s.be->row_max(s.mx, s.logits, valid);
          s.be->sumexp_and_target(s.se, s.logits, s.mx, s.target, valid, v0);
          s.be->xent_finish(s.lse, s.stats, s.mx, s.se, s.target);
          s.be->copy(s.grad, s.logits);
          s.be->xent_grad_inplace(s.grad, s.lse, s.target, w, valid, v0);
        },
        [=](S& s) {
          std::vector<double> mx(rows), tgt(rows);
          Ref se(rows), lse(rows), loss(1), grad(rows * cols);
          loss.val[0] = 0.5;
          for (int64_t r = 0; r < rows; ++r) {
            const float* lr = &s.hl[r * cols];
            float m = -std::numeric_limits<float>::infinity();
            for (int64_t c2 = 0; c2 < valid; ++c2) m = std::max(m, lr[c2]);
            mx[r] = m;
            double sum = 0;
            for (int64_t c2 = 0; c2 < valid; ++c2) sum += std::exp(double(lr[c2]) - m);
            se.val[r] = sum;
            se.err[r] = 4 * kU * sum;
            const int64_t t = int64_t(s.ht[r]) - v0;
            const bool has = s.ht[r] >= 0 && t >= 0 && t < valid;
            tgt[r] = has ? lr[t] : 0.0;
            lse.val[r] = m + std::log(sum);
            lse.err[r] = 4 * kU * (std::fabs(m) + std::fabs(std::log(sum))) + 4 * kU;
            if (s.ht[r] >= 0) {
              loss.val[0] += lse.val[r] - tgt[r];
              loss.err[0] += lse.err[r] + 2 * kU * (std::fabs(lse.val[r]) + std::fabs(tgt[r]));
            }
            const double wr = s.ht[r] >= 0 ? w : 0.0;
            for (int64_t c2 = 0; c2 < cols; ++c2) {
              const int64_t e = r * cols + c2;
              if (c2 >= valid || wr == 0) continue;
              const double p = wr * std::exp(double(lr[c2]) - lse.val[r]);
              grad.val[e] = p - (has && c2 == t ? wr : 0.0);
              grad.err[e] = 8 * kU * (p + (has && c2 == t ? wr : 0.0)) + p * kSafety * lse.err[r];
            }
          }
          loss.err[0] += 2 * kU * std::fabs(loss.val[0]);
          auto se_got = down(*s.be, s.se);
          std::vector<float> se0(rows), se1(rows);
          for (int64_t r = 0; r < rows; ++r) se0[r] = se_got[2 * r], se1[r] = se_got[2 * r + 1];
          auto st = down(*s.be, s.stats);
          return std::vector<Check>{exact("row_max", down(*s.be, s.mx), mx),
                                    compare("sumexp", se0, se, DType::f32),
                                    exact("target logit", se1, tgt),
                                    compare("lse", down(*s.be, s.lse), lse, DType::f32),
                                    compare("loss statistic", {st[kStatLossSum]}, loss, DType::f32),
                                    compare("grad", down(*s.be, s.grad), grad, DType::f32)};
        });
  };
  return c;
}

// ================================================================ AdamW
OpCase adamw_case(const std::string& tag, int64_t n, float clip, bool skip, bool emulated) {
  OpCase c;
  c.name = "adamw_" + tag + "_f32";
  c.op = "adamw";
  c.shape = std::to_string(n) + " params" + (clip > 0 ? ", clip " + std::to_string(clip).substr(0, 3) : "") +
            (skip ? ", non-finite flag set" : "");
  c.dtype = "f32";
  c.tolerance = skip ? "exact: the step is skipped, nothing changes"
                     : "m, v: 8 u (terms); master: 2 u |p| + 16 u lr (|update| + wd |p|) (bias corrections in double, "
                       "sqrt, division, fp32 products)";
  c.flops = 14.0 * n;
  c.bytes = double(n) * 4 * 7;
  c.ref_cost = double(n);
  c.emulated = emulated;
  c.make = [=](Backend& be) {
    struct S {
      Backend* be;
      std::vector<float> hp, hm, hv, hg, hs;
      Tensor p, m, v, g, stats;
    };
    auto s = std::make_shared<S>();
    s->be = &be;
    s->hp = randn(n, 101);
    s->hm = randn(n, 102, 0.1f);
    s->hv = randn(n, 103, 0.1f);
    for (auto& x : s->hv) x = x * x;
    s->hg = randn(n, 104, 0.5f);
    double g2 = 0;
    for (float x : s->hg) g2 += double(x) * x;
    s->hs = {3.0f, skip ? 7.0f : 0.0f, static_cast<float>(g2)};
    s->p = up(be, s->hp, 1, n, DType::f32);
    s->m = up(be, s->hm, 1, n, DType::f32);
    s->v = up(be, s->hv, 1, n, DType::f32);
    s->g = up(be, s->hg, 1, n, DType::f32);
    s->stats = up(be, s->hs, 1, kStepStats, DType::f32);
    AdamWArgs a;
    a.lr = 1e-2f;
    a.weight_decay = 0.1f;
    a.decay = 1;
    a.clip = clip;
    a.step = 3;
    return instance(
        s, [=](S& s) { s.be->adamw(s.p, s.m, s.v, s.g, s.stats, a); },
        [=](S& s) {
          Ref p(n), m(n), v(n);
          const double norm = std::sqrt(double(s.hs[kStatGradNorm2]));
          const double gs = (a.clip > 0 && norm > a.clip) ? double(static_cast<float>(a.clip / (norm + 1e-6))) : 1.0;
          const double b1 = a.beta1, b2 = a.beta2;
          const double bc1 = 1 - std::pow(b1, double(a.step)), bc2 = 1 - std::pow(b2, double(a.step));
          for (int64_t i = 0; i < n; ++i) {
            if (skip) {
              p.val[i] = s.hp[i], m.val[i] = s.hm[i], v.val[i] = s.hv[i];
              continue;
            }
            const double g = s.hg[i] * gs;
            m.val[i] = b1 * s.hm[i] + (1 - b1) * g;
            m.err[i] = 8 * kU * (b1 * std::fabs(s.hm[i]) + (1 - b1) * std::fabs(g));
            v.val[i] = b2 * s.hv[i] + (1 - b2) * g * g;
            v.err[i] = 8 * kU * (b2 * s.hv[i] + (1 - b2) * g * g);
            const double upd = (m.val[i] / bc1) / (std::sqrt(v.val[i] / bc2) + double(a.eps));
            p.val[i] = s.hp[i] - double(a.lr) * (upd + double(a.weight_decay) * s.hp[i]);
            p.err[i] = 2 * kU * (std::fabs(s.hp[i]) + std::fabs(p.val[i])) +
                       16 * kU * a.lr * (std::fabs(upd) + a.weight_decay * std::fabs(s.hp[i])) +
                       a.lr * std::fabs(upd) * (m.err[i] / std::max(std::fabs(m.val[i]), 1e-30) + v.err[i] / std::max(v.val[i], 1e-30));
          }
          return std::vector<Check>{compare("master", down(*s.be, s.p), p, DType::f32),
                                    compare("m", down(*s.be, s.m), m, DType::f32),
                                    compare("v", down(*s.be, s.v), v, DType::f32)};
        });
  };
  return c;
}

// ================================================================ copy f32 <-> bf16
// Round to nearest even, computed independently of executor/bf16.hpp: the two bf16 neighbours
// of f, the nearer in float64, ties to the even one; NaN and infinities stay.
double ref_round_bf16(float f) {
  if (std::isnan(f) || std::isinf(f)) return f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t lo_bits = u & 0xffff0000u, hi_bits = lo_bits + 0x10000u;
  float lo, hi;
  std::memcpy(&lo, &lo_bits, 4);
  std::memcpy(&hi, &hi_bits, 4);
  const double hi_d = std::isinf(hi) ? std::copysign(std::ldexp(1.0, 128), hi) : double(hi);
  const double dl = std::fabs(double(f) - lo), dh = std::fabs(hi_d - f);
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo_bits & 0x10000u) ? hi : lo;
}

OpCase copy_case(int64_t n, DType from, DType to, bool emulated) {
  OpCase c;
  c.name = std::string("copy_") + dt_name(from) + "_to_" + dt_name(to);
  c.op = "copy";
  c.shape = std::to_string(n) + (from == DType::f32 ? " incl. ties, NaN, inf, overflow, subnormals" : "");
  c.dtype = std::string(dt_name(from)) + ">" + dt_name(to);
  c.tolerance = "exact (round to nearest even, ties to even; widening is exact)";
  c.bytes = double(n * (esz(from) + esz(to)));
  c.ref_cost = double(n);
  c.emulated = emulated;
  c.make = [=](Backend& be) {
    struct S {
      Backend* be;
      std::vector<float> hx;
      Tensor x, y;
    };
    auto s = std::make_shared<S>();
    s->be = &be;
    s->hx = randn(n, 111, 100.0f);
    const float specials[] = {1.0f + 0x1p-8f,  1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), std::nanf(""),
                              INFINITY,        -INFINITY,          3.4e38f,            -3.4e38f,
                              0x1p-130f,       -0x1.0181p-127f,    0.0f,               -0.0f};
    for (size_t i = 0; i < std::size(specials) && i < s->hx.size(); ++i) s->hx[i * 7 % n] = specials[i];
    s->hx = stored(s->hx, from);
    s->x = up(be, s->hx, 1, n, from);
    s->y = be.alloc(1, n, to, Mem::workspace);
    return instance(
        s, [](S& s) { s.be->copy(s.y, s.x); },
        [=](S& s) {
          std::vector<double> want(n);
          for (int64_t i = 0; i < n; ++i) want[i] = to == DType::bf16 ? ref_round_bf16(s.hx[i]) : double(s.hx[i]);
          return std::vector<Check>{exact("y", down(*s.be, s.y), want)};
        });
  };
  return c;
}

}  // namespace

std::string Check::describe() const {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s: max |err| %.3g, worst err/tol %.3g at element %lld (got %.9g, reference %.9g, tol %.3g)",
                what.c_str(), max_abs_err, worst, static_cast<long long>(at), got, want, tol);
  return buf;
}

void attention_reference(const AttnGeom& g, const std::vector<double>& q, const std::vector<double>& k,
                         const std::vector<double>& v, std::vector<double>& o, std::vector<double>& lse) {
  // the double inputs as floats would lose the finite-difference perturbations: a direct float64 pass
  const int64_t tq = g.tq(), hq = g.hq, hkv = g.hkv, d = g.d, group = hq / hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const Keys K = all_keys(g);
  const int64_t tk = static_cast<int64_t>(K.idx.size());
  o.assign(tq * hq * d, 0.0);
  lse.assign(tq * hq, -kInf);
  std::vector<double> s(tk);
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = h / group, r = i * hq + h;
      double mx = -kInf;
      for (int64_t j = 0; j < tk; ++j) {
        s[j] = -kInf;
        if (!(K.idx[j] <= g.qi[i] && K.doc[j] == g.qd[i])) continue;
        double acc = 0;
        for (int64_t e = 0; e < d; ++e) acc += q[r * d + e] * k[(j * hkv + kh) * d + e];
        s[j] = acc * scale;
        mx = std::max(mx, s[j]);
      }
      if (mx == -kInf) continue;
      double sum = 0;
      for (int64_t j = 0; j < tk; ++j)
        if (s[j] > -kInf) sum += std::exp(s[j] - mx);
      lse[r] = mx + std::log(sum);
      for (int64_t j = 0; j < tk; ++j)
        if (s[j] > -kInf)
          for (int64_t e = 0; e < d; ++e) o[r * d + e] += std::exp(s[j] - mx) / sum * v[(j * hkv + kh) * d + e];
    }
}

std::vector<OpCase> test_cases() {
  const DType F = DType::f32, B = DType::bf16;
  std::vector<OpCase> v;
  // GEMM: all transposes (sizes not multiples of any tile), beta 0.5, the mixed-dtype forms, k = 0
  for (int t = 0; t < 4; ++t) v.push_back(gemm_case("", 37, 29, 45, t & 2, t & 1, F, F, F, 0.75f, 0.5f, true));
  v.push_back(gemm_case("", 37, 29, 45, false, true, B, B, B, 1.0f, 0.0f, true));
  v.push_back(gemm_case("acc", 37, 29, 45, true, false, B, B, F, 1.0f, 1.0f, true));  // weight gradient into f32
  v.push_back(gemm_case("", 37, 29, 45, false, false, F, B, F, 1.0f, 0.0f, true));   // f32 logits grad x bf16 head
  v.push_back(gemm_case("k0", 5, 7, 0, false, false, F, F, F, 1.0f, 0.5f, true));
  for (DType dt : {F, B}) {
    v.push_back(rmsnorm_fwd_case(33, 200, dt, true));
    v.push_back(rmsnorm_bwd_case(33, 200, dt, true));
    v.push_back(rope_case(19, 3, 24, 16, dt, false, true));
    v.push_back(swiglu_case(37, 53, dt, false, true));
    v.push_back(swiglu_case(37, 53, dt, true, true));
    v.push_back(embedding_case(50, 24, 40, 100, dt, false, true));
    v.push_back(embedding_case(50, 24, 40, 100, dt, true, true));
  }
  v.push_back(rope_case(19, 3, 24, 16, F, true, true));
  // attention: documents, zig-zag order, two merged key blocks, hulls; GQA 4:1 and 8:1; head dims
  // 20 (not a multiple of any tile), 64, 128; a late hull; bf16 storage and fp32 accumulators
  v.push_back(attention_fwd_case("doc_gqa4_d64", attn_geom_doc(8, 2, 64), F, F, true));
  v.push_back(attention_fwd_case("doc_gqa4_d20", attn_geom_doc(8, 2, 20), F, F, false));
  v.push_back(attention_fwd_case("doc_gqa8_d128", attn_geom_doc(8, 1, 128), F, F, false));
  v.push_back(attention_fwd_case("perm_mha_d8", attn_geom_small(), F, F, false));
  v.push_back(attention_fwd_case("late_hull_gqa4_d32", attn_geom_late_hull(4, 1, 32), F, F, true));
  v.push_back(attention_fwd_case("doc_gqa4_d64", attn_geom_doc(8, 2, 64), B, B, true));
  v.push_back(attention_fwd_case("doc_gqa4_d64", attn_geom_doc(8, 2, 64), B, F, false));
  v.push_back(attention_bwd_case("doc_gqa4_d64", attn_geom_doc(8, 2, 64), F, F, true, false));
  v.push_back(attention_bwd_case("doc_gqa4_d20", attn_geom_doc(8, 2, 20), F, F, false, false));
  v.push_back(attention_bwd_case("doc_gqa8_d128", attn_geom_doc(8, 1, 128), F, F, false, false));
  v.push_back(attention_bwd_case("perm_mha_d8", attn_geom_small(), F, F, false, false));
  v.push_back(attention_bwd_case("late_hull_gqa4_d32", attn_geom_late_hull(4, 1, 32), F, F, false, false));
  v.push_back(attention_bwd_case("doc_gqa4_d64", attn_geom_doc(8, 2, 64), B, B, true, false));
  v.push_back(attention_bwd_case("doc_gqa4_d64", attn_geom_doc(8, 2, 64), B, F, false, false));
  // cross-entropy: targets first and last valid, past valid, below the shard, ignored, inside
  v.push_back(xent_case(6, 1000, 990, 2000, {2000, 2989, 2990, 1999, -1, 2500}, true));
  v.push_back(adamw_case("clip", 1000, 1.0f, false, true));
  v.push_back(adamw_case("noclip", 1000, 0.0f, false, true));
  v.push_back(adamw_case("skip", 1000, 1.0f, true, true));
  v.push_back(copy_case(1000, F, B, true));
  v.push_back(copy_case(1000, B, F, true));
  for (auto& c : v) c.emulated = true;  // the whole list runs on cuda-emulated in about a second
  return v;
}

std::vector<OpCase> perf_cases(bool reduced) {
  const DType F = DType::f32, B = DType::bf16;
  const int64_t r = reduced ? 8 : 1;  // reduced: dims / 8 (GEMM), tokens / 8 (attention), rows / 16 (rest)
  std::vector<OpCase> v;
  auto tagged = [](OpCase c, const std::string& tag) {
    c.name += "_" + tag;
    return c;
  };
  // GEMM: 8192^3, and Llama-3-8B (hidden 4096, 32/8 heads of 128, MLP 14336, vocab 128256) at 4K tokens
  const int64_t T = 4096 / r, H = 4096 / r, F2 = 14336 / r, QKV = 6144 / r, V = 128256 / r, G = 8192 / r;
  v.push_back(tagged(gemm_case("sq", G, G, G, false, false, B, B, B, 1, 0, false), std::to_string(G)));
  v.push_back(tagged(gemm_case("sq", G, G, G, false, false, F, F, F, 1, 0, false), std::to_string(G)));
  v.push_back(gemm_case("l8b_qkv", T, QKV, H, false, true, B, B, B, 1, 0, false));
  v.push_back(gemm_case("l8b_o", T, H, H, false, true, B, B, B, 1, 0, false));
  v.push_back(gemm_case("l8b_gateup", T, 2 * F2, H, false, true, B, B, B, 1, 0, false));
  v.push_back(gemm_case("l8b_down", T, H, F2, false, true, B, B, B, 1, 0, false));
  v.push_back(gemm_case("l8b_down_dgrad", T, F2, H, false, false, B, B, B, 1, 0, false));
  v.push_back(gemm_case("l8b_gateup_wgrad", 2 * F2, H, T, true, false, B, B, F, 1, 1, false));
  v.push_back(gemm_case("l8b_lmhead", T, V, H, false, true, B, B, B, 1, 0, false));
  // attention: head_dim 128, 32 query heads (reduced: 8), GQA 4:1 and 8:1, causal and documents
  const int64_t hq = reduced ? 8 : 32;
  struct A {
    int64_t T, doc, hkv;
    DType dt;
  };
  std::vector<A> attn = {{8192, 0, hq / 4, B}, {16384, 0, hq / 4, B}, {32768, 0, hq / 4, B}, {16384, 0, hq / 8, B},
                         {32768, 0, hq / 8, B}, {16384, 2048, hq / 4, B}, {32768, 4096, hq / 4, B}, {8192, 0, hq / 4, F}};
  for (const A& a : attn) {
    const int64_t t = a.T / (reduced ? 16 : 1);  // reduced: 512 to 2K tokens
    const std::string tag = (t >= 1024 ? std::to_string(t / 1024) + "k_" : std::to_string(t) + "_") + (a.doc ? "doc" + std::to_string(a.doc / (reduced ? 16 : 1)) : "causal") +
                            "_gqa" + std::to_string(hq / a.hkv) + "_d128";
    auto g = attn_geom_packed(t, a.doc / (reduced ? 16 : 1), hq, a.hkv, 128);
    v.push_back(attention_fwd_case(tag, g, a.dt, a.dt, false));
    v.push_back(attention_bwd_case(tag, g, a.dt, a.dt, false, true));
  }
  // the rest at Llama-8B sizes, 16K tokens
  const int64_t R = 16384 / (reduced ? 16 : 1);
  v.push_back(rmsnorm_fwd_case(R, 4096, B, false));
  v.push_back(rmsnorm_bwd_case(R, 4096, B, false));
  v.push_back(rope_case(R, 32, 128, 128, B, false, false));
  v.push_back(swiglu_case(R, 14336, B, false, false));
  v.push_back(swiglu_case(R, 14336, B, true, false));
  v.push_back(embedding_case(128256 / (reduced ? 16 : 1), 4096, R, 0, B, false, false));
  v.push_back(embedding_case(128256 / (reduced ? 16 : 1), 4096, R, 0, B, true, false));
  v.push_back(xent_case(4096 / (reduced ? 16 : 1), 128256, 128256, 0, {}, false));
  v.push_back(adamw_case("clip", (int64_t(1) << 28) / (reduced ? 16 : 1), 1.0f, false, false));
  v.push_back(copy_case((int64_t(1) << 28) / (reduced ? 16 : 1), F, B, false));
  v.push_back(copy_case((int64_t(1) << 28) / (reduced ? 16 : 1), B, F, false));
  return v;
}

}  // namespace ctx::exec::opcases
