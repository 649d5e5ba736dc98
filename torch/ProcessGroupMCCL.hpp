// ProcessGroupMCCL.hpp: the thin c10d::Backend shim over include/mccl.h (layer "torch backend").
//
// A collective call checks everything that can be checked before a byte moves (device, layout,
// dtype, op, sizes), asks the tensors' device kind (device.hpp) for engine buffers and the
// handoff's tickets, and issues the C call with a handoff whose consumer_release hands the Work to
// a completion pool, which completes it and its Future with the output tensor list, as DDP expects
// (off the engine thread: Future callbacks may issue and wait on further collectives). The Work
// keeps every tensor and staging buffer it touches alive until then.
//
// Waiting: on CPU tensors wait() blocks until the results are in place. On device tensors it
// blocks nothing: it makes the calling thread's current stream wait for the collective, and
// raises only if the collective has already failed (a later failure is raised by the Work's
// exception(), its Future, and every later call on the group). The Future of a device Work carries
// its device, so Future.wait() and then() order the consumer's stream after the results.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "device.hpp"
#include "mccl.h"

namespace mccl {

class WorkMCCL : public c10d::Work {
 public:
  WorkMCCL(c10d::OpType type, const char* profiling_name, std::vector<at::Tensor> outputs,
           std::unique_ptr<Staging> staging);
  ~WorkMCCL() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override;
  int sourceRank() const override;

  // The pointer the C library should read (output=false) or read and write (output=true) for `t`:
  // the tensor itself or a staging buffer of its device kind, kept alive with the Work; an output's
  // staged values are copied back once the collective is done. Outputs whose elements overlap
  // (expand()) are refused.
  void* buffer(const at::Tensor& t, bool output, const char* op);
  Staging& staging() { return *staging_; }

 private:
  friend class ProcessGroupMCCL;
  static void onRelease(void* ctx, mcclResult_t result);
  void complete(mcclResult_t result);
  // " (issued at train.py:12 (in main))" with MCCL_CHECK_CALL_SITES, else "": for its errors.
  std::string issuedAt() const { return site_.empty() ? std::string() : " (issued at " + site_ + ")"; }

  std::vector<at::Tensor> outputs_;       // what the Future completes with
  std::unique_ptr<Staging> staging_;      // engine buffers, copy-backs and tickets (device.hpp)
  bool inference_mode_;                   // the caller's InferenceMode, restored for copy-backs
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  c10::intrusive_ptr<WorkMCCL> self_;     // held until the engine releases the buffers
  mcclRequest_t request_ = nullptr;
  mcclComm_t comm_ = nullptr;             // the issuing communicator (follow-up context)
  mcclHandoff_t handoff_{};
  std::mutex issuing_;                    // held by launch() until the staging's issued() ran:
                                          // complete() may not overtake it
  std::string error_;
  uint64_t seq_ = 0;
  std::string name_;
  std::string group_;                     // " on group NAME ('DESC')", for its error messages
  std::string site_;                      // MCCL_CHECK_CALL_SITES: where it was issued, or ""
  uint32_t call_site_ = 0;                // and its tag (mcclOpOptions_t.call_site)
};

// The order mark of a Python callback (see "where a callback's collectives run" in the .cpp):
// one order marker per live mccl group, held until the callback returned.
class OrderMark {
 public:
  ~OrderMark();
  // A mark for a callback being attached to `future`, or nullptr when it needs none (not an mccl
  // Future, or already completed: the callback runs at once, at this very point of the program).
  static std::shared_ptr<OrderMark> forCallbackOf(const c10::intrusive_ptr<c10::ivalue::Future>& future);
  // `child` (returned by then() on an mccl Future) counts as an mccl Future too.
  static void derived(const c10::intrusive_ptr<c10::ivalue::Future>& child);
  static bool isMcclFuture(const c10::intrusive_ptr<c10::ivalue::Future>& future);
  void enter();  // this thread now runs the callback: its collectives follow the markers
  void exit();   // the callback returned: the previous context again, and the markers sealed
  mcclRequest_t markerFor(mcclComm_t comm) const;

