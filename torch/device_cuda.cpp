// device_cuda.cpp: CUDA tensors (see device.hpp), with torch's device-generic Stream, Event and
// guard APIs, so this file builds against any torch wheel (the CPU one in CI) and runs where torch
// has CUDA. The few driver calls torch has no device-generic form of (stream memory operations on
// mapped pinned host memory, dedicated streams) come from libcuda.so.1 at run time (Driver below).
//
// One collective, on the caller's thread at issue (ARCHITECTURE.md, "Device handoff"):
//   1. ticket t = the context's next ticket; an event on the caller's current stream; the
//      context's copy-out stream waits on it and copies every input (and, so that a collective
//      that fails before writing leaves them as they were, every output) into pooled pinned host
//      buffers (torch's caching host allocator), then writes t into the producer word
//      (cuStreamWriteValue64, after a memory barrier): the producer timeline (O1).
//   2. the C call, with that producer and a consumer timeline: one of kLanes words, lane t % kLanes.
//   3. the copy-back stream waits until the lane reaches t (cuStreamWaitValue64), copies the
//      results back into the tensors, and records the consumer event. Only the engine raises the
//      lane, when the collective is finished, also on error, timeout or abort: no stream waits
//      forever, and the engine calls nothing of CUDA.
// wait()/synchronize() make the waiter's current stream wait on the consumer event; the Future is
// completed (on the completion pool) on a stream that waits on it too. Collectives finish in the
// engine's run order and share one copy-back stream; follow-ups (issued from Future callbacks, run
// before collectives issued earlier) have one of their own, and sends and receives one per peer,
// so no copy-back waits behind a ticket that is raised later than its own. The copy-back stream
// also waits on an event recorded after the producer write: CUDA's stream memory operations ask
// that an order they establish be visible to CUDA as well (so its scheduler never serialises a
// stream wait ahead of the work it depends on).
//
// Lifetime: the Work holds the tensors and pinned buffers; the caching allocator is told which side
// stream uses which tensor (recordDataPtrOnStream), and torch records the pinned buffers' use by
// each asynchronous copy, so neither reuses memory a pending copy reads or writes (the paper's
// buffer-reuse race). A context's streams and ticket words are kept for the life of the process:
// the caching allocator may still hold events to record on those streams for tensors freed later,
// and freeing mapped host memory would synchronise the device on whatever thread drops the last
// Work (32 KiB and two or three streams per group and device).
#include "device.hpp"

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <string>

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

