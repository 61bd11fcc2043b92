// The NCCL subset the backend uses (comm_nccl.cpp), between processes, on the emulated device:
// each NCCL communicator is an MPI communicator over the same processes, and each NCCL call is a
// stream operation that posts MPI non-blocking operations when its stream reaches it and stays in
// flight until they complete, while the device's other streams go on (emu_device.hpp). So two
// collectives on different communicators, started in different orders by two ranks, complete
// as they would on GPUs instead of deadlocking. MPI only ever sees host staging buffers (copied
// from and to device memory when the operation starts and completes), because the process may
// make progress on them inside a later host-side MPI call, when device memory is not readable.
//
// Bootstrap: ncclGetUniqueId makes a random token; ncclCommInitRank finds the members' MPI world
// ranks through files named by the token under $TMPDIR (the emulation runs on one machine), then
// builds the communicator with MPI_Comm_create_group, which only the members call. One rank
// needs no MPI at all. Reductions: fp32/fp64/int32/int64 by MPI's own operations; bf16 by a user
// operation that adds in fp32 and rounds each partial sum to bf16 (NCCL, too, reduces bf16 in
// steps, not once); ncclAvg is the sum scaled by 1/nranks at the end.
#include <mpi.h>
#include <nccl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "executor/bf16.hpp"
#include "executor/cuda/emulated/emu_device.hpp"

using ctx_emu::Device;

struct ncclComm {
  int nranks = 1, rank = 0;
  MPI_Comm mpi = MPI_COMM_NULL;
  bool aborted = false;
  std::string token;
  std::deque<std::shared_ptr<std::vector<char>>> to_self;  // one rank: sends to itself, in order
};

namespace {

using Lock = std::lock_guard<std::recursive_mutex>;

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

float bf(uint16_t b) { return ctx::exec::bf16_to_f32(b); }
uint16_t to_bf(float f) { return ctx::exec::f32_to_bf16(f); }
template <int Kind>
void bf16_op(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = bf(a[i]), y = bf(b[i]);
    const float r = Kind == 0 ? x + y : Kind == 1 ? x * y : Kind == 2 ? std::fmax(x, y) : std::fmin(x, y);
    b[i] = to_bf(r);
  }
}

bool mpi_type(ncclDataType_t t, MPI_Datatype* out) {
  switch (t) {
    case ncclFloat32: *out = MPI_FLOAT; return true;
    case ncclFloat64: *out = MPI_DOUBLE; return true;
    case ncclInt32: *out = MPI_INT32_T; return true;
    case ncclUint32: *out = MPI_UINT32_T; return true;
    case ncclInt64: *out = MPI_INT64_T; return true;
    case ncclUint64: *out = MPI_UINT64_T; return true;
    case ncclInt8: *out = MPI_INT8_T; return true;
    case ncclUint8: *out = MPI_UINT8_T; return true;
    case ncclBfloat16: *out = MPI_UINT16_T; return true;
    default: return false;
  }
}
bool mpi_op(ncclRedOp_t op, ncclDataType_t t, MPI_Op* out) {
  if (t == ncclBfloat16) {
    static MPI_Op ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
    static MPI_User_function* fns[4] = {bf16_op<0>, bf16_op<1>, bf16_op<2>, bf16_op<3>};
    const int k = op == ncclSum || op == ncclAvg ? 0 : op == ncclProd ? 1 : op == ncclMax ? 2 : op == ncclMin ? 3 : -1;
    if (k < 0) return false;
    if (ops[k] == MPI_OP_NULL) MPI_Op_create(fns[k], 1, &ops[k]);
    *out = ops[k];
    return true;
  }
  switch (op) {
    case ncclSum: case ncclAvg: *out = MPI_SUM; return true;
    case ncclProd: *out = MPI_PROD; return true;
    case ncclMax: *out = MPI_MAX; return true;
    case ncclMin: *out = MPI_MIN; return true;
    default: return false;
  }
}
void scale_avg(void* p, size_t n, ncclDataType_t t, int nranks) {
  if (t == ncclFloat32)
    for (size_t i = 0; i < n; ++i) static_cast<float*>(p)[i] /= static_cast<float>(nranks);
  else if (t == ncclFloat64)
    for (size_t i = 0; i < n; ++i) static_cast<double*>(p)[i] /= nranks;
  else if (t == ncclBfloat16)
    for (size_t i = 0; i < n; ++i)
      static_cast<uint16_t*>(p)[i] = to_bf(bf(static_cast<uint16_t*>(p)[i]) / static_cast<float>(nranks));
}

