// ProcessGroupMCCL.cpp: tensors in, C calls out; see ProcessGroupMCCL.hpp.
#include "ProcessGroupMCCL.hpp"

#include <c10/util/Exception.h>

#include <cstring>
#include <sstream>

namespace mccl {
namespace {

// ---- the bootstrap store: c10d::Store behind mcclStore_t ----------------------------------

mcclResult_t storeSet(void* ctx, const char* key, const void* value, size_t len) {
  try {
    auto* bytes = static_cast<const uint8_t*>(value);
    static_cast<c10d::Store*>(ctx)->set(key, std::vector<uint8_t>(bytes, bytes + len));
    return mcclSuccess;
  } catch (const std::exception& e) {
    TORCH_WARN("mccl: store set('", key, "') failed: ", e.what());
    return mcclRemoteError;
  }
}

mcclResult_t storeWait(void* ctx, const char* key, int64_t timeout_ms) {
  try {
    static_cast<c10d::Store*>(ctx)->wait({key}, std::chrono::milliseconds(timeout_ms));
    return mcclSuccess;
  } catch (const std::exception& e) {
    TORCH_WARN("mccl: store wait('", key, "') failed: ", e.what());
    return mcclTimeout;
  }
}

mcclResult_t storeGet(void* ctx, const char* key, void* buf, size_t cap, size_t* len,
                      int64_t timeout_ms) {
  try {
    auto* store = static_cast<c10d::Store*>(ctx);
    store->wait({key}, std::chrono::milliseconds(timeout_ms));
    std::vector<uint8_t> v = store->get(key);
    *len = v.size();
    std::memcpy(buf, v.data(), std::min(cap, v.size()));
    return mcclSuccess;
  } catch (const std::exception& e) {
    TORCH_WARN("mccl: store get('", key, "') failed: ", e.what());
    return mcclTimeout;
  }
}

mcclResult_t storeAdd(void* ctx, const char* key, int64_t delta, int64_t* result) {
  try {
    *result = static_cast<c10d::Store*>(ctx)->add(key, delta);
    return mcclSuccess;
  } catch (const std::exception& e) {
    TORCH_WARN("mccl: store add('", key, "') failed: ", e.what());
    return mcclRemoteError;
  }
}

// ---- argument checks: everything is refused before a byte is sent -------------------------

mcclDataType_t toMcclType(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat: return mcclFloat32;
    case at::kDouble: return mcclFloat64;
    case at::kHalf: return mcclFloat16;
    case at::kBFloat16: return mcclBfloat16;
    case at::kChar: return mcclInt8;
    case at::kByte: return mcclUint8;
    case at::kInt: return mcclInt32;
    case at::kLong: return mcclInt64;
    case at::kBool: return mcclBool;
    default:
      TORCH_CHECK(false, "mccl ", op, ": unsupported dtype ", t.scalar_type(),
                  "; supported: float32, float64, float16, bfloat16, int8, uint8, int32, int64, bool");
  }
}

mcclRedOp_t toMcclOp(const c10d::ReduceOp& op, const at::Tensor& t) {
  switch (op) {
    case c10d::ReduceOp::SUM: return mcclSum;
    case c10d::ReduceOp::AVG: return mcclAvg;
    case c10d::ReduceOp::PRODUCT: return mcclProd;
    case c10d::ReduceOp::MIN: return mcclMin;
    case c10d::ReduceOp::MAX: return mcclMax;
    case c10d::ReduceOp::BAND: return mcclBand;
    case c10d::ReduceOp::BOR: return mcclBor;
    case c10d::ReduceOp::BXOR: return mcclBxor;
    default:
      TORCH_CHECK(false, "mccl allreduce: reduce op ", op.op_, " is not supported yet (supported: "
                  "SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR)");
  }
}

const at::Tensor& checkSingle(const std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "mccl ", op, ": expects exactly one tensor per process, got ",
              tensors.size());
  return tensors[0];
}

void checkTensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.layout() == at::kStrided, "mccl ", op, ": only dense (strided) tensors are supported, got ",
              t.layout());
  TORCH_CHECK(t.device().is_cpu(), "mccl ", op, ": tensor is on device ", t.device(),
              "; this build of mccl moves cpu tensors (call .cpu() or register another device)");
  TORCH_CHECK(t.is_contiguous(), "mccl ", op, ": tensor is not contiguous (shape ", t.sizes(),
              ", strides ", t.strides(), "); call .contiguous() first");
  toMcclType(t, op);
}

int64_t timeoutMs(std::chrono::milliseconds op_timeout, std::chrono::milliseconds pg_timeout) {
  return op_timeout == c10d::kUnsetTimeout ? pg_timeout.count() : op_timeout.count();
}

