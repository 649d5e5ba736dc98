// ProcessGroupMCCL.cpp: tensors in, C calls out; see ProcessGroupMCCL.hpp.
#include "ProcessGroupMCCL.hpp"

#include <Python.h>  // the GIL, released while shutdown waits for completions

#include <c10/core/InferenceMode.h>
#include <optional>
#include <pthread.h>
#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <unordered_set>
#include <thread>
#include <sstream>

namespace mccl {
namespace {

// A store failure's message without the C++ backtrace c10::Error carries.
const char* brief(const std::exception& e) {
  auto* err = dynamic_cast<const c10::Error*>(&e);
  return err ? err->what_without_backtrace() : e.what();
}

// ---- the bootstrap store: c10d::Store behind mcclStore_t ----------------------------------

mcclResult_t storeSet(void* ctx, const char* key, const void* value, size_t len) {
  try {
    auto* bytes = static_cast<const uint8_t*>(value);
    static_cast<c10d::Store*>(ctx)->set(key, std::vector<uint8_t>(bytes, bytes + len));
    return mcclSuccess;
  } catch (const std::exception& e) {
    TORCH_WARN("mccl: store set('", key, "') failed: ", brief(e));
    return mcclRemoteError;
  }
}

// A store call that failed: mcclRemoteError when its connection broke (the server went away or
// closed: c10d raises DistNetworkError), else mcclTimeout (the key did not appear in time).
mcclResult_t storeFailure(const std::exception& e, const char* what, const char* key) {
  TORCH_WARN("mccl: store ", what, "('", key, "') failed: ", brief(e));
  return dynamic_cast<const c10::DistNetworkError*>(&e) != nullptr ? mcclRemoteError : mcclTimeout;
}

mcclResult_t storeWait(void* ctx, const char* key, int64_t timeout_ms) {
  try {
    static_cast<c10d::Store*>(ctx)->wait({key}, std::chrono::milliseconds(timeout_ms));
    return mcclSuccess;
  } catch (const std::exception& e) {
    return storeFailure(e, "wait", key);
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
    return storeFailure(e, "get", key);
  }
}

mcclResult_t storeAdd(void* ctx, const char* key, int64_t delta, int64_t* result) {
  try {
    *result = static_cast<c10d::Store*>(ctx)->add(key, delta);
    return mcclSuccess;
  } catch (const std::exception& e) {
    TORCH_WARN("mccl: store add('", key, "') failed: ", brief(e));
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
    case at::kShort: return mcclInt16;
    case at::kUInt16: return mcclUint16;
    case at::kUInt32: return mcclUint32;
    case at::kUInt64: return mcclUint64;
    default:
      TORCH_CHECK(false, "mccl ", op, ": unsupported dtype ", t.scalar_type(),
                  "; supported: float32, float64, float16, bfloat16, int8, uint8, int16, uint16, int32, "
                  "uint32, int64, uint64, bool");
  }
}

// A ReduceOp's name as torch spells it (ReduceOp.MAX), for error messages.
const char* reduceOpName(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "an unknown op";
  }
}

// The C op for a torch ReduceOp; PREMUL_SUM's factor (a double or a one-element tensor) goes to
// *factor.
mcclRedOp_t toMcclOp(const c10d::ReduceOp& op, double* factor) {
  switch (op) {
    case c10d::ReduceOp::SUM: return mcclSum;
    case c10d::ReduceOp::AVG: return mcclAvg;
    case c10d::ReduceOp::PRODUCT: return mcclProd;
    case c10d::ReduceOp::MIN: return mcclMin;
    case c10d::ReduceOp::MAX: return mcclMax;
    case c10d::ReduceOp::BAND: return mcclBand;
    case c10d::ReduceOp::BOR: return mcclBor;
    case c10d::ReduceOp::BXOR: return mcclBxor;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* sup = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(sup != nullptr, "mccl: PREMUL_SUM without its factor");
      *factor = sup->tensor_factor.defined() ? sup->tensor_factor.to(at::kCPU, at::kDouble).item<double>()
                                             : sup->double_factor;
      return mcclPremulSum;
    }
    default:
      TORCH_CHECK(false, "mccl: reduce op ", op.op_, " is not supported (supported: SUM, AVG, "
                  "PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM)");
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
  TORCH_CHECK(deviceKind(t.device().type()) != nullptr, "mccl ", op, ": tensor is on device ", t.device(),
              "; this build of mccl moves cpu and cuda tensors, and mps tensors on macOS");
  toMcclType(t, op);
}

// Every tensor of one call lives on one device (the engine stages them together).
void checkSameDevice(const at::Tensor& t, const at::Tensor& ref, const char* op) {
  TORCH_CHECK(t.device() == ref.device(), "mccl ", op, ": every tensor of one call must be on one device; got ",
              t.device(), " and ", ref.device());
}

// Every tensor of a collective: checked, same dtype as the first.
void checkAll(const std::vector<at::Tensor>& ts, const at::Tensor& ref, const char* op) {
  for (const auto& t : ts) {
    checkTensor(t, op);
    checkSameDevice(t, ref, op);
    TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "mccl ", op, ": every tensor must have dtype ",
                ref.scalar_type(), ", got ", t.scalar_type());
  }
}

at::Tensor flatCat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const auto& t : ts) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

// After the collective, copy consecutive pieces of engine buffer `flat` into `ts`.
void splitInto(Staging& staging, const at::Tensor& flat, const std::vector<at::Tensor>& ts) {
  int64_t off = 0;
  for (const auto& t : ts) {
    staging.copyBack(t, flat.narrow(0, off, t.numel()));
    off += t.numel();
  }
}


// The outputs of a list collective are filled by copies out of one staging buffer: each must be
// writable on its own. Two outputs that share memory (the same tensor twice, overlapping views)
// or one whose elements do (expand()) would silently keep only the last copy, so they are
// refused. Spans are sorted by start address, and only outputs whose spans meet are compared:
// at::get_overlap_status decides dense ones; strided views it cannot judge (interleaved ones are
// legal) go to an exact check that marks each output's elements in a map of their memory.
void checkOutputs(const std::vector<at::Tensor>& outs, const char* op) {
  struct Span {
    uintptr_t begin, end;
    size_t index;
  };
  std::vector<Span> spans;
  spans.reserve(outs.size());
  for (size_t i = 0; i < outs.size(); i++) {
    const at::Tensor& t = outs[i];
    TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, "mccl ", op, ": output ", i,
                " has elements that share memory (shape ", t.sizes(), ", strides ", t.strides(),
                ", e.g. from expand()); it cannot receive a result");
    if (t.numel() == 0) continue;
    int64_t extent = 1;  // elements from the first to the last one, strides being non-negative
    for (int64_t d = 0; d < t.dim(); d++) extent += (t.size(d) - 1) * t.stride(d);
    auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
    spans.push_back({begin, begin + static_cast<uintptr_t>(extent) * t.element_size(), i});
  }
  auto refuse = [&](size_t a, size_t b) {
    TORCH_CHECK(false, "mccl ", op, ": outputs ", std::min(a, b), " and ", std::max(a, b),
                " share memory (the same tensor twice, or overlapping views); each output must "
                "receive its own result");
  };
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  std::vector<size_t> unsure;  // outputs in spans[] order whose overlap only the map can decide
  for (size_t k = 0; k < spans.size(); k++)
    for (size_t j = k + 1; j < spans.size() && spans[j].begin < spans[k].end; j++) {
      at::MemOverlapStatus st = at::get_overlap_status(outs[spans[k].index], outs[spans[j].index]);
      if (st == at::MemOverlapStatus::Full || st == at::MemOverlapStatus::Partial) refuse(spans[k].index, spans[j].index);
      if (st == at::MemOverlapStatus::TooHard) unsure.insert(unsure.end(), {k, j});
    }
  if (unsure.empty()) return;
  // A map per run of unsure outputs whose spans meet (so it covers memory they share, never the
  // gap between two allocations); every output of a list has one dtype, so their addresses
  // differ by whole elements. Each output writes its index + 1 into its elements in the map; an
  // element already marked belongs to an earlier output.
  std::sort(unsure.begin(), unsure.end());
  unsure.erase(std::unique(unsure.begin(), unsure.end()), unsure.end());
  const int64_t esize = outs[spans[unsure.front()].index].element_size();
  for (size_t first = 0; first < unsure.size();) {
    size_t last = first;
    uintptr_t lo = spans[unsure[first]].begin, hi = spans[unsure[first]].end;
    while (last + 1 < unsure.size() && spans[unsure[last + 1]].begin < hi)
      hi = std::max(hi, spans[unsure[++last]].end);
    at::Tensor owner = at::zeros({static_cast<int64_t>((hi - lo) / esize)}, at::kInt);
    for (size_t u = first; u <= last; u++) {
      const Span& sp = spans[unsure[u]];
      const at::Tensor& t = outs[sp.index];
      at::Tensor mine = owner.as_strided(t.sizes(), t.strides(), static_cast<int64_t>((sp.begin - lo) / esize));
      int64_t earlier = mine.max().item<int64_t>();
      if (earlier > 0) refuse(static_cast<size_t>(earlier - 1), sp.index);
      mine.fill_(static_cast<int>(sp.index + 1));
    }
    first = last + 1;
  }
}

