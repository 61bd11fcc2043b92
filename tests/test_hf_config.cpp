// Importing a Hugging Face config.json: the imported model must be the same model the profile
// describes (same derived parameter count), RoPE scaling and NoPE layers must be read, and a
// missing key must be named in the error together with the file.
#include <gtest/gtest.h>

#include <string>

#include "costmodel/errors.hpp"
#include "costmodel/json_util.hpp"
#include "costmodel/model_spec.hpp"
#include "costmodel/profile_store.hpp"

using namespace ctx;

namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(default_profiles_dir());
  return p;
}

std::string data(const std::string& rel) { return std::string(CTXPLAN_TEST_DATA) + "/" + rel; }

ModelSpec load_hf(const std::string& rel) {
  std::string path = data(rel);
  return model_from_hf_config(read_json_file(path), path);
}

// Parameter count of a Llama-style decoder, written out from the architecture:
// per layer Wq [h, H*d], Wk/Wv [h, K*d], Wo [H*d, h], SwiGLU gate/up/down [h, f] x3, two norms [h];
// plus embedding [V, h], an untied head [V, h], and the final norm [h].
int64_t llama_params(int64_t L, int64_t h, int64_t H, int64_t K, int64_t d, int64_t f, int64_t V, bool tied,
                     bool qk_norm) {
  int64_t attn = h * H * d + 2 * h * K * d + H * d * h + (qk_norm ? 2 * d : 0);
  int64_t mlp = 3 * h * f;
  int64_t norms = 2 * h;
  return L * (attn + mlp + norms) + V * h + (tied ? 0 : V * h) + h;
}

json llama8b_json() { return read_json_file(data("hf_llama8b/config.json")); }

}  // namespace

TEST(HfConfig, Llama8BMatchesProfileParameterCount) {
  ModelSpec hf = load_hf("hf_llama8b/config.json");
  ModelSpec prof = resolve_model(profiles(), "Llama-3.1-8B");
  EXPECT_EQ(total_params(hf), total_params(prof));
  EXPECT_EQ(nonembedding_params(hf), nonembedding_params(prof));
  EXPECT_EQ(params_per_layer(hf), params_per_layer(prof));
  // Independent closed form; 8,030,261,248 is the count Meta publishes for Llama-3.1-8B ("8.03B").
  int64_t want = llama_params(32, 4096, 32, 8, 128, 14336, 128256, false, false);
  EXPECT_EQ(want, 8030261248);
  EXPECT_EQ(total_params(hf), want);
  EXPECT_EQ(hf.layers, prof.layers);
  EXPECT_EQ(hf.kv_heads, 8);
  EXPECT_EQ(hf.head_dim, 4096 / 32);
  EXPECT_FALSE(hf.qk_norm);
  EXPECT_FALSE(hf.qkv_bias);
  EXPECT_FALSE(hf.tied_embeddings);
}

