#include "costmodel/tp_overlap.hpp"

#include <algorithm>

namespace ctx {

double ring_exchange_seconds(double chunk_gemm_seconds, double hop_seconds, int64_t tp, double reduce_seconds) {
  const double n = static_cast<double>(std::max<int64_t>(1, tp));
  // chunk i starts at max(end of chunk i-1, arrival of hop i-1 = i * hop): the later of the two chains
  return std::max(n * chunk_gemm_seconds, chunk_gemm_seconds + (n - 1.0) * hop_seconds) + reduce_seconds;
}

double pipeline_rs_seconds(double chunk_gemm_seconds, double chunk_rs_seconds, int64_t splits) {
  const double n = static_cast<double>(std::max<int64_t>(1, splits));
  // reduce-scatter i ends at max over j <= i of (j * gemm + (i - j + 1) * rs): GEMM-bound (j = n) or RS-bound (j = 1)
  return std::max(n * chunk_gemm_seconds + chunk_rs_seconds, chunk_gemm_seconds + n * chunk_rs_seconds);
}

double bulk_overlap_seconds(double gemm_seconds, double comm_seconds, double comm_sm_fraction) {
  return std::max(comm_seconds, gemm_seconds + comm_seconds * comm_sm_fraction);
}

}  // namespace ctx
