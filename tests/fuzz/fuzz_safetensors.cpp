// ctxrun's safetensors reader (--resume shards, --init-from Hugging Face weights) on fuzzed bytes.
// Property: what it returns is what the header promised (element counts match the shapes).
#include "executor/safetensors.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, std::string> metadata;
  try {
    ctx::exec::TensorMap t = ctx::exec::parse_safetensors(ctx::fuzz::bytes(data, size), "fuzz.safetensors", &shapes, &metadata);
    for (auto& [name, v] : t) {
      int64_t n = 1;
      for (int64_t d : shapes.at(name)) n *= d;
      CTX_FUZZ_EXPECT(static_cast<int64_t>(v.size()) == n);
    }
  } catch (const ctx::InputError&) {
  }
  return 0;
}
