// The plan-string parser (`--plan "tp=8,cp=4,..."`) on fuzzed text, with the round-trip property:
// a string that parses prints (plan_to_string) to a string that parses to the same plan, and the
// plan's JSON form (plan_to_json -> plan_from_json) reads back to the same plan.
#include <cstdio>
#include <cstdlib>

#include "costmodel/plan.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = ctx::fuzz::bytes(data, size);
  ctx::Plan p;
  try {
    p = ctx::parse_plan(text, "--plan");
  } catch (const ctx::InputError&) {
    return 0;
  }
  const std::string s = ctx::plan_to_string(p);
  ctx::Plan q, r;
  try {
    q = ctx::parse_plan(s, "round-trip");
    r = ctx::plan_from_json(ctx::plan_to_json(p), "round-trip");
  } catch (const ctx::InputError& e) {
    std::fprintf(stderr, "plan '%s' printed as '%s', which does not read back: %s\n", text.c_str(), s.c_str(), e.what());
    std::abort();
  }
  CTX_FUZZ_EXPECT(ctx::plan_to_string(q) == s);
  CTX_FUZZ_EXPECT(ctx::plan_to_string(r) == s);
  return 0;
}
