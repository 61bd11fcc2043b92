// What one pipeline stage holds: its layers (vpp model chunks; pipeline_chunk_layers gives each
// chunk's layers, even or by Megatron's uneven rules), whether it holds the embedding (first stage)
// or the head and loss (last stage), its parameters, and how many micro-batches' activations its
// schedule keeps at once. pp = 1 is one stage holding everything.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "costmodel/model_spec.hpp"
#include "costmodel/plan.hpp"

namespace ctx {

struct PipelineStage {
  int64_t stage = 0;
  int64_t layers = 0;            // on this stage, all its chunks (L / pp when even)
  int64_t chunk_layers = 0;      // its largest model chunk (L / (pp * vpp) when even)
  int64_t first_layer = 0;       // the model's index of its first chunk's first layer
  bool first = true;             // holds the embedding (and runs the first chunk)
  bool last = true;              // holds the final norm, the head and the loss
  int64_t in_flight_chunks = 1;  // (chunk, micro-batch) forwards whose activations it holds at once
  int64_t in_flight_layers = 0;  // the layers of those chunks (in_flight_chunks * chunk_layers when its chunks are equal)
};

// Why the plan's pipeline split is not one Megatron builds, naming the key, its value and what would
// be valid; "" when valid. The rules (Megatron-LM, megatron/core/transformer/transformer_config.py
// TransformerConfig.__post_init__ "Uneven PP", and transformer_block.py get_num_layers_to_build):
//  - even (no pp_* key): pp * vpp divides the layers;
//  - pp_first / pp_last (num_layers_in_first/last_pipeline_stage): each > 0 and, with vpp, a multiple
//    of vpp; the layers left, L - pp_first - pp_last, split evenly over the stages left (pp minus one
//    per key set), a multiple of vpp per stage; "middle layers remaining but no middle stages" (and
//    the reverse) is refused; not with pp_embed / pp_loss ("cannot be set at the same time");
//  - pp_embed / pp_loss (account_for_embedding/loss_in_pipeline_split): L + pp_embed + pp_loss is
//    divisible by pp, and per stage by vpp; the first (last) model chunk builds one layer fewer.
// Beyond Megatron: a chunk of zero layers (Megatron builds one when the embedding or loss takes a
// chunk's only place) is refused, since ctxplan prices a chunk from its layers.
std::string pipeline_split_error(int64_t layers, const Plan& p);

// The layers of every virtual stage v = chunk * pp + stage (Megatron's order: vp_stage major,
// transformer_layer.py get_transformer_layer_offset), pp * vpp entries summing to the layers, for a
// plan pipeline_split_error accepts (std::invalid_argument otherwise). Even: L / (pp vpp) each;
// pp_first / pp_last: pp_first / vpp on stage 0's chunks, pp_last / vpp on the last stage's, the
// middle stages (L - pp_first - pp_last) / (stages left) / vpp; pp_embed / pp_loss: (L + pp_embed +
// pp_loss) / (pp vpp) each, minus one on virtual stage 0 (pp_embed) and pp vpp - 1 (pp_loss).
// pp = 1: the split keys are moot (one stage holds every layer).
std::vector<int64_t> pipeline_chunk_layers(int64_t layers, const Plan& p);

// Stage `stage` of plan `p` (pp, vpp, the split and ga as checked by check_plan).
PipelineStage pipeline_stage(const ModelSpec& m, const Plan& p, int64_t stage);

// Parameters one TP rank of the stage holds (before ZeRO sharding), from one layer's parameters on
// a TP rank and the vocabulary rows per TP rank. The first stage holds the embedding [V/tp, h];
// the last the final norm and the head [V/tp, h]: Megatron keeps a copy of a tied embedding on the
// last stage as the head (LanguageModule.setup_embeddings_and_output_layer) and all-reduces their
// gradients. pp = 1: the model's own count (the head only when untied).
double pipeline_stage_params(const ModelSpec& m, const PipelineStage& s, double layer_params, double vocab_rows);

}  // namespace ctx
