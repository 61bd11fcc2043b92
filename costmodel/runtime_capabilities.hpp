// What a training stack can run (issue 21): the plan values a runtime profile allows, each
// statement with the stack version it holds for and its source. The search commands propose only
// plans their runtime can run; `predict` refuses the others naming the missing capability.
//
// In a runtime profile (profiles/runtimes/*.json), beside "constants":
//   "capabilities": {
//     "stack":     {"value": "<stack and version>", "source": "..."},
//     "tp":        {"value": "any" | <largest tp>, "source": "..."},
//     "sp":        {"value": [true, false]},          Megatron sequence parallel with tp > 1: on, off
//     "pp":        {"value": "any" | <largest pp>},
//     "vpp":       {"value": true | false},           interleaved pipeline schedules (vpp > 1)
//     "cp_comm":   {"value": ["p2p", "allgather", "a2a", "a2a+p2p"]},   [] = no context parallelism
//     "cp_layout": {"value": ["contiguous", "headtail", "headtail-doc"]},
//     "cp_varlen": {"value": ["native", "cycle", "split"]},   packed documents under CP; [] = none
//     "zero":      {"value": [0, 1, 2, 3]},
//     "zero_shard": {"value": [1, 2, 3] | true | false},  HSDP (plan key zero_shard) with these ZeRO
//                                                    stages (true = all); optional, absent = false (a stack
//                                                    that states capabilities and not this one shards over
//                                                    all dp*cp ranks)
//     "zero_with_pp": {"value": [0, 1, 2, 3]},       the ZeRO stages with pp > 1 (a stack whose sharding
//                                                    changes meaning under pipeline stages); optional,
//                                                    absent = the "zero" list holds with pp > 1 too
//     "recompute": {"value": ["none", "selective", "full"]},
//     "opt_offload", "param_offload", "ckpt_offload", "tiled_loss", "tiled_mlp": {"value": true | false}
//     "master":    {"value": ["fp32", "none"]},       optimizer precision (plan keys master, grads, moments);
//     "grads":     {"value": ["fp32", "bf16"]},       optional: absent = only the runtime's own (its
//     "moments":   {"value": ["fp32", "bf16", "8bit"]}  constants' master/grad/optimizer_bytes)
//     "tp_overlap": {"value": true | false}          TP collectives overlapped with the GEMMs (plan key
//                                                    tp_overlap); optional, absent = false
//     "compile":   {"value": ["off", "model", "model+loss"]}  torch.compile (plan key compile); optional:
//                                                    absent = eager only (off)
//   }
// Every other key is required; every key carries a source. A profile without "capabilities" (a user's own file)
// states nothing: every plan the cost model prices is allowed.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "costmodel/json_util.hpp"
#include "costmodel/plan.hpp"

namespace ctx {

struct RuntimeCapabilities {
  bool declared = false;           // false: no statement, anything the cost model prices runs
  std::string stack;               // the stack and version the statements hold for
  int64_t max_tp = 0, max_pp = 0;  // 0: any
  bool sp_on = true, sp_off = true;
  bool interleaved = true;         // vpp > 1
  std::vector<CpComm> cp_comm;
  std::vector<CpLayout> cp_layout;
  std::vector<CpVarlen::Kind> cp_varlen;
  std::vector<int> zero;
  std::vector<int> zero_shard;     // ZeRO stages with HSDP (shard over zero_shard ranks, replicate across); absent: none
  std::vector<int> zero_with_pp;     // ZeRO stages with pp > 1 (zero_with_pp_declared); else the zero list
  bool zero_with_pp_declared = false;
  std::vector<Recompute> recompute;
  bool opt_offload = true, param_offload = true, ckpt_offload = true, tiled_loss = true, tiled_mlp = true;
  bool tp_overlap = true;          // tp_overlap=1 (a declared profile: its optional "tp_overlap", absent = false)
  // optimizer precision a plan may set (Plan::master, grads, moments); the profile reader adds the
  // runtime's own value (runtime_state_dtypes), so an absent key allows only that
  std::vector<StateDtype> master, grads, moments;
  std::vector<Compile> compile{Compile::off};  // plan key compile; absent: eager only
  std::map<std::string, std::string> sources;  // key -> the source of its statement
};

// Reads the "capabilities" object (`r` is it); errors name the file, the key and the valid values.
RuntimeCapabilities capabilities_from_json(const JsonReader& r);

// One row per capability: {key, what the stack allows, source} (`ctxplan show runtime`).
std::vector<std::vector<std::string>> capability_rows(const RuntimeCapabilities& caps);

// The first capability the stack lacks for the plan (in the order below), none when it can run it.
// The rules live here once; missing_capability words the answer. Allocates nothing (the search asks
// it of every plan it enumerates).
enum class CapabilityGap : uint8_t {
  none, tp, sp_on, sp_off, pp, vpp, cp_comm, cp_layout, cp_varlen, zero_with_pp, zero, zero_shard, recompute,
  opt_offload, param_offload, ckpt_offload, tiled_loss, tiled_mlp, tp_overlap, compile, master, grads, moments
};
CapabilityGap capability_gap(const RuntimeCapabilities& caps, const Plan& p);
// Whether the stack can run the plan (missing_capability(...).empty(), without building the text).
inline bool runtime_runs(const RuntimeCapabilities& caps, const Plan& p) { return capability_gap(caps, p) == CapabilityGap::none; }

// "" when the stack can run the plan; else the first capability it lacks (capability_gap), as
// "<runtime> cannot run <key>=<value>: <what it runs> (<source>)".
std::string missing_capability(const RuntimeCapabilities& caps, const std::string& runtime, const Plan& p);

}  // namespace ctx
