// The tensor-core attention's kernel source (executor/cuda/attention_mma_kernels.cuh: mma.sync
// m16n8k16 bf16 -> fp32, FlashAttention-2 structure) run on the CPU by the emulator of the CUDA
// execution model (cuda_emulator.hpp, mma fragments by mma_emulator.hpp) with the shared-memory
// race detector, randomised block/thread order and the sm_90 launch limits on, and compared with a
// float64 reference computed here from the same bf16-rounded inputs. Label "cpu".
//
// Cases: document masks, GQA 4:1 and 8:1 (and 2:1), head dims 16, 32, 48, 64, 128 (48: a head dim
// below its template bucket), lengths that are not multiples of the tiles, hulls narrowed to half,
// a late-starting hull (from key 120 of 200) and empty hulls, two key blocks merged in sequence =
// one block holding both, float and bf16 outputs, 16- and 4-byte global->shared copies.
//
// Tolerance (per element, derived; u = 2^-8 is bf16's unit roundoff: 8 significant bits). Besides
// the output, the kernels round exactly two things to bf16 before the second mma: P (forward, dV)
// and dS (dQ, dK). A sum y = sum_j w_j x_j whose weights are rounded is off by at most u A,
// A = sum_j |w_j x_j| (the reference's own absolute terms, computed here per element); the forward
// divides by the unrounded row sum, so o is off by at most u sum_j P_j |v_j|. fp32 accumulation in
// the mma moves a score by at most gamma_d scale sum_e |q_e k_e| (gamma_d = (d + 4) 2^-24; p then
// moves by that relative amount, counted 4x) and dP by gamma_d sum_e |dO_e v_e|: those terms are
// added exactly (about 1e-5 of A). A bf16 output is rounded once per call, u |result| <=
// u (|initial| + A): added as u |initial| per call plus a share of A. Tolerance = c u A + fp32
// terms + initial-value terms + 1e-6, c = 2 for float outputs (a factor 2 over the bound) and 4 for
// bf16 outputs (+ u A per call, two calls); lse (from the unrounded p): 2x its score term +
// 1e-6 (1 + |lse|).
#include "executor/cuda/tests/cuda_emulator.hpp"  // first: maps the CUDA spellings
//
#include <vector>
// Every tile a block examines, from the kernels' test seam (thread 0 of the block).
struct TileVisit {
  int kernel;  // 0 fwd, 1 dq, 2 dkdv
  unsigned bx, by;
  int64_t t0;
  bool loaded;
};
inline std::vector<TileVisit>& tile_log() {
  static std::vector<TileVisit> v;
  return v;
}
#define CTX_MMA_TILE_HOOK(kernel, t0, loaded) \
  tile_log().push_back({kernel, ::ctx_emu::state()->block_idx.x, ::ctx_emu::state()->block_idx.y, t0, loaded})
#include "executor/cuda/attention_mma_kernels.cuh"
#include "executor/cuda/tests/mma_emulator.hpp"
//
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <random>
#include <string>
#include <vector>

namespace dev = ctx::exec::cuda::dev;
using bf16 = uint16_t;

