// The CPU test doubles of the CUDA runtime, cuBLASLt and NCCL (emu_*.cpp) behave as the real
// libraries do where the backend depends on it: work runs only when the host waits; device memory
// faults on a host access; events order streams, and a missing event wait is caught by the seeded
// stream order; launches over sm_90's limits fail at the launch; out of memory is an error; the
// backend's own cuBLASLt wrapper (gemm_lt.cpp) matches a float64 reference for every transpose
// and dtype; NCCL on one rank. Label cpu. Compiled with emu_prelude.hpp like the backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "executor/cuda/emulated/emu_device.hpp"
#include "executor/cuda/gemm_lt.hpp"
#include "executor/cuda/launch.cuh"

namespace {

__global__ void write_kernel(float* out, float value, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = value;
}
__global__ void copy_plus_one_kernel(float* dst, const float* src, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) dst[i] = src[i] + 1;
}

void check(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

TEST(EmulatedRuntime, WorkRunsOnlyWhenTheHostWaits) {
  float* pinned = nullptr;
  float* dev = nullptr;
  check(cudaMallocHost(reinterpret_cast<void**>(&pinned), 64 * sizeof(float)));
  check(cudaMalloc(reinterpret_cast<void**>(&dev), 64 * sizeof(float)));
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < 64; ++i) pinned[i] = -1;
  CTX_LAUNCH(2, 32, 0, s, write_kernel)(dev, 3.0f, 64);
  check(cudaMemcpyAsync(pinned, dev, 64 * sizeof(float), cudaMemcpyDeviceToHost, s));
  EXPECT_EQ(pinned[0], -1) << "a copy into pinned memory ran before the host waited";
  check(cudaStreamSynchronize(s));
  for (int i = 0; i < 64; ++i) ASSERT_EQ(pinned[i], 3.0f);
  // a copy into pageable memory is synchronous, as in CUDA
  std::vector<float> host(64, 0);
  CTX_LAUNCH(2, 32, 0, s, write_kernel)(dev, 5.0f, 64);
  check(cudaMemcpyAsync(host.data(), dev, 64 * sizeof(float), cudaMemcpyDeviceToHost, s));
  EXPECT_EQ(host[63], 5.0f);
  // a pageable source is staged at the call: overwriting it afterwards changes nothing
  std::vector<float> src(64, 7.0f);
  check(cudaMemcpyAsync(dev, src.data(), 64 * sizeof(float), cudaMemcpyHostToDevice, s));
  src.assign(64, 8.0f);
  check(cudaMemcpy(host.data(), dev, 64 * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(host[0], 7.0f);
  check(cudaStreamDestroy(s));
  check(cudaFree(dev));
  check(cudaFreeHost(pinned));
}

TEST(EmulatedRuntime, HostAccessToDeviceMemoryFaults) {
  float* dev = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&dev), 4096));
  EXPECT_DEATH({ volatile float x = dev[0]; (void)x; }, "");
  EXPECT_EQ(cudaMemcpyAsync(dev, dev, 16, cudaMemcpyHostToDevice, nullptr), cudaErrorInvalidValue)
      << "a device pointer passed as the host source";
  (void)cudaGetLastError();
  check(cudaFree(dev));
}

// y = x + 1 on stream b after x = 2 on stream a: right with the event wait under every seed; without
// it the seeded stream order runs b first under some seed (and the test says which).
TEST(EmulatedRuntime, EventsOrderStreamsAndAMissingWaitIsCaught) {
  float *x = nullptr, *y = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&x), 32 * sizeof(float)));
  check(cudaMalloc(reinterpret_cast<void**>(&y), 32 * sizeof(float)));
  cudaStream_t a, b;
  cudaEvent_t e;
  check(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  check(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  int wrong_without_wait = 0;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    ctx_emu::Device::get().reseed(seed);
    for (bool wait : {true, false}) {
      CTX_LAUNCH(1, 32, 0, a, write_kernel)(x, 0.0f, 32);
      check(cudaDeviceSynchronize());
      CTX_LAUNCH(1, 32, 0, a, write_kernel)(x, 2.0f, 32);
      check(cudaEventRecord(e, a));
      if (wait) check(cudaStreamWaitEvent(b, e, 0));
      CTX_LAUNCH(1, 32, 0, b, copy_plus_one_kernel)(y, x, 32);
      float got = 0;
      check(cudaMemcpy(&got, y, sizeof(float), cudaMemcpyDeviceToHost));
      if (wait) EXPECT_EQ(got, 3.0f) << "seed " << seed;
      else wrong_without_wait += got != 3.0f;
    }
  }
  ctx_emu::Device::get().reseed(0x5eed);
  EXPECT_GT(wrong_without_wait, 0) << "the seeded stream order never ran the unordered reader first";
  check(cudaFree(x));
  check(cudaFree(y));
}

