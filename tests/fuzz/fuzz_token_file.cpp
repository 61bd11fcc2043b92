// ctxrun's llm.c token-file reader (--data) on fuzzed bytes, then a few sequences read from it.
#include "executor/data.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ctx::exec::DataOptions o;
  o.seq = 16;
  o.vocab = 50304;
  o.doc_mask = size % 2 == 1;
  try {
    auto d = ctx::exec::parse_token_file(ctx::fuzz::bytes(data, size), "fuzz.bin", o);
    for (int64_t i = 0; i < 3; ++i) {
      ctx::exec::Sequence s = d->sequence(i);
      CTX_FUZZ_EXPECT(static_cast<int64_t>(s.tokens.size()) == o.seq);
    }
  } catch (const ctx::InputError&) {
  }
  return 0;
}