TEST(HfConfig, Llama8BReadsLlama3RopeScaling) {
  ModelSpec hf = load_hf("hf_llama8b/config.json");
  ModelSpec prof = resolve_model(profiles(), "Llama-3.1-8B");
  EXPECT_EQ(hf.rope.scaling, RopeScaling::llama3);
  EXPECT_DOUBLE_EQ(hf.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(hf.rope.base, 500000.0);
  EXPECT_EQ(hf.rope.original_max_positions, 8192);
  EXPECT_DOUBLE_EQ(hf.rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(hf.rope.high_freq_factor, 4.0);
  EXPECT_EQ(hf.max_position, 131072);
  EXPECT_EQ(hf.rope.scaling, prof.rope.scaling);
  EXPECT_DOUBLE_EQ(hf.rope.factor, prof.rope.factor);
  EXPECT_EQ(count_layers(hf, PositionKind::rope), 32);
}

TEST(HfConfig, ResolveModelAcceptsConfigFolder) {
  ModelSpec via_folder = resolve_model(profiles(), data("hf_llama8b"));
  EXPECT_EQ(total_params(via_folder), total_params(resolve_model(profiles(), "Llama-3.1-8B")));
}

TEST(HfConfig, OlderRopeScalingTypeKeyIsRead) {
  // Configs before transformers 4.43 wrote "type" instead of "rope_type".
  json j = llama8b_json();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  ModelSpec m = model_from_hf_config(j, "config.json");
  EXPECT_EQ(m.rope.scaling, RopeScaling::linear);
  EXPECT_DOUBLE_EQ(m.rope.factor, 4.0);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  m = model_from_hf_config(j, "config.json");
  EXPECT_EQ(m.rope.scaling, RopeScaling::yarn);
  EXPECT_EQ(m.rope.original_max_positions, 32768);
}

TEST(HfConfig, Transformers5RopeParametersAreRead) {
  // transformers 5 writes RoPE under rope_parameters (seen in a config.json that 5.17 saved on the GPU
  // machine, 2026-11-28): without reading it a Llama-3 model would silently get base 10000 and no scaling.
  json j = llama8b_json();
  const json scaling = j["rope_scaling"];
  const double theta = j["rope_theta"].get<double>();
  j.erase("rope_scaling");
  j.erase("rope_theta");
  json rp = scaling;
  rp["rope_theta"] = theta;
  j["rope_parameters"] = rp;
  const ModelSpec old_style = model_from_hf_config(llama8b_json(), "config.json");
  const ModelSpec m = model_from_hf_config(j, "config.json");
  EXPECT_NE(theta, 10000.0);
  EXPECT_DOUBLE_EQ(m.rope.base, theta);
  EXPECT_EQ(m.rope.scaling, old_style.rope.scaling);
  EXPECT_NE(m.rope.scaling, RopeScaling::none);
  EXPECT_DOUBLE_EQ(m.rope.factor, old_style.rope.factor);
  // both spellings present must agree
  j["rope_theta"] = theta * 2;
  try {
    model_from_hf_config(j, "config.json");
    ADD_FAILURE() << "disagreeing rope_theta values were accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rope_theta"), std::string::npos) << e.what();
  }
  j["rope_theta"] = theta;
  EXPECT_DOUBLE_EQ(model_from_hf_config(j, "config.json").rope.base, theta);
}

TEST(HfConfig, SmolLM3NoRopeLayersMarkNope) {
  ModelSpec m = load_hf("hf_smollm3/config.json");
  ASSERT_EQ(m.layers, 36);
  // no_rope_layers[i] == 0 marks layer i NoPE: layers 3, 7, ..., 35 (every 4th), 36/4 = 9 of them.
  for (int64_t i = 0; i < m.layers; ++i)
    EXPECT_EQ(m.layer_position[static_cast<size_t>(i)], (i + 1) % 4 == 0 ? PositionKind::nope : PositionKind::rope)
        << "layer " << i;
  EXPECT_EQ(count_layers(m, PositionKind::nope), 9);
  EXPECT_EQ(count_layers(m, PositionKind::rope), 27);
  // Same positions and size as the SmolLM3-3B profile (which says nope_interval 4).
  ModelSpec prof = resolve_model(profiles(), "SmolLM3-3B");
  EXPECT_EQ(m.layer_position, prof.layer_position);
  EXPECT_TRUE(m.tied_embeddings);
  EXPECT_EQ(total_params(m), llama_params(36, 2048, 16, 4, 128, 11008, 128256, true, false));
  EXPECT_EQ(total_params(m), total_params(prof));
}

TEST(HfConfig, NoRopeLayerIntervalAloneMarksEveryNth) {
  json j = read_json_file(data("hf_smollm3/config.json"));
  j.erase("no_rope_layers");
  j["no_rope_layer_interval"] = 3;
  ModelSpec m = model_from_hf_config(j, "config.json");
  EXPECT_EQ(count_layers(m, PositionKind::nope), 36 / 3);
  EXPECT_EQ(m.layer_position[2], PositionKind::nope);
  EXPECT_EQ(m.layer_position[0], PositionKind::rope);
}

