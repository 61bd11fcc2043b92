// compare's readers: a prediction (`ctxplan predict --json`) and a measurement (`ctxrun --report`)
// document, separated by the first NUL byte of the input (no NUL: the input is a ctxrun report
// that embeds its prediction, as `ctxplan compare run.json` reads it).
#include <cstring>

#include "costmodel/json_util.hpp"
#include "planner/compare.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all = ctx::fuzz::bytes(data, size);
  const size_t nul = all.find('\0');
  ctx::CompareOptions o;
  try {
    if (nul == std::string::npos) {
      const ctx::json run = ctx::parse_json_text(all, "run.json");
      if (!run.is_object() || !run.contains("prediction")) return 0;
      ctx::Comparison c = ctx::compare_documents(run["prediction"], "run.json", "prediction", run, "run.json", o);
      (void)ctx::comparison_table(c);
      (void)ctx::comparison_to_json(c).dump();
    } else {
      const ctx::json pred = ctx::parse_json_text(all.substr(0, nul), "pred.json");
      const ctx::json run = ctx::parse_json_text(all.substr(nul + 1), "run.json");
      ctx::Comparison c = ctx::compare_documents(pred, "pred.json", "", run, "run.json", o);
      (void)ctx::comparison_table(c);
      (void)ctx::comparison_to_json(c).dump();
    }
  } catch (const ctx::InputError&) {
  }
  return 0;
}
