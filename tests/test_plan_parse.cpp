// Plans as text and JSON (parse_plan, plan_to_string, plan_to_json, plan_from_json) and the rules
// check_plan enforces against a model, a cluster and a sequence length.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "costmodel/errors.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"

using namespace ctx;

namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(default_profiles_dir());
  return p;
}

ClusterSpec cluster(const std::string& s) { return resolve_cluster(profiles(), s); }
ModelSpec model(const std::string& s) { return resolve_model(profiles(), s); }

// Two plans mean the same thing: every field equal, sp compared by its effect.
void expect_same_plan(const Plan& a, const Plan& b, const std::string& ctx) {
  SCOPED_TRACE(ctx);
  EXPECT_EQ(a.dp, b.dp);
  EXPECT_EQ(a.tp, b.tp);
  EXPECT_EQ(sp_enabled(a), sp_enabled(b));
  EXPECT_EQ(a.cp, b.cp);
  EXPECT_EQ(a.cp_comm, b.cp_comm);
  EXPECT_EQ(a.cp_layout, b.cp_layout);
  EXPECT_TRUE(a.cp_varlen == b.cp_varlen);
  EXPECT_EQ(ulysses_degree(a), ulysses_degree(b));
  EXPECT_EQ(a.zero, b.zero);
  EXPECT_EQ(a.mbs, b.mbs);
  EXPECT_EQ(a.ga, b.ga);
  EXPECT_EQ(a.recompute, b.recompute);
  EXPECT_EQ(a.ckpt_offload, b.ckpt_offload);
  EXPECT_EQ(a.opt_offload, b.opt_offload);
  EXPECT_EQ(a.param_offload, b.param_offload);
  EXPECT_EQ(a.tiled_loss, b.tiled_loss);
  EXPECT_EQ(std::max<int64_t>(a.tiled_mlp, 1), std::max<int64_t>(b.tiled_mlp, 1));
  EXPECT_EQ(a.mask, b.mask);
  EXPECT_EQ(a.docs.kind, b.docs.kind);
  EXPECT_EQ(a.docs.token_share, b.docs.token_share);
  EXPECT_EQ(a.docs.tokens, b.docs.tokens);
  ASSERT_EQ(a.docs.weights.size(), b.docs.weights.size());
  for (size_t i = 0; i < a.docs.weights.size(); ++i) EXPECT_NEAR(a.docs.weights[i], b.docs.weights[i], 1e-9);
  EXPECT_EQ(a.precision, b.precision);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.order[i], b.order[i]);
}

const std::vector<std::string>& sample_plans() {
  static const std::vector<std::string> plans = {
      "",
      "cp=8,cp_kind=zigzag,zero=3,recompute=full,tiled_loss=2048",
      "dp=4,tp=2",
      "tp=4,sp=0",
      "tp=1,sp=1",
      "cp=4,cp_kind=ring",
      "cp=1,cp_kind=ring",
      "cp=8,cp_kind=allgather,zero=1",
      "cp=8,cp_kind=ulysses,zero=2,mbs=2,ga=4",
      "cp=16,cp_kind=usp,ulysses=4,zero=3,recompute=full,ckpt_offload=1,opt_offload=1",
      "zero=3,param_offload=1,recompute=selective,tiled_mlp=8",
      "mask=doc:4096",
      "mask=doc:1024/2048/4096",
      "mask=doc:hist:1024@0.5/8192@0.25/65536@0.25",
      "mask=explicit,precision=fp8",
      "cp=2,precision=fp32",
      "precision=bf16",
      "order=dp-cp-tp,tp=2,cp=2",
      "order=cp-tp-dp",
  };
  return plans;
}

int count_containing(const std::vector<std::string>& v, const std::string& needle) {
  return static_cast<int>(std::count_if(v.begin(), v.end(), [&](auto& s) { return s.find(needle) != std::string::npos; }));
}

}  // namespace

// ---- text and JSON forms ------------------------------------------------------------------

TEST(PlanParse, ToStringRoundTrips) {
  for (const auto& text : sample_plans()) {
    Plan p = parse_plan(text);
    std::string canon = plan_to_string(p);
    Plan q = parse_plan(canon);
    expect_same_plan(p, q, text + " -> " + canon);
    EXPECT_EQ(plan_to_string(q), canon) << "canonical form is a fixed point";
  }
}