TEST(HfConfig, NoRopeLayersOfWrongLengthIsAnError) {
  json j = read_json_file(data("hf_smollm3/config.json"));
  j["no_rope_layers"] = {1, 1, 0};
  try {
    model_from_hf_config(j, "smol/config.json");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field, "no_rope_layers");
  }
}

TEST(HfConfig, Qwen3SetsQkNormAndHeadDim) {
  ModelSpec m = load_hf("hf_qwen3/config.json");
  EXPECT_TRUE(m.qk_norm);
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_NE(m.head_dim, m.hidden / m.heads);  // 5120/64 = 80: head_dim is read, not derived
  EXPECT_EQ(q_dim(m), 64 * 128);
  EXPECT_EQ(kv_dim(m), 8 * 128);
  EXPECT_FALSE(m.qkv_bias);
  EXPECT_EQ(m.rope.scaling, RopeScaling::none);  // "rope_scaling": null
  EXPECT_DOUBLE_EQ(m.rope.base, 1e6);
  int64_t want = llama_params(64, 5120, 64, 8, 128, 25600, 151936, false, true);
  EXPECT_EQ(total_params(m), want);
  EXPECT_EQ(total_params(m), total_params(resolve_model(profiles(), "Qwen3-32B")));
}

TEST(HfConfig, Qwen2HasQkvBiasAndNoQkNorm) {
  json j = read_json_file(data("hf_qwen3/config.json"));
  j["model_type"] = "qwen2";
  j.erase("attention_bias");
  j.erase("head_dim");
  ModelSpec m = model_from_hf_config(j, "qwen2/config.json");
  EXPECT_TRUE(m.qkv_bias);
  EXPECT_FALSE(m.qk_norm);
  EXPECT_EQ(m.head_dim, 5120 / 64);
}

TEST(HfConfig, MissingRequiredKeysNameKeyAndFile) {
  for (const char* key : {"num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"}) {
    json j = llama8b_json();
    j.erase(key);
    try {
      model_from_hf_config(j, "/models/x/config.json");
      ADD_FAILURE() << "no error without " << key;
    } catch (const InputError& e) {
      EXPECT_EQ(e.field, key);
      EXPECT_EQ(e.where, "/models/x/config.json");
      std::string what = e.what();
      EXPECT_NE(what.find(key), std::string::npos) << what;
      EXPECT_NE(what.find("/models/x/config.json"), std::string::npos) << what;
    }
  }
}

TEST(HfConfig, MissingLayersFileNamesKeyAndPath) {
  std::string path = data("hf_missing_layers/config.json");
  try {
    model_from_hf_config(read_json_file(path), path);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field, "num_hidden_layers");
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
}

TEST(HfConfig, HeadDimNeededWhenHiddenNotMultipleOfHeads) {
  json j = llama8b_json();
  j["num_attention_heads"] = 24;  // 4096 / 24 is not an integer
  j["num_key_value_heads"] = 8;
  try {
    model_from_hf_config(j, "config.json");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field, "head_dim");
  }
}

TEST(HfConfig, BadValuesAreInputErrors) {
  json j = llama8b_json();
  j["hidden_act"] = "relu6";
  EXPECT_THROW(model_from_hf_config(j, "config.json"), InputError);
  j = llama8b_json();
  j["num_hidden_layers"] = "32";
  EXPECT_THROW(model_from_hf_config(j, "config.json"), InputError);
  j = llama8b_json();
  j["num_key_value_heads"] = 5;  // 32 % 5 != 0
  EXPECT_THROW(model_from_hf_config(j, "config.json"), InputError);
  j = llama8b_json();
  j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
  EXPECT_THROW(model_from_hf_config(j, "config.json"), InputError);
  EXPECT_THROW(model_from_hf_config(json::array(), "config.json"), InputError);
}
