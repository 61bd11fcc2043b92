// ctxrun-calibrate's measurements (see calibrate.hpp): GEMM throughput through cuBLASLt (bf16 and
// fp32), this backend's attention kernel forward/backward by sequence length and head dimension,
// device-to-device copy bandwidth, pinned host<->device bandwidth, the cost of a kernel launch,
// and, with two or more GPUs, NCCL collectives over all of them (nccl-tests' method: algbw and
// busbw). Timing: CUDA events around a batch long enough (>= ~20 ms) to hide launch jitter, the
// median of three batches. Untested on a GPU so far (docs/CUDA.md).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef CTXPLAN_HAVE_NCCL
#include <nccl.h>
#endif
#ifdef CTXPLAN_HAVE_CUDNN
#include <cudnn.h>
#endif

#include "executor/cuda/calibrate.hpp"
#include "executor/cuda/cuda_check.hpp"
#include "executor/cuda/gemm_lt.hpp"
#include "executor/cuda/attention_mma.hpp"
#include "executor/cuda/kernels.hpp"

namespace ctx::exec::calib {
namespace {

__global__ void empty_kernel() {}

// Small pseudo-random values (a hash of the index): GEMM timing on zeros can be optimistic.
__global__ void init_f32(float* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    p[i] = (static_cast<float>(h & 0xffff) / 65536.0f - 0.5f) * 0.1f;
  }
}
__global__ void init_bf16(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    p[i] = __float2bfloat16((static_cast<float>(h & 0xffff) / 65536.0f - 0.5f) * 0.1f);
  }
}
// One causal document: token i at index i, and its key hull [0, i + 1) (what the strategy code's
// KeyBlock would hold for a single-rank causal block).
__global__ void iota_index(int64_t* idx, int32_t* doc, int32_t* kv_range, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    idx[i] = i;
    doc[i] = 0;
    kv_range[2 * i] = 0;
    kv_range[2 * i + 1] = static_cast<int32_t>(i + 1);
  }
}

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { CTX_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 256))); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(p); }
};

// Seconds per call of `op` on `s`: batches of R calls timed with events (R makes a batch ~20 ms),
// the median of three batches.
double time_per_call(cudaStream_t s, const std::function<void()>& op) {
  cudaEvent_t a, b;
  CTX_CUDA(cudaEventCreate(&a));
  CTX_CUDA(cudaEventCreate(&b));
  op();  // warm-up (heuristics, first-touch, clocks)
  op();
  CTX_CUDA(cudaEventRecord(a, s));
  op();
  CTX_CUDA(cudaEventRecord(b, s));
  CTX_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CTX_CUDA(cudaEventElapsedTime(&ms, a, b));
  const int reps = std::clamp(static_cast<int>(20.0 / std::max(ms, 1e-3f)), 3, 200);
  std::vector<double> per;
  for (int t = 0; t < 3; ++t) {
    CTX_CUDA(cudaEventRecord(a, s));
    for (int r = 0; r < reps; ++r) op();
    CTX_CUDA(cudaEventRecord(b, s));
    CTX_CUDA(cudaEventSynchronize(b));
    CTX_CUDA(cudaEventElapsedTime(&ms, a, b));
    per.push_back(ms * 1e-3 / reps);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(per.begin(), per.end());
  return per[1];
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::clamp<int64_t>((n + 255) / 256, 1, 65535)); }