// Argument errors become RuntimeError; failures of the communication itself (a lost or failed
// peer, a timeout, a mismatch) become torch's DistBackendError, a RuntimeError subclass.
[[noreturn]] void throwMccl(mcclResult_t res, const std::string& where, const char* detail) {
  std::ostringstream msg;
  msg << "mccl " << where << " failed: " << mcclGetErrorString(res) << ": " << detail;
  if (res == mcclInvalidArgument || res == mcclUnsupported || res == mcclInvalidUsage)
    TORCH_CHECK(false, msg.str());
  C10_THROW_ERROR(DistBackendError, msg.str());
}

}  // namespace

// ---- Work ---------------------------------------------------------------------------------

WorkMCCL::WorkMCCL(c10d::OpType type, const char* profiling_name, std::vector<at::Tensor> outputs)
    : c10d::Work(-1, type, profiling_name),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))),
      name_(profiling_name) {}

WorkMCCL::~WorkMCCL() { mcclRequestFree(request_); }

// Engine thread, exactly once: the buffers are final (or the collective failed). Completes the
// Future with the outputs, then drops the Work's hold on itself.
void WorkMCCL::onRelease(void* ctx, mcclResult_t result) {
  auto* work = static_cast<WorkMCCL*>(ctx);
  c10::intrusive_ptr<WorkMCCL> self = std::move(work->self_);
  std::exception_ptr eptr;
  if (result == mcclSuccess) {
    try {
      if (work->postprocess_) work->postprocess_();
    } catch (...) {
      eptr = std::current_exception();
    }
  } else {
    const char* detail = mcclRequestError(work->request_);
    try {
      throwMccl(result, work->name_, detail[0] ? detail : "see the log");
    } catch (...) {
      eptr = std::current_exception();
    }
  }
  if (eptr) {
    try {
      std::rethrow_exception(eptr);
    } catch (const std::exception& e) {
      work->error_ = e.what();
    }
    work->finish(eptr);
    work->future_->setError(eptr);
  } else {
    work->finish();
    work->future_->markCompleted(c10::IValue(work->outputs_));
  }
  work->keep_alive_.clear();
}

bool WorkMCCL::isCompleted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}
bool WorkMCCL::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}
std::exception_ptr WorkMCCL::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}
std::vector<at::Tensor> WorkMCCL::result() { return outputs_; }
c10::intrusive_ptr<c10::ivalue::Future> WorkMCCL::getFuture() { return future_; }
uint64_t WorkMCCL::getSequencenumber() const { return seq_; }

bool WorkMCCL::wait(std::chrono::milliseconds timeout) {
  int64_t ms = timeout == kNoTimeout ? -1 : timeout.count();
  mcclResult_t res = mcclWait(request_, ms);
  if (res == mcclInProgress) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("mccl ", name_, " #", seq_, ": wait() timed out after ", ms,
                             " ms; the collective is still running"));
  }
  // The request is done, so onRelease has run: completed_ and exception_ are set.
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return completed_; });
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

// ---- Backend ------------------------------------------------------------------------------

ProcessGroupMCCL::ProcessGroupMCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   std::chrono::milliseconds timeout, const std::string& peer_hint)
    : c10d::Backend(rank, size), store_(store), timeout_(timeout) {
  mcclCommConfig_t cfg;
  mcclCommConfigInit(&cfg);
  cfg.rank = rank;
  cfg.nranks = size;
  cfg.store = mcclStore_t{store_.get(), storeSet, storeGet, storeWait, storeAdd};
  cfg.name = "pg";  // the store is already prefixed per process group
  cfg.timeout_ms = timeout.count();
  cfg.peer_hint = peer_hint.empty() ? nullptr : peer_hint.c_str();
  mcclResult_t res = mcclCommInitConfig(&comm_, &cfg);
  if (res != mcclSuccess) throwMccl(res, "init", mcclGetLastError(nullptr));
}

ProcessGroupMCCL::~ProcessGroupMCCL() {
  if (comm_ != nullptr) mcclCommDestroy(comm_);
}

