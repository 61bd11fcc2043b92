// RoPE frequencies for the variants a model profile can name (costmodel/model_spec.hpp RopeSpec):
// plain/ABF (base), linear position interpolation, NTK-aware base scaling, YaRN, Llama-3.
// The rotation itself is a backend kernel; NoPE layers skip it.
#pragma once
#include <vector>

#include "costmodel/model_spec.hpp"

namespace ctx::exec {

struct RopeTable {
  std::vector<float> inv_freq;  // rot_dim/2 entries
  int64_t rot_dim = 0;          // rotated dimensions of each head (partial rotary)
  float attn_scale = 1.0f;      // YaRN's attention temperature, applied to q and k
};

RopeTable make_rope_table(const RopeSpec& r, int64_t head_dim);

}  // namespace ctx::exec