void measure_gemm(Measurements& out, const Options& o, cudaStream_t s) {
  std::vector<int64_t> squares = {256, 512, 1024, 2048, 4096, 8192};
  if (!o.quick) squares.push_back(16384);
  struct Shape {
    int64_t m, n, k;
  };
  std::vector<Shape> shapes;
  for (int64_t x : squares) shapes.push_back({x, x, x});
  // Llama-8B-like projections at 4K tokens: QKV/O (h x h), MLP up (h -> ffn) and down (ffn -> h)
  for (Shape sh : {Shape{4096, 4096, 4096}, Shape{4096, 14336, 4096}, Shape{4096, 4096, 14336}, Shape{4096, 1024, 4096}})
    shapes.push_back(sh);
  int64_t most = 0;
  for (auto& sh : shapes) most = std::max({most, sh.m * sh.k, sh.k * sh.n, sh.m * sh.n});
  DeviceBuffer ws(size_t(32) << 20);
  cuda::LtGemm lt(ws.p, size_t(32) << 20);
  for (const char* dtype : {"bf16", "fp32"}) {
    const bool bf = std::string(dtype) == "bf16";
    const size_t elem = bf ? 2 : 4;
    DeviceBuffer a(most * elem), b(most * elem), c(most * elem);
    for (auto* buf : {&a, &b, &c}) {
      if (bf) init_bf16<<<grid_for(most), 256, 0, s>>>(buf->as<__nv_bfloat16>(), most, 7);
      else init_f32<<<grid_for(most), 256, 0, s>>>(buf->as<float>(), most, 7);
      CTX_CUDA_LAUNCHED("init");
    }
    for (const Shape& sh : shapes) {
      if (!bf && sh.m * sh.n * sh.k > int64_t(8192) * 8192 * 8192) continue;  // fp32 at 16K^3: seconds per call
      GemmSample g;
      g.m = sh.m;
      g.n = sh.n;
      g.k = sh.k;
      g.dtype = dtype;
      g.seconds = time_per_call(s, [&] {
        lt.run(bf ? cuda::GemmType::bf16 : cuda::GemmType::fp32, false, true, sh.m, sh.n, sh.k, 1.0f, a.p, b.p, 0.0f,
               c.p, s);
      });
      out.gemm.push_back(g);
    }
  }
}

void measure_memory(Measurements& out, const Options& o, cudaStream_t s) {
  const int64_t largest = o.quick ? (int64_t(256) << 20) : (int64_t(1) << 30);
  DeviceBuffer src(largest), dst(largest);
  CTX_CUDA(cudaMemsetAsync(src.p, 1, largest, s));
  for (int64_t bytes = 64 << 10; bytes <= largest; bytes *= 4) {
    CopySample c;
    c.bytes_moved = 2.0 * static_cast<double>(bytes);  // read + write
    c.seconds = time_per_call(s, [&] { CTX_CUDA(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, s)); });
    out.device_copy.push_back(c);
  }
  const size_t host_bytes = size_t(256) << 20;
  void* pinned = nullptr;
  CTX_CUDA(cudaMallocHost(&pinned, host_bytes));
  const double h2d = time_per_call(s, [&] { CTX_CUDA(cudaMemcpyAsync(dst.p, pinned, host_bytes, cudaMemcpyHostToDevice, s)); });
  const double d2h = time_per_call(s, [&] { CTX_CUDA(cudaMemcpyAsync(pinned, src.p, host_bytes, cudaMemcpyDeviceToHost, s)); });
  cudaFreeHost(pinned);
  out.h2d_bytes_per_second = static_cast<double>(host_bytes) / h2d;
  out.d2h_bytes_per_second = static_cast<double>(host_bytes) / d2h;
}

void measure_launch(Measurements& out, cudaStream_t s) {
  constexpr int kLaunches = 2000;
  out.launch_seconds = time_per_call(s, [&] {
                         for (int i = 0; i < kLaunches; ++i) empty_kernel<<<1, 32, 0, s>>>();
                       }) /
                       kLaunches;
  CTX_CUDA_LAUNCHED("empty_kernel");
}

