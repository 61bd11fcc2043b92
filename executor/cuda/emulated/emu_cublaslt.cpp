// The cuBLASLt subset the backend uses (gemm_lt.cpp), on the emulated device: D = alpha op(A)
// op(B) + beta C in column-major layouts, A and B in fp32 or bf16, C and D in fp32 or bf16,
// products in fp32 (exact for bf16 inputs, inputs rounded to TF32 under
// CUBLAS_COMPUTE_32F_FAST_TF32), summed in fp32 in k order; beta = 0 never reads C (as cuBLAS).
// Runs when the stream reaches it. Combinations cuBLASLt does not offer (A and B of different
// types, fp32 inputs with a bf16 output, an epilogue, batches, a non-column-major order, operands
// in pageable host memory) fail with CUBLAS_STATUS_NOT_SUPPORTED or INVALID_VALUE, as they would
// on a GPU, so the backend cannot rely on something the real library would refuse.
#include <cublasLt.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "executor/bf16.hpp"
#include "executor/cuda/emulated/emu_device.hpp"

using ctx_emu::Device;

namespace {

struct Layout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t order = CUBLASLT_ORDER_COL;
  int32_t batch = 1;
};
struct Desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
};
struct Handle {
  int magic = 0x17;
};

template <typename Opaque, typename T>
T* body(Opaque* o) {
  static_assert(sizeof(T) <= sizeof(Opaque), "emulated cuBLASLt: descriptor does not fit its opaque type");
  return reinterpret_cast<T*>(o);
}

float load(const void* p, cudaDataType t, size_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  return ctx::exec::bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
}
void store(void* p, cudaDataType t, size_t i, float f) {
  if (t == CUDA_R_32F) static_cast<float*>(p)[i] = f;
  else static_cast<uint16_t*>(p)[i] = ctx::exec::f32_to_bf16(f);  // round to nearest even, as cuBLASLt
}
float tf32(float f) {  // round to 10 explicit mantissa bits, nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return f;
  u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
  std::memcpy(&f, &u, 4);
  return f;
}
bool supported_type(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = reinterpret_cast<cublasLtHandle_t>(new Handle());
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete reinterpret_cast<Handle*>(h);
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasLtGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    default: return "CUBLAS_STATUS (emulated)";
  }
}
const char* cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
    default: return "emulated cuBLASLt error";
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (!supported_type(type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (ld < static_cast<int64_t>(rows ? rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
  *l = new cublasLtMatrixLayoutOpaque_t{};
  *body<cublasLtMatrixLayoutOpaque_t, Layout>(*l) = Layout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t bytes) {
  Layout* L = body<cublasLtMatrixLayoutOpaque_t, Layout>(l);
  if (attr == CUBLASLT_MATRIX_LAYOUT_ORDER && bytes == 4) std::memcpy(&L->order, buf, 4);
  else if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && bytes == 4) std::memcpy(&L->batch, buf, 4);
  else return CUBLAS_STATUS_NOT_SUPPORTED;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  if (scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32 && compute != CUBLAS_COMPUTE_32F_FAST_16BF)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  *d = new cublasLtMatmulDescOpaque_t{};
  *body<cublasLtMatmulDescOpaque_t, Desc>(*d) = Desc{compute, scale};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t bytes) {
  Desc* D = body<cublasLtMatmulDescOpaque_t, Desc>(d);
  if (!buf) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      if (bytes != 4) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&D->trans_a, buf, 4);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_TRANSB:
      if (bytes != 4) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&D->trans_b, buf, 4);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      if (bytes != 4) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&D->epilogue, buf, 4);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      if (bytes != 4) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&D->pointer_mode, buf, 4);
      return CUBLAS_STATUS_SUCCESS;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new cublasLtMatmulPreferenceOpaque_t{};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                                                    const void* buf, size_t) {
  return buf ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

// One "algorithm": the reference loop. Shapes and types are checked here as cuBLASLt does.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* count) {
  const Desc* D = body<cublasLtMatmulDescOpaque_t, Desc>(d);
  const Layout *A = body<cublasLtMatrixLayoutOpaque_t, Layout>(a), *B = body<cublasLtMatrixLayoutOpaque_t, Layout>(b),
               *C = body<cublasLtMatrixLayoutOpaque_t, Layout>(c), *DD = body<cublasLtMatrixLayoutOpaque_t, Layout>(dd);
  *count = 0;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  if (A->type != B->type || C->type != DD->type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (A->type == CUDA_R_32F && C->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (D->compute == CUBLAS_COMPUTE_32F_FAST_TF32 && A->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  std::memset(&results[0], 0, sizeof(results[0]));
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha_p, const void* a,
                              cublasLtMatrixLayout_t al, const void* b, cublasLtMatrixLayout_t bl, const void* beta_p,
                              const void* c, cublasLtMatrixLayout_t cl, void* d, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(Device::get().mutex());
  const Desc D = *body<cublasLtMatmulDescOpaque_t, Desc>(desc);
  const Layout A = *body<cublasLtMatrixLayoutOpaque_t, Layout>(al), B = *body<cublasLtMatrixLayoutOpaque_t, Layout>(bl),
               C = *body<cublasLtMatrixLayoutOpaque_t, Layout>(cl), DL = *body<cublasLtMatrixLayoutOpaque_t, Layout>(dl);
  if (D.epilogue != CUBLASLT_EPILOGUE_DEFAULT || D.pointer_mode != CUBLASLT_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
  for (const Layout* L : {&A, &B, &C, &DL})
    if (L->order != CUBLASLT_ORDER_COL || L->batch != 1) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (A.type != B.type || C.type != DL.type || (A.type == CUDA_R_32F && C.type != CUDA_R_32F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool ta = D.trans_a != CUBLAS_OP_N, tb = D.trans_b != CUBLAS_OP_N;
  const uint64_t m = DL.rows, n = DL.cols, k = ta ? A.rows : A.cols;
  if ((ta ? A.cols : A.rows) != m || (tb ? B.cols : B.rows) != k || (tb ? B.rows : B.cols) != n || C.rows != m ||
      C.cols != n)
    return CUBLAS_STATUS_INVALID_VALUE;
  Device& dev = Device::get();
  for (const void* p : {a, b, static_cast<const void*>(d)})
    if (dev.kind(p) == ctx_emu::PtrKind::pageable) {
      std::fprintf(stderr, "emulated cuBLASLt: an operand in pageable host memory\n");
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  const float alpha = *static_cast<const float*>(alpha_p), beta = *static_cast<const float*>(beta_p);
  const bool round_tf32 = D.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  ctx_emu::Op op;
  op.what = "cublasLtMatmul m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
  op.start = [=] {
    for (uint64_t j = 0; j < n; ++j)
      for (uint64_t i = 0; i < m; ++i) {
        float s = 0;
        for (uint64_t p = 0; p < k; ++p) {
          float x = load(a, A.type, ta ? p + i * A.ld : i + p * A.ld);
          float y = load(b, B.type, tb ? j + p * B.ld : p + j * B.ld);
          if (round_tf32) x = tf32(x), y = tf32(y);
          s += x * y;
        }
        float out = alpha * s;
        if (beta != 0) out += beta * load(c, C.type, i + j * C.ld);
        store(d, DL.type, i + j * DL.ld, out);
      }
    return true;
  };
  dev.enqueue(stream, std::move(op));
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
