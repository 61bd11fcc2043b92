#include "costmodel/plan_check.hpp"

#include "costmodel/pipeline_stages.hpp"

#include <algorithm>
#include <cstdlib>

#include "costmodel/process_groups.hpp"

namespace ctx {
namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// The valid values nearest to `want` (at most two: one below, one above).
std::vector<int64_t> nearest(const std::vector<int64_t>& valid, int64_t want) {
  int64_t below = -1, above = -1;
  for (int64_t v : valid) {
    if (v <= want) below = v;
    if (v >= want && above < 0) above = v;
  }
  std::vector<int64_t> out;
  if (below > 0) out.push_back(below);
  if (above > 0 && above != below) out.push_back(above);
  return out;
}

bool ulysses_ok(const ModelSpec& m, int64_t tp, int64_t u) {
  int64_t q = m.heads / tp, kv = std::max<int64_t>(1, m.kv_heads / tp);
  if (q % u != 0) return false;
  // DeepSpeed's rule: u divides the KV heads, or (u > KV heads) KV heads divide u and are replicated
  return kv % u == 0 || u % kv == 0;
}

}  // namespace

std::string PlanCheck::message() const {
  std::string s;
  for (auto& e : errors) s += (s.empty() ? "" : "; ") + e;
  if (!alternatives.empty()) {
    s += "; nearest valid: ";
    for (size_t i = 0; i < alternatives.size(); ++i) s += (i ? " | " : "") + alternatives[i];
  }
  return s;
}

int64_t seq_granule(const Plan& p) {
  // headtail: 2*cp chunks, two per rank (a2a+p2p: 2*ring chunks cut in ulysses slices); headtail-doc:
  // the same chunking of every document (Transformer Engine's THD asks each length to divide by 2*cp)
  if (p.cp > 1 && p.cp_layout != CpLayout::contiguous && p.cp_comm != CpComm::a2a) return 2 * p.cp;
  return p.cp * (sp_enabled(p) ? p.tp : 1);  // even shards (and SP shards)
}

int64_t padded_seq(const Plan& p, int64_t seq) {
  const int64_t g = seq_granule(p);
  if (!p.pad || g <= 1 || seq <= 0 || seq % g == 0) return seq;
  return (seq / g + 1) * g;
}

