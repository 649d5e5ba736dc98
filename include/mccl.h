/*
 * mccl.h: the public C11 API of MCCL, a collective-communication library over TCP.
 *
 * One communicator (mcclComm_t) connects `nranks` processes, numbered 0..nranks-1. Collectives are
 * issued on the caller's thread, which stamps each with the communicator's next sequence number;
 * a progress engine (one thread per communicator) runs them strictly in that order, so every
 * rank sees the same order on the wire whatever its threads do. Every call returns an
 * mcclResult_t and writes outputs through pointers. Nothing in this library calls abort() or
 * exit(), and nothing blocks without a deadline.
 *
 * Threading: every function may be called from any thread. Collectives on one communicator must
 * be issued in the same order on every rank (as with NCCL and torch.distributed); issuing from
 * two threads at once is allowed, but then the order is whatever the lock gives.
 *
 * Buffers: a buffer passed to a collective must stay valid, and must not be written by anyone
 * else, until the request completes (mcclWait / mcclTest reports it done) or, when a handoff is
 * given, until its consumer timeline was signalled and its consumer_release callback has run.
 */
#ifndef MCCL_H_
#define MCCL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MCCL_BUILDING_LIBRARY)
#define MCCL_API __attribute__((visibility("default")))
#else
#define MCCL_API
#endif

#define MCCL_VERSION_MAJOR 0
#define MCCL_VERSION_MINOR 1
#define MCCL_VERSION_PATCH 0

/* Result codes. mcclGetErrorString() names each; the communicator's last error says more. */
typedef enum {
  mcclSuccess = 0,
  mcclInProgress = 1,      /* mcclTest/mcclWait: the request has not finished yet. */
  mcclInvalidArgument = 2, /* A bad pointer, size, dtype, op or rank, caught before any I/O. */
  mcclInvalidUsage = 3,    /* A call that is not allowed in the current state. */
  mcclSystemError = 4,     /* An OS call failed (socket, thread, memory). */
  mcclRemoteError = 5,     /* A peer closed or reset its connection, or sent an abort. */
  mcclTimeout = 6,         /* A deadline passed while waiting for a peer or a store key. */
  mcclMismatch = 7,        /* Ranks issued different collectives (kind, size, dtype, op, root). */
  mcclProtocolError = 8,   /* Malformed bytes from a peer (bad magic, version, token, frame). */
  mcclAborted = 9,         /* mcclCommAbort was called. */
  mcclInternalError = 10,  /* A bug in MCCL. */
  mcclUnsupported = 11,    /* A valid request this build cannot serve (e.g. AVG of bool). */
  mcclNumResults = 12
} mcclResult_t;

/* Element types. Sizes in bytes: 1, 1, 4, 8, 2, 4, 8, 2, 1, 2, 2, 4, 8. Bool is one byte holding 0
 * or 1. The numbers are part of the wire protocol (frames carry them): new types are appended, and
 * no value ever changes. */
typedef enum {
  mcclInt8 = 0,
  mcclUint8 = 1,
  mcclInt32 = 2,
  mcclInt64 = 3,
  mcclFloat16 = 4,  /* IEEE binary16; reduced in fp32, rounded to nearest even once per hop. */
  mcclFloat32 = 5,
  mcclFloat64 = 6,
  mcclBfloat16 = 7, /* bfloat16; reduced in fp32, rounded to nearest even once per hop. */
  mcclBool = 8,
  mcclInt16 = 9,
  mcclUint16 = 10,
  mcclUint32 = 11,
  mcclUint64 = 12,
  mcclNumTypes = 13
} mcclDataType_t;

/* Reduction operators.
 * SUM, PROD, MAX, MIN on every type. Integers (signed and unsigned, 8 to 64 bits) wrap around
 * (two's complement, i.e. modulo 2^bits) and never pass through floating point; MAX and MIN
 * compare signed types as signed and unsigned types as unsigned. Bool: SUM and MAX are logical
 * OR, PROD and MIN are logical AND.
 * MAX/MIN of floats propagate NaN (as torch.maximum/torch.minimum do).
 * AVG: the sum divided by the number of ranks, once, at the end: true division for floating
 * types, division truncating toward zero for integers (of the wrapped sum, for unsigned types an
 * unsigned division); not defined for bool.
 * BAND, BOR, BXOR: bitwise, integer and bool types only.
 * PREMUL_SUM: every rank multiplies its own input by mcclOpOptions_t.premul_factor (once, in
 * fp32 for the half types, in the type otherwise), then the products are summed; floating types
 * only (what FSDP uses to average gradients without a final division). */