TEST(PlanParse, ToStringRoundTripsHistogramThirds) {
  // Fractions that sum to 1 when given in full must still sum to 1 after plan_to_string prints them.
  Plan p = parse_plan("mask=doc:hist:1024@0.3333333333/2048@0.3333333333/4096@0.3333333334");
  std::string canon = plan_to_string(p);
  Plan q;
  ASSERT_NO_THROW(q = parse_plan(canon)) << canon;
  expect_same_plan(p, q, canon);
}

TEST(PlanParse, JsonRoundTripAgreesWithTextParser) {
  for (const auto& text : sample_plans()) {
    Plan p = parse_plan(text);
    Plan q = plan_from_json(plan_to_json(p), "test");
    expect_same_plan(p, q, text);
  }
}

TEST(PlanParse, HandWrittenJsonAgreesWithText) {
  json j = {{"tp", 2}, {"cp", 4}, {"cp_kind", "usp"}, {"ulysses", 2}, {"zero", 3}, {"recompute", "full"},
            {"ckpt_offload", true}, {"mask", "doc:hist:2048@0.75/8192@0.25"}, {"order", "cp-tp-dp"}};
  expect_same_plan(plan_from_json(j, "plan.json"),
                   parse_plan("tp=2,cp=4,cp_kind=usp,ulysses=2,zero=3,recompute=full,ckpt_offload=1,"
                              "mask=doc:hist:2048@0.75/8192@0.25,order=cp-tp-dp"),
                   "hand-written");
}

// Issue 20: every cp_comm x cp_layout x cp_varlen, with and without a Ulysses degree and a document
// mask, round-trips through the text and the JSON form (exhaustive over the axes).
TEST(PlanParse, EveryCpAxisCombinationRoundTrips) {
  int n = 0;
  for (const char* comm : {"p2p", "allgather", "a2a", "a2a+p2p"})
    for (const char* layout : {"contiguous", "headtail", "headtail-doc"})
      for (const char* varlen : {"", "native", "cycle", "split:3"})
        for (const char* mask : {"", "doc:4096", "doc:tokhist:1k@0.3/64k@0.7"}) {
          if (*varlen && !*mask) continue;  // cp_varlen needs a document mask (tested below)
          const bool ring = std::string(comm) == "p2p" || std::string(comm) == "a2a+p2p";
          if (!ring && (std::string(varlen) == "cycle" || std::string(varlen) == "split:3")) continue;  // refused (RingVarlen... below)
          std::string text = std::string("cp=8,cp_comm=") + comm + ",cp_layout=" + layout;
          if (std::string(comm) == "a2a+p2p") text += ",ulysses=2";
          if (*mask) text += std::string(",mask=") + mask;
          if (*varlen) text += std::string(",cp_varlen=") + varlen;
          const Plan p = parse_plan(text);
          EXPECT_STREQ(to_string(p.cp_comm), comm) << text;
          EXPECT_STREQ(to_string(p.cp_layout), layout) << text;
          const std::string canon = plan_to_string(p);
          expect_same_plan(p, parse_plan(canon), text + " -> " + canon);
          expect_same_plan(p, plan_from_json(plan_to_json(p), "plan.json"), text + " (json)");
          ++n;
        }
  // 3 layouts x (causal + 2 masks x varlen spellings): 4 spellings for the 2 ring exchanges, 2 (unset, native) for the others
  EXPECT_EQ(n, 2 * 3 * (1 + 2 * 4) + 2 * 3 * (1 + 2 * 2));
}

TEST(PlanParse, CpKindIsAShorthandForTheAxes) {
  struct Want { const char* kind; CpComm comm; CpLayout layout; };
  for (Want w : {Want{"ring", CpComm::p2p, CpLayout::contiguous}, Want{"zigzag", CpComm::p2p, CpLayout::headtail},
                 Want{"allgather", CpComm::allgather, CpLayout::headtail}, Want{"ulysses", CpComm::a2a, CpLayout::contiguous},
                 Want{"usp", CpComm::a2a_p2p, CpLayout::headtail}}) {
    Plan p = parse_plan(std::string("cp=8,cp_kind=") + w.kind);
    EXPECT_EQ(p.cp_comm, w.comm) << w.kind;
    EXPECT_EQ(p.cp_layout, w.layout) << w.kind;
    EXPECT_TRUE(cp_kind_exact(p)) << w.kind;
    EXPECT_STREQ(to_string(cp_kind_of(p)), w.kind);
    // the axis key the shorthand implies may be repeated
    EXPECT_EQ(parse_plan(std::string("cp=8,cp_kind=") + w.kind + ",cp_comm=" + to_string(w.comm)).cp_layout, w.layout);
  }
  // the done-when plan: allgather refined to the layout it meant before issue 20, in either key order
  EXPECT_EQ(parse_plan("cp=8,cp_kind=allgather,cp_layout=contiguous").cp_layout, CpLayout::contiguous);
  EXPECT_EQ(parse_plan("cp=8,cp_layout=contiguous,cp_kind=allgather").cp_layout, CpLayout::contiguous);
  EXPECT_EQ(parse_plan("cp=8,cp_kind=usp,ulysses=2,cp_layout=headtail-doc").cp_layout, CpLayout::headtail_doc);
}

