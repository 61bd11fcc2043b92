#include "costmodel/runtime_profile.hpp"

namespace ctx {

namespace {
constexpr double kFp32Bytes = 4;  // IEEE 754 binary32
}  // namespace

bool precision_changes_runtime(const RuntimeProfile& rt, Precision precision) {
  return precision == Precision::fp32 &&
         (rt.weight_bytes != kFp32Bytes || rt.activation_bytes != kFp32Bytes || rt.logits_bytes != kFp32Bytes);
}

RuntimeProfile runtime_for_precision(const RuntimeProfile& rt, Precision precision) {
  RuntimeProfile out = rt;
  if (!precision_changes_runtime(rt, precision)) return out;
  const std::string why = "precision=fp32: float32 storage";
  out.weight_bytes = kFp32Bytes;      // the compute copy of the weights (and ZeRO-3 gathers, param offload)
  out.activation_bytes = kFp32Bytes;  // saved activations, TP/SP/CP/Ulysses communication
  out.logits_bytes = kFp32Bytes;      // the head's output
  out.sources["weight_bytes"] = why;
  out.sources["activation_bytes"] = why;
  out.sources["logits_bytes"] = why;
  return out;
}

std::string ctxrun_runtime_for_backend(const std::string& backend) {
  return backend.rfind("cuda", 0) == 0 ? "ctxrun-cuda" : "ctxrun-cpu";
}

}  // namespace ctx
