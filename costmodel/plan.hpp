// A parallel plan: how one training step of one model is laid out over the GPUs.
// Written on the command line as `key=value,...` (parse_plan) or as plan.json (plan_to_json).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "costmodel/json_util.hpp"

namespace ctx {

// Context parallelism is two axes and a strategy (docs/CONTEXT_PARALLEL.md):
//   cp_comm    how K,V travel: p2p (ring), allgather (all-gather K,V, reduce-scatter dK,dV),
//              a2a (Ulysses all-to-all over heads), a2a+p2p (Ulysses inside, ring outside = USP)
//   cp_layout  which tokens a rank holds: contiguous (chunk c of cp), headtail (chunks c and
//              2cp-1-c of 2cp), headtail-doc (every document cut into 2cp chunks, placed head-tail)
//   cp_varlen  how packed documents run under a ring: native (one varlen call per ring step),
//              cycle (the ring run once per document), split:<k> (k sub-packs, native in each)
// CpKind is the shorthand `cp_kind=` names: ring = p2p+contiguous, zigzag = p2p+headtail,
// allgather = allgather+headtail, ulysses = a2a (contiguous unless cp_layout says), usp = a2a+p2p+headtail.
enum class CpComm { p2p, allgather, a2a, a2a_p2p };
enum class CpLayout { contiguous, headtail, headtail_doc };
struct CpVarlen {
  enum class Kind { native, cycle, split } kind = Kind::native;
  int64_t split = 0;  // split:<k>: sub-packs (>= 2); 0 otherwise
  bool operator==(const CpVarlen& o) const { return kind == o.kind && split == o.split; }
};
enum class CpKind { ring, zigzag, allgather, ulysses, usp };
enum class Recompute { none, selective, full };
enum class MaskKind { causal, document, explicit_mask };
enum class Precision { fp32, bf16, fp8 };
// Optimizer and gradient precision (issue 21): the optimizer's copy of the weights (master=fp32|none),
// the gradient accumulation buffer (grads=fp32|bf16) and Adam's moments m and v (moments=fp32|bf16|8bit,
// 8bit = block-wise quantised with one fp32 scale per block). `runtime` (unset): the runtime profile's
// own; runtime_for_plan (runtime_profile.hpp) resolves them, the runtime's capabilities allow them.
enum class StateDtype { runtime, none, fp32, bf16, q8 };
enum class Dim { tp, cp, dp };
// torch.compile (issue 16): what the runtime compiles. off = eager; model = each TransformerBlock
// compiled, the loss eager (torchtitan 9dec370's apply_compile; its train.py leaves the loss's
// torch.compile commented out); model_loss = the blocks and the loss (torchtitan e7c0cae..000204a4
// training.compile: build_cross_entropy_loss compiles loss_fn too). A runtime lists the values it
// runs (capability "compile"); what the compiled code keeps is its profile's compiled_* constants.
enum class Compile { off, model, model_loss };

// Lengths of the documents packed into a sequence (intra-document masking).
struct DocLengths {
  enum class Kind { fixed, list, histogram } kind = Kind::fixed;
  std::vector<int64_t> tokens;   // fixed: one length; list: each length; histogram: bin upper edges
  std::vector<double> weights;   // histogram: each bin's fraction (sums to 1)
  bool token_share = false;      // histogram: weights are shares of tokens (doc:tokhist:), not of documents (doc:hist:)
};

struct Plan {
  int64_t dp = 0;                 // 0 = fill the GPUs the other degrees leave
  int64_t tp = 1;
  int sp = -1;                    // Megatron sequence parallel; -1 = on whenever tp > 1
  bool tp_overlap = false;        // TP all-gathers/reduce-scatters overlapped with the layer's GEMMs (Megatron
                                  // --tp-comm-overlap: Transformer Engine userbuffers; tp > 1 with sp only)
  int64_t cp = 1;
  int64_t pp = 1;                 // pipeline stages (outermost in the rank grid, as Megatron's tp-cp-ep-dp-pp)
  int64_t vpp = 1;                // model chunks per pipeline rank: 1 = 1F1B, >1 = interleaved 1F1B
  // Uneven pipeline splits (Megatron's rules, pipeline_stages.hpp pipeline_chunk_layers): the layers
  // on the first / last stage (--decoder-first/last-pipeline-num-layers; 0 = unset: the even split),
  // the rest split evenly over the other stages; or the embedding / the loss taking one layer's
  // place in an even split (--account-for-embedding/loss-in-pipeline-split). The two kinds exclude each other.
  int64_t pp_first = 0;
  int64_t pp_last = 0;
  bool pp_embed = false;
  bool pp_loss = false;
  CpComm cp_comm = CpComm::p2p;   // with cp_layout: the CP axes (default = cp_kind=zigzag)
  CpLayout cp_layout = CpLayout::headtail;
  CpVarlen cp_varlen;             // with mask=document
  int64_t ulysses = 0;            // Ulysses degree inside usp (0 = all of cp for ulysses, required for usp)
  int zero = 0;                   // 0..3, sharded over dp x cp (every rank with the same TP shard)
  int64_t zero_shard = 0;         // HSDP: ranks of the dp x cp grid that shard the model states (the rest replicate); 0 = all dp*cp
  int64_t mbs = 1;                // sequences per micro-batch
  int64_t ga = 1;                 // micro-batches per step (gradient accumulation)
  Recompute recompute = Recompute::none;
  bool ckpt_offload = false;      // full-recompute checkpoints kept in host memory
  bool opt_offload = false;       // fp32 master weights and Adam states in host memory
  bool param_offload = false;     // ZeRO-3 parameter shards in host memory
  int64_t tiled_loss = 0;         // tokens per logits/loss tile; 0 = untiled, -1 = auto (ALST's ~1 GiB fp32 tiles: loss_tile_tokens)
  int64_t tiled_mlp = 0;          // MLP chunks along the sequence; 0 or 1 = untiled, -1 = auto (ceil(tokens/hidden))
  MaskKind mask = MaskKind::causal;
  DocLengths docs;                // with mask=document
  bool sorted_packing = false;    // packing=sorted: balance attention work (sum of squared document lengths) over DP ranks
  bool pad = false;               // pad=1: a sequence the layout cannot split is padded up to its multiple (seq_granule) and the padding priced
  Precision precision = Precision::bf16;
  StateDtype master = StateDtype::runtime;   // master=fp32|none
  StateDtype grads = StateDtype::runtime;    // grads=fp32|bf16
  StateDtype moments = StateDtype::runtime;  // moments=fp32|bf16|8bit
  Compile compile = Compile::off;            // compile=off|model|model+loss
  Dim order[3] = {Dim::tp, Dim::cp, Dim::dp};  // innermost first: consecutive ranks differ in order[0]; pp outside all three
};

// Degrees after defaults are resolved against a world size.
bool sp_enabled(const Plan& p);
int64_t ulysses_degree(const Plan& p);   // 1 for ring kinds, cp for ulysses, `ulysses` for usp
int64_t ring_degree(const Plan& p);      // cp / ulysses_degree
int64_t zero_shard_degree(const Plan& p);      // ranks the model states shard over: zero_shard, or dp * cp when 0
int64_t zero_replicate_degree(const Plan& p);  // HSDP replicas of each shard: dp * cp / zero_shard_degree
int64_t plan_world(const Plan& p);         // dp * tp * cp * pp (dp 0 counted as 1)

// The shorthand nearest the plan's axes (p2p: ring when contiguous, else zigzag); cp_kind_exact:
// whether `cp_kind=<that>` alone names the axes. set_cp_kind: the axes a shorthand names.
CpKind cp_kind_of(const Plan& p);
bool cp_kind_exact(const Plan& p);
void set_cp_kind(Plan& p, CpKind k);
bool cp_ring_exchange(const Plan& p);  // K,V pass around a ring (p2p or a2a+p2p)

const char* to_string(CpKind k);
const char* to_string(CpComm c);
const char* to_string(CpLayout l);
std::string to_string(const CpVarlen& v);
const char* to_string(Recompute r);
const char* to_string(Dim d);
const char* to_string(Precision x);
const char* to_string(StateDtype x);  // runtime, none, fp32, bf16, 8bit
const char* to_string(Compile x);     // off, model, model+loss
std::string mask_to_string(const Plan& p);
std::string order_to_string(const Plan& p);

// The plan keys, their meaning and defaults, for --help and error messages.
const std::vector<std::pair<std::string, std::string>>& plan_key_help();

// A number with an optional binary suffix: 128k = 131072, 1m = 1048576, 1.5m = 1572864.
// Returns false unless the whole text is a finite number (suffix included).
bool parse_scaled_number(const std::string& text, double* out);

// Parses `dp=8,tp=2,cp_kind=zigzag,...`; `where` names the source in errors ("--plan").
Plan parse_plan(const std::string& text, const std::string& where = "--plan");
// The canonical `key=value` form (only keys that differ from the defaults, plus dp/tp/cp).
std::string plan_to_string(const Plan& p);

json plan_to_json(const Plan& p);
Plan plan_from_json(const json& j, const std::string& where);

}  // namespace ctx