TEST(PlanParse, ShorthandAndAxisThatDisagreeNameBoth) {
  for (const char* text : {"cp=8,cp_kind=zigzag,cp_comm=allgather", "cp=8,cp_comm=a2a,cp_kind=ring",
                           "cp=8,cp_kind=ring,cp_layout=headtail", "cp=8,cp_kind=zigzag,cp_layout=contiguous"}) {
    try {
      parse_plan(text);
      ADD_FAILURE() << text << " parsed";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("cp_kind="), std::string::npos) << what;
      EXPECT_TRUE(what.find("cp_comm=") != std::string::npos || what.find("cp_layout=") != std::string::npos) << what;
      EXPECT_NE(what.find("disagrees"), std::string::npos) << what;
    }
  }
  // cp_varlen without a document mask, and unknown spellings, are input errors naming the field
  for (const char* text : {"cp=8,cp_varlen=cycle", "cp=8,mask=doc:1k,cp_varlen=split:1", "cp=8,mask=doc:1k,cp_varlen=split",
                           "cp=8,cp_layout=zigzag", "cp=8,cp_comm=ring"}) {
    try {
      parse_plan(text);
      ADD_FAILURE() << text << " parsed";
    } catch (const InputError& e) {
      EXPECT_TRUE(std::string(e.what()).find("cp_varlen") != std::string::npos ||
                  std::string(e.what()).find("cp_layout") != std::string::npos ||
                  std::string(e.what()).find("cp_comm") != std::string::npos) << e.what();
    }
  }
}

TEST(PlanParse, PlansSavedBeforeTheAxesStillLoad) {
  // plan.json from before issue 20 carried cp_kind (and a derived ulysses) only; allgather now
  // means the head-tail layout the stacks run (docs/CONTEXT_PARALLEL.md)
  json old = {{"dp", 1}, {"tp", 1}, {"cp", 8}, {"cp_kind", "allgather"}, {"ulysses", 1}, {"zero", 3}};
  Plan p = plan_from_json(old, "old.json");
  EXPECT_EQ(p.cp_comm, CpComm::allgather);
  EXPECT_EQ(p.cp_layout, CpLayout::headtail);
  json usp = {{"cp", 8}, {"cp_kind", "usp"}, {"ulysses", 4}};
  EXPECT_EQ(ulysses_degree(plan_from_json(usp, "old.json")), 4);
}

TEST(PlanParse, JsonAndTextRejectTheSameBadValues) {
  for (auto [key, bad] : std::vector<std::pair<std::string, std::string>>{
           {"zero", "5"}, {"cp", "-1"}, {"cp_kind", "foo"}, {"recompute", "some"}, {"tpp", "2"}}) {
    EXPECT_THROW(parse_plan(key + "=" + bad), InputError) << key;
    json j = json::object();
    j[key] = bad;
    EXPECT_THROW(plan_from_json(j, "plan.json"), InputError) << key;
  }
}

TEST(PlanParse, DefaultsAreDocumented) {
  Plan p = parse_plan("");
  EXPECT_EQ(p.dp, 0);  // fill
  EXPECT_EQ(p.tp, 1);
  EXPECT_EQ(p.cp, 1);
  EXPECT_EQ(cp_kind_of(p), CpKind::zigzag);
  EXPECT_EQ(p.zero, 0);
  EXPECT_EQ(p.recompute, Recompute::none);
  EXPECT_EQ(p.mask, MaskKind::causal);
  EXPECT_EQ(order_to_string(p), "tp-cp-dp");
  EXPECT_FALSE(sp_enabled(p));
}

TEST(PlanParse, SequenceParallelTurnsOnWithTp) {
  EXPECT_TRUE(sp_enabled(parse_plan("tp=2")));
  EXPECT_FALSE(sp_enabled(parse_plan("tp=2,sp=0")));
  EXPECT_FALSE(sp_enabled(parse_plan("tp=1")));
}