PlanCheck check_plan(Plan& p, const ModelSpec& m, const ClusterSpec& c, int64_t seq) {
  PlanCheck r;
  const int64_t world = world_size(c);
  auto err = [&](std::string e) { r.errors.push_back(std::move(e)); };
  auto alt = [&](std::string a) {
    if (std::find(r.alternatives.begin(), r.alternatives.end(), a) == r.alternatives.end()) r.alternatives.push_back(a);
  };

  if (seq <= 0 || seq > (int64_t(1) << 34)) err("sequence length must be 1..17179869184 tokens, got " + std::to_string(seq));

  // ---- world size: dp * tp * cp * pp must equal the GPUs
  const int64_t pp = std::max<int64_t>(1, p.pp);
  const std::string pp_text = pp > 1 ? "*pp" : "";
  int64_t tpcp = p.tp * p.cp * pp;
  if (p.dp == 0) {
    if (tpcp > 0 && world % tpcp == 0) p.dp = world / tpcp;
    else {
      err("tp*cp" + pp_text + " = " + std::to_string(tpcp) + " does not divide the " + std::to_string(world) +
          " GPUs, so dp cannot fill them");
      if (world % (p.tp * pp) == 0)
        for (int64_t cp : nearest(divisors(world / (p.tp * pp)), p.cp)) alt("cp=" + std::to_string(cp));
      p.dp = 1;
    }
  } else if (p.dp * tpcp != world) {
    err("dp*tp*cp" + pp_text + " = " + std::to_string(p.dp) + "*" + std::to_string(p.tp) + "*" + std::to_string(p.cp) +
        (pp > 1 ? "*" + std::to_string(pp) : "") + " = " + std::to_string(p.dp * tpcp) + ", but the cluster has " +
        std::to_string(world) + " GPUs");
    if (world % tpcp == 0) alt("dp=" + std::to_string(world / tpcp));
  }

  // ---- TP communication overlap: Megatron-LM validate_args asserts sequence parallelism for
  // --tp-comm-overlap ("Tensor parallel communication/GEMM overlap can happen only when sequence
  // parallelism is enabled"); with tp=1 there is no TP collective to overlap
  if (p.tp_overlap && (p.tp <= 1 || !sp_enabled(p))) {
    err(p.tp <= 1 ? "tp_overlap=1 overlaps tensor-parallel collectives with GEMMs; it needs tp > 1 (tp=1 has none)"
                  : "tp_overlap=1 needs sequence parallelism (sp=1): Megatron's --tp-comm-overlap overlaps SP's all-gathers and "
                    "reduce-scatters and refuses to start without --sequence-parallel");
    alt("tp_overlap=0");
    if (p.tp > 1) alt("sp=1");
  }

  // ---- pipeline parallel (Megatron's rules): the layers split over pp*vpp model chunks, evenly or
  // by Megatron's uneven rules (pp_first/pp_last, pp_embed/pp_loss: pipeline_stages.hpp
  // pipeline_split_error); the interleaved schedule needs the micro-batches divisible by pp
  // (schedules.py, forward_backward_pipelining_with_interleaving raises "number of microbatches ...
  // is not divisible by pipeline-model-parallel-size when using interleaved schedule"); DeepSpeed's
  // PipelineEngine asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism".
  const int64_t vpp = std::max<int64_t>(1, p.vpp);
  const bool uneven = p.pp_first > 0 || p.pp_last > 0 || p.pp_embed || p.pp_loss;
  if (pp > 1 || vpp > 1 || uneven) {
    if (const std::string split = pipeline_split_error(m.layers, p); !split.empty()) {
      err(split);
      if (!uneven) {
        std::vector<int64_t> ok;
        for (int64_t s : divisors(m.layers))
          if (m.layers % (s * vpp) == 0 && world % (s * p.tp * p.cp) == 0) ok.push_back(s);
        for (int64_t s : nearest(ok, pp)) alt("pp=" + std::to_string(s));
        if (vpp > 1 && m.layers % pp == 0)
          for (int64_t v : nearest(divisors(m.layers / pp), vpp)) alt("vpp=" + std::to_string(v));
      }
      // the uneven splits Megatron builds at this pp and vpp, nearest the even share: the first and
      // last stages one chunk's worth lighter (or heavier), the middle stages even
      if (pp > 2 && !(p.pp_embed || p.pp_loss)) {
        const int64_t share = m.layers / pp / vpp * vpp;
        int shown = 0;
        for (int64_t d = 0; d <= share && shown < 2; d += vpp)
          for (int64_t f : {share - d, share + d}) {
            Plan q = p;
            q.pp_first = q.pp_last = f;
            if (shown < 2 && f > 0 && (d > 0 || f == share) && pipeline_split_error(m.layers, q).empty()) {
              alt("pp_first=" + std::to_string(f) + ",pp_last=" + std::to_string(f));
              ++shown;
            }
            if (d == 0) break;
          }
      }
      for (bool embed : {true, false})
        for (bool loss : {true, false}) {
          Plan q = p;
          q.pp_first = q.pp_last = 0;
          q.pp_embed = embed;
          q.pp_loss = loss;
          if ((embed || loss) && pp > 1 && pipeline_split_error(m.layers, q).empty())
            alt(std::string(embed ? "pp_embed=1" : "") + (embed && loss ? "," : "") + (loss ? "pp_loss=1" : ""));
        }
    }
    if (vpp > 1 && pp == 1) {
      err("vpp=" + std::to_string(vpp) + " interleaves model chunks over pipeline stages; it needs pp > 1");
      alt("vpp=1");
    }
    if (vpp > 1 && pp > 1 && p.ga % pp != 0) {
      err("the interleaved schedule (vpp=" + std::to_string(vpp) + ") needs the micro-batches ga=" + std::to_string(p.ga) +
          " divisible by pp=" + std::to_string(pp) + " (Megatron's rule)");
      const int64_t down = p.ga / pp * pp;
      if (down > 0) alt("ga=" + std::to_string(down));
      alt("ga=" + std::to_string(down + pp));
      alt("vpp=1");
    } else if (pp > 1 && p.ga < pp) {
      r.warnings.push_back("ga=" + std::to_string(p.ga) + " micro-batches fill fewer than the pp=" + std::to_string(pp) +
                           " stages: most of the step is pipeline bubble (Megatron runs it; use ga >= pp)");
    }
    if (pp > 1 && p.zero >= 2) {
      err("zero=" + std::to_string(p.zero) + " with pp=" + std::to_string(pp) +
          ": ZeRO-2/3 shard gradients that pipeline micro-batches accumulate (DeepSpeed's PipelineEngine refuses it; "
          "Megatron's distributed optimizer is ZeRO-1)");
      alt("zero=1");
    }
  }

  // ---- HSDP: zero_shard ranks shard the model states, the dp*cp/zero_shard groups of them replicate
  if (p.zero_shard > 0) {
    const int64_t dpcp = std::max<int64_t>(1, p.dp) * p.cp;
    if (p.zero == 0) {
      err("zero_shard=" + std::to_string(p.zero_shard) + " says over how many ranks ZeRO shards the model states; it needs zero>=1");
      alt("zero=3");
      alt("zero_shard=0");
    } else if (p.zero_shard == 1 || dpcp % p.zero_shard != 0) {
      err("zero_shard=" + std::to_string(p.zero_shard) + " must divide dp*cp = " + std::to_string(dpcp) +
          " and be > 1 (one rank per shard group is zero=0); valid: 0 (all dp*cp ranks) or a divisor > 1 of " + std::to_string(dpcp));
      for (int64_t v : nearest(divisors(dpcp), p.zero_shard))
        if (v > 1) alt("zero_shard=" + std::to_string(v));
      alt("zero_shard=0");
    }
  }

  // ---- tensor parallel: heads, KV heads and the MLP split evenly
  if (m.heads % p.tp != 0 || m.ffn % p.tp != 0 || (m.kv_heads % p.tp != 0 && p.tp % m.kv_heads != 0)) {
    err("tp=" + std::to_string(p.tp) + " must divide the query heads (" + std::to_string(m.heads) + "), the MLP width (" +
        std::to_string(m.ffn) + ") and the KV heads (" + std::to_string(m.kv_heads) + ", or be a multiple of them)");
    std::vector<int64_t> ok;
    for (int64_t t : divisors(m.heads))
      if (m.ffn % t == 0 && (m.kv_heads % t == 0 || t % m.kv_heads == 0) && world % t == 0) ok.push_back(t);
    for (int64_t t : nearest(ok, p.tp)) alt("tp=" + std::to_string(t));
  } else if (p.tp > m.kv_heads) {
    r.warnings.push_back("tp=" + std::to_string(p.tp) + " exceeds the " + std::to_string(m.kv_heads) +
                         " KV heads: each KV head is replicated on " + std::to_string(p.tp / m.kv_heads) + " TP ranks");
  }
  if (p.sp == 1 && p.tp == 1) r.warnings.push_back("sp=1 has no effect with tp=1");

  // ---- context parallel kinds
  if (p.cp_comm == CpComm::a2a_p2p) {
    if (p.ulysses <= 0) {
      err("cp_kind=usp needs ulysses=<degree> (the Ulysses part of cp; ring degree = cp/ulysses)");
      p.ulysses = 1;
    } else if (p.cp % p.ulysses != 0) {
      err("ulysses=" + std::to_string(p.ulysses) + " must divide cp=" + std::to_string(p.cp));
      for (int64_t u : nearest(divisors(p.cp), p.ulysses)) alt("ulysses=" + std::to_string(u));
    }
  } else if (p.ulysses > 0 && p.cp_comm != CpComm::a2a) {
    err("ulysses=" + std::to_string(p.ulysses) + " is only meaningful with cp_kind=usp");
    alt("cp_kind=usp");
  } else if (p.cp_comm == CpComm::a2a && p.ulysses > 0 && p.ulysses != p.cp) {
    err("with cp_kind=ulysses the Ulysses degree is cp (" + std::to_string(p.cp) + "); use cp_kind=usp for a hybrid");
  }
  int64_t u = ulysses_degree(p);
  if (u > 1 && p.tp > 0 && m.heads % p.tp == 0 && !ulysses_ok(m, p.tp, u)) {
    int64_t q = m.heads / p.tp, kv = std::max<int64_t>(1, m.kv_heads / p.tp);
    err("Ulysses degree " + std::to_string(u) + " must divide the " + std::to_string(q) +
        " query heads per TP rank, and either divide the " + std::to_string(kv) +
        " KV heads per TP rank or be a multiple of them (KV heads are then replicated)");
    std::vector<int64_t> ok;
    for (int64_t d : divisors(q))
      if (ulysses_ok(m, p.tp, d)) ok.push_back(d);
    for (int64_t d : nearest(ok, u))
      alt(p.cp_comm == CpComm::a2a_p2p ? "ulysses=" + std::to_string(d) : "cp=" + std::to_string(d));
  } else if (u > 1 && m.kv_heads / std::max<int64_t>(1, p.tp) < u) {
    int64_t kv = std::max<int64_t>(1, m.kv_heads / std::max<int64_t>(1, p.tp));
    r.warnings.push_back("Ulysses degree " + std::to_string(u) + " exceeds the " + std::to_string(kv) +
                         " KV heads per TP rank: each KV head is replicated " + std::to_string(u / kv) + "x");
  }

  // ---- sequence divisibility
  int64_t g = seq_granule(p);
  if (seq > 0 && g > 0 && seq % g != 0 && p.pad) {
    // pad=1: the stacks pad instead of refusing (Megatron pads each document to a multiple of
    // 2*cp under THD, DESIGN.md's pitfalls); the pad tokens are priced like real ones
    const int64_t padded = padded_seq(p, seq);
    r.warnings.push_back("pad=1: the sequence of " + std::to_string(seq) + " tokens is padded to " + std::to_string(padded) +
                         " (a multiple of " + std::to_string(g) + "): " + std::to_string(padded - seq) +
                         " pad tokens priced in memory and time, tokens/s counts the " + std::to_string(seq) + " real ones");
  } else if (seq > 0 && g > 0 && seq % g != 0) {
    std::string why = g == 2 * p.cp && p.cp > 1
                          ? std::string("cp_layout=") + to_string(p.cp_layout) + " needs the sequence divisible by 2*cp = " + std::to_string(g)
                          : "the sequence must split evenly over cp" + std::string(sp_enabled(p) ? "*tp" : "") + " = " +
                                std::to_string(g) + " ranks";
    err(why + ", got " + std::to_string(seq));
    int64_t down = seq / g * g, up = down + g;
    if (down > 0) alt("--seq " + std::to_string(down));
    alt("--seq " + std::to_string(up));
    alt("pad=1");  // the stacks' way: pad to `up` and price the pad tokens
  }
  if (seq > 0 && p.cp > seq) err("cp=" + std::to_string(p.cp) + " exceeds the sequence length");

  // ---- memory features
  if (p.ckpt_offload && p.recompute != Recompute::full) {
    err("ckpt_offload=1 offloads the per-layer checkpoints of full recompute; it needs recompute=full");
    alt("recompute=full");
  }
  if (p.param_offload && p.zero != 3) {
    err("param_offload=1 offloads ZeRO-3 parameter shards; it needs zero=3");
    alt("zero=3");
  }
  int64_t local_tokens = (seq > 0 ? seq : 1) * p.mbs / std::max<int64_t>(1, p.cp);
  if (p.tiled_loss > local_tokens)
    r.warnings.push_back("tiled_loss=" + std::to_string(p.tiled_loss) + " is larger than the " +
                         std::to_string(local_tokens) + " tokens each rank holds: one tile");
  if (p.tiled_mlp > local_tokens) err("tiled_mlp=" + std::to_string(p.tiled_mlp) + " chunks exceed the " +
                                      std::to_string(local_tokens) + " tokens each rank holds");
  if (p.cp > 1 && p.cp_layout == CpLayout::headtail_doc && p.mask != MaskKind::document)
    r.warnings.push_back("cp_layout=headtail-doc cuts every document head-tail; without a document mask the sequence is one document: "
                         "the same as cp_layout=headtail");
  if (p.zero > 0 && p.dp * p.cp == 1) r.warnings.push_back("zero=" + std::to_string(p.zero) + " has no effect on one rank per TP shard");
  if (p.precision == Precision::fp8 && c.gpu.peak_fp8_flops <= 0) err(c.gpu.name + " has no fp8 tensor cores; use precision=bf16");
  if (p.mask == MaskKind::explicit_mask)
    r.warnings.push_back("mask=explicit materialises an s x s mask per GPU; pass document boundaries instead (mask=doc:...)");

  // ---- placement
  if (r.errors.empty() && world > 1) {
    if (p.tp > 1 && nodes_spanned(p, Group::tp, c.gpus_per_node) > 1)
      r.warnings.push_back("the TP group spans " + std::to_string(nodes_spanned(p, Group::tp, c.gpus_per_node)) +
                           " nodes: its collectives run on the inter-node network");
  }
  return r;
}

}  // namespace ctx
