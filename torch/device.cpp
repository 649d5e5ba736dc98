// device.cpp: the registry of device kinds and what they share (see device.hpp).
#include "device.hpp"

#include <array>

#include <c10/util/Exception.h>

namespace mccl {
namespace {
std::array<DeviceKind*, static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>& kinds() {
  static std::array<DeviceKind*, static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)> k{};
  return k;
}
}  // namespace

void registerDeviceKind(c10::DeviceType type, DeviceKind* kind) { kinds()[static_cast<size_t>(type)] = kind; }

DeviceKind* deviceKind(c10::DeviceType type) {
  static const bool builtin = [] {
    registerDeviceKind(c10::DeviceType::CPU, cpuDeviceKind());
    registerDeviceKind(c10::DeviceType::CUDA, cudaDeviceKind());
    return true;
  }();
  (void)builtin;
  size_t i = static_cast<size_t>(type);
  return i < kinds().size() ? kinds()[i] : nullptr;
}

std::unique_ptr<Staging> stagingFor(DeviceContexts& contexts, const c10::Device& device, const CallKind& call,
                                    const char* op) {
  DeviceKind* kind = deviceKind(device.type());
  TORCH_CHECK(kind != nullptr, "mccl ", op, ": tensor is on device ", device,
              "; this build of mccl moves cpu and cuda tensors", ", and mps tensors on macOS");
  return kind->begin(contexts, device, call);
}

std::shared_ptr<DeviceContext> contextFor(DeviceContexts& contexts, const c10::Device& device,
                                          const std::function<std::shared_ptr<DeviceContext>()>& make) {
  std::lock_guard<std::mutex> lock(contexts.mu);
  for (auto& [d, ctx] : contexts.by_device)
    if (d == device) return ctx;
  contexts.by_device.emplace_back(device, make());
  return contexts.by_device.back().second;
}

void copyElements(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.is_contiguous()) dst.view(src.sizes()).copy_(src);
  else dst.copy_(src.reshape(dst.sizes()));
}

}  // namespace mccl
