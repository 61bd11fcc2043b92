#include "executor/cuda/gemm_lt.hpp"

#include <stdexcept>
#include <string>

#include "executor/cuda/cuda_check.hpp"

namespace ctx::exec::cuda {

int pointer_alignment(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  int a = 1;
  while (a < 256 && (v % (2 * a)) == 0) a *= 2;
  return a;
}

size_t LtGemm::KeyHash::operator()(const Key& k) const {
  size_t h = static_cast<size_t>(k.type) * 1000003u ^ static_cast<size_t>(k.ta * 2 + k.tb);
  for (int64_t v : {k.m, k.n, k.k, int64_t(k.align_a), int64_t(k.align_b), int64_t(k.align_c)})
    h = h * 1099511628211ull ^ static_cast<size_t>(v);
  return h;
}

LtGemm::LtGemm(void* workspace, size_t workspace_bytes) : workspace_(workspace), workspace_bytes_(workspace_bytes) {
  CTX_CUBLAS(cublasLtCreate(&handle_));
}

LtGemm::~LtGemm() {
  for (auto& [k, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
  }
  if (handle_) cublasLtDestroy(handle_);
}

const LtGemm::Plan& LtGemm::plan_for(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  const GemmType type = static_cast<GemmType>(key.type);
  const bool bf16_ab = type == GemmType::bf16 || type == GemmType::bf16_f32;
  const cudaDataType_t storage = bf16_ab ? CUDA_R_16BF : CUDA_R_32F;                  // A and B
  const cudaDataType_t c_storage = type == GemmType::bf16 ? CUDA_R_16BF : CUDA_R_32F;  // C and D
  const cublasComputeType_t compute = type == GemmType::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  Plan p;
  CTX_CUBLAS(cublasLtMatmulDescCreate(&p.op, compute, CUDA_R_32F));
  // Column-major view: D^T[n,m] = op(B)^T op(A)^T. The first Lt operand is B, the second is A.
  // B row-major [k,n] is column-major [n,k] = op(B)^T already (no transpose); B row-major [n,k]
  // (trans_b) is column-major [k,n] and needs a transpose. Likewise for A with [k,m] / [m,k].
  cublasOperation_t op_first = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_second = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  CTX_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  CTX_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
  const uint64_t m = static_cast<uint64_t>(key.m), n = static_cast<uint64_t>(key.n), k = static_cast<uint64_t>(key.k);
  // stored column-major shapes (rows, cols, ld) of the buffers as they lie in memory
  if (key.tb) CTX_CUBLAS(cublasLtMatrixLayoutCreate(&p.b, storage, k, n, static_cast<int64_t>(k)));
  else CTX_CUBLAS(cublasLtMatrixLayoutCreate(&p.b, storage, n, k, static_cast<int64_t>(n)));
  if (key.ta) CTX_CUBLAS(cublasLtMatrixLayoutCreate(&p.a, storage, m, k, static_cast<int64_t>(m)));
  else CTX_CUBLAS(cublasLtMatrixLayoutCreate(&p.a, storage, k, m, static_cast<int64_t>(k)));
  CTX_CUBLAS(cublasLtMatrixLayoutCreate(&p.c, c_storage, n, m, static_cast<int64_t>(n)));

  cublasLtMatmulPreference_t pref = nullptr;
  CTX_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = workspace_bytes_;
  uint32_t al_first = static_cast<uint32_t>(key.align_b), al_second = static_cast<uint32_t>(key.align_a),
           al_c = static_cast<uint32_t>(key.align_c);
  CTX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  CTX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_first,
                                                  sizeof(al_first)));
  CTX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_second,
                                                  sizeof(al_second)));
  CTX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  CTX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.b, p.a, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
    throw std::runtime_error("cuBLASLt has no algorithm for GEMM m=" + std::to_string(key.m) + " n=" +
                             std::to_string(key.n) + " k=" + std::to_string(key.k) + " ta=" + std::to_string(key.ta) +
                             " tb=" + std::to_string(key.tb) + " (" + cublasLtGetStatusString(st) + ")");
  }
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void LtGemm::run(GemmType type, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
                 const void* b, float beta, void* c, cudaStream_t stream) {
  Key key{static_cast<int>(type), ta ? 1 : 0, tb ? 1 : 0, m, n, k, pointer_alignment(a), pointer_alignment(b),
          pointer_alignment(c)};
  const Plan& p = plan_for(key);
  CTX_CUBLAS(cublasLtMatmul(handle_, p.op, &alpha, b, p.b, a, p.a, &beta, c, p.c, c, p.c, &p.algo, workspace_,
                            workspace_bytes_, stream));
}

}  // namespace ctx::exec::cuda
