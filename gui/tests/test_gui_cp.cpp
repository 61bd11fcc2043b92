// The explorer's context-parallel controls and per-rank work chart (issue 20), without a window:
// the chart's bars are the cost model's per-rank attention pairs (derived by hand for causal
// head-tail and contiguous placements; the expectation over the priced packs for a histogram; every
// kept pair computed once under each variable-length strategy), the controls change the selected
// plan's axes and its predicted step time as the library predicts it, a combination the cost model
// refuses shows the cost model's own reason, and a state file saved before the CP axes still loads.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <thread>

#include "costmodel/attention_work.hpp"
#include "costmodel/plan_check.hpp"
#include "app_settle.hpp"
#include "gui/app.hpp"
#include "gui/cp_choice.hpp"
#include "gui/cp_work.hpp"
#include "gui/gui_state.hpp"
#include "gui/plan_rows.hpp"
#include "gui/resolve_inputs.hpp"

namespace {

using namespace ctx;
using namespace ctx::gui;

const std::string kProfiles = std::string(CTXPLAN_SOURCE_DIR) + "/profiles";

const Profiles& profiles() {
  static Profiles p = load_profiles(kProfiles);
  return p;
}

using ctx::gui::test::settle;

// The selected plan of a job, checked (dp filled) as the App predicts it.
Plan checked_plan(const Inputs& in, const std::string& text, int64_t* seq) {
  const ResolvedJob job = resolve_inputs(profiles(), in);
  Plan p = selected_plan(job, text);
  const PlanCheck c = check_plan(p, job.model, job.cluster, job.seq_tokens);
  EXPECT_TRUE(c.ok()) << text << ": " << c.message();
  *seq = job.seq_tokens;
  return p;
}

Inputs histogram_inputs() {
  Inputs in = default_state().inputs;
  in.seq_tokens = 1 << 20;
  in.docs = DocMode::histogram;
  in.doc_bins = {{2048, 0.6}, {32768, 0.3}, {524288, 0.1}};
  return in;
}

// Mean over the priced packs of the pairs a causal mask keeps inside each document: l(l+1)/2.
double pairs_per_sequence(const Plan& p, int64_t seq) {
  const auto packs = priced_packs(p, seq);
  double total = 0;
  for (const auto& docs : packs)
    for (int64_t l : docs) total += static_cast<double>(l) * static_cast<double>(l + 1) / 2;
  return total / static_cast<double>(packs.size());
}

double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

// Causal, one document of s tokens, cp=8 head-tail: 16 chunks of c = s/16; rank i holds chunks i and
// 15-i. Queries of chunk j see j*c*c keys of earlier chunks and c(c+1)/2 inside their own, so rank i
// does (i + 15 - i)*c^2 + 2*c(c+1)/2 = 16c^2 + c pairs: the same on every rank.
TEST(CpWork, HeadTailGivesEveryRankTheSameCausalWork) {
  Inputs in = default_state().inputs;
  in.seq_tokens = 131072;
  int64_t seq = 0;
  const Plan p = checked_plan(in, "cp=8,cp_kind=zigzag", &seq);
  const CpWork w = cp_work(p, seq);
  const double c = 131072.0 / 16;
  ASSERT_EQ(w.pairs.size(), 8u);
  const std::vector<double> model = attention_pairs_per_rank(p, seq);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(w.pairs[i], model[i]) << "rank " << i << ": not the cost model's number";
    EXPECT_EQ(w.pairs[i], 16 * c * c + c) << "rank " << i;  // integers below 2^53: exact
  }
  EXPECT_EQ(w.imbalance, 0.0);
  EXPECT_FALSE(w.varlen_calls);
  EXPECT_EQ(w.packs, 1);
}