typedef enum {
  mcclSum = 0,
  mcclProd = 1,
  mcclMax = 2,
  mcclMin = 3,
  mcclAvg = 4,
  mcclBand = 5,
  mcclBor = 6,
  mcclBxor = 7,
  mcclPremulSum = 8,
  mcclNumOps = 9
} mcclRedOp_t;

/* ---------------------------------------------------------------------------------------------
 * Bootstrap store: how ranks find each other.
 *
 * A small key-value store shared by all ranks of a job (torch's c10d::Store plugs in here). Keys
 * are NUL-terminated strings; values are byte strings. All callbacks may be called from the
 * thread that creates the communicator only, and must be safe to call while other communicators
 * use the same store.
 *   set:  store `len` bytes under `key`, replacing any old value.
 *   get:  wait up to `timeout_ms` for `key` to exist, then copy at most `cap` bytes of its value
 *         into `buf` and its full length into `*len`. mcclTimeout if it never appears.
 *   wait: wait up to `timeout_ms` for `key` to exist. mcclTimeout if it never appears.
 *   add:  atomically add `delta` to the integer stored under `key` (0 if absent) and write the
 *         new value to `*result`.
 * ------------------------------------------------------------------------------------------- */
typedef struct mcclStore {
  void* ctx;
  mcclResult_t (*set)(void* ctx, const char* key, const void* value, size_t len);
  mcclResult_t (*get)(void* ctx, const char* key, void* buf, size_t cap, size_t* len,
                      int64_t timeout_ms);
  mcclResult_t (*wait)(void* ctx, const char* key, int64_t timeout_ms);
  mcclResult_t (*add)(void* ctx, const char* key, int64_t delta, int64_t* result);
} mcclStore_t;

/* The built-in TCP store, for C programs and tools that have no torch store.
 * One process serves (mcclTcpStoreServe) and every rank connects as a client.
 *
 * mcclTcpStoreListen: bind a listening socket on `host` (a numeric address; NULL: all interfaces)
 *   and `port` (0..65535, 0: an ephemeral port); writes the bound port to `*port_out` and the
 *   server handle to `*server`.
 * mcclTcpStoreServe: serve requests until mcclTcpStoreStop is called from another thread or
 *   `expected_clients` clients have connected and all of them have closed (0: serve until
 *   stopped). Blocks the calling thread.
 * mcclTcpStoreStop / mcclTcpStoreFree: stop serving; free the server (both: NULL is a no-op).
 * mcclTcpStoreConnect: connect to `host`:`port` (numeric, 1..65535), retrying until `timeout_ms`
 *   (>= 0; 0: one attempt); fills `*store`.
 * mcclTcpStoreClose: close a client store made by mcclTcpStoreConnect (NULL: a no-op). */
typedef struct mcclTcpStoreServer mcclTcpStoreServer_t;
MCCL_API mcclResult_t mcclTcpStoreListen(const char* host, int port, int* port_out,
                                         mcclTcpStoreServer_t** server);
MCCL_API mcclResult_t mcclTcpStoreServe(mcclTcpStoreServer_t* server, int expected_clients);
MCCL_API void mcclTcpStoreStop(mcclTcpStoreServer_t* server);
MCCL_API void mcclTcpStoreFree(mcclTcpStoreServer_t* server);
MCCL_API mcclResult_t mcclTcpStoreConnect(const char* host, int port, int64_t timeout_ms,
                                          mcclStore_t* store);
MCCL_API void mcclTcpStoreClose(mcclStore_t* store);

