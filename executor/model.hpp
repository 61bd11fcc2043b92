// The Llama-style decoder, forward and backward written out, over this rank's share of the plan:
// vocab-parallel embedding, per layer RMSNorm -> GQA attention (RoPE or NoPE per layer) -> RMSNorm
// -> SwiGLU MLP with column/row-parallel linears and Megatron SP, then the final norm and the
// vocab-parallel head fused with the cross-entropy (tiled when the plan says so).
// Recompute none / selective (attention core and SwiGLU product) / full (layer input is the
// checkpoint, optionally offloaded to host memory); tiled MLP saves only the MLP input.
#pragma once
#include <array>
#include <vector>

#include "costmodel/model_spec.hpp"
#include "executor/context_parallel.hpp"
#include "executor/params.hpp"
#include "executor/rope.hpp"

namespace ctx::exec {

struct LayerActs {
  Tensor x;                       // layer input (the checkpoint under full recompute; host memory when offloaded)
  Tensor x_device;                // offload: the checkpoint's device copy while a copy-stream transfer is in flight
  Backend::CopyEvent copy;        // that transfer
  Tensor rstd1, q, k, v, o, lse;  // attention side
  Tensor x2, rstd2, gate, up, act;  // MLP side (x2 = input of the MLP block)
};

// Codes for the non-finite flag (StepStat kStatNonFinite): the larger, the earlier the layer, so a
// max over ranks and micro-batches names the first layer that produced a NaN or an infinity.
inline float nonfinite_code(int64_t layer, int64_t layers) { return static_cast<float>(layers + 1 - layer); }
inline int64_t nonfinite_layer(float code, int64_t layers) { return layers + 1 - static_cast<int64_t>(code); }

class Model {
 public:
  Model(Backend& be, ParallelContext& pc, const ModelSpec& m, const Layout& l, ParamStore& ps);
  // Forward and backward of one micro-batch; gradients accumulate into the parameter store, scaled
  // by token_weight (1 / valid labels in the step's global batch). The loss sum and the non-finite
  // flag accumulate into stats (f32 [1, kStepStats]) on the device; mark_time slots time_slot0 ..
  // time_slot0 + 3 record the start and the ends of forward, loss and backward. On the step's last
  // micro-batch (`last`) every unit's gradient is reduced as soon as its backward is done.
  void forward_backward(const DeviceBatch& b, float token_weight, View stats, int time_slot0, bool last);
  // Fault injection for the NaN tests: poison this layer's output on the next forward.
  void inject_nan_at_layer(int layer) { inject_nan_layer_ = layer; }
  const ContextAttention& attention() const { return attn_; }

 private:
  enum class Keep { all, selective, checkpoint };
  Tensor layer_forward(int64_t i, const DeviceBatch& b, Tensor x, LayerActs& a, Keep keep);
  Tensor layer_backward(int64_t i, const DeviceBatch& b, LayerActs& a, Tensor dy);
  void fetch_checkpoint(int64_t i, LayerActs& a);
  void settle_offload(LayerActs& a, bool back);
  Tensor attention_block_forward(int64_t i, const DeviceBatch& b, const Tensor& x, LayerActs& a, Keep keep);
  Tensor mlp_block_forward(int64_t i, const Tensor& x2, LayerActs& a, Keep keep);
  void norm_backward_into(Tensor& dy, Tensor dnorm_partial, int64_t unit, int norm_param, Tensor& x, Tensor& rstd);
  void mlp_block_backward(int64_t i, LayerActs& a, Tensor& dy);                           // dy += block's dx
  void attention_block_backward(int64_t i, const DeviceBatch& b, LayerActs& a, Tensor& dy);
  int64_t mlp_chunks() const;
  void qkv_rope(int64_t i, const DeviceBatch& b, View q, View k, bool inverse);
  void loss_forward_backward(const DeviceBatch& b, const Tensor& xl, Tensor& dxl, float token_weight, View stats);

  // Sequence-parallel helpers (identity when SP is off or tp == 1)
  Tensor gather_seq(View x, Mem cat);        // [Tsp, h] -> [T, h] (SP only)
  Tensor reduce_partial(Tensor y, Mem cat);  // partial sums over TP: reduce-scatter (SP) or all-reduce
  Tensor linear(View x, View w, Mem cat);    // x [rows, in] W^T, W [out, in]

  Backend& be_;
  ParallelContext& pc_;
  ModelSpec m_;
  Layout l_;
  ParamStore& ps_;
  ContextAttention attn_;
  RopeTable rope_;
  Tensor inv_freq_;  // f32 [rot_dim/2], uploaded once
  int inject_nan_layer_ = -1;
};

}  // namespace ctx::exec
