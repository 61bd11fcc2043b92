#include "costmodel/runtime_profile.hpp"

#include <algorithm>

namespace ctx {

namespace {
constexpr double kFp32Bytes = 4;  // IEEE 754 binary32
constexpr double kBf16Bytes = 2;  // bfloat16
// 8-bit Adam: torchao/optim/README.md "block size is 256 for 8-bit ... optimizers" (AdamW8bit), each
// block's scale one fp32 (torchao/optim/subclass_8bit.py OptimState8bit.scale)
constexpr double kQ8BlockElements = 256;
constexpr double kQ8MomentBytes = 1 + kFp32Bytes / kQ8BlockElements;  // one moment, per element

double master_bytes_of(StateDtype x) { return x == StateDtype::none ? 0.0 : kFp32Bytes; }
double grad_bytes_of(StateDtype x) { return x == StateDtype::bf16 ? kBf16Bytes : kFp32Bytes; }
double moment_bytes_of(StateDtype x) {  // m and v together
  return 2.0 * (x == StateDtype::bf16 ? kBf16Bytes : x == StateDtype::q8 ? kQ8MomentBytes : kFp32Bytes);
}
bool overrides(StateDtype planned, StateDtype own) { return planned != StateDtype::runtime && planned != own; }
}  // namespace

StateDtypes runtime_state_dtypes(const RuntimeProfile& rt) {
  StateDtypes d;
  d.master = rt.master_bytes == 0 ? StateDtype::none : StateDtype::fp32;
  d.grads = rt.grad_bytes <= kBf16Bytes ? StateDtype::bf16 : StateDtype::fp32;
  d.moments = rt.optimizer_bytes >= 2 * kFp32Bytes ? StateDtype::fp32
              : rt.optimizer_bytes >= 2 * kBf16Bytes ? StateDtype::bf16
                                                     : StateDtype::q8;
  return d;
}

bool plan_changes_runtime(const RuntimeProfile& rt, const Plan& p) {
  if (precision_changes_runtime(rt, p.precision)) return true;
  if (p.master == StateDtype::runtime && p.grads == StateDtype::runtime && p.moments == StateDtype::runtime) return false;
  const StateDtypes own = runtime_state_dtypes(rt);
  return overrides(p.master, own.master) || overrides(p.grads, own.grads) || overrides(p.moments, own.moments);
}

RuntimeProfile runtime_for_plan(const RuntimeProfile& rt, const Plan& p) {
  RuntimeProfile out = runtime_for_precision(rt, p.precision);
  const StateDtypes own = runtime_state_dtypes(rt);
  if (overrides(p.master, own.master)) {
    out.master_bytes = master_bytes_of(p.master);
    out.sources["master_bytes"] = std::string("the plan's master=") + to_string(p.master);
  }
  if (overrides(p.grads, own.grads)) {
    out.grad_bytes = out.grad_comm_bytes = grad_bytes_of(p.grads);
    out.sources["grad_bytes"] = out.sources["grad_comm_bytes"] = std::string("the plan's grads=") + to_string(p.grads);
  }
  if (overrides(p.moments, own.moments)) {
    out.optimizer_bytes = moment_bytes_of(p.moments);
    out.sources["optimizer_bytes"] = std::string("the plan's moments=") + to_string(p.moments) +
                                     (p.moments == StateDtype::q8 ? " (int8 m and v, an fp32 scale per 256 elements: torchao AdamW8bit)" : "");
  }
  return out;
}

RuntimeProfile runtime_for_compile(const RuntimeProfile& rt, const Plan& p) {
  RuntimeProfile out = rt;
  if (p.compile == Compile::off) return out;
  if (rt.compiled_mlp_saved_ffn_tensors >= 0) {
    out.mlp_saved_ffn_tensors = rt.compiled_mlp_saved_ffn_tensors;
    out.saves_norm_outputs = rt.compiled_saves_norm_outputs;
    out.sources["mlp_saved_ffn_tensors"] = "the plan's compile=" + std::string(to_string(p.compile)) + ": " +
                                           out.sources["compiled_mlp_saved_ffn_tensors"];
    out.sources["saves_norm_outputs"] = "the plan's compile=" + std::string(to_string(p.compile)) + ": " +
                                        out.sources["compiled_saves_norm_outputs"];
    out.tiled_loss_mlp_saved_ffn_tensors = out.tiled_loss_mlp_backward_ffn_tensors = 0;  // the compiled MLP's set holds
  }
  if (p.compile == Compile::model_loss && rt.compiled_loss_logit_copies >= 0) {
    out.loss_logit_copies = rt.compiled_loss_logit_copies;
    out.sources["loss_logit_copies"] = "the plan's compile=model+loss: " + out.sources["compiled_loss_logit_copies"];
  }
  return out;
}

bool compile_changes_runtime(const RuntimeProfile& rt, const Plan& p) {
  if (p.compile == Compile::off) return false;
  const bool model = rt.compiled_mlp_saved_ffn_tensors >= 0 &&
                     (rt.mlp_saved_ffn_tensors != rt.compiled_mlp_saved_ffn_tensors || rt.saves_norm_outputs != rt.compiled_saves_norm_outputs);
  const bool loss = p.compile == Compile::model_loss && rt.compiled_loss_logit_copies >= 0 &&
                    rt.loss_logit_copies != rt.compiled_loss_logit_copies;
  return model || loss;
}

bool precision_changes_runtime(const RuntimeProfile& rt, Precision precision) {
  return precision == Precision::fp32 && (rt.weight_bytes != kFp32Bytes || rt.activation_bytes != kFp32Bytes ||
                                          rt.logits_bytes != kFp32Bytes || rt.grad_comm_bytes != kFp32Bytes);
}

RuntimeProfile runtime_for_precision(const RuntimeProfile& rt, Precision precision) {
  RuntimeProfile out = rt;
  if (!precision_changes_runtime(rt, precision)) return out;
  // ctxrun's CUDA backend runs fp32 attention on its SIMT kernel, not its bf16 tensor-core one: an fp32
  // plan is priced on that kernel's curve (kernels.attention.ctxrun_fp32, measured by ctxrun-calibrate;
  // 4-5 TFLOP/s against 37-42 for ctxrun_mma on an H200, docs/GPU_PROOF.md), with the default's
  // fallbacks where the GPU has no such curve. A kernel chosen with --attention is kept.
  const bool runs_simt = std::find(rt.attention_kernels.begin(), rt.attention_kernels.end(), "ctxrun_fp32") !=
                         rt.attention_kernels.end();
  if (precision == Precision::fp32 && runs_simt && rt.attention_where.empty()) {
    const size_t bar = rt.attention_kernel.find('|');
    out.attention_kernel = "ctxrun_fp32" + (bar == std::string::npos ? std::string() : rt.attention_kernel.substr(bar));
    out.sources["attention_kernel"] = "precision=fp32: ctxrun's SIMT attention kernel (executor/cuda/attention.cu)";
  }
  const std::string why = "precision=fp32: float32 storage";
  out.weight_bytes = kFp32Bytes;      // the compute copy of the weights (and ZeRO-3 gathers, param offload)
  out.activation_bytes = kFp32Bytes;  // saved activations, TP/SP/CP/Ulysses communication
  out.logits_bytes = kFp32Bytes;      // the head's output
  out.grad_comm_bytes = kFp32Bytes;   // the gradient reduction (fp32 gradients of fp32 weights)
  out.sources["weight_bytes"] = why;
  out.sources["activation_bytes"] = why;
  out.sources["logits_bytes"] = why;
  out.sources["grad_comm_bytes"] = why;
  return out;
}

std::string ctxrun_runtime_for_backend(const std::string& backend) {
  return backend.rfind("cuda", 0) == 0 ? "ctxrun-cuda" : "ctxrun-cpu";
}

}  // namespace ctx