namespace mccl {
namespace {

// ---- the CUDA driver, from libcuda.so.1 -----------------------------------------------------
// Values and signatures from CUDA's cuda.h (driver API, CUDA 12/13): declared here so that no CUDA
// toolkit is needed to build.
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUstream = void*;
using CUdeviceptr = unsigned long long;
constexpr unsigned kStreamNonBlocking = 0x1;      // CU_STREAM_NON_BLOCKING
constexpr unsigned kHostAllocPortable = 0x01;     // CU_MEMHOSTALLOC_PORTABLE
constexpr unsigned kHostAllocDeviceMap = 0x02;    // CU_MEMHOSTALLOC_DEVICEMAP
constexpr unsigned kWaitGeq = 0x0;                // CU_STREAM_WAIT_VALUE_GEQ: (int)(*addr - v) >= 0
constexpr unsigned kWriteDefault = 0x0;           // CU_STREAM_WRITE_VALUE_DEFAULT: after a barrier
constexpr int kAttr64BitMemOps = 122;             // CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS

struct Driver {
  bool loaded = false;
  std::string why;  // why it did not load
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*cuCtxPushCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxPopCurrent)(CUcontext*) = nullptr;
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr*, void*, unsigned) = nullptr;
  CUresult (*cuMemFreeHost)(void*) = nullptr;
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuStreamWriteValue64)(CUstream, CUdeviceptr, unsigned long long, unsigned) = nullptr;
  CUresult (*cuStreamWaitValue64)(CUstream, CUdeviceptr, unsigned long long, unsigned) = nullptr;
  CUresult (*cuStreamWriteValue32)(CUstream, CUdeviceptr, unsigned, unsigned) = nullptr;
  CUresult (*cuStreamWaitValue32)(CUstream, CUdeviceptr, unsigned, unsigned) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;

  static Driver& get() {
    static Driver d = load();
    return d;
  }

  // Throws a RuntimeError naming the call and CUDA's message unless `r` is CUDA_SUCCESS (0).
  void check(CUresult r, const char* what) const {
    if (r == 0) return;
    const char* msg = nullptr;
    if (cuGetErrorString != nullptr) cuGetErrorString(r, &msg);
    TORCH_CHECK(false, "mccl cuda: ", what, " failed: CUDA error ", r, " (", msg ? msg : "unknown", ")");
  }

 private:
  template <typename F>
  static bool sym(void* lib, F& fn, const char* name, const char* fallback = nullptr) {
    void* p = dlsym(lib, name);
    if (p == nullptr && fallback != nullptr) p = dlsym(lib, fallback);
    fn = reinterpret_cast<F>(p);
    return p != nullptr;
  }

  static Driver load() {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* err = dlerror();
      d.why = std::string("cannot load libcuda.so.1: ") + (err ? err : "unknown error");
      return d;
    }
    bool ok = sym(lib, d.cuDeviceGet, "cuDeviceGet") && sym(lib, d.cuDeviceGetAttribute, "cuDeviceGetAttribute") &&
              sym(lib, d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
              sym(lib, d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease") &&
              sym(lib, d.cuCtxPushCurrent, "cuCtxPushCurrent_v2", "cuCtxPushCurrent") &&
              sym(lib, d.cuCtxPopCurrent, "cuCtxPopCurrent_v2", "cuCtxPopCurrent") &&
              sym(lib, d.cuMemHostAlloc, "cuMemHostAlloc") &&
              sym(lib, d.cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer") &&
              sym(lib, d.cuMemFreeHost, "cuMemFreeHost") && sym(lib, d.cuStreamCreate, "cuStreamCreate") &&
              sym(lib, d.cuStreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy") &&
              sym(lib, d.cuStreamSynchronize, "cuStreamSynchronize") &&
              sym(lib, d.cuStreamWriteValue64, "cuStreamWriteValue64_v2", "cuStreamWriteValue64") &&
              sym(lib, d.cuStreamWaitValue64, "cuStreamWaitValue64_v2", "cuStreamWaitValue64") &&
              sym(lib, d.cuStreamWriteValue32, "cuStreamWriteValue32_v2", "cuStreamWriteValue32") &&
              sym(lib, d.cuStreamWaitValue32, "cuStreamWaitValue32_v2", "cuStreamWaitValue32") &&
              sym(lib, d.cuGetErrorString, "cuGetErrorString");
    if (!ok) {
      d.why = "libcuda.so.1 lacks the stream memory operations (cuStreamWaitValue64 and friends); update the driver";
      return d;
    }
    d.loaded = true;
    return d;
  }
};

// The device's primary context made current on this thread for the scope (driver calls need one;
// the thread may have none, or another device's).
class CtxScope {
 public:
  explicit CtxScope(CUcontext ctx) : d_(Driver::get()) { d_.check(d_.cuCtxPushCurrent(ctx), "cuCtxPushCurrent"); }
  ~CtxScope() {
    CUcontext ignored = nullptr;
    d_.cuCtxPopCurrent(&ignored);
  }

 private:
  const Driver& d_;
};

const c10::impl::DeviceGuardImplInterface* cudaImpl() { return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA); }

// A side stream of our own: created by the driver and wrapped as an external torch stream (a
// stream id that is the handle itself), so that no other code is handed it from torch's pool and
// queues work behind our waits. Where the wrapping does not round-trip on this torch, a stream
// from torch's pool is used instead (said once in the log).
struct SideStream {
  c10::Stream stream;
  CUstream raw = nullptr;
  bool owned = false;
};

constexpr size_t kLanes = 4096;  // consumer words: requests of one context in flight at once

class CudaContext final : public DeviceContext {
 public:
  CudaContext(const c10::Device& device, int64_t timeout_ms) : device_(device), timeout_ms_(timeout_ms) {
    const Driver& d = Driver::get();
    TORCH_CHECK(d.loaded, "mccl: cuda tensors need the CUDA driver's stream memory operations: ", d.why);
    d.check(d.cuDeviceGet(&dev_, device.index()), "cuDeviceGet");
    d.check(d.cuDevicePrimaryCtxRetain(&ctx_, dev_), "cuDevicePrimaryCtxRetain");
    CtxScope scope(ctx_);
    int wide = 0;
    d.check(d.cuDeviceGetAttribute(&wide, kAttr64BitMemOps, dev_), "cuDeviceGetAttribute");
    wide_ = wide != 0;
    // One word for the producer timeline, then the consumer lanes; mapped, so streams reach it.
    void* host = nullptr;
    d.check(d.cuMemHostAlloc(&host, (kLanes + 1) * sizeof(uint64_t), kHostAllocPortable | kHostAllocDeviceMap),
            "cuMemHostAlloc (the ticket words)");
    words_ = static_cast<uint64_t*>(host);
    for (size_t i = 0; i <= kLanes; i++) words_[i] = 0;
    d.check(d.cuMemHostGetDevicePointer(&words_dev_, host, 0), "cuMemHostGetDevicePointer");
    const int flags = wide_ ? 0 : MCCL_TIMELINE_32BIT;
    check(mcclTimelineCreate(&words_[0], flags, nullptr, &producer_), "the producer timeline");
    lanes_.resize(kLanes, nullptr);
    for (size_t i = 0; i < kLanes; i++) check(mcclTimelineCreate(&words_[i + 1], flags, nullptr, &lanes_[i]), "a lane");
    d2h_ = makeStream();
    coll_h2d_ = makeStream();
  }

  ~CudaContext() override {
    // Every request of this context was released (each Work holds the context): the timelines'
    // CPU side may go. The words and streams stay (see "Lifetime" above), and so does the retained
    // primary context they live in.
    mcclTimelineDestroy(producer_);
    for (mcclTimeline_t tl : lanes_) mcclTimelineDestroy(tl);
  }

  const c10::Device& device() const { return device_; }

  // Step 1 (see the top of this file) under the context's lock, so that tickets are written on
  // the copy-out stream in the order they are handed out. Returns the ticket (its lane is
  // t % kLanes); `produced` is recorded right after the ticket's write.
  template <typename CopyOut>
  uint64_t produce(CopyOut copy_out, c10::Event& produced) {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t t = next_ticket_ + 1;
    mcclTimeline_t lane = this->lane(t);
    if (t > kLanes && mcclTimelinePoll(lane, t - kLanes) != mcclSuccess) {
      // The lane's previous request (kLanes tickets ago) is still running: wait for it (a host
      // wait, only with kLanes requests of this group on this device in flight).
      mcclResult_t res = mcclTimelineWait(lane, t - kLanes, timeout_ms_);
      TORCH_CHECK(res == mcclSuccess, "mccl cuda: ", kLanes, " collectives in flight on ", device_,
                  " and the oldest did not finish within the group's timeout (", mcclGetErrorString(res), ")");
    }
    c10::Event ready(c10::DeviceType::CUDA);
    ready.record(cudaImpl()->getStream(device_));
    ready.block(d2h_.stream);
    {
      c10::StreamGuard guard(d2h_.stream);
      copy_out(d2h_.stream);
    }
    write(d2h_.raw, 0, t);
    produced.record(d2h_.stream);
    next_ticket_ = t;
    return t;
  }

  mcclTimeline_t producer() const { return producer_; }
  mcclTimeline_t lane(uint64_t ticket) const { return lanes_[ticket % kLanes]; }

  // The copy-back stream: one for collectives, one for follow-ups, one per peer for sends and
  // receives (key -1 - peer, so that any-source receives, peer -1, get one too).
  SideStream& copyBackStream(const CallKind& call) {
    if (!call.p2p && !call.follow_up) return coll_h2d_;
    int key = call.p2p ? -2 - call.peer : 0;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = other_h2d_.find(key);
    if (it == other_h2d_.end()) it = other_h2d_.emplace(key, makeStream()).first;
    return it->second;
  }

  // The stream waits until the lane of `ticket` reaches it.
  void waitLane(const SideStream& s, uint64_t ticket) {
    const Driver& d = Driver::get();
    CtxScope scope(ctx_);
    CUdeviceptr addr = words_dev_ + (ticket % kLanes + 1) * sizeof(uint64_t);
    uint64_t value = ticket;
    if (wide_) d.check(d.cuStreamWaitValue64(s.raw, addr, value, kWaitGeq), "cuStreamWaitValue64");
    else d.check(d.cuStreamWaitValue32(s.raw, addr, static_cast<unsigned>(value), kWaitGeq), "cuStreamWaitValue32");
  }

 private:
  static void check(mcclResult_t res, const char* what) {
    TORCH_CHECK(res == mcclSuccess, "mccl cuda: cannot create ", what, ": ", mcclGetLastError(nullptr));
  }

  void write(CUstream s, size_t word, uint64_t value) {
    const Driver& d = Driver::get();
    CtxScope scope(ctx_);
    CUdeviceptr addr = words_dev_ + word * sizeof(uint64_t);
    if (wide_) d.check(d.cuStreamWriteValue64(s, addr, value, kWriteDefault), "cuStreamWriteValue64");
    else d.check(d.cuStreamWriteValue32(s, addr, static_cast<unsigned>(value), kWriteDefault), "cuStreamWriteValue32");
  }

  SideStream makeStream() {
    const Driver& d = Driver::get();
    CUstream raw = nullptr;
    {
      CtxScope scope(ctx_);
      d.check(d.cuStreamCreate(&raw, kStreamNonBlocking), "cuStreamCreate");
    }
    c10::Stream wrapped(c10::Stream::UNSAFE, device_, static_cast<c10::StreamId>(reinterpret_cast<intptr_t>(raw)));
    if (wrapped.native_handle() == raw) return SideStream{wrapped, raw, true};
    {
      CtxScope scope(ctx_);
      d.cuStreamDestroy(raw);
    }
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      fprintf(stderr, "mccl: this torch does not wrap external CUDA streams as expected; the side streams come "
                      "from torch's stream pool\n");
    c10::Stream pooled = cudaImpl()->getNewStream(device_);
    return SideStream{pooled, pooled.native_handle(), false};
  }

  c10::Device device_;
  int64_t timeout_ms_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  bool wide_ = true;
  uint64_t* words_ = nullptr;
  CUdeviceptr words_dev_ = 0;
  mcclTimeline_t producer_ = nullptr;
  std::vector<mcclTimeline_t> lanes_;
  SideStream d2h_{c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CUDA, 0))};
  SideStream coll_h2d_{c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CUDA, 0))};
  std::map<int, SideStream> other_h2d_;  // follow-ups (key 0) and each peer's sends/receives
  std::mutex mu_;
  uint64_t next_ticket_ = 0;
};

