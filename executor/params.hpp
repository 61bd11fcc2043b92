// The model's parameters as units (embedding, each layer, final norm + head), each one flat buffer
// sharded over the ZeRO group (dp x cp) after the TP split. The unit is what ZeRO-3 gathers before
// use and releases after, and what ZeRO-2/3 reduce-scatter when its backward is done.
// Names and full shapes are Hugging Face Llama's (`model.layers.3.self_attn.q_proj.weight`).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "costmodel/model_spec.hpp"
#include "executor/backend.hpp"
#include "executor/parallel_context.hpp"

namespace ctx::exec {

enum class TpSplit { replicated, rows, cols, kv_rows };

struct ParamInfo {
  std::string name;
  int64_t rows = 0, cols = 0;            // this rank's shape (HF layout [out, in])
  int64_t full_rows = 0, full_cols = 0;  // the model's shape
  int64_t offset = 0;                    // in the unit's flat buffer
  TpSplit split = TpSplit::replicated;
  bool decay = true;                     // AdamW weight decay (not on norms)
  bool counted_here = true;              // this rank's copy counts in the gradient norm (TP replicas once)
  bool grad_partial_over_tp = false;     // its gradient is a partial sum over TP (norms under SP)
  int64_t numel() const { return rows * cols; }
};

struct ParamUnit {
  std::string name;
  std::vector<ParamInfo> params;
  int64_t numel = 0, padded = 0, shard = 0, shard_offset = 0;
  Tensor w;        // full compute weights, plan precision (ZeRO-3: only while gathered)
  Tensor w_shard;  // ZeRO-3: this rank's shard of the weights, plan precision
  Tensor g;        // full fp32 gradients (ZeRO-2/3: only during the unit's backward)
  Tensor g_shard;  // ZeRO-2/3: this rank's accumulated fp32 gradient shard
  Tensor master, m, v;  // fp32 master weights (none with master=none) and Adam moments (fp32, or bf16 with moments=bf16) of this rank's shard
  int find(const std::string& param_name) const;
};

struct OptimizerConfig {
  float lr = 3e-3f, min_lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  float clip = 1.0f;     // max global gradient norm (0 = off)
  int64_t warmup = 10, total_steps = 100;
};
float learning_rate(const OptimizerConfig& c, int64_t step);  // step counts from 1

class ParamStore {
 public:
  ParamStore(Backend& be, ParallelContext& pc, const ModelSpec& m, const Layout& l, uint64_t seed);
  std::vector<ParamUnit> units;  // [0] embedding, [1..L] layers, [L+1] final norm (+ head when untied)
  int64_t layer_unit(int64_t layer) const { return layer + 1; }
  int64_t final_unit() const { return static_cast<int64_t>(units.size()) - 1; }

  // Weights of a unit: ZeRO-3 gathers them into a transient buffer (comm_buffers) until release.
  void acquire_weights(int64_t u);
  void release_weights(int64_t u);
  View weight(int64_t u, int p) const;  // [rows, cols] of this rank's shape
  // Gradient buffer of a unit (f32; ZeRO-2/3: transient, zeroed); finish_grads reduces it into the shard.
  View grad(int64_t u, int p) const;
  void acquire_grads(int64_t u);
  // The unit's backward is done: ZeRO-2/3 reduce-scatter its gradient into the shard (every
  // micro-batch); ZeRO-0/1 all-reduce it over dp x cp on the step's last micro-batch (`last`),
  // behind the rest of the backward. TP fix-ups (partial sums of SP norms, shared KV heads) first.
  void finish_grads(int64_t u, bool last);
  void zero_grads();
  // stats[kStatGradNorm2] = the global gradient norm squared, before clipping (on the device;
  // collective over the world).
  void grad_norm2(View stats);
  // AdamW on this rank's shards (clipped, or skipped on a non-finite step, on the device from
  // stats), then the compute weights are refreshed (all-gather for ZeRO-1/2).
  void optimizer_step(const OptimizerConfig& c, int64_t step, View stats);

  // Full Hugging Face tensors (collective, blocking downloads; every rank gets them).
  // kind: weights | grads | master | m | v
  std::map<std::string, std::vector<float>> gather_full(const std::string& kind);
  // Sets master weights (and compute weights) or Adam moments from full tensors; kind: master | m | v.
  void load_full(const std::string& kind, const std::map<std::string, std::vector<float>>& full,
                 const std::string& where);
  std::vector<std::pair<std::string, std::vector<int64_t>>> full_shapes() const;

  // This rank's own fp32 optimizer state of unit u, exactly as held (u.shard floats, ZeRO padding
  // included; blocking download / upload, no communication); kind: master | m | v. Sharded
  // checkpoints save and restore these bit for bit; after uploading master, call refresh_weights.
  std::vector<float> download_shard(int64_t u, const std::string& kind);
  void upload_shard(int64_t u, const std::string& kind, const std::vector<float>& data);
  // Collective over the ZeRO group: the compute weights from the master shards, as after an
  // optimizer step (ZeRO-3: the weight shard; ZeRO-1/2: all-gathered).
  void refresh_weights();
  int zero_stage() const { return zero_; }
  int64_t shard_degree() const { return shard_degree_; }

 private:
  void tp_fixups(ParamUnit& u, const Tensor& g);
  // What AdamW steps for this rank's shard: the master copy, or with master=none the compute weights' shard.
  View master_shard(ParamUnit& u);
  View shard_grad(ParamUnit& u);
  // A host float range of a unit's flat layout onto a device tensor of the given dtype, and back.
  Tensor upload_flat(const float* src, int64_t n, DType dt, Mem cat);
  std::vector<float> download(View v);
  Backend& be_;
  ParallelContext& pc_;
  Layout l_;
  int zero_;
  int64_t shard_degree_;
};

}  // namespace ctx::exec
