#include "costmodel/attention_kernels.hpp"

#include "costmodel/errors.hpp"

namespace ctx {

const std::vector<AttentionKernelInfo>& attention_kernel_catalogue() {
  static const std::vector<AttentionKernelInfo> k = {
      {"fa2", "FlashAttention-2 (Dao 2023, flash_attn 2.x; Ampere, Hopper)", true},
      {"fa3", "FlashAttention-3 (Shah et al. 2024, flash_attn 3 'hopper' build; Hopper only)", true},
      {"cudnn", "cuDNN fused flash attention (cuDNN 9 SDPA: Transformer Engine's FusedAttention, PyTorch's cuDNN SDPA backend)", true},
      {"flex", "PyTorch FlexAttention (torch.compile-generated Triton kernels, block masks)", true},
      {"sdpa", "PyTorch scaled_dot_product_attention, flash backend (PyTorch's own FlashAttention-2 build)", true},
      {"triton", "FlashAttention in Triton (flash-attention's experimental flash_attn_triton.py on the pre-MLIR Triton: llm-foundry's attn_impl 'triton')", true},
      {"ctxrun_mma", "ctxrun's bf16 tensor-core kernel (executor/cuda/attention_mma.cu)", false},
      {"ctxrun_fp32", "ctxrun's SIMT kernel for fp32 plans (executor/cuda/attention.cu)", false},
  };
  return k;
}

std::string attention_choices() {
  std::string s;
  for (auto& k : attention_kernel_catalogue())
    if (k.user_choice) s += (s.empty() ? "" : "|") + k.name;
  return s;
}

std::string canonical_attention(const std::string& name) {
  if (name == "flash2") return "fa2";
  for (auto& k : attention_kernel_catalogue())
    if (k.name == name) return name;
  return "";
}

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
}  // namespace

RuntimeProfile with_attention(RuntimeProfile rt, const std::string& name, const std::string& where, const std::string& field) {
  const std::string k = canonical_attention(name);
  if (k.empty()) {
    std::string all;
    for (auto& i : attention_kernel_catalogue()) all += (all.empty() ? "" : ", ") + i.name;
    throw InputError(where, field, "unknown attention implementation '" + name + "'; valid: " + all);
  }
  bool runs = false;
  for (auto& r : rt.attention_kernels) runs |= (r == k);
  if (!runs)
    throw InputError(where, field, "runtime " + rt.name + " does not run '" + k + "'; it runs: " + join(rt.attention_kernels) +
                                       " (constants.attention_kernels of its profile)");
  // the default keeps its pricing alternatives ("ctxrun_mma|fa2": its own curve where measured)
  if (rt.attention_kernel.substr(0, rt.attention_kernel.find('|')) != k) rt.attention_kernel = k;
  rt.attention_where = where;
  rt.attention_field = field;
  return rt;
}

const AttentionKernel& find_attention_kernel(const ClusterSpec& c, const RuntimeProfile& rt) {
  size_t start = 0;
  for (;;) {
    const size_t bar = rt.attention_kernel.find('|', start);
    const std::string name = rt.attention_kernel.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
    for (auto& k : c.gpu.kernels.attention)
      if (k.name == name) return k;
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  std::vector<std::string> here;
  for (auto& k : c.gpu.kernels.attention) here.push_back(k.name);
  const bool chosen = !rt.attention_where.empty();
  throw InputError(chosen ? rt.attention_where : "runtime profile " + rt.name,
                   chosen ? rt.attention_field : "constants.attention_kernel",
                   "'" + rt.attention_kernel + "' has no throughput curve in hardware profile " + c.gpu.name +
                       " (kernels.attention); valid on this GPU: " + join(here));
}

AttentionMask attention_mask(const Plan& p, const AttentionKernel& k, const RuntimeProfile& rt) {
  if (p.mask != MaskKind::document) return AttentionMask::causal;
  if (k.document_mask) return AttentionMask::document;
  const bool chosen = !rt.attention_where.empty();
  throw InputError(chosen ? rt.attention_where : "runtime profile " + rt.name,
                   chosen ? rt.attention_field : "constants.attention_kernel",
                   "'" + k.name + "' cannot run mask=document (packed documents): " + k.document_mask_source +
                       "; choose a kernel with a variable-length entry (fa2, fa3, cudnn, flex) or mask=explicit");
}

double attention_efficiency(const AttentionKernel& k, AttentionMask mask, double head_dim, double tokens, bool backward) {
  const bool full = mask == AttentionMask::full;
  const Curve& c = backward ? (full && !k.full_bwd.points.empty() ? k.full_bwd : k.bwd)
                            : (full && !k.full_fwd.points.empty() ? k.full_fwd : k.fwd);
  return c.at(tokens) * (k.head_dim.points.empty() ? 1.0 : k.head_dim.at(head_dim));
}

}  // namespace ctx
