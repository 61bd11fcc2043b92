// What one pipeline stage holds: its layers (vpp chunks of layers/(pp*vpp) each), whether it holds
// the embedding (first stage) or the head and loss (last stage), its parameters, and how many
// micro-batches' activations its schedule keeps at once. pp = 1 is one stage holding everything.
#pragma once
#include <cstdint>

#include "costmodel/model_spec.hpp"
#include "costmodel/plan.hpp"

namespace ctx {

struct PipelineStage {
  int64_t stage = 0;
  int64_t layers = 0;            // on this stage, all chunks: L / pp
  int64_t chunk_layers = 0;      // one model chunk: L / (pp * vpp)
  bool first = true;             // holds the embedding (and runs the first chunk)
  bool last = true;              // holds the final norm, the head and the loss
  int64_t in_flight_chunks = 1;  // (chunk, micro-batch) forwards whose activations it holds at once
};

// Stage `stage` of plan `p` (pp, vpp and ga as checked by check_plan).
PipelineStage pipeline_stage(const ModelSpec& m, const Plan& p, int64_t stage);

// Parameters one TP rank of the stage holds (before ZeRO sharding), from one layer's parameters on
// a TP rank and the vocabulary rows per TP rank. The first stage holds the embedding [V/tp, h];
// the last the final norm and the head [V/tp, h]: Megatron keeps a copy of a tied embedding on the
// last stage as the head (LanguageModule.setup_embeddings_and_output_layer) and all-reduces their
// gradients. pp = 1: the model's own count (the head only when untied).
double pipeline_stage_params(const ModelSpec& m, const PipelineStage& s, double layer_params, double vocab_rows);

}  // namespace ctx