// One NCCL operation: post() copies its inputs into host buffers and posts MPI requests (or, on
// one rank, does the copy itself); finish() copies the results into device memory.
struct Part {
  ncclComm* comm = nullptr;
  cudaStream_t stream = nullptr;
  std::string what;
  std::function<void(std::vector<MPI_Request>&)> post;
  std::function<void()> finish;
};

struct Group {
  int depth = 0;
  std::vector<Part> parts;
};
Group& group() {
  static Group g;
  return g;
}

void enqueue_parts(std::vector<Part> parts) {
  // one stream operation per stream: a group's sends and receives are posted together
  while (!parts.empty()) {
    cudaStream_t s = parts.front().stream;
    std::vector<Part> mine, rest;
    for (auto& p : parts) (p.stream == s ? mine : rest).push_back(std::move(p));
    parts = std::move(rest);
    auto shared = std::make_shared<std::vector<Part>>(std::move(mine));
    auto reqs = std::make_shared<std::vector<MPI_Request>>();
    std::string what;
    for (auto& p : *shared) what += (what.empty() ? "" : " + ") + p.what;
    ctx_emu::Op op;
    op.what = what;
    auto finish = [shared] {
      for (auto& p : *shared)
        if (p.finish && !p.comm->aborted) p.finish();
    };
    op.start = [shared, reqs, finish] {
      for (auto& p : *shared)
        if (!p.comm->aborted) p.post(*reqs);
      if (reqs->empty()) {
        finish();
        return true;
      }
      return false;
    };
    op.poll = [shared, reqs, finish] {
      for (auto& p : *shared)
        if (p.comm->aborted) return true;
      int flag = 0;
      MPI_Testall(static_cast<int>(reqs->size()), reqs->data(), &flag, MPI_STATUSES_IGNORE);
      if (!flag) return false;
      finish();
      return true;
    };
    op.waiting = [what] { return "the other ranks of " + what; };
    Device::get().enqueue(s, std::move(op));
  }
}

ncclResult_t submit(Part p) {
  if (!p.comm) return ncclInvalidArgument;
  if (p.comm->aborted) return ncclInvalidUsage;
  if (group().depth > 0) {
    group().parts.push_back(std::move(p));
    return ncclSuccess;
  }
  std::vector<Part> one;
  one.push_back(std::move(p));
  enqueue_parts(std::move(one));
  return ncclSuccess;
}

bool device_side(const void* p) { return Device::get().kind(p) != ctx_emu::PtrKind::pageable; }