TEST(PlanParse, DpFillsTheGpusLeftByTpAndCp) {
  ModelSpec m = model("Llama-3.1-8B");
  ClusterSpec c = cluster("4x8xh100");  // 32 GPUs
  Plan p = parse_plan("tp=2,cp=4,zero=3,recompute=full");
  PlanCheck r = check_plan(p, m, c, 131072);
  EXPECT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(p.dp, 32 / (2 * 4));
}

TEST(PlanParse, UlyssesAndRingDegrees) {
  Plan u = parse_plan("cp=8,cp_kind=ulysses");
  EXPECT_EQ(ulysses_degree(u), 8);
  EXPECT_EQ(ring_degree(u), 1);
  Plan h = parse_plan("cp=16,cp_kind=usp,ulysses=4");
  EXPECT_EQ(ulysses_degree(h), 4);
  EXPECT_EQ(ring_degree(h), 4);
  Plan z = parse_plan("cp=8,cp_kind=zigzag");
  EXPECT_EQ(ulysses_degree(z), 1);
  EXPECT_EQ(ring_degree(z), 8);
}

TEST(PlanParse, TokenSuffixesScaleByPowersOfTwo) {
  EXPECT_EQ(parse_plan("tiled_loss=2k").tiled_loss, 2048);
  EXPECT_THROW(parse_plan("tiled_loss=1.5"), InputError);
}

TEST(PlanParse, MalformedItemsAreRejected) {
  EXPECT_THROW(parse_plan("tp"), InputError);
  EXPECT_THROW(parse_plan("=2"), InputError);
  EXPECT_THROW(parse_plan("tp=2,tp=4"), InputError);  // given twice
  EXPECT_THROW(parse_plan("tp=two"), InputError);
  EXPECT_THROW(parse_plan("sp=maybe"), InputError);
}

TEST(PlanParse, HugeIntegerIsReportedAsGiven) {
  // 1e20 does not fit in int64: the error must be "out of range" and echo what was typed,
  // not a value produced by an overflowing conversion.
  try {
    parse_plan("cp=99999999999999999999");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    std::string what = e.what();
    EXPECT_EQ(e.field, "cp");
    EXPECT_NE(what.find("99999999999999999999"), std::string::npos) << what;
    EXPECT_EQ(what.find("-9223372036854775808"), std::string::npos) << what;
  }
}

TEST(PlanParse, JsonWithWrongTypeIsAnInputError) {
  // A number where cp_kind expects a string, next to a ulysses key, must still be bad input.
  json j = {{"cp", 8}, {"cp_kind", 5}, {"ulysses", 2}};
  EXPECT_THROW(plan_from_json(j, "plan.json"), InputError);
  EXPECT_THROW(plan_from_json(json{{"tp", json::array()}}, "plan.json"), InputError);
  EXPECT_THROW(plan_from_json(json::array(), "plan.json"), InputError);
}

TEST(PlanParse, UnknownKeySuggestsClosest) {
  try {
    parse_plan("tpp=2");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field, "tpp");
    EXPECT_NE(std::string(e.what()).find("did you mean 'tp'"), std::string::npos) << e.what();
  }
}

TEST(PlanParse, PrecisionFp32RoundTripsThroughTextAndJson) {
  Plan p = parse_plan("cp=2,precision=fp32");
  EXPECT_EQ(p.precision, Precision::fp32);
  EXPECT_NE(plan_to_string(p).find("precision=fp32"), std::string::npos) << plan_to_string(p);
  EXPECT_EQ(parse_plan(plan_to_string(p)).precision, Precision::fp32);
  json j = plan_to_json(p);
  EXPECT_EQ(j.at("precision"), "fp32");
  EXPECT_EQ(plan_from_json(j, "plan.json").precision, Precision::fp32);
  EXPECT_EQ(parse_plan("").precision, Precision::bf16) << "the default stays bf16";
  EXPECT_EQ(plan_to_string(parse_plan("")).find("precision"), std::string::npos) << "the default is not written";
}

TEST(PlanParse, BadPrecisionNamesTheKeyAndTheValidValues) {
  for (bool from_json : {false, true}) {
    try {
      if (from_json) plan_from_json(json{{"precision", "fp16"}}, "plan.json");
      else parse_plan("precision=fp16");
      FAIL() << "expected InputError";
    } catch (const InputError& e) {
      EXPECT_EQ(e.field, "precision");
      EXPECT_NE(std::string(e.what()).find("fp32|bf16|fp8"), std::string::npos) << e.what();
    }
  }
}