TEST(EmulatedRuntime, AWaitThatCanNeverBeSatisfiedIsReported) {
  cudaStream_t a, b;
  cudaEvent_t ea, eb;
  check(cudaStreamCreate(&a));
  check(cudaStreamCreate(&b));
  check(cudaEventCreate(&ea));
  check(cudaEventCreate(&eb));
  // b waits for a's second record, which a only reaches after waiting for b: a cycle
  check(cudaEventRecord(eb, b));  // position 1 of b (to be superseded below)
  check(cudaStreamWaitEvent(a, eb, 0));
  float* x = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&x), 128));
  CTX_LAUNCH(1, 32, 0, a, write_kernel)(x, 1.0f, 32);
  check(cudaEventRecord(ea, a));
  check(cudaStreamWaitEvent(b, ea, 0));
  check(cudaEventRecord(eb, b));
  check(cudaStreamWaitEvent(a, eb, 0));  // a now waits for b, which waits for a's record: fine
  check(cudaStreamSynchronize(a));       // no cycle yet: completes
  // a genuine cycle: a waits for b's future position, b waits for a's
  auto cycle = [&] {
    ctx_emu::Device& d = ctx_emu::Device::get();
    ctx_emu::StreamState* sa = d.resolve(a);
    ctx_emu::StreamState* sb = d.resolve(b);
    const uint64_t pa = sa->issued + 2, pb = sb->issued + 2;
    d.enqueue(a, ctx_emu::Op{"wait b", [sb, pb] { return sb->done >= pb; }, [] { return true; }, {}, {}});
    d.enqueue(a, ctx_emu::Op{"nop", {}, [] { return true; }, {}, {}});
    d.enqueue(b, ctx_emu::Op{"wait a", [sa, pa] { return sa->done >= pa; }, [] { return true; }, {}, {}});
    d.enqueue(b, ctx_emu::Op{"nop", {}, [] { return true; }, {}, {}});
    d.synchronize_all();
  };
  EXPECT_THROW(cycle(), std::runtime_error);
  ctx_emu::Device::get().discard_all();
  check(cudaFree(x));
}

TEST(EmulatedRuntime, LaunchesOverTheSm90LimitsFailAtTheLaunch) {
  float* x = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&x), 4096));
  (void)cudaGetLastError();
  CTX_LAUNCH(1, 2048, 0, nullptr, write_kernel)(x, 1.0f, 16);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  CTX_LAUNCH(1, 32, 64 * 1024, nullptr, write_kernel)(x, 1.0f, 16);  // 64 KiB dynamic, no opt-in
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  check(cudaFuncSetAttribute(reinterpret_cast<const void*>(&write_kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                             64 * 1024));
  CTX_LAUNCH(1, 32, 64 * 1024, nullptr, write_kernel)(x, 1.0f, 16);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  check(cudaDeviceSynchronize());
  check(cudaFree(x));
}

TEST(EmulatedRuntime, OutOfMemoryIsAnError) {
  size_t free_bytes = 0, total = 0;
  check(cudaMemGetInfo(&free_bytes, &total));
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, total + 1), cudaErrorMemoryAllocation);
  (void)cudaGetLastError();
  check(cudaMalloc(&p, 1 << 20));
  size_t after = 0;
  check(cudaMemGetInfo(&after, &total));
  EXPECT_EQ(free_bytes - after, size_t{1} << 20);
  check(cudaFree(p));
}

