// Shared by the libFuzzer targets (docs/FUZZING.md). A target feeds one input to one reader and
// lets only InputError (bad input: exit 2 in every binary) pass; any other exception escapes and
// libFuzzer reports it (an exit-1 "internal error" in the binaries), as it reports crashes,
// sanitizer findings, timeouts and memory blow-ups.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "costmodel/errors.hpp"

#define CTX_FUZZ_EXPECT(cond)                                                                 \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "fuzz property failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

namespace ctx::fuzz {

inline std::string bytes(const uint8_t* data, size_t size) { return std::string(reinterpret_cast<const char*>(data), size); }

}  // namespace ctx::fuzz
