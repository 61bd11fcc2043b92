#include "executor/safetensors.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "costmodel/errors.hpp"
#include "costmodel/json_util.hpp"

namespace fs = std::filesystem;

namespace ctx::exec {
namespace {

float bf16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float f16_to_float(uint16_t h) {
  uint32_t s = (h >> 15) & 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? std::ldexp(static_cast<float>(m), -24)
            : e == 31 ? (m ? NAN : INFINITY)
                      : std::ldexp(static_cast<float>(m | 0x400), static_cast<int>(e) - 25);
  return s ? -v : v;
}

// One header entry, checked before any byte is copied: dtype known, shape non-negative with a
// product that does not overflow, offsets inside the data section, and the byte length equal to
// dtype size x element count (a length that is not would overrun the buffer sized from it).
struct TensorEntry {
  std::string dtype;
  size_t dtype_bytes = 0;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

TensorEntry check_entry(const std::string& path, const std::string& name, const json& t, uint64_t data_bytes) {
  if (!t.is_object())
    throw InputError(path, name, "expected an object {dtype, shape, data_offsets}, got " + json_excerpt(t));
  TensorEntry e;
  const json* dt = t.contains("dtype") ? &t["dtype"] : nullptr;
  if (!dt || !dt->is_string()) throw InputError(path, name + ".dtype", "missing or not a string; valid: F32, BF16, F16");
  e.dtype = dt->get<std::string>();
  if (e.dtype == "F32") e.dtype_bytes = 4;
  else if (e.dtype == "BF16" || e.dtype == "F16") e.dtype_bytes = 2;
  else throw InputError(path, name, "dtype " + e.dtype.substr(0, 32) + " is not supported (F32, BF16, F16)");
  const json* sh = t.contains("shape") ? &t["shape"] : nullptr;
  if (!sh || !sh->is_array() || sh->size() > 8)
    throw InputError(path, name + ".shape", "missing or not an array of at most 8 dimensions");
  uint64_t numel = 1;
  for (const json& d : *sh) {
    auto n = json_exact_integer(d);
    if (!n || *n < 0 || *n > (int64_t(1) << 40))
      throw InputError(path, name + ".shape", "dimension " + json_excerpt(d) + " is not an integer in 0..2^40");
    if (*n != 0 && numel > data_bytes / static_cast<uint64_t>(*n))
      throw InputError(path, name + ".shape", "holds more elements than the file has bytes");
    numel *= static_cast<uint64_t>(*n);
    e.shape.push_back(*n);
  }
  const json* off = t.contains("data_offsets") ? &t["data_offsets"] : nullptr;
  if (!off || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
    throw InputError(path, name + ".data_offsets", "missing or not [begin, end] (two non-negative integers)");
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  if (e.end < e.begin || e.end > data_bytes)
    throw InputError(path, name + ".data_offsets",
                     "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] is not within the " +
                         std::to_string(data_bytes) + " data bytes (truncated?)");
  if (e.end - e.begin != numel * e.dtype_bytes)
    throw InputError(path, name + ".data_offsets",
                     "holds " + std::to_string(e.end - e.begin) + " bytes, but " + e.dtype + " x " +
                         std::to_string(numel) + " elements is " + std::to_string(numel * e.dtype_bytes));
  return e;
}

}  // namespace

namespace {

// The reader behind both entry points: `read(offset, n, dst)` copies n bytes at offset of a source
// of `size` bytes (a file, streamed tensor by tensor, or a buffer).
using ReadAt = std::function<void(uint64_t, uint64_t, char*)>;

TensorMap read_tensors(const std::string& path, uint64_t size, const ReadAt& read,
                       std::map<std::string, std::vector<int64_t>>* shapes,
                       std::map<std::string, std::string>* metadata) {
  uint64_t hn = 0;
  if (size >= 8) read(0, 8, reinterpret_cast<char*>(&hn));
  if (size < 8 || hn == 0 || hn > size - 8)
    throw InputError(path, "header", "not a safetensors file (bad header length)");
  std::string h(hn, '\0');
  read(8, hn, h.data());
  const json header = parse_json_text(h, path + " (header)");
  if (!header.is_object()) throw InputError(path, "header", "expected a JSON object of tensors");
  const uint64_t data0 = 8 + hn, data_bytes = size - data0;
  TensorMap out;
  for (auto& [name, t] : header.items()) {
    if (name == "__metadata__") {
      if (metadata && t.is_object())
        for (auto& [k, v] : t.items()) (*metadata)[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    const TensorEntry e = check_entry(path, name, t, data_bytes);
    std::vector<float> v((e.end - e.begin) / e.dtype_bytes);
    if (e.dtype == "F32") {
      read(data0 + e.begin, e.end - e.begin, reinterpret_cast<char*>(v.data()));
    } else {
      std::string raw(e.end - e.begin, '\0');
      read(data0 + e.begin, e.end - e.begin, raw.data());
      for (size_t i = 0; i < v.size(); ++i) {
        uint16_t x;
        std::memcpy(&x, raw.data() + 2 * i, 2);
        v[i] = e.dtype == "BF16" ? bf16_to_float(x) : f16_to_float(x);
      }
    }
    if (shapes) shapes->emplace(name, e.shape);
    out.emplace(name, std::move(v));
  }
  return out;
}

}  // namespace

std::string safetensors_bytes(const ShapeList& order, const TensorMap& tensors,
                              const std::map<std::string, std::string>& extra_metadata) {
  json header = json::object();
  uint64_t off = 0;
  for (auto& [name, shape] : order) {
    uint64_t n = tensors.at(name).size() * 4;
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  header["__metadata__"] = {{"format", "pt"}, {"producer", "ctxrun"}};
  for (auto& [k, v] : extra_metadata) header["__metadata__"][k] = v;
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::string out(8, '\0');
  uint64_t hn = h.size();
  std::memcpy(out.data(), &hn, 8);
  out += h;
  for (auto& [name, shape] : order) {
    const auto& v = tensors.at(name);
    out.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }
  return out;
}


void write_safetensors(const std::string& path, const ShapeList& order, const TensorMap& tensors) {
  ctx::write_file_atomic(path, safetensors_bytes(order, tensors));
}

TensorMap parse_safetensors(const std::string& bytes, const std::string& path,
                            std::map<std::string, std::vector<int64_t>>* shapes,
                            std::map<std::string, std::string>* metadata) {
  return read_tensors(path, bytes.size(), [&](uint64_t off, uint64_t n, char* dst) { std::memcpy(dst, bytes.data() + off, n); },
                      shapes, metadata);
}

TensorMap read_safetensors(const std::string& path, std::map<std::string, std::vector<int64_t>>* shapes,
                           std::map<std::string, std::string>* metadata) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw InputError(path, "", "is a folder; expected a .safetensors file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(path, "", "cannot open the safetensors file");
  const uint64_t size = fs::file_size(path, ec);
  if (ec) throw InputError(path, "", "cannot read the file size: " + ec.message());
  auto read = [&](uint64_t off, uint64_t n, char* dst) {
    f.seekg(static_cast<std::streamoff>(off));
    f.read(dst, static_cast<std::streamsize>(n));
    if (!f) throw InputError(path, "", "read failed at byte " + std::to_string(off) + " (file changed while read?)");
  };
  return read_tensors(path, size, read, shapes, metadata);
}

}  // namespace ctx::exec
