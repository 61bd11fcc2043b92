#include "costmodel/json_util.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <fstream>
#include <sstream>

namespace ctx {
namespace {

// nlohmann reports a byte offset; turn it into 1-based line and column for the message.
std::pair<size_t, size_t> line_col(const std::string& text, size_t byte) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < byte && i < text.size(); ++i) {
    if (text[i] == '\n') { ++line; col = 1; } else { ++col; }
  }
  return {line, col};
}

// Refuses nesting deeper than kJsonMaxDepth before nlohmann sees the text: the parser itself is
// iterative, but every reader, dump() and destructor that follows would recurse once per level.
void check_depth(const std::string& text, const std::string& where) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > kJsonMaxDepth) {
        auto [line, col] = line_col(text, i);
        throw InputError(where + ":" + std::to_string(line) + ":" + std::to_string(col), "",
                         "JSON nested deeper than " + std::to_string(kJsonMaxDepth) +
                             " levels of arrays/objects (the limit for every input file)");
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

// Builds the document through nlohmann's SAX interface, so that a repeated key is refused (the DOM
// parser keeps the last silently) and an error knows the field it happened in.
class DomBuilder {
 public:
  json root;
  std::string duplicate_key;  // set when key() refused a repeat
  size_t error_byte = 0;
  std::string error_token;
  int error_id = 0;
  std::string error_what;

  bool null() { return put(nullptr); }
  bool boolean(bool b) { return put(b); }
  bool number_integer(json::number_integer_t v) { return put(v); }
  bool number_unsigned(json::number_unsigned_t v) { return put(v); }
  bool number_float(json::number_float_t v, const std::string&) { return put(v); }
  bool string(std::string& v) { return put(std::move(v)); }
  bool binary(json::binary_t& v) { return put(json::binary(std::move(v))); }
  bool start_object(std::size_t) { return open(json::object()); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& k) {
    json& top = *stack_.back();
    seg_.back() = k;
    if (top.contains(k)) {
      duplicate_key = k;
      return false;
    }
    pending_ = &top[k];
    return true;
  }
  bool parse_error(std::size_t byte, const std::string& token, const nlohmann::detail::exception& e) {
    error_byte = byte;
    error_token = token;
    error_id = e.id;
    error_what = e.what();
    return false;
  }
  // The field being read: "a.b[3].c" (empty at the top level).
  std::string path() const {
    std::string p;
    for (size_t i = 0; i < seg_.size(); ++i) {
      if (seg_[i].empty()) break;
      if (stack_[i]->is_array()) p += "[" + seg_[i] + "]";
      else p += (p.empty() ? "" : ".") + seg_[i];
    }
    return p;
  }

 private:
  std::vector<json*> stack_;
  std::vector<std::string> seg_;  // per open container: the key or index being filled
  json* pending_ = nullptr;

  json* slot() {
    if (stack_.empty()) return &root;
    json& top = *stack_.back();
    if (top.is_array()) {
      seg_.back() = std::to_string(top.size());
      top.push_back(nullptr);
      return &top.back();
    }
    return pending_;
  }
  bool put(json v) {
    *slot() = std::move(v);
    return true;
  }
  bool open(json v) {
    json* s = slot();
    *s = std::move(v);
    stack_.push_back(s);
    seg_.emplace_back();
    return true;
  }
  bool close() {
    stack_.pop_back();
    seg_.pop_back();
    return true;
  }
};

}  // namespace

json parse_json_text(const std::string& text, const std::string& where) {
  check_depth(text, where);
  DomBuilder b;
  if (json::sax_parse(text, &b)) return std::move(b.root);
  if (!b.duplicate_key.empty())
    throw InputError(where, b.path(), "the key '" + b.duplicate_key + "' appears twice in one object; give it once");
  auto [line, col] = line_col(text, b.error_byte == 0 ? 0 : b.error_byte - 1);
  const std::string at = where + ":" + std::to_string(line) + ":" + std::to_string(col);
  if (b.error_id == 406)  // nlohmann: number overflow
    throw InputError(at, b.path(),
                     "the number " + b.error_token.substr(0, kJsonExcerptChars) +
                         " is beyond the range of a double (about +-1.8e308)");
  std::string msg = b.error_what;
  // nlohmann's message starts with "[json.exception.parse_error.101] parse error at line L, column C: ..."
  auto colon = msg.find("column");
  if (colon != std::string::npos) {
    auto c2 = msg.find(':', colon);
    if (c2 != std::string::npos) msg = msg.substr(c2 + 2);
  }
  if (msg.size() > 2 * kJsonExcerptChars) msg = msg.substr(0, 2 * kJsonExcerptChars) + "...";
  throw InputError(at, b.path(), "malformed JSON (" + msg + ")");
}

