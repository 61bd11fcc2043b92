// The safetensors format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the bytes.
// ctxrun writes F32 and reads F32, BF16 and F16 (Hugging Face weights) as float.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ctx::exec {

using TensorMap = std::map<std::string, std::vector<float>>;
using ShapeList = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// The file's bytes: tensors in `order`, as F32, with `extra_metadata` in __metadata__.
std::string safetensors_bytes(const ShapeList& order, const TensorMap& tensors,
                              const std::map<std::string, std::string>& extra_metadata = {});
void write_safetensors(const std::string& path, const ShapeList& order, const TensorMap& tensors);
// Reads F32, BF16 and F16 tensors as float; throws InputError naming the file and tensor on bad
// input. Every header entry is checked (dtype, shape, offsets, byte length = dtype size x elements)
// before any byte is copied. `metadata`: the file's __metadata__ (string values), when given.
// parse_safetensors: the same reader over bytes in memory (`path` names them in errors).
TensorMap parse_safetensors(const std::string& bytes, const std::string& path,
                            std::map<std::string, std::vector<int64_t>>* shapes = nullptr,
                            std::map<std::string, std::string>* metadata = nullptr);
TensorMap read_safetensors(const std::string& path, std::map<std::string, std::vector<int64_t>>* shapes = nullptr,
                           std::map<std::string, std::string>* metadata = nullptr);

}  // namespace ctx::exec