 private:
  void seal();
  std::vector<std::pair<mcclComm_t, mcclRequest_t>> markers_;
  std::atomic<bool> sealed_{false};
  OrderMark* outer_ = nullptr;
};

class ProcessGroupMCCL : public c10d::Backend {
 public:
  // store: the group's (prefixed) store; timeout: default for init and every collective;
  // peer_hint: a host all ranks reach (MASTER_ADDR), used to pick the interface; label: how the
  // C library's log lines and errors name the communicator (e.g. "group 1"; empty: "pg").
  ProcessGroupMCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   std::chrono::milliseconds timeout, const std::string& peer_hint,
                   const std::string& label = "");
  ~ProcessGroupMCCL() override;

  const std::string getBackendName() const override { return "mccl"; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;

  // The collective sequence number (what the C library stamps on every frame): the next
  // collective this group issues gets getSequenceNumberForGroup(). Set once, at construction.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return next_seq_; }

  void abort() override;
  void shutdown() override;

 private:
  template <typename Issue>
  c10::intrusive_ptr<c10d::Work> launch(c10::intrusive_ptr<WorkMCCL> work,
                                        std::chrono::milliseconds timeout, Issue issue,
                                        double premul_factor);
  // The communicator, held open (shared) while a call issues on it: abort, shutdown and the
  // destructor take it away exclusively, so no call uses a communicator they freed.
  class CommRef {
   public:
    CommRef(std::shared_mutex& mu, const std::atomic<mcclComm_t>& comm);
    operator mcclComm_t() const { return comm_; }

   private:
    std::shared_lock<std::shared_mutex> lock_;
    mcclComm_t comm_;
  };
  CommRef comm() const;  // RuntimeError once the group was shut down or aborted
  mcclComm_t takeComm();
  std::string groupLabel() const;
  c10::intrusive_ptr<c10d::Work> allgatherUneven(std::vector<at::Tensor>& outs, const at::Tensor& input,
                                                 mcclDataType_t dt, const c10d::AllgatherOptions& opts);
  c10::intrusive_ptr<c10d::Work> allreduceSparse(at::Tensor& tensor, const c10d::AllreduceOptions& opts);
  void checkRoot(int64_t root, const char* op) const;  // RuntimeError unless 0 <= root < size
  // A Work whose buffers live on `device` (its device kind stages them).
  c10::intrusive_ptr<WorkMCCL> makeWork(c10d::OpType type, const char* name, std::vector<at::Tensor> outputs,
                                        const c10::Device& device, CallKind call = {});

  friend class OrderMark;
  mutable std::shared_mutex comm_mu_;
  std::atomic<mcclComm_t> comm_{nullptr};
  DeviceContexts contexts_;  // per device: streams and tickets (device kinds' own state)
  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  std::atomic<uint64_t> next_seq_{0};
};

// Python's atexit hook (mccl/__init__.py): waits, up to `seconds` (MCCL_EXIT_WAIT_S, default 10),
// until every operation issued has completed and its completion (Future callbacks included) has
// run; past that, aborts every live group of the process and waits up to max(`seconds`, 10 s) more
// for the callbacks; later completions leave their Works and tensors to the exiting process. So no
// completion thread takes the GIL while the interpreter finalizes (ProcessGroupMCCL.cpp,
// Completer::atExit). Call it with the GIL held or not; it releases the GIL while it waits.
void completionsAtExit(double seconds);

// MCCL_CHECK_CALL_SITES=1 (call_site.cpp): a tag of the Python line that issued the collective
// being issued on this thread (0 if none: no Python frame outside torch and mccl), and that line as text
// ("train.py:12 (in main)") in `where`. Takes the GIL for the walk.
uint32_t pythonCallSite(std::string* where);

}  // namespace mccl
