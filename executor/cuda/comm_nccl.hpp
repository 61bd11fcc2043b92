// The NCCL communicator: the view-level Comm (executor/comm.hpp) on NCCL, for the CUDA backend's
// memory. Compiles everywhere NCCL is installed; not wired into ctxrun yet; untested on GPUs
// (docs/CUDA.md).
//
//   bootstrap   one NCCL communicator per process group, made from that group's HostComm (an MPI
//               sub-group from CommWorld::split, or the one-rank world): the group's rank 0
//               creates the ncclUniqueId and broadcasts it over the HostComm, then
//               ncclCommInitRank. No ncclCommSplit, no MPI call here: the HostComm is the
//               bootstrap, as it is the host control path below.
//   dtypes      by the view's dtype: f32 ncclFloat32, bf16 ncclBfloat16 (reductions sum in NCCL's
//               bf16 arithmetic), i32 ncclInt32, i64 ncclInt64.
//   streams     each communicator has its own stream. Collectives are stream-ordered, not
//               blocking: the communicator's stream waits (event) for everything queued on the
//               backend's compute stream, runs the collective, and the compute stream waits
//               (event) for it, so the host never waits and later ops see the result.
//   p2p         isend/irecv are queued and launched as one ncclGroupStart/End batch as soon as
//               the queue holds both a send and a receive (a ring step), or at the first wait()
//               or collective; wait() makes the compute stream wait for the batch. NCCL matches
//               point-to-point messages by order per peer, not by tag: tags are ignored (the
//               ring code posts matching messages in the same order on both sides).
//   host path   host_allreduce_max/sum and barrier wait for both streams, then run on the
//               HostComm (MPI): they are the blocking control path (flags, step counters), a few
//               scalars per step, where a device round trip would buy nothing.
//   errors      every host-path call, wait() in blocking mode and the destructor check
//               ncclCommGetAsyncError; CTXPLAN_NCCL_BLOCKING=1 makes every collective and wait()
//               wait on the host, with a timeout (CTXPLAN_NCCL_TIMEOUT_S, default 600 s) that
//               aborts the communicator and names the operation and the rank (debugging a hang).
//   lifetimes   a buffer passed to isend/irecv must stay allocated until wait() (the caching
//               allocator orders reuse by the compute stream only).
#pragma once
#include <memory>

#include "executor/backend.hpp"
#include "executor/comm.hpp"

namespace ctx::exec {

// A Comm over the process group of `host` for a process whose CUDA backend is `be`. Collective
// over the group (every member calls it). Throws when `be` is not the CUDA backend.
std::unique_ptr<Comm> make_nccl_comm(Backend& be, std::unique_ptr<HostComm> host);

}  // namespace ctx::exec