void measure_attention(Measurements& out, const Options& o, cudaStream_t s) {
  std::vector<int64_t> seqs = {512, 1024, 2048, 4096, 8192};
  if (!o.quick) seqs.push_back(16384);
  const int64_t hq = 16, hkv = 4;  // GQA 4:1, as Llama-3 8B
  for (int64_t d : {int64_t(64), int64_t(128)}) {
    for (int64_t S : seqs) {
      const int64_t qn = S * hq * d, kn = S * hkv * d;
      DeviceBuffer q(qn * 4), k(kn * 4), v(kn * 4), o_(qn * 4), lse(S * hq * 4), dq(qn * 4), dk(kn * 4), dv(kn * 4),
          dout(qn * 4), delta(S * hq * 4), idx(S * 8), doc(S * 4), range(S * 8);
      const std::pair<DeviceBuffer*, int64_t> inputs[] = {{&q, qn}, {&k, kn}, {&v, kn}, {&dout, qn}};
      for (auto [buf, n] : inputs) {
        init_f32<<<grid_for(n), 256, 0, s>>>(buf->as<float>(), n, static_cast<uint32_t>(n));
        CTX_CUDA_LAUNCHED("init");
      }
      iota_index<<<grid_for(S), 256, 0, s>>>(idx.as<int64_t>(), doc.as<int32_t>(), range.as<int32_t>(), S);
      CTX_CUDA_LAUNCHED("iota");
      cuda::k::fill(lse.as<float>(), -INFINITY, S * hq, s);
      const cuda::k::AttnDims dims{hq, hkv, d, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))};
      cuda::k::AttnTokens tok;
      tok.q_index = tok.k_index = idx.as<int64_t>();
      tok.q_doc = tok.k_doc = doc.as<int32_t>();
      tok.tq = tok.tk = S;
      tok.kv_range = range.as<int32_t>();
      AttentionSample a;
      a.kernel = "ctxrun_fp32";
      a.seq = S;
      a.head_dim = d;
      a.q_heads = hq;
      a.kv_heads = hkv;
      a.causal = true;
      a.pairs = static_cast<double>(S) * static_cast<double>(S + 1) / 2.0;
      a.fwd_seconds = time_per_call(s, [&] {
        cuda::k::attention_forward(o_.as<float>(), lse.as<float>(), q.as<float>(), k.as<float>(), v.as<float>(), tok,
                                   dims, s);
      });
      cuda::k::attention_delta(delta.as<float>(), dout.as<float>(), o_.as<float>(), S * hq, d, s);
      a.bwd_seconds = time_per_call(s, [&] {
        cuda::k::attention_backward(dq.as<float>(), dk.as<float>(), dv.as<float>(), q.as<float>(), k.as<float>(),
                                    v.as<float>(), tok, dout.as<float>(), lse.as<float>(), delta.as<float>(), dims, s);
      });
      out.attention.push_back(a);

      // the tensor-core kernel (attention_mma.cu) on the same shapes in bf16: what bf16 plans run
      if (cuda::k::attention_mma_supported(dims)) {
        const std::pair<DeviceBuffer*, int64_t> bf_inputs[] = {{&q, qn}, {&k, kn}, {&v, kn}, {&dout, qn}};
        for (auto [buf, n] : bf_inputs) {  // bf16 values in the first half of each buffer
          init_bf16<<<grid_for(n), 256, 0, s>>>(buf->as<__nv_bfloat16>(), n, static_cast<uint32_t>(n));
          CTX_CUDA_LAUNCHED("init bf16");
        }
        cuda::k::fill(lse.as<float>(), -INFINITY, S * hq, s);
        using bits = cuda::k::bf16_bits;
        AttentionSample m = a;
        m.kernel = "ctxrun_mma";
        m.fwd_seconds = time_per_call(s, [&] {
          cuda::k::attention_mma_forward(o_.as<float>(), lse.as<float>(), q.as<bits>(), k.as<bits>(), v.as<bits>(),
                                         tok, dims, s);
        });
        m.bwd_seconds = time_per_call(s, [&] {
          cuda::k::attention_mma_backward(dq.as<float>(), dk.as<float>(), dv.as<float>(), q.as<bits>(), k.as<bits>(),
                                          v.as<bits>(), tok, dout.as<bits>(), lse.as<float>(), delta.as<float>(), dims,
                                          s);
        });
        out.attention.push_back(m);
      }
    }
  }
}

#ifdef CTXPLAN_HAVE_NCCL
void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string("NCCL ") + what + ": " + ncclGetErrorString(r));
}

