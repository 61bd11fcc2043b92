// cuDNN 9 fused SDPA through the backend graph API (design in attention_cudnn.hpp).
// Status: ran on one H200 on 2026-11-28 (docs/GPU_PROOF.md) (cuDNN 9.19): the engines accept both graphs; the forward and dV
// match float64, dQ and dK do not (relative 1.45-2.02, deterministic; cause not found). The graph patterns
// follow what cudnn-frontend builds for its SDPA forward and backward nodes (tests/test_attention_cudnn.cpp).
#include "executor/cuda/attention_cudnn.hpp"

#include <cudnn.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <tuple>
#include <vector>

// The handle attributes of the operation graph and the plan are marked deprecated in cuDNN 9 (the
// handle moves elsewhere in later versions) but are what 9.x still reads.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace ctx::exec::cuda {
namespace {

[[noreturn]] void throw_cudnn(cudnnStatus_t s, const char* what, int line) {
  char msg[256] = {0};
  cudnnGetLastErrorString(msg, sizeof msg);
  throw std::runtime_error(std::string("cuDNN error ") + cudnnGetErrorString(s) + " in " + what + " (line " +
                           std::to_string(line) + ")" + (msg[0] ? std::string(": ") + msg : ""));
}
#define CTX_CUDNN(call)                                                  \
  do {                                                                   \
    cudnnStatus_t ctx_s_ = (call);                                       \
    if (ctx_s_ != CUDNN_STATUS_SUCCESS) throw_cudnn(ctx_s_, #call, __LINE__); \
  } while (0)

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t t) { CTX_CUDNN(cudnnBackendCreateDescriptor(t, &d_)); }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  template <typename T>
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T* values, int64_t n = 1) {
    CTX_CUDNN(cudnnBackendSetAttribute(d_, name, type, n, values));
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, const Desc& other) {
    cudnnBackendDescriptor_t o = other.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &o);
  }
  void finalize() { CTX_CUDNN(cudnnBackendFinalize(d_)); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};
using DescPtr = std::unique_ptr<Desc>;

// Tensor unique ids of the variant packs.
enum Uid : int64_t {
  kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kScale = 6, kNegInf = 7,
  kDO = 8, kDQ = 9, kDK = 10, kDV = 11, kDelta = 12, kDQAccum = 13,
  kVirtual = 100,  // virtual tensors count up from here
};

// A graph under construction: owns every descriptor, hands out virtual ids.
struct GraphBuilder {
  cudnnHandle_t handle;
  std::vector<DescPtr> tensors, ops, aux;
  int64_t next_virtual = kVirtual;

  const Desc& tensor(int64_t uid, cudnnDataType_t dt, std::vector<int64_t> dims, std::vector<int64_t> strides,
                     bool is_virtual, bool by_value = false) {
    auto t = std::make_unique<Desc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16;
    t->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &dt)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), static_cast<int64_t>(dims.size()))
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), static_cast<int64_t>(strides.size()))
        .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid)
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &align)
        .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual)
        .set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &by_value);
    t->finalize();
    tensors.push_back(std::move(t));
    return *tensors.back();
  }
  const Desc& virt(cudnnDataType_t dt, std::vector<int64_t> dims, std::vector<int64_t> strides) {
    return tensor(next_virtual++, dt, std::move(dims), std::move(strides), true);
  }
  const Desc& scalar(int64_t uid) { return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true); }

  // y = mode(x[, b[, t]]); axis for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b, const Desc* t, const Desc& y,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    auto pw = std::make_unique<Desc>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode)
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &prec);
    if (axis >= 0) pw->set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis);
    pw->finalize();
    auto op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *pw).set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    op->finalize();
    aux.push_back(std::move(pw));
    ops.push_back(std::move(op));
  }
  void matmul(const Desc& a, const Desc& b, const Desc& c) {
    auto mm = std::make_unique<Desc>(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    mm->set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &comp);
    mm->finalize();
    auto op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, *mm);
    op->finalize();
    aux.push_back(std::move(mm));
    ops.push_back(std::move(op));
  }
  void reduction(cudnnReduceTensorOp_t mode, const Desc& x, const Desc& y) {
    auto rd = std::make_unique<Desc>(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    rd->set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &mode)
        .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &comp);
    rd->finalize();
    auto op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, *rd);
    op->finalize();
    aux.push_back(std::move(rd));
    ops.push_back(std::move(op));
  }
  void reshape(const Desc& x, const Desc& y) {
    auto op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x).set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    op->finalize();
    ops.push_back(std::move(op));
  }
};