// MCCL_CHECK_CALL_SITES (docs/ENVIRONMENT.md), as the C library read it.
bool checkCallSites() {
  static const bool on = [] {
    int64_t v = 0;
    return mcclGetEnvInt("MCCL_CHECK_CALL_SITES", &v) == mcclSuccess && v == 1;
  }();
  return on;
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

namespace {
// The Futures of mccl Works, and those derived from them by then(), while they are pending: only
// those need an order mark (a callback attached to a completed Future runs at once), and each entry
// leaves when its Future completes. A Future must not be kept any longer: even a weak reference
// keeps an ivalue::Future's value, the collective's output tensors, alive (it has no
// release_resources(): its members go with the last weak reference), and did so for up to a
// thousand finished collectives before (a fresh-eyes test, 2026-12-06).
class FutureRegistry {
 public:
  static FutureRegistry& get() {
    static std::once_flag once;
    std::call_once(once, [] {
      if (instance_ == nullptr) instance_ = new FutureRegistry();
    });
    return *instance_;
  }
  static void forgetAfterFork() { instance_ = new FutureRegistry(); }
  void add(const c10::intrusive_ptr<c10::ivalue::Future>& f) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.insert(f.get());
    }
    // Runs at once if it has completed already; first among its callbacks otherwise, on the
    // completing thread. The Future is alive while it runs, so its address is not reused yet.
    f->addCallback([](c10::ivalue::Future& done) { FutureRegistry::get().remove(&done); },
                   /*uses_future=*/false);
  }
  bool has(const c10::ivalue::Future* f) {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_.count(f) != 0;
  }
  // Also for a Future that goes away without completing (a Work whose collective was refused).
  void remove(const c10::ivalue::Future* f) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.erase(f);
  }

 private:
  static FutureRegistry* instance_;
  std::mutex mu_;
  std::unordered_set<const c10::ivalue::Future*> pending_;
};
FutureRegistry* FutureRegistry::instance_ = nullptr;
}  // namespace

// ---- Work ---------------------------------------------------------------------------------

namespace {
// The torch.profiler name of a collective: "mccl:" and torch's name of it ("mccl:all_reduce"), as
// gloo's "gloo:all_reduce". Interned: the Work keeps the pointer.
const char* profilingTitle(const char* name) {
  static std::mutex mu;
  static std::set<std::string> titles;
  std::string title = std::string("mccl:") + name;
  for (const char* from : {"allreduce", "allgather"}) {
    size_t at = title.find(from);
    if (at != std::string::npos) title.insert(at + 3, "_");
  }
  std::lock_guard<std::mutex> lock(mu);
  return titles.insert(title).first->c_str();
}
}  // namespace

WorkMCCL::WorkMCCL(c10d::OpType type, const char* profiling_name, std::vector<at::Tensor> outputs,
                   std::unique_ptr<Staging> staging)
    : c10d::Work(-1, type, profilingTitle(profiling_name)),
      outputs_(std::move(outputs)),
      staging_(std::move(staging)),
      inference_mode_(c10::InferenceMode::is_enabled()),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       staging_->futureDevices())),
      name_(profiling_name) {
  FutureRegistry::get().add(future_);
}

WorkMCCL::~WorkMCCL() {
  FutureRegistry::get().remove(future_.get());
  mcclRequestFree(request_);
}

// ---- where a callback's collectives run (include/mccl.h, mcclOrderMarker) -------------------
//
// A Python callback attached to the Future of an mccl Work (or to a Future derived from one by
// then()) gets an order mark at the moment it is attached: one order marker in every live mccl
// group, at that point of the program. The callback runs with the mark as its thread's context
// (python/mccl/_order.py wraps it), so every collective it issues follows the marker of its group
// and runs where the callback was attached, on every rank, whether the callback runs at once
// (the Future had completed) or later on the completion pool. The mark is sealed when the callback
// returns. Callbacks attached from C++ get no mark: their collectives take their place in issue
// order (torch's built-in C++ comm hooks issue none).

namespace {
thread_local OrderMark* tl_mark = nullptr;  // the mark of the callback this thread is running

std::mutex* g_groups_mu = new std::mutex();                                  // never destroyed
std::vector<ProcessGroupMCCL*>* g_groups = new std::vector<ProcessGroupMCCL*>();  // under it
std::mutex& groupsMutex() { return *g_groups_mu; }
std::vector<ProcessGroupMCCL*>& liveGroups() { return *g_groups; }

}  // namespace

OrderMark::~OrderMark() {
  seal();
  for (auto& [comm, marker] : markers_) mcclRequestFree(marker);
}

void OrderMark::seal() {
  if (sealed_.exchange(true)) return;
  for (auto& [comm, marker] : markers_) mcclRequestSeal(marker);
}

mcclRequest_t OrderMark::markerFor(mcclComm_t comm) const {
  for (auto& [c, marker] : markers_)
    if (c == comm) return marker;
  return nullptr;
}

void OrderMark::enter() {
  outer_ = tl_mark;
  tl_mark = this;
}

void OrderMark::exit() {
  tl_mark = outer_;
  seal();
}

std::shared_ptr<OrderMark> OrderMark::forCallbackOf(const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  if (!FutureRegistry::get().has(future.get()) || future->completed()) return nullptr;
  auto mark = std::make_shared<OrderMark>();
  std::lock_guard<std::mutex> lock(groupsMutex());
  for (ProcessGroupMCCL* pg : liveGroups()) {
    mcclComm_t comm = pg->comm_;
    if (comm == nullptr) continue;
    mcclOpOptions_t opts;
    std::memset(&opts, 0, sizeof(opts));
    if (tl_mark != nullptr) opts.follows = tl_mark->markerFor(comm);  // a mark inside a mark
    mcclRequest_t marker = nullptr;
    if (mcclOrderMarker(comm, &opts, &marker) == mcclSuccess) mark->markers_.emplace_back(comm, marker);
  }
  return mark;
}

void OrderMark::derived(const c10::intrusive_ptr<c10::ivalue::Future>& child) { FutureRegistry::get().add(child); }