json read_json_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(path, "", "is a folder; expected a JSON file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "", "cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_json_text(ss.str(), path);
}

std::string json_dump(const json& j, int indent) { return j.dump(indent, ' ', false, json::error_handler_t::replace); }

std::string json_excerpt(const json& v) {
  std::string s;
  // containers deeper than the parse limit cannot come from a file; built in code, they are summarised
  // (the check descends at most kJsonMaxDepth levels)
  std::function<bool(const json&, int)> deeper_than = [&](const json& x, int levels) {
    if (!x.is_structured()) return false;
    if (levels == 0) return true;
    for (const auto& c : x)
      if (deeper_than(c, levels - 1)) return true;
    return false;
  };
  if (deeper_than(v, kJsonMaxDepth)) s = v.is_array() ? "[...]" : "{...}";
  else s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > kJsonExcerptChars) s = s.substr(0, kJsonExcerptChars) + "...";
  return s;
}

std::optional<int64_t> json_exact_integer(const json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // [-2^63, 2^63): both bounds exact in a double; NaN and infinities fail the comparisons
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != std::trunc(d)) return std::nullopt;
    return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

void write_file_atomic(const std::string& path, const std::string& content) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw InputError(path, "", "cannot write file");
  size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ::write(fd, content.data() + off, content.size() - off);
    if (n <= 0) { ::close(fd); ::unlink(tmp.c_str()); throw InputError(path, "", "write failed"); }
    off += static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw InputError(path, "", "cannot rename temporary file into place");
  }
}

JsonReader::JsonReader(const json& j, std::string where, std::string prefix)
    : j_(j), where_(std::move(where)), prefix_(std::move(prefix)) {
  if (!j_.is_object()) throw InputError(where_, prefix_, "expected a JSON object");
}

void JsonReader::fail(const std::string& key, const std::string& what) const {
  throw InputError(where_, path(key), what);
}

bool JsonReader::has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }

const json& JsonReader::raw(const std::string& key) const {
  if (!j_.contains(key)) fail(key, "missing required field");
  return j_.at(key);
}

int64_t JsonReader::integer(const std::string& key) const {
  const json& v = raw(key);
  if (auto i = json_exact_integer(v)) return *i;
  fail(key, "expected an integer (within +-9.2e18), got " + json_excerpt(v));
}

int64_t JsonReader::integer_or(const std::string& key, int64_t fallback) const {
  return has(key) ? integer(key) : fallback;
}

int64_t JsonReader::integer_in(const std::string& key, int64_t lo, int64_t hi) const {
  int64_t v = integer(key);
  if (v < lo || v > hi)
    fail(key, "value " + std::to_string(v) + " is out of range; valid: " + std::to_string(lo) + ".." +
                  std::to_string(hi));
  return v;
}

double JsonReader::number(const std::string& key) const {
  const json& v = raw(key);
  if (!v.is_number()) fail(key, "expected a number, got " + json_excerpt(v));
  return v.get<double>();
}

double JsonReader::number_or(const std::string& key, double fallback) const {
  return has(key) ? number(key) : fallback;
}

bool JsonReader::boolean_or(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const json& v = j_.at(key);
  if (!v.is_boolean()) fail(key, "expected true or false, got " + json_excerpt(v));
  return v.get<bool>();
}

std::string JsonReader::string(const std::string& key) const {
  const json& v = raw(key);
  if (!v.is_string()) fail(key, "expected a string, got " + json_excerpt(v));
  return v.get<std::string>();
}

std::string JsonReader::string_or(const std::string& key, const std::string& fallback) const {
  return has(key) ? string(key) : fallback;
}

JsonReader JsonReader::object(const std::string& key) const {
  const json& v = raw(key);
  if (!v.is_object()) fail(key, "expected an object, got " + json_excerpt(v));
  return JsonReader(v, where_, path(key));
}

}  // namespace ctx