// The scores' causal mask: keep (row >= col), otherwise the lowest float (top-left alignment).
const Desc& causal_mask(GraphBuilder& g, const Desc& s, const std::vector<int64_t>& sd,
                        const std::vector<int64_t>& ss) {
  const Desc& row = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  const Desc& col = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, row, CUDNN_DATA_FLOAT, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, col, CUDNN_DATA_FLOAT, 3);
  const Desc& keep = g.virt(CUDNN_DATA_BOOLEAN, sd, ss);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, nullptr, keep, CUDNN_DATA_BOOLEAN);
  const Desc& neg = g.scalar(kNegInf);
  const Desc& masked = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, &neg, &keep, masked);
  return masked;
}

// BSHD: token-major rows of heads x d.
std::vector<int64_t> bshd_dims(int64_t b, int64_t h, int64_t s, int64_t d) { return {b, h, s, d}; }
std::vector<int64_t> bshd_strides(int64_t h, int64_t s, int64_t d) { return {s * h * d, d, h * d, 1}; }
// The same memory seen as {b, h, d, s} (a transpose by strides).
std::vector<int64_t> bshd_t_strides(int64_t h, int64_t s, int64_t d) { return {s * h * d, d, 1, h * d}; }

struct Plan {
  GraphBuilder g;
  DescPtr graph, plan;
  int64_t plan_workspace = 0;
  int64_t extra_bytes = 0;  // the backward's fp32 delta and dQ accumulator, after the plan's workspace
  int64_t delta_offset = 0, dq_accum_offset = 0;
  std::string failure;  // non-empty: no engine
};

int64_t round256(int64_t n) { return (n + 255) / 256 * 256; }

void finish(Plan& p, cudnnHandle_t h) {
  std::vector<cudnnBackendDescriptor_t> ops;
  for (auto& o : p.g.ops) ops.push_back(o->get());
  p.graph = std::make_unique<Desc>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  p.graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops.data(), static_cast<int64_t>(ops.size()))
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &h);
  p.graph->finalize();
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *p.graph).set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
  heur.finalize();
  int64_t count = 0;
  CTX_CUDNN(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                     nullptr));
  std::vector<DescPtr> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    cfgs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(cfgs.back()->get());
  }
  int64_t got = 0;
  if (count > 0)
    CTX_CUDNN(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                       &got, raw.data()));
  std::string last = "no engine config from heuristic mode A";
  for (int64_t i = 0; i < got; ++i) {
    auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &h)
        .set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *cfgs[static_cast<size_t>(i)]);
    const cudnnStatus_t s = cudnnBackendFinalize(plan->get());
    if (s != CUDNN_STATUS_SUCCESS) {
      last = std::string("engine config ") + std::to_string(i) + ": " + cudnnGetErrorString(s);
      continue;
    }
    int64_t ws = 0, n = 0;
    CTX_CUDNN(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws));
    p.plan = std::move(plan);
    p.plan_workspace = ws;
    return;
  }
  p.failure = last;
}