// Single process, every visible GPU (ncclCommInitAll), nccl-tests' buffer conventions.
void measure_collectives(Measurements& out, const Options& o, int ndev) {
  std::vector<ncclComm_t> comms(ndev);
  std::vector<int> devs(ndev);
  for (int i = 0; i < ndev; ++i) devs[i] = i;
  nccl_check(ncclCommInitAll(comms.data(), ndev, devs.data()), "ncclCommInitAll");
  const size_t largest = o.quick ? (size_t(64) << 20) : (size_t(1) << 30);
  std::vector<cudaStream_t> streams(ndev);
  std::vector<void*> sendb(ndev), recvb(ndev);
  for (int i = 0; i < ndev; ++i) {
    CTX_CUDA(cudaSetDevice(i));
    CTX_CUDA(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
    CTX_CUDA(cudaMalloc(&sendb[i], largest));
    CTX_CUDA(cudaMalloc(&recvb[i], largest));
    CTX_CUDA(cudaMemset(sendb[i], 0, largest));
  }
  auto run = [&](const std::string& op, size_t bytes) {
    const size_t count = bytes / sizeof(float), per = count / static_cast<size_t>(ndev);
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int i = 0; i < ndev; ++i) {
      if (op == "all_reduce") nccl_check(ncclAllReduce(sendb[i], recvb[i], count, ncclFloat32, ncclSum, comms[i], streams[i]), "all_reduce");
      else if (op == "all_gather") nccl_check(ncclAllGather(sendb[i], recvb[i], per, ncclFloat32, comms[i], streams[i]), "all_gather");
      else if (op == "reduce_scatter") nccl_check(ncclReduceScatter(sendb[i], recvb[i], per, ncclFloat32, ncclSum, comms[i], streams[i]), "reduce_scatter");
      else if (op == "all_to_all") nccl_check(ncclAlltoAll(sendb[i], recvb[i], per, ncclFloat32, comms[i], streams[i]), "all_to_all");
      else {  // p2p: a ring of send/recv pairs
        nccl_check(ncclSend(sendb[i], count, ncclFloat32, (i + 1) % ndev, comms[i], streams[i]), "send");
        nccl_check(ncclRecv(recvb[i], count, ncclFloat32, (i + ndev - 1) % ndev, comms[i], streams[i]), "recv");
      }
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  };
  auto sync_all = [&] {
    for (int i = 0; i < ndev; ++i) {
      CTX_CUDA(cudaSetDevice(i));
      CTX_CUDA(cudaStreamSynchronize(streams[i]));
    }
  };
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"}) {
    for (size_t bytes = 8 * sizeof(float) * ndev; bytes <= largest; bytes *= 16) {
      run(op, bytes);  // warm-up
      run(op, bytes);
      sync_all();
      const int reps = bytes < (size_t(16) << 20) ? 50 : 10;
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) run(op, bytes);
      sync_all();
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
      out.collectives.push_back({op, ndev, static_cast<double>(bytes), sec});
      if (std::string(op) == "all_reduce" && (out.collective_launch_seconds == 0 || sec < out.collective_launch_seconds))
        out.collective_launch_seconds = sec;
    }
  }
  for (int i = 0; i < ndev; ++i) {
    CTX_CUDA(cudaSetDevice(i));
    cudaFree(sendb[i]);
    cudaFree(recvb[i]);
    cudaStreamDestroy(streams[i]);
    ncclCommDestroy(comms[i]);
  }
  CTX_CUDA(cudaSetDevice(0));
}
#endif

}  // namespace

Measurements measure(const Options& o) {
  int ndev = 0;  // left unchanged by cudaGetDeviceCount when there is no driver
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)
    throw std::runtime_error("no CUDA device (cudaGetDeviceCount found none): nothing can be measured on this machine");
  Measurements m;
  CTX_CUDA(cudaSetDevice(0));
  cudaDeviceProp p{};
  CTX_CUDA(cudaGetDeviceProperties(&p, 0));
  m.device_name = p.name;
  m.sm = p.major * 10 + p.minor;
  int drv = 0;
  CTX_CUDA(cudaDriverGetVersion(&drv));
  m.driver = "CUDA driver " + std::to_string(drv / 1000) + "." + std::to_string((drv % 1000) / 10);
#ifdef CTXPLAN_HAVE_CUDNN
  m.cudnn_version = std::to_string(cudnnGetVersion());
#endif
  size_t free_b = 0, total_b = 0;
  CTX_CUDA(cudaMemGetInfo(&free_b, &total_b));
  m.free_bytes = static_cast<double>(free_b);
  m.total_bytes = static_cast<double>(total_b);
  cudaStream_t s;
  CTX_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  measure_launch(m, s);
  measure_memory(m, o, s);
  measure_gemm(m, o, s);
  measure_attention(m, o, s);
  CTX_CUDA(cudaStreamSynchronize(s));
  cudaStreamDestroy(s);
#ifdef CTXPLAN_HAVE_NCCL
  if (o.collectives && ndev >= 2) measure_collectives(m, o, ndev);
#endif
  return m;
}

}  // namespace ctx::exec::calib