bool OrderMark::isMcclFuture(const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  return FutureRegistry::get().has(future.get());
}

// Completes Works off MCCL's engine thread. Future callbacks run on the thread that completes the
// Future, and a callback may issue another collective and wait on it (DDP's PowerSGD hook does):
// completing on the engine thread would deadlock, and so would a single completion thread whose
// callback waits on a Future that same thread has to complete. So tasks run in order on a pool
// that starts another thread whenever more tasks wait than threads are idle (up to 256).
void abortLiveGroups();  // every live ProcessGroupMCCL of this process (defined below)

// How long a shutdown waits for the completion pool. The pool is shared by every process group,
// and what a shutdown waits for is the tail of completions already under way (microseconds), so
// a bound well below a collective timeout keeps another group's slow callback from holding it.
// The exit waits at least as long for Future callbacks once it has aborted the groups (atExit).
constexpr std::chrono::milliseconds kDrainLimit{10000};

class Completer {
 public:
  // Never destroyed (its threads may outlive statics); a forked child gets a fresh one
  // (forgetShimState).
  static Completer& get() {
    static std::once_flag once;
    std::call_once(once, [] {
      if (instance_ == nullptr) instance_ = new Completer();
    });
    return *instance_;
  }
  static void forgetAfterFork() { instance_ = new Completer(); }

  // Python's atexit, before the interpreter starts finalizing (mccl/__init__.py registers it).
  // A completion thread that runs a Python then() callback, or drops the last reference to a
  // tensor Python also holds, takes the GIL; once the interpreter finalizes, Python ends such a
  // thread (pthread_exit), and when that happens inside a destructor (torch's callback wrapper,
  // a Work's tensors) the process aborts ("terminate called without an active exception"). That
  // is what a script that exits without waiting for its collectives, or calling
  // destroy_process_group, risked. So the exit:
  //  1. waits, up to `limit`, until every operation issued has completed and its completion task
  //     (Future callbacks included) has run;
  //  2. if that did not happen, aborts every live group of this process (what is in flight fails
  //     now, with an error its Future's callbacks see, instead of at its timeout or not at all),
  //     says so on stderr, and waits up to max(`limit`, 10 s) more for the completions and
  //     callbacks that follow (MCCL_EXIT_WAIT_S=0 stops waiting for collectives, not for callbacks);
  //  3. from then on leaves a finished task's captures (the Work and its tensors) to the exiting
  //     process instead of dropping them, and a task that would start once the interpreter
  //     finalizes does not run (run()).
  // What is left after step 2 is a callback still running after both waits: if it touches Python
  // once the interpreter finalizes, the process aborts (docs/FAILURES.md).
  static void atExit(std::chrono::milliseconds limit) {
    exiting_.store(true, std::memory_order_release);
    Completer& c = get();
    Idle idle = c.waitIdle(limit, /*issued_too=*/true);
    if (idle.done) return;
    abandoned_.store(true, std::memory_order_release);
    fprintf(stderr, "mccl: the process is exiting, and after %lld ms (MCCL_EXIT_WAIT_S) %lld operation(s) it "
            "issued are unfinished (%lld of them in their Future callbacks); aborting this process's process "
            "groups, so that what is in flight fails now, and waiting for the callbacks (wait for your "
            "collectives, or call destroy_process_group(), before exiting)\n",
            static_cast<long long>(limit.count()), idle.unfinished, idle.in_callbacks);
    abortLiveGroups();
    const std::chrono::milliseconds more = std::max(limit, kDrainLimit);
    idle = c.waitIdle(more, /*issued_too=*/true);
    if (!idle.done)
      fprintf(stderr, "mccl: %lld operation(s) still unfinished (%lld in their Future callbacks) another %lld ms "
              "after their groups were aborted; a callback that touches Python while the interpreter "
              "finalizes aborts the process\n",
              idle.unfinished, idle.in_callbacks, static_cast<long long>(more.count()));
  }
  // atExit gave up waiting and aborted the groups; a group destroyed later aborts too
  // (~ProcessGroupMCCL) instead of waiting for what is in flight.
  static bool abandonedAtExit() { return abandoned_.load(std::memory_order_acquire); }

  // A Work was issued: its completion task will be posted (onRelease) and will call retired().
  // Counted so that atExit can wait for operations still in flight, not only posted tasks.
  void issued() {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_++;
  }
  // From the completion task of an issued Work, once it has completed (callbacks run).
  void retired() {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_--;
  }

  // Until every task posted so far has run to its end (a task may still drop the last references
  // to tensors after its Work's waiters were released), or `limit` passed. Called when a process
  // group shuts down, so that no pool thread still touches tensors (freeing one that Python owns
  // takes the GIL) while the interpreter exits. From a pool thread, its own task does not count.
  void drain(std::chrono::milliseconds limit) {
    if (!waitIdle(limit, /*issued_too=*/false).done)
      fprintf(stderr, "mccl: completion callbacks still running %lld ms after the process group shut down\n",
              static_cast<long long>(limit.count()));
  }

  struct Idle {
    bool done;
    long long unfinished;    // issued Works whose completion task has not finished
    long long in_callbacks;  // of those, completion tasks queued or running
  };
  // drain's wait; with `issued_too`, also until every issued Work has completed (atExit: a
  // shutdown does not wait for other groups' Works). The caller's GIL is released while waiting:
  // a task may need it.
  Idle waitIdle(std::chrono::milliseconds limit, bool issued_too) {
    // Once the interpreter finalizes (a group destroyed by module teardown), a task still running
    // can only end by taking the GIL, which aborts: waiting for it would only make sure it does.
    // atExit has waited already and said what was left.
    if (exiting_.load(std::memory_order_acquire) && interpreterGone()) return Idle{true, 0, 0};
    PyThreadState* saved = Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
    Idle idle;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const int self = tl_in_pool ? 1 : 0;
      idle.done = drained_.wait_for(lock, limit, [&] {
        return tasks_.empty() && running_ <= self && (!issued_too || in_flight_ <= 0);
      });
      // Every posted or running task is a Work's completion (onRelease is the only poster).
      idle.in_callbacks = static_cast<long long>(tasks_.size()) + running_ - self;
      idle.unfinished = in_flight_;
    }
    if (saved != nullptr) PyEval_RestoreThread(saved);
    return idle;
  }

  void post(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    if (static_cast<int>(tasks_.size()) > idle_ && threads_ < kMaxThreads) {
      threads_++;
      std::thread([this] { run(); }).detach();
    } else {
      cv_.notify_one();
    }
  }

 private:
  static constexpr int kMaxThreads = 256;

  void run() {
    pthread_setname_np(pthread_self(), "mccl-complete");  // tests tell pool threads apart by name
    tl_in_pool = true;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      while (tasks_.empty()) {
        idle_++;
        cv_.wait(lock);
        idle_--;
      }
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      running_++;
      lock.unlock();
      // Once the interpreter finalizes, a completion is not delivered at all (atExit): running it
      // would take the GIL.
      if (!(exiting_.load(std::memory_order_acquire) && interpreterGone())) task();
      // The captured Work and its tensors go here, before the count drops; after atExit they
      // are left to the exiting process (leaked on purpose: see atExit).
      if (exiting_.load(std::memory_order_acquire))
        (void)new std::function<void()>(std::move(task));
      else
        task = nullptr;
      lock.lock();
      running_--;
      if (tasks_.empty()) drained_.notify_all();
    }
  }

  static bool interpreterGone() {
#if PY_VERSION_HEX >= 0x030D0000
    return !Py_IsInitialized() || Py_IsFinalizing();
#else
    return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
  }

  static thread_local bool tl_in_pool;
  static std::atomic<bool> exiting_, abandoned_;
  static Completer* instance_;
  std::mutex mu_;
  std::condition_variable cv_, drained_;
  int running_ = 0;
  long long in_flight_ = 0;  // issued Works whose completion task has not finished (issued/retired)
  std::deque<std::function<void()>> tasks_;
  int idle_ = 0;
  int threads_ = 0;
};