// Forward: S = Q K^T * scale, causal mask, softmax with stats, O = P V.
void build_forward(Plan& p, const SdpaShape& s) {
  GraphBuilder& g = p.g;
  const int64_t b = s.batch, hq = s.heads_q, hk = s.heads_kv, sq = s.seq_q, sk = s.seq_kv, d = s.head_dim;
  const Desc& q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, bshd_dims(b, hq, sq, d), bshd_strides(hq, sq, d), false);
  const Desc& kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, {b, hk, d, sk}, bshd_t_strides(hk, sk, d), false);
  const Desc& v = g.tensor(kV, CUDNN_DATA_BFLOAT16, bshd_dims(b, hk, sk, d), bshd_strides(hk, sk, d), false);
  const Desc& o = g.tensor(kO, CUDNN_DATA_BFLOAT16, bshd_dims(b, hq, sq, d), bshd_strides(hq, sq, d), false);
  const std::vector<int64_t> sd = {b, hq, sq, sk}, ss = {hq * sq * sk, sq * sk, sk, 1};
  const std::vector<int64_t> rd = {b, hq, sq, 1}, rs = {hq * sq, sq, 1, 1};
  const Desc& stats = g.tensor(kStats, CUDNN_DATA_FLOAT, rd, rs, false);

  const Desc& s0 = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.matmul(q, kt, s0);
  const Desc& scale = g.scalar(kScale);
  const Desc& s1 = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, s0, &scale, nullptr, s1);
  const Desc& s2 = s.causal ? causal_mask(g, s1, sd, ss) : s1;
  const Desc& mx = g.virt(CUDNN_DATA_FLOAT, rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s2, mx);
  const Desc& sub = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, s2, &mx, nullptr, sub);
  const Desc& ex = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise(CUDNN_POINTWISE_EXP, sub, nullptr, nullptr, ex);
  const Desc& sum = g.virt(CUDNN_DATA_FLOAT, rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, ex, sum);
  const Desc& lg = g.virt(CUDNN_DATA_FLOAT, rd, rs);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, nullptr, lg);
  g.pointwise(CUDNN_POINTWISE_ADD, mx, &lg, nullptr, stats);  // stats = max + log(sum): the LSE
  const Desc& prob = g.virt(CUDNN_DATA_BFLOAT16, sd, ss);      // P in bf16 for the second product
  g.pointwise(CUDNN_POINTWISE_DIV, ex, &sum, nullptr, prob);
  g.matmul(prob, v, o);
}

