// Per-rank device memory and per-node host memory of one training step, by category, with the
// peak taken over the step's timeline (forward layer by layer, loss, backward layer by layer,
// optimizer), not as a sum of per-category maxima.
#pragma once
#include <array>
#include <cstdint>

#include "costmodel/framework_memory.hpp"
#include "costmodel/hardware_spec.hpp"
#include "costmodel/model_spec.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/runtime_profile.hpp"

namespace ctx {

// Device categories. The executor's allocator tags every allocation with one of these.
enum class Mem : int {
  weights, grads, master_weights, optimizer, activations, checkpoints, workspace, comm_buffers, logits, mask,
  runtime, count
};
constexpr int kMemCategories = static_cast<int>(Mem::count);
const char* to_string(Mem m);

// Host categories, per node.
enum class HostMem : int { optimizer, master_weights, grads, weights, checkpoints, runtime, count };
constexpr int kHostCategories = static_cast<int>(HostMem::count);
const char* to_string(HostMem m);

struct MemorySnapshot {
  std::array<double, kMemCategories> bytes{};
  double total() const;
  double& operator[](Mem m) { return bytes[static_cast<int>(m)]; }
  double operator[](Mem m) const { return bytes[static_cast<int>(m)]; }
};

enum class Phase : int { forward, loss, backward, optimizer, count };
constexpr int kPhases = static_cast<int>(Phase::count);
const char* to_string(Phase p);

struct MemoryPrediction {
  MemorySnapshot peak;                         // the breakdown at the instant of the peak
  Phase peak_phase = Phase::forward;
  int64_t peak_layer = -1;                     // layer being run at the peak (-1: none)
  int64_t peak_stage = 0;                      // pipeline stage at the peak (0 without pp)
  std::array<MemorySnapshot, kPhases> phase_peak;  // each phase's own peak instant
  double device_capacity_bytes = 0;            // usable after the CUDA context
  std::array<double, kHostCategories> host_bytes_per_node{};
  double host_total_bytes_per_node = 0;
  double host_capacity_bytes_per_node = 0;
  int64_t ranks_per_node = 0;
  // the stack's own buffers term by term (framework_memory.hpp): the device terms are part of the
  // `runtime` category, the host terms (per rank, x ranks_per_node) of the host `runtime` category
  FrameworkMemory framework;
  bool fits_device = false;
  bool fits_host = false;
  // the largest [tokens, hidden] tensor a rank holds, in elements, and the most the runtime's kernels
  // index (tiled_loss_max_tensor_elements; 0: no limit): a plan beyond it does not run, whatever the memory
  double tensor_elements = 0;
  double max_tensor_elements = 0;
  bool fits_index = true;
  bool fits() const { return fits_device && fits_host && fits_index; }
  double headroom_bytes() const { return device_capacity_bytes - peak.total(); }
};

// The shapes one rank holds, derived from the plan (exposed for tests and the op cost model).
struct LocalShapes {
  double tokens;        // tokens per rank in the sequence-sharded regions: mbs*seq/cp
  double tokens_sp;     // tokens in norm/residual regions: tokens/tp under SP
  double attn_tokens;   // query/key tokens inside attention: tokens, or mbs*seq/ring under Ulysses
  double q_heads;       // query heads inside attention: heads/(tp*ulysses)
  double kv_heads;      // KV heads inside attention (at least 1: replicated beyond the KV-head count)
  double kv_heads_tp;   // KV heads per TP rank as the projections produce them (at least 1)
  double ffn;           // MLP width per rank: ffn/tp
  double vocab;         // vocabulary per rank: ceil(vocab/tp)
  double params;        // parameters this TP rank owns before ZeRO sharding
  double layer_params;  // one layer's parameters on this TP rank
  double zero_degree;   // dp*cp
};
LocalShapes local_shapes(const ModelSpec& m, const Plan& p, int64_t seq);

// Bytes of K and V one rank sends to its ring neighbour per ring step and layer: its local
// attention tokens x KV heads x head_dim, K and V, at `elem_bytes` each.
double ring_kv_bytes_per_step(const ModelSpec& m, const LocalShapes& s, double elem_bytes);
// How many times the KV bytes the runtime's context parallelism exchanges and holds are of the
// model's KV heads: q heads / KV heads where it expands K,V before its attention call
// (RuntimeProfile::cp_kv_query_heads), else 1.
double cp_kv_expansion(const RuntimeProfile& rt, const LocalShapes& s);

// The logits + loss working set at the loss, split by dtype (the memory model's logits term).
struct LossWorkingSet {
  double logits_bytes = 0;       // the head's output (a tile of it when tiled)
  double fp32_bytes = 0;         // fp32 copies of the logits (or of one tile) alive at once
  double hidden_grad_bytes = 0;  // gradient of the final hidden states [T, h] (accumulated tile by tile when tiled)
  double total() const { return logits_bytes + fp32_bytes + hidden_grad_bytes; }
};
// fp32 numbers per logits row besides the logits: row max, sum of exp and target logit, log-sum-exp
// (the token weight is one scalar for the whole step)
constexpr double kLossRowStats = 4;
LossWorkingSet loss_working_set(const ModelSpec& m, const RuntimeProfile& rt, const Plan& p, const LocalShapes& s);

// Largest sequence (a multiple of the plan's granule, at most `hi`) at which the plan fits device
// and host memory; 0 if none does. Memory grows with the sequence, so this bisects.
int64_t max_trainable_seq(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt, const Plan& p, int64_t hi);

// MLP chunks a plan runs (tiled_mlp=auto: ceil(tokens per rank / hidden), ALST's TiledMLP rule).
double mlp_chunks(const ModelSpec& m, const Plan& p, const LocalShapes& s);
// Rows (tokens) of one logits+loss tile: all of them untiled; tiled_loss=N: N; tiled_loss=auto (on):
// ArcticTraining's default, ceil(T / ceil(T x V x 4 bytes / 1 GiB)) -- tiles of about 1 GiB of fp32
// logits (arctic_training/trainer/sft_trainer.py, SFTTrainer.loss: slice_size_in_gb = 1).
double loss_tile_tokens(const Plan& p, const LocalShapes& s);
// The same from the plan's tiled_loss, the rank's tokens and its vocabulary rows (the executor's loss).
double loss_tile_rows(int64_t tiled_loss, double tokens, double vocab);

// One pipeline stage's rank (pipeline_stages.hpp): its layers and parameters, the saved tensors of
// the micro-batches its schedule keeps in flight, the loss only on the last stage.
struct PipelineStage;
MemoryPrediction predict_stage_memory(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt, const Plan& p,
                                      int64_t seq, const PipelineStage& stage);

// The peak over the pipeline's stages (one stage without pp).
// Hot path: allocation-free, no exceptions (an fp32 plan on a bf16 profile copies the profile once,
// runtime_for_precision). The plan must have passed check_plan.
MemoryPrediction predict_memory(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt, const Plan& p,
                                int64_t seq);

}  // namespace ctx
