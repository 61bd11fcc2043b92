// The profiles folder (data, not code): models, hardware, clusters and runtimes as JSON.
// Lookups accept a profile name or alias (case-insensitive), a path to a JSON file, and for
// clusters the shorthand `<nodes>x<gpus per node>x<gpu>` (`8xh100`, `128x8xh100`).
#pragma once
#include <string>
#include <vector>

#include "costmodel/hardware_spec.hpp"
#include "costmodel/json_util.hpp"
#include "costmodel/model_spec.hpp"
#include "costmodel/runtime_profile.hpp"

namespace ctx {

struct Profiles {
  std::string dir;
  std::vector<ModelSpec> models;
  std::vector<std::vector<std::string>> model_aliases;  // parallel to models
  std::vector<HardwareSpec> hardware;
  std::vector<ClusterSpec> clusters;
  std::vector<RuntimeProfile> runtimes;
};

// CTXPLAN_PROFILES from the environment if set, else the folder the build was configured with.
std::string default_profiles_dir();
// Loads every profile in `dir`; a bad file throws InputError naming it and the field.
Profiles load_profiles(const std::string& dir);

// Parsers for single documents (also used by tests on hand-written files).
ModelSpec model_from_json(const json& j, const std::string& where, std::vector<std::string>* aliases = nullptr);
HardwareSpec hardware_from_json(const json& j, const std::string& where);
RuntimeProfile runtime_from_json(const json& j, const std::string& where);
json model_to_json(const ModelSpec& m);

// Name, alias or file path -> spec. Unknown names throw InputError listing the closest names.
ModelSpec resolve_model(const Profiles& p, const std::string& arg);
const HardwareSpec& resolve_hardware(const Profiles& p, const std::string& arg);
ClusterSpec resolve_cluster(const Profiles& p, const std::string& arg);
// A runtime is a name in profiles/runtimes or the path of a runtime JSON (e.g. what `ctxplan calibrate -o` writes).
RuntimeProfile resolve_runtime(const Profiles& p, const std::string& arg);
// The calibration scales a runtime JSON may carry (constants.<name>, optional; 1 or 0 when absent).
const std::vector<std::string>& calibration_constant_names();

// A cluster of `nodes` x `gpus_per_node` of `gpu` with the GPU's default fabric.
ClusterSpec make_cluster(const HardwareSpec& gpu, int64_t nodes, int64_t gpus_per_node);

// Reads a Hugging Face config.json (Llama, Mistral, Qwen2/3, GLM-4, SmolLM3 keys).
ModelSpec model_from_hf_config(const json& j, const std::string& where);
// The inverse for Llama-family models: a config.json that transformers (and model_from_hf_config) read back.
json model_to_hf_config(const ModelSpec& m);

}  // namespace ctx