thread_local bool Completer::tl_in_pool = false;
std::atomic<bool> Completer::exiting_{false};
std::atomic<bool> Completer::abandoned_{false};
Completer* Completer::instance_ = nullptr;

namespace {
// fork(): the child inherits this state but none of the threads that use it, and maybe a mutex one
// of them held: it starts afresh (the old objects are left alone). The groups it inherited are
// unusable there (their calls fail at once: include/mccl.h, "fork"), so it knows of none; the
// parent's order marks, pool and Futures are not its own. DataLoader workers fork like this.
void forgetShimState() {
  g_groups_mu = new std::mutex();
  g_groups = new std::vector<ProcessGroupMCCL*>();
  FutureRegistry::forgetAfterFork();
  Completer::forgetAfterFork();
  tl_mark = nullptr;
}
[[maybe_unused]] const bool g_at_fork = (pthread_atfork(nullptr, nullptr, forgetShimState), true);
}  // namespace

// Engine thread, exactly once: the buffers are final (or the collective failed). Hands the
// completion to the Completer, which copies staged outputs back, completes the Work and its Future
// with the outputs, and then drops the Work's hold on itself.
void WorkMCCL::onRelease(void* ctx, mcclResult_t result) {
  auto* work = static_cast<WorkMCCL*>(ctx);
  c10::intrusive_ptr<WorkMCCL> self = std::move(work->self_);
  Completer::get().post([self, result]() {
    self->complete(result);
    Completer::get().retired();
  });
}

void WorkMCCL::complete(mcclResult_t result) {
  { std::lock_guard<std::mutex> issued(issuing_); }  // the issuing thread finished the staging
  // Under torch.profiler, the "mccl:<collective>" event the Work opened ends here, once.
  if (recordFunctionEndCallback_) std::exchange(recordFunctionEndCallback_, nullptr)();
  std::exception_ptr eptr;
  if (result == mcclSuccess) {
    try {
      // Copies back into the caller's tensors run under the caller's InferenceMode: inference
      // tensors may only be written inside it (torchmetrics gathers under Trainer.validate).
      std::optional<c10::InferenceMode> guard;
      if (inference_mode_) guard.emplace();
      staging_->complete(true);
    } catch (...) {
      eptr = std::current_exception();
    }
  } else {
    try {
      staging_->complete(false);
    } catch (...) {
    }
    const char* detail = mcclRequestError(request_);
    try {
      throwMccl(result, name_ + group_ + issuedAt(), detail[0] ? detail : "see the log");
    } catch (...) {
      eptr = std::current_exception();
    }
  }
  if (eptr) {
    try {
      std::rethrow_exception(eptr);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    finish(eptr);
    future_->setError(eptr);
  } else {
    finish();
    try {
      // For device tensors the Future records its events under this guard: after the results.
      std::optional<c10::StreamGuard> guard = staging_->completionGuard();
      future_->markCompleted(c10::IValue(outputs_));
    } catch (...) {
      if (!future_->completed()) future_->setError(std::current_exception());
    }
  }
}

void* WorkMCCL::buffer(const at::Tensor& t, bool output, const char* op) {
  if (output)
    TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, "mccl ", op,
                ": the output tensor has elements that share memory (shape ", t.sizes(), ", strides ",
                t.strides(), ", e.g. from expand()); it cannot receive a result");
  return (output ? staging_->inout(t) : staging_->input(t)).data_ptr();
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
int WorkMCCL::sourceRank() const {
  // Known once the receive landed: a device Work's wait() does not wait for that on the host.
  if (!staging_->hostWait()) mcclWait(request_, -1);
  return mcclRequestSource(request_);
}

void WorkMCCL::synchronize() { staging_->consumerWait(); }

bool WorkMCCL::wait(std::chrono::milliseconds timeout) {
  if (!staging_->hostWait()) {
    // Device tensors: the stream waits, not the host. A collective that already failed raises,
    // and so does one on a communicator that failed (it fails at once: wait for that).
    int done = 0;
    mcclResult_t failed = mcclSuccess;
    if (!c10d::isP2POp(retrieveOpType()) && comm_ != nullptr) mcclCommGetAsyncError(comm_, &failed);
    if (failed != mcclSuccess) mcclWait(request_, -1);
    if (mcclTest(request_, &done) != mcclSuccess && done) {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return completed_; });
      if (exception_) std::rethrow_exception(exception_);
    }
    staging_->consumerWait();
    return true;
  }
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
                                   std::chrono::milliseconds timeout, const std::string& peer_hint,
                                   const std::string& label)
    : c10d::Backend(rank, size), store_(store), timeout_(timeout) {
  mcclCommConfig_t cfg;
  mcclCommConfigInit(&cfg);
  cfg.rank = rank;
  cfg.nranks = size;
  cfg.store = mcclStore_t{store_.get(), storeSet, storeGet, storeWait, storeAdd};
  cfg.name = "pg";  // the store is already prefixed per process group
  cfg.timeout_ms = timeout.count();
  cfg.peer_hint = peer_hint.empty() ? nullptr : peer_hint.c_str();
  cfg.label = label.c_str();
  mcclComm_t comm = nullptr;
  mcclResult_t res = mcclCommInitConfig(&comm, &cfg);
  if (res != mcclSuccess) throwMccl(res, "init", mcclGetLastError(nullptr));
  comm_ = comm;
  std::lock_guard<std::mutex> lock(groupsMutex());
  liveGroups().push_back(this);
}

// Takes the communicator away from every later call, once, whichever of abort, shutdown and the
// destructor comes first, from whatever thread: out of the order marks' reach first, then after
// every call that is issuing on it has issued (they hold comm_mu_ shared).
mcclComm_t ProcessGroupMCCL::takeComm() {
  {
    std::lock_guard<std::mutex> lock(groupsMutex());
    auto& groups = liveGroups();
    groups.erase(std::remove(groups.begin(), groups.end(), this), groups.end());
  }
  std::unique_lock<std::shared_mutex> lock(comm_mu_);
  return comm_.exchange(nullptr);
}

ProcessGroupMCCL::~ProcessGroupMCCL() {
  if (mcclComm_t c = takeComm()) {
    if (Completer::abandonedAtExit())
      mcclCommAbort(c);  // the exit already waited MCCL_EXIT_WAIT_S for what is in flight
    else
      mcclCommDestroy(c);
  }
  Completer::get().drain(kDrainLimit);
}

void ProcessGroupMCCL::checkRoot(int64_t root, const char* op) const {
  TORCH_CHECK(root >= 0 && root < getSize(), "mccl ", op, ": root rank ", root, " is outside 0..",
              getSize() - 1);
}

ProcessGroupMCCL::CommRef ProcessGroupMCCL::comm() const { return CommRef(comm_mu_, comm_); }

