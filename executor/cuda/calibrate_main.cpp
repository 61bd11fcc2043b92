// ctxrun-calibrate: measures this machine's GPU and writes a hardware profile the cost model reads.
//   ctxrun-calibrate --base profiles/hardware/h200-141gb.json --out profiles/hardware/h200-measured.json
// The output is the base profile with the measured curves replacing the estimated ones
// (calibrate_profile.hpp lists the keys); it is validated with the cost model's own loader before
// it is written. Exit codes: 0 written, 1 internal error, 2 bad input, 5 no CUDA device.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>

#include "costmodel/errors.hpp"
#include "costmodel/profile_store.hpp"
#include "executor/cuda/calibrate_profile.hpp"
#include "executor/cuda/cuda_backend.hpp"
#include "costmodel/exit_codes.hpp"

using namespace ctx;
using namespace ctx::exec;

namespace {

std::string today() {
  std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

// A path, or a hardware profile name looked up in <profiles>/hardware/<name>.json.
std::string base_path(const std::string& arg, const std::string& profiles) {
  if (std::filesystem::exists(arg)) return arg;
  std::string p = (profiles.empty() ? default_profiles_dir() : profiles) + "/hardware/" + arg + ".json";
  if (std::filesystem::exists(p)) return p;
  throw InputError("--base", "", "'" + arg + "' is neither a file nor a profile in " + p);
}

void print_summary(const calib::Measurements& m) {
  std::printf("%s (sm_%d), %s, %.0f MiB (%.0f free)\n", m.device_name.c_str(), m.sm, m.driver.c_str(),
              m.total_bytes / 1048576.0, m.free_bytes / 1048576.0);
  std::printf("launch %.2f us, H2D %.1f GB/s, D2H %.1f GB/s (pinned)\n", m.launch_seconds * 1e6,
              m.h2d_bytes_per_second / 1e9, m.d2h_bytes_per_second / 1e9);
  std::printf("%-6s %7s %7s %7s %10s %9s\n", "gemm", "m", "n", "k", "ms", "TFLOP/s");
  for (auto& g : m.gemm)
    std::printf("%-6s %7lld %7lld %7lld %10.3f %9.1f\n", g.dtype.c_str(), static_cast<long long>(g.m),
                static_cast<long long>(g.n), static_cast<long long>(g.k), g.seconds * 1e3, g.flops() / g.seconds / 1e12);
  std::printf("%-12s %6s %4s %10s %10s %9s %9s\n", "attention", "seq", "d", "fwd ms", "bwd ms", "fwd TF/s", "bwd TF/s");
  for (auto& a : m.attention)
    std::printf("%-12s %6lld %4lld %10.3f %10.3f %9.1f %9.1f\n", a.kernel.c_str(), static_cast<long long>(a.seq),
                static_cast<long long>(a.head_dim), a.fwd_seconds * 1e3, a.bwd_seconds * 1e3,
                a.fwd_flops() / a.fwd_seconds / 1e12, a.bwd_flops() / a.bwd_seconds / 1e12);
  for (auto& c : m.collectives)
    std::printf("%-14s %d GPUs %12.0f B %10.1f us busbw %7.1f GB/s\n", c.op.c_str(), c.ranks, c.bytes, c.seconds * 1e6,
                c.busbw_bytes_per_second() / 1e9);
}
}  // namespace

int main(int argc, char** argv) {
  std::string out, base, name, profiles;
  bool quick = false, no_collectives = false, keep_memory = false;
  CLI::App app{"ctxrun-calibrate: measure this GPU (GEMM, attention, memory and host bandwidth, launch cost, NCCL "
               "collectives) and write a hardware profile for the cost model.\nExit codes: 0 written, 1 internal "
               "error, 2 bad input, 5 no CUDA device."};
  app.add_option("--out,-o", out, "hardware profile to write, e.g. profiles/hardware/h200-measured.json")->required();
  app.add_option("--base,-b", base, "profile to start from (file or name in <profiles>/hardware): peaks, fabric and "
                                    "everything not measured are kept")->required();
  app.add_option("--name", name, "name of the written profile (default: the base's)");
  app.add_option("--profiles", profiles, "profiles folder (default: $CTXPLAN_PROFILES or the source tree's)");
  app.add_flag("--quick", quick, "smaller grid (no 16K GEMMs or attention, 256 MiB copies)");
  app.add_flag("--no-collectives", no_collectives, "skip the NCCL measurements even with several GPUs");
  app.add_flag("--keep-memory", keep_memory, "keep the base's hbm_mib/usable_mib instead of cudaMemGetInfo's");
  CLI11_PARSE(app, argc, argv);
  try {
    const std::string bp = base_path(base, profiles);
    json base_json = read_json_file(bp);
    hardware_from_json(base_json, bp);  // a bad base fails before minutes of measuring
    calib::MergeOptions mo;
    mo.name = name;
    mo.date = today();
    mo.set_memory = !keep_memory;
    (void)calib::merge_into_profile(base_json, calib::Measurements{}, mo);
    if (cuda_device_count() == 0) {
      std::cerr << "ctxrun-calibrate: no CUDA device (cudaGetDeviceCount found none, or no driver): nothing measured, "
                   "nothing written\n";
      return kExitNoDevice;
    }
    calib::Options o;
    o.quick = quick;
    o.collectives = !no_collectives;
    calib::Measurements m = calib::measure(o);
    print_summary(m);
    json merged = calib::merge_into_profile(base_json, m, mo);
    hardware_from_json(merged, out);  // the cost model must be able to read what we write
    write_file_atomic(out, merged.dump(2) + "\n");
    std::printf("wrote %s\n", out.c_str());
    return kExitOk;
  } catch (const InputError& e) {
    std::cerr << "ctxrun-calibrate: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "ctxrun-calibrate: " << e.what() << "\n";
    return kExitInternal;
  }
}