namespace {

constexpr double kU = 1.0 / 256;  // bf16 unit roundoff 2^-8 (8 significant bits)
const double kInf = std::numeric_limits<double>::infinity();

float b2f(bf16 b) { return dev::bf16_to_float(b); }

std::vector<bf16> rand_bf16(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<bf16> v(n);
  for (auto& x : v) x = dev::float_to_bf16(nd(rng));
  return v;
}

std::vector<int32_t> hulls(const std::vector<int64_t>& qi, const std::vector<int32_t>& qd, const std::vector<int64_t>& ki,
                           const std::vector<int32_t>& kd) {
  std::vector<int32_t> r(2 * qi.size(), 0);
  for (size_t i = 0; i < qi.size(); ++i) {
    int32_t lo = -1, hi = -1;
    for (size_t j = 0; j < ki.size(); ++j)
      if (ki[j] <= qi[i] && kd[j] == qd[i]) {
        if (lo < 0) lo = static_cast<int32_t>(j);
        hi = static_cast<int32_t>(j) + 1;
      }
    r[2 * i] = lo < 0 ? 0 : lo;
    r[2 * i + 1] = lo < 0 ? 0 : hi;
  }
  return r;
}

struct KeyBlk {
  int64_t tk = 0;
  std::vector<bf16> k, v;
  std::vector<int64_t> idx;
  std::vector<int32_t> doc, range;
};

struct Case {
  const char* name;
  int64_t hq, hkv, d, tq, tk, doc_len;
  bool bf16_out;
  bool late = false;  // 10 queries at 150..159 in a document from 120; block 0 keys 0..199, block 1 200..399
  bool copy4 = false;  // 4-byte global->shared copies (the launchers' path for pointers not 16-byte aligned)
};

struct Problem {
  Case c;
  float scale;
  std::vector<bf16> q, dout;
  std::vector<int64_t> qi;
  std::vector<int32_t> qd;
  KeyBlk blk[2];
  int32_t doc_of(int64_t pos) const {
    if (c.late) return pos < 120 ? 0 : pos < 170 ? 1 : 2;
    return static_cast<int32_t>(pos / c.doc_len);
  }
  // other query positions (same count), hulls recomputed
  void set_queries(const std::vector<int64_t>& pos) {
    qi = pos;
    for (size_t i = 0; i < pos.size(); ++i) qd[i] = doc_of(pos[i]);
    for (auto& k : blk) k.range = hulls(qi, qd, k.idx, k.doc);
  }
  explicit Problem(const Case& cs) : c(cs) {
    scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
    const int64_t tq = c.tq, tk = c.tk;
    // queries: a zig-zag over positions tk - tq/3 .. : some see only part of block 0, some part of block 1
    const int64_t base = tk - tq / 3;
    for (int64_t i = 0; i < tq; ++i) {
      const int64_t pos = c.late ? 159 - i : i < tq / 2 ? base + i : base + tq / 2 + (tq - 1 - i);
      qi.push_back(pos);
      qd.push_back(doc_of(pos));
    }
    for (int b = 0; b < 2; ++b) {
      KeyBlk& k = blk[b];
      k.tk = tk;
      for (int64_t j = 0; j < tk; ++j) {
        k.idx.push_back(b * tk + j);
        k.doc.push_back(doc_of(b * tk + j));
      }
      k.range = hulls(qi, qd, k.idx, k.doc);
      k.k = rand_bf16(tk * c.hkv * c.d, 100 + b);
      k.v = rand_bf16(tk * c.hkv * c.d, 200 + b);
    }
    q = rand_bf16(tq * c.hq * c.d, 7);
    dout = rand_bf16(tq * c.hq * c.d, 8);
  }
  dev::MmaGeo geo() const {
    return {c.hq, c.hkv, c.hq / c.hkv, static_cast<int32_t>(c.d), c.copy4 ? 0 : 1, scale};
  }
  // both blocks as one
  KeyBlk joined() const {
    KeyBlk j;
    j.tk = 2 * c.tk;
    for (int b = 0; b < 2; ++b) {
      j.k.insert(j.k.end(), blk[b].k.begin(), blk[b].k.end());
      j.v.insert(j.v.end(), blk[b].v.begin(), blk[b].v.end());
      j.idx.insert(j.idx.end(), blk[b].idx.begin(), blk[b].idx.end());
      j.doc.insert(j.doc.end(), blk[b].doc.begin(), blk[b].doc.end());
    }
    j.range = hulls(qi, qd, j.idx, j.doc);
    return j;
  }
};

// ---------------------------------------------------------------- float64 reference
double gamma_d(int64_t d) { return static_cast<double>(d + 4) * std::ldexp(1.0, -24); }

bool visible(const Problem& P, const KeyBlk& B, int64_t i, int64_t j) {
  return j >= B.range[2 * i] && j < B.range[2 * i + 1] && B.idx[j] <= P.qi[i] && B.doc[j] == P.qd[i];
}
double dotq(const Problem& P, const std::vector<bf16>& x, int64_t xrow, const std::vector<bf16>& y, int64_t yrow,
            double* abs_sum) {
  double s = 0, a = 0;
  for (int64_t e = 0; e < P.c.d; ++e) {
    const double t = static_cast<double>(b2f(x[xrow * P.c.d + e])) * b2f(y[yrow * P.c.d + e]);
    s += t;
    a += std::fabs(t);
  }
  if (abs_sum) *abs_sum = a;
  return s;
}

struct FwdRef {
  std::vector<double> o, lse, tol_o, tol_lse;
};
// Softmax over every visible key of the given blocks (their hulls), per (token, head) row.
FwdRef ref_forward(const Problem& P, const std::vector<const KeyBlk*>& blocks, double c_u) {
  const int64_t d = P.c.d, hq = P.c.hq, group = hq / P.c.hkv, rows = P.c.tq * hq;
  FwdRef R;
  R.o.assign(rows * d, 0.0);
  R.lse.assign(rows, -kInf);
  R.tol_o.assign(rows * d, 1e-6);
  R.tol_lse.assign(rows, 0.0);
  for (int64_t i = 0; i < P.c.tq; ++i)
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t row = i * hq + h, g = h / group;
      std::vector<double> s, pa;
      std::vector<std::pair<const KeyBlk*, int64_t>> keys;
      double eps_s = 0;
      for (const KeyBlk* B : blocks)
        for (int64_t j = 0; j < B->tk; ++j)
          if (visible(P, *B, i, j)) {
            double a;
            s.push_back(P.scale * dotq(P, P.q, row, B->k, j * P.c.hkv + g, &a));
            eps_s = std::max(eps_s, gamma_d(d) * P.scale * a);
            keys.push_back({B, j});
          }
      if (s.empty()) continue;
      const double mx = *std::max_element(s.begin(), s.end());
      double l = 0;
      for (double x : s) l += std::exp(x - mx);
      R.lse[row] = mx + std::log(l);
      R.tol_lse[row] = 2 * eps_s + 1e-6 * (1 + std::fabs(R.lse[row]));
      for (int64_t e = 0; e < d; ++e) {
        double acc = 0, A = 0;
        for (size_t n = 0; n < s.size(); ++n) {
          const double p = std::exp(s[n] - R.lse[row]);
          const double v = b2f(keys[n].first->v[(keys[n].second * P.c.hkv + g) * d + e]);
          acc += p * v;
          A += p * std::fabs(v);
        }
        R.o[row * d + e] = acc;
        R.tol_o[row * d + e] = (c_u * kU + 4 * eps_s) * A + 1e-6;
      }
    }
  return R;
}

