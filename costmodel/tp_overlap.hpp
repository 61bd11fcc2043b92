// Tensor-parallel communication overlapped with the layer's GEMMs (plan key tp_overlap; Megatron's
// --tp-comm-overlap, Transformer Engine's userbuffers). TE replaces each SP all-gather before a
// column-parallel GEMM and each reduce-scatter after a row-parallel one by one fused operation that
// splits the GEMM and moves the shards while the other chunks compute
// (transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp). Three methods, per GEMM as
// the userbuffers configuration names them (transformer_engine/pytorch/module/base.py initialize_ub):
//   ring_exchange  qkv_fprop, fc1_fprop (AG of the input), proj_dgrad, fc2_dgrad (AG of d(out)); also
//                  proj_fprop/fc2_fprop (RS) in Megatron-Bridge's FP8 configurations. The GEMM runs in
//                  tp chunks, one shard each; the shards hop between neighbours on the copy engines
//                  (use_ce, 1 SM), chunk i+1 waiting for hop i (CommOverlapP2PBase::split_overlap_ag);
//                  the RS form sends each finished chunk to its owner and sums the tp partials in one
//                  kernel at the end (CommOverlapP2PBase::split_overlap_rs)
//   pipeline       proj_fprop, fc2_fprop (RS of the output): the GEMM in num_splits chunks on the SMs
//                  the communication leaves (set_sm_margin: sm_count - num_sm), each chunk's
//                  reduce-scatter on num_sm SMs after it (CommOverlapBase::split_overlap_rs)
//   bulk           qkv_dgrad, fc1_dgrad (AG of the saved norm output, for the weight gradient) and
//                  qkv_wgrad, fc1_wgrad (RS of the input gradient): the whole collective beside the
//                  whole GEMM, on num_sm SMs the GEMM shares (CommOverlapBase::bulk_overlap)
// Each returns the seconds of the fused operation (GEMM and collective together).
#pragma once
#include <cstdint>

namespace ctx {

// ring_exchange: tp GEMM chunks of `chunk_gemm_seconds` each; tp-1 hops of `hop_seconds`, back to
// back on the send stream, chunk i+1 starts when hop i has arrived and the SMs are free:
// max(tp * chunk, chunk + (tp-1) * hop). The RS form ends with its reduction (`reduce_seconds`).
double ring_exchange_seconds(double chunk_gemm_seconds, double hop_seconds, int64_t tp, double reduce_seconds = 0);

// pipeline: `splits` GEMM chunks of `chunk_gemm_seconds` (already at the SMs the margin leaves), back to
// back; chunk i's reduce-scatter (`chunk_rs_seconds`) starts when chunk i is done and the previous
// reduce-scatter has finished: max(splits * chunk + rs, chunk + splits * rs).
double pipeline_rs_seconds(double chunk_gemm_seconds, double chunk_rs_seconds, int64_t splits);

// bulk: the collective (`comm_seconds`) on `comm_sm_fraction` of the SMs beside the GEMM
// (`gemm_seconds` on all of them): while both run the GEMM has the other SMs, so it finishes
// comm * fraction later, unless the collective outlasts it: max(comm, gemm + comm * fraction).
double bulk_overlap_seconds(double gemm_seconds, double comm_seconds, double comm_sm_fraction);

}  // namespace ctx
