// device_mps.mm: Apple MPS tensors (see device.hpp), macOS only. Objective-C++, compiled without
// ARC (ATen's MPS headers do not build under ARC): every Objective-C object here is retained and
// released by hand.
//
// STATUS: written to the paper's design against the ATen MPS headers of the Linux torch wheel; it
// has not been compiled or run on a Mac (there is none in this project's machines). The ordering
// it relies on (producer poll, consumer release, exactly once on every path) is the shared C layer
// that the CPU and CUDA tests cover.
//
// Unified path (the default, shared storage): the engine works in place on the tensors' own
// unified memory, through CPU tensors that alias the MTLBuffer contents (plus the storage offset).
// At issue, on PyTorch's thread and inside the MPS stream's serial queue after ending kernel
// coalescing, a signal of this Work's producer MTLSharedEvent is encoded after the kernels that
// write the bucket and the command buffer is committed; the engine polls the event's
// signaledValue (O1). A non-contiguous tensor is first made contiguous on the stream (before that
// signal). When the engine is done, the completion pool copies non-contiguous and list outputs
// back through the aliases (CPU copies: unified memory), then raises this Work's consumer event
// from the CPU. wait()/synchronize() encode a GPU-side wait for it on PyTorch's stream (O2); the
// Future is a CPU one, completed after the consumer event was raised (DDP's Future.wait() blocks
// its thread until then, the GPU never). Only PyTorch's thread encodes on its stream (O3).
//
// Staged path (MCCL_UNIFIED_COLLECTIVE=0, the paper's ablation, or storage the CPU cannot address):
// each tensor is copied to a CPU tensor at issue (torch blits and waits for the GPU: the host stall
// the ablation measures), the engine works on the copy, and wait() copies the result back on
// PyTorch's thread; the Future completes with the CPU copies, which DDP copies into the gradients.
#include "device.hpp"

#include <ATen/mps/MPSAllocatorInterface.h>
#include <ATen/mps/MPSStream.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#if __has_feature(objc_arc)
#error "device_mps.mm must be compiled without ARC (-fno-objc-arc)"
#endif

namespace mccl {
namespace {

bool unifiedEnabled() {
  int64_t v = 1;
  mcclGetEnvInt("MCCL_UNIFIED_COLLECTIVE", &v);  // the library's reader of the environment
  return v != 0;
}

// The host address of `t`'s first element, or nullptr when its storage is not CPU-visible.
// storage().data() is the MTLBuffer on the torch versions this was written against (2.11-2.13);
// the allocator says whether it is shared and where its contents are.
void* hostAddress(const at::Tensor& t) {
  const void* data = t.storage().data();
  at::mps::IMPSAllocator* alloc = at::mps::getIMPSAllocator();
  if (data == nullptr || !alloc->isSharedBuffer(data)) return nullptr;
  const void* contents = alloc->getSharedBufferPtr(data).first;
  if (contents == nullptr) return nullptr;
  return static_cast<char*>(const_cast<void*>(contents)) + t.storage_offset() * t.element_size();
}

// A CPU tensor over the same unified memory as MPS tensor `t` (same sizes and strides).
at::Tensor hostAlias(const at::Tensor& t) {
  void* p = hostAddress(t);
  TORCH_CHECK(p != nullptr, "mccl mps: internal error: no host address for a shared tensor");
  return at::from_blob(p, t.sizes(), t.strides(), at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU));
}

uint64_t eventRead(void* ctx) { return [(id<MTLSharedEvent>)ctx signaledValue]; }
void eventWrite(void* ctx, uint64_t v) { [(id<MTLSharedEvent>)ctx setSignaledValue:v]; }

// Encode `what` on PyTorch's current MPS stream, as PyTorch's own events do.
void onStream(void (^what)(at::mps::MPSStream*)) {
  at::mps::MPSStream* stream = at::mps::getCurrentMPSStream();
  at::mps::dispatch_sync_with_rethrow(stream->queue(), ^() {
    stream->endKernelCoalescing();
    what(stream);
  });
}

class MpsStaging final : public Staging {
 public:
  MpsStaging() {
    id<MTLDevice> dev = (id<MTLDevice>)at::mps::getCurrentMPSStream()->device();
    producer_event_ = [dev newSharedEvent];
    consumer_event_ = [dev newSharedEvent];
    mcclTimelineOps_t ops = {(void*)producer_event_, eventRead, eventWrite};
    TORCH_CHECK(mcclTimelineCreate(nullptr, 0, &ops, &producer_) == mcclSuccess, "mccl mps: ",
                mcclGetLastError(nullptr));
  }
  ~MpsStaging() override {
    mcclTimelineDestroy(producer_);
    [producer_event_ release];
    [consumer_event_ release];
  }