struct BwdRef {
  std::vector<double> dq, dk, dv, tol_dq, tol_dk, tol_dv;
};
// This block's gradients added to (dq0, dk0, dv0) given the final lse and delta (as the kernel
// gets them: f32); tolerances add c_u u A (+ u |x0| per call for bf16 outputs).
void ref_backward_block(const Problem& P, const KeyBlk& B, const std::vector<float>& lse, const std::vector<float>& delta,
                        BwdRef& R, double c_u, bool bf16_out) {
  const int64_t d = P.c.d, hq = P.c.hq, hkv = P.c.hkv, group = hq / hkv;
  for (int64_t i = 0; i < P.c.tq; ++i)
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t row = i * hq + h, g = h / group;
      for (int64_t j = 0; j < B.tk; ++j) {
        if (!visible(P, B, i, j)) continue;
        const int64_t kr = j * hkv + g;
        double aqk, adv;
        const double s = P.scale * dotq(P, P.q, row, B.k, kr, &aqk);
        const double dp = dotq(P, P.dout, row, B.v, kr, &adv);
        const double p = std::exp(s - static_cast<double>(lse[row]));
        const double ds = p * (dp - delta[row]) * P.scale;
        const double rel_p = 4 * gamma_d(d) * P.scale * aqk;  // p's relative error from the fp32 score
        const double e_ds = p * P.scale * (gamma_d(d) * (adv + std::fabs(delta[row])) + std::fabs(dp - delta[row]) * rel_p);
        for (int64_t e = 0; e < d; ++e) {
          const double qe = b2f(P.q[row * d + e]), ke = b2f(B.k[kr * d + e]), oe = b2f(P.dout[row * d + e]);
          R.dq[row * d + e] += ds * ke;
          R.tol_dq[row * d + e] += c_u * kU * std::fabs(ds * ke) + e_ds * std::fabs(ke);
          R.dk[kr * d + e] += ds * qe;
          R.tol_dk[kr * d + e] += c_u * kU * std::fabs(ds * qe) + e_ds * std::fabs(qe);
          R.dv[kr * d + e] += p * oe;
          R.tol_dv[kr * d + e] += (c_u * kU + rel_p) * std::fabs(p * oe);
        }
      }
    }
  (void)bf16_out;
}

// ---------------------------------------------------------------- the kernels under the emulator
// The launchers' geometry (attention_mma.cu): buckets, tiles, grid, shared memory and its opt-in.
template <int kD>
void opt_in(const char* kind) {
  using Tl = dev::MmaTiles<kD>;
  const std::string tag = std::string("<") + std::to_string(kD) + ">";
  ctx_emu::set_max_dynamic_smem(std::string("attn_mma_fwd_kernel") + tag, dev::mma_fwd_smem(kD, Tl::fwd_keys));
  ctx_emu::set_max_dynamic_smem(std::string("attn_mma_dq_kernel") + tag, dev::mma_dq_smem(kD, Tl::dq_keys));
  ctx_emu::set_max_dynamic_smem(std::string("attn_mma_dkdv_kernel") + tag, dev::mma_dkdv_smem(kD, Tl::dkdv_rows));
  (void)kind;
}
const bool kOptIn = [] {
  opt_in<32>("");
  opt_in<64>("");
  opt_in<128>("");
  return true;
}();

