#include "costmodel/pipeline_stages.hpp"

#include <algorithm>
#include <stdexcept>

#include "costmodel/pipeline_schedule.hpp"

namespace ctx {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

bool uneven_ends(const Plan& p) { return p.pp_first > 0 || p.pp_last > 0; }

}  // namespace

std::string pipeline_split_error(int64_t L, const Plan& p) {
  const int64_t pp = std::max<int64_t>(1, p.pp), vpp = std::max<int64_t>(1, p.vpp);
  const bool ends = uneven_ends(p), account = p.pp_embed || p.pp_loss;
  const std::string vpp_text = vpp > 1 ? " and vpp=" + str(vpp) : "";
  if ((ends || account) && pp == 1) {
    const std::string key = p.pp_first > 0 ? "pp_first=" + str(p.pp_first) : p.pp_last > 0 ? "pp_last=" + str(p.pp_last)
                            : p.pp_embed ? "pp_embed=1" : "pp_loss=1";
    return key + " sets how the layers split over pipeline stages; it needs pp > 1 (or drop it)";
  }
  if (ends && account)  // transformer_config.py: "cannot be set at the same time"
    return "pp_first/pp_last and pp_embed/pp_loss are two ways to split the layers unevenly; Megatron refuses both at once "
           "(TransformerConfig: num_layers_in_first/last_pipeline_stage cannot be set with account_for_embedding/loss_in_pipeline_split): keep one";
  if (ends) {
    int64_t rest = L, stages = pp;
    for (auto [key, n] : {std::pair<const char*, int64_t>{"pp_first", p.pp_first}, {"pp_last", p.pp_last}}) {
      if (n <= 0) continue;
      if (n % vpp != 0)
        return std::string(key) + "=" + str(n) + " must be a multiple of vpp=" + str(vpp) +
               " (each of the stage's vpp model chunks holds " + key + "/vpp layers; Megatron's rule): valid e.g. " + key +
               "=" + str(std::max<int64_t>(vpp, n / vpp * vpp));
      rest -= n;
      --stages;
    }
    const std::string keys = std::string(p.pp_first > 0 ? "pp_first=" + str(p.pp_first) : "") +
                             (p.pp_first > 0 && p.pp_last > 0 ? ", " : "") + (p.pp_last > 0 ? "pp_last=" + str(p.pp_last) : "");
    if (rest < 0 || (rest > 0) != (stages > 0)) {
      if (stages == 0)
        return keys + " put " + str(L - rest) + " layers on the pp=" + str(pp) + " stages; they must hold all " + str(L) +
               " layers (pp_first + pp_last = layers when pp=2)";
      return keys + " leave " + str(rest) + " layers for the " + str(stages) + " other stage" + (stages > 1 ? "s" : "") +
             " of pp=" + str(pp) + "; each needs at least " + str(vpp) + " (pp_first + pp_last <= " + str(L - stages * vpp) + ")";
    }
    if (stages > 0 && rest % (stages * vpp) != 0)
      return keys + " leave " + str(rest) + " layers, which do not split evenly over the " + str(stages) + " other stage" +
             (stages > 1 ? "s" : "") + " of pp=" + str(pp) + (vpp > 1 ? " in vpp=" + str(vpp) + " chunks each" : "") +
             " (Megatron's rule: the layers left divide by the stages left" + (vpp > 1 ? ", and per stage by vpp" : "") +
             "): valid splits leave a multiple of " + str(stages * vpp);
    return "";
  }
  if (account) {
    const int64_t Lx = L + (p.pp_embed ? 1 : 0) + (p.pp_loss ? 1 : 0);
    const std::string keys = std::string(p.pp_embed ? "pp_embed=1" : "") + (p.pp_embed && p.pp_loss ? ", " : "") +
                             (p.pp_loss ? "pp_loss=1" : "");
    if (Lx % (pp * vpp) != 0)
      return "with " + keys + " the split counts " + str(Lx) + " layers (" + str(L) + " and the embedding or loss as one each), which pp=" +
             str(pp) + vpp_text + " must divide into pp*vpp = " + str(pp * vpp) + " equal chunks (Megatron's rule)";
    if (Lx / (pp * vpp) < 2)
      return "with " + keys + " a model chunk of pp=" + str(pp) + vpp_text + " holds " + str(Lx / (pp * vpp)) +
             " place, taken by the embedding or the loss: a chunk without layers, which Megatron builds but ctxplan does not "
             "price; use fewer chunks (pp*vpp <= " + str(Lx / 2) + ")";
    return "";
  }
  if (L % (pp * vpp) != 0)
    return vpp > 1 ? "pp*vpp = " + str(pp) + "*" + str(vpp) + " must divide the " + str(L) +
                         " layers (each rank holds vpp chunks of layers/(pp*vpp) layers), or split them unevenly (pp_first/pp_last, pp_embed/pp_loss)"
                   : "pp=" + str(pp) + " must divide the " + str(L) +
                         " layers (each stage holds layers/pp), or split them unevenly with pp_first/pp_last (Megatron's "
                         "--decoder-first/last-pipeline-num-layers) or pp_embed/pp_loss";
  return "";
}

