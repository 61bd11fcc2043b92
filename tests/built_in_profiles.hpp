// Test helper: the repository's own profiles (profiles/), loaded once per test binary, and the
// ctxplan binary run against them.
#pragma once
#include <string>
#include <vector>

#include "costmodel/profile_store.hpp"
#include "run_process.hpp"

namespace ctx::testing {

inline const std::string& built_in_profiles_dir() {
  static const std::string dir = std::string(CTXPLAN_SOURCE_DIR) + "/profiles";
  return dir;
}

inline const Profiles& built_in_profiles() {
  static const Profiles p = load_profiles(built_in_profiles_dir());
  return p;
}

// `ctxplan --profiles <profiles/> args...`
inline RunResult ctxplan_with_built_in_profiles(std::vector<std::string> args) {
  args.insert(args.begin(), {"--profiles", built_in_profiles_dir()});
  return run_process(CTXPLAN_BIN, args);
}

}  // namespace ctx::testing
