#include "costmodel/pipeline_stages.hpp"

#include <algorithm>

#include "costmodel/pipeline_schedule.hpp"

namespace ctx {

PipelineStage pipeline_stage(const ModelSpec& m, const Plan& p, int64_t stage) {
  const int64_t pp = std::max<int64_t>(1, p.pp), vpp = std::max<int64_t>(1, p.vpp);
  PipelineStage s;
  s.stage = stage;
  s.layers = m.layers / pp;
  s.chunk_layers = m.layers / (pp * vpp);
  s.first = stage == 0;
  s.last = stage == pp - 1;
  // the schedule's own count (pipeline_schedule.hpp): 1F1B min(pp - stage, ga) micro-batches;
  // interleaved min(2 (pp - stage - 1) + (vpp - 1) pp + 1, ga vpp) chunks
  s.in_flight_chunks = pp > 1 ? pipeline_in_flight(pp, vpp, std::max<int64_t>(1, p.ga), stage) : 1;
  return s;
}

double pipeline_stage_params(const ModelSpec& m, const PipelineStage& s, double layer_params, double vocab_rows) {
  const double h = static_cast<double>(m.hidden);
  const bool whole = s.first && s.last;
  double params = static_cast<double>(s.layers) * layer_params;
  if (s.first) params += vocab_rows * h;                                            // embedding
  if (s.last) params += h + ((whole && m.tied_embeddings) ? 0.0 : vocab_rows * h);  // final norm, head
  return params;
}

}  // namespace ctx
