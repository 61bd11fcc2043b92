// One rank's place in a plan: its communicators (built from costmodel/process_groups.hpp, the same
// function the cost model uses), the shapes it holds, and where its tokens sit in the sequence.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "costmodel/cp_placement.hpp"  // cp_token_indices: where a CP rank's tokens sit
#include "costmodel/model_spec.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/process_groups.hpp"
#include "executor/backend.hpp"
#include "executor/comm.hpp"
#include "executor/schedule_trace.hpp"

namespace ctx::exec {

struct Layout {
  int64_t layers = 0, hidden = 0, head_dim = 0, vocab = 0;
  int64_t q_heads = 0;       // query heads on this TP rank
  int64_t kv_heads = 0;      // KV heads on this TP rank (1 when TP replicates them)
  int64_t kv_head0 = 0;      // index of the first of them in the model
  int64_t kv_replicas = 1;   // TP ranks sharing one KV head (tp / kv_heads when tp > kv_heads)
  int64_t ffn = 0;           // MLP width on this TP rank
  int64_t vocab_rows = 0;    // rows of the vocab-parallel embedding/head (ceil(vocab/tp))
  int64_t vocab0 = 0;        // first vocabulary id of this shard
  int64_t vocab_valid = 0;   // real ids in this shard (the last one may be padded)
  int64_t seq = 0;           // tokens per sequence
  int64_t tokens = 0;        // tokens of one micro-batch on this rank (mbs * seq / cp)
  int64_t tokens_sp = 0;     // tokens in the norm/residual regions (tokens/tp under SP)
  int64_t ulysses = 1, ring = 1;
  int64_t attn_q_heads = 0, attn_kv_heads = 0;  // heads inside attention (after the Ulysses all-to-all)
  int64_t attn_tokens = 0;   // tokens inside attention (tokens * ulysses)
  bool sp = false;
  DType act = DType::bf16;   // weights, activations and their communication (plan precision)
};

struct ParallelContext {
  Plan plan;
  int64_t rank = 0, world = 1;
  RankCoord coord;
  std::unique_ptr<Comm> tp, cp, dp, ulysses, ring, zero, all;
  // ZeRO's shard group and the replicas of this rank's shard (HSDP, plan key zero_shard; without it
  // zero_shard spans the zero group and zero_replicate is this rank alone)
  std::unique_ptr<Comm> zero_shard, zero_replicate;
  Comm* world_comm = nullptr;  // == all: every rank
  ScheduleTrace trace;         // the tasks this rank issues, in the simulator's names (when enabled)
  int64_t zero_rank() const { return zero->rank(); }
};

// Collective: every rank of `w` calls it. The plan's dp must be resolved and dp*tp*cp == world.
// The communicators are the backend's own (Backend::make_comm: host-staged on CPU backends, NCCL
// on the CUDA backend).
ParallelContext make_parallel_context(CommWorld& w, Backend& be, const Plan& plan);
Layout make_layout(const ModelSpec& m, const Plan& p, int64_t tp_rank, int64_t seq);

// Executor-specific requirements beyond check_plan (e.g. SP needs tokens per rank divisible by tp);
// returns an empty string when runnable, else the reason.
std::string executor_plan_problem(const ModelSpec& m, const Plan& p, int64_t seq);

}  // namespace ctx::exec
