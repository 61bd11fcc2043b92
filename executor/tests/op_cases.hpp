// One list of op cases at the Backend-interface level (issue 13; ggml's test-backend-ops is the
// model). Each case is declared once: the op, its shapes and dtypes, a builder of inputs
// (deterministic seeds), a float64 reference with a derived tolerance, and the FLOPs and bytes one
// run moves. test_backend_ops.cpp runs every case on every backend of the build (cpu,
// cuda-emulated, cuda); bench/backend_ops.cpp runs them in test mode or times them in perf mode.
//
// Tolerances are first-order worst-case bounds in units of the float32 unit roundoff u = 2^-24,
// computed per element by the reference from the magnitudes of the terms (a sum of n terms is off
// by at most n u times the sum of their absolute values, in any order), times a safety factor of 2.
// A bf16 output adds half a bf16 ulp, at most 2^-8 |value|, per rounding it went through (an
// output written by c calls: 2^-8 (|value| + (c - 1) * sum of its terms' magnitudes)). bf16 inputs
// are rounded on the host first, so the reference sees exactly the values the backend holds.
// Data movement and bf16 conversions are exact.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "executor/backend.hpp"

namespace ctx::exec::opcases {

// One output compared with its reference: the worst element by |got - want| / tol (<= 1 passes).
struct Check {
  std::string what;
  double max_abs_err = 0;  // max |got - want| over the elements
  double worst = 0;        // max |got - want| / tol (0/0 = 0; NaN or a wrong infinity: +inf)
  int64_t at = -1;         // the worst element
  double got = 0, want = 0, tol = 0;
  bool ok() const { return worst <= 1.0; }
  std::string describe() const;
};

// A case's tensors on one backend.
class Instance {
 public:
  virtual ~Instance() = default;
  // The op(s) under test, stream-ordered; repeatable (accumulating or in-place ops then keep
  // updating their outputs, which only perf mode does).
  virtual void run() = 0;
  // Downloads the outputs (blocking) and compares them with the float64 reference. Valid after
  // exactly one run() on a fresh instance.
  virtual std::vector<Check> check() = 0;
};

struct OpCase {
  std::string name;       // unique, [A-Za-z0-9_]: op_variant_dtype
  std::string op;         // the Backend op(s) one run() issues
  std::string shape;      // human-readable shape
  std::string dtype;      // f32, bf16, bf16>f32 (bf16 inputs, f32 outputs), f32xbf16, ...
  std::string tolerance;  // one line: the tolerance and why
  double flops = 0;       // per run()
  double bytes = 0;       // bytes read + written per run() (each tensor once)
  double ref_cost = 0;    // float64 reference work (multiply-adds), to skip slow checks in perf mode
  bool emulated = false;  // runs on cuda-emulated in test mode (every test case today; the emulator is slow)
  std::function<std::unique_ptr<Instance>(Backend&)> make;
};

// Small shapes for test mode, each with a float64 reference.
std::vector<OpCase> test_cases();
// The perf shapes (GPU: attention head_dim 128, GQA 4:1 and 8:1, 8K-32K tokens, causal and
// document masks; GEMM 8192^3 and Llama-3-8B projections at 4K tokens; the other ops at Llama-8B
// sizes). reduced: the same cases at CPU-sized shapes.
std::vector<OpCase> perf_cases(bool reduced);

// ---- attention geometry, shared with the per-backend kernel tests

// Queries and key blocks as the ring sees them: token positions and documents of the local
// queries and of each key block, heads and head dim.
struct AttnGeom {
  int64_t hq = 0, hkv = 0, d = 0;
  std::vector<int64_t> qi;
  std::vector<int32_t> qd;
  std::vector<std::vector<int64_t>> ki;  // per key block
  std::vector<std::vector<int32_t>> kd;
  int64_t tq() const { return static_cast<int64_t>(qi.size()); }
  int64_t tk(size_t b) const { return static_cast<int64_t>(ki[b].size()); }
  int64_t tk_all() const;
  AttnShape shape() const;
};

// 70 queries at positions 40..109 in reverse-chunk (zig-zag-like) order, documents of 30 tokens;
// two key blocks of 45 keys, 0..44 and 45..89: queries of the document 30..59 see keys in both
// (the merge), those of 60..89 only the second, those from 90 on none (lse stays -inf); hulls
// start mid-block. hq, hkv, d as given.
AttnGeom attn_geom_doc(int64_t hq, int64_t hkv, int64_t d);
// 24 tokens in a permuted order ((7 i) mod 24), three documents; three key blocks of 8 (the CPU
// kernel test's geometry, cheap enough for finite differences).
AttnGeom attn_geom_small();
// One key block of 200 keys in one document from position 120 on: every query's hull starts at key
// 120, so a kernel that starts its key loop anywhere but the hull start is wrong.
AttnGeom attn_geom_late_hull(int64_t hq, int64_t hkv, int64_t d);
// T tokens at positions 0..T-1 as queries and one key block; documents of doc_len (0: one, causal).
AttnGeom attn_geom_packed(int64_t T, int64_t doc_len, int64_t hq, int64_t hkv, int64_t d);

// The hull [lo, hi) of the keys each query sees (same document, key position <= query position);
// lo == hi when none. Flat [tq * 2] for an i32 [tq, 2] tensor.
std::vector<int32_t> kv_hulls(const std::vector<int64_t>& q_index, const std::vector<int32_t>& q_doc,
                              const std::vector<int64_t>& k_index, const std::vector<int32_t>& k_doc);

// Float64 masked-softmax attention over all key blocks of g (GQA: query head h reads kv head
// h / (hq / hkv)). q [tq, hq*d]; k, v the key blocks' rows concatenated [tk_all, hkv*d]. Returns
// o [tq, hq*d] (0 where no key is visible) and lse [tq, hq] (-inf there).
void attention_reference(const AttnGeom& g, const std::vector<double>& q, const std::vector<double>& k,
                         const std::vector<double>& v, std::vector<double>& o, std::vector<double>& lse);

// Seeded N(0, scale^2) floats (std::mt19937_64): every case's inputs.
std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f);

}  // namespace ctx::exec::opcases
