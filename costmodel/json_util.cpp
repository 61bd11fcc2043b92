#include "costmodel/json_util.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
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

}  // namespace

json parse_json_text(const std::string& text, const std::string& where) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    auto [line, col] = line_col(text, e.byte == 0 ? 0 : e.byte - 1);
    std::string msg = e.what();
    // nlohmann's message starts with "[json.exception.parse_error.101] parse error at line L, column C: ..."
    auto colon = msg.find("column");
    if (colon != std::string::npos) {
      auto c2 = msg.find(':', colon);
      if (c2 != std::string::npos) msg = msg.substr(c2 + 2);
    }
    throw InputError(where + ":" + std::to_string(line) + ":" + std::to_string(col), "",
                     "malformed JSON (" + msg + ")");
  }
}

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "", "cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_json_text(ss.str(), path);
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
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (d == static_cast<double>(static_cast<int64_t>(d))) return static_cast<int64_t>(d);
  }
  fail(key, "expected an integer, got " + v.dump());
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
  if (!v.is_number()) fail(key, "expected a number, got " + v.dump());
  return v.get<double>();
}

double JsonReader::number_or(const std::string& key, double fallback) const {
  return has(key) ? number(key) : fallback;
}

bool JsonReader::boolean_or(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const json& v = j_.at(key);
  if (!v.is_boolean()) fail(key, "expected true or false, got " + v.dump());
  return v.get<bool>();
}

std::string JsonReader::string(const std::string& key) const {
  const json& v = raw(key);
  if (!v.is_string()) fail(key, "expected a string, got " + v.dump());
  return v.get<std::string>();
}

std::string JsonReader::string_or(const std::string& key, const std::string& fallback) const {
  return has(key) ? string(key) : fallback;
}

JsonReader JsonReader::object(const std::string& key) const {
  const json& v = raw(key);
  if (!v.is_object()) fail(key, "expected an object");
  return JsonReader(v, where_, path(key));
}

}  // namespace ctx