/* ---------------------------------------------------------------------------------------------
 * Communicators
 *
 * fork(): a communicator belongs to the process that created it. A child of fork() inherits its
 * memory but none of its threads, so in the child every call on an inherited communicator (or
 * issuing anything on it) fails at once with mcclInvalidUsage, and mcclGetLastError says that it
 * was created in process <pid> and cannot be used after fork(); no call blocks, whatever the
 * timeout. The child's copies of the communicator's sockets are closed during the fork itself
 * (a pthread_atfork handler; close() only drops the child's reference), so the parent's
 * connections and collectives carry on untouched, and nothing the child does with the inherited
 * communicator sends a byte or shuts a connection down. mcclCommDestroy and mcclCommAbort of an
 * inherited communicator free the child's copy and return mcclSuccess, without joining the
 * parent's threads or sending ABORT frames. Requests issued before the fork belong to the parent
 * too: the child must not wait on, test or free them. A new communicator created in the child
 * (over a store connection of its own) works as any other. Children that never touch MCCL, such
 * as DataLoader workers, are not affected at all.
 * ------------------------------------------------------------------------------------------- */
typedef struct mcclComm* mcclComm_t;

typedef struct mcclCommConfig {
  size_t size;            /* sizeof(mcclCommConfig_t): lets the struct grow compatibly. */
  int rank;               /* This process's rank, 0 <= rank < nranks. */
  int nranks;             /* The world size of this communicator, >= 1. */
  mcclStore_t store;      /* How ranks exchange addresses and the job token. */
  const char* name;       /* Group name, part of every store key: 1 to 127 characters (NULL:
                             "default"). */
  int64_t timeout_ms;     /* Default deadline of init and of every collective (<= 0: 30 min;
                             longer than ~29 years: ~29 years, i.e. forever). */
  const char* peer_hint;  /* A host all ranks can reach (e.g. MASTER_ADDR); picks the interface
                             whose route leads there when MCCL_SOCKET_IFNAME is unset. NULL: none. */
  const char* label;      /* How log lines and error messages name this communicator, e.g. the
                             framework's group name ("group 3"); cut to 127 characters. Never part of
                             a store key. NULL or "": the name. */
} mcclCommConfig_t;

/* Initialise `*config` with defaults (size set, timeout 30 min, name "default"). NULL: a no-op
 * that leaves a message for mcclGetLastError(NULL). */
MCCL_API void mcclCommConfigInit(mcclCommConfig_t* config);

/* Create a communicator. Collective over all `nranks` ranks: each must call it with the same
 * name, store and nranks. Checks every rank's world size and rank through the store first,
 * listens on an ephemeral port, publishes its address under a key made of the group name and an
 * init generation (so re-inits never meet stale endpoints), connects to every peer with an
 * authenticated handshake, and starts the progress engine.
 * Errors: mcclInvalidArgument (bad config; or ranks started with different world sizes, or two
 * processes with one rank: every rank that can see it fails at once, its message naming both
 * world sizes and ranks), mcclTimeout (a peer never showed up within the timeout: the message
 * names the ranks still missing), a store failure (the callback's result, e.g. mcclRemoteError
 * for a closed connection, or mcclRemoteError for a callback that reported a timeout long before
 * the deadline it was given; the message says "the bootstrap store failed while ..."),
 * mcclSystemError. On failure *comm is NULL and mcclGetLastError() explains why. After a failed
 * init of world sizes that differ, that group's keys on that store are spoilt: use a new store
 * (or group name). */
MCCL_API mcclResult_t mcclCommInitConfig(mcclComm_t* comm, const mcclCommConfig_t* config);

/* Finish every request already issued (each bounded by its own deadline), then close all
 * connections, stop the engine and free the communicator. */
MCCL_API mcclResult_t mcclCommDestroy(mcclComm_t comm);

/* Fail every issued and future request with mcclAborted, unblock every waiter, close all
 * connections, and free the communicator. Safe to call from any thread, once. */
MCCL_API mcclResult_t mcclCommAbort(mcclComm_t comm);

MCCL_API mcclResult_t mcclCommRank(mcclComm_t comm, int* rank);
MCCL_API mcclResult_t mcclCommCount(mcclComm_t comm, int* nranks);

/* The communicator's first fatal error, or mcclSuccess. Once set, every later request fails with
 * it. The message names the peer rank, its address and the operation. */
MCCL_API mcclResult_t mcclCommGetAsyncError(mcclComm_t comm, mcclResult_t* error);

/* A human-readable message for the last error of `comm` (NULL: the calling thread's last error,
 * e.g. from a failed init). Valid until the next call on the same communicator or thread. */