// ---- masks --------------------------------------------------------------------------------

TEST(PlanParse, DocumentMaskFixedAndList) {
  Plan f = parse_plan("mask=doc:4096");
  EXPECT_EQ(f.mask, MaskKind::document);
  EXPECT_EQ(f.docs.kind, DocLengths::Kind::fixed);
  EXPECT_EQ(f.docs.tokens, std::vector<int64_t>{4096});
  Plan l = parse_plan("mask=doc:1024/2048/8k");
  EXPECT_EQ(l.docs.kind, DocLengths::Kind::list);
  EXPECT_EQ(l.docs.tokens, (std::vector<int64_t>{1024, 2048, 8192}));
}

TEST(PlanParse, DocumentMaskHistogram) {
  Plan h = parse_plan("mask=doc:hist:1024@0.5/8192@0.25/65536@0.25");
  EXPECT_EQ(h.docs.kind, DocLengths::Kind::histogram);
  EXPECT_EQ(h.docs.tokens, (std::vector<int64_t>{1024, 8192, 65536}));
  ASSERT_EQ(h.docs.weights.size(), 3u);
  EXPECT_DOUBLE_EQ(h.docs.weights[0], 0.5);
  EXPECT_DOUBLE_EQ(h.docs.weights[1], 0.25);
  EXPECT_DOUBLE_EQ(h.docs.weights[2], 0.25);
}

TEST(PlanParse, HistogramFractionsMustSumToOne) {
  EXPECT_THROW(parse_plan("mask=doc:hist:1024@0.5/8192@0.4"), InputError);   // 0.9
  EXPECT_THROW(parse_plan("mask=doc:hist:1024@0.7/8192@0.4"), InputError);   // 1.1
  EXPECT_THROW(parse_plan("mask=doc:hist:1024@1.5/8192@-0.5"), InputError);  // negative
  EXPECT_THROW(parse_plan("mask=doc:hist:8192@0.5/1024@0.5"), InputError);   // edges decrease
  EXPECT_THROW(parse_plan("mask=doc:hist:1024"), InputError);                // no fraction
  EXPECT_THROW(parse_plan("mask=doc:"), InputError);
  EXPECT_THROW(parse_plan("mask=docs:1024"), InputError);
  EXPECT_NO_THROW(parse_plan("mask=doc:hist:1024@1"));
}

TEST(PlanParse, HistogramFractionsMustBeNumbers) {
  // NaN compares false with everything, so a sum check alone lets it through.
  EXPECT_THROW(parse_plan("mask=doc:hist:1024@nan"), InputError);
  EXPECT_THROW(parse_plan("mask=doc:hist:1024@0.5/2048@nan"), InputError);
  // Trailing text after the number is not a fraction.
  EXPECT_THROW(parse_plan("mask=doc:hist:1024@1junk"), InputError);
}

// ---- rank order ---------------------------------------------------------------------------

TEST(PlanParse, EveryOrderPermutationParses) {
  std::vector<std::string> dims = {"cp", "dp", "tp"};
  int n = 0;
  do {
    std::string text = dims[0] + "-" + dims[1] + "-" + dims[2];
    Plan p = parse_plan("order=" + text);
    EXPECT_EQ(order_to_string(p), text);
    ++n;
  } while (std::next_permutation(dims.begin(), dims.end()));
  EXPECT_EQ(n, 6);
}

TEST(PlanParse, OrderMustNameEachDimensionOnce) {
  EXPECT_THROW(parse_plan("order=tp-tp-dp"), InputError);
  EXPECT_THROW(parse_plan("order=tp-cp"), InputError);
  EXPECT_THROW(parse_plan("order=tp-cp-dp-tp"), InputError);
  EXPECT_THROW(parse_plan("order=tp-pp-dp"), InputError);
}

// ---- check_plan ---------------------------------------------------------------------------

