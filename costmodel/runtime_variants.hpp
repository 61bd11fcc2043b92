// The variants of the runtime profiles (profile_store.cpp): framework versions that change some of a
// runtime's constants, each resolved as "<runtime>@<variant>" by resolve_runtime. Listed for
// `ctxplan show runtime` and the GUI's runtime combo.
#pragma once

#include <string>
#include <vector>

#include "costmodel/profile_store.hpp"

namespace ctx {

struct RuntimeVariantInfo {
  std::string name;         // "<runtime>@<variant>", what --runtime takes
  std::string description;  // the variant's description (the version it states)
};

// The variants of one built-in runtime (`runtime` its name), or of every runtime (`runtime` empty),
// in file and then declaration order.
std::vector<RuntimeVariantInfo> runtime_variants(const Profiles& p, const std::string& runtime = "");

}  // namespace ctx
