/*
 * test_args.c: every public function of include/mccl.h called with each kind of bad argument:
 * NULL pointers, out-of-range (or "negative", i.e. wrapped) counts, dtypes, ops, roots, peers,
 * tags, ports, world sizes and options. Each call must return mcclInvalidArgument before any byte
 * moves or any sequence number is taken, and mcclGetLastError (of the communicator, or of the
 * thread when there is none) must name the argument. Functions that return no result must not
 * crash on NULL.
 *
 * Known gaps: a check the library does not make yet can be listed with GAP(), which reports it
 * as "KNOWN GAP" without failing (MCCL_TEST_ARGS_STRICT=1 enforces it). None is listed now: the
 * wrapped counts, options and NULL requests of the first version of this test are all checked.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "core/debug.h"
#include "harness.h"

static int strict;    /* MCCL_TEST_ARGS_STRICT=1: known gaps fail the test */
static int gap_count; /* known gaps seen (not counted as failures unless strict) */
static int print_gaps = 1; /* rank 1 runs the same calls as rank 0: one list is enough */

/* Forget the last errors, so that each check reads the message of its own call. */
static void clearErrors(mcclComm_t comm) {
  mcclSetThreadError("%s", "");
  if (comm != NULL) {
    pthread_mutex_lock(&comm->errlock);
    comm->error_msg[0] = '\0';
    pthread_mutex_unlock(&comm->errlock);
  }
}

/* `call` must return mcclInvalidArgument and leave a last error (of `msg_comm`: NULL reads the
 * thread's) that contains `word`. */
#define EXPECT_INVALID(msg_comm, word, call)                                                        \
  do {                                                                                              \
    clearErrors(msg_comm);                                                                          \
    mcclResult_t r_ = (call);                                                                       \
    const char* m_ = mcclGetLastError(msg_comm);                                                    \
    EXPECT(r_ == mcclInvalidArgument, "%s -> %s, expected invalid argument (%s)", #call,             \
           mcclGetErrorString(r_), m_ ? m_ : "(null)");                                             \
    EXPECT(m_ != NULL && strstr(m_, word) != NULL, "%s: message '%s' does not name '%s'", #call,     \
           m_ ? m_ : "(null)", word);                                                               \
  } while (0)

/* A check the library does not pass yet (see the top of the file). `run_unless_strict`: whether
 * the call is safe to make while the check is missing. */
