// The NCCL communicator: the view-level Comm (executor/comm.hpp) on NCCL, for the CUDA backend's
// memory. Compiles everywhere NCCL is installed; a one-rank communicator ran on one H200 on 2026-11-28 (docs/GPU_PROOF.md), several GPUs untested; the
// watchdog's policy is tested on the CPU (tests/test_nccl_watchdog.cpp).
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
//   failures    every communicator is non-blocking (ncclConfig_t blocking = 0, so no NCCL call
//               can hang the host: a call that answers ncclInProgress is settled by polling
//               ncclCommGetAsyncError under the timeout) and is watched by the process's NCCL
//               watchdog (nccl_watchdog.hpp): a thread polls each communicator's asynchronous
//               error and its oldest unfinished operation (events recorded before and after it
//               on the communicator's stream). An error, or an operation that has run longer
//               than CTXPLAN_NCCL_TIMEOUT_S (default 300 s) since it started on the device,
//               aborts every communicator (ncclCommAbort) and ends the process with exit code 1
//               and one message naming the operation, the group, the rank and how long it ran.
//               CTXPLAN_NCCL_BLOCKING=1 additionally makes every collective and wait() wait on
//               the host (debugging: the failing call is then on the stack).
//   lifetimes   a buffer passed to isend/irecv must stay allocated until wait() (the caching
//               allocator orders reuse by the compute stream only).
#pragma once
#include <memory>
#include <string>

#include "executor/backend.hpp"
#include "executor/comm.hpp"

namespace ctx::exec {
namespace cuda {

// A Comm over the process group of `host` for a process whose CUDA backend is `be`. Collective
// over the group (every member calls it). `group_name` (e.g. "dp", "cp ring") names the group in
// failure messages. Throws when `be` is not the CUDA backend.
std::unique_ptr<Comm> make_nccl_comm(Backend& be, std::unique_ptr<HostComm> host, const std::string& group_name = "");

}  // namespace cuda

// The old entry point (cuda_backend.cpp): cuda::make_nccl_comm with no group name. Defined only
// in the real build (not when the emulated build renames namespace cuda).
std::unique_ptr<Comm> make_nccl_comm(Backend& be, std::unique_ptr<HostComm> host);

}  // namespace ctx::exec
