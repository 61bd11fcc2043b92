// The CUDA runtime API subset the backend uses, on the emulated device (emu_device.hpp). Compiled
// with emu_prelude.hpp, so each function below is defined under its renamed symbol
// (ctxemu_cudaMalloc, ...) and the real libcudart can be linked into the same program.
//
// Copies: host-to-device from pageable memory is staged at the call (the caller may reuse its
// buffer at once, as CUDA documents); device-to-host into pageable memory waits for the stream
// (CUDA makes it synchronous); copies from or into pinned memory run when the stream reaches them,
// so the host must wait before reading. Device pointers given as host addresses (or the reverse,
// with an explicit kind) fail with cudaErrorInvalidValue.
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "executor/cuda/emulated/emu_device.hpp"
#include "executor/cuda/emulated/emu_launch.hpp"

using ctx_emu::Device;
using ctx_emu::Op;
using ctx_emu::PtrKind;

namespace ctx_emu {

struct EventState {
  StreamState* stream = nullptr;  // of the last record (nullptr: never recorded)
  uint64_t pos = 0;               // the stream position the last record completes at
  uint64_t gen = 0;               // records so far: only the last one's time counts
  double time_s = -1;
  bool timing = true;
};

std::unordered_map<const void*, size_t>& func_smem() {
  static std::unordered_map<const void*, size_t> m;
  return m;
}
size_t max_dynamic_smem_of(const void* kernel) {
  auto it = func_smem().find(kernel);
  return it == func_smem().end() ? 0 : it->second;
}

}  // namespace ctx_emu

namespace {

using Lock = std::lock_guard<std::recursive_mutex>;
Device& dev() { return Device::get(); }
ctx_emu::EventState* ev(cudaEvent_t e) { return reinterpret_cast<ctx_emu::EventState*>(e); }

cudaError_t fail(cudaError_t e) {
  ctx_emu::last_error() = e;
  return e;
}

bool is_device_side(PtrKind k) { return k != PtrKind::pageable; }  // device, pinned or managed

// kind checks as the real runtime makes them (cudaMemcpyDefault infers the direction)
bool kind_ok(cudaMemcpyKind kind, PtrKind dst, PtrKind src) {
  switch (kind) {
    case cudaMemcpyHostToDevice: return src != PtrKind::device && dst != PtrKind::pageable;
    case cudaMemcpyDeviceToHost: return src != PtrKind::pageable && dst != PtrKind::device;
    case cudaMemcpyDeviceToDevice: return is_device_side(src) && is_device_side(dst);
    case cudaMemcpyHostToHost: return src != PtrKind::device && dst != PtrKind::device;
    case cudaMemcpyDefault: return true;
  }
  return false;
}

cudaError_t memcpy_async(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s, bool sync) {
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return fail(cudaErrorInvalidValue);
  Device& d = dev();
  const PtrKind kd = d.kind(dst), ks = d.kind(src);
  if (!kind_ok(kind, kd, ks)) return fail(cudaErrorInvalidValue);
  if (ks == PtrKind::pageable) {  // staged now: the caller may reuse its buffer at once
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + n);
    d.enqueue(s, Op{"cudaMemcpyAsync from pageable host memory", {}, [dst, staged] {
                      std::memcpy(dst, staged->data(), staged->size());
                      return true;
                    }, {}, {}});
  } else {
    d.enqueue(s, Op{"cudaMemcpyAsync", {}, [dst, src, n] {
                      std::memmove(dst, src, n);
                      return true;
                    }, {}, {}});
  }
  if (sync || kd == PtrKind::pageable) d.synchronize_stream(s);  // into pageable memory: synchronous
  return cudaSuccess;
}

}  // namespace

