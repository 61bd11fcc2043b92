// Checkpoints: weights in safetensors with Hugging Face Llama names (model.safetensors), the fp32
// master weights' Adam moments beside them (optimizer.safetensors), and trainer.json (step, model,
// plan). A checkpoint is written into <dir>/step-N.tmp, fsynced, renamed to <dir>/step-N, and then
// <dir>/latest is replaced atomically: a crash leaves the previous checkpoint intact.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "costmodel/json_util.hpp"
#include "executor/trainer.hpp"

namespace ctx::exec {

using TensorMap = std::map<std::string, std::vector<float>>;
using ShapeList = std::vector<std::pair<std::string, std::vector<int64_t>>>;

void write_safetensors(const std::string& path, const ShapeList& order, const TensorMap& tensors);
// Reads F32, BF16 and F16 tensors as float; throws InputError naming the file on bad input.
TensorMap read_safetensors(const std::string& path, std::map<std::string, std::vector<int64_t>>* shapes = nullptr);

// Collective: gathers the full tensors; rank 0 writes. Returns the checkpoint's directory.
std::string save_checkpoint(Trainer& t, const std::string& dir, const json& run_info);
// Collective: every rank reads <dir>/latest (or `dir` itself when it holds trainer.json) and takes
// its shards. Throws InputError when the checkpoint belongs to another model.
int64_t load_checkpoint(Trainer& t, const std::string& dir);
// Loads a Hugging Face checkpoint folder (config.json + *.safetensors) as the initial weights.
void load_hf_weights(Trainer& t, const std::string& dir);

}  // namespace ctx::exec