  at::Tensor input(const at::Tensor& t) override { return stage(t, false); }
  at::Tensor inout(const at::Tensor& t) override { return stage(t, true); }
  at::Tensor buffer(int64_t numel, at::ScalarType dtype, const std::function<at::Tensor()>&) override {
    // Copy-backs run only after a success (on the CPU), so no initial copy is needed.
    at::Tensor b = at::empty({numel}, at::TensorOptions().dtype(dtype));
    keep_.push_back(b);
    return b;
  }
  void copyBack(const at::Tensor& dst, const at::Tensor& src) override {
    if (!staged_ && hostAddress(dst) != nullptr) backs_.emplace_back(hostAlias(dst), src);
    else device_backs_.emplace_back(dst, src);
  }

  void commit(mcclHandoff_t* h) override {
    id<MTLSharedEvent> ev = producer_event_;
    onStream(^(at::mps::MPSStream* stream) {
      [stream->commandBuffer() encodeSignalEvent:ev value:1];
      stream->synchronize(at::mps::SyncType::COMMIT);
    });
    h->producer = producer_;
    h->producer_value = 1;
    h->consumer = nullptr;  // raised by complete(), after the host-side copy-backs
  }
  void issued() override {}
  void refused() override { [consumer_event_ setSignaledValue:1]; }

  void complete(bool ok) override {
    if (ok)
      for (auto& [dst, src] : backs_) copyElements(dst, src);
    backs_.clear();
    [consumer_event_ setSignaledValue:1];  // a CPU-side signal: never blocks on the GPU
  }
  void consumerWait() override {
    if (staged_) {
      // The ablation: the host waited at issue and waits here; the copy-back is a blit.
      for (auto& [dst, src] : device_backs_) copyElements(dst, src);
      device_backs_.clear();
      return;
    }
    id<MTLSharedEvent> ev = consumer_event_;
    onStream(^(at::mps::MPSStream* stream) { [stream->commandBuffer() encodeWaitForEvent:ev value:1]; });
  }
  std::vector<c10::Device> futureDevices() const override { return {}; }
  std::optional<c10::StreamGuard> completionGuard() override { return std::nullopt; }
  bool hostWait() const override { return staged_; }

 private:
  at::Tensor stage(const at::Tensor& t, bool output) {
    if (unifiedEnabled() && hostAddress(t) != nullptr) {
      at::Tensor c = t.is_contiguous() ? t : t.contiguous();  // on the stream, before the signal
      keep_.push_back(c);
      at::Tensor alias = hostAlias(c);
      if (output && !c.is_same(t)) backs_.emplace_back(hostAlias(t), alias);
      return alias;
    }
    staged_ = true;
    at::Tensor c = t.to(at::kCPU).contiguous();  // blit and wait: the ablation's host stall
    keep_.push_back(c);
    if (output) device_backs_.emplace_back(t, c);
    return c;
  }

  id<MTLSharedEvent> producer_event_ = nil;
  id<MTLSharedEvent> consumer_event_ = nil;
  mcclTimeline_t producer_ = nullptr;
  bool staged_ = false;
  std::vector<at::Tensor> keep_;
  std::vector<std::pair<at::Tensor, at::Tensor>> backs_;         // host aliases, on the pool
  std::vector<std::pair<at::Tensor, at::Tensor>> device_backs_;  // staged: at wait()
};

class MpsKind final : public DeviceKind {
 public:
  std::unique_ptr<Staging> begin(DeviceContexts&, const c10::Device&, const CallKind&) override {
    return std::make_unique<MpsStaging>();
  }
};

// c10d's dispatcher ops have kernels for CPU, CUDA and PrivateUse1 only. For MPS tensors, send
// them to the CPU kernel, which calls the group's backend for the CPU, the same mccl backend
// object that serves mps (skipped for any op this torch already serves on MPS).
void toCpuKernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

void registerDispatcherKernels() {
  static const char* const kOps[] = {
      "broadcast_", "allreduce_", "allreduce_coalesced_", "allgather_", "_allgather_base_",
      "allgather_coalesced_", "allgather_into_tensor_coalesced_", "reduce_scatter_", "_reduce_scatter_base_",
      "reduce_scatter_tensor_coalesced_", "reduce_", "gather_", "scatter_", "alltoall_", "alltoall_base_",
      "barrier", "send", "recv_", "recv_any_source_"};
  static torch::Library* lib = new torch::Library(torch::Library::IMPL, "c10d", c10::DispatchKey::MPS,
                                                  __FILE__, __LINE__);
  for (const char* name : kOps) {
    auto handle = c10::Dispatcher::singleton().findOp(c10::OperatorName(std::string("c10d::") + name, ""));
    if (!handle.has_value() || handle->hasKernelForDispatchKey(c10::DispatchKey::MPS)) continue;
    lib->impl(name, torch::CppFunction::makeFromBoxedFunction<&toCpuKernel>());
  }
}

}  // namespace

// Called once from module init on macOS: registers the kind and the dispatcher kernels.
bool registerMps() {
  static MpsKind kind;
  registerDeviceKind(c10::DeviceType::MPS, &kind);
  registerDispatcherKernels();
  return true;
}

}  // namespace mccl
