// device.hpp: one small interface per device kind (layer "torch backend"; ARCHITECTURE.md, "Device
// handoff"). A collective's tensors all live on one device; the kind of that device decides how
// the engine reaches their bytes and how the handoff's tickets order the engine against the
// device's stream:
//
//   cpu   (device_cpu.cpp)  the tensors themselves (contiguous ones in place, others through a
//                           contiguous copy); no tickets; copy-backs run on the completion pool.
//   cuda  (device_cuda.cpp) pooled pinned host buffers: device-to-host copies on a side stream
//                           after an event on the caller's stream, a producer ticket written by
//                           that stream; copy-backs queued at issue on another side stream behind
//                           a wait on the consumer ticket, which only the engine raises.
//   mps   (device_mps.mm)   in place in unified memory (shared storage) or through a shared
//                           staging buffer; tickets on MTLSharedEvents (macOS only).
//
// Rules (O1-O3): everything a kind encodes on a stream is encoded at issue or at wait(), on the
// calling thread; the engine only polls and raises timelines; pool threads never encode work on
// the framework's stream. A Staging holds every tensor and buffer it hands out until the Work
// that owns it is destroyed, and tells the caching allocators about the side streams that use
// them, so no memory is reused while a copy still reads or writes it.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <c10/core/StreamGuard.h>

#include "mccl.h"

namespace mccl {

// The device side of one collective. Made on the issuing thread by stagingFor(); used there up to
// issued()/refused(); complete() runs on the completion pool; consumerWait() on whichever thread
// waits on the Work.
class Staging {
 public:
  virtual ~Staging() = default;

  // A contiguous tensor the engine may read through data_ptr() that holds `t`'s values once the
  // producer ticket is reached.
  virtual at::Tensor input(const at::Tensor& t) = 0;
  // The same for a tensor the collective also writes: the buffer's final contents go back into
  // `t` (a collective that fails before writing leaves `t` as it was).
  virtual at::Tensor inout(const at::Tensor& t) = 0;
  // A contiguous engine buffer of `numel` elements for list collectives' flat staging of outputs.
  // `initial()` gives the outputs' current values in the buffer's layout: a kind whose copy-backs
  // run whatever the collective's result (cuda) fills the buffer with them first, so a collective
  // that fails before writing leaves the outputs as they were; others never call it.
  virtual at::Tensor buffer(int64_t numel, at::ScalarType dtype, const std::function<at::Tensor()>& initial) = 0;
  // After the collective, copy engine buffer `src` (a view of one from above) into `dst`.
  virtual void copyBack(const at::Tensor& dst, const at::Tensor& src) = 0;

  // Before the C call: encode what precedes the engine (producer side) and fill the handoff's
  // timelines and values. Its ctx and consumer_release belong to the caller.
  virtual void commit(mcclHandoff_t* handoff) = 0;
  // After the C call: it returned mcclSuccess (encode the consumer side), or it failed (the handoff
  // will never be released: give back what commit() took).
  virtual void issued() = 0;
  virtual void refused() = 0;

  // Completion pool, after the engine released the request: host-side copy-backs (if `ok`) and
  // whatever tells the device the buffers are final. Throws what a copy-back throws.
  virtual void complete(bool ok) = 0;
  // Order the calling thread's current stream after the collective, without blocking the host
  // (Work::wait / synchronize). A no-op where the host already waited.
  virtual void consumerWait() = 0;
  // The devices of the Work's Future (empty: a CPU Future, completed once the results are final
  // in host-visible memory), and a guard to hold while the Future is marked completed (events the
  // Future records then follow the collective on the device).
  virtual std::vector<c10::Device> futureDevices() const = 0;
  virtual std::optional<c10::StreamGuard> completionGuard() = 0;
  // True when wait() must block the host until the engine is done (CPU memory).
  virtual bool hostWait() const = 0;
};

// Per process group and device: streams, ticket counters, timelines. Made lazily by the kind on
// the first collective on that device; shared by the Stagings of that device, so it lives until
// the last Work that used it is gone.
class DeviceContext {
 public:
  virtual ~DeviceContext() = default;
};

// Contexts of one process group, one per device used so far (owned by the ProcessGroupMCCL).
struct DeviceContexts {
  std::mutex mu;
  std::vector<std::pair<c10::Device, std::shared_ptr<DeviceContext>>> by_device;
  int64_t timeout_ms = 0;  // the group's timeout (bounds the rare host wait for a ticket slot)
};

// What a Staging serves: a collective (finished in the engine's run order, which is issue order
// except for follow-ups, which run right after the collective they follow), or a send or receive
// to or from `peer` (finished in its own order). A device kind must not queue one's consumer side
// behind another that finishes later.
struct CallKind {
  bool p2p = false;
  int peer = -1;
  bool follow_up = false;  // issued from a Future callback of the group: runs before later-issued ones
};

// A device kind: makes Stagings for collectives on devices of its type.
class DeviceKind {
 public:
  virtual ~DeviceKind() = default;
  virtual std::unique_ptr<Staging> begin(DeviceContexts& contexts, const c10::Device& device,
                                         const CallKind& call) = 0;
};

// The kind for `type`, or nullptr when this build has none (registerDeviceKind adds one; cpu and
// cuda are built in, mps on macOS).
DeviceKind* deviceKind(c10::DeviceType type);
void registerDeviceKind(c10::DeviceType type, DeviceKind* kind);

// The Staging for a collective on `device`; RuntimeError naming the device when no kind serves it.
std::unique_ptr<Staging> stagingFor(DeviceContexts& contexts, const c10::Device& device,
                                    const CallKind& call, const char* op);

// dst := src's elements in row-major order (same number of elements, any shapes and strides).
void copyElements(const at::Tensor& dst, const at::Tensor& src);

// The context of `device` in `contexts`, made by `make` on first use.
std::shared_ptr<DeviceContext> contextFor(DeviceContexts& contexts, const c10::Device& device,
                                          const std::function<std::shared_ptr<DeviceContext>()>& make);

// Device kinds defined in their own files.
DeviceKind* cpuDeviceKind();
DeviceKind* cudaDeviceKind();

}  // namespace mccl