ProcessGroupMCCL::CommRef::CommRef(std::shared_mutex& mu, const std::atomic<mcclComm_t>& comm)
    : lock_(mu), comm_(comm.load()) {
  TORCH_CHECK(comm_ != nullptr, "mccl: the process group was shut down or aborted");
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupMCCL::getBackendOptions() {
  return c10::make_intrusive<Options>("mccl", timeout_);
}

c10::intrusive_ptr<WorkMCCL> ProcessGroupMCCL::makeWork(c10d::OpType type, const char* name,
                                                       std::vector<at::Tensor> outputs, const c10::Device& device,
                                                       CallKind call) {
  contexts_.timeout_ms = timeout_.count();
  call.follow_up = !call.p2p && tl_mark != nullptr && tl_mark->markerFor(comm_) != nullptr;  // see launch()
  auto work = c10::make_intrusive<WorkMCCL>(type, name, std::move(outputs), stagingFor(contexts_, device, call, name));
  work->group_ = groupLabel();
  // Here, before the caller holds the group (comm()) or the Work's issuing lock: the walk takes
  // the GIL, which no thread may wait for while holding a lock that a GIL holder may wait on
  // (the interpreter's exit aborts the groups holding the GIL).
  if (!call.p2p && checkCallSites()) work->call_site_ = pythonCallSite(&work->site_);
  return work;
}

// " on group NAME ('DESC')" for error messages: which of a program's groups failed (torch sets
// both once the group exists; a group made outside init_process_group/new_group has neither).
std::string ProcessGroupMCCL::groupLabel() const {
  const std::string& uid = getGroupUid();
  const std::string& desc = getGroupDesc();
  if (uid.empty() && (desc.empty() || desc == "undefined")) return "";
  std::string label = " on group " + (uid.empty() ? std::string("?") : uid);
  if (!desc.empty() && desc != "undefined") label += " ('" + desc + "')";
  return label;
}

template <typename Issue>
c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::launch(c10::intrusive_ptr<WorkMCCL> work,
                                                        std::chrono::milliseconds timeout,
                                                        Issue issue, double premul_factor) {
  work->handoff_.ctx = work.get();
  work->handoff_.consumer_release = &WorkMCCL::onRelease;
  work->staging_->commit(&work->handoff_);  // the producer side (device tensors: tickets, copies)
  work->self_ = work;
  const bool p2p = c10d::isP2POp(work->retrieveOpType());
  // The engine may finish the request before issued() below has run: complete() waits for it.
  std::unique_lock<std::mutex> issuing(work->issuing_);
  mcclOpOptions_t opts;
  std::memset(&opts, 0, sizeof(opts));
  opts.timeout_ms = timeoutMs(timeout, timeout_);
  opts.handoff = &work->handoff_;
  opts.premul_factor = premul_factor;
  opts.call_site = work->call_site_;  // makeWork's (0 unless MCCL_CHECK_CALL_SITES)
  // Issued from a callback with an order mark: run where the callback was attached.
  if (!p2p && tl_mark != nullptr) opts.follows = tl_mark->markerFor(comm_);
  work->comm_ = comm_;
  mcclResult_t res = issue(&opts, &work->request_);
  if (res != mcclSuccess) {
    work->staging_->refused();
    work->self_.reset();
    throwMccl(res, work->name_ + work->group_ + work->issuedAt(), mcclGetLastError(comm_));
  }
  // Counted before complete() can run: it waits for `issuing`, which this thread holds.
  Completer::get().issued();
  work->staging_->issued();  // the consumer side: copy-backs queued behind the consumer ticket
  // torch's per-group sequence number: issue order on this process (the engine's run order, which
  // can differ for follow-ups, is in mcclRequestSeq and in MCCL's messages).
  if (!p2p) work->seq_ = next_seq_++;
  return work;
}

namespace {
// A Work that finished before it was returned (the sparse all-reduce runs at issue).
class DoneWork : public c10d::Work {
 public:
  DoneWork(c10d::OpType type, const char* name, std::vector<at::Tensor> outputs)
      : c10d::Work(-1, type, profilingTitle(name)),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
    if (recordFunctionEndCallback_) std::exchange(recordFunctionEndCallback_, nullptr)();
    finish();
    future_->markCompleted(c10::IValue(outputs_));
  }
  bool wait(std::chrono::milliseconds) override { return true; }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};
}  // namespace

