// device_cpu.cpp: CPU tensors (see device.hpp). The engine reads and writes the tensors
// themselves; a non-contiguous one goes through a contiguous copy. No tickets: CPU memory is
// written before the call that issues the collective returns, and read after the Work completes.
#include "device.hpp"

namespace mccl {
namespace {

class CpuStaging final : public Staging {
 public:
  at::Tensor input(const at::Tensor& t) override {
    at::Tensor c = t.is_contiguous() ? t : t.contiguous();
    keep_.push_back(c);
    return c;
  }
  at::Tensor inout(const at::Tensor& t) override {
    at::Tensor c = input(t);
    if (!c.is_same(t)) backs_.emplace_back(t, c);
    return c;
  }
  at::Tensor buffer(int64_t numel, at::ScalarType dtype, const std::function<at::Tensor()>&) override {
    // Copy-backs run only after a success, so the outputs need no initial copy.
    at::Tensor b = at::empty({numel}, at::TensorOptions().dtype(dtype));
    keep_.push_back(b);
    return b;
  }
  void copyBack(const at::Tensor& dst, const at::Tensor& src) override { backs_.emplace_back(dst, src); }
  void commit(mcclHandoff_t* h) override {
    h->producer = nullptr;
    h->consumer = nullptr;
  }
  void issued() override {}
  void refused() override {}
  void complete(bool ok) override {
    if (ok)
      for (auto& [dst, src] : backs_) copyElements(dst, src);
    backs_.clear();
  }
  void consumerWait() override {}
  std::vector<c10::Device> futureDevices() const override { return {}; }
  std::optional<c10::StreamGuard> completionGuard() override { return std::nullopt; }
  bool hostWait() const override { return true; }

 private:
  std::vector<at::Tensor> keep_;
  std::vector<std::pair<at::Tensor, at::Tensor>> backs_;
};

class CpuKind final : public DeviceKind {
 public:
  std::unique_ptr<Staging> begin(DeviceContexts&, const c10::Device&, const CallKind&) override {
    return std::make_unique<CpuStaging>();
  }
};

}  // namespace

DeviceKind* cpuDeviceKind() {
  static CpuKind kind;
  return &kind;
}

}  // namespace mccl