MCCL_API const char* mcclGetLastError(mcclComm_t comm);

/* A static name for a result code. */
MCCL_API const char* mcclGetErrorString(mcclResult_t result);

/* The value in force of integer parameter `name` (an MCCL_* variable of docs/ENVIRONMENT.md, read
 * once per process; its default when unset or refused), for layers above the library (the torch
 * shim) so that the environment has one reader. mcclInvalidArgument for an unknown name. */
MCCL_API mcclResult_t mcclGetEnvInt(const char* name, int64_t* value);

/* The name of the library's parameter number `index` (0, 1, ... in docs/ENVIRONMENT.md's table
 * order), or NULL past the last; *is_string (if not NULL) is 1 for a string parameter (read it
 * from the environment; mcclGetEnvInt refuses it) and 0 for an integer one. For tools that list
 * what is in force (python -m mccl.info). */
MCCL_API const char* mcclGetEnvName(int index, int* is_string);

/* Which build of the reduction kernels this process runs, decided from the CPU at run time:
 * "x86-64 AVX2 + F16C", "x86-64 baseline (...)", "arm64 baseline (NEON)" or "portable C". */
MCCL_API const char* mcclGetReduceKernels(void);

/* Bytes per element; 0 for a value outside mcclDataType_t. */
MCCL_API size_t mcclDataTypeSize(mcclDataType_t datatype);

/* ---------------------------------------------------------------------------------------------
 * Device handoff: the seam between a device's stream and the engine (ARCHITECTURE.md, rules O1-O3).
 *
 * A timeline is a monotonic 64-bit counter that a device and the CPU share. A device raises it
 * from its stream when the work queued before has finished (CUDA: cuStreamWriteValue64 on mapped
 * pinned host memory; MPS: an MTLSharedEvent signal) and waits on it from its stream until the
 * CPU raised it (cuStreamWaitValue64, encodeWaitForEvent). The engine never blocks on a device:
 * it polls a producer timeline (O1) and raises a consumer timeline (O2), and calls nothing of a
 * device's runtime. All timeline functions are thread-safe and never call back into the device's
 * runtime except through the ops given at creation.
 *
 * Value semantics: mcclTimelineValue is the largest value signalled so far; a value v is reached
 * once the timeline's value is >= v (for MCCL_TIMELINE_32BIT: once (int32_t)(value - v) >= 0 on
 * the low 32 bits, CUDA's wrap-around rule for 32-bit stream waits). Signalling never lowers the
 * value. A failed timeline (mcclTimelineFail) keeps the values it reached and reports its error
 * for every value it had not reached.
 * ------------------------------------------------------------------------------------------- */
typedef struct mcclTimeline* mcclTimeline_t;

/* For a timeline whose value is not a word of memory the CPU can read (MPS: an
 * MTLSharedEvent's signaledValue). Both must be non-blocking and callable from any thread. */
typedef struct mcclTimelineOps {
  void* ctx;
  uint64_t (*read)(void* ctx);               /* the current value */
  void (*write)(void* ctx, uint64_t value);  /* set the value (called with increasing values) */
} mcclTimelineOps_t;

#define MCCL_TIMELINE_32BIT 1 /* mcclTimelineCreate flag: the device reads and writes only the
                                 low 32 bits of `word` (little-endian), with wrap-around */

/* Create a timeline over `word` (8 bytes, 8-byte aligned, e.g. mapped pinned host memory; it must
 * outlive the timeline; its current contents are the initial value), or over `ops` (word NULL),
 * or, with both NULL, over memory of its own starting at 0. flags: 0 or MCCL_TIMELINE_32BIT.
 * Errors: mcclInvalidArgument (word and ops both given, bad flags, misaligned word),
 * mcclSystemError (out of memory). */
MCCL_API mcclResult_t mcclTimelineCreate(uint64_t* word, int flags, const mcclTimelineOps_t* ops,
                                         mcclTimeline_t* timeline);

/* Free a timeline (NULL: a no-op). No thread may be waiting on it. */
MCCL_API void mcclTimelineDestroy(mcclTimeline_t timeline);

/* The current value (an acquire read: memory the signaller wrote before signalling is visible). */
MCCL_API uint64_t mcclTimelineValue(mcclTimeline_t timeline);