// Sparse COO tensors (DDP's sparse gradients, e.g. nn.Embedding(sparse=True)), summed as gloo
// does: every rank's coalesced indices and values are gathered, in rank order, and the
// concatenation is coalesced again, so every rank computes the same sum from the same operands in
// the same order (bitwise equal results). Three collectives (the sizes, the indices, the values)
// run back to back at issue, under one order marker so that no other collective comes between
// them on any rank; the Work is returned finished.
c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allreduceSparse(at::Tensor& tensor, const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM, "mccl allreduce: sparse tensors can only be summed "
              "(ReduceOp.SUM), not reduced with ReduceOp.", reduceOpName(opts.reduceOp.op_));
  at::NoGradGuard no_grad;
  at::Tensor input = tensor.coalesce();
  at::Tensor indices = input._indices().t().contiguous().cpu();  // (nnz, sparse_dim) int64
  at::Tensor values = input._values().contiguous().cpu();        // (nnz, dense dims...)
  mcclDataType_t dt = toMcclType(values, "allreduce (sparse values)");
  const int n = getSize();
  const int64_t nnz = indices.size(0), sparse_dim = input.sparse_dim();
  std::vector<int64_t> value_shape = values.sizes().vec();
  int64_t dense_numel = 1;
  for (size_t d = 1; d < value_shape.size(); d++) dense_numel *= value_shape[d];
  CommRef c = comm();
  mcclOpOptions_t mo;
  std::memset(&mo, 0, sizeof(mo));
  if (tl_mark != nullptr) mo.follows = tl_mark->markerFor(c);
  mcclRequest_t marker = nullptr;
  mcclResult_t res = mcclOrderMarker(c, &mo, &marker);
  if (res != mcclSuccess) throwMccl(res, "allreduce (sparse)", mcclGetLastError(c));
  std::shared_ptr<void> sealed(nullptr, [marker](void*) {
    mcclRequestSeal(marker);
    mcclRequestFree(marker);
  });
  mcclOpOptions_t o;
  std::memset(&o, 0, sizeof(o));
  o.follows = marker;
  o.timeout_ms = timeoutMs(opts.timeout, timeout_);
  auto finishCall = [&](mcclResult_t issued, mcclRequest_t req, const char* what) {
    if (issued != mcclSuccess) throwMccl(issued, std::string("allreduce (sparse ") + what + ")", mcclGetLastError(c));
    mcclResult_t done = mcclWait(req, -1);
    std::string err = mcclRequestError(req);
    mcclRequestFree(req);
    if (done != mcclSuccess) throwMccl(done, std::string("allreduce (sparse ") + what + ")", err.c_str());
  };
  // Every rank's number of non-zeros, then its indices and values to every rank.
  std::vector<int64_t> counts(n, 0);
  int64_t mine = nnz;
  mcclRequest_t req = nullptr;
  mcclResult_t issued = mcclAllGather(&mine, counts.data(), 1, mcclInt64, c, &o, &req);
  finishCall(issued, req, "sizes");  // (not in one expression: argument order is unspecified)
  int64_t total = 0;
  for (int64_t k : counts) total += k;
  auto gather = [&](const at::Tensor& mine_t, int64_t unit, at::Tensor& all, mcclDataType_t type, const char* what) {
    std::vector<size_t> scount(n, static_cast<size_t>(nnz * unit)), sdisp(n, 0), rcount(n), rdisp(n);
    size_t off = 0;
    for (int p = 0; p < n; p++) {
      rcount[p] = static_cast<size_t>(counts[p] * unit);
      rdisp[p] = off;
      off += rcount[p];
    }
    mcclRequest_t r = nullptr;
    mcclResult_t res_v = mcclAllToAllv(mine_t.data_ptr(), scount.data(), sdisp.data(), all.data_ptr(), rcount.data(),
                                       rdisp.data(), type, c, &o, &r);
    finishCall(res_v, r, what);
  };
  at::Tensor all_indices = at::empty({total, sparse_dim}, indices.options());
  gather(indices, sparse_dim, all_indices, mcclInt64, "indices");
  value_shape[0] = total;
  at::Tensor all_values = at::empty(value_shape, values.options());
  gather(values, dense_numel, all_values, dt, "values");
  at::Tensor sum = at::sparse_coo_tensor(all_indices.t(), all_values, tensor.sizes(), values.options().layout(at::kSparse))
                       .coalesce();
  tensor.copy_(sum.to(tensor.device()));
  return c10::make_intrusive<DoneWork>(c10d::OpType::ALLREDUCE, "allreduce", std::vector<at::Tensor>{tensor});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  const at::Tensor& t = checkSingle(tensors, "allreduce");
  if (t.layout() == at::kSparse) return allreduceSparse(tensors[0], opts);
  checkTensor(t, "allreduce");
  mcclDataType_t dt = toMcclType(t, "allreduce");
  double factor = 0;
  mcclRedOp_t op = toMcclOp(opts.reduceOp, &factor);
  auto work = makeWork(c10d::OpType::ALLREDUCE, "allreduce", tensors, t.device());
  CommRef c = comm();  // holds the group open until the call is issued
  void* ptr = work->buffer(t, true, "allreduce");
  size_t n = static_cast<size_t>(t.numel());
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclAllReduce(ptr, ptr, n, dt, op, c, o, r);
  }, factor);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  const at::Tensor& t = checkSingle(tensors, "broadcast");
  checkTensor(t, "broadcast");
  TORCH_CHECK(opts.rootTensor == 0, "mccl broadcast: rootTensor must be 0 (one tensor per process)");
  checkRoot(opts.rootRank, "broadcast");
  mcclDataType_t dt = toMcclType(t, "broadcast");
  auto work = makeWork(c10d::OpType::BROADCAST, "broadcast", tensors, t.device());
  CommRef c = comm();  // holds the group open until the call is issued
  void* ptr = work->buffer(t, true, "broadcast");
  size_t n = static_cast<size_t>(t.numel());
  int root = static_cast<int>(opts.rootRank);
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclBroadcast(ptr, n, dt, root, c, o, r);
  }, 0);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::AllgatherOptions& opts) {
  checkTensor(input, "all_gather_into_tensor");
  checkTensor(output, "all_gather_into_tensor");
  checkSameDevice(output, input, "all_gather_into_tensor");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "mccl all_gather_into_tensor: output dtype ",
              output.scalar_type(), " differs from input dtype ", input.scalar_type());
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "mccl all_gather_into_tensor: output has ",
              output.numel(), " elements, expected world size ", getSize(), " x ", input.numel());
  mcclDataType_t dt = toMcclType(input, "all_gather_into_tensor");
  auto work = makeWork(c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {output}, input.device());
  CommRef c = comm();  // holds the group open until the call is issued
  const void* in = work->buffer(input, false, "all_gather_into_tensor");
  void* out = work->buffer(output, true, "all_gather_into_tensor");
  size_t n = static_cast<size_t>(input.numel());
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclAllGather(in, out, n, dt, c, o, r);
  }, 0);
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
  bool even = true;
  for (const auto& o : outs) {
    checkTensor(o, "all_gather");
    checkSameDevice(o, input, "all_gather");
    TORCH_CHECK(o.scalar_type() == input.scalar_type(), "mccl all_gather: every output must have the input's dtype ",
                input.scalar_type(), "; got ", o.scalar_type());
    even = even && o.numel() == input.numel();
  }
  TORCH_CHECK(outs[getRank()].numel() == input.numel(), "mccl all_gather: output ", getRank(), " (this rank's) has ",
              outs[getRank()].numel(), " elements but the input has ", input.numel());
  checkOutputs(outs, "all_gather");
  mcclDataType_t dt = toMcclType(input, "all_gather");
  if (!even) return allgatherUneven(outs, input, dt, opts);
  // Gather into one flat engine buffer, then copy each block into its output.
  auto work = makeWork(c10d::OpType::ALLGATHER, "all_gather", outs, input.device());
  int64_t numel = input.numel();
  at::Tensor flat = work->staging().buffer(getSize() * numel, input.scalar_type(), [&] { return flatCat(outs); });
  for (size_t i = 0; i < outs.size(); i++)
    work->staging().copyBack(outs[i], flat.narrow(0, static_cast<int64_t>(i) * numel, numel));
  CommRef c = comm();  // holds the group open until the call is issued
  const void* in = work->buffer(input, false, "all_gather");
  void* out = flat.data_ptr();
  size_t n = static_cast<size_t>(numel);
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclAllGather(in, out, n, dt, c, o, r);
  }, 0);
}

// Outputs of different sizes per rank: output p receives rank p's input, whatever its size. Each
// rank sends its input to every rank (an all-to-allv whose send blocks are all the input), so
// every rank checks that each peer's size is the one its output expects (mcclMismatch otherwise).
c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allgatherUneven(std::vector<at::Tensor>& outs,
                                                                 const at::Tensor& input, mcclDataType_t dt,
                                                                 const c10d::AllgatherOptions& opts) {
  const int n = getSize();
  std::vector<size_t> scount(n, static_cast<size_t>(input.numel())), sdisp(n, 0), rcount(n), rdisp(n);
  size_t off = 0;
  for (int p = 0; p < n; p++) {
    rcount[p] = static_cast<size_t>(outs[p].numel());
    rdisp[p] = off;
    off += rcount[p];
  }
  auto work = makeWork(c10d::OpType::ALLGATHER, "all_gather", outs, input.device());
  at::Tensor flat = work->staging().buffer(static_cast<int64_t>(off), input.scalar_type(), [&] { return flatCat(outs); });
  splitInto(work->staging(), flat, outs);
  CommRef c = comm();  // holds the group open until the call is issued
  const void* in = work->buffer(input, false, "all_gather");
  void* out = flat.data_ptr();
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclAllToAllv(in, scount.data(), sdisp.data(), out, rcount.data(), rdisp.data(), dt, c, o, r);
  }, 0);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::barrier(const c10d::BarrierOptions& opts) {
  auto work = makeWork(c10d::OpType::BARRIER, "barrier", {}, c10::Device(c10::kCPU));
  CommRef c = comm();  // holds the group open until the call is issued
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclBarrier(c, o, r);
  }, 0);
}

// ---- the rest of the surface: staging through one flat buffer where torch hands lists ------