// The backend's LtGemm (row-major through cuBLASLt's column-major transpose trick, gemm_lt.cpp)
// against a float64 reference: all four transposes, beta 0 and 0.5, exact fp32 (tolerance 1e-5 of
// sum |a b|: fp32 sums of 9 terms) and TF32 (inputs rounded to 10 mantissa bits: 2^-10 of it).
TEST(EmulatedCublasLt, BackendGemmMatchesFloat64ForEveryTranspose) {
  const int64_t m = 7, n = 5, k = 9;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  void* ws = nullptr;
  check(cudaMalloc(&ws, 1 << 20));
  ctx::exec::cuda::LtGemm lt(ws, 1 << 20);
  for (auto type : {ctx::exec::cuda::GemmType::fp32, ctx::exec::cuda::GemmType::tf32})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.0f, 0.5f}) {
          std::vector<float> A(m * k), B(k * n), C(m * n);
          for (auto* v : {&A, &B, &C})
            for (float& x : *v) x = nd(rng);
          // stored: A as [m,k] or [k,m] (ta), B as [k,n] or [n,k] (tb)
          std::vector<float> As(m * k), Bs(k * n);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t p = 0; p < k; ++p) As[ta ? p * m + i : i * k + p] = A[i * k + p];
          for (int64_t p = 0; p < k; ++p)
            for (int64_t j = 0; j < n; ++j) Bs[tb ? j * k + p : p * n + j] = B[p * n + j];
          void *da, *db, *dc;
          check(cudaMalloc(&da, m * k * 4));
          check(cudaMalloc(&db, k * n * 4));
          check(cudaMalloc(&dc, m * n * 4));
          check(cudaMemcpy(da, As.data(), As.size() * 4, cudaMemcpyHostToDevice));
          check(cudaMemcpy(db, Bs.data(), Bs.size() * 4, cudaMemcpyHostToDevice));
          check(cudaMemcpy(dc, C.data(), C.size() * 4, cudaMemcpyHostToDevice));
          lt.run(type, ta, tb, m, n, k, 1.0f, da, db, beta, dc, nullptr);
          std::vector<float> got(m * n);
          check(cudaMemcpy(got.data(), dc, got.size() * 4, cudaMemcpyDeviceToHost));
          const double tol = type == ctx::exec::cuda::GemmType::tf32 ? std::ldexp(1.0, -10) : 1e-5;
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double ref = beta * static_cast<double>(C[i * n + j]), mag = std::fabs(ref);
              for (int64_t p = 0; p < k; ++p) {
                ref += static_cast<double>(A[i * k + p]) * B[p * n + j];
                mag += std::fabs(static_cast<double>(A[i * k + p]) * B[p * n + j]);
              }
              ASSERT_NEAR(got[i * n + j], ref, tol * mag)
                  << "ta " << ta << " tb " << tb << " beta " << beta << " at " << i << "," << j;
            }
          check(cudaFree(da));
          check(cudaFree(db));
          check(cudaFree(dc));
        }
  check(cudaFree(ws));
}

TEST(EmulatedNccl, OneRankCollectivesAndSendToSelf) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm;
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  float *x = nullptr, *y = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&x), 64 * sizeof(float)));
  check(cudaMalloc(reinterpret_cast<void**>(&y), 64 * sizeof(float)));
  CTX_LAUNCH(2, 32, 0, nullptr, write_kernel)(x, 4.0f, 64);
  ASSERT_EQ(ncclAllReduce(x, y, 64, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
  float got = 0;
  check(cudaMemcpy(&got, y + 63, sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, 4.0f);
  CTX_LAUNCH(2, 32, 0, nullptr, write_kernel)(x, 6.0f, 64);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclRecv(y, 64, ncclFloat32, 0, comm, nullptr), ncclSuccess);
  ASSERT_EQ(ncclSend(x, 64, ncclFloat32, 0, comm, nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  check(cudaMemcpy(&got, y, sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, 6.0f);
  EXPECT_EQ(ncclAllReduce(x, &got, 1, ncclFloat32, ncclSum, comm, nullptr), ncclInvalidArgument)
      << "a pageable host buffer";
  ASSERT_EQ(ncclCommDestroy(comm), ncclSuccess);
  check(cudaFree(x));
  check(cudaFree(y));
}

}  // namespace
