// Hostile files and faults in ctxrun (issue 17): damaged safetensors, token files and checkpoint
// indexes are bad input (exit 2, the file and field named), never a heap overflow, a runaway
// allocation, an "internal error", a "diverged" or a silent success; no save removes the checkpoint
// `latest` names; a dangling `latest` falls back to the newest complete checkpoint; an unwritable
// --ckpt-dir is refused before the first step. Each test says what happened before the fix.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "costmodel/errors.hpp"
#include "costmodel/exit_codes.hpp"
#include "executor/data.hpp"
#include "executor/rope.hpp"
#include "executor/safetensors.hpp"
#include "executor/tests/ctxrun_cli.hpp"

namespace fs = std::filesystem;
using ctx::exec::testing::ctxrun;
using ctx::exec::testing::Result;
using ctx::exec::testing::sh;
using nlohmann::json;

namespace {

fs::path scratch(const std::string& name) { return ctx::exec::testing::scratch("ctxrun_hostile", name); }
using ctx::exec::testing::slurp;

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }
#define EXPECT_HAS(text, needle) EXPECT_TRUE(contains(text, needle)) << "missing \"" << (needle) << "\" in:\n" << (text)

// A safetensors file with one header (given as JSON text) and `data` bytes after it.
std::string safetensors_with(const std::string& header, const std::string& data) {
  std::string h = header;
  while (h.size() % 8) h += ' ';
  std::string out(8, '\0');
  uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  return out + h + data;
}

// The InputError message of parsing `bytes`, or "" when it parsed.
std::string safetensors_error(const std::string& bytes) {
  try {
    ctx::exec::parse_safetensors(bytes, "w.safetensors");
  } catch (const ctx::InputError& e) {
    return e.what();
  }
  return "";
}

const std::string kSmallRun = "--model tiny --seq 64 --plan precision=fp32 ";

}  // namespace

// Before: an F32 buffer was sized bytes/4 and `bytes` were copied into it: 5 bytes overran the heap
// by one (a segfault on --resume/--init-from with 1-3 extra bytes).
TEST(HostileFiles, SafetensorsByteLengthMustEqualDtypeTimesShape) {
  for (const char* dt : {"F32", "BF16", "F16"}) {
    const std::string header = std::string(R"({"w":{"dtype":")") + dt + R"(","shape":[1],"data_offsets":[0,5]}})";
    const std::string msg = safetensors_error(safetensors_with(header, std::string(5, '\1')));
    EXPECT_HAS(msg, "w.safetensors");
    EXPECT_HAS(msg, "w.data_offsets");
    EXPECT_HAS(msg, "holds 5 bytes");
  }
  // the matching length reads back the values written
  float x = 1.5f;
  std::string ok = safetensors_with(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                    std::string(reinterpret_cast<const char*>(&x), 4));
  auto t = ctx::exec::parse_safetensors(ok, "w.safetensors");
  ASSERT_EQ(t.at("w").size(), 1u);
  EXPECT_EQ(t.at("w")[0], 1.5f);
}

// Before: a missing data_offsets, a non-object entry or offsets of the wrong type escaped as
// nlohmann exceptions (exit 1, "internal error"), and wrapped offsets were taken.
TEST(HostileFiles, SafetensorsHeaderEntriesAreCheckedBeforeAnyCopy) {
  const std::string data(8, '\0');
  for (const char* header : {R"({"w":{"dtype":"F32","shape":[2]}})",                                  // no offsets
                             R"({"w":[1,2,3]})",                                                      // not an object
                             R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})",             // wrapped
                             R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,"8"]}})",           // a string
                             R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}})",  // past the end
                             R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",            // negative dim
                             R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",  // overflow
                             R"({"w":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})",                 // dtype a number
                             R"([1,2])"}) {                                                           // not an object
    const std::string msg = safetensors_error(safetensors_with(header, data));
    EXPECT_HAS(msg, "w.safetensors");
  }
  // a header length beyond the file, and a file shorter than the length field
  EXPECT_HAS(safetensors_error(std::string(8, '\xff')), "bad header length");
  EXPECT_HAS(safetensors_error("abc"), "bad header length");
}