c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "mccl allreduce_coalesced: no tensors");
  checkAll(tensors, tensors[0], "allreduce_coalesced");
  mcclDataType_t dt = toMcclType(tensors[0], "allreduce_coalesced");
  double factor = 0;
  mcclRedOp_t op = toMcclOp(opts.reduceOp, &factor);
  auto work = makeWork(c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors, tensors[0].device());
  at::Tensor flat = work->staging().input(flatCat(tensors));
  splitInto(work->staging(), flat, tensors);
  CommRef c = comm();  // holds the group open until the call is issued
  void* ptr = flat.data_ptr();
  size_t n = static_cast<size_t>(flat.numel());
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclAllReduce(ptr, ptr, n, dt, op, c, o, r);
  }, factor);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  const at::Tensor& t = checkSingle(tensors, "reduce");
  checkTensor(t, "reduce");
  checkRoot(opts.rootRank, "reduce");
  mcclDataType_t dt = toMcclType(t, "reduce");
  double factor = 0;
  mcclRedOp_t op = toMcclOp(opts.reduceOp, &factor);
  auto work = makeWork(c10d::OpType::REDUCE, "reduce", tensors, t.device());
  CommRef c = comm();  // holds the group open until the call is issued
  void* ptr = work->buffer(t, getRank() == opts.rootRank, "reduce");  // only root's is written
  size_t n = static_cast<size_t>(t.numel());
  int root = static_cast<int>(opts.rootRank);
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclReduce(ptr, ptr, n, dt, op, root, c, o, r);  // written on root only
  }, factor);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(!inputs.empty() && inputs.size() == outputs.size(),
              "mccl allgather_into_tensor_coalesced: needs as many outputs as inputs");
  checkAll(inputs, inputs[0], "allgather_into_tensor_coalesced");
  checkAll(outputs, inputs[0], "allgather_into_tensor_coalesced");
  const int64_t n = getSize();
  for (size_t i = 0; i < inputs.size(); i++)
    TORCH_CHECK(outputs[i].numel() == n * inputs[i].numel(), "mccl allgather_into_tensor_coalesced: output ",
                i, " has ", outputs[i].numel(), " elements, expected world size x ", inputs[i].numel());
  checkOutputs(outputs, "allgather_into_tensor_coalesced");
  mcclDataType_t dt = toMcclType(inputs[0], "allgather_into_tensor_coalesced");
  auto work = makeWork(c10d::OpType::COALESCED, "allgather_into_tensor_coalesced", outputs, inputs[0].device());
  at::Tensor flat_in = work->staging().input(flatCat(inputs));
  const int64_t total = flat_in.numel();
  at::Tensor flat_out = work->staging().buffer(n * total, flat_in.scalar_type(), [&] {
    std::vector<at::Tensor> cols;
    for (size_t i = 0; i < outputs.size(); i++) cols.push_back(outputs[i].reshape({n, inputs[i].numel()}));
    return at::cat(cols, 1).reshape({-1});
  });
  // Row p of the gathered buffer is rank p's concatenated inputs: output i takes columns of it.
  at::Tensor rows = flat_out.view({n, total});
  int64_t off = 0;
  for (size_t i = 0; i < outputs.size(); i++) {
    work->staging().copyBack(outputs[i], rows.narrow(1, off, inputs[i].numel()));
    off += inputs[i].numel();
  }
  CommRef c = comm();  // holds the group open until the call is issued
  const void* in = flat_in.data_ptr();
  void* out = flat_out.data_ptr();
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclAllGather(in, out, static_cast<size_t>(total), dt, c, o, r);
  }, 0);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::GatherOptions& opts) {
  const at::Tensor& input = checkSingle(inputs, "gather");
  checkTensor(input, "gather");
  checkRoot(opts.rootRank, "gather");
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = getRank() == root;
  std::vector<at::Tensor> targets;
  if (is_root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                "mccl gather: root needs one list of world size ", getSize(), " output tensors");
    targets = outputs[0];
    checkAll(targets, input, "gather");
    for (const auto& t : targets)
      TORCH_CHECK(t.numel() == input.numel(), "mccl gather: every output must have ", input.numel(), " elements");
    checkOutputs(targets, "gather");
  } else {
    TORCH_CHECK(outputs.empty() || outputs[0].empty(), "mccl gather: only the root passes output tensors");
  }
  mcclDataType_t dt = toMcclType(input, "gather");
  auto work = makeWork(c10d::OpType::GATHER, "gather", targets, input.device());
  at::Tensor flat;
  if (is_root) {
    flat = work->staging().buffer(getSize() * input.numel(), input.scalar_type(), [&] { return flatCat(targets); });
    splitInto(work->staging(), flat, targets);
  }
  CommRef c = comm();  // holds the group open until the call is issued
  const void* in = work->buffer(input, false, "gather");
  void* out = is_root ? flat.data_ptr() : nullptr;
  size_t n = static_cast<size_t>(input.numel());
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclGather(in, out, n, dt, root, c, o, r);
  }, 0);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
  const at::Tensor& output = checkSingle(outputs, "scatter");
  checkTensor(output, "scatter");
  checkRoot(opts.rootRank, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = getRank() == root;
  at::Tensor flat;
  if (is_root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                "mccl scatter: root needs one list of world size ", getSize(), " input tensors");
    checkAll(inputs[0], output, "scatter");
    for (const auto& t : inputs[0])
      TORCH_CHECK(t.numel() == output.numel(), "mccl scatter: every input must have ", output.numel(), " elements");
  } else {
    TORCH_CHECK(inputs.empty() || inputs[0].empty(), "mccl scatter: only the root passes input tensors");
  }
  mcclDataType_t dt = toMcclType(output, "scatter");
  auto work = makeWork(c10d::OpType::SCATTER, "scatter", outputs, output.device());
  if (is_root) flat = work->staging().input(flatCat(inputs[0]));
  CommRef c = comm();  // holds the group open until the call is issued
  const void* in = is_root ? flat.data_ptr() : nullptr;
  void* out = work->buffer(output, true, "scatter");
  size_t n = static_cast<size_t>(output.numel());
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclScatter(in, out, n, dt, root, c, o, r);
  }, 0);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::ReduceScatterOptions& opts) {
  checkTensor(input, "reduce_scatter_tensor");
  checkTensor(output, "reduce_scatter_tensor");
  checkSameDevice(output, input, "reduce_scatter_tensor");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "mccl reduce_scatter_tensor: output dtype ",
              output.scalar_type(), " differs from input dtype ", input.scalar_type());
  TORCH_CHECK(input.numel() == output.numel() * getSize(), "mccl reduce_scatter_tensor: input has ",
              input.numel(), " elements, expected world size ", getSize(), " x ", output.numel());
  mcclDataType_t dt = toMcclType(input, "reduce_scatter_tensor");
  double factor = 0;
  mcclRedOp_t op = toMcclOp(opts.reduceOp, &factor);
  auto work = makeWork(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {output}, input.device());
  CommRef c = comm();  // holds the group open until the call is issued
  const void* in = work->buffer(input, false, "reduce_scatter_tensor");
  void* out = work->buffer(output, true, "reduce_scatter_tensor");
  size_t n = static_cast<size_t>(output.numel());
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclReduceScatter(in, out, n, dt, op, c, o, r);
  }, factor);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) {
  at::Tensor& output = const_cast<at::Tensor&>(checkSingle(outputs, "reduce_scatter"));
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
              "mccl reduce_scatter: needs one list of world size ", getSize(), " input tensors");
  checkAll(inputs[0], output, "reduce_scatter");
  for (const auto& t : inputs[0])
    TORCH_CHECK(t.numel() == output.numel(), "mccl reduce_scatter: every input must have ", output.numel(), " elements");
  at::Tensor flat = flatCat(inputs[0]);
  return _reduce_scatter_base(output, flat, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(!inputs.empty() && inputs.size() == outputs.size(),
              "mccl reduce_scatter_tensor_coalesced: needs as many outputs as inputs");
  checkAll(inputs, inputs[0], "reduce_scatter_tensor_coalesced");
  checkAll(outputs, inputs[0], "reduce_scatter_tensor_coalesced");
  const int64_t n = getSize();
  std::vector<at::Tensor> rows;  // input i as (n, m_i): row p is rank p's block
  for (size_t i = 0; i < inputs.size(); i++) {
    TORCH_CHECK(inputs[i].numel() == n * outputs[i].numel(), "mccl reduce_scatter_tensor_coalesced: input ",
                i, " has ", inputs[i].numel(), " elements, expected world size x ", outputs[i].numel());
    rows.push_back(inputs[i].reshape({n, outputs[i].numel()}));
  }
  checkOutputs(outputs, "reduce_scatter_tensor_coalesced");
  mcclDataType_t dt = toMcclType(inputs[0], "reduce_scatter_tensor_coalesced");
  double factor = 0;
  mcclRedOp_t op = toMcclOp(opts.reduceOp, &factor);
  auto work = makeWork(c10d::OpType::COALESCED, "reduce_scatter_tensor_coalesced", outputs, inputs[0].device());
  // Rank-major staging: block p holds every input's row p, so one reduce-scatter serves all.
  at::Tensor staged = work->staging().input(at::cat(rows, 1).reshape({-1}));
  at::Tensor flat_out = work->staging().buffer(staged.numel() / n, staged.scalar_type(), [&] { return flatCat(outputs); });
  splitInto(work->staging(), flat_out, outputs);
  CommRef c = comm();  // holds the group open until the call is issued
  const void* in = staged.data_ptr();
  void* out = flat_out.data_ptr();
  size_t count = static_cast<size_t>(flat_out.numel());
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclReduceScatter(in, out, count, dt, op, c, o, r);
  }, factor);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t>& outputSplitSizes,
                                                               std::vector<int64_t>& inputSplitSizes,
                                                               const c10d::AllToAllOptions& opts) {
  checkTensor(input, "all_to_all_single");
  checkTensor(output, "all_to_all_single");
  checkSameDevice(output, input, "all_to_all_single");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "mccl all_to_all_single: output dtype ",
              output.scalar_type(), " differs from input dtype ", input.scalar_type());
  const int n = getSize();
  mcclDataType_t dt = toMcclType(input, "all_to_all_single");
  // Split sizes count rows of dimension 0; a row holds numel / size(0) elements.
  auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
    std::vector<size_t> cnt(n), disp(n);
    int64_t row = t.dim() > 0 && t.size(0) > 0 ? t.numel() / t.size(0) : 0;
    if (splits.empty()) {
      TORCH_CHECK(t.dim() > 0 ? t.size(0) % n == 0 : t.numel() == 0, "mccl all_to_all_single: ", which,
                  " dimension 0 (", t.dim() > 0 ? t.size(0) : 0, ") is not divisible by world size ", n);
      for (int j = 0; j < n; j++) cnt[j] = static_cast<size_t>(t.numel() / n);
    } else {
      TORCH_CHECK(static_cast<int>(splits.size()) == n, "mccl all_to_all_single: ", which, " split sizes have ",
                  splits.size(), " entries, expected world size ", n);
      int64_t rows = 0;
      for (int j = 0; j < n; j++) {
        TORCH_CHECK(splits[j] >= 0, "mccl all_to_all_single: negative split size");
        cnt[j] = static_cast<size_t>(splits[j] * row);
        rows += splits[j];
      }
      TORCH_CHECK(rows == (t.dim() > 0 ? t.size(0) : 0), "mccl all_to_all_single: ", which,
                  " split sizes add up to ", rows, " rows, the tensor has ", t.dim() > 0 ? t.size(0) : 0);
    }
    size_t off = 0;
    for (int j = 0; j < n; j++) {
      disp[j] = off;
      off += cnt[j];
    }
    return std::make_pair(cnt, disp);
  };
  auto [scount, sdisp] = counts(input, inputSplitSizes, "input");
  auto [rcount, rdisp] = counts(output, outputSplitSizes, "output");
  auto work = makeWork(c10d::OpType::ALLTOALL_BASE, "all_to_all_single", {output}, input.device());
  CommRef c = comm();  // holds the group open until the call is issued
  const void* in = work->buffer(input, false, "all_to_all_single");
  void* out = work->buffer(output, true, "all_to_all_single");
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclAllToAllv(in, scount.data(), sdisp.data(), out, rcount.data(), rdisp.data(), dt, c, o, r);
  }, 0);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
  const int n = getSize();
  TORCH_CHECK(static_cast<int>(inputs.size()) == n && static_cast<int>(outputs.size()) == n,
              "mccl all_to_all: needs world size ", n, " input and output tensors");
  checkAll(inputs, inputs[0], "all_to_all");
  checkAll(outputs, inputs[0], "all_to_all");
  checkOutputs(outputs, "all_to_all");
  int64_t out_total = 0;
  std::vector<size_t> scount(n), sdisp(n), rcount(n), rdisp(n);
  size_t soff = 0, roff = 0;
  for (int j = 0; j < n; j++) {
    scount[j] = static_cast<size_t>(inputs[j].numel());
    sdisp[j] = soff;
    soff += scount[j];
    rcount[j] = static_cast<size_t>(outputs[j].numel());
    rdisp[j] = roff;
    roff += rcount[j];
    out_total += outputs[j].numel();
  }
  mcclDataType_t dt = toMcclType(inputs[0], "all_to_all");
  auto work = makeWork(c10d::OpType::ALLTOALL, "all_to_all", outputs, inputs[0].device());
  at::Tensor flat_in = work->staging().input(flatCat(inputs));
  at::Tensor flat_out = work->staging().buffer(out_total, inputs[0].scalar_type(), [&] { return flatCat(outputs); });
  splitInto(work->staging(), flat_out, outputs);
  CommRef c = comm();  // holds the group open until the call is issued
  const void* in = flat_in.data_ptr();
  void* out = flat_out.data_ptr();
  return launch(work, opts.timeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclAllToAllv(in, scount.data(), sdisp.data(), out, rcount.data(), rdisp.data(), dt, c, o, r);
  }, 0);
}

