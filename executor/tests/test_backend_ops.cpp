// Every op case (op_cases.hpp) in test mode on every backend of the build, one gtest per
// <backend>/<case>: ctest lists e.g. cpu/CpuOps.Case/attention_fwd_doc_gqa4_d64_f32,
// cuda_emulated/EmulatedOps.Case/..., cuda/CudaOps.Case/....
//
//   cpu            the Eigen reference backend, every case                        (test_backend_ops, label cpu)
//   cuda_emulated  the CUDA backend on the CPU doubles of CUDA, cuBLASLt and NCCL, its kernels on the
//                  emulator: the cases marked `emulated` (today every test case: the whole list takes
//                  about 1.5 s there)                                            (test_backend_ops, label cpu)
//   cuda           the CUDA backend on a GPU, every case; SKIPPED without a device (test_backend_ops_gpu, label gpu)
//
// The tolerances are derived per element by the references (op_cases.cpp) and printed on failure.
#include <gtest/gtest.h>

#include <cctype>
#include <memory>
#include <ostream>
#include <set>
#include <string>

#include "executor/tests/op_cases.hpp"
#if defined(CTXPLAN_OPS_GPU)
#include "executor/cuda/cuda_backend.hpp"
#elif defined(CTXPLAN_HAVE_CUDA_EMULATED)
#include "executor/cuda/emulated/cuda_emulated.hpp"
#endif

using namespace ctx::exec;
using ctx::exec::opcases::OpCase;

namespace ctx::exec::opcases {
void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }  // not gtest's byte dump
}  // namespace ctx::exec::opcases

namespace {

// One backend of each kind per process (the emulated device is one per process; cuBLASLt set-up
// costs a second on a GPU); null where it cannot be made.
Backend* backend(const std::string& kind) {
  if (kind == "cpu") {
    static std::unique_ptr<Backend> cpu = make_cpu_backend();
    return cpu.get();
  }
#if defined(CTXPLAN_OPS_GPU)
  if (kind == "cuda") {
    static std::unique_ptr<Backend> gpu = cuda_device_count() > 0 ? make_cuda_backend(0) : nullptr;
    return gpu.get();
  }
#elif defined(CTXPLAN_HAVE_CUDA_EMULATED)
  if (kind == "cuda_emulated") {
    static std::unique_ptr<Backend> emu = make_cuda_emulated_backend(0);
    return emu.get();
  }
#endif
  return nullptr;
}

class BackendOps : public ::testing::TestWithParam<OpCase> {};

void run_case(const std::string& kind) {
  const OpCase& c = BackendOps::GetParam();
  Backend* be = backend(kind);
  if (!be) GTEST_SKIP() << kind << ": no device (cudaGetDeviceCount found none): skipped";
  ::testing::Test::RecordProperty("shape", c.shape);
  auto inst = c.make(*be);
  inst->run();
  for (const auto& chk : inst->check())
    EXPECT_TRUE(chk.ok()) << c.name << " [" << c.shape << ", " << c.dtype << "] on " << kind << "\n  "
                          << chk.describe() << "\n  tolerance: " << c.tolerance;
}

std::string case_name(const ::testing::TestParamInfo<OpCase>& info) { return info.param.name; }

std::vector<OpCase> cases(bool emulated_subset) {
  std::vector<OpCase> out;
  for (auto& c : opcases::test_cases())
    if (!emulated_subset || c.emulated) out.push_back(c);
  return out;
}

}  // namespace

// One suite per backend (the prefix of the instantiation names the backend).
#if defined(CTXPLAN_OPS_GPU)
class CudaOps : public BackendOps {};
TEST_P(CudaOps, Case) { run_case("cuda"); }
INSTANTIATE_TEST_SUITE_P(cuda, CudaOps, ::testing::ValuesIn(cases(false)), case_name);
#else
class CpuOps : public BackendOps {};
TEST_P(CpuOps, Case) { run_case("cpu"); }
INSTANTIATE_TEST_SUITE_P(cpu, CpuOps, ::testing::ValuesIn(cases(false)), case_name);
#if defined(CTXPLAN_HAVE_CUDA_EMULATED)
class EmulatedOps : public BackendOps {};
TEST_P(EmulatedOps, Case) { run_case("cuda_emulated"); }
INSTANTIATE_TEST_SUITE_P(cuda_emulated, EmulatedOps, ::testing::ValuesIn(cases(true)), case_name);
#endif
#endif

// The case list itself: names unique and gtest-safe, every case with a tolerance line and a size.
TEST(OpCaseList, NamesAreUniqueAndEveryCaseIsDescribed) {
  for (bool perf : {false, true}) {
    std::set<std::string> names;
    for (const auto& c : perf ? opcases::perf_cases(false) : opcases::test_cases()) {
      EXPECT_TRUE(names.insert(c.name).second) << "duplicate " << c.name;
      EXPECT_FALSE(c.tolerance.empty()) << c.name;
      EXPECT_GT(c.bytes, 0) << c.name;
      for (char ch : c.name) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_') << c.name;
    }
  }
}