// plan_valid (what the search asks of every plan, no text built) is check_plan(...).ok() and fills
// the plan the same way (dp, and ulysses where cp_kind=usp gives none), on a plan breaking each
// rule check_plan has (and a few that only warn), on several clusters and sequence lengths.
TEST(PlanCheck, PlanValidIsCheckPlanOkWithoutTheText) {
  const char* plans[] = {
      "", "dp=3,tp=2", "cp=3", "tp=2,sp=0,tp_overlap=1", "tp_overlap=1", "tp=2,tp_overlap=1", "pp=3", "pp=2,vpp=3", "vpp=2",
      "pp=2,vpp=2,ga=3", "pp=2,vpp=2,ga=4", "pp=2,ga=1", "pp=2,zero=2", "pp=4,pp_first=6,pp_last=6", "pp=4,pp_embed=1",
      "zero_shard=2", "zero=3,zero_shard=3", "zero=3,zero_shard=1", "zero=3,zero_shard=4", "tp=3", "tp=8", "cp=8,cp_kind=usp",
      "cp=8,cp_kind=usp,ulysses=3", "cp=8,cp_kind=ring,ulysses=2", "cp=8,cp_kind=ulysses,ulysses=4", "cp=6,cp_kind=ulysses",
      "cp=8,cp_kind=ulysses", "cp=8", "cp=8,pad=1", "cp=4,tp=2,cp_kind=allgather", "cp=8,cp_layout=headtail-doc",
      "ckpt_offload=1", "param_offload=1", "zero=3,param_offload=1", "tiled_mlp=1048576", "tiled_loss=1048576",
      "precision=fp8", "sp=1", "zero=1", "mask=explicit", "cp=8,mask=doc:4096,cp_layout=headtail-doc"};
  int valid = 0, invalid = 0;
  for (const char* where : {"8xh100", "dgx-a100", "6"})
    for (int64_t seq : {int64_t{131072}, int64_t{131000}, int64_t{0}, int64_t{4}})
      for (const char* text : plans) {
        const ClusterSpec c = std::string(where) == "6" ? make_cluster(resolve_hardware(profiles(), "h100"), 1, 6) : cluster(where);
        const Plan given = parse_plan(text);
        Plan a = given, b = given;
        const bool ok = plan_valid(a, model("Llama-3.1-8B"), c, seq);
        const PlanCheck r = check_plan(b, model("Llama-3.1-8B"), c, seq);
        EXPECT_EQ(ok, r.ok()) << text << " on " << where << " at " << seq << ": " << r.message();
        EXPECT_EQ(plan_to_string(a), plan_to_string(b)) << text;
        EXPECT_EQ(a.dp, b.dp) << text;
        EXPECT_EQ(a.ulysses, b.ulysses) << text;
        (ok ? valid : invalid) += 1;
      }
  EXPECT_GT(valid, 20);
  EXPECT_GT(invalid, 100);
}

TEST(PlanCheck, WorldSizeMismatchIsAnErrorWithNearestDp) {
  ModelSpec m = model("Llama-3.1-8B");
  Plan p = parse_plan("dp=3,tp=2");
  PlanCheck r = check_plan(p, m, cluster("8xh100"), 131072);
  EXPECT_FALSE(r.ok());
  // 8 GPUs / (tp 2 * cp 1) = 4
  EXPECT_NE(std::find(r.alternatives.begin(), r.alternatives.end(), "dp=4"), r.alternatives.end()) << r.message();
}

TEST(PlanCheck, CpThatCannotFillTheGpusIsAnError) {
  ModelSpec m = model("Llama-3.1-8B");
  Plan p = parse_plan("cp=3");
  PlanCheck r = check_plan(p, m, cluster("8xh100"), 131072);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(count_containing(r.errors, "does not divide"), 1) << r.message();
}

TEST(PlanCheck, TpMustDivideHeads) {
  // Llama-3.1-8B: 32 heads, 8 KV heads, ffn 14336 = 2^11 * 7. tp=3 divides none of the heads; on 12
  // GPUs the valid tps dividing 32 and 12 are 1, 2, 4: nearest to 3 are 2 and 4.
  ModelSpec m = model("Llama-3.1-8B");
  Plan p = parse_plan("tp=3,zero=3,recompute=full");
  PlanCheck r = check_plan(p, m, make_cluster(resolve_hardware(profiles(), "h100"), 1, 12), 131072);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(count_containing(r.errors, "tp=3 must divide"), 1) << r.message();
  EXPECT_NE(std::find(r.alternatives.begin(), r.alternatives.end(), "tp=2"), r.alternatives.end()) << r.message();
  EXPECT_NE(std::find(r.alternatives.begin(), r.alternatives.end(), "tp=4"), r.alternatives.end()) << r.message();
}