/* Raise the value to `value` (a release write; no-op when already there) and wake waiters. */
MCCL_API mcclResult_t mcclTimelineSignal(mcclTimeline_t timeline, uint64_t value);

/* Mark the timeline failed with `error` (an mcclResult_t other than mcclSuccess/mcclInProgress;
 * the first one sticks) and wake waiters: values it had not reached now report that error. */
MCCL_API mcclResult_t mcclTimelineFail(mcclTimeline_t timeline, mcclResult_t error);

/* Non-blocking: mcclSuccess once `value` is reached, mcclInProgress before, or the error of a
 * failed timeline that has not reached it. */
MCCL_API mcclResult_t mcclTimelinePoll(mcclTimeline_t timeline, uint64_t value);

/* Block until `value` is reached (mcclSuccess), the timeline fails (its error; mcclTimelineFail
 * with mcclAborted is how another thread wakes a waiter early), or `timeout_ms` passes
 * (mcclTimeout; < 0: no deadline). CPU signals wake it at once; values a device writes are seen
 * within a fraction of a millisecond (it spins briefly, then sleeps in growing slices up to 1 ms). */
MCCL_API mcclResult_t mcclTimelineWait(mcclTimeline_t timeline, uint64_t value, int64_t timeout_ms);

/* The handoff of one request. O1: the engine reads no byte of the request's buffers before
 * `producer` reached `producer_value` (NULL: no producer; CPU memory); it polls, so a producer
 * that is late never stops the engine from progressing other work, and one that never finishes
 * fails the request with mcclTimeout at the request's deadline (or with the producer timeline's
 * error). O2: when the request is finished (success, error, timeout, abort, or never run because
 * the communicator had failed) the engine first signals `consumer` with `consumer_value` (if
 * non-NULL), so that no device stream waiting on it waits forever, and then calls
 * consumer_release (if non-NULL) with the result; both happen exactly once, on the engine's thread
 * (or on the thread of mcclCommAbort / mcclCommDestroy), and only for a request whose issuing call
 * returned mcclSuccess: a call that fails returns without touching the handoff. consumer_release
 * must not block on a device (it may post work elsewhere); the caller may release the buffers
 * once it ran. The timelines must outlive the request. */
typedef struct mcclHandoff {
  mcclTimeline_t producer;
  uint64_t producer_value;
  mcclTimeline_t consumer;
  uint64_t consumer_value;
  void* ctx;
  void (*consumer_release)(void* ctx, mcclResult_t result);
} mcclHandoff_t;

/* Algorithm choice for one call (benchmarks and tests force one; users leave AUTO). */
typedef enum {
  mcclAlgoAuto = 0, /* by size: MCCL_RING_THRESHOLD bytes and up take the ring, except medium
                       all-reduces, which may take halving-doubling (docs/algorithms.md) */
  mcclAlgoRing = 1, /* pipelined ring (all-reduce, all-gather) or chain (broadcast) */
  mcclAlgoTree = 2, /* recursive doubling (all-reduce) or a log-depth broadcast (Bruck) */
  mcclAlgoHalvingDoubling = 3 /* all-reduce: recursive halving, then recursive doubling
                                 (Rabenseifner): 2 log2 p rounds, 2 (p-1)/p of the buffer per
                                 rank, p the largest power of two <= nranks; the other
                                 collectives run as with mcclAlgoRing */
} mcclAlgorithm_t;

/* Per-call options; pass NULL for the defaults. Zero-initialise, then set what you need. */
typedef struct mcclOpOptions {
  int64_t timeout_ms;            /* <= 0: the communicator's timeout. Counted from when the
                                    engine starts the request. */
  const mcclHandoff_t* handoff;  /* NULL: plain CPU memory, no callbacks. Copied at issue. */
  mcclAlgorithm_t algorithm;     /* mcclAlgoAuto unless a test or benchmark forces one. */
  double premul_factor;          /* the factor of mcclPremulSum; ignored by other ops */
  int hold;                      /* 1: hold the run order after this collective until
                                    mcclRequestSeal (see "Issue order" below). */
  struct mcclRequest* follows;   /* NULL, or a collective request of the same communicator that
                                    this collective follows up (see "Issue order" below). */
  uint32_t call_site;            /* 0, or a tag of the place in the caller's program that issued
                                    this collective (e.g. a hash of file and line): carried in its
                                    frames and compared with the peers' like its count, so
                                    ranks that pair collectives from two different places fail
                                    with mcclMismatch instead of combining them. 0 matches any
                                    tag (a caller that has none). Point-to-point calls ignore
                                    it. The torch shim sets it when MCCL_CHECK_CALL_SITES=1
                                    (docs/FAILURES.md). */
} mcclOpOptions_t;