void recordOn(const at::Tensor& t, const c10::Stream& s) {
  if (t.defined() && t.numel() > 0) cudaImpl()->recordDataPtrOnStream(t.storage().data_ptr(), s);
}

class CudaStaging final : public Staging {
 public:
  CudaStaging(std::shared_ptr<CudaContext> ctx, const CallKind& call) : ctx_(std::move(ctx)), call_(call) {}

  at::Tensor input(const at::Tensor& t) override {
    at::Tensor p = pinned(t.sizes(), t.scalar_type());
    outs_.push_back({t, p});
    keep_.push_back(t);
    return p;
  }
  at::Tensor inout(const at::Tensor& t) override {
    at::Tensor p = input(t);
    backs_.emplace_back(t, p);
    return p;
  }
  at::Tensor buffer(int64_t numel, at::ScalarType dtype, const std::function<at::Tensor()>& initial) override {
    at::Tensor p = pinned({numel}, dtype);
    at::Tensor now = initial();  // on the caller's stream, before the producer event
    TORCH_CHECK(now.numel() == numel, "mccl cuda: internal error: staging layout of ", now.numel(), " elements for ",
                numel);
    outs_.push_back({now.reshape({numel}), p});
    keep_.push_back(now);
    return p;
  }
  void copyBack(const at::Tensor& dst, const at::Tensor& src) override { backs_.emplace_back(dst, src); }