template <int kD, typename T>
void run_forward_b(const Problem& P, const KeyBlk& B, std::vector<T>& o, std::vector<float>& lse) {
  constexpr int kN = dev::MmaTiles<kD>::fwd_keys;
  const dev::MmaGeo G = P.geo();
  ctx_emu::launch("attn_mma_fwd_kernel<" + std::to_string(kD) + ">",
                  {dev::mma_row_blocks(P.c.tq, G.group), static_cast<unsigned>(P.c.hkv), 1}, {dev::kMmaThreads, 1, 1},
                  dev::mma_fwd_smem(P.c.d, kN), [&] {
                    dev::attn_mma_fwd_kernel<kD, kN, T>(o.data(), lse.data(), P.q.data(), P.qi.data(), P.qd.data(),
                                                        P.c.tq, B.k.data(), B.v.data(), B.idx.data(), B.doc.data(),
                                                        B.tk, B.range.data(), G);
                  });
}
template <typename T>
void run_forward(const Problem& P, const KeyBlk& B, std::vector<T>& o, std::vector<float>& lse) {
  switch (dev::mma_bucket(P.c.d)) {
    case 32: return run_forward_b<32>(P, B, o, lse);
    case 64: return run_forward_b<64>(P, B, o, lse);
    case 128: return run_forward_b<128>(P, B, o, lse);
    default: FAIL() << "unsupported head dim " << P.c.d;
  }
}

template <int kD, typename T>
void run_backward_b(const Problem& P, const KeyBlk& B, std::vector<T>& dq, std::vector<T>& dk, std::vector<T>& dv,
                    const std::vector<float>& lse, const std::vector<float>& delta) {
  constexpr int kN = dev::MmaTiles<kD>::dq_keys, kM = dev::MmaTiles<kD>::dkdv_rows;
  const dev::MmaGeo G = P.geo();
  ctx_emu::launch("attn_mma_dq_kernel<" + std::to_string(kD) + ">",
                  {dev::mma_row_blocks(P.c.tq, G.group), static_cast<unsigned>(P.c.hkv), 1}, {dev::kMmaThreads, 1, 1},
                  dev::mma_dq_smem(P.c.d, kN), [&] {
                    dev::attn_mma_dq_kernel<kD, kN, T>(dq.data(), P.q.data(), P.qi.data(), P.qd.data(), P.c.tq,
                                                       B.k.data(), B.v.data(), B.idx.data(), B.doc.data(), B.tk,
                                                       B.range.data(), P.dout.data(), lse.data(), delta.data(), G);
                  });
  ctx_emu::launch("attn_mma_dkdv_kernel<" + std::to_string(kD) + ">",
                  {dev::mma_key_blocks(B.tk), static_cast<unsigned>(P.c.hkv), 1}, {dev::kMmaThreads, 1, 1},
                  dev::mma_dkdv_smem(P.c.d, kM), [&] {
                    dev::attn_mma_dkdv_kernel<kD, kM, T>(dk.data(), dv.data(), P.q.data(), P.qi.data(), P.qd.data(),
                                                         P.c.tq, B.k.data(), B.v.data(), B.idx.data(), B.doc.data(),
                                                         B.tk, B.range.data(), P.dout.data(), lse.data(), delta.data(),
                                                         G);
                  });
}
template <typename T>
void run_backward(const Problem& P, const KeyBlk& B, std::vector<T>& dq, std::vector<T>& dk, std::vector<T>& dv,
                  const std::vector<float>& lse, const std::vector<float>& delta) {
  switch (dev::mma_bucket(P.c.d)) {
    case 32: return run_backward_b<32>(P, B, dq, dk, dv, lse, delta);
    case 64: return run_backward_b<64>(P, B, dq, dk, dv, lse, delta);
    case 128: return run_backward_b<128>(P, B, dq, dk, dv, lse, delta);
    default: FAIL() << "unsupported head dim " << P.c.d;
  }
}

// The race detector off for a test that checks something else (the other tests keep it on).
struct NoRaceCheck {
  bool saved = ctx_emu::options().race_check;
  NoRaceCheck() { ctx_emu::options().race_check = false; }
  ~NoRaceCheck() { ctx_emu::options().race_check = saved; }
};

float as_f(float x) { return x; }
float as_f(bf16 x) { return b2f(x); }
template <typename T>
T from_f(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else
    return dev::float_to_bf16(x);
}

