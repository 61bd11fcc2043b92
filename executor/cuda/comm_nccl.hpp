// The NCCL communicator: the Comm/CommWorld interface (executor/comm.hpp) on NCCL, for the CUDA
// backend's memory. Compiles everywhere NCCL is installed; untested on GPUs (docs/CUDA.md).
//
//   bootstrap   rank 0's ncclUniqueId is broadcast over MPI (CTXPLAN_HAVE_MPI); without MPI the
//               world is one rank. split() is ncclCommSplit: one ncclComm per group.
//   streams     each communicator has its own stream; a collective waits (event) for the
//               backend's compute stream, and the compute stream waits (event) for it.
//   blocking    collectives return when complete, as the interface promises (the strategy code
//               reads results on the host); completion is polled with ncclCommGetAsyncError and a
//               timeout, so a dead peer ends in ncclCommAbort and an error naming the rank and the
//               operation instead of a hang.
//   p2p         isend/irecv are queued and launched as one ncclGroupStart/End batch as soon as
//               the queue holds both a send and a receive (a ring step), or at the first wait()
//               or collective; wait() polls the batch's event. NCCL matches point-to-point
//               messages by order per peer, not by tag: tags are ignored (the ring code posts
//               matching messages in the same order on both sides).
//   host memory collectives on host pointers (the trainer's loss and divergence scalars, the
//               checkpoint gather) are staged through a device buffer; p2p buffers must be
//               device or managed memory.
#pragma once
#include <memory>

#include "executor/backend.hpp"
#include "executor/comm.hpp"

namespace ctx::exec {

// The world over NCCL for a process whose CUDA backend is `be` (the communicators order their
// work against its stream; their staging buffers are accounted in its ledger as comm_buffers).
// Initialises MPI when built with it. Throws when `be` is not the CUDA backend.
std::unique_ptr<CommWorld> make_nccl_world(int* argc, char*** argv, Backend& be);
// A one-rank NCCL world without MPI (tests on one GPU).
std::unique_ptr<CommWorld> make_nccl_single_rank_world(Backend& be);

}  // namespace ctx::exec
