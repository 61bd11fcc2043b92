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

namespace {

// The rules of check_plan, written once. Detail: the errors, warnings and alternatives as text in
// *out. Without: only how many errors (the search asks it of every plan it enumerates: no text is
// built and no alternative searched); p is filled in the same way either way (dp, ulysses).
// err/alt/warn take a function that makes the text, called only with Detail.
template <bool Detail>
int check_rules(Plan& p, const ModelSpec& m, const ClusterSpec& c, int64_t seq, PlanCheck* out) {
  PlanCheck& r = *out;
  int errors = 0;
  const int64_t world = world_size(c);
  auto err = [&](auto&& text) {
    ++errors;
    if constexpr (Detail) r.errors.push_back(text());
  };
  auto alt = [&](auto&& text) {
    if constexpr (Detail) {
      std::string a = text();
      if (std::find(r.alternatives.begin(), r.alternatives.end(), a) == r.alternatives.end()) r.alternatives.push_back(a);
    }
  };
  auto warn = [&](auto&& text) {
    if constexpr (Detail) r.warnings.push_back(text());
  };
  auto str = [](int64_t v) { return std::to_string(v); };

  if (seq <= 0 || seq > (int64_t(1) << 34)) err([&] { return "sequence length must be 1..17179869184 tokens, got " + str(seq); });

  // ---- world size: dp * tp * cp * pp must equal the GPUs
  const int64_t pp = std::max<int64_t>(1, p.pp);
  const char* const pp_text = pp > 1 ? "*pp" : "";
  int64_t tpcp = p.tp * p.cp * pp;
  if (p.dp == 0) {
    if (tpcp > 0 && world % tpcp == 0) p.dp = world / tpcp;
    else {
      err([&] { return "tp*cp" + std::string(pp_text) + " = " + str(tpcp) + " does not divide the " + str(world) + " GPUs, so dp cannot fill them"; });
      if constexpr (Detail)
        if (world % (p.tp * pp) == 0)
          for (int64_t cp : nearest(divisors(world / (p.tp * pp)), p.cp)) alt([&] { return "cp=" + str(cp); });
      p.dp = 1;
    }
  } else if (p.dp * tpcp != world) {
    err([&] {
      return "dp*tp*cp" + std::string(pp_text) + " = " + str(p.dp) + "*" + str(p.tp) + "*" + str(p.cp) + (pp > 1 ? "*" + str(pp) : "") +
             " = " + str(p.dp * tpcp) + ", but the cluster has " + str(world) + " GPUs";
    });
    if (world % tpcp == 0) alt([&] { return "dp=" + str(world / tpcp); });
  }

  // ---- TP communication overlap: Megatron-LM validate_args asserts sequence parallelism for
  // --tp-comm-overlap ("Tensor parallel communication/GEMM overlap can happen only when sequence
  // parallelism is enabled"); with tp=1 there is no TP collective to overlap
  if (p.tp_overlap && (p.tp <= 1 || !sp_enabled(p))) {
    err([&] {
      return std::string(p.tp <= 1 ? "tp_overlap=1 overlaps tensor-parallel collectives with GEMMs; it needs tp > 1 (tp=1 has none)"
                                    : "tp_overlap=1 needs sequence parallelism (sp=1): Megatron's --tp-comm-overlap overlaps SP's all-gathers and "
                                      "reduce-scatters and refuses to start without --sequence-parallel");
    });
    alt([] { return std::string("tp_overlap=0"); });
    if (p.tp > 1) alt([] { return std::string("sp=1"); });
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
      err([&] { return split; });
      if constexpr (Detail) {
        if (!uneven) {
          std::vector<int64_t> ok;
          for (int64_t s : divisors(m.layers))
            if (m.layers % (s * vpp) == 0 && world % (s * p.tp * p.cp) == 0) ok.push_back(s);
          for (int64_t s : nearest(ok, pp)) alt([&] { return "pp=" + str(s); });
          if (vpp > 1 && m.layers % pp == 0)
            for (int64_t v : nearest(divisors(m.layers / pp), vpp)) alt([&] { return "vpp=" + str(v); });
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
                alt([&] { return "pp_first=" + str(f) + ",pp_last=" + str(f); });
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
              alt([&] { return std::string(embed ? "pp_embed=1" : "") + (embed && loss ? "," : "") + (loss ? "pp_loss=1" : ""); });
          }
      }
    }
    if (vpp > 1 && pp == 1) {
      err([&] { return "vpp=" + str(vpp) + " interleaves model chunks over pipeline stages; it needs pp > 1"; });
      alt([] { return std::string("vpp=1"); });
    }
    if (vpp > 1 && pp > 1 && p.ga % pp != 0) {
      err([&] {
        return "the interleaved schedule (vpp=" + str(vpp) + ") needs the micro-batches ga=" + str(p.ga) + " divisible by pp=" + str(pp) +
               " (Megatron's rule)";
      });
      const int64_t down = p.ga / pp * pp;
      if (down > 0) alt([&] { return "ga=" + str(down); });
      alt([&] { return "ga=" + str(down + pp); });
      alt([] { return std::string("vpp=1"); });
    } else if (pp > 1 && p.ga < pp) {
      warn([&] {
        return "ga=" + str(p.ga) + " micro-batches fill fewer than the pp=" + str(pp) +
               " stages: most of the step is pipeline bubble (Megatron runs it; use ga >= pp)";
      });
    }
    if (pp > 1 && p.zero >= 2) {
      err([&] {
        return "zero=" + str(p.zero) + " with pp=" + str(pp) +
               ": ZeRO-2/3 shard gradients that pipeline micro-batches accumulate (DeepSpeed's PipelineEngine refuses it; "
               "Megatron's distributed optimizer is ZeRO-1)";
      });
      alt([] { return std::string("zero=1"); });
    }
  }