// Every element within its tolerance; prints the largest error and the largest error / tolerance.
template <typename T>
void expect_within(const std::vector<T>& got, const std::vector<double>& ref, const std::vector<double>& tol,
                   const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double worst = 0, worst_ratio = 0, scale = 0;
  size_t bad = 0, first_bad = 0;
  for (size_t n = 0; n < got.size(); ++n) {
    const double g = as_f(got[n]);
    scale = std::max(scale, std::fabs(ref[n]));
    if (std::isinf(ref[n])) {  // an untouched lse: exactly -inf
      if (g != ref[n] && bad++ == 0) first_bad = n;
      continue;
    }
    const double err = std::fabs(g - ref[n]);
    if (!(err <= tol[n]) && bad++ == 0) first_bad = n;
    worst = std::max(worst, err);
    worst_ratio = std::max(worst_ratio, err / tol[n]);
  }
  std::printf("  %-44s max|err| %.3e  max err/tol %.3f  (max|ref| %.3f, %zu values)\n", what.c_str(), worst,
              worst_ratio, scale, got.size());
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " values outside the tolerance; first at "
                     << first_bad << ": got " << as_f(got[first_bad]) << ", reference " << ref[first_bad]
                     << ", tolerance " << tol[first_bad] << " (schedule seed " << ctx_emu::options().seed << ")";
}

const Case kCases[] = {
    {"docs, GQA 4:1, d 64, f32 out", 8, 2, 64, 70, 100, 45, false},
    {"docs, GQA 8:1, d 128, bf16 out", 8, 1, 128, 23, 70, 50, true},
    {"one doc, GQA 4:1, d 16, bf16 out", 4, 1, 16, 37, 75, 1000, true},
    {"docs, GQA 2:1, d 48, f32 out, 4-byte copies", 4, 2, 48, 30, 90, 40, false, false, true},
    {"late and empty hulls, GQA 4:1, d 32", 4, 1, 32, 10, 200, 0, false, true},
};

template <typename T>
void check_forward(const Case& cs) {
  Problem P(cs);
  const double c_u = cs.bf16_out ? 4 : 2;
  const int64_t rows = cs.tq * cs.hq;
  std::vector<T> o(rows * cs.d, from_f<T>(0.0f));
  std::vector<float> lse(rows, -INFINITY);
  const std::string tag = std::string(" [") + cs.name + "]";
  for (int b = 0; b < 2; ++b) {
    run_forward(P, P.blk[b], o, lse);
    std::vector<const KeyBlk*> upto;
    for (int c = 0; c <= b; ++c) upto.push_back(&P.blk[c]);
    const FwdRef R = ref_forward(P, upto, c_u);
    expect_within(lse, R.lse, R.tol_lse, "lse after block " + std::to_string(b) + tag);
    expect_within(o, R.o, R.tol_o, "o after block " + std::to_string(b) + tag);
  }
  // the two blocks merged in sequence = one block holding both keys
  const KeyBlk J = P.joined();
  std::vector<T> oj(rows * cs.d, from_f<T>(0.0f));
  std::vector<float> lj(rows, -INFINITY);
  {
    NoRaceCheck fast;  // the same kernel and tiles as the calls above, which ran under the detector
    run_forward(P, J, oj, lj);
  }
  const FwdRef R = ref_forward(P, {&J}, cs.bf16_out ? 3 : 2);  // one call: one output rounding
  expect_within(lj, R.lse, R.tol_lse, "lse of the joined block" + tag);
  expect_within(oj, R.o, R.tol_o, "o of the joined block" + tag);
  // and the sequence against the joined block's result directly
  std::vector<double> seq(o.size()), tol(o.size());
  for (size_t n = 0; n < o.size(); ++n) seq[n] = as_f(o[n]), tol[n] = 2 * R.tol_o[n];
  expect_within(oj, seq, tol, "o joined vs two blocks in sequence" + tag);
}