mcclComm_t ProcessGroupMCCL::comm() const {
  TORCH_CHECK(comm_ != nullptr, "mccl: the process group was shut down or aborted");
  return comm_;
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupMCCL::getBackendOptions() {
  return c10::make_intrusive<Options>("mccl", timeout_);
}

template <typename Issue>
c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::launch(c10::intrusive_ptr<WorkMCCL> work,
                                                        std::chrono::milliseconds timeout,
                                                        Issue issue) {
  work->handoff_.ctx = work.get();
  work->handoff_.producer_wait = nullptr;  // CPU memory: written before the call returns
  work->handoff_.consumer_release = &WorkMCCL::onRelease;
  work->self_ = work;
  mcclOpOptions_t opts;
  std::memset(&opts, 0, sizeof(opts));
  opts.timeout_ms = timeoutMs(timeout, timeout_);
  opts.handoff = &work->handoff_;
  mcclResult_t res = issue(&opts, &work->request_);
  if (res != mcclSuccess) {
    work->self_.reset();
    throwMccl(res, work->name_, mcclGetLastError(comm_));
  }
  work->seq_ = mcclRequestSeq(work->request_);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  const at::Tensor& t = checkSingle(tensors, "allreduce");
  checkTensor(t, "allreduce");
  mcclDataType_t dt = toMcclType(t, "allreduce");
  mcclRedOp_t op = toMcclOp(opts.reduceOp, t);
  auto work = c10::make_intrusive<WorkMCCL>(c10d::OpType::ALLREDUCE, "allreduce", tensors);
  mcclComm_t c = comm();
  void* ptr = t.data_ptr();
  size_t n = static_cast<size_t>(t.numel());
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclAllReduce(ptr, ptr, n, dt, op, c, o, r);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  const at::Tensor& t = checkSingle(tensors, "broadcast");
  checkTensor(t, "broadcast");
  TORCH_CHECK(opts.rootTensor == 0, "mccl broadcast: rootTensor must be 0 (one tensor per process)");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "mccl broadcast: root rank ",
              opts.rootRank, " is outside 0..", getSize() - 1);
  mcclDataType_t dt = toMcclType(t, "broadcast");
  auto work = c10::make_intrusive<WorkMCCL>(c10d::OpType::BROADCAST, "broadcast", tensors);
  mcclComm_t c = comm();
  void* ptr = t.data_ptr();
  size_t n = static_cast<size_t>(t.numel());
  int root = static_cast<int>(opts.rootRank);
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclBroadcast(ptr, n, dt, root, c, o, r);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::AllgatherOptions& opts) {
  checkTensor(input, "all_gather_into_tensor");
  checkTensor(output, "all_gather_into_tensor");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "mccl all_gather_into_tensor: output dtype ",
              output.scalar_type(), " differs from input dtype ", input.scalar_type());
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "mccl all_gather_into_tensor: output has ",
              output.numel(), " elements, expected world size ", getSize(), " x ", input.numel());
  mcclDataType_t dt = toMcclType(input, "all_gather_into_tensor");
  auto work = c10::make_intrusive<WorkMCCL>(c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor",
                                            std::vector<at::Tensor>{output});
  work->keep_alive_ = {input};
  mcclComm_t c = comm();
  const void* in = input.data_ptr();
  void* out = output.data_ptr();
  size_t n = static_cast<size_t>(input.numel());
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclAllGather(in, out, n, dt, c, o, r);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllgatherOptions& opts) {
  const at::Tensor& input = checkSingle(inputs, "all_gather");
  checkTensor(input, "all_gather");
  TORCH_CHECK(outputs.size() == 1, "mccl all_gather: expects one output list per process, got ",
              outputs.size());
  std::vector<at::Tensor>& outs = outputs[0];
  TORCH_CHECK(static_cast<int>(outs.size()) == getSize(), "mccl all_gather: output list has ",
              outs.size(), " tensors, expected world size ", getSize());
  for (const auto& o : outs) {
    TORCH_CHECK(o.device().is_cpu(), "mccl all_gather: output tensor is on device ", o.device());
    TORCH_CHECK(o.scalar_type() == input.scalar_type() && o.numel() == input.numel(),
                "mccl all_gather: every output must match the input's dtype ", input.scalar_type(),
                " and size ", input.numel(), "; got ", o.scalar_type(), " with ", o.numel(), " elements");
  }
  mcclDataType_t dt = toMcclType(input, "all_gather");
  // Gather into one flat buffer, then copy out on the engine thread before completion.
  at::Tensor flat = at::empty({getSize() * input.numel()}, input.options());
  auto work = c10::make_intrusive<WorkMCCL>(c10d::OpType::ALLGATHER, "all_gather", outs);
  work->keep_alive_ = {input, flat};
  std::vector<at::Tensor> targets = outs;
  int64_t numel = input.numel();
  work->postprocess_ = [targets, flat, numel]() {
    for (size_t i = 0; i < targets.size(); i++)
      targets[i].view({-1}).copy_(flat.narrow(0, static_cast<int64_t>(i) * numel, numel));
  };
  mcclComm_t c = comm();
  const void* in = input.data_ptr();
  void* out = flat.data_ptr();
  size_t n = static_cast<size_t>(numel);
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclAllGather(in, out, n, dt, c, o, r);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::barrier(const c10d::BarrierOptions& opts) {
  auto work = c10::make_intrusive<WorkMCCL>(c10d::OpType::BARRIER, "barrier", std::vector<at::Tensor>{});
  mcclComm_t c = comm();
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclBarrier(c, o, r);
  });
}

void ProcessGroupMCCL::abort() {
  if (comm_ != nullptr) {
    mcclComm_t c = comm_;
    comm_ = nullptr;
    mcclCommAbort(c);
  }
}

void ProcessGroupMCCL::shutdown() {
  if (comm_ != nullptr) {
    mcclComm_t c = comm_;
    comm_ = nullptr;
    mcclCommDestroy(c);
  }
}

}  // namespace mccl