/* ---------------------------------------------------------------------------------------------
 * Requests. Every collective takes `request`: when non-NULL, the call returns at once with a
 * request to wait on; when NULL, the call blocks until the collective has finished.
 * ------------------------------------------------------------------------------------------- */
typedef struct mcclRequest* mcclRequest_t;

/* Wait up to `timeout_ms` (< 0: forever; the request's own deadline still applies) for the
 * request to finish. Returns mcclSuccess, the request's error, or mcclInProgress when this
 * wait's timeout passed first (the request goes on). */
MCCL_API mcclResult_t mcclWait(mcclRequest_t request, int64_t timeout_ms);

/* Non-blocking: *done = 1 and the request's result once it finished, else *done = 0. */
MCCL_API mcclResult_t mcclTest(mcclRequest_t request, int* done);

/* The collective's position in its communicator's run order (0, 1, 2, ...), the number its
 * frames and error messages carry. Known once the engine started the request (always once it
 * finished); before that, UINT64_MAX. Point-to-point requests are numbered on their own. */
MCCL_API uint64_t mcclRequestSeq(mcclRequest_t request);

/* ---------------------------------------------------------------------------------------------
 * Issue order. Collectives run one after another in the order they were issued, and that order
 * must be the same on every rank. A program whose completion callbacks issue collectives (the
 * communication hooks of PyTorch's DDP do) has no such order: a callback runs on another thread,
 * at a time that differs from rank to rank. Follow-ups give it one:
 *
 *  - A collective R issued with mcclOpOptions_t.hold = 1 keeps the engine from starting any
 *    collective ordered after R until mcclRequestSeal(R) is called (the owner seals R once R's
 *    callbacks have returned; the hold must be asked for at issue, since R may finish at once).
 *  - A collective issued with mcclOpOptions_t.follows = R while R is held runs after R and R's
 *    earlier follow-ups (and theirs), before any collective ordered after R.
 *
 * The run order is then the depth-first order of the follow-up tree, identical on every rank
 * whatever the thread timing; it is the order NCCL gives when callbacks run inline at issue.
 * mcclOrderMarker (below) places a hold where a callback is attached rather than where its
 * collective was issued: the torch shim uses that (docs/algorithms.md, "Run order").
 * A follow-up of a request that is no longer held (it finished and was sealed, or never held)
 * takes its place in plain issue order. If a held request is not sealed within its timeout while
 * other collectives wait behind it, the communicator fails with mcclTimeout naming it (a
 * callback that waits for a collective issued after the one it follows can never finish).
 * Point-to-point requests are not ordered this way and cannot be held or followed.
 * ------------------------------------------------------------------------------------------- */

/* Releases a hold (idempotent; a no-op on a request never held or on a point-to-point one). */
MCCL_API mcclResult_t mcclRequestSeal(mcclRequest_t request);

/* An order marker: a request that sends nothing and takes no sequence number, placed in the run
 * order where the call is made (after every collective issued so far, or, with options->follows
 * set, as a follow-up of that request), and held there until mcclRequestSeal(*marker). Collectives
 * issued with mcclOpOptions_t.follows = *marker run at the marker's place, before any collective
 * issued after it. A completion callback attached at some point of a program can so give the
 * collectives it will issue that point of the program order, on every rank, whether it runs at
 * once (its collective already finished) or later on another thread: the torch shim places one
 * when a callback is attached to a Future of an mccl collective. The marker finishes (mcclWait)
 * as soon as the engine reaches it; mcclRequestFree it once sealed. Its hold's timeout is the
 * communicator's, counted from when the engine reached it. Errors: mcclInvalidArgument (NULL
 * comm or marker, a bad options->follows), mcclInvalidUsage (the communicator is being destroyed). */
