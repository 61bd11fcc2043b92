// A decoder-only transformer as the cost model and the executor see it.
// Loaded from profiles/models/*.json or from a Hugging Face config.json (hf_config.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ctx {

enum class NormKind { rmsnorm, layernorm };
enum class ActivationKind { swiglu, gelu };
enum class PositionKind { rope, nope, alibi };
enum class RopeScaling { none, linear, ntk, yarn, llama3 };

struct RopeSpec {
  double base = 10000.0;                 // theta; ABF raises it (Llama-3: 500000)
  RopeScaling scaling = RopeScaling::none;
  double factor = 1.0;                   // PI / NTK / YaRN / llama3 scale factor
  int64_t original_max_positions = 0;    // context the base model was trained at
  double low_freq_factor = 1.0;          // llama3 scaling
  double high_freq_factor = 4.0;         // llama3 scaling
  double beta_fast = 32.0;               // YaRN
  double beta_slow = 1.0;                // YaRN
  double partial_rotary_factor = 1.0;    // fraction of head_dim rotated (GLM-4: 0.5)
  // Hugging Face rope_type "dynamic" (dynamic NTK): the base is rescaled from the current length,
  // and only once it exceeds max_position_embeddings (executor/rope.hpp rope_for_sequence)
  bool dynamic = false;
};

struct ModelSpec {
  std::string name;
  std::string source;           // where the numbers come from (HF config, paper)
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;            // query heads
  int64_t kv_heads = 0;         // key/value heads (GQA/MQA when < heads)
  int64_t head_dim = 0;         // heads * head_dim may differ from hidden (Qwen3)
  int64_t ffn = 0;              // MLP intermediate size
  int64_t vocab = 0;
  bool tied_embeddings = false;
  bool qkv_bias = false;
  bool qk_norm = false;         // per-head RMSNorm on q and k (Qwen3)
  NormKind norm = NormKind::rmsnorm;
  ActivationKind activation = ActivationKind::swiglu;
  RopeSpec rope;
  std::vector<PositionKind> layer_position;  // one entry per layer
  int64_t max_position = 0;     // advertised context length (informational)
};

// ---- derived quantities (free functions; all counts exact, no rounding) -------------------
int64_t q_dim(const ModelSpec& m);                    // heads * head_dim
int64_t kv_dim(const ModelSpec& m);                   // kv_heads * head_dim
int64_t attention_params_per_layer(const ModelSpec& m);
int64_t mlp_params_per_layer(const ModelSpec& m);
int64_t norm_params_per_layer(const ModelSpec& m);
int64_t params_per_layer(const ModelSpec& m);
int64_t embedding_params(const ModelSpec& m);         // input embedding
int64_t head_params(const ModelSpec& m);              // output projection (0 when tied)
int64_t total_params(const ModelSpec& m);
int64_t nonembedding_params(const ModelSpec& m);      // total minus input embedding and head
// KV bytes one token adds to one layer's cache: K and V, kv_heads * head_dim each.
int64_t kv_bytes_per_token_per_layer(const ModelSpec& m, int64_t bytes_per_element);
// Training FLOPs per token, dense part: 6 * (matmul parameters), forward + backward.
double dense_train_flops_per_token(const ModelSpec& m);
// Training FLOPs per token for attention scores and values at sequence length `seq`,
// causal mask: forward 4 * q_dim * (seq+1)/2 per token per layer, backward twice forward.
double causal_attention_train_flops_per_token(const ModelSpec& m, int64_t seq);
int64_t count_layers(const ModelSpec& m, PositionKind kind);

const char* to_string(NormKind k);
const char* to_string(ActivationKind k);
const char* to_string(PositionKind k);
const char* to_string(RopeScaling k);

// Checks the spec is self-consistent; throws InputError naming `where` and the field.
void validate_model(const ModelSpec& m, const std::string& where);

}  // namespace ctx