template <typename T>
void check_backward(const Case& cs, const std::vector<int32_t>* narrowed = nullptr) {
  Problem P(cs);
  if (narrowed) P.blk[1].range = *narrowed;
  const double c_u = cs.bf16_out ? 4 : 2;
  const int64_t rows = cs.tq * cs.hq, d = cs.d;
  const FwdRef F = ref_forward(P, {&P.blk[0], &P.blk[1]}, c_u);
  std::vector<float> lse(rows), delta(rows);
  for (int64_t r = 0; r < rows; ++r) {
    lse[r] = static_cast<float>(F.lse[r]);
    double s = 0;
    for (int64_t e = 0; e < d; ++e) s += static_cast<double>(b2f(P.dout[r * d + e])) * F.o[r * d + e];
    delta[r] = static_cast<float>(s);
  }
  // dq, dk, dv start from small random values: the kernels add to them
  auto start = [&](size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 0.1f);
    std::vector<T> x(n);
    for (auto& e : x) e = from_f<T>(nd(rng));
    return x;
  };
  std::vector<T> dq = start(rows * d, 31);
  BwdRef Rq;
  Rq.dq.resize(dq.size());
  Rq.tol_dq.resize(dq.size());
  for (size_t n = 0; n < dq.size(); ++n)
    Rq.dq[n] = as_f(dq[n]), Rq.tol_dq[n] = 1e-6 + (cs.bf16_out ? 2 * kU * std::fabs(Rq.dq[n]) : 0.0);
  const std::string tag = std::string(" [") + cs.name + (narrowed ? ", half hulls" : "") + "]";
  for (int b = 0; b < 2; ++b) {
    const size_t nk = static_cast<size_t>(cs.tk * cs.hkv * d);
    std::vector<T> dk = start(nk, 40 + b), dv = start(nk, 50 + b);
    BwdRef R;
    R.dq.assign(rows * d, 0.0);
    R.tol_dq.assign(rows * d, 0.0);
    R.dk.resize(nk);
    R.dv.resize(nk);
    R.tol_dk.resize(nk);
    R.tol_dv.resize(nk);
    for (size_t n = 0; n < nk; ++n) {
      R.dk[n] = as_f(dk[n]), R.dv[n] = as_f(dv[n]);
      R.tol_dk[n] = 1e-6 + (cs.bf16_out ? kU * std::fabs(R.dk[n]) : 0.0);
      R.tol_dv[n] = 1e-6 + (cs.bf16_out ? kU * std::fabs(R.dv[n]) : 0.0);
    }
    ref_backward_block(P, P.blk[b], lse, delta, R, c_u, cs.bf16_out);
    for (size_t n = 0; n < Rq.dq.size(); ++n) Rq.dq[n] += R.dq[n], Rq.tol_dq[n] += R.tol_dq[n];
    run_backward(P, P.blk[b], dq, dk, dv, lse, delta);
    expect_within(dk, R.dk, R.tol_dk, "dk of block " + std::to_string(b) + tag);
    expect_within(dv, R.dv, R.tol_dv, "dv of block " + std::to_string(b) + tag);
  }
  expect_within(dq, Rq.dq, Rq.tol_dq, "dq after both blocks" + tag);
}

struct Timer {
  const char* what;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~Timer() {
    std::printf("  (%s: %.2f s)\n", what,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
};

}  // namespace

TEST(AttentionMmaEmulated, ForwardMergesBlocksLikeTheFloat64Reference) {
  Timer t{"forward"};
  for (const Case& c : kCases) {
    if (c.bf16_out)
      check_forward<bf16>(c);
    else
      check_forward<float>(c);
  }
}

TEST(AttentionMmaEmulated, BackwardMatchesTheFloat64Reference) {
  Timer t{"backward"};
  for (const Case& c : kCases) {
    if (c.bf16_out)
      check_backward<bf16>(c);
    else
      check_backward<float>(c);
  }
}

// kv_range bounds what a row sees: with block 1's hulls cut to their first half, keys outside a
// hull are never counted although the mask shows them (forward and backward).
TEST(AttentionMmaEmulated, HonoursNarrowedHulls) {
  Timer t{"narrowed hulls"};
  const Case& cs = kCases[0];
  Problem P(cs);
  std::vector<int32_t> half = P.blk[1].range;
  for (int64_t i = 0; i < cs.tq; ++i) half[2 * i + 1] = half[2 * i] + (half[2 * i + 1] - half[2 * i]) / 2;
  ASSERT_NE(half, P.blk[1].range) << "the case must narrow some hull";
  P.blk[1].range = half;
  const int64_t rows = cs.tq * cs.hq;
  std::vector<float> o(rows * cs.d, 0.0f), lse(rows, -INFINITY);
  run_forward(P, P.blk[1], o, lse);
  const FwdRef R = ref_forward(P, {&P.blk[1]}, 2);
  expect_within(lse, R.lse, R.tol_lse, "lse over half hulls");
  expect_within(o, R.o, R.tol_o, "o over half hulls");
  check_backward<float>(cs, &half);
}

// Results do not depend on the order blocks and threads run in (no atomics, no cross-block
// accumulation): bit-identical under three schedule seeds.
TEST(AttentionMmaEmulated, BitIdenticalUnderRandomisedSchedules) {
  Timer t{"schedules"};
  NoRaceCheck fast;
  const Case cs{"schedules, GQA 4:1, d 16", 4, 1, 16, 37, 75, 30, false};
  Problem P(cs);
  const uint64_t saved = ctx_emu::options().seed;
  std::vector<std::vector<float>> outs;
  for (uint64_t seed : {1u, 2u, 3u}) {
    ctx_emu::options().seed = seed;
    const int64_t rows = cs.tq * cs.hq, nk = cs.tk * cs.hkv * cs.d;
    std::vector<float> o(rows * cs.d, 0.0f), lse(rows, -INFINITY), dq(rows * cs.d, 0.0f), dk(nk, 0.0f), dv(nk, 0.0f);
    for (int b = 0; b < 2; ++b) run_forward(P, P.blk[b], o, lse);
    std::vector<float> delta(rows, 0.25f);
    run_backward(P, P.blk[1], dq, dk, dv, lse, delta);
    std::vector<float> all = o;
    for (auto* v : {&lse, &dq, &dk, &dv}) all.insert(all.end(), v->begin(), v->end());
    outs.push_back(all);
  }
  ctx_emu::options().seed = saved;
  for (size_t s = 1; s < outs.size(); ++s)
    EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[s].data(), outs[0].size() * sizeof(float)))
        << "seed " << s + 1 << " differs from seed 1";
}

