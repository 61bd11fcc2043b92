// Every JSON loader on fuzzed text. The first byte picks the loader (its value modulo 7):
//   0 model profile  1 Hugging Face config.json  2 hardware profile  3 runtime profile
//   4 cluster profile  5 plan file (ctxplan.plan/1)  6 GUI state (ctxplan.gui-state/1)
// the rest is the document. Seeds: profiles/ and tests/data, each prefixed with its loader's byte.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "costmodel/json_util.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/profile_store.hpp"
#include "gui/gui_state.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace {

const ctx::Profiles& profiles() {
  static const ctx::Profiles p = ctx::load_profiles(CTXPLAN_PROFILES_DIR);
  return p;
}

// The cluster loader reads a path (it is not exported on its own): the document goes to a file.
std::string cluster_file() {
  static const std::string path = "/tmp/ctxplan-fuzz-cluster-" + std::to_string(::getpid()) + ".json";
  return path;
}

void load(int which, const std::string& text) {
  const std::string where = "fuzz.json";
  if (which == 4) {
    std::ofstream(cluster_file(), std::ios::binary | std::ios::trunc) << text;
    (void)ctx::resolve_cluster(profiles(), cluster_file());
    return;
  }
  const ctx::json j = ctx::parse_json_text(text, where);
  switch (which) {
    case 0: {
      std::vector<std::string> aliases;
      (void)ctx::model_from_json(j, where, &aliases);
      break;
    }
    case 1: {
      ctx::ModelSpec m = ctx::model_from_hf_config(j, where);
      (void)ctx::model_to_hf_config(m);
      break;
    }
    case 2: (void)ctx::hardware_from_json(j, where); break;
    case 3: (void)ctx::runtime_from_json(j, where); break;
    case 5: {  // what `ctxplan predict --plan-file` reads
      ctx::JsonReader r(j, where);
      (void)r.string_or("schema", "");
      ctx::Plan p = ctx::plan_from_json(r.raw("plan"), where);
      if (r.has("seq")) (void)r.integer_in("seq", 1, int64_t(1) << 34);
      if (r.has("model")) (void)r.string("model");
      // a plan the file holds prints and reads back as itself
      ctx::Plan q = ctx::parse_plan(ctx::plan_to_string(p), "round-trip");
      CTX_FUZZ_EXPECT(ctx::plan_to_string(q) == ctx::plan_to_string(p));
      break;
    }
    case 6: {
      ctx::gui::GuiState s = ctx::gui::state_from_json(j, where, ctx::gui::default_state());
      (void)ctx::gui::state_to_json(s, true).dump();
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  try {
    load(data[0] % 7, ctx::fuzz::bytes(data + 1, size - 1));
  } catch (const ctx::InputError&) {
  }
  return 0;
}