std::string hex(const unsigned char* b, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += d[b[i] >> 4], s += d[b[i] & 15];
  return s;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* v) {
  *v = NCCL_VERSION_CODE;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument (emulated NCCL)";
    case ncclInvalidUsage: return "invalid usage (emulated NCCL)";
    case ncclSystemError: return "system error (emulated NCCL)";
    case ncclInProgress: return "in progress";
    default: return "emulated NCCL error";
  }
}
const char* ncclGetLastError(ncclComm_t) { return ""; }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof(*id));
  std::random_device rd;
  unsigned char token[16];
  for (auto& t : token) t = static_cast<unsigned char>(rd());
  std::snprintf(id->internal, sizeof(id->internal), "ctxemu-%s", hex(token, 16).c_str());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  if (std::strncmp(id.internal, "ctxemu-", 7) != 0) return ncclInvalidArgument;
  auto c = std::make_unique<ncclComm>();
  c->nranks = nranks;
  c->rank = rank;
  c->token = std::string(id.internal + 7, 32);
  if (nranks > 1) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      std::fprintf(stderr, "emulated NCCL: a communicator of %d ranks needs MPI (run under mpirun)\n", nranks);
      return ncclInvalidUsage;
    }
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    const char* tmp = std::getenv("TMPDIR");
    const std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/ctx-emu-nccl-" + c->token;
    mkdir(dir.c_str(), 0700);
    {
      const std::string part = dir + "/" + std::to_string(rank) + ".tmp";
      std::ofstream(part) << world_rank << "\n";
      std::rename(part.c_str(), (dir + "/" + std::to_string(rank)).c_str());
    }
    std::vector<int> members(nranks, -1);
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < nranks; ++r) {
      for (;;) {
        std::ifstream f(dir + "/" + std::to_string(r));
        if (f >> members[r]) break;
        if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(120)) {
          std::fprintf(stderr, "emulated NCCL: rank %d of %s never joined (120 s)\n", r, c->token.c_str());
          return ncclSystemError;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    MPI_Group world_group, g;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, nranks, members.data(), &g);
    const int tag = static_cast<int>(std::strtoul(c->token.substr(0, 4).c_str(), nullptr, 16) % 30000);
    if (MPI_Comm_create_group(MPI_COMM_WORLD, g, tag, &c->mpi) != MPI_SUCCESS) return ncclSystemError;
    MPI_Group_free(&g);
    MPI_Group_free(&world_group);
    MPI_Barrier(c->mpi);  // every member has read every file
    std::remove((dir + "/" + std::to_string(rank)).c_str());
    MPI_Barrier(c->mpi);
    if (rank == 0) rmdir(dir.c_str());
  }
  *out = c.release();
  return ncclSuccess;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank, ncclConfig_t*) {
  return ncclCommInitRank(out, nranks, id, rank);  // blocking or not, the emulated init completes here
}
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  Lock l(Device::get().mutex());
  Device::get().synchronize_all();
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm->mpi != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  comm->aborted = true;  // queued and in-flight operations of this communicator complete at once, as no-ops
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* err) {
  if (!comm) return ncclInvalidArgument;
  *err = ncclSuccess;
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* n) {
  *n = comm->nranks;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* r) {
  *r = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  group().depth++;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  Lock l(Device::get().mutex());
  if (group().depth == 0) return ncclInvalidUsage;
  if (--group().depth == 0) {
    std::vector<Part> parts = std::move(group().parts);
    group().parts.clear();
    enqueue_parts(std::move(parts));
  }
  return ncclSuccess;
}

}  // extern "C"

namespace {
// A collective on host staging buffers: `send` (in_bytes) is copied into a host buffer when the
// stream reaches it, MPI runs between host buffers, the first out_bytes of the result go into
// `recv` when it completes (then `after(recv)`). On one rank each of these collectives is the
// identity on its first out_bytes.
template <typename Mpi>
ncclResult_t staged(ncclComm_t comm, cudaStream_t s, const char* what, const void* send, size_t in_bytes, void* recv,
                    size_t out_bytes, Mpi mpi, std::function<void(void*)> after = {}) {
  auto in = std::make_shared<std::vector<char>>(in_bytes), out = std::make_shared<std::vector<char>>(out_bytes);
  Part p{comm, s, what, {}, {}};
  p.post = [=](std::vector<MPI_Request>& reqs) {
    std::memcpy(in->data(), send, in_bytes);
    if (comm->nranks == 1) {
      std::memcpy(out->data(), in->data(), out_bytes);
      return;
    }
    reqs.emplace_back();
    mpi(in->data(), out->data(), comm->mpi, &reqs.back());
  };
  p.finish = [=] {
    std::memcpy(recv, out->data(), out_bytes);
    if (after) after(recv);
  };
  return submit(std::move(p));
}
}  // namespace

extern "C" {

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t s) {
  Lock l(Device::get().mutex());
  MPI_Datatype mt;
  MPI_Op mo;
  if (!comm || !mpi_type(t, &mt) || !mpi_op(op, t, &mo) || !device_side(send) || !device_side(recv))
    return ncclInvalidArgument;
  const size_t bytes = count * type_bytes(t);
  return staged(
      comm, s, "ncclAllReduce", send, bytes, recv, bytes,
      [=](void* in, void* out, MPI_Comm c, MPI_Request* r) { MPI_Iallreduce(in, out, static_cast<int>(count), mt, mo, c, r); },
      [=](void* p) {
        if (op == ncclAvg) scale_avg(p, count, t, comm->nranks);
      });
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t s) {
  Lock l(Device::get().mutex());
  MPI_Datatype mt;
  MPI_Op mo;
  if (!comm || !mpi_type(t, &mt) || !mpi_op(op, t, &mo) || !device_side(send) || !device_side(recv))
    return ncclInvalidArgument;
  const size_t bytes = recvcount * type_bytes(t);
  return staged(
      comm, s, "ncclReduceScatter", send, bytes * comm->nranks, recv, bytes,
      [=](void* in, void* out, MPI_Comm c, MPI_Request* r) {
        MPI_Ireduce_scatter_block(in, out, static_cast<int>(recvcount), mt, mo, c, r);
      },
      [=](void* p) {
        if (op == ncclAvg) scale_avg(p, recvcount, t, comm->nranks);
      });
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t s) {
  Lock l(Device::get().mutex());
  const size_t bytes = sendcount * type_bytes(t);
  if (!comm || !bytes || !device_side(send) || !device_side(recv)) return ncclInvalidArgument;
  const int n = static_cast<int>(bytes);
  return staged(comm, s, "ncclAllGather", send, bytes, recv, bytes * comm->nranks,
                [=](void* in, void* out, MPI_Comm c, MPI_Request* r) { MPI_Iallgather(in, n, MPI_BYTE, out, n, MPI_BYTE, c, r); });
}