  void commit(mcclHandoff_t* h) override {
    ticket_ = ctx_->produce([&](const c10::Stream& s) {
      for (auto& [src, dst] : outs_) {
        dst.copy_(src.detach(), /*non_blocking=*/true);
        recordOn(src, s);
      }
    }, produced_);
    h->producer = ctx_->producer();
    h->producer_value = ticket_;
    h->consumer = ctx_->lane(ticket_);
    h->consumer_value = ticket_;
  }

  void refused() override { mcclTimelineSignal(ctx_->lane(ticket_), ticket_); }  // the lane may be reused

  void issued() override {
    SideStream& s = ctx_->copyBackStream(call_);
    produced_.block(s.stream);  // a CUDA-visible order as well: producer, then consumer
    ctx_->waitLane(s, ticket_);
    c10::StreamGuard guard(s.stream);
    // Results come back from the pinned buffers: straight into a contiguous tensor of the same
    // size, or through a device copy of the whole buffer for views and non-contiguous targets.
    std::vector<std::pair<at::Tensor, at::Tensor>> on_device;  // pinned buffer -> its device copy
    for (auto& [dst_in, src] : backs_) {
      at::Tensor dst = dst_in.detach();
      recordOn(dst, s.stream);
      const at::Tensor* whole = bufferOf(src);
      bool direct = whole != nullptr && src.is_contiguous() && src.numel() == whole->numel() && dst.is_contiguous();
      if (direct) {
        dst.view(src.sizes()).copy_(src, /*non_blocking=*/true);
        continue;
      }
      TORCH_CHECK(whole != nullptr, "mccl cuda: internal error: a copy-back from outside the staging buffers");
      at::Tensor dev;
      for (auto& [b, d] : on_device)
        if (b.is_same(*whole)) dev = d;
      if (!dev.defined()) {
        dev = at::empty(whole->sizes(), whole->options().device(ctx_->device()).pinned_memory(false));
        dev.copy_(*whole, /*non_blocking=*/true);
        on_device.emplace_back(*whole, dev);
        keep_.push_back(dev);
      }
      at::Tensor view = dev.as_strided(src.sizes(), src.strides(), src.storage_offset() - whole->storage_offset());
      copyElements(dst, view);
    }
    done_.emplace(c10::DeviceType::CUDA);
    done_->record(s.stream);
  }