// Backward (cudnn-frontend's SDPA backward pattern).
void build_backward(Plan& p, const SdpaShape& s) {
  GraphBuilder& g = p.g;
  const int64_t b = s.batch, hq = s.heads_q, hk = s.heads_kv, sq = s.seq_q, sk = s.seq_kv, d = s.head_dim;
  const auto bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  const Desc& q = g.tensor(kQ, bf, bshd_dims(b, hq, sq, d), bshd_strides(hq, sq, d), false);
  const Desc& kt = g.tensor(kK, bf, {b, hk, d, sk}, bshd_t_strides(hk, sk, d), false);
  const Desc& vt = g.tensor(kV, bf, {b, hk, d, sk}, bshd_t_strides(hk, sk, d), false);
  const Desc& o = g.tensor(kO, bf, bshd_dims(b, hq, sq, d), bshd_strides(hq, sq, d), false);
  const Desc& d_o = g.tensor(kDO, bf, bshd_dims(b, hq, sq, d), bshd_strides(hq, sq, d), false);
  const Desc& dq = g.tensor(kDQ, bf, bshd_dims(b, hq, sq, d), bshd_strides(hq, sq, d), false);
  const Desc& dk = g.tensor(kDK, bf, bshd_dims(b, hk, sk, d), bshd_strides(hk, sk, d), false);
  const Desc& dv = g.tensor(kDV, bf, bshd_dims(b, hk, sk, d), bshd_strides(hk, sk, d), false);
  const std::vector<int64_t> sd = {b, hq, sq, sk}, ss = {hq * sq * sk, sq * sk, sk, 1};
  const std::vector<int64_t> td = {b, hq, sk, sq}, ts = {hq * sq * sk, sq * sk, 1, sk};  // transposed scores
  const std::vector<int64_t> rd = {b, hq, sq, 1}, rs = {hq * sq, sq, 1, 1};
  const Desc& stats = g.tensor(kStats, f32, rd, rs, false);
  const Desc& scale = g.scalar(kScale);

  // delta = rowsum(dO * O), kept in the workspace (non-virtual, as cudnn-frontend does)
  const Desc& dov = g.virt(f32, bshd_dims(b, hq, sq, d), bshd_strides(hq, sq, d));
  g.pointwise(CUDNN_POINTWISE_MUL, d_o, &o, nullptr, dov);
  const Desc& delta = g.tensor(kDelta, f32, rd, rs, false);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, dov, delta);

  // P = exp(Q K^T * scale (masked) - stats)
  const Desc& s0 = g.virt(f32, sd, ss);
  g.matmul(q, kt, s0);
  const Desc& s1 = g.virt(f32, sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, s0, &scale, nullptr, s1);
  const Desc& s2 = s.causal ? causal_mask(g, s1, sd, ss) : s1;
  const Desc& s3 = g.virt(f32, sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, s2, &stats, nullptr, s3);
  const Desc& prob = g.virt(f32, sd, ss);
  g.pointwise(CUDNN_POINTWISE_EXP, s3, nullptr, nullptr, prob);

  // dV = P^T dO (GQA: per query head, then summed over each group)
  const Desc& pt = g.virt(bf, td, ts);
  g.reshape(prob, pt);
  if (hq == hk) {
    g.matmul(pt, d_o, dv);
  } else {
    const Desc& dv_full = g.virt(bf, {b, hq, sk, d}, {hq * sk * d, sk * d, d, 1});
    g.matmul(pt, d_o, dv_full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dv_full, dv);
  }

  // dS = P * (dO V^T - delta) * scale
  const Desc& dp = g.virt(f32, sd, ss);
  g.matmul(d_o, vt, dp);
  const Desc& dp2 = g.virt(f32, sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, &delta, nullptr, dp2);
  const Desc& ds0 = g.virt(f32, sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, dp2, &prob, nullptr, ds0);
  const Desc& ds = g.virt(bf, sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, ds0, &scale, nullptr, ds);

  // dK = dS^T Q
  const Desc& dst = g.virt(bf, td, ts);
  g.reshape(ds, dst);
  if (hq == hk) {
    g.matmul(dst, q, dk);
  } else {
    const Desc& dk_full = g.virt(bf, {b, hq, sk, d}, {hq * sk * d, sk * d, d, 1});
    g.matmul(dst, q, dk_full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dk_full, dk);
  }

  // dQ = dS K, accumulated in fp32 (workspace), then converted
  const Desc& k = g.virt(bf, bshd_dims(b, hk, sk, d), bshd_strides(hk, sk, d));
  g.reshape(kt, k);
  const Desc& dq_acc = g.tensor(kDQAccum, f32, bshd_dims(b, hq, sq, d), {hq * sq * d, sq * d, d, 1}, false);
  g.matmul(ds, k, dq_acc);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_acc, nullptr, nullptr, dq);

  p.delta_offset = 0;
  p.dq_accum_offset = round256(b * hq * sq * 4);
  p.extra_bytes = p.dq_accum_offset + round256(b * hq * sq * d * 4);
}

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, float, bool>;
Key key_of(const SdpaShape& s, bool backward) {
  return {s.batch, s.heads_q, s.heads_kv, s.seq_q, s.seq_kv, s.head_dim, s.causal, s.scale, backward};
}

void check_shape(const SdpaShape& s) {
  if (s.batch < 1 || s.heads_q < 1 || s.heads_kv < 1 || s.seq_q < 1 || s.seq_kv < 1)
    throw std::invalid_argument("cuDNN SDPA: empty shape");
  if (s.heads_q % s.heads_kv != 0)
    throw std::invalid_argument("cuDNN SDPA: heads_kv must divide heads_q (GQA)");
  if (s.head_dim % 8 != 0 || s.head_dim > 256)
    throw std::invalid_argument("cuDNN SDPA: head_dim must be a multiple of 8, at most 256 (cuDNN's limits)");
}

}  // namespace

struct CudnnSdpa::Impl {
  cudnnHandle_t handle = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans;