TEST(PlanCheck, TpBeyondKvHeadsWarnsOfReplication) {
  // Llama-3.1-70B: 64 heads, 8 KV heads; tp=16 replicates each KV head on 16/8 = 2 ranks.
  ModelSpec m = model("Llama-3.1-70B");
  Plan p = parse_plan("tp=16,zero=3,recompute=full");
  PlanCheck r = check_plan(p, m, cluster("2x8xh100"), 131072);
  EXPECT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(count_containing(r.warnings, "replicated on 2 TP ranks"), 1);
  EXPECT_EQ(count_containing(r.warnings, "spans 2 nodes"), 1);  // 16 ranks over 8-GPU nodes
}

TEST(PlanCheck, UlyssesBeyondKvHeadsWarnsButRuns) {
  // 8B on 4x8xh100 with cp=32 Ulysses: 32 divides the 32 query heads; 32 > 8 KV heads, so each
  // KV head is replicated 32/8 = 4x (DeepSpeed's rule): a warning, not an error.
  ModelSpec m = model("Llama-3.1-8B");
  Plan p = parse_plan("cp=32,cp_kind=ulysses,zero=3,recompute=full");
  PlanCheck r = check_plan(p, m, cluster("4x8xh100"), 131072);
  EXPECT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(p.dp, 1);
  EXPECT_EQ(count_containing(r.warnings, "replicated 4x"), 1) << r.warnings.size();
}

TEST(PlanCheck, UlyssesMustDivideQueryHeads) {
  ModelSpec m = model("Llama-3.1-8B");
  Plan p = parse_plan("cp=6,cp_kind=ulysses");
  PlanCheck r = check_plan(p, m, make_cluster(resolve_hardware(profiles(), "h100"), 1, 6), 6 * 20480);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.errors.size(), 1u) << r.message();
  // valid Ulysses degrees for 32 heads / 8 KV heads: 1, 2, 4, 8, 16, 32; nearest to 6: 4 and 8
  EXPECT_NE(std::find(r.alternatives.begin(), r.alternatives.end(), "cp=4"), r.alternatives.end()) << r.message();
  EXPECT_NE(std::find(r.alternatives.begin(), r.alternatives.end(), "cp=8"), r.alternatives.end()) << r.message();
}

TEST(PlanCheck, UspUlyssesMustDivideCp) {
  ModelSpec m = model("Llama-3.1-8B");
  Plan p = parse_plan("cp=8,cp_kind=usp,ulysses=3");
  PlanCheck r = check_plan(p, m, cluster("8xh100"), 131072);
  EXPECT_FALSE(r.ok());
  Plan missing = parse_plan("cp=8,cp_kind=usp");
  EXPECT_FALSE(check_plan(missing, m, cluster("8xh100"), 131072).ok());
  Plan stray = parse_plan("cp=8,cp_kind=ring,ulysses=2");
  PlanCheck s = check_plan(stray, m, cluster("8xh100"), 131072);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::find(s.alternatives.begin(), s.alternatives.end(), "cp_kind=usp"), s.alternatives.end());
  Plan good = parse_plan("cp=8,cp_kind=usp,ulysses=4");
  EXPECT_TRUE(check_plan(good, m, cluster("8xh100"), 131072).ok());
}

TEST(PlanCheck, ZigZagNeedsSeqDivisibleByTwoCp) {
  ModelSpec m = model("Llama-3.1-8B");
  Plan p = parse_plan("cp=8,cp_kind=zigzag");
  // 2*cp = 16; 131072 = 16 * 8192 is fine, 131000 is not: neighbours 16*8187 and 16*8188
  Plan ok = p;
  EXPECT_TRUE(check_plan(ok, m, cluster("8xh100"), 131072).ok());
  PlanCheck r = check_plan(p, m, cluster("8xh100"), 131000);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(std::find(r.alternatives.begin(), r.alternatives.end(), "--seq " + std::to_string(16 * 8187)),
            r.alternatives.end()) << r.message();
  EXPECT_NE(std::find(r.alternatives.begin(), r.alternatives.end(), "--seq " + std::to_string(16 * 8188)),
            r.alternatives.end()) << r.message();
  // A ring over cp=8 only needs seq divisible by 8: 131000 = 8 * 16375.
  Plan ring = parse_plan("cp=8,cp_kind=ring");
  EXPECT_TRUE(check_plan(ring, m, cluster("8xh100"), 131000).ok());
  EXPECT_EQ(seq_granule(parse_plan("cp=8,cp_kind=zigzag")), 16);
  EXPECT_EQ(seq_granule(parse_plan("cp=4,tp=2,cp_kind=ring")), 8);  // SP shards over tp too
}