// The launchers' geometry passes sm_90's limits with their opt-in, at head dim 128 and 1M query
// and key tokens with 8 KV heads (GQA 8:1), and needs the opt-in (over 48 KiB of shared memory).
TEST(AttentionMmaEmulated, LaunchGeometryFitsSm90) {
  using Tl = dev::MmaTiles<128>;
  const int64_t tokens = 1 << 20, hkv = 8, group = 8;
  const ctx_emu::Idx block{dev::kMmaThreads, 1, 1};
  const ctx_emu::Idx rows{dev::mma_row_blocks(tokens, group), static_cast<unsigned>(hkv), 1};
  const ctx_emu::Idx keys{dev::mma_key_blocks(tokens), static_cast<unsigned>(hkv), 1};
  EXPECT_NO_THROW(ctx_emu::check_launch("attn_mma_fwd_kernel<128>", rows, block, dev::mma_fwd_smem(128, Tl::fwd_keys)));
  EXPECT_NO_THROW(ctx_emu::check_launch("attn_mma_dq_kernel<128>", rows, block, dev::mma_dq_smem(128, Tl::dq_keys)));
  EXPECT_NO_THROW(
      ctx_emu::check_launch("attn_mma_dkdv_kernel<128>", keys, block, dev::mma_dkdv_smem(128, Tl::dkdv_rows)));
  EXPECT_GT(dev::mma_fwd_smem(128, Tl::fwd_keys), 48u * 1024);
  EXPECT_THROW(ctx_emu::check_launch("attn_mma_fwd_kernel without opt-in", rows, block,
                                     dev::mma_fwd_smem(128, Tl::fwd_keys)),
               std::invalid_argument);
  std::printf("  shared memory per block at d 128: fwd %zu, dq %zu, dkdv %zu bytes\n",
              dev::mma_fwd_smem(128, Tl::fwd_keys), dev::mma_dq_smem(128, Tl::dq_keys),
              dev::mma_dkdv_smem(128, Tl::dkdv_rows));
  EXPECT_EQ(dev::mma_bucket(20), 0);  // not a multiple of 16: the SIMT kernel's
  EXPECT_EQ(dev::mma_bucket(256), 0);
  EXPECT_EQ(dev::mma_bucket(16), 32);
  EXPECT_EQ(dev::mma_bucket(128), 128);
}