  Plan& get(const SdpaShape& s, bool backward) {
    check_shape(s);
    auto& slot = plans[key_of(s, backward)];
    if (!slot) {
      auto p = std::make_unique<Plan>();
      p->g.handle = handle;
      try {
        if (backward) build_backward(*p, s);
        else build_forward(*p, s);
        finish(*p, handle);
      } catch (const std::exception& e) {
        p->failure = e.what();
      }
      slot = std::move(p);
    }
    return *slot;
  }
  Plan& usable(const SdpaShape& s, bool backward) {
    Plan& p = get(s, backward);
    if (!p.failure.empty())
      throw std::runtime_error(std::string("cuDNN SDPA ") + (backward ? "backward" : "forward") +
                               ": no engine for this shape: " + p.failure);
    return p;
  }
  void run(Plan& p, std::vector<int64_t> uids, std::vector<void*> ptrs, void* workspace, cudaStream_t stream) {
    CTX_CUDNN(cudnnSetStream(handle, stream));
    Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), static_cast<int64_t>(uids.size()))
        .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, ptrs.data(), static_cast<int64_t>(ptrs.size()))
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace);
    pack.finalize();
    CTX_CUDNN(cudnnBackendExecute(handle, p.plan->get(), pack.get()));
  }
};

CudnnSdpa::CudnnSdpa() : impl_(std::make_unique<Impl>()) { CTX_CUDNN(cudnnCreate(&impl_->handle)); }

CudnnSdpa::~CudnnSdpa() {
  impl_->plans.clear();
  if (impl_->handle) cudnnDestroy(impl_->handle);
}

bool CudnnSdpa::supports(const SdpaShape& s, std::string* why) {
  try {
    for (bool bwd : {false, true}) {
      Plan& p = impl_->get(s, bwd);
      if (!p.failure.empty()) {
        if (why) *why = std::string(bwd ? "backward: " : "forward: ") + p.failure;
        return false;
      }
    }
  } catch (const std::exception& e) {
    if (why) *why = e.what();
    return false;
  }
  return true;
}

int64_t CudnnSdpa::forward_workspace_bytes(const SdpaShape& s) { return round256(impl_->usable(s, false).plan_workspace); }

int64_t CudnnSdpa::backward_workspace_bytes(const SdpaShape& s) {
  Plan& p = impl_->usable(s, true);
  return round256(p.plan_workspace) + p.extra_bytes;
}

void CudnnSdpa::forward(const SdpaShape& s, const SdpaForwardArgs& a, void* workspace, cudaStream_t stream) {
  Plan& p = impl_->usable(s, false);
  float scale = s.scale != 0 ? s.scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  float neg = std::numeric_limits<float>::lowest();
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> ptrs = {const_cast<void*>(a.q), const_cast<void*>(a.k), const_cast<void*>(a.v), a.o, a.stats,
                             &scale};
  if (s.causal) {
    uids.push_back(kNegInf);
    ptrs.push_back(&neg);
  }
  impl_->run(p, std::move(uids), std::move(ptrs), workspace, stream);
}

void CudnnSdpa::backward(const SdpaShape& s, const SdpaBackwardArgs& a, void* workspace, cudaStream_t stream) {
  Plan& p = impl_->usable(s, true);
  float scale = s.scale != 0 ? s.scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  float neg = std::numeric_limits<float>::lowest();
  char* extra = static_cast<char*>(workspace) + round256(p.plan_workspace);
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kDO, kStats, kScale, kDQ, kDK, kDV, kDelta, kDQAccum};
  std::vector<void*> ptrs = {const_cast<void*>(a.q),  const_cast<void*>(a.k),   const_cast<void*>(a.v),
                             const_cast<void*>(a.o),  const_cast<void*>(a.d_o), const_cast<float*>(a.stats),
                             &scale,                  a.d_q,                    a.d_k,
                             a.d_v,                   extra + p.delta_offset,   extra + p.dq_accum_offset};
  if (s.causal) {
    uids.push_back(kNegInf);
    ptrs.push_back(&neg);
  }
  impl_->run(p, std::move(uids), std::move(ptrs), workspace, stream);
}

size_t CudnnSdpa::cached_graphs() const { return impl_->plans.size(); }

}  // namespace ctx::exec::cuda
