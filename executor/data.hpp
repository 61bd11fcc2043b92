// Training data: packed token files in llm.c's format (a 256 x int32 header: magic 20240520,
// version 1, token count; then uint16 tokens), and a built-in generator of synthetic documents with
// long-range structure. Documents are separated by EOS; a sequence is a window of the packed stream,
// its labels are the next tokens (shifted before any sharding), positions restart per document
// under intra-document masking.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "executor/context_parallel.hpp"

namespace ctx::exec {

class Dataset {
 public:
  virtual ~Dataset() = default;
  // The packed sequence with this global index (deterministic: any rank can build any sequence).
  virtual Sequence sequence(int64_t index) const = 0;
  virtual std::string describe() const = 0;
};

struct DataOptions {
  int64_t seq = 0;
  int64_t vocab = 0;
  int32_t eos = -1;           // -1: vocab - 1 (synthetic) / 50256 when the vocabulary has it (files)
  bool doc_mask = false;      // intra-document masking and per-document positions
  uint64_t seed = 1234;
  int64_t doc_min = 0, doc_max = 0;  // synthetic document lengths (0: seq/8 .. seq/2)
};

// Throws InputError naming the file on a bad header, a truncated file or out-of-vocabulary tokens.
std::unique_ptr<Dataset> open_token_file(const std::string& path, const DataOptions& o);
// The same reader over a file's bytes (`path` names them in errors); the header's token count is
// checked against the bytes present before anything is sized from it.
std::unique_ptr<Dataset> parse_token_file(const std::string& bytes, const std::string& path, const DataOptions& o);
std::unique_ptr<Dataset> make_synthetic(const DataOptions& o);
// Writes tokens in llm.c's format (used by tests and to export the synthetic corpus).
void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens);

// Attention work of a sequence under its mask: sum over documents of len^2 (causal: seq^2).
double attention_work(const Sequence& s);

// Which global sequences each data-parallel rank trains on in one step: [dp][ga*mbs] indices.
// Plain: consecutive. Sorted packing: the step's sequences dealt so each rank's attention work is
// balanced (largest first, to the least-loaded rank with room), as GLM-4 did.
std::vector<std::vector<int64_t>> step_assignment(const Dataset& d, int64_t step, int64_t dp, int64_t per_rank,
                                                  bool sorted);

}  // namespace ctx::exec