// Causal, contiguous over cp=8: rank i holds chunk i of C = s/8 and does i*C^2 + C(C+1)/2 pairs;
// the mean is 3.5C^2 + C(C+1)/2 and the last rank the max, so max/mean - 1 is about 0.875.
TEST(CpWork, ContiguousCausalWorkRisesByRank) {
  Inputs in = default_state().inputs;
  in.seq_tokens = 131072;
  int64_t seq = 0;
  const Plan p = checked_plan(in, "cp=8,cp_kind=ring", &seq);
  const CpWork w = cp_work(p, seq);
  const double C = 131072.0 / 8, diag = C * (C + 1) / 2;
  ASSERT_EQ(w.pairs.size(), 8u);
  const std::vector<double> model = attention_pairs_per_rank(p, seq);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(w.pairs[i], model[i]) << "rank " << i;
    EXPECT_EQ(w.pairs[i], static_cast<double>(i) * C * C + diag) << "rank " << i;
  }
  const double mean = 3.5 * C * C + diag;
  EXPECT_EQ(w.mean, mean);
  EXPECT_EQ(w.max, 7 * C * C + diag);
  // the ratio of two exact doubles: within a few ulps
  EXPECT_NEAR(w.imbalance, (7 * C * C + diag) / mean - 1, 1e-15);
}