  void complete(bool) override {}  // the copy-backs run on the device, queued at issue

  void consumerWait() override {
    if (done_.has_value()) done_->block(cudaImpl()->getStream(ctx_->device()));
  }
  std::vector<c10::Device> futureDevices() const override { return {ctx_->device()}; }
  std::optional<c10::StreamGuard> completionGuard() override {
    // A pool stream that waits for this collective's copy-backs only (the copy-back stream itself
    // may hold later collectives' waits by now).
    c10::Stream s = cudaImpl()->getStreamFromGlobalPool(ctx_->device());
    if (done_.has_value()) done_->block(s);
    return std::optional<c10::StreamGuard>(std::in_place, s);
  }
  bool hostWait() const override { return false; }

 private:
  at::Tensor pinned(at::IntArrayRef sizes, at::ScalarType dtype) {
    at::Tensor p = at::empty(sizes, at::TensorOptions().dtype(dtype).pinned_memory(true));
    buffers_.push_back(p);
    return p;
  }
  // The pinned buffer `view` looks into, or nullptr.
  const at::Tensor* bufferOf(const at::Tensor& view) const {
    for (const at::Tensor& b : buffers_)
      if (b.storage().is_alias_of(view.storage())) return &b;
    return nullptr;
  }

  std::shared_ptr<CudaContext> ctx_;
  CallKind call_;
  std::vector<std::pair<at::Tensor, at::Tensor>> outs_;   // device tensor -> pinned buffer (copy-out)
  std::vector<std::pair<at::Tensor, at::Tensor>> backs_;  // device tensor <- pinned view (copy-back)
  std::vector<at::Tensor> buffers_;                       // the pinned buffers
  std::vector<at::Tensor> keep_;                          // device tensors the side streams use
  uint64_t ticket_ = 0;
  c10::Event produced_{c10::DeviceType::CUDA};            // after the producer's ticket write
  std::optional<c10::Event> done_;                        // after the copy-backs (the consumer event)
};

class CudaKind final : public DeviceKind {
 public:
  std::unique_ptr<Staging> begin(DeviceContexts& contexts, const c10::Device& device, const CallKind& call) override {
    auto ctx = std::static_pointer_cast<CudaContext>(
        contextFor(contexts, device, [&] { return std::make_shared<CudaContext>(device, contexts.timeout_ms); }));
    return std::make_unique<CudaStaging>(std::move(ctx), call);
  }
};

}  // namespace

DeviceKind* cudaDeviceKind() {
  static CudaKind kind;
  return &kind;
}

}  // namespace mccl