#define GAP(where, run_unless_strict, msg_comm, word, call)                                          \
  do {                                                                                              \
    if (strict) {                                                                                   \
      EXPECT_INVALID(msg_comm, word, call);                                                         \
    } else if (!(run_unless_strict)) {                                                              \
      gap_count++;                                                                                  \
      if (print_gaps) printf("KNOWN GAP (%s; not run, MCCL_TEST_ARGS_STRICT=1 runs it): %s should be invalid, naming '%s'\n", \
             where, #call, word);                                                                   \
    } else {                                                                                        \
      clearErrors(msg_comm);                                                                        \
      mcclResult_t r_ = (call);                                                                     \
      const char* m_ = mcclGetLastError(msg_comm);                                                  \
      if (r_ != mcclInvalidArgument || m_ == NULL || strstr(m_, word) == NULL) {                    \
        gap_count++;                                                                                \
        if (print_gaps) printf("KNOWN GAP (%s): %s -> %s, message '%s' (want invalid argument naming '%s')\n", where, \
               #call, mcclGetErrorString(r_), m_ ? m_ : "(null)", word);                            \
      }                                                                                             \
    }                                                                                               \
  } while (0)

/* ---- store callbacks that must never be reached by a call that fails validation ---------------- */

static int store_calls;

static mcclResult_t badSet(void* ctx, const char* key, const void* value, size_t len) {
  (void)ctx, (void)key, (void)value, (void)len;
  store_calls++;
  return mcclSystemError;
}
static mcclResult_t badGet(void* ctx, const char* key, void* buf, size_t cap, size_t* len, int64_t timeout_ms) {
  (void)ctx, (void)key, (void)buf, (void)cap, (void)len, (void)timeout_ms;
  store_calls++;
  return mcclSystemError;
}
static mcclResult_t badAdd(void* ctx, const char* key, int64_t delta, int64_t* result) {
  (void)ctx, (void)key, (void)delta, (void)result;
  store_calls++;
  return mcclSystemError;
}

/* ---- functions that need no communicator ------------------------------------------------------- */

static void testWithoutComm(void) {
  /* Configuration and init. */
  clearErrors(NULL);
  mcclCommConfigInit(NULL); /* void: must not crash */
  EXPECT(strstr(mcclGetLastError(NULL), "config") != NULL, "mcclCommConfigInit(NULL): '%s'", mcclGetLastError(NULL));
  mcclCommConfig_t cfg;
  mcclCommConfigInit(&cfg);
  cfg.rank = 0;
  cfg.nranks = 2;
  cfg.store = (mcclStore_t){NULL, badSet, badGet, NULL, badAdd};
  mcclComm_t comm = (mcclComm_t)(uintptr_t)1; /* must be overwritten with NULL on failure */
  EXPECT_INVALID(NULL, "comm", mcclCommInitConfig(NULL, &cfg));
  EXPECT_INVALID(NULL, "config", mcclCommInitConfig(&comm, NULL));
  EXPECT(comm == (mcclComm_t)(uintptr_t)1, "comm written although config was NULL");
  mcclCommConfig_t bad = cfg;
  bad.size = sizeof(cfg) - 1;
  EXPECT_INVALID(NULL, "config.size", mcclCommInitConfig(&comm, &bad));
  EXPECT(comm == NULL, "*comm not NULL after a failed init");
  const int nranks_bad[] = {0, -1, INT_MIN, 65536, INT_MAX};
  for (size_t i = 0; i < sizeof(nranks_bad) / sizeof(nranks_bad[0]); i++) {
    bad = cfg;
    bad.nranks = nranks_bad[i];
    EXPECT_INVALID(NULL, "nranks", mcclCommInitConfig(&comm, &bad));
  }
  const int rank_bad[] = {-1, 2, INT_MIN, INT_MAX};
  for (size_t i = 0; i < sizeof(rank_bad) / sizeof(rank_bad[0]); i++) {
    bad = cfg;
    bad.rank = rank_bad[i];
    EXPECT_INVALID(NULL, "config.rank", mcclCommInitConfig(&comm, &bad));
  }
  bad = cfg;
  bad.store.set = NULL;
  EXPECT_INVALID(NULL, "set is NULL", mcclCommInitConfig(&comm, &bad));
  bad = cfg;
  bad.store.get = NULL;
  EXPECT_INVALID(NULL, "get is NULL", mcclCommInitConfig(&comm, &bad));
  bad = cfg;
  bad.store.add = NULL;
  EXPECT_INVALID(NULL, "add is NULL", mcclCommInitConfig(&comm, &bad));
  bad = cfg;
  bad.name = "";
  EXPECT_INVALID(NULL, "config.name", mcclCommInitConfig(&comm, &bad));
  char long_name[300];
  memset(long_name, 'g', sizeof(long_name) - 1);
  long_name[sizeof(long_name) - 1] = '\0';
  bad.name = long_name;
  EXPECT_INVALID(NULL, "config.name", mcclCommInitConfig(&comm, &bad));
  EXPECT(store_calls == 0, "a rejected init used the store %d times", store_calls);

  /* Communicator calls on NULL. */
  int i = 0;
  mcclResult_t err = mcclSuccess;
  EXPECT_INVALID(NULL, "comm", mcclCommDestroy(NULL));
  EXPECT_INVALID(NULL, "comm", mcclCommAbort(NULL));
  EXPECT_INVALID(NULL, "comm", mcclCommRank(NULL, &i));
  EXPECT_INVALID(NULL, "comm", mcclCommCount(NULL, &i));
  EXPECT_INVALID(NULL, "comm", mcclCommGetAsyncError(NULL, &err));
  EXPECT(mcclGetLastError(NULL) != NULL, "mcclGetLastError(NULL) is NULL");

  /* Names and sizes of values outside the enums. */
  for (int r = 0; r < mcclNumResults; r++)
    EXPECT(strcmp(mcclGetErrorString((mcclResult_t)r), "unknown result code") != 0, "result %d has no name", r);
  EXPECT(strcmp(mcclGetErrorString((mcclResult_t)-1), "unknown result code") == 0, "result -1");
  EXPECT(strcmp(mcclGetErrorString(mcclNumResults), "unknown result code") == 0, "result mcclNumResults");
  EXPECT(mcclDataTypeSize((mcclDataType_t)-1) == 0 && mcclDataTypeSize(mcclNumTypes) == 0 &&
             mcclDataTypeSize((mcclDataType_t)1000) == 0,
         "a dtype outside the enum has a size");
  for (int t = 0; t < mcclNumTypes; t++) EXPECT(mcclDataTypeSize((mcclDataType_t)t) > 0, "dtype %d has size 0", t);

  /* Requests. */
  int done = 0;
  EXPECT_INVALID(NULL, "request", mcclWait(NULL, 0));
  EXPECT_INVALID(NULL, "request", mcclTest(NULL, &done));
  EXPECT(mcclWait(NULL, 0) == mcclInvalidArgument && mcclTest(NULL, &done) == mcclInvalidArgument,
         "mcclWait/mcclTest(NULL) not invalid");
  EXPECT(mcclRequestSeq(NULL) == UINT64_MAX && mcclRequestSource(NULL) == -1, "seq/source of NULL");
  EXPECT(mcclRequestError(NULL) != NULL && mcclRequestError(NULL)[0] == '\0', "mcclRequestError(NULL)");
  mcclRequestFree(NULL); /* void: must not crash */

  /* Every collective and point-to-point call with a NULL communicator. */
  float f[4] = {0};
  size_t v[4] = {0};
  EXPECT_INVALID(NULL, "communicator", mcclAllReduce(f, f, 4, mcclFloat32, mcclSum, NULL, NULL, NULL));
  EXPECT_INVALID(NULL, "communicator", mcclBroadcast(f, 4, mcclFloat32, 0, NULL, NULL, NULL));
  EXPECT_INVALID(NULL, "communicator", mcclAllGather(f, f, 1, mcclFloat32, NULL, NULL, NULL));
  EXPECT_INVALID(NULL, "communicator", mcclReduce(f, f, 4, mcclFloat32, mcclSum, 0, NULL, NULL, NULL));
  EXPECT_INVALID(NULL, "communicator", mcclReduceScatter(f, f, 1, mcclFloat32, mcclSum, NULL, NULL, NULL));
  EXPECT_INVALID(NULL, "communicator", mcclGather(f, f, 1, mcclFloat32, 0, NULL, NULL, NULL));
  EXPECT_INVALID(NULL, "communicator", mcclScatter(f, f, 1, mcclFloat32, 0, NULL, NULL, NULL));
  EXPECT_INVALID(NULL, "communicator", mcclAllToAll(f, f + 2, 1, mcclFloat32, NULL, NULL, NULL));
  EXPECT_INVALID(NULL, "communicator", mcclAllToAllv(f, v, v, f, v, v, mcclFloat32, NULL, NULL, NULL));
  EXPECT_INVALID(NULL, "communicator", mcclSend(f, 4, mcclFloat32, 1, 0, NULL, NULL, NULL));
  EXPECT_INVALID(NULL, "communicator", mcclRecv(f, 4, mcclFloat32, 1, 0, NULL, NULL, NULL));
  EXPECT_INVALID(NULL, "communicator", mcclBarrier(NULL, NULL, NULL));

  /* The built-in store. */
  int port = 0;
  mcclTcpStoreServer_t* server = NULL;
  EXPECT_INVALID(NULL, "port_out", mcclTcpStoreListen("127.0.0.1", 0, NULL, &server));
  EXPECT_INVALID(NULL, "server", mcclTcpStoreListen("127.0.0.1", 0, &port, NULL));
  EXPECT_INVALID(NULL, "port -1", mcclTcpStoreListen("127.0.0.1", -1, &port, &server));
  EXPECT_INVALID(NULL, "port 65536", mcclTcpStoreListen("127.0.0.1", 65536, &port, &server));
  EXPECT_INVALID(NULL, "host 'localhost'", mcclTcpStoreListen("localhost", 0, &port, &server));
  EXPECT(server == NULL, "a failed listen returned a server");
  EXPECT_INVALID(NULL, "server", mcclTcpStoreServe(NULL, 0));
  EXPECT_OK(NULL, mcclTcpStoreListen("127.0.0.1", 0, &port, &server));
  if (server != NULL) {
    EXPECT_INVALID(NULL, "expected_clients", mcclTcpStoreServe(server, -1));
    mcclTcpStoreFree(server);
  }
  mcclTcpStoreStop(NULL); /* void: must not crash */
  mcclTcpStoreFree(NULL);
  mcclStore_t store;
  memset(&store, 0, sizeof(store));
  EXPECT_INVALID(NULL, "host", mcclTcpStoreConnect(NULL, 1234, 0, &store));
  EXPECT_INVALID(NULL, "store", mcclTcpStoreConnect("127.0.0.1", 1234, 0, NULL));
  EXPECT_INVALID(NULL, "port 0", mcclTcpStoreConnect("127.0.0.1", 0, 0, &store));
  EXPECT_INVALID(NULL, "port 70000", mcclTcpStoreConnect("127.0.0.1", 70000, 0, &store));
  EXPECT_INVALID(NULL, "timeout_ms", mcclTcpStoreConnect("127.0.0.1", 1234, -1, &store));
  EXPECT_INVALID(NULL, "host 'no.such.host'", mcclTcpStoreConnect("no.such.host", 1234, 0, &store));
  mcclTcpStoreClose(NULL); /* void: must not crash */
  mcclTcpStoreClose(&store);
}

/* ---- functions of a live communicator (2 ranks) ------------------------------------------------ */

static int rankMain(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  print_gaps = r == 0;
  float f[8] = {1, 1, 1, 1, 1, 1, 1, 1}, g[8] = {0};
  int64_t big[4] = {0};
  size_t counts[2] = {1, 1}, displs[2] = {0, 1};
  const mcclDataType_t dtypes[] = {(mcclDataType_t)-1, mcclNumTypes, (mcclDataType_t)42};
  const mcclRedOp_t ops[] = {(mcclRedOp_t)-1, mcclNumOps, (mcclRedOp_t)77};
  const int roots[] = {-1, n, INT_MIN, INT_MAX};

  for (size_t k = 0; k < sizeof(dtypes) / sizeof(dtypes[0]); k++) {
    mcclDataType_t dt = dtypes[k];
    EXPECT_INVALID(comm, "datatype", mcclAllReduce(f, g, 2, dt, mcclSum, comm, NULL, NULL));
    EXPECT_INVALID(comm, "datatype", mcclBroadcast(f, 2, dt, 0, comm, NULL, NULL));
    EXPECT_INVALID(comm, "datatype", mcclAllGather(f, g, 1, dt, comm, NULL, NULL));
    EXPECT_INVALID(comm, "datatype", mcclReduce(f, g, 2, dt, mcclSum, 0, comm, NULL, NULL));
    EXPECT_INVALID(comm, "datatype", mcclReduceScatter(f, g, 1, dt, mcclSum, comm, NULL, NULL));
    EXPECT_INVALID(comm, "datatype", mcclGather(f, g, 1, dt, 0, comm, NULL, NULL));
    EXPECT_INVALID(comm, "datatype", mcclScatter(f, g, 1, dt, 0, comm, NULL, NULL));
    EXPECT_INVALID(comm, "datatype", mcclAllToAll(f, g, 1, dt, comm, NULL, NULL));
    EXPECT_INVALID(comm, "datatype", mcclAllToAllv(f, counts, displs, g, counts, displs, dt, comm, NULL, NULL));
    EXPECT_INVALID(comm, "datatype", mcclSend(f, 2, dt, 1 - r, 0, comm, NULL, NULL));
    EXPECT_INVALID(comm, "datatype", mcclRecv(f, 2, dt, 1 - r, 0, comm, NULL, NULL));
  }
  for (size_t k = 0; k < sizeof(ops) / sizeof(ops[0]); k++) {
    EXPECT_INVALID(comm, "op", mcclAllReduce(f, g, 2, mcclFloat32, ops[k], comm, NULL, NULL));
    EXPECT_INVALID(comm, "op", mcclReduce(f, g, 2, mcclFloat32, ops[k], 0, comm, NULL, NULL));
    EXPECT_INVALID(comm, "op", mcclReduceScatter(f, g, 1, mcclFloat32, ops[k], comm, NULL, NULL));
  }
  for (size_t k = 0; k < sizeof(roots) / sizeof(roots[0]); k++) {
    int root = roots[k];
    EXPECT_INVALID(comm, "root", mcclBroadcast(f, 2, mcclFloat32, root, comm, NULL, NULL));
    EXPECT_INVALID(comm, "root", mcclReduce(f, g, 2, mcclFloat32, mcclSum, root, comm, NULL, NULL));
    EXPECT_INVALID(comm, "root", mcclGather(f, g, 1, mcclFloat32, root, comm, NULL, NULL));
    EXPECT_INVALID(comm, "root", mcclScatter(f, g, 1, mcclFloat32, root, comm, NULL, NULL));
  }
  /* NULL buffers with elements to move. */
  EXPECT_INVALID(comm, "buffer", mcclAllReduce(NULL, g, 2, mcclFloat32, mcclSum, comm, NULL, NULL));
  EXPECT_INVALID(comm, "buffer", mcclAllReduce(f, NULL, 2, mcclFloat32, mcclSum, comm, NULL, NULL));
  EXPECT_INVALID(comm, "buffer", mcclBroadcast(NULL, 2, mcclFloat32, 0, comm, NULL, NULL));
  EXPECT_INVALID(comm, "buffer", mcclAllGather(NULL, g, 1, mcclFloat32, comm, NULL, NULL));
  EXPECT_INVALID(comm, "buffer", mcclAllGather(f, NULL, 1, mcclFloat32, comm, NULL, NULL));
  EXPECT_INVALID(comm, "buffer", mcclReduce(NULL, g, 2, mcclFloat32, mcclSum, 0, comm, NULL, NULL));
  EXPECT_INVALID(comm, "recvbuf", mcclReduce(f, NULL, 2, mcclFloat32, mcclSum, r, comm, NULL, NULL));
  EXPECT_INVALID(comm, "buffer", mcclReduceScatter(NULL, g, 1, mcclFloat32, mcclSum, comm, NULL, NULL));
  EXPECT_INVALID(comm, "buffer", mcclReduceScatter(f, NULL, 1, mcclFloat32, mcclSum, comm, NULL, NULL));
  EXPECT_INVALID(comm, "buffer", mcclGather(NULL, g, 1, mcclFloat32, 0, comm, NULL, NULL));
  EXPECT_INVALID(comm, "recvbuf", mcclGather(f, NULL, 1, mcclFloat32, r, comm, NULL, NULL));
  EXPECT_INVALID(comm, "buffer", mcclScatter(f, NULL, 1, mcclFloat32, 0, comm, NULL, NULL));
  EXPECT_INVALID(comm, "sendbuf", mcclScatter(NULL, g, 1, mcclFloat32, r, comm, NULL, NULL));
  EXPECT_INVALID(comm, "buffer", mcclAllToAll(NULL, g, 1, mcclFloat32, comm, NULL, NULL));
  EXPECT_INVALID(comm, "buffer", mcclAllToAll(f, NULL, 1, mcclFloat32, comm, NULL, NULL));
  EXPECT_INVALID(comm, "differ", mcclAllToAll(f, f, 1, mcclFloat32, comm, NULL, NULL));
  EXPECT_INVALID(comm, "arrays", mcclAllToAllv(f, NULL, displs, g, counts, displs, mcclFloat32, comm, NULL, NULL));
  EXPECT_INVALID(comm, "arrays", mcclAllToAllv(f, counts, NULL, g, counts, displs, mcclFloat32, comm, NULL, NULL));
  EXPECT_INVALID(comm, "arrays", mcclAllToAllv(f, counts, displs, g, NULL, displs, mcclFloat32, comm, NULL, NULL));
  EXPECT_INVALID(comm, "arrays", mcclAllToAllv(f, counts, displs, g, counts, NULL, mcclFloat32, comm, NULL, NULL));
  EXPECT_INVALID(comm, "buffer", mcclAllToAllv(NULL, counts, displs, g, counts, displs, mcclFloat32, comm, NULL, NULL));
  EXPECT_INVALID(comm, "buffer", mcclAllToAllv(f, counts, displs, NULL, counts, displs, mcclFloat32, comm, NULL, NULL));
  EXPECT_INVALID(comm, "buffer", mcclSend(NULL, 2, mcclFloat32, 1 - r, 0, comm, NULL, NULL));
  EXPECT_INVALID(comm, "buffer", mcclRecv(NULL, 2, mcclFloat32, 1 - r, 0, comm, NULL, NULL));
  /* Peers and tags. */
  const int peers[] = {r, -2, n, INT_MIN, INT_MAX};
  for (size_t k = 0; k < sizeof(peers) / sizeof(peers[0]); k++) {
    EXPECT_INVALID(comm, "peer", mcclSend(f, 2, mcclFloat32, peers[k], 0, comm, NULL, NULL));
    EXPECT_INVALID(comm, "peer", mcclRecv(f, 2, mcclFloat32, peers[k], 0, comm, NULL, NULL));
  }
  EXPECT_INVALID(comm, "peer", mcclSend(f, 2, mcclFloat32, MCCL_ANY_SOURCE, 0, comm, NULL, NULL));
  EXPECT_INVALID(comm, "tag", mcclSend(f, 2, mcclFloat32, 1 - r, -1, comm, NULL, NULL));
  EXPECT_INVALID(comm, "tag", mcclRecv(f, 2, mcclFloat32, MCCL_ANY_SOURCE, INT_MIN, comm, NULL, NULL));
  /* Outputs of the communicator queries. */
  EXPECT_INVALID(NULL, "rank", mcclCommRank(comm, NULL));
  EXPECT_INVALID(NULL, "nranks", mcclCommCount(comm, NULL));
  EXPECT_INVALID(NULL, "error", mcclCommGetAsyncError(comm, NULL));

  /* Counts whose byte size wraps around size_t ("negative" counts from a signed caller), or
   * whose all-gather/reduce-scatter/all-to-all total does: collectives.c does not check them, so
   * they would be submitted and read and write far past the buffers. */
  const size_t wrapped[] = {(size_t)-1, SIZE_MAX / 2 + 1};
  for (size_t k = 0; k < 2; k++) {
    size_t c = wrapped[k];
    EXPECT_INVALID(comm, "count", mcclAllReduce(f, g, c, mcclFloat32, mcclSum, comm, NULL, NULL));
    EXPECT_INVALID(comm, "count", mcclBroadcast(f, c, mcclFloat32, 0, comm, NULL, NULL));
    EXPECT_INVALID(comm, "count", mcclAllGather(f, g, c, mcclFloat32, comm, NULL, NULL));
    EXPECT_INVALID(comm, "count", mcclReduce(f, g, c, mcclFloat32, mcclSum, 0, comm, NULL, NULL));
    EXPECT_INVALID(comm, "count", mcclReduceScatter(f, g, c, mcclFloat32, mcclSum, comm, NULL, NULL));
    EXPECT_INVALID(comm, "count", mcclGather(f, g, c, mcclFloat32, 0, comm, NULL, NULL));
    EXPECT_INVALID(comm, "count", mcclScatter(f, g, c, mcclFloat32, 0, comm, NULL, NULL));
    EXPECT_INVALID(comm, "count", mcclAllToAll(f, g, c, mcclFloat32, comm, NULL, NULL));
    EXPECT_INVALID(comm, "count", mcclSend(f, c, mcclFloat32, 1 - r, 0, comm, NULL, NULL));
    EXPECT_INVALID(comm, "count", mcclRecv(f, c, mcclFloat32, 1 - r, 0, comm, NULL, NULL));
  }
  /* An all-gather whose per-rank count is fine but whose n x count total wraps. */
  EXPECT_INVALID(comm, "count", mcclAllGather(big, big, SIZE_MAX / 8 / 2 + 1, mcclInt64, comm, NULL, NULL));
  size_t wrap_counts[2] = {SIZE_MAX, 2};
  EXPECT_INVALID(comm, "sendcounts",
      mcclAllToAllv(f, wrap_counts, displs, g, wrap_counts, displs, mcclFloat32, comm, NULL, NULL));
  /* Per-call options: an algorithm outside the enum, and a timeout whose deadline in nanoseconds
   * overflows int64 (undefined behaviour in engine.c: start + timeout_ms * 1000000). */
  mcclOpOptions_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.algorithm = (mcclAlgorithm_t)7;
  EXPECT_INVALID(comm, "algorithm", mcclAllReduce(f, g, 2, mcclFloat32, mcclSum, comm, &opts, NULL));
  memset(&opts, 0, sizeof(opts));
  opts.hold = 2;
  EXPECT_INVALID(comm, "hold", mcclAllReduce(f, g, 2, mcclFloat32, mcclSum, comm, &opts, NULL));
  EXPECT_INVALID(NULL, "request", mcclRequestSeal(NULL));

  /* None of the calls above took a sequence number or sent a byte: the first valid collective is
   * #0 and gives the exact result, and so is the first valid send/recv. */
  mcclRequest_t req = NULL;
  EXPECT_OK(comm, mcclAllReduce(f, g, 8, mcclFloat32, mcclSum, comm, NULL, &req));
  if (req != NULL) {
    EXPECT(mcclWait(req, 30000) == mcclSuccess, "all-reduce: %s", mcclRequestError(req));
    EXPECT(mcclRequestSeq(req) == 0, "invalid calls took sequence numbers: #%llu", (unsigned long long)mcclRequestSeq(req));
    clearErrors(comm);
    int* no_done = NULL;
    EXPECT(mcclTest(req, no_done) == mcclInvalidArgument, "mcclTest(req, NULL) not invalid");
    EXPECT_INVALID(NULL, "done", mcclTest(req, no_done));
    mcclRequestFree(req);
  }
  for (int k = 0; k < 8; k++) EXPECT(g[k] == (float)n, "g[%d] = %g", k, g[k]);
  {
    /* A side that moves nothing may pass NULL: rank 0 sends nothing, rank 1 receives nothing. */
    size_t none[2] = {0, 0}, four[2] = {0, 0}, at[2] = {0, 0};
    four[1 - r] = 4;
    float got[4] = {0, 0, 0, 0}, sent[4] = {1, 2, 3, 4};
    EXPECT_OK(comm, r == 0 ? mcclAllToAllv(NULL, none, at, got, four, at, mcclFloat32, comm, NULL, NULL)
                           : mcclAllToAllv(sent, four, at, NULL, none, at, mcclFloat32, comm, NULL, NULL));
    if (r == 0) EXPECT(got[0] == 1 && got[3] == 4, "rank 0 received %g..%g", (double)got[0], (double)got[3]);
  }
  /* A huge per-call timeout means "no deadline": it is clamped (never overflows) and works. */
  memset(&opts, 0, sizeof(opts));
  opts.timeout_ms = INT64_MAX;
  EXPECT_OK(comm, mcclAllReduce(f, g, 8, mcclFloat32, mcclSum, comm, &opts, NULL));
  for (int k = 0; k < 8; k++) EXPECT(g[k] == (float)n, "g[%d] = %g after the INT64_MAX-timeout all-reduce", k, g[k]);
  float msg = (float)(10 + r), got = 0;
  req = NULL;
  if (r == 0) EXPECT_OK(comm, mcclSend(&msg, 1, mcclFloat32, 1, 3, comm, NULL, &req));
  else EXPECT_OK(comm, mcclRecv(&got, 1, mcclFloat32, 0, 3, comm, NULL, &req));
  if (req != NULL) {
    EXPECT(mcclWait(req, 30000) == mcclSuccess, "send/recv: %s", mcclRequestError(req));
    EXPECT(mcclRequestSeq(req) == 0, "invalid send/recv calls took numbers: #%llu", (unsigned long long)mcclRequestSeq(req));
    mcclRequestFree(req);
  }
  if (r == 1) EXPECT(got == 10.0f, "received %g", got);
  /* A send/recv whose timeout means "forever": its deadline must not overflow (UBSan builds
   * fail on the overflow itself; p2p.c clamps it through mcclDeadlineNs). */
  mcclOpOptions_t forever;
  memset(&forever, 0, sizeof(forever));
  forever.timeout_ms = INT64_MAX;
  got = 0;
  if (r == 0) EXPECT_OK(comm, mcclSend(&msg, 1, mcclFloat32, 1, 4, comm, &forever, NULL));
  else EXPECT_OK(comm, mcclRecv(&got, 1, mcclFloat32, 0, 4, comm, &forever, NULL));
  if (r == 1) EXPECT(got == 10.0f, "received %g with a timeout of INT64_MAX ms", got);
  mcclResult_t async = mcclInternalError;
  EXPECT_OK(comm, mcclCommGetAsyncError(comm, &async));
  EXPECT(async == mcclSuccess, "argument errors failed the communicator: %s", mcclGetErrorString(async));
  EXPECT_OK(comm, mcclCommDestroy(comm));
  return 0;
}

int main(void) {
  const char* s = getenv("MCCL_TEST_ARGS_STRICT");
  strict = s != NULL && atoi(s) != 0;
  testWithoutComm();
  harnessRunRanks(2, 120, rankMain, NULL);
  /* Rank 0 printed the gaps of the communicator calls (in its own process). */
  if (gap_count > 0 && !strict) printf("test_args: %d known gaps without a communicator, more with one (KNOWN GAP lines)\n", gap_count);
  return harnessExit("test_args");
}
