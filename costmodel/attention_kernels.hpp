// The attention implementation as an input: the kernels a job can name (`--attention`, a plan file's
// "attention", a validation point's "attention"), which of them a runtime can run, and how a kernel's
// throughput curves (profiles/hardware/*.json, kernels.attention.<name>) are read by sequence length,
// head dim and mask kind. The curves themselves are data with their sources; this file only names the
// kernels and picks the curve.
#pragma once
#include <string>
#include <vector>

#include "costmodel/hardware_spec.hpp"
#include "costmodel/runtime_profile.hpp"

namespace ctx {

// causal: one causal document per sequence; document: packed documents through the kernel's
// variable-length entry (cu_seqlens, or block masks for flex), priced at the document's length;
// full: no mask (bidirectional), which no plan uses today.
enum class AttentionMask { causal, full, document };

struct AttentionKernelInfo {
  std::string name;   // as written in profiles and on the command line
  std::string what;   // the implementation, in words
  bool user_choice;   // one of the published implementations --attention lists (not ctxrun's own)
};
// fa2, fa3, cudnn, flex, sdpa, triton, then ctxrun's own kernels (ctxrun_mma, ctxrun_fp32).
const std::vector<AttentionKernelInfo>& attention_kernel_catalogue();
// "fa2|fa3|cudnn|flex|sdpa|triton" (the published implementations), for help texts and errors.
std::string attention_choices();
// The catalogue name of a kernel key; "flash2" (the key before issue 16) reads as "fa2". Unknown: "".
std::string canonical_attention(const std::string& name);

// The runtime with the job's attention choice in force. `where`/`field` name the input that gave it
// (e.g. "--attention", or a plan file and "attention") for the errors: an unknown name lists the valid
// ones, a kernel the runtime does not run lists what it runs.
RuntimeProfile with_attention(RuntimeProfile rt, const std::string& name, const std::string& where,
                              const std::string& field);

// The kernel the runtime runs on this cluster's GPU: the first of rt.attention_kernel's alternatives
// ("a|b") with a curve in the hardware profile. None: an InputError naming the input that chose it, the
// GPU and the kernels that GPU has curves for (e.g. fa3 on an A100).
const AttentionKernel& find_attention_kernel(const ClusterSpec& c, const RuntimeProfile& rt);

// The mask a plan's attention runs with: document for mask=document (refused, naming the kernel's
// source, on a kernel without a variable-length entry), causal otherwise (an explicit mask is priced as
// causal attention; its [s, s] bytes are the memory model's).
AttentionMask attention_mask(const Plan& p, const AttentionKernel& k, const RuntimeProfile& rt);

// Achieved fraction of the bf16 peak for one call over `tokens` keys at this head dim and mask.
double attention_efficiency(const AttentionKernel& k, AttentionMask mask, double head_dim, double tokens, bool backward);

}  // namespace ctx
