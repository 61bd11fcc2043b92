#include "costmodel/model_spec.hpp"

#include "costmodel/errors.hpp"

namespace ctx {

int64_t q_dim(const ModelSpec& m) { return m.heads * m.head_dim; }
int64_t kv_dim(const ModelSpec& m) { return m.kv_heads * m.head_dim; }

int64_t attention_params_per_layer(const ModelSpec& m) {
  // Wq [hidden, q_dim], Wk and Wv [hidden, kv_dim], Wo [q_dim, hidden]
  int64_t w = m.hidden * q_dim(m) + 2 * m.hidden * kv_dim(m) + q_dim(m) * m.hidden;
  if (m.qkv_bias) w += q_dim(m) + 2 * kv_dim(m);   // biases on q, k, v (Qwen2, GLM-4)
  if (m.qk_norm) w += 2 * m.head_dim;                // per-head RMSNorm weights on q and k (Qwen3)
  return w;
}

int64_t mlp_params_per_layer(const ModelSpec& m) {
  // SwiGLU: gate and up [hidden, ffn], down [ffn, hidden]; GELU MLP: up and down only.
  return (m.activation == ActivationKind::swiglu ? 3 : 2) * m.hidden * m.ffn;
}

int64_t norm_params_per_layer(const ModelSpec& m) {
  // two norms per layer (pre-attention, pre-MLP); weight only (MPT's LayerNorm has no bias)
  return 2 * m.hidden;
}

int64_t params_per_layer(const ModelSpec& m) {
  return attention_params_per_layer(m) + mlp_params_per_layer(m) + norm_params_per_layer(m);
}

int64_t embedding_params(const ModelSpec& m) { return m.vocab * m.hidden; }
int64_t head_params(const ModelSpec& m) { return m.tied_embeddings ? 0 : m.vocab * m.hidden; }

int64_t total_params(const ModelSpec& m) {
  return m.layers * params_per_layer(m) + embedding_params(m) + head_params(m) + m.hidden /* final norm */;
}

int64_t nonembedding_params(const ModelSpec& m) {
  return total_params(m) - embedding_params(m) - head_params(m);
}

int64_t kv_bytes_per_token_per_layer(const ModelSpec& m, int64_t bytes_per_element) {
  return 2 * kv_dim(m) * bytes_per_element;  // K and V
}

double dense_train_flops_per_token(const ModelSpec& m) {
  // 2 FLOPs per multiply-add in forward, 4 in backward (dgrad + wgrad) over every matmul weight,
  // the output head included (it is a matmul even when tied); the embedding lookup is not.
  double matmul_params = static_cast<double>(m.layers) *
                             (attention_params_per_layer(m) + mlp_params_per_layer(m)) +
                         static_cast<double>(m.vocab) * m.hidden;
  return 6.0 * matmul_params;
}

double causal_attention_train_flops_per_token(const ModelSpec& m, int64_t seq) {
  // QK^T and PV: 2 matmuls x 2 FLOPs x q_dim per attended key; a causal token attends to
  // (seq+1)/2 keys on average; backward is 2x forward (FlashAttention's accounting).
  double fwd = 4.0 * static_cast<double>(q_dim(m)) * (static_cast<double>(seq) + 1.0) / 2.0;
  return 3.0 * fwd * static_cast<double>(m.layers);
}

int64_t count_layers(const ModelSpec& m, PositionKind kind) {
  int64_t n = 0;
  for (auto k : m.layer_position) n += (k == kind);
  return n;
}

const char* to_string(NormKind k) { return k == NormKind::rmsnorm ? "rmsnorm" : "layernorm"; }
const char* to_string(ActivationKind k) { return k == ActivationKind::swiglu ? "swiglu" : "gelu"; }
const char* to_string(PositionKind k) {
  switch (k) {
    case PositionKind::rope: return "rope";
    case PositionKind::nope: return "nope";
    case PositionKind::alibi: return "alibi";
  }
  return "?";
}
const char* to_string(RopeScaling k) {
  switch (k) {
    case RopeScaling::none: return "none";
    case RopeScaling::linear: return "linear";
    case RopeScaling::ntk: return "ntk";
    case RopeScaling::yarn: return "yarn";
    case RopeScaling::llama3: return "llama3";
  }
  return "?";
}

void validate_model(const ModelSpec& m, const std::string& where) {
  auto positive = [&](const char* field, int64_t v, int64_t hi) {
    if (v <= 0 || v > hi)
      throw InputError(where, field,
                       "must be a positive integer no larger than " + std::to_string(hi) + ", got " +
                           std::to_string(v));
  };
  positive("layers", m.layers, 10000);
  positive("hidden", m.hidden, 1 << 20);
  positive("heads", m.heads, 1 << 14);
  positive("kv_heads", m.kv_heads, 1 << 14);
  positive("head_dim", m.head_dim, 1 << 12);
  positive("ffn", m.ffn, 1 << 22);
  positive("vocab", m.vocab, 1 << 24);
  if (m.heads % m.kv_heads != 0)
    throw InputError(where, "kv_heads",
                     "query heads (" + std::to_string(m.heads) + ") must be a multiple of kv_heads (" +
                         std::to_string(m.kv_heads) + ")");
  if (static_cast<int64_t>(m.layer_position.size()) != m.layers)
    throw InputError(where, "positional", "needs one entry per layer");
  if (m.rope.base <= 0) throw InputError(where, "rope.base", "must be positive");
  if (m.rope.factor < 1.0) throw InputError(where, "rope.scaling.factor", "must be >= 1");
  if (m.rope.partial_rotary_factor <= 0 || m.rope.partial_rotary_factor > 1)
    throw InputError(where, "rope.partial_rotary_factor", "must be in (0, 1]");
}

}  // namespace ctx
