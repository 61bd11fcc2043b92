// Hugging Face config.json -> ModelSpec. Accepts the keys Llama, Mistral, Qwen2/Qwen3, GLM-4
// (transformers' glm4) and SmolLM3 write; a missing required key names the key and the file.
#include <cmath>

#include "costmodel/profile_store.hpp"

namespace ctx {

ModelSpec model_from_hf_config(const json& j, const std::string& where) {
  JsonReader r(j, where);
  static const char* required[] = {"num_hidden_layers", "hidden_size", "num_attention_heads",
                                   "intermediate_size", "vocab_size"};
  for (const char* key : required)
    if (!r.has(key))
      r.fail(key, "missing required key (a Llama/Mistral/Qwen-style config.json has num_hidden_layers, hidden_size, "
                  "num_attention_heads, intermediate_size and vocab_size)");
  ModelSpec m;
  std::string type = r.string_or("model_type", "llama");
  m.name = r.string_or("_name_or_path", "");
  if (m.name.empty()) m.name = where;
  m.source = "Hugging Face config.json: " + where;
  m.layers = r.integer_in("num_hidden_layers", 1, 10000);
  m.hidden = r.integer_in("hidden_size", 1, 1 << 20);
  m.heads = r.integer_in("num_attention_heads", 1, 1 << 14);
  m.kv_heads = r.has("num_key_value_heads") ? r.integer_in("num_key_value_heads", 1, 1 << 14) : m.heads;
  m.head_dim = r.has("head_dim") ? r.integer_in("head_dim", 1, 1 << 12) : m.hidden / m.heads;
  if (!r.has("head_dim") && m.hidden % m.heads != 0)
    r.fail("head_dim", "missing, and hidden_size is not a multiple of num_attention_heads");
  m.ffn = r.integer_in("intermediate_size", 1, 1 << 22);
  m.vocab = r.integer_in("vocab_size", 1, 1 << 24);
  m.tied_embeddings = r.boolean_or("tie_word_embeddings", false);
  // qkv bias: explicit attention_bias, else Qwen2's always-on q/k/v bias, GLM-4's add_qkv_bias
  m.qkv_bias = r.boolean_or("attention_bias", type == "qwen2" || r.boolean_or("add_qkv_bias", false));
  m.qk_norm = (type == "qwen3" || type == "qwen3_moe");
  std::string act = r.string_or("hidden_act", "silu");
  // Llama-family MLPs are gated: silu -> SwiGLU; a gated GELU is costed the same as SwiGLU.
  m.activation = ActivationKind::swiglu;
  if (act != "silu" && act != "swiglu" && act != "gelu" && act != "gelu_pytorch_tanh")
    r.fail("hidden_act", "unsupported activation '" + act + "'; valid: silu, swiglu, gelu, gelu_pytorch_tanh");
  m.norm = NormKind::rmsnorm;
  m.max_position = r.integer_or("max_position_embeddings", 0);
  // transformers 5 writes RoPE under rope_parameters ({"rope_theta", "rope_type", and the scaling keys});
  // earlier versions write rope_theta and rope_scaling at the top level. Both are read; they must agree.
  m.rope.base = r.number_or("rope_theta", 10000.0);
  if (r.has("rope_parameters")) {
    JsonReader rp = r.object("rope_parameters");
    if (rp.has("rope_theta")) {
      const double theta = rp.number("rope_theta");
      if (r.has("rope_theta") && theta != m.rope.base)
        rp.fail("rope_theta", "is " + std::to_string(theta) + " but the top-level rope_theta is " +
                                  std::to_string(m.rope.base) + "; they must agree");
      m.rope.base = theta;
    }
  }
  m.rope.partial_rotary_factor = r.number_or("partial_rotary_factor", 1.0);
  const char* scaling_key = r.has("rope_scaling") ? "rope_scaling" : r.has("rope_parameters") ? "rope_parameters" : nullptr;
  if (scaling_key) {
    JsonReader s = r.object(scaling_key);
    std::string kind = s.has("rope_type") ? s.string("rope_type") : s.string_or("type", "default");
    if (kind == "default") m.rope.scaling = RopeScaling::none;
    else if (kind == "linear") m.rope.scaling = RopeScaling::linear;
    else if (kind == "dynamic") m.rope.scaling = RopeScaling::ntk, m.rope.dynamic = true;
    else if (kind == "ntk") m.rope.scaling = RopeScaling::ntk;
    else if (kind == "yarn") m.rope.scaling = RopeScaling::yarn;
    else if (kind == "llama3") m.rope.scaling = RopeScaling::llama3;
    else s.fail("rope_type", "unsupported RoPE scaling '" + kind + "'; valid: default, linear, dynamic, yarn, llama3");
    if (m.rope.scaling != RopeScaling::none) {
      m.rope.factor = s.number("factor");
      m.rope.original_max_positions = s.integer_or("original_max_position_embeddings", m.max_position);
      m.rope.low_freq_factor = s.number_or("low_freq_factor", 1.0);
      m.rope.high_freq_factor = s.number_or("high_freq_factor", 4.0);
      m.rope.beta_fast = s.number_or("beta_fast", 32.0);
      m.rope.beta_slow = s.number_or("beta_slow", 1.0);
    }
  }
  m.layer_position.assign(static_cast<size_t>(m.layers), PositionKind::rope);
  // SmolLM3: no_rope_layers[i] == 0 marks layer i as NoPE; else every no_rope_layer_interval-th.
  if (r.has("no_rope_layers")) {
    const json& v = r.raw("no_rope_layers");
    if (!v.is_array() || static_cast<int64_t>(v.size()) != m.layers)
      r.fail("no_rope_layers", "expected an array with one 0/1 entry per layer (" + std::to_string(m.layers) + ")");
    for (size_t i = 0; i < v.size(); ++i)
      if (!v[i].is_number_integer()) r.fail("no_rope_layers", "entries must be 0 or 1");
      else if (v[i].get<int>() == 0) m.layer_position[i] = PositionKind::nope;
  } else if (r.has("no_rope_layer_interval")) {
    int64_t every = r.integer_in("no_rope_layer_interval", 1, 10000);
    for (int64_t i = 0; i < m.layers; ++i)
      if ((i + 1) % every == 0) m.layer_position[static_cast<size_t>(i)] = PositionKind::nope;
  }
  validate_model(m, where);
  return m;
}

json model_to_hf_config(const ModelSpec& m) {
  json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["_name_or_path"] = m.name;
  j["num_hidden_layers"] = m.layers;
  j["hidden_size"] = m.hidden;
  j["num_attention_heads"] = m.heads;
  j["num_key_value_heads"] = m.kv_heads;
  j["head_dim"] = m.head_dim;
  j["intermediate_size"] = m.ffn;
  j["vocab_size"] = m.vocab;
  j["tie_word_embeddings"] = m.tied_embeddings;
  j["attention_bias"] = m.qkv_bias;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = 1e-5;
  j["max_position_embeddings"] = m.max_position;
  j["rope_theta"] = m.rope.base;
  if (m.rope.partial_rotary_factor != 1.0) j["partial_rotary_factor"] = m.rope.partial_rotary_factor;
  if (m.rope.scaling != RopeScaling::none) {
    json s;
    switch (m.rope.scaling) {
      case RopeScaling::linear: s["rope_type"] = "linear"; break;
      case RopeScaling::ntk: s["rope_type"] = "dynamic"; break;
      case RopeScaling::yarn: s["rope_type"] = "yarn"; break;
      default: s["rope_type"] = "llama3"; break;
    }
    s["factor"] = m.rope.factor;
    s["original_max_position_embeddings"] = m.rope.original_max_positions;
    s["low_freq_factor"] = m.rope.low_freq_factor;
    s["high_freq_factor"] = m.rope.high_freq_factor;
    s["beta_fast"] = m.rope.beta_fast;
    s["beta_slow"] = m.rope.beta_slow;
    j["rope_scaling"] = s;
  }
  bool any_nope = false;
  json no_rope = json::array();
  for (auto k : m.layer_position) {
    no_rope.push_back(k == PositionKind::nope ? 0 : 1);
    any_nope |= k == PositionKind::nope;
  }
  if (any_nope) j["no_rope_layers"] = no_rope;  // SmolLM3's convention: 0 marks a NoPE layer
  j["torch_dtype"] = "float32";
  return j;
}

}  // namespace ctx
