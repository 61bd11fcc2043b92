// Reading JSON documents with errors a person can act on: file, line and column for syntax
// errors; file, field path and the expected type or range for content errors.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "costmodel/errors.hpp"

namespace ctx {

using json = nlohmann::json;

// Limits every JSON input is held to (named in the refusal, documented in the README):
// nesting deeper than this is refused before parsing, so no reader or message recurses without bound.
constexpr int kJsonMaxDepth = 64;
// A value quoted in an error message is cut to this many characters.
constexpr size_t kJsonExcerptChars = 80;

// Parses a file; a syntax error becomes InputError naming file, line and column. Also refused with
// InputError (exit 2): a folder, nesting deeper than kJsonMaxDepth, a number beyond double range,
// and a key repeated within one object (nlohmann would silently keep the last).
json read_json_file(const std::string& path);
// Parses text that came from `where` (a file name or a flag), with the same error shape.
json parse_json_text(const std::string& text, const std::string& where);
// A value as an error message quotes it: compact JSON, at most kJsonExcerptChars characters
// ("..." marks a cut), never recursing past kJsonMaxDepth levels.
std::string json_excerpt(const json& v);
// A JSON number as an exact int64, or nullopt: a fraction, or beyond the int64 range (checked on
// the double before any cast, so no undefined behaviour).
std::optional<int64_t> json_exact_integer(const json& v);
// A document as every binary writes it (files and standard output): bytes that are not UTF-8 in a
// string (a file name, a model path) become U+FFFD instead of nlohmann's type_error (exit 1).
std::string json_dump(const json& j, int indent = 2);
// Writes a file atomically (temp file, fsync, rename) so a failed run never leaves half a file.
void write_file_atomic(const std::string& path, const std::string& content);

// Typed access to an object's fields; errors name `where` and the field path.
class JsonReader {
 public:
  JsonReader(const json& j, std::string where, std::string prefix = "");
  bool has(const std::string& key) const;
  int64_t integer(const std::string& key) const;
  int64_t integer_or(const std::string& key, int64_t fallback) const;
  // A positive integer within [lo, hi].
  int64_t integer_in(const std::string& key, int64_t lo, int64_t hi) const;
  double number(const std::string& key) const;
  double number_or(const std::string& key, double fallback) const;
  bool boolean_or(const std::string& key, bool fallback) const;
  std::string string(const std::string& key) const;
  std::string string_or(const std::string& key, const std::string& fallback) const;
  JsonReader object(const std::string& key) const;
  const json& raw(const std::string& key) const;
  const json& self() const { return j_; }
  const std::string& where() const { return where_; }
  std::string path(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "." + key; }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

 private:
  const json& j_;
  std::string where_;
  std::string prefix_;
};

}  // namespace ctx