ncclResult_t ncclAlltoAll(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t comm,
                          cudaStream_t s) {
  Lock l(Device::get().mutex());
  const size_t bytes = count * type_bytes(t);
  if (!comm || !bytes || !device_side(send) || !device_side(recv)) return ncclInvalidArgument;
  const int n = static_cast<int>(bytes);
  return staged(comm, s, "ncclAlltoAll", send, bytes * comm->nranks, recv, bytes * comm->nranks,
                [=](void* in, void* out, MPI_Comm c, MPI_Request* r) { MPI_Ialltoall(in, n, MPI_BYTE, out, n, MPI_BYTE, c, r); });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t s) {
  Lock l(Device::get().mutex());
  const size_t bytes = count * type_bytes(t);
  if (!comm || root < 0 || root >= comm->nranks || !device_side(recv) || (comm->rank == root && !device_side(send)))
    return ncclInvalidArgument;
  auto buf = std::make_shared<std::vector<char>>(bytes);
  Part p{comm, s, "ncclBroadcast", {}, {}};
  p.post = [=](std::vector<MPI_Request>& reqs) {
    if (comm->rank == root) std::memcpy(buf->data(), send, bytes);
    if (comm->nranks == 1) return;
    reqs.emplace_back();
    MPI_Ibcast(buf->data(), static_cast<int>(bytes), MPI_BYTE, root, comm->mpi, &reqs.back());
  };
  p.finish = [=] { std::memcpy(recv, buf->data(), bytes); };
  return submit(std::move(p));
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t s) {
  Lock l(Device::get().mutex());
  const size_t bytes = count * type_bytes(t);
  if (!comm || peer < 0 || peer >= comm->nranks || !device_side(send)) return ncclInvalidArgument;
  auto buf = std::make_shared<std::vector<char>>(bytes);
  Part p{comm, s, "ncclSend to " + std::to_string(peer), {}, {}};
  p.post = [=](std::vector<MPI_Request>& reqs) {
    std::memcpy(buf->data(), send, bytes);
    if (comm->nranks == 1) {
      comm->to_self.push_back(buf);
      return;
    }
    reqs.emplace_back();
    MPI_Isend(buf->data(), static_cast<int>(bytes), MPI_BYTE, peer, 0, comm->mpi, &reqs.back());
  };
  return submit(std::move(p));
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t s) {
  Lock l(Device::get().mutex());
  const size_t bytes = count * type_bytes(t);
  if (!comm || peer < 0 || peer >= comm->nranks || !device_side(recv)) return ncclInvalidArgument;
  auto buf = std::make_shared<std::vector<char>>(bytes);
  Part p{comm, s, "ncclRecv from " + std::to_string(peer), {}, {}};
  p.post = [=](std::vector<MPI_Request>& reqs) {
    if (comm->nranks == 1) return;
    reqs.emplace_back();
    MPI_Irecv(buf->data(), static_cast<int>(bytes), MPI_BYTE, peer, 0, comm->mpi, &reqs.back());
  };
  p.finish = [=] {
    if (comm->nranks == 1) {  // the matching send was posted before (in this group or earlier)
      if (comm->to_self.empty() || comm->to_self.front()->size() != bytes)
        throw std::runtime_error("emulated NCCL: a receive from itself with no matching send of " +
                                 std::to_string(bytes) + " bytes");
      std::memcpy(recv, comm->to_self.front()->data(), bytes);
      comm->to_self.pop_front();
      return;
    }
    std::memcpy(recv, buf->data(), bytes);
  };
  return submit(std::move(p));
}

}  // extern "C"