// Before: the token count in the header was allocated (up to 4 GB per rank) before the file's size
// was looked at. Under a 1 GiB address-space limit that allocation failed (std::bad_alloc, exit 1).
TEST(HostileFiles, TokenFileCountIsCheckedAgainstTheBytesBeforeAllocating) {
  fs::path d = scratch("tokens");
  int32_t header[256] = {20240520, 1, 2147483647};
  std::string bytes(reinterpret_cast<const char*>(header), sizeof(header));
  bytes += std::string(10000, '\0');
  std::ofstream(d / "big.bin", std::ios::binary) << bytes;
  pid_t pid = fork();
  if (pid == 0) {
    rlimit lim{size_t(1) << 30, size_t(1) << 30};
    setrlimit(RLIMIT_AS, &lim);
    ctx::exec::DataOptions o;
    o.seq = 16;
    o.vocab = 50304;
    try {
      ctx::exec::open_token_file((d / "big.bin").string(), o);
    } catch (const ctx::InputError& e) {
      _exit(std::strstr(e.what(), "promises 2147483647 tokens, the file holds 5000") ? 0 : 3);
    } catch (...) {
      _exit(4);
    }
    _exit(5);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "3: other message, 4: another exception (bad_alloc), 5: accepted";
}

// Before: "step":"abc" exited 1, a negative step trained with a negative learning rate and exited 0,
// a huge one overflowed; a missing data_offsets in a shard exited 1.
TEST(HostileFiles, DamagedCheckpointIndexIsBadInputNamingFileAndField) {
  fs::path d = scratch("index");
  Result a = sh(ctxrun(1, kSmallRun + "--steps 2 --ckpt-dir " + d.string()));
  ASSERT_EQ(a.code, 0) << a.out;
  const fs::path index = d / "step-000002" / "trainer.json";
  const std::string good = slurp(index);
  for (const char* bad : {"\"abc\"", "-5", "1e30", "2.5", "null", "[1]"}) {
    json j = json::parse(good);
    j["step"] = json::parse(bad);
    std::ofstream(index) << j.dump(2);
    Result r = sh(ctxrun(1, kSmallRun + "--steps 4 --resume --ckpt-dir " + d.string()));
    EXPECT_EQ(r.code, ctx::kExitBadInput) << bad << ":\n" << r.out;
    EXPECT_HAS(r.out, index.string());
    EXPECT_HAS(r.out, "field 'step'");
    EXPECT_FALSE(contains(r.out, "step     3")) << bad << ": trained on a damaged index";
  }
  json j = json::parse(good);
  j.erase("step");
  std::ofstream(index) << j.dump(2);
  Result missing = sh(ctxrun(1, kSmallRun + "--steps 4 --resume --ckpt-dir " + d.string()));
  EXPECT_EQ(missing.code, ctx::kExitBadInput) << missing.out;
  EXPECT_HAS(missing.out, "missing required field");
  // a shard whose header lost an entry's offsets
  std::ofstream(index) << good;
  const fs::path shard = d / "step-000002" / "rank-00000.safetensors";
  std::string s = slurp(shard);
  const size_t at = s.find("\"data_offsets\"");
  ASSERT_NE(at, std::string::npos);
  s.replace(at, 14, "\"data_offsetz\"");
  std::ofstream(shard, std::ios::binary) << s;
  Result shard_bad = sh(ctxrun(1, kSmallRun + "--steps 4 --resume --ckpt-dir " + d.string()));
  EXPECT_EQ(shard_bad.code, ctx::kExitBadInput) << shard_bad.out;
  EXPECT_HAS(shard_bad.out, shard.string());
  EXPECT_HAS(shard_bad.out, "data_offsets");
}

// Before: resuming with --steps equal to the checkpoint's step saved that step again, removing the
// folder `latest` names before the new one was renamed in (a kill there lost the checkpoint).
// Now the same step is not saved twice, and a step folder that exists is exchanged atomically.
TEST(HostileFiles, SavingAStepThatExistsNeverRemovesTheCheckpointLatestNames) {
  fs::path d = scratch("resave");
  Result a = sh(ctxrun(1, kSmallRun + "--steps 2 --ckpt-dir " + d.string()));
  ASSERT_EQ(a.code, 0) << a.out;
  const fs::path shard = d / "step-000002" / "rank-00000.safetensors";
  const auto mtime_before = fs::last_write_time(shard);
  Result same = sh(ctxrun(1, kSmallRun + "--steps 2 --resume --ckpt-dir " + d.string()));
  ASSERT_EQ(same.code, 0) << same.out;
  EXPECT_FALSE(contains(same.out, "saved ")) << "the resumed step was saved again:\n" << same.out;
  EXPECT_EQ(fs::last_write_time(shard), mtime_before);
  // a fresh run (no --resume) into the same folder replaces step 2: exchanged, nothing left over
  Result fresh = sh(ctxrun(1, "--model tiny --seq 64 --plan precision=fp32 --seed 7 --steps 2 --ckpt-dir " + d.string()));
  ASSERT_EQ(fresh.code, 0) << fresh.out;
  EXPECT_HAS(fresh.out, "saved ");
  EXPECT_NE(fs::last_write_time(shard), mtime_before);
  for (auto& e : fs::directory_iterator(d)) {
    const std::string n = e.path().filename().string();
    EXPECT_TRUE(n == "step-000002" || n == "latest") << "left over: " << n;
  }
  Result again = sh(ctxrun(1, "--model tiny --seq 64 --plan precision=fp32 --seed 7 --steps 3 --resume --ckpt-dir " + d.string()));
  EXPECT_EQ(again.code, 0) << again.out;
}

// Before: a `latest` naming a folder that is gone failed the resume ("missing"); stale .tmp folders
// stayed forever.
TEST(HostileFiles, DanglingLatestFallsBackToNewestCompleteCheckpointAndStaleTmpIsCleaned) {
  fs::path d = scratch("dangling");
  Result a = sh(ctxrun(1, kSmallRun + "--steps 4 --save-every 2 --ckpt-dir " + d.string()));
  ASSERT_EQ(a.code, 0) << a.out;
  ASSERT_TRUE(fs::exists(d / "step-000002") && fs::exists(d / "step-000004"));
  std::ofstream(d / "latest") << "step-000009\n";
  fs::create_directories(d / "step-000005.tmp");
  std::ofstream(d / "step-000005.tmp" / "rank-00000.safetensors") << "half";
  Result r = sh(ctxrun(1, kSmallRun + "--steps 5 --resume --ckpt-dir " + d.string()));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_HAS(r.out, "resuming from step-000004");
  EXPECT_HAS(r.out, "resumed from");
  EXPECT_HAS(r.out, "at step 4");
  EXPECT_FALSE(fs::exists(d / "step-000005.tmp"));
  EXPECT_EQ(slurp(d / "latest"), "step-000005\n");
}

// Before: an unwritable --ckpt-dir was found at the first save, after the training it was to keep.
TEST(HostileFiles, UnwritableCheckpointDirIsRefusedBeforeTheFirstStep) {
  fs::path d = scratch("unwritable");
  std::ofstream(d / "a-file") << "x";
  const std::string bad = (d / "a-file" / "ckpt").string();  // a folder under a file: never writable
  Result r = sh(ctxrun(1, kSmallRun + "--steps 2 --ckpt-dir " + bad));
  EXPECT_EQ(r.code, ctx::kExitBadInput) << r.out;
  EXPECT_HAS(r.out, bad);
  EXPECT_HAS(r.out, "cannot write checkpoints");
  EXPECT_FALSE(contains(r.out, "step     1")) << "trained before refusing:\n" << r.out;
}

// Before: rope_type "dynamic" in a Hugging Face config ran as static NTK (the base always rescaled
// by factor^(d/(d-2))). Hugging Face's dynamic NTK rescales only past max_position_embeddings M, from
// the current length L: base * (factor * L / M - (factor - 1))^(d/(d-2)). Reference written here
// from that definition (transformers' _compute_dynamic_ntk_parameters).
TEST(HostileFiles, DynamicNtkRopeFollowsTheHuggingFaceDefinitionOrIsRefused) {
  ctx::ModelSpec m;
  m.name = "dyn";
  m.head_dim = 64;
  m.max_position = 2048;
  m.rope.base = 10000.0;
  m.rope.scaling = ctx::RopeScaling::ntk;
  m.rope.factor = 4.0;
  m.rope.dynamic = true;
  auto hf_inv_freq = [&](double length) {
    const double d = 64, M = 2048, f = 4.0;
    const double L = std::max(length, M);
    const double base = 10000.0 * std::pow(f * L / M - (f - 1.0), d / (d - 2.0));
    std::vector<float> inv;
    for (int i = 0; i < 32; ++i) inv.push_back(static_cast<float>(1.0 / std::pow(base, 2.0 * i / d)));
    return inv;
  };
  // within the original context: unscaled, exactly HF's (and plain RoPE's) frequencies
  for (int64_t seq : {256, 2048}) {
    auto t = ctx::exec::make_rope_table(ctx::exec::rope_for_sequence(m, seq, false), m.head_dim);
    auto ref = hf_inv_freq(static_cast<double>(seq));
    ASSERT_EQ(t.inv_freq.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_FLOAT_EQ(t.inv_freq[i], ref[i]) << "seq " << seq << ", i " << i;
  }
  // past it, positions 0..seq-1 every step: the base rescaled from L = seq
  for (int64_t seq : {4096, 16384}) {
    auto t = ctx::exec::make_rope_table(ctx::exec::rope_for_sequence(m, seq, false), m.head_dim);
    auto ref = hf_inv_freq(static_cast<double>(seq));
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(t.inv_freq[i], ref[i], 1e-6 * ref[i]) << "seq " << seq << ", i " << i;
  }
  // under document masking L changes per batch: refused, naming the difference
  try {
    ctx::exec::rope_for_sequence(m, 4096, true);
    ADD_FAILURE() << "accepted";
  } catch (const ctx::InputError& e) {
    EXPECT_HAS(std::string(e.what()), "dynamic");
    EXPECT_HAS(std::string(e.what()), "2048");
  }
  // a static NTK profile ("ntk") is unchanged by the sequence
  m.rope.dynamic = false;
  EXPECT_EQ(ctx::exec::rope_for_sequence(m, 256, true).factor, 4.0);
}
