#include "costmodel/cp_eager_merge.hpp"

namespace ctx {

CpEagerMergeBytes cp_eager_merge_bytes(double E, double Ekv, double a, int64_t ring, int64_t pos, bool load_balanced) {
  CpEagerMergeBytes m;
  const double cast_in = 4.0 + a;   // an a-byte tensor read, its fp32 copy written (per element)
  const double acc = 8.0 + a;       // fp32 accumulator read and written, an a-byte addend read
  for (int64_t i = 0; i < ring; ++i) {
    double f = 0, b = 0, fo = 0, bo = 0;
    const bool full_q = i <= pos, skipped = i > pos && !load_balanced;
    if (i == 0) {
      f += 4.0 * a * Ekv + cast_in * E + cast_in * E;  // K,V contiguous; results() cast; step 0's out.to(fp32)
      fo += 4;
      b += 4.0 * E + 8.0 * Ekv + 4.0 * a * Ekv + cast_in * E + 2.0 * cast_in * Ekv;  // zeros; contiguous; final casts
      b += 2.0 * acc * Ekv + acc * E;                                                 // step 0's += into dK, dV, dQ
      bo += 3 + 2 + 2 + 3;
    } else if (!skipped) {
      const double O = full_q ? E : E / 2.0;
      f += cast_in * O + 12.0 * O + 8.0 * O + 12.0 * O;  // cast, out - block_out, sigmoid(.) * that, out - that
      fo += 4;
      if (!full_q) {
        f += 8.0 * E;  // _partial_update: torch.cat of the two fp32 halves
        fo += 1;
        b += 2.0 * acc * Ekv + acc * E / 2.0 + 8.0 * E;  // dK,dV += ; dQ's second half += and torch.cat
        bo += 2 + 2;
      } else {
        b += 2.0 * (acc * Ekv / 2.0 + 8.0 * Ekv) + acc * E;  // dK,dV first half += and torch.cat; dQ +=
        bo += 4 + 1;
      }
    } else {
      b += 4.0 * E + 8.0 * Ekv + 24.0 * Ekv + 12.0 * E;  // zeros for the skipped block; fp32 += fp32
      bo += 3 + 3;
    }
    b += 16.0 * Ekv;  // torch.cat of the fp32 dK,dV for the dK,dV rotater, every step
    bo += 1;
    if (i < ring - 1) {  // torch.cat([key.flatten(), value.flatten()]) before the rotater, both passes
      f += 4.0 * a * Ekv;
      b += 4.0 * a * Ekv;
      fo += 1;
      bo += 1;
    }
    m.fwd_bytes.push_back(f);
    m.bwd_bytes.push_back(b);
    m.fwd_ops.push_back(fo);
    m.bwd_ops.push_back(bo);
  }
  return m;
}

}  // namespace ctx
