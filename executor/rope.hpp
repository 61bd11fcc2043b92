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

// The RoPE a run of `seq` tokens executes for model `m`. Only Hugging Face's dynamic NTK
// (rope.dynamic) depends on it: there the base becomes base * (factor * L / M - (factor - 1))^(d/(d-2))
// with L the current length (the largest position + 1) and M = max_position_embeddings, and stays
// unscaled while L <= M. Without document masking L is `seq` in every step: the static NTK form with
// that factor, or no scaling. Under document masking L changes from batch to batch, which ctxrun does
// not execute: InputError naming the difference.
RopeSpec rope_for_sequence(const ModelSpec& m, int64_t seq, bool doc_mask);

}  // namespace ctx::exec