std::vector<int64_t> pipeline_chunk_layers(int64_t L, const Plan& p0) {
  // one stage holds every layer whatever the split keys say (the time model prices a stage as a
  // plan of its own with pp = 1; plan_check refuses the keys without pp > 1)
  Plan p = p0;
  if (std::max<int64_t>(1, p.pp) == 1) {
    p.pp_first = p.pp_last = 0;
    p.pp_embed = p.pp_loss = false;
  }
  const std::string e = pipeline_split_error(L, p);
  if (!e.empty()) throw std::invalid_argument("pipeline_chunk_layers: " + e);
  const int64_t pp = std::max<int64_t>(1, p.pp), vpp = std::max<int64_t>(1, p.vpp), V = pp * vpp;
  std::vector<int64_t> out(static_cast<size_t>(V), 0);
  if (uneven_ends(p)) {  // transformer_block.py get_num_layers_to_build, "uneven pp"
    const int64_t stages = pp - (p.pp_first > 0 ? 1 : 0) - (p.pp_last > 0 ? 1 : 0);
    const int64_t middle = stages > 0 ? (L - p.pp_first - p.pp_last) / stages : 0;
    for (int64_t v = 0; v < V; ++v) {
      const int64_t s = v % pp;
      int64_t n = middle;
      if (s == 0 && p.pp_first > 0) n = p.pp_first;
      if (s == pp - 1 && p.pp_last > 0) n = p.pp_last;
      out[static_cast<size_t>(v)] = n / vpp;
    }
    return out;
  }
  const int64_t Lx = L + (p.pp_embed ? 1 : 0) + (p.pp_loss ? 1 : 0);
  std::fill(out.begin(), out.end(), Lx / V);
  if (p.pp_embed) out.front() -= 1;  // is_vp_first_stage and the first pp stage: one layer fewer
  if (p.pp_loss) out.back() -= 1;    // is_vp_last_stage and the last pp stage
  return out;
}

PipelineStage pipeline_stage(const ModelSpec& m, const Plan& p, int64_t stage) {
  const int64_t pp = std::max<int64_t>(1, p.pp), vpp = std::max<int64_t>(1, p.vpp);
  const std::vector<int64_t> chunks = pipeline_chunk_layers(m.layers, p);
  PipelineStage s;
  s.stage = stage;
  s.layers = 0;
  s.chunk_layers = 0;
  for (int64_t c = 0; c < vpp; ++c) {
    const int64_t n = chunks[static_cast<size_t>(c * pp + stage)];
    s.layers += n;
    s.chunk_layers = std::max(s.chunk_layers, n);
  }
  for (int64_t v = 0; v < stage; ++v) s.first_layer += chunks[static_cast<size_t>(v)];  // virtual stages before its first chunk
  s.first = stage == 0;
  s.last = stage == pp - 1;
  // the schedule's own count (pipeline_schedule.hpp): 1F1B min(pp - stage, ga) micro-batches;
  // interleaved min(2 (pp - stage - 1) + (vpp - 1) pp + 1, ga vpp) chunks
  s.in_flight_chunks = pp > 1 ? pipeline_in_flight(pp, vpp, std::max<int64_t>(1, p.ga), stage) : 1;
  // the layers those chunks hold: with equal chunks in_flight_chunks of them; with unequal ones
  // (pp_embed / pp_loss shorten the first / last chunk) the most the stage's program holds at once,
  // walking Megatron's order (pipeline_stage_order): + a chunk's layers at its forward, - at its backward
  bool equal = true;
  for (int64_t c = 0; c < vpp; ++c) equal = equal && chunks[static_cast<size_t>(c * pp + stage)] == s.chunk_layers;
  if (equal) s.in_flight_layers = s.in_flight_chunks * s.chunk_layers;
  else {
    int64_t held = 0;
    for (const PipelineOp& op : pipeline_stage_order(pp, vpp, std::max<int64_t>(1, p.ga), stage)) {
      const int64_t n = chunks[static_cast<size_t>(op.chunk * pp + stage)];
      held += op.forward ? n : -n;
      s.in_flight_layers = std::max(s.in_flight_layers, held);
    }
  }
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
