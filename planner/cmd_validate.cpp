// `ctxplan validate`: every reference point the repo carries (profiles/validation/, copied with
// sources from published papers, framework docs and benchmark tables) predicted and compared:
// step time, tokens/s, TFLOPS and MFU as each source defines them, and the longest trainable
// sequence. Prints predicted vs published with the error, and the geometric-mean error per metric.
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "costmodel/attention_kernels.hpp"
#include "costmodel/prediction.hpp"
#include "planner/commands.hpp"
#include "costmodel/exit_codes.hpp"
#include "planner/format.hpp"
#include "planner/job_args.hpp"
#include "planner/validation_points.hpp"

namespace ctx {

std::function<int()> add_validate_command(CLI::App& app, CommonOptions& common) {
  struct Args {
    bool json = false, markdown = false;
    std::string only, update_doc;
  };
  auto a = std::make_shared<Args>();
  app.add_flag("--json", a->json, "print every row and the summary as JSON");
  app.add_flag("--markdown", a->markdown,
               "print docs/VALIDATION.md's generated tables (max sequence fit and check, step time fit, check points, summary), "
               "each between its markers");
  app.add_option("--update-doc", a->update_doc,
                 "rewrite the generated tables of this Markdown file in place (between its '<!-- ctxplan validate --markdown: NAME' "
                 "and '<!-- end NAME -->' markers), e.g. docs/VALIDATION.md");
  app.add_option("--only", a->only, "only points whose id contains this text (e.g. alst, nemo, tt-)");
  app.footer("Reads profiles/validation/published_time.jsonl and alst_maxseq.jsonl. docs/VALIDATION.md's tables are this "
             "command's: `ctxplan validate --update-doc docs/VALIDATION.md` rewrites them. "
             "A point's role is fit (its residual is the runtime's error band) or check (only compared); the summary gives "
             "each metric's geometric mean over all points and, where both kinds exist, over each apart.");
  return [a, &common]() {
    if (!a->update_doc.empty() && !a->only.empty())
      throw InputError("--update-doc", "", "rewrites every table from every point; drop --only (or print a subset with --markdown --only)");
    Profiles profiles = load_profiles(common.profiles.empty() ? default_profiles_dir() : common.profiles);
    const std::string dir = profiles.dir + "/validation/";
    struct Row {
      std::string id, metric;
      double published, predicted;
      std::string plan, note, attention, role;
      std::string model, source_plan;  // for the Markdown tables: the model, the plan as the point states it
      int64_t gpus = 0, seq = 0;
      std::string gpu;
      double predicted_step = 0, implied_step = 0;  // time metrics: the predicted step, the step the published number implies
      double out_of_sample = 0;  // the prediction out of sample: a calibrated runtime's fit point's leave-one-out, else predicted
      bool loo = false;          // out_of_sample comes from the calibration record's leave-one-out fit
      double failed = 0;         // max_seq_tokens: the shortest length the source states failed (0: none stated)
      // predicted (in or out of sample) over what it is compared with: published, or a max-seq bracket's nearer end
      double ratio(double v) const { return metric == "max_seq_tokens" ? max_seq_error_ratio(v, published, failed) : v / published; }
    };
    std::vector<Row> rows;
    for (const PublishedTimeRow& p : predict_published_time(profiles, a->only, ""))
      rows.push_back({p.id, p.metric, p.published, p.predicted, p.plan, p.note, p.attention, p.role, p.model, p.source_plan, p.gpus,
                      p.seq, p.gpu, p.time_metric ? p.predicted_step_seconds : 0.0,
                      p.time_metric ? p.predicted_step_seconds * std::exp(p.step_log_ratio) : 0.0, p.predicted_out_of_sample,
                      p.leave_one_out});
    for (const json& pt : read_jsonl(dir + "alst_maxseq.jsonl")) {
      JsonReader r(pt, dir + "alst_maxseq.jsonl");
      std::string id = r.string("id") + ":max_seq_tokens";
      if (!a->only.empty() && id.find(a->only) == std::string::npos) continue;
      ModelSpec m = resolve_model(profiles, r.string("model"));
      ClusterSpec c = resolve_cluster(profiles, r.string("cluster"));
      // a runtime variant (<runtime>@<variant>: a framework version, e.g. Liger-Kernel >= 0.6.1) is a fact of
      // the point's source like its kernel: quoted in runtime_source
      if (r.string("runtime").find('@') != std::string::npos && r.string_or("runtime_source", "").empty())
        r.fail("runtime_source", "a point's runtime variant must quote where its source states the framework version");
      RuntimeProfile rt = resolve_runtime(profiles, r.string("runtime"));
      // the attention implementation, where the point's source states it (quoted in attention_source), as in
      // published_time.jsonl: the same input as --attention; otherwise the runtime's default
      if (r.has("attention")) {
        if (r.string_or("attention_source", "").empty())
          r.fail("attention_source", "a point's attention must quote where its source states the kernel");
        rt = with_attention(std::move(rt), r.string("attention"), dir + "alst_maxseq.jsonl", id + ": attention");
      }
      Plan plan = parse_plan(r.string("plan"), id + ": plan");
      double published = r.number("published_max_seq_tokens");
      // the shortest length the source states failed, quoted in failed_source: the limit lies in [published, failed)
      double failed = 0;
      if (r.has("published_failed_seq_tokens")) {
        failed = r.number("published_failed_seq_tokens");
        if (r.string_or("failed_source", "").empty())
          r.fail("failed_source", "a point's published_failed_seq_tokens must quote where its source states the length failed");
        if (!(failed > published))
          r.fail("published_failed_seq_tokens", "must be above published_max_seq_tokens (" + fixed(published, 0) +
                                                    "): the limit lies between the length that ran and the one that failed");
      }
      PlanCheck chk = check_plan(plan, m, c, seq_granule(plan) * 1024);
      if (!chk.ok()) throw InputError(dir + "alst_maxseq.jsonl", id, chk.message());
      int64_t s = max_trainable_seq(m, c, rt, plan, static_cast<int64_t>(published * 4));
      rows.push_back({id, "max_seq_tokens", published, static_cast<double>(s), plan_to_string(plan), "",
                      find_attention_kernel(c, rt).name, point_role(r), m.name, r.string("plan"), world_size(c), 0, c.gpu.name, 0.0,
                      0.0, static_cast<double>(s), false, failed});
    }
    // geometric-mean |error| per metric: all points, and the fit and check points apart; in sample (the
    // prediction) and out of sample (a calibrated runtime's fit points at their leave-one-out fit)
    struct Sum {
      double in = 0, out = 0;
      int n = 0;
    };
    std::map<std::string, Sum> by_metric;                      // sum |ln ratio| in and out of sample, count
    std::map<std::pair<std::string, std::string>, Sum> by_role;  // (metric, role) -> the same
    for (auto& r : rows)
      if (r.predicted > 0 && r.published > 0 && r.out_of_sample > 0) {
        const double e = std::abs(std::log(r.ratio(r.predicted))), o = std::abs(std::log(r.ratio(r.out_of_sample)));
        for (Sum* x : {&by_metric[r.metric], &by_role[{r.metric, r.role}]}) x->in += e, x->out += o, x->n += 1;
      }
    auto geomean = [](const Sum& v) { return std::exp(v.in / v.n) - 1.0; };
    auto geomean_out = [](const Sum& v) { return std::exp(v.out / v.n) - 1.0; };
    auto pct = [](double predicted, double published) {
      return (predicted >= published ? "+" : "") + fixed(100.0 * (predicted / published - 1.0), 1) + "%";
    };
    // a row's error: against its published value, or for a max-seq bracket against the bracket ("in" inside it)
    auto row_pct = [&](const Row& r, double v) {
      const double q = r.ratio(v);
      if (r.failed > 0 && q == 1.0) return std::string("0% (in bracket)");
      return (q >= 1.0 ? "+" : "") + fixed(100.0 * (q - 1.0), 1) + "%";
    };
    auto published_text = [](const Row& r, int dec) {
      return fixed(r.published, dec) + (r.failed > 0 ? " (" + fixed(r.failed, 0) + " failed)" : "");
    };
    if (a->markdown || !a->update_doc.empty()) {
      // docs/VALIDATION.md's tables, each a block between markers (issue 16: regenerated by one command)
      auto num = [](double published, double v) {  // 2 decimals below 100, 1 where the published value has a fraction
        return fixed(v, published < 100 ? 2 : published != std::floor(published) ? 1 : 0);
      };
      auto seq_k = [](int64_t seq) { return seq % 1024 == 0 ? std::to_string(seq / 1024) + "K" : std::to_string(seq); };
      auto err = [&](const Row& r) { return pct(r.predicted, r.published) + (r.note.empty() ? "" : " (" + r.note + ")"); };
      std::vector<std::pair<std::string, std::string>> blocks;
      for (const char* role : {"fit", "check"}) {
        std::ostringstream o;
        o << "| point | GPUs | plan | published max | predicted max | error |\n|---|---|---|---|---|---|\n";
        for (auto& r : rows)
          if (r.metric == "max_seq_tokens" && r.role == role)
            o << "| " << r.id.substr(0, r.id.find(':')) << " | " << r.gpus << " | `" << r.source_plan << "` | " << published_text(r, 0)
              << " | " << fixed(r.predicted, 0) << " | " << row_pct(r, r.predicted) << " |\n";
        if (auto it = by_role.find({"max_seq_tokens", role}); it != by_role.end())
          o << "\nGeometric-mean |error| over these " << it->second.n << " " << role << " points: " << fixed(100.0 * geomean(it->second), 1)
            << "%.\n";
        blocks.push_back({std::string("maxseq-") + role, o.str()});
      }
      {
        std::ostringstream o;
        o << "| point | metric | attention | published | predicted | error | leave-one-out |\n|---|---|---|---:|---:|---:|---:|\n";
        for (auto& r : rows)
          if (r.metric != "max_seq_tokens" && r.role == "fit")
            o << "| " << r.id.substr(0, r.id.find(':')) << " | " << r.metric << " | " << r.attention << " | " << num(r.published, r.published)
              << " | " << num(r.published, r.predicted) << " | " << err(r) << " | " << (r.loo ? pct(r.out_of_sample, r.published) : "")
              << " |\n";
        blocks.push_back({"time-fit", o.str()});
      }
      {
        std::ostringstream o;
        o << "| point | model | GPUs | plan | seq | metric | published | predicted | error |\n|---|---|---|---|---:|---|---:|---:|---:|\n";
        for (auto& r : rows)
          if (r.metric != "max_seq_tokens" && r.role == "check")
            o << "| " << r.id.substr(0, r.id.find(':')) << " | " << r.model << " | " << r.gpus << " x " << r.gpu << " | `" << r.source_plan
              << "` | " << seq_k(r.seq) << " | " << r.metric << " | " << num(r.published, r.published) << " | "
              << num(r.published, r.predicted) << " | " << err(r) << " |\n";
        blocks.push_back({"check", o.str()});
      }
      {
        std::ostringstream o;
        o << "| metric | points | role | in sample | out of sample |\n|---|---:|---|---:|---:|\n";
        for (auto& [k, v] : by_metric) {
          const bool both = by_role.count({k, "fit"}) && by_role.count({k, "check"});
          if (both) o << "| " << k << " | " << v.n << " | all | " << fixed(100.0 * geomean(v), 1) << "% | " << fixed(100.0 * geomean_out(v), 1) << "% |\n";
          for (const char* role : {"fit", "check"})
            if (auto it = by_role.find({k, role}); it != by_role.end())
              o << "| " << k << " | " << it->second.n << " | " << role << " | " << fixed(100.0 * geomean(it->second), 1) << "% | "
                << fixed(100.0 * geomean_out(it->second), 1) << "% |\n";
        }
        blocks.push_back({"summary", o.str()});
      }
      const std::string begin = "<!-- ctxplan validate --markdown: ", end = "<!-- end ";
      if (a->update_doc.empty()) {
        for (auto& [name, body] : blocks) std::cout << begin << name << " -->\n" << body << end << name << " -->\n\n";
        return kExitOk;
      }
      std::ifstream in(a->update_doc);
      if (!in) throw InputError(a->update_doc, "", "cannot read the Markdown file to update");
      std::stringstream buf;
      buf << in.rdbuf();
      std::string doc = buf.str();
      for (auto& [name, body] : blocks) {
        const std::string open = begin + name + " -->", close = end + name + " -->";
        const size_t at = doc.find(open);
        if (at == std::string::npos)
          throw InputError(a->update_doc, name, "no '" + open + "' marker: put the block's two markers where its table goes");
        const size_t from = doc.find('\n', at) + 1, to = doc.find(close, from);
        if (from == 0 || to == std::string::npos) throw InputError(a->update_doc, name, "'" + open + "' has no '" + close + "' after it");
        doc.replace(from, to - from, body);
      }
      write_file_atomic(a->update_doc, doc);
      std::cout << "ctxplan validate: rewrote " << blocks.size() << " generated tables in " << a->update_doc << "\n";
      return kExitOk;
    }
    if (a->json) {
      json jr = json::array(), js = json::object();
      for (auto& r : rows) {
        json row = {{"id", r.id}, {"metric", r.metric}, {"published", r.published}, {"predicted", r.predicted},
                    {"error", r.ratio(r.predicted) - 1.0}, {"plan", r.plan}, {"note", r.note},
                    {"attention", r.attention},  // the kernel priced: the point's stated one, else the runtime's default
                    {"role", r.role}};
        // a step time or a rate: the predicted step, and the step the published number implies (a rate is
        // inverse to the step): what `ctxplan calibrate --runs` takes as the measurement
        if (r.implied_step > 0) row["predicted_step_seconds"] = r.predicted_step, row["implied_step_seconds"] = r.implied_step;
        if (r.loo) row["predicted_leave_one_out"] = r.out_of_sample;
        if (r.failed > 0) row["published_failed"] = r.failed;  // a max-seq bracket: the error is against [published, failed)
        jr.push_back(row);
      }
      for (auto& [k, v] : by_metric)
        js[k] = {{"points", v.n}, {"geomean_abs_error", geomean(v)}, {"geomean_abs_error_out_of_sample", geomean_out(v)}};
      for (auto& [k, v] : by_role)
        js[k.first][k.second] = {{"points", v.n}, {"geomean_abs_error", geomean(v)}, {"geomean_abs_error_out_of_sample", geomean_out(v)}};
      std::cout << json_dump(json{{"schema", "ctxplan.validation/1"}, {"rows", jr}, {"summary", js}}) << "\n";
      return kExitOk;
    }
    Table t;
    t.header = {"point", "role", "published", "predicted", "error", "leave-one-out", "plan"};
    for (auto& r : rows) {
      int dec = r.published < 100 ? 2 : 0;
      t.rows.push_back({r.id, r.role, published_text(r, dec), fixed(r.predicted, dec), row_pct(r, r.predicted),
                        r.loo ? pct(r.out_of_sample, r.published) : "", r.plan + (r.note.empty() ? "" : " (" + r.note + ")")});
    }
    std::cout << "ctxplan validate: " << rows.size() << " reference points (profiles/validation/)\n" << t.render() << "\n";
    Table s;
    s.header = {"metric", "points", "role", "geometric-mean |error|", "out of sample"};
    for (auto& [k, v] : by_metric) {
      const bool both = by_role.count({k, "fit"}) && by_role.count({k, "check"});
      if (both) s.rows.push_back({k, std::to_string(v.n), "all", fixed(100.0 * geomean(v), 1) + "%", fixed(100.0 * geomean_out(v), 1) + "%"});
      for (const char* role : {"fit", "check"})
        if (auto it = by_role.find({k, role}); it != by_role.end())
          s.rows.push_back({both ? "" : k, std::to_string(it->second.n), role, fixed(100.0 * geomean(it->second), 1) + "%",
                            fixed(100.0 * geomean_out(it->second), 1) + "%"});
    }
    std::cout << s.render()
              << "out of sample: a calibrated runtime's fit points predicted by the fit to its other points (its calibration "
                 "record's leave-one-out step); every other point is out of sample as predicted\n";
    return kExitOk;
  };
}

}  // namespace ctx
