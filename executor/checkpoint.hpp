// Checkpoints are sharded: every rank writes what it holds, its fp32 master-weight shard and Adam
// moments of each parameter unit (<dir>/step-N/rank-RRRRR.safetensors, with the plan, the rank's
// coordinates and the units' geometry in the file's metadata), and rank 0 writes the index
// (trainer.json: step, model, plan, run info, the files). Nothing is gathered. A checkpoint is
// written into <dir>/step-N.tmp (each file fsynced), renamed to <dir>/step-N once every rank has
// finished, and then <dir>/latest is replaced atomically: a crash leaves the previous one intact.
// A checkpoint resumes only under the plan that wrote it (same world, tp, cp, dp, zero, Ulysses
// degree); resharding is not supported: export_hf writes a consolidated Hugging Face folder
// (config.json + model.safetensors), which any plan can start from (--init-from).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "costmodel/json_util.hpp"
#include "executor/safetensors.hpp"
#include "executor/trainer.hpp"

namespace ctx::exec {

// Collective, before the first step: creates `dir`, proves it writable (InputError naming it, on
// every rank, otherwise: a bad --ckpt-dir is found before training, not at the first save) and
// removes step-N.tmp / step-N.old folders left by saves that were killed.
void prepare_checkpoint_dir(Trainer& t, const std::string& dir);
// Collective: every rank writes its own shard file; rank 0 the index. Saving a step whose folder
// exists exchanges the two folders atomically: the checkpoint `latest` names is never missing. Returns the checkpoint's directory.
std::string save_checkpoint(Trainer& t, const std::string& dir, const json& run_info);
// Collective: every rank reads <dir>/latest (or `dir` itself when it holds trainer.json; a `latest`
// naming no complete checkpoint falls back to the newest complete step-N with a warning) and takes
// its own shard file back bit for bit. Throws InputError naming the file when the checkpoint
// belongs to another model or another plan, or a shard file is missing or damaged.
int64_t load_checkpoint(Trainer& t, const std::string& dir);
// Collective: gathers the fp32 master weights; rank 0 writes <dir>/config.json and
// <dir>/model.safetensors (Hugging Face Llama names), a valid --init-from source under any plan.
void export_hf(Trainer& t, const std::string& dir);
// Loads a Hugging Face checkpoint folder (config.json + *.safetensors) as the initial weights.
void load_hf_weights(Trainer& t, const std::string& dir);

}  // namespace ctx::exec