// doc:hist: the bars are the expectation over the kPricedPacks packs the cost model samples (not the
// first pack), and every pair a document keeps is computed by exactly one rank, so the bars add up to
// the mean pairs per sequence (sums of ~1e10 in another order: relative 1e-12).
TEST(CpWork, ADocumentHistogramIsTheExpectationOverThePricedPacks) {
  int64_t seq = 0;
  const Plan p = checked_plan(histogram_inputs(), "cp=8,cp_kind=zigzag", &seq);
  const CpWork w = cp_work(p, seq);
  const std::vector<double> model = attention_pairs_per_rank(p, seq);
  ASSERT_EQ(w.pairs.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(w.pairs[i], model[i]) << "rank " << i;
  const auto packs = priced_packs(p, seq);
  EXPECT_EQ(w.packs, static_cast<int64_t>(packs.size()));
  ASSERT_GT(packs.size(), 1u);
  std::vector<double> mean(8, 0.0);
  for (const auto& docs : packs) {
    const std::vector<double> one = attention_pairs_per_rank(p, docs);
    for (size_t i = 0; i < 8; ++i) mean[i] += one[i] / static_cast<double>(packs.size());
  }
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(w.pairs[i], mean[i], 1e-12 * mean[i]) << "rank " << i;
  const std::vector<double> first = attention_pairs_per_rank(p, packs.front());
  EXPECT_GT(std::abs(sum(first) - sum(w.pairs)), 1e-6 * sum(w.pairs)) << "the packs are all alike: the test proves nothing";
  EXPECT_NEAR(sum(w.pairs), pairs_per_sequence(p, seq), 1e-12 * pairs_per_sequence(p, seq));
}

// cp_varlen=split:k (attention_work.hpp): document i of a pack goes to sub-pack i mod k, each
// sub-pack placed by the layout on its own. The bars are that, averaged over the priced packs;
// cycle runs the ring once per document. Either way every kept pair is computed once.
TEST(CpWork, VariableLengthStrategiesComputeEveryPairOnce) {
  int64_t seq = 0;
  const Plan split = checked_plan(histogram_inputs(), "cp=8,cp_comm=p2p,cp_layout=headtail-doc,cp_varlen=split:4", &seq);
  const CpWork w = cp_work(split, seq);
  EXPECT_TRUE(w.varlen_calls);
  const auto packs = priced_packs(split, seq);
  std::vector<double> expected(8, 0.0);
  for (const auto& docs : packs) {
    std::vector<std::vector<int64_t>> sub(4);
    for (size_t i = 0; i < docs.size(); ++i) sub[i % 4].push_back(docs[i]);
    for (const auto& s : sub) {
      if (s.empty()) continue;
      const std::vector<double> one = attention_pairs_per_rank(split, s);
      for (size_t r = 0; r < 8; ++r) expected[r] += one[r] / static_cast<double>(packs.size());
    }
  }
  ASSERT_EQ(w.pairs.size(), 8u);
  for (size_t r = 0; r < 8; ++r) EXPECT_NEAR(w.pairs[r], expected[r], 1e-12 * expected[r]) << "rank " << r;
  EXPECT_NEAR(sum(w.pairs), pairs_per_sequence(split, seq), 1e-12 * pairs_per_sequence(split, seq));

  const Plan cycle = checked_plan(histogram_inputs(), "cp=8,cp_kind=zigzag,cp_varlen=cycle", &seq);
  const CpWork c = cp_work(cycle, seq);
  EXPECT_TRUE(c.varlen_calls);
  EXPECT_NEAR(sum(c.pairs), pairs_per_sequence(cycle, seq), 1e-12 * pairs_per_sequence(cycle, seq));
  // head-tail inside every document balances each causal document: ranks within 1% of each other
  EXPECT_LT(c.imbalance, 0.01);
}

// An App (no search) on these inputs with this plan selected, settled.
std::unique_ptr<App> app_with(const Inputs& in, const std::string& plan) {
  auto app = std::make_unique<App>(kProfiles);
  app->state.run_search = false;
  app->state.inputs = in;
  app->inputs_changed(0);
  settle(*app, 0);
  app->select_plan(plan);
  settle(*app, 1);
  return app;
}

// The layout control rewrites the selected plan (its other keys kept) and the App predicts the
// new one exactly as the library does; a contiguous causal ring is slower than head-tail, whose
// last rank does 1.875x the mean attention work.
TEST(CpControls, ChangingTheLayoutChangesThePlanAndItsStepTime) {
  Inputs in = default_state().inputs;
  in.seq_tokens = 131072;
  const auto app_owner = app_with(in, "cp=8,cp_kind=zigzag,zero=3,recompute=full");
  App& app = *app_owner;
  ASSERT_TRUE(app.errors.empty()) << app.errors.begin()->second.message;
  ASSERT_FALSE(app.time_pending);
  EXPECT_EQ(app.cp_choice.layout, CpLayout::headtail);
  const double headtail_s = app.prediction.time.step_seconds;

  CpChoice c = app.cp_choice;
  c.layout = CpLayout::contiguous;
  app.choose_cp(c);
  settle(app, 2);
  ASSERT_TRUE(app.errors.empty()) << app.errors.begin()->second.message;
  EXPECT_EQ(app.prediction.plan.cp_layout, CpLayout::contiguous);
  EXPECT_EQ(app.prediction.plan.cp_comm, CpComm::p2p);
  EXPECT_EQ(app.prediction.plan.zero, 3);
  EXPECT_EQ(app.prediction.plan.recompute, Recompute::full);
  EXPECT_NE(app.state.plan.find("cp_kind=ring"), std::string::npos) << app.state.plan;  // p2p + contiguous
  const Prediction ref = predict(app.job->model, app.job->cluster, app.job->runtime, selected_plan(*app.job, app.state.plan), 131072);
  EXPECT_DOUBLE_EQ(app.prediction.time.step_seconds, ref.time.step_seconds);
  EXPECT_GT(app.prediction.time.step_seconds, headtail_s);
  EXPECT_NEAR(app.rank_work.imbalance, 0.875, 1e-3);

  // all-gather with the layout the control keeps
  c.comm = CpComm::allgather;
  app.choose_cp(c);
  settle(app, 3);
  ASSERT_TRUE(app.errors.empty()) << app.errors.begin()->second.message;
  EXPECT_EQ(app.prediction.plan.cp_comm, CpComm::allgather);
  EXPECT_EQ(app.prediction.plan.cp_layout, CpLayout::contiguous);
}

// cp_varlen without a document mask: the parser's own error, shown as the plan's error; the last
// valid plan's prediction stays and the control shows the pick. With a document mask it is valid.
TEST(CpControls, AnInvalidCombinationShowsTheCostModelsReason) {
  Inputs in = default_state().inputs;
  in.seq_tokens = 131072;
  const auto app_owner = app_with(in, "cp=8,cp_kind=zigzag");
  App& app = *app_owner;
  ASSERT_TRUE(app.have_prediction);
  const std::string before = plan_to_string(app.prediction.plan);
  CpChoice c = app.cp_choice;
  c.varlen = CpVarlen::Kind::cycle;
  app.choose_cp(c);
  settle(app, 2);
  ASSERT_EQ(app.errors.count("plan"), 1u);
  std::string reason;
  try {
    parse_plan("dp=1,tp=1,cp=8,cp_kind=zigzag,cp_varlen=cycle", "selected plan");
  } catch (const InputError& e) {
    reason = e.what();
  }
  ASSERT_FALSE(reason.empty()) << "the parser accepts cp_varlen without a document mask";
  EXPECT_EQ(app.errors["plan"].message, reason);
  EXPECT_EQ(app.errors["plan"].field, "cp_varlen");
  EXPECT_EQ(app.cp_choice.varlen, CpVarlen::Kind::cycle);
  EXPECT_EQ(app.cp_choice_from, App::CpChoiceFrom::pick) << "the controls keep showing the pick";
  EXPECT_EQ(plan_to_string(app.prediction.plan), before) << "the last valid plan's prediction stays";
  c.varlen = CpVarlen::Kind::native;
  app.choose_cp(c);
  settle(app, 3);
  EXPECT_EQ(app.errors.count("plan"), 0u);

  // a2a+p2p needs its Ulysses degree: plan_check's words
  c.comm = CpComm::a2a_p2p;
  c.ulysses = 0;
  app.choose_cp(c);
  settle(app, 4);
  ASSERT_EQ(app.errors.count("plan"), 1u);
  Plan usp = selected_plan(*app.job, app.state.plan);
  const PlanCheck check = check_plan(usp, app.job->model, app.job->cluster, app.job->seq_tokens);
  ASSERT_FALSE(check.ok());
  EXPECT_NE(app.errors["plan"].message.find(check.message()), std::string::npos) << app.errors["plan"].message;
  c.ulysses = 2;
  app.choose_cp(c);
  settle(app, 5);
  EXPECT_EQ(app.errors.count("plan"), 0u);
  EXPECT_EQ(ulysses_degree(app.prediction.plan), 2);
  c.comm = CpComm::p2p;  // the Ulysses degree belongs to a2a+p2p: dropped with it
  app.choose_cp(c);
  settle(app, 6);
  EXPECT_EQ(app.errors.count("plan"), 0u);
  EXPECT_EQ(app.prediction.plan.cp_comm, CpComm::p2p);

  // the same strategies are valid with documents in the inputs (the text need not name the mask)
  Inputs docs = histogram_inputs();
  const auto doc_app_owner = app_with(docs, "cp=8,cp_kind=zigzag,zero=3,recompute=full");
  App& doc_app = *doc_app_owner;
  CpChoice d = doc_app.cp_choice;
  d.layout = CpLayout::headtail_doc;
  d.varlen = CpVarlen::Kind::split;
  d.split_k = 4;
  doc_app.choose_cp(d);
  settle(doc_app, 2);
  ASSERT_TRUE(doc_app.errors.empty()) << doc_app.errors.begin()->second.message;
  EXPECT_EQ(doc_app.prediction.plan.cp_layout, CpLayout::headtail_doc);
  EXPECT_EQ(doc_app.prediction.plan.cp_varlen, (CpVarlen{CpVarlen::Kind::split, 4}));
  EXPECT_TRUE(doc_app.rank_work.varlen_calls);
  d.split_k = 1;  // the parser's bound, k >= 2
  doc_app.choose_cp(d);
  settle(doc_app, 3);
  ASSERT_EQ(doc_app.errors.count("plan"), 1u);
  EXPECT_EQ(doc_app.errors["plan"].field, "cp_varlen");
  // typed text naming cp_varlen without the mask parses with the inputs' documents
  doc_app.select_plan("cp=8,cp_kind=zigzag,cp_varlen=cycle");
  settle(doc_app, 4);
  EXPECT_TRUE(doc_app.errors.empty()) << doc_app.errors.begin()->second.message;
  EXPECT_EQ(doc_app.prediction.plan.cp_varlen.kind, CpVarlen::Kind::cycle);
  // a plan text whose own mask the inputs replace by causal: the combination is refused too
  const auto causal_owner = app_with(default_state().inputs, "cp=8,cp_kind=zigzag,mask=doc:8192,cp_varlen=cycle");
  App& causal = *causal_owner;
  ASSERT_EQ(causal.errors.count("plan"), 1u);
  EXPECT_EQ(causal.errors["plan"].field, "cp_varlen");
  // typed text that does not parse: the controls show the last valid plan's axes (and say so)
  EXPECT_EQ(causal.cp_choice_from, App::CpChoiceFrom::last_valid);
  EXPECT_EQ(causal.cp_choice.varlen, causal.prediction.plan.cp_varlen.kind);
}

// A state file written before the CP axes (the format of gui_state.cpp before issue 20: plan with
// cp_kind only, sort column 6 = peak, cp_kinds constraints) still loads; cp_kind=allgather now means
// allgather + headtail (docs/CONTEXT_PARALLEL.md), and the plan predicts without an error.
TEST(GuiStateCp, AStateSavedBeforeTheCpAxesStillLoads) {
  const std::string path = std::string(CTXPLAN_SOURCE_DIR) + "/gui/tests/data/gui_state_before_cp_axes.json";
  const GuiState s = state_from_json(read_json_file(path), path, default_state());
  EXPECT_EQ(s.plan, "cp=8,cp_kind=allgather,zero=3,recompute=full,tiled_loss=2048");
  EXPECT_EQ(static_cast<PlanColumn>(s.view.sort_column), PlanColumn::peak);
  EXPECT_STREQ(column_name(static_cast<PlanColumn>(s.view.sort_column)), "peak GiB");
  EXPECT_EQ(s.inputs.cp_kinds, (std::array<bool, kCpKinds>{false, true, true, false, false}));
  App app(kProfiles);
  app.state = s;
  app.state.run_search = false;
  app.inputs_changed(0);
  settle(app, 0);
  ASSERT_TRUE(app.errors.empty()) << app.errors.begin()->second.message;
  EXPECT_EQ(app.prediction.plan.cp_comm, CpComm::allgather);
  EXPECT_EQ(app.prediction.plan.cp_layout, CpLayout::headtail);
  EXPECT_EQ(app.cp_choice.comm, CpComm::allgather);
  EXPECT_EQ(app.cp_choice.layout, CpLayout::headtail);
}

// The new fields (the plan's CP axes, the CP work tab) survive a save and a load.
TEST(GuiStateCp, TheCpAxesAndTheCpWorkTabRoundTrip) {
  GuiState s = default_state();
  s.inputs = histogram_inputs();
  s.plan = "cp=8,cp_comm=a2a+p2p,cp_layout=headtail-doc,ulysses=2,cp_varlen=split:3,zero=3";
  s.view.tab = "cpwork";
  const json j = state_to_json(s);
  const GuiState back = state_from_json(j, "x", default_state());
  EXPECT_EQ(state_to_json(back), j);
  EXPECT_EQ(back.view.tab, "cpwork");
  const ResolvedJob job = resolve_inputs(profiles(), back.inputs);
  const Plan p = selected_plan(job, back.plan);
  EXPECT_EQ(p.cp_comm, CpComm::a2a_p2p);
  EXPECT_EQ(p.cp_layout, CpLayout::headtail_doc);
  EXPECT_EQ(p.ulysses, 2);
  EXPECT_EQ(p.cp_varlen, (CpVarlen{CpVarlen::Kind::split, 3}));
  // the controls' text for the same axes is the same plan
  const CpChoice c = cp_choice_of(p);
  EXPECT_EQ(plan_to_string(selected_plan(job, plan_text_with(p, c))), plan_to_string(p));
}

// The plan table's CP layout and varlen columns: the plan's values, "-" where they do not apply,
// and sorting by them groups the rows by name.
TEST(GuiStateCp, ThePlanTableShowsAndSortsByLayoutAndVarlen) {
  PlanTable t;
  for (const char* text : {"cp=4,cp_comm=p2p,cp_layout=headtail-doc,mask=doc:4096,cp_varlen=cycle", "cp=4,cp_kind=ring,mask=doc:4096",
                           "cp=1", "cp=4,cp_kind=zigzag,mask=doc:4096,cp_varlen=split:2"}) {
    PlanRow r;
    r.plan = parse_plan(text);
    r.text = plan_to_string(r.plan);
    t.rows.push_back(r);
  }
  EXPECT_EQ(layout_cell(t.rows[0].plan), "headtail-doc");
  EXPECT_EQ(varlen_cell(t.rows[0].plan), "cycle");
  EXPECT_EQ(layout_cell(t.rows[2].plan), "-");
  EXPECT_EQ(varlen_cell(t.rows[2].plan), "-");
  EXPECT_EQ(varlen_cell(t.rows[3].plan), "split:2");
  EXPECT_EQ(table_order(t, "", false, PlanColumn::cp_layout, false), (std::vector<int>{2, 1, 3, 0}));
  EXPECT_EQ(table_order(t, "", false, PlanColumn::cp_varlen, true), (std::vector<int>{3, 1, 0, 2}));
}

}  // namespace