TEST(PlanCheck, ParamOffloadNeedsZero3) {
  ModelSpec m = model("Llama-3.1-8B");
  Plan p = parse_plan("cp=8,zero=2,param_offload=1,recompute=full");
  PlanCheck r = check_plan(p, m, cluster("8xh100"), 131072);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(std::find(r.alternatives.begin(), r.alternatives.end(), "zero=3"), r.alternatives.end());
  Plan q = parse_plan("cp=8,zero=3,param_offload=1,recompute=full");
  EXPECT_TRUE(check_plan(q, m, cluster("8xh100"), 131072).ok());
}

TEST(PlanCheck, CheckpointOffloadNeedsFullRecompute) {
  ModelSpec m = model("Llama-3.1-8B");
  Plan p = parse_plan("cp=8,zero=3,ckpt_offload=1,recompute=selective");
  PlanCheck r = check_plan(p, m, cluster("8xh100"), 131072);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(std::find(r.alternatives.begin(), r.alternatives.end(), "recompute=full"), r.alternatives.end());
}

TEST(PlanCheck, AbsurdSequenceLengthsAreErrors) {
  ModelSpec m = model("Llama-3.1-8B");
  for (int64_t seq : {int64_t(0), int64_t(-5), (int64_t(1) << 34) + 1}) {
    Plan p = parse_plan("");
    EXPECT_FALSE(check_plan(p, m, cluster("8xh100"), seq).ok()) << seq;
  }
}

TEST(PlanCheck, Fp8NeedsFp8Hardware) {
  ModelSpec m = model("Llama-3.1-8B");
  Plan p = parse_plan("cp=8,precision=fp8");
  EXPECT_FALSE(check_plan(p, m, cluster("8xa100"), 131072).ok());
  Plan q = parse_plan("cp=8,precision=fp8");
  EXPECT_TRUE(check_plan(q, m, cluster("8xh100"), 131072).ok());
}

TEST(PlanCheck, CheckNeverThrowsOnNonsense) {
  ModelSpec m = model("Llama-3.1-8B");
  for (const char* text : {"cp=7,cp_kind=usp", "tp=5,cp=3", "dp=1000", "cp=1024,cp_kind=ulysses"}) {
    Plan p = parse_plan(text);
    EXPECT_NO_THROW({
      PlanCheck r = check_plan(p, m, cluster("8xh100"), 131072);
      EXPECT_FALSE(r.ok()) << text;
    });
  }
}

namespace ctx {
namespace {

// cycle and split:<k> run a ring per document or sub-pack: with an exchange that passes no K,V
// around a ring (allgather gathers once, a2a swaps heads) they mean nothing, so they are refused
// naming the key; native stays valid with every exchange.
TEST(PlanParse, RingVarlenStrategiesNeedARingExchange) {
  for (const char* kind : {"allgather", "ulysses"})
    for (const char* varlen : {"cycle", "split:4"}) {
      const std::string text = std::string("cp=4,cp_kind=") + kind + ",mask=doc:2048,cp_varlen=" + varlen;
      try {
        parse_plan(text, "--plan");
        ADD_FAILURE() << text << " accepted";
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("cp_varlen"), std::string::npos) << e.what();
      }
      EXPECT_NO_THROW(parse_plan(std::string("cp=4,cp_kind=") + kind + ",mask=doc:2048,cp_varlen=native", "--plan"));
    }
  EXPECT_NO_THROW(parse_plan("cp=4,cp_kind=usp,ulysses=2,mask=doc:2048,cp_varlen=cycle", "--plan"));
  EXPECT_NO_THROW(parse_plan("cp=4,cp_kind=ring,mask=doc:2048,cp_varlen=split:4", "--plan"));
}

// headtail-doc without documents is headtail: a warning says so (the plan stays valid).
TEST(PlanCheck, HeadtailDocWithoutDocumentsWarns) {
  Profiles pr = load_profiles(default_profiles_dir());
  Plan p = parse_plan("cp=4,cp_comm=p2p,cp_layout=headtail-doc", "--plan");
  PlanCheck c = check_plan(p, resolve_model(pr, "Llama-3.1-8B"), resolve_cluster(pr, "8xh100"), 65536);
  EXPECT_TRUE(c.ok()) << c.message();
  bool warned = false;
  for (auto& w : c.warnings) warned |= w.find("headtail-doc") != std::string::npos;
  EXPECT_TRUE(warned);
}

}  // namespace
}  // namespace ctx