// Point-to-point: matched per (peer, tag) in issue order, outside the collective sequence.
c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  const at::Tensor& t = checkSingle(tensors, "send");
  checkTensor(t, "send");
  mcclDataType_t dt = toMcclType(t, "send");
  auto work = makeWork(c10d::OpType::SEND, "send", tensors, t.device(), CallKind{true, dstRank});
  CommRef c = comm();  // holds the group open until the call is issued
  const void* ptr = work->buffer(t, false, "send");
  size_t n = static_cast<size_t>(t.numel());
  return launch(work, c10d::kUnsetTimeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclSend(ptr, n, dt, dstRank, tag, c, o, r);
  }, 0);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  const at::Tensor& t = checkSingle(tensors, "recv");
  checkTensor(t, "recv");
  mcclDataType_t dt = toMcclType(t, "recv");
  auto work = makeWork(c10d::OpType::RECV, "recv", tensors, t.device(), CallKind{true, srcRank});
  CommRef c = comm();  // holds the group open until the call is issued
  void* ptr = work->buffer(t, true, "recv");
  size_t n = static_cast<size_t>(t.numel());
  return launch(work, c10d::kUnsetTimeout, [&](const mcclOpOptions_t* o, mcclRequest_t* r) {
    return mcclRecv(ptr, n, dt, srcRank, tag, c, o, r);
  }, 0);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return recv(tensors, MCCL_ANY_SOURCE, tag);
}

void ProcessGroupMCCL::abort() {
  if (mcclComm_t c = takeComm()) mcclCommAbort(c);
}

// atExit, once its wait ran out. The list is copied first: abort() takes the groups' lock itself.
// Only the exiting main thread destroys groups at that point, so none goes away meanwhile.
void abortLiveGroups() {
  std::vector<ProcessGroupMCCL*> groups;
  {
    std::lock_guard<std::mutex> lock(groupsMutex());
    groups = liveGroups();
  }
  for (ProcessGroupMCCL* pg : groups) pg->abort();
}

void ProcessGroupMCCL::shutdown() {
  if (mcclComm_t c = takeComm()) mcclCommDestroy(c);  // every Work released: their completions are posted
  Completer::get().drain(kDrainLimit);
}

void completionsAtExit(double seconds) {
  Completer::atExit(std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0)));
}

}  // namespace mccl
