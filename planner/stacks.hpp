// The training stacks users already run, as ctxplan jobs: Megatron-LM/NeMo arguments, a torchtitan job
// TOML, a DeepSpeed config JSON, an ArcticTraining (ALST) YAML. `import_stack` reads a stack's
// configuration into a Plan (plus model, sequence and GPU count where the file states them);
// `export_stack` writes the configuration and launch line that run a Plan on that stack. Each
// stack's mapping table, its source and the stack version it follows are in docs/STACKS.md and in
// the stack_*.cpp file that implements it.
//
// Nothing is dropped silently: an option that is read but not modelled becomes a warning, an option
// that changes the answer and cannot be modelled is an InputError (exit 2), and what a stack cannot
// express on export is listed (and checked by importing the export back).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "costmodel/model_spec.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/profile_store.hpp"

namespace ctx {

enum class Stack { megatron, torchtitan, deepspeed, arctic };
const char* to_string(Stack s);
// "megatron" | "nemo" | "torchtitan" | "deepspeed" | "arctic" (alst); `where` names the source in errors.
Stack parse_stack(const std::string& name, const std::string& where);
// The runtime profile that states what the stack runs (its capabilities) and prices its jobs, as
// import writes it: megatron, torchtitan, hf-deepspeed (DeepSpeed and ArcticTraining).
const char* stack_runtime(Stack s);

// What a stack's configuration says about a ctxplan job.
struct StackJob {
  Plan plan;
  std::string model;                    // a profile name, an HF id that resolves, or empty (see model_spec)
  std::optional<ModelSpec> model_spec;  // a model shape no profile matches (Megatron flags): written beside the plan
  int64_t seq = 0;                      // 0: the file does not state it
  int64_t world = 0;                    // GPUs of the launch line or of --cluster; 0: not stated
  int64_t nodes = 0, gpus_per_node = 0; // from a launch line, 0: not stated
  std::string runtime;                  // the runtime profile closest to the stack
  std::vector<std::string> warnings;    // read but not modelled, or modelled approximately
  std::vector<std::string> ignored;     // read; no effect on memory or time (learning rate, paths, logging)
};

struct ImportOptions {
  int64_t world = 0;  // GPUs the job runs on (--cluster); 0: from the file's launch line, if any
  std::string model;  // --model: names the model instead of the file's model fields (which are still read)
};

// Reads `text` (the contents of `where`) as `stack`'s configuration. Throws InputError naming
// `where`, the option and what would be valid.
StackJob import_stack(Stack stack, const std::string& text, const std::string& where, const Profiles& profiles,
                      const ImportOptions& options = {});

// A resolved job to write in a stack's terms.
struct ExportJob {
  ModelSpec model;
  std::string model_arg;  // what the user named (profile, alias or config.json path)
  int64_t seq = 0;
  int64_t nodes = 1, gpus_per_node = 1;
  Plan plan;              // dp resolved (> 0)
};

struct StackExport {
  std::string text;                          // the file: args / TOML / JSON / YAML
  std::string launch;                        // the launch line (torchrun / srun / deepspeed / arctic_training)
  std::string default_file;                  // a file name for -o when none is given
  std::vector<std::string> cannot_express;   // plan features the stack lacks, and what was written instead
  std::vector<std::string> notes;            // features written as the stack's nearest equivalent (imports back equal)
  Plan exported;                             // the plan the written file imports back as
};

StackExport export_stack(Stack stack, const ExportJob& job, const Profiles& profiles);

// Plan equality as the plan file sees it (sp and ulysses resolved, dp as given).
bool same_plan(const Plan& a, const Plan& b);
// The plan keys whose values differ, "key: a -> b" each.
std::vector<std::string> plan_differences(const Plan& from, const Plan& to);

// ---- shared by the stack_*.cpp files --------------------------------------------------------
namespace stacks {
// A profile whose shape equals `m` (layers, hidden, heads, KV heads, head dim, FFN, norm,
// activation, tied embeddings; vocab when m.vocab > 0); empty when none.
std::string match_model_profile(const Profiles& profiles, const ModelSpec& m);
// A Hugging Face repository id (meta-llama/Llama-3.1-8B) for a profile, empty if not known.
std::string hf_repo_for(const std::string& profile_name);
// Resolves an HF id or path (org/name, name, config.json path) to a profile name or a path; throws
// InputError naming `where` and `field` when nothing matches.
std::string resolve_model_name(const Profiles& profiles, const std::string& id, const std::string& where,
                               const std::string& field);
// An integer written as 8_000, 3800000, 1e6, 5e8 (YAML/JSON configs); false if not a whole number.
bool parse_whole(const std::string& text, int64_t* out);
// ga from a global batch: global / (mbs * dp); throws unless it divides.
int64_t accumulation_from_global(int64_t global, int64_t mbs, int64_t dp, const std::string& where, const std::string& field);
// At most `max` characters of a value quoted in a message ("..." marks the cut).
std::string excerpt(const std::string& s, size_t max = 120);
// "a, b, c"
std::string join(const std::vector<std::string>& items, const std::string& sep = ", ");
}  // namespace stacks

StackJob import_megatron(const std::string& text, const std::string& where, const Profiles& profiles, const ImportOptions& o);
StackJob import_torchtitan(const std::string& text, const std::string& where, const Profiles& profiles, const ImportOptions& o);
StackJob import_deepspeed(const std::string& text, const std::string& where, const Profiles& profiles, const ImportOptions& o);
StackJob import_arctic(const std::string& text, const std::string& where, const Profiles& profiles, const ImportOptions& o);
StackExport export_megatron(const ExportJob& job, const Profiles& profiles);
StackExport export_torchtitan(const ExportJob& job, const Profiles& profiles);
StackExport export_deepspeed(const ExportJob& job, const Profiles& profiles);
StackExport export_arctic(const ExportJob& job, const Profiles& profiles);

}  // namespace ctx