  // ---- HSDP: zero_shard ranks shard the model states, the dp*cp/zero_shard groups of them replicate
  if (p.zero_shard > 0) {
    const int64_t dpcp = std::max<int64_t>(1, p.dp) * p.cp;
    if (p.zero == 0) {
      err([&] { return "zero_shard=" + str(p.zero_shard) + " says over how many ranks ZeRO shards the model states; it needs zero>=1"; });
      alt([] { return std::string("zero=3"); });
      alt([] { return std::string("zero_shard=0"); });
    } else if (p.zero_shard == 1 || dpcp % p.zero_shard != 0) {
      err([&] {
        return "zero_shard=" + str(p.zero_shard) + " must divide dp*cp = " + str(dpcp) +
               " and be > 1 (one rank per shard group is zero=0); valid: 0 (all dp*cp ranks) or a divisor > 1 of " + str(dpcp);
      });
      if constexpr (Detail)
        for (int64_t v : nearest(divisors(dpcp), p.zero_shard))
          if (v > 1) alt([&] { return "zero_shard=" + str(v); });
      alt([] { return std::string("zero_shard=0"); });
    }
  }

  // ---- tensor parallel: heads, KV heads and the MLP split evenly
  if (m.heads % p.tp != 0 || m.ffn % p.tp != 0 || (m.kv_heads % p.tp != 0 && p.tp % m.kv_heads != 0)) {
    err([&] {
      return "tp=" + str(p.tp) + " must divide the query heads (" + str(m.heads) + "), the MLP width (" + str(m.ffn) + ") and the KV heads (" +
             str(m.kv_heads) + ", or be a multiple of them)";
    });
    if constexpr (Detail) {
      std::vector<int64_t> ok;
      for (int64_t t : divisors(m.heads))
        if (m.ffn % t == 0 && (m.kv_heads % t == 0 || t % m.kv_heads == 0) && world % t == 0) ok.push_back(t);
      for (int64_t t : nearest(ok, p.tp)) alt([&] { return "tp=" + str(t); });
    }
  } else if (p.tp > m.kv_heads) {
    warn([&] {
      return "tp=" + str(p.tp) + " exceeds the " + str(m.kv_heads) + " KV heads: each KV head is replicated on " + str(p.tp / m.kv_heads) +
             " TP ranks";
    });
  }
  if (p.sp == 1 && p.tp == 1) warn([] { return std::string("sp=1 has no effect with tp=1"); });

  // ---- context parallel kinds
  if (p.cp_comm == CpComm::a2a_p2p) {
    if (p.ulysses <= 0) {
      err([] { return std::string("cp_kind=usp needs ulysses=<degree> (the Ulysses part of cp; ring degree = cp/ulysses)"); });
      p.ulysses = 1;
    } else if (p.cp % p.ulysses != 0) {
      err([&] { return "ulysses=" + str(p.ulysses) + " must divide cp=" + str(p.cp); });
      if constexpr (Detail)
        for (int64_t u : nearest(divisors(p.cp), p.ulysses)) alt([&] { return "ulysses=" + str(u); });
    }
  } else if (p.ulysses > 0 && p.cp_comm != CpComm::a2a) {
    err([&] { return "ulysses=" + str(p.ulysses) + " is only meaningful with cp_kind=usp"; });
    alt([] { return std::string("cp_kind=usp"); });
  } else if (p.cp_comm == CpComm::a2a && p.ulysses > 0 && p.ulysses != p.cp) {
    err([&] { return "with cp_kind=ulysses the Ulysses degree is cp (" + str(p.cp) + "); use cp_kind=usp for a hybrid"; });
  }
  int64_t u = ulysses_degree(p);
  if (u > 1 && p.tp > 0 && m.heads % p.tp == 0 && !ulysses_ok(m, p.tp, u)) {
    int64_t q = m.heads / p.tp, kv = std::max<int64_t>(1, m.kv_heads / p.tp);
    err([&] {
      return "Ulysses degree " + str(u) + " must divide the " + str(q) + " query heads per TP rank, and either divide the " + str(kv) +
             " KV heads per TP rank or be a multiple of them (KV heads are then replicated)";
    });
    if constexpr (Detail) {
      std::vector<int64_t> ok;
      for (int64_t d : divisors(q))
        if (ulysses_ok(m, p.tp, d)) ok.push_back(d);
      for (int64_t d : nearest(ok, u)) alt([&] { return p.cp_comm == CpComm::a2a_p2p ? "ulysses=" + str(d) : "cp=" + str(d); });
    }
  } else if (u > 1 && m.kv_heads / std::max<int64_t>(1, p.tp) < u) {
    int64_t kv = std::max<int64_t>(1, m.kv_heads / std::max<int64_t>(1, p.tp));
    warn([&] {
      return "Ulysses degree " + str(u) + " exceeds the " + str(kv) + " KV heads per TP rank: each KV head is replicated " + str(u / kv) + "x";
    });
  }

