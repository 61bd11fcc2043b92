#include "executor/rope.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "costmodel/errors.hpp"

namespace ctx::exec {

RopeTable make_rope_table(const RopeSpec& r, int64_t head_dim) {
  RopeTable t;
  int64_t rot = static_cast<int64_t>(std::llround(static_cast<double>(head_dim) * r.partial_rotary_factor));
  rot -= rot % 2;
  t.rot_dim = rot;
  const int64_t half = rot / 2;
  const double pi = 3.14159265358979323846;
  double base = r.base;
  if (r.scaling == RopeScaling::ntk && r.factor > 1.0)
    base *= std::pow(r.factor, static_cast<double>(rot) / static_cast<double>(rot - 2));  // NTK-aware base change
  std::vector<double> inv(half);
  for (int64_t i = 0; i < half; ++i) inv[i] = 1.0 / std::pow(base, 2.0 * static_cast<double>(i) / static_cast<double>(rot));
  switch (r.scaling) {
    case RopeScaling::none:
    case RopeScaling::ntk:
      break;
    case RopeScaling::linear:  // position interpolation: positions / factor
      for (auto& f : inv) f /= r.factor;
      break;
    case RopeScaling::yarn: {
      // YaRN (Peng et al. 2023): interpolate low frequencies, keep high ones, linear ramp between
      // the dimensions that rotate beta_fast and beta_slow times over the original context.
      const double orig = static_cast<double>(r.original_max_positions > 0 ? r.original_max_positions : 4096);
      auto corr_dim = [&](double rotations) {
        return static_cast<double>(rot) * std::log(orig / (rotations * 2.0 * pi)) / (2.0 * std::log(r.base));
      };
      double lo = std::max(0.0, std::floor(corr_dim(r.beta_fast)));
      double hi = std::min(static_cast<double>(rot - 1), std::ceil(corr_dim(r.beta_slow)));
      if (hi == lo) hi += 0.001;
      for (int64_t i = 0; i < half; ++i) {
        double ramp = std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0);
        double extrap = 1.0 - ramp;  // weight of the original (extrapolated) frequency
        inv[i] = inv[i] / r.factor * (1.0 - extrap) + inv[i] * extrap;
      }
      if (r.factor > 1.0) t.attn_scale = static_cast<float>(0.1 * std::log(r.factor) + 1.0);
      break;
    }
    case RopeScaling::llama3: {
      const double orig = static_cast<double>(r.original_max_positions > 0 ? r.original_max_positions : 8192);
      const double low_wl = orig / r.low_freq_factor, high_wl = orig / r.high_freq_factor;
      for (auto& f : inv) {
        double wl = 2.0 * pi / f;
        if (wl < high_wl) continue;
        if (wl > low_wl) { f /= r.factor; continue; }
        double smooth = (orig / wl - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        f = (1.0 - smooth) * f / r.factor + smooth * f;
      }
      break;
    }
  }
  t.inv_freq.assign(inv.begin(), inv.end());
  return t;
}

RopeSpec rope_for_sequence(const ModelSpec& m, int64_t seq, bool doc_mask) {
  RopeSpec r = m.rope;
  if (!r.dynamic) return r;
  r.dynamic = false;
  const std::string where = m.source.empty() ? m.name : m.source;
  if (m.max_position <= 0)
    throw InputError(where, "max_position_embeddings",
                     "rope_type 'dynamic' rescales RoPE past max_position_embeddings, which the config does not give");
  if (seq <= m.max_position) {  // the current length never passes the original maximum: plain RoPE
    r.scaling = RopeScaling::none;
    r.factor = 1.0;
    return r;
  }
  if (doc_mask)
    throw InputError(where, "rope_scaling.rope_type",
                     "'dynamic' (Hugging Face's dynamic NTK) rescales the RoPE base from the longest position of each "
                     "batch once it passes max_position_embeddings (" + std::to_string(m.max_position) +
                         "); under document masking that length changes from batch to batch, which ctxrun does not "
                         "execute (it would apply one static NTK base): train at --seq <= " + std::to_string(m.max_position) +
                         ", without document masking, or with rope_type 'linear' or 'yarn'");
  // positions 0..seq-1 in every step: HF's base change is the static NTK one with this factor
  r.factor = r.factor * static_cast<double>(seq) / static_cast<double>(m.max_position) - (r.factor - 1.0);
  return r;
}

}  // namespace ctx::exec