MCCL_API mcclResult_t mcclOrderMarker(mcclComm_t comm, const mcclOpOptions_t* options, mcclRequest_t* marker);

/* The error message of a failed request ("" on success). Valid once mcclWait/mcclTest reported the
 * request done, and inside its consumer_release callback; until mcclRequestFree. */
MCCL_API const char* mcclRequestError(mcclRequest_t request);

/* Release the caller's hold. The engine keeps its own until the request finishes, so freeing a
 * running request is allowed (its result is then lost). */
MCCL_API void mcclRequestFree(mcclRequest_t request);

/* ---------------------------------------------------------------------------------------------
 * Collectives. Counts are in elements of `datatype`; a count of 0 is a no-op that still takes a
 * sequence number. In-place use is allowed where stated (sendbuf == recvbuf). Every rank's
 * result is bitwise identical. Errors before any byte moves: mcclInvalidArgument for a bad
 * dtype/op/root/pointer, mcclUnsupported for an op the dtype lacks; later errors (peer lost,
 * timeout, mismatch) come from mcclWait and also fail the communicator.
 *
 * Mismatches: a collective succeeds on a rank only if every rank issued the same one (kind,
 * count, dtype, op, root). When one rank's differs, every rank fails with mcclMismatch or
 * mcclRemoteError naming the mismatch, and no rank's output (nor input) has changed: outputs are
 * written only once the collective is known to match everywhere (docs/algorithms.md).
 * ------------------------------------------------------------------------------------------- */

/* recvbuf[i] = op over ranks of sendbuf[i], i < count. In place allowed. Uses recursive doubling
 * below MCCL_RING_THRESHOLD bytes and a pipelined ring (reduce-scatter + all-gather) above it;
 * over equal topology groups, a two-level ring where the flat ring's chunks fall below alpha x
 * beta (or MCCL_ALGO=twolevel). The rules are in csrc/algo/select.c. */
MCCL_API mcclResult_t mcclAllReduce(const void* sendbuf, void* recvbuf, size_t count,
                                    mcclDataType_t datatype, mcclRedOp_t op, mcclComm_t comm,
                                    const mcclOpOptions_t* options, mcclRequest_t* request);

/* Copy `count` elements from `root`'s buffer into every rank's buffer (in place: the buffer is
 * read on root and written elsewhere). Below the threshold a Bruck all-gather of root's buffer
 * (scattered first when that is faster), pipelined chain above. */
MCCL_API mcclResult_t mcclBroadcast(void* buffer, size_t count, mcclDataType_t datatype, int root,
                                    mcclComm_t comm, const mcclOpOptions_t* options,
                                    mcclRequest_t* request);

/* recvbuf[r * sendcount + i] = sendbuf of rank r [i]. recvbuf holds nranks * sendcount elements.
 * In place allowed when sendbuf == recvbuf + rank * sendcount. Pipelined ring. */
MCCL_API mcclResult_t mcclAllGather(const void* sendbuf, void* recvbuf, size_t sendcount,
                                    mcclDataType_t datatype, mcclComm_t comm,
                                    const mcclOpOptions_t* options, mcclRequest_t* request);

/* recvbuf[i] on `root` = op over ranks of sendbuf[i], i < count. recvbuf is only written on root
 * (it may be NULL elsewhere); sendbuf is never written. In place allowed on root. Binomial tree
 * below MCCL_RING_THRESHOLD bytes; above it a ring reduce-scatter, then every block to root. */
MCCL_API mcclResult_t mcclReduce(const void* sendbuf, void* recvbuf, size_t count,
                                 mcclDataType_t datatype, mcclRedOp_t op, int root, mcclComm_t comm,
                                 const mcclOpOptions_t* options, mcclRequest_t* request);

/* recvbuf[i] = op over ranks of sendbuf[rank * recvcount + i], i < recvcount: sendbuf holds
 * nranks * recvcount elements and is never written. In place allowed when
 * recvbuf == sendbuf + rank * recvcount. Pipelined ring (reduce-scatter half of the all-reduce
 * ring, with an engine-owned scratch of the input's size) above the threshold, recursive doubling
 * on a scratch copy below it. */
MCCL_API mcclResult_t mcclReduceScatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                        mcclDataType_t datatype, mcclRedOp_t op, mcclComm_t comm,
                                        const mcclOpOptions_t* options, mcclRequest_t* request);