  // ---- sequence divisibility
  int64_t g = seq_granule(p);
  if (seq > 0 && g > 0 && seq % g != 0 && p.pad) {
    // pad=1: the stacks pad instead of refusing (Megatron pads each document to a multiple of
    // 2*cp under THD, DESIGN.md's pitfalls); the pad tokens are priced like real ones
    warn([&] {
      const int64_t padded = padded_seq(p, seq);
      return "pad=1: the sequence of " + str(seq) + " tokens is padded to " + str(padded) + " (a multiple of " + str(g) + "): " +
             str(padded - seq) + " pad tokens priced in memory and time, tokens/s counts the " + str(seq) + " real ones";
    });
  } else if (seq > 0 && g > 0 && seq % g != 0) {
    err([&] {
      std::string why = g == 2 * p.cp && p.cp > 1
                            ? std::string("cp_layout=") + to_string(p.cp_layout) + " needs the sequence divisible by 2*cp = " + str(g)
                            : "the sequence must split evenly over cp" + std::string(sp_enabled(p) ? "*tp" : "") + " = " + str(g) + " ranks";
      return why + ", got " + str(seq);
    });
    int64_t down = seq / g * g, up = down + g;
    if (down > 0) alt([&] { return "--seq " + str(down); });
    alt([&] { return "--seq " + str(up); });
    alt([] { return std::string("pad=1"); });  // the stacks' way: pad to `up` and price the pad tokens
  }
  if (seq > 0 && p.cp > seq) err([&] { return "cp=" + str(p.cp) + " exceeds the sequence length"; });

  // ---- memory features
  if (p.ckpt_offload && p.recompute != Recompute::full) {
    err([] { return std::string("ckpt_offload=1 offloads the per-layer checkpoints of full recompute; it needs recompute=full"); });
    alt([] { return std::string("recompute=full"); });
  }
  if (p.param_offload && p.zero != 3) {
    err([] { return std::string("param_offload=1 offloads ZeRO-3 parameter shards; it needs zero=3"); });
    alt([] { return std::string("zero=3"); });
  }
  int64_t local_tokens = (seq > 0 ? seq : 1) * p.mbs / std::max<int64_t>(1, p.cp);
  if (p.tiled_loss > local_tokens)
    warn([&] { return "tiled_loss=" + str(p.tiled_loss) + " is larger than the " + str(local_tokens) + " tokens each rank holds: one tile"; });
  if (p.tiled_mlp > local_tokens)
    err([&] { return "tiled_mlp=" + str(p.tiled_mlp) + " chunks exceed the " + str(local_tokens) + " tokens each rank holds"; });
  if (p.cp > 1 && p.cp_layout == CpLayout::headtail_doc && p.mask != MaskKind::document)
    warn([] {
      return std::string(
          "cp_layout=headtail-doc cuts every document head-tail; without a document mask the sequence is one document: "
          "the same as cp_layout=headtail");
    });
  if (p.zero > 0 && p.dp * p.cp == 1) warn([&] { return "zero=" + str(p.zero) + " has no effect on one rank per TP shard"; });
  if (p.precision == Precision::fp8 && c.gpu.peak_fp8_flops <= 0) err([&] { return c.gpu.name + " has no fp8 tensor cores; use precision=bf16"; });
  if (p.mask == MaskKind::explicit_mask)
    warn([] { return std::string("mask=explicit materialises an s x s mask per GPU; pass document boundaries instead (mask=doc:...)"); });

  // ---- placement
  if constexpr (Detail) {
    if (errors == 0 && world > 1) {
      if (p.tp > 1 && nodes_spanned(p, Group::tp, c.gpus_per_node) > 1)
        warn([&] { return "the TP group spans " + str(nodes_spanned(p, Group::tp, c.gpus_per_node)) + " nodes: its collectives run on the inter-node network"; });
    }
  }
  return errors;
}

}  // namespace

PlanCheck check_plan(Plan& p, const ModelSpec& m, const ClusterSpec& c, int64_t seq) {
  PlanCheck r;
  check_rules<true>(p, m, c, seq, &r);
  return r;
}

bool plan_valid(Plan& p, const ModelSpec& m, const ClusterSpec& c, int64_t seq) {
  PlanCheck unused;  // stays empty: nothing is written without the detail
  return check_rules<false>(p, m, c, seq, &unused) == 0;
}

}  // namespace ctx
