// Errors that reach a user: every one names where the bad input came from (file or flag),
// the field, and what would be valid. The CLI maps them to exit codes (see costmodel/exit_codes.hpp).
#pragma once
#include <stdexcept>
#include <string>

namespace ctx {

// Bad input: a malformed file, an unknown name, an invalid plan, an absurd size.
struct InputError : std::runtime_error {
  std::string where;  // file path, "--plan", "--seq", ...
  std::string field;  // JSON field or plan key, may be empty
  InputError(std::string where_, std::string field_, const std::string& what)
      : std::runtime_error(format(where_, field_, what)), where(std::move(where_)), field(std::move(field_)) {}

  static std::string format(const std::string& where, const std::string& field, const std::string& what) {
    std::string s = where;
    if (!field.empty()) s += (s.empty() ? "" : ": ") + std::string("field '") + field + "'";
    if (!s.empty()) s += ": ";
    return s + what;
  }
};

}  // namespace ctx