extern "C" {

// ---- memory
cudaError_t cudaMalloc(void** p, size_t bytes) {
  Lock l(dev().mutex());
  *p = dev().malloc_device(bytes);
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void* p) {
  Lock l(dev().mutex());
  if (!p) return cudaSuccess;
  dev().synchronize_all();  // cudaFree synchronises the device
  const PtrKind k = dev().kind(p);
  if (k == PtrKind::device) dev().free_device(p);
  else if (k == PtrKind::managed) dev().free_host(p);
  else return fail(cudaErrorInvalidValue);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  Lock l(dev().mutex());
  *p = dev().malloc_host(bytes, false);
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) { return cudaMallocHost(p, bytes); }
cudaError_t cudaFreeHost(void* p) {
  Lock l(dev().mutex());
  if (!p) return cudaSuccess;
  dev().synchronize_all();
  if (dev().kind(p) != PtrKind::pinned) return fail(cudaErrorInvalidValue);
  dev().free_host(p);
  return cudaSuccess;
}
cudaError_t cudaMallocManaged(void** p, size_t bytes, unsigned int) {
  Lock l(dev().mutex());
  *p = dev().malloc_host(bytes, true);
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaMemAdvise(const void*, size_t, enum cudaMemoryAdvise, struct cudaMemLocation) { return cudaSuccess; }
cudaError_t cudaMemPrefetchAsync(const void*, size_t, struct cudaMemLocation, unsigned int, cudaStream_t) {
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  Lock l(dev().mutex());
  *total = dev().capacity_bytes();
  *free_bytes = dev().capacity_bytes() - dev().used_bytes();
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* a, const void* p) {
  Lock l(dev().mutex());
  std::memset(a, 0, sizeof(*a));
  switch (dev().kind(p)) {
    case PtrKind::device: a->type = cudaMemoryTypeDevice; a->devicePointer = const_cast<void*>(p); break;
    case PtrKind::pinned: a->type = cudaMemoryTypeHost; a->devicePointer = const_cast<void*>(p); a->hostPointer = const_cast<void*>(p); break;
    case PtrKind::managed: a->type = cudaMemoryTypeManaged; a->devicePointer = const_cast<void*>(p); a->hostPointer = const_cast<void*>(p); break;
    case PtrKind::pageable: a->type = cudaMemoryTypeUnregistered; a->hostPointer = const_cast<void*>(p); a->device = -2; return cudaSuccess;
  }
  a->device = 0;
  return cudaSuccess;
}

// ---- copies and fills
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
  Lock l(dev().mutex());
  return memcpy_async(dst, src, n, kind, s, false);
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, enum cudaMemcpyKind kind) {
  Lock l(dev().mutex());
  return memcpy_async(dst, src, n, kind, nullptr, true);
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t s) {
  Lock l(dev().mutex());
  if (width > dpitch || width > spitch) return fail(cudaErrorInvalidPitchValue);
  for (size_t r = 0; r < height; ++r) {
    const cudaError_t e = memcpy_async(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                                       width, kind, s, false);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t s) {
  Lock l(dev().mutex());
  if (n == 0) return cudaSuccess;
  if (dev().kind(p) == PtrKind::pageable) return fail(cudaErrorInvalidValue);
  dev().enqueue(s, Op{"cudaMemsetAsync", {}, [p, value, n] {
                       std::memset(p, value, n);
                       return true;
                     }, {}, {}});
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t n) {
  Lock l(dev().mutex());
  const cudaError_t e = cudaMemsetAsync(p, value, n, nullptr);
  if (e == cudaSuccess) dev().synchronize_all();
  return e;
}

// ---- device
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* p, int d) {
  if (d != 0) return fail(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof(*p));
  std::snprintf(p->name, sizeof(p->name), "%s", "emulated sm_90 (CPU test double)");
  p->major = 9;
  p->minor = 0;
  p->totalGlobalMem = Device::get().capacity_bytes();
  p->sharedMemPerBlock = 48 * 1024;
  p->sharedMemPerBlockOptin = ctx_emu::Limits::smem_optin;
  p->maxThreadsPerBlock = 1024;
  p->multiProcessorCount = 132;
  p->warpSize = 32;
  p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
  p->unifiedAddressing = 1;
  p->managedMemory = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, enum cudaDeviceAttr attr, int d) {
  if (d != 0) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrMultiProcessorCount: *v = 132; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = static_cast<int>(ctx_emu::Limits::smem_optin); break;
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    default: *v = 0; break;
  }
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  Lock l(dev().mutex());
  dev().synchronize_all();
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  Lock l(dev().mutex());
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || static_cast<size_t>(value) > ctx_emu::Limits::smem_optin) return fail(cudaErrorInvalidValue);
    ctx_emu::func_smem()[func] = static_cast<size_t>(value);
  }
  return cudaSuccess;
}

