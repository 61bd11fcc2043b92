// Row-major GEMM through cuBLASLt. cuBLASLt is column-major; a row-major C[m,n] = op(A) op(B) is
// the column-major C^T[n,m] = op(B)^T op(A)^T, so the call swaps the operands and keeps each
// operand's own transpose flag (the "transpose trick": no data is moved). One descriptor set and
// one heuristic choice are cached per (dtype, transposes, shape, pointer alignment), so the hot
// path after the first step is a hash lookup and the cublasLtMatmul call. The workspace is owned
// by the caller (the backend accounts it in the ledger as workspace).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <unordered_map>

namespace ctx::exec::cuda {

// storage (A and B / C and D) and compute: fp32/fp32 with fp32 FMA; fp32/fp32 on tf32 tensor cores;
// bf16/bf16 with fp32 accumulation (the result rounded once into bf16 D); bf16 A, B with fp32 C, D
// and fp32 accumulation (weight gradients accumulating in fp32). Every type uses
// CUBLAS_COMPUTE_32F (tf32: _FAST_TF32) with fp32 alpha and beta; cuBLASLt lists bf16 A/B with
// C/D either bf16 or fp32 for that compute type. It has no mixed f32/bf16 A and B: the backend
// widens such an operand first (cuda_backend.cpp, gemm).
enum class GemmType { fp32, tf32, bf16, bf16_f32 };

class LtGemm {
 public:
  LtGemm(void* workspace, size_t workspace_bytes);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // C[m,n] = alpha op(A) op(B) + beta C with contiguous row-major operands of `type`'s storage
  // (float for fp32/tf32; bf16 bits for A and B of bf16 and bf16_f32; bf16 C for bf16, float C
  // for bf16_f32); alpha and beta are host floats. m, n, k > 0.
  void run(GemmType type, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
           const void* b, float beta, void* c, cudaStream_t stream);
  size_t cached_plans() const { return plans_.size(); }

 private:
  struct Key {
    int type, ta, tb;
    int64_t m, n, k;
    int align_a, align_b, align_c;
    bool operator==(const Key& o) const {
      return type == o.type && ta == o.ta && tb == o.tb && m == o.m && n == o.n && k == o.k && align_a == o.align_a &&
             align_b == o.align_b && align_c == o.align_c;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  const Plan& plan_for(const Key& key);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;
  std::unordered_map<Key, Plan, KeyHash> plans_;
};

// Largest power of two (<= 256) dividing the address: what cuBLASLt may assume about alignment.
int pointer_alignment(const void* p);

}  // namespace ctx::exec::cuda