// Loop bounds: the forward and dq kernels examine exactly the key tiles from the union of their
// rows' hulls (start rounded down to the tile grid) to its end, never one outside, and load K/V
// exactly for the tiles holding a visible pair; the dk/dv kernel loads Q/dO exactly for the query
// tiles holding a visible pair. Late hulls (from key 120 of 200), empty hulls (block 1 of the late
// case: nothing examined), documents and hulls cut to half.
TEST(AttentionMmaEmulated, VisitsOnlyTilesInsideTheHullsAndLoadsOnlyVisibleOnes) {
  Timer t{"tile visits"};
  NoRaceCheck fast;
  // variant 3: two clusters of queries in documents 0 and 5: the block's hull union spans key
  // tiles 0..192, of which 64 and 128 hold no visible pair (examined, not loaded)
  const Case clusters{"two query clusters, GQA 2:1, d 16", 2, 1, 16, 32, 256, 40, false};
  for (int variant = 0; variant < 4; ++variant) {
    const Case& cs = variant == 0 ? kCases[4] : variant == 3 ? clusters : kCases[3];
    Problem P(cs);
    if (variant == 3) {
      std::vector<int64_t> pos;
      for (int64_t i = 0; i < cs.tq; ++i) pos.push_back(i < 16 ? 10 + i : 200 + 2 * i);
      P.set_queries(pos);
    }
    if (variant == 2)
      for (int64_t i = 0; i < cs.tq; ++i)
        P.blk[1].range[2 * i + 1] = P.blk[1].range[2 * i] + (P.blk[1].range[2 * i + 1] - P.blk[1].range[2 * i]) / 2;
    const int64_t group = cs.hq / cs.hkv, rows = cs.tq * group, d = cs.d;
    ASSERT_EQ(dev::mma_bucket(d), d <= 32 ? 32 : 64);
    const int kN = dev::MmaTiles<64>::fwd_keys, kNq = dev::MmaTiles<64>::dq_keys, kM = dev::MmaTiles<64>::dkdv_rows;
    static_assert(dev::MmaTiles<32>::fwd_keys == dev::MmaTiles<64>::fwd_keys &&
                  dev::MmaTiles<32>::dq_keys == dev::MmaTiles<64>::dq_keys &&
                  dev::MmaTiles<32>::dkdv_rows == dev::MmaTiles<64>::dkdv_rows);
    for (int b = 0; b < 2; ++b) {
      const KeyBlk& B = P.blk[b];
      const std::string tag = " [" + std::string(cs.name) + (variant == 2 ? ", half hulls" : "") + ", block " +
                              std::to_string(b) + "]";
      tile_log().clear();
      std::vector<float> o(cs.tq * cs.hq * d, 0.0f), lse(cs.tq * cs.hq, 0.0f), dq(o), dk(B.tk * cs.hkv * d, 0.0f),
          dv(dk), delta(lse);
      run_forward(P, B, o, lse);
      run_backward(P, B, dq, dk, dv, lse, delta);
      using Key = std::tuple<int, unsigned, unsigned>;
      std::map<Key, std::set<int64_t>> examined, loaded, want_examined, want_loaded;
      for (const TileVisit& v : tile_log()) {
        const Key key{v.kernel, v.bx, v.by};
        EXPECT_TRUE(examined[key].insert(v.t0).second) << "tile examined twice" << tag;
        if (v.loaded) loaded[key].insert(v.t0);
      }
      auto sees = [&](int64_t R, int64_t j) { return R < rows && j < B.tk && visible(P, B, R / group, j); };
      for (unsigned by = 0; by < cs.hkv; ++by) {
        for (unsigned bx = 0; bx < dev::mma_row_blocks(cs.tq, group); ++bx) {
          int64_t lo = B.tk, hi = 0;
          for (int64_t R = bx * 64; R < std::min<int64_t>(rows, bx * 64 + 64); ++R) {
            const int64_t i = R / group;
            if (B.range[2 * i] < B.range[2 * i + 1]) {
              lo = std::min<int64_t>(lo, B.range[2 * i]);
              hi = std::max<int64_t>(hi, B.range[2 * i + 1]);
            }
          }
          for (int kernel = 0; kernel < 2; ++kernel) {
            const int n = kernel == 0 ? kN : kNq;
            for (int64_t t0 = lo / n * n; t0 < hi; t0 += n) {
              want_examined[{kernel, bx, by}].insert(t0);
              bool any = false;
              for (int64_t R = bx * 64; R < bx * 64 + 64 && !any; ++R)
                for (int64_t j = t0; j < t0 + n && !any; ++j) any = sees(R, j);
              if (any) want_loaded[{kernel, bx, by}].insert(t0);
            }
          }
        }
        for (unsigned bx = 0; bx < dev::mma_key_blocks(B.tk); ++bx)
          for (int64_t R0 = 0; R0 < rows; R0 += kM) {
            want_examined[{2, bx, by}].insert(R0);
            bool any = false;
            for (int64_t R = R0; R < R0 + kM && !any; ++R)
              for (int64_t j = bx * 64; j < bx * 64 + 64 && !any; ++j) any = sees(R, j);
            if (any) want_loaded[{2, bx, by}].insert(R0);
          }
      }
      auto drop_empty = [](std::map<Key, std::set<int64_t>>& m) {
        for (auto it = m.begin(); it != m.end();) it = it->second.empty() ? m.erase(it) : std::next(it);
      };
      for (auto* m : {&examined, &loaded, &want_examined, &want_loaded}) drop_empty(*m);
      EXPECT_EQ(examined, want_examined) << "examined tiles" << tag;
      EXPECT_EQ(loaded, want_loaded) << "loaded tiles" << tag;
      size_t n_ex = 0, n_ld = 0;
      for (auto& [k, v] : examined) n_ex += std::get<0>(k) < 2 ? v.size() : 0;
      for (auto& [k, v] : loaded) n_ld += std::get<0>(k) < 2 ? v.size() : 0;
      std::printf("  %-60s fwd+dq tiles examined %zu, loaded %zu\n", tag.c_str(), n_ex, n_ld);
      if (variant == 0 && b == 1) {
        EXPECT_EQ(n_ex, 0u) << "empty hulls: no key tile may be examined" << tag;
      }
    }
  }
}