// ---- errors
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = ctx_emu::last_error();
  ctx_emu::last_error() = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return ctx_emu::last_error(); }
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorInvalidPitchValue: return "cudaErrorInvalidPitchValue";
    default: return "cudaError (emulated)";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    default: return "emulated CUDA error";
  }
}

// ---- streams
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  Lock l(dev().mutex());
  *s = reinterpret_cast<cudaStream_t>(dev().create_stream());
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) { return cudaStreamCreate(s); }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int, int) { return cudaStreamCreate(s); }
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}
cudaError_t cudaStreamGetPriority(cudaStream_t, int* p) {
  *p = 0;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  Lock l(dev().mutex());
  dev().destroy_stream(dev().resolve(s));
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Lock l(dev().mutex());
  dev().synchronize_stream(s);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  Lock l(dev().mutex());
  dev().progress();
  ctx_emu::StreamState* st = dev().resolve(s);
  return st->done >= st->issued ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  Lock l(dev().mutex());
  ctx_emu::EventState* x = ev(e);
  if (!x) return fail(cudaErrorInvalidResourceHandle);
  if (!x->stream) return cudaSuccess;  // never recorded: nothing to wait for
  ctx_emu::StreamState* st = x->stream;
  const uint64_t pos = x->pos;
  Op op{"cudaStreamWaitEvent", [st, pos] { return st->done >= pos; }, [] { return true; }, {},
        [st, pos] { return "stream " + std::to_string(st->id) + " reaching position " + std::to_string(pos); }};
  dev().enqueue(s, std::move(op));
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  Lock l(dev().mutex());
  dev().enqueue(s, Op{"cudaLaunchHostFunc", {}, [fn, data] {
                       fn(data);
                       return true;
                     }, {}, {}});
  return cudaSuccess;
}

// ---- events
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = reinterpret_cast<cudaEvent_t>(new ctx_emu::EventState());
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  auto* x = new ctx_emu::EventState();
  x->timing = (flags & cudaEventDisableTiming) == 0;
  *e = reinterpret_cast<cudaEvent_t>(x);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t) {
  return cudaSuccess;  // kept: a queued record or wait may still name it (a few bytes per event)
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  Lock l(dev().mutex());
  ctx_emu::EventState* x = ev(e);
  if (!x) return fail(cudaErrorInvalidResourceHandle);
  ctx_emu::StreamState* st = dev().resolve(s);
  const uint64_t gen = ++x->gen;
  Device* d = &dev();
  dev().enqueue(s, Op{"cudaEventRecord", {}, [x, gen, d] {
                       if (x->gen == gen) x->time_s = d->seconds();
                       return true;
                     }, {}, {}});
  x->stream = st;
  x->pos = st->issued;  // the record's own position (enqueue may have added a default-stream wait first)
  x->time_s = -1;
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  Lock l(dev().mutex());
  ctx_emu::EventState* x = ev(e);
  if (!x) return fail(cudaErrorInvalidResourceHandle);
  if (!x->stream) return cudaSuccess;
  dev().progress();
  return x->stream->done >= x->pos ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  Lock l(dev().mutex());
  ctx_emu::EventState* x = ev(e);
  if (!x) return fail(cudaErrorInvalidResourceHandle);
  if (!x->stream) return cudaSuccess;
  ctx_emu::StreamState* st = x->stream;
  const uint64_t pos = x->pos;
  dev().run_until([st, pos] { return st->done >= pos; }, "an event");
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  Lock l(dev().mutex());
  ctx_emu::EventState *x = ev(a), *y = ev(b);
  if (!x || !y || !x->timing || !y->timing) return fail(cudaErrorInvalidResourceHandle);
  if (!x->stream || !y->stream) return fail(cudaErrorInvalidResourceHandle);
  if (x->stream->done < x->pos || y->stream->done < y->pos || x->time_s < 0 || y->time_s < 0)
    return cudaErrorNotReady;
  *ms = static_cast<float>((y->time_s - x->time_s) * 1e3);
  return cudaSuccess;
}

}  // extern "C"