/* On root, recvbuf[r * sendcount + i] = sendbuf of rank r [i]; recvbuf holds nranks * sendcount
 * elements and is only used on root. Every rank sends straight to root (root receives all at once). */
MCCL_API mcclResult_t mcclGather(const void* sendbuf, void* recvbuf, size_t sendcount,
                                 mcclDataType_t datatype, int root, mcclComm_t comm,
                                 const mcclOpOptions_t* options, mcclRequest_t* request);

/* recvbuf[i] = root's sendbuf[rank * recvcount + i]; sendbuf (nranks * recvcount elements) is
 * only read on root. Root sends every block at once. */
MCCL_API mcclResult_t mcclScatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                  mcclDataType_t datatype, int root, mcclComm_t comm,
                                  const mcclOpOptions_t* options, mcclRequest_t* request);

/* recvbuf[p * count + i] = sendbuf of rank p [rank * count + i]: block j of every rank's sendbuf
 * goes to rank j. Both buffers hold nranks * count elements; not in place. Pairwise exchange.
 * Every rank must call the same one of mcclAllToAll and mcclAllToAllv for a given all-to-all
 * (the v form sends one more control frame per peer); mixing them fails with mcclMismatch. */
MCCL_API mcclResult_t mcclAllToAll(const void* sendbuf, void* recvbuf, size_t count,
                                   mcclDataType_t datatype, mcclComm_t comm,
                                   const mcclOpOptions_t* options, mcclRequest_t* request);

/* Uneven all-to-all: sendcounts[j] elements starting at sendbuf + sdispls[j] go to rank j, and
 * recvcounts[p] elements from rank p land at recvbuf + rdispls[p] (arrays of nranks entries, in
 * elements, copied at issue). Rank p's sendcounts[rank] must equal this rank's recvcounts[p]
 * (checked: mcclMismatch). Regions must not overlap between buffers. */
MCCL_API mcclResult_t mcclAllToAllv(const void* sendbuf, const size_t* sendcounts,
                                    const size_t* sdispls, void* recvbuf, const size_t* recvcounts,
                                    const size_t* rdispls, mcclDataType_t datatype, mcclComm_t comm,
                                    const mcclOpOptions_t* options, mcclRequest_t* request);

/* ---------------------------------------------------------------------------------------------
 * Point-to-point. Sends and receives are matched per (sender, tag) in the order they were issued
 * (MPI's non-overtaking rule), outside the collective sequence: uneven point-to-point traffic never
 * shifts later collectives. They run on the engine alongside collectives, so a receive that waits
 * does not hold up collectives issued after it. A message that arrives before its receive is
 * posted is parked in memory until then. The receive's count and dtype must equal the send's
 * (mcclMismatch otherwise). A receive that no send matches within its timeout fails alone with
 * mcclTimeout; a send the peer stops reading fails the communicator.
 * Limitation: a message queued behind frames of a collective the receiver has not issued yet is
 * reached only once the receiver issues that collective.
 * ------------------------------------------------------------------------------------------- */
#define MCCL_ANY_SOURCE (-1)

MCCL_API mcclResult_t mcclSend(const void* buf, size_t count, mcclDataType_t datatype, int peer, int tag,
                               mcclComm_t comm, const mcclOpOptions_t* options, mcclRequest_t* request);

/* peer may be MCCL_ANY_SOURCE: the first message with this tag from any rank; mcclRequestSource
 * then tells which rank sent it. */
MCCL_API mcclResult_t mcclRecv(void* buf, size_t count, mcclDataType_t datatype, int peer, int tag,
                               mcclComm_t comm, const mcclOpOptions_t* options, mcclRequest_t* request);

/* The rank a finished receive came from (-1 before it finished, and for other requests). */
MCCL_API int mcclRequestSource(mcclRequest_t request);

/* Returns on every rank only after every rank has entered it (dissemination over recursive
 * doubling partners, one byte per step). */
MCCL_API mcclResult_t mcclBarrier(mcclComm_t comm, const mcclOpOptions_t* options,
                                  mcclRequest_t* request);

#ifdef __cplusplus
}
#endif
#endif /* MCCL_H_ */
