/*
 * test_failures.c: what happens when things go wrong. Every rank must get a clear error in time
 * (never a hang, never wrong data): a peer that exits, ranks that issue different collectives, a
 * stalled peer, bad arguments, and abort.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/param.h"
#include "harness.h"

/* Rank n-1 exits right after a barrier; the others must fail within 5 s naming a peer. */
static int peerExits(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  EXPECT_OK(comm, mcclBarrier(comm, NULL, NULL));
  if (r == n - 1) _exit(0);
  size_t count = 1 << 20;
  float* buf = calloc(count, sizeof(float));
  double start = harnessSeconds();
  mcclResult_t res = mcclSuccess;
  for (int i = 0; i < 100 && res == mcclSuccess; i++)
    res = mcclAllReduce(buf, buf, count, mcclFloat32, mcclSum, comm, NULL, NULL);
  double took = harnessSeconds() - start;
  const char* msg = mcclGetLastError(comm);
  EXPECT(res == mcclRemoteError, "rank %d: expected a remote error, got %s", r, mcclGetErrorString(res));
  EXPECT(took < 5.0, "rank %d noticed after %.1f s", r, took);
  EXPECT(strstr(msg, "rank") != NULL && strstr(msg, "allreduce") != NULL, "rank %d: message '%s'", r, msg);
  /* Every later request fails at once with the same cause. */
  EXPECT(mcclAllReduce(buf, buf, 4, mcclFloat32, mcclSum, comm, NULL, NULL) != mcclSuccess,
         "rank %d: a request after the failure succeeded", r);
  mcclCommDestroy(comm);
  free(buf);
  return 0;
}

/* With connections opened on first use (MCCL_RUNTIME_CONNECT=1), rank n-1 exits before any rank
 * linked to it: the rank whose send is for it asks it to dial (tcp.h), is refused three times and
 * fails naming it; the others hear of that. Within 5 s of a 20 s timeout on every rank (before the
 * ask, a lower rank waited for the dial until its timeout). */
static int peerGoneUnlinked(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  if (r == n - 1) _exit(0);
  EXPECT(mcclParamInt("MCCL_RUNTIME_CONNECT") == 1, "rank %d: runtime connection is off", r);
  harnessSleepUs(200000); /* its process is gone, its listener with it */
  size_t count = 1 << 18;
  float* buf = calloc(count, sizeof(float));
  mcclOpOptions_t o;
  memset(&o, 0, sizeof(o));
  o.timeout_ms = 20000;
  double start = harnessSeconds();
  mcclResult_t res = mcclAllReduce(buf, buf, count, mcclFloat32, mcclSum, comm, &o, NULL);
  double took = harnessSeconds() - start;
  const char* msg = mcclGetLastError(comm);
  char gone[32];
  snprintf(gone, sizeof(gone), "rank %d", n - 1);
  EXPECT(res != mcclSuccess, "rank %d: an all-reduce without rank %d succeeded", r, n - 1);
  EXPECT(took < 5.0, "rank %d noticed after %.1f s: '%s'", r, took, msg);
  /* Refused; or, where its process took long to go (a sanitizer's teardown), it answered an ask
   * while alive and closed the link when it went: either way named at once. */
  EXPECT(strstr(msg, gone) != NULL && (strstr(msg, "refused") != NULL || strstr(msg, "closed the connection") != NULL),
         "rank %d: message '%s'", r, msg);
  mcclCommDestroy(comm);
  free(buf);
  return 0;
}

/* The root of a chain broadcast (mcclAlgoRing) exits mid-stream: ranks 1 and 2 may hold a frame
 * they forward as it lands, half-written (MCCL_CHAIN_RELAY, transport/tcp.h), when their upstream
 * dies. Every survivor must fail within 5 s, naming a rank (rank 1: the root) and the broadcast,
 * never hang on the half-written frame. */
static void* exitSoon(void* arg) {
  harnessSleepUs((unsigned)(size_t)arg);
  _exit(0);
  return NULL;
}

static int chainRootExits(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  EXPECT_OK(comm, mcclBarrier(comm, NULL, NULL));
  size_t count = (size_t)16 << 20; /* 64 MiB of floats: hundreds of frames per broadcast */
  float* buf = calloc(count, sizeof(float));
  pthread_t th;
  if (r == 0 && pthread_create(&th, NULL, exitSoon, (void*)(size_t)40000) != 0) _exit(1);
  mcclOpOptions_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.algorithm = mcclAlgoRing;
  double start = harnessSeconds();
  mcclResult_t res = mcclSuccess;
  for (int i = 0; i < 1000 && res == mcclSuccess; i++)
    res = mcclBroadcast(buf, count, mcclFloat32, 0, comm, &opts, NULL);
  double took = harnessSeconds() - start;
  const char* msg = mcclGetLastError(comm);
  EXPECT(res == mcclRemoteError, "rank %d: expected a remote error, got %s (%s)", r, mcclGetErrorString(res), msg);
  EXPECT(took < 5.0, "rank %d noticed after %.1f s", r, took);
  EXPECT(strstr(msg, "rank") != NULL && strstr(msg, "broadcast") != NULL, "rank %d: message '%s'", r, msg);
  /* The root's neighbour names the root; further down, a rank whose upstream was mid-relay hears
   * only a close (no ABORT frame may follow half a frame) and names that upstream rank. */
  if (r == 1) EXPECT(strstr(msg, "rank 0 (") != NULL, "rank 1 does not name the root: '%s'", msg);
  mcclCommDestroy(comm);
  free(buf);
  return 0;
}

/* Rank 1 issues a collective of 0 elements where the others issue 1000: every rank must fail
 * with the mismatch within 5 s (a 20 s timeout), not return at once on rank 1 while the others
 * time out. Per collective kind (arg: 0 all-reduce, 1 broadcast, 2 all-gather). */
static int zeroCount(int r, int n, mcclStore_t* store, void* arg) {
  const int kind = (int)(size_t)arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  int32_t in[1000], out[1000 * 8];
  for (int i = 0; i < 1000; i++) in[i] = 7;
  mcclOpOptions_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.timeout_ms = 20000;
  size_t count = r == 1 ? 0 : 1000;
  double start = harnessSeconds();
  mcclResult_t res = kind == 0 ? mcclAllReduce(in, out, count, mcclInt32, mcclSum, comm, &opts, NULL)
                     : kind == 1 ? mcclBroadcast(out, count, mcclInt32, 0, comm, &opts, NULL)
                                 : mcclAllGather(in, out, count, mcclInt32, comm, &opts, NULL);
  double took = harnessSeconds() - start;
  const char* msg = mcclGetLastError(comm);
  EXPECT(res == mcclMismatch || res == mcclRemoteError, "kind %d rank %d (count %zu): got %s (%s)", kind, r, count,
         mcclGetErrorString(res), msg);
  EXPECT(strstr(msg, "mismatch") != NULL, "kind %d rank %d: message '%s' does not say mismatch", kind, r, msg);
  EXPECT(took < 5.0, "kind %d rank %d failed after %.1f s", kind, r, took);
  mcclCommDestroy(comm);
  return 0;
}

/* Every rank issues collectives of 0 elements: each succeeds (and checks that all ranks issued it). */
static int zeroCountEverywhere(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  int32_t buf[4] = {1, 2, 3, 4};
  EXPECT_OK(comm, mcclAllReduce(buf, buf, 0, mcclInt32, mcclSum, comm, NULL, NULL));
  EXPECT_OK(comm, mcclBroadcast(buf, 0, mcclInt32, n - 1, comm, NULL, NULL));
  EXPECT_OK(comm, mcclAllGather(buf, buf, 0, mcclInt32, comm, NULL, NULL));
  EXPECT_OK(comm, mcclReduce(buf, buf, 0, mcclInt32, mcclSum, 0, comm, NULL, NULL));
  EXPECT(buf[0] == 1 && buf[3] == 4, "rank %d: a collective of 0 elements wrote the buffer", r);
  EXPECT_OK(comm, mcclAllReduce(buf, buf, 4, mcclInt32, mcclSum, comm, NULL, NULL));
  EXPECT(buf[0] == n && buf[3] == 4 * n, "rank %d: sum %d %d after the empty ones", r, buf[0], buf[3]);
  mcclCommDestroy(comm);
  return 0;
}

/* Rank 0 reduces 100 elements, rank 1 200: both must report a mismatch, outputs untouched on the
 * rank that detects it. */
static int mismatch(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  size_t count = r == 0 ? 100 : 200;
  int32_t buf[200];
  for (int i = 0; i < 200; i++) buf[i] = 7;
  mcclResult_t res = mcclAllReduce(buf, buf, count, mcclInt32, mcclSum, comm, NULL, NULL);
  const char* msg = mcclGetLastError(comm);
  EXPECT(res == mcclMismatch || res == mcclRemoteError, "rank %d: got %s", r, mcclGetErrorString(res));
  EXPECT(strstr(msg, "mismatch") != NULL, "rank %d: message '%s' does not say mismatch", r, msg);
  mcclCommDestroy(comm);
  return 0;
}

/* Rank 1 stalls for 2 s; rank 0's 300 ms deadline must name rank 1. Rank 1's late all-reduce
 * fails too, naming rank 0: rank 0's frame was already in its socket, so its data is whole, but so
 * is rank 0's notice that it failed this collective (mcclTransportSettle). */
static int stalled(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  float buf[16] = {0};
  if (r == 1) harnessSleepUs(2000000);
  mcclOpOptions_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.timeout_ms = 300;
  double start = harnessSeconds();
  mcclResult_t res = mcclAllReduce(buf, buf, 16, mcclFloat32, mcclSum, comm, &opts, NULL);
  double took = harnessSeconds() - start;
  const char* msg = mcclGetLastError(comm);
  if (r == 0) {
    EXPECT(res == mcclTimeout, "rank 0: got %s", mcclGetErrorString(res));
    EXPECT(took > 0.25 && took < 1.5, "rank 0 timed out after %.2f s", took);
    EXPECT(strstr(msg, "rank 1") != NULL && strstr(msg, "timed out") != NULL, "rank 0: '%s'", msg);
  } else {
    EXPECT(res != mcclSuccess, "rank 1: its late all-reduce succeeded after its peer failed it");
    EXPECT(strstr(mcclGetLastError(comm), "rank 0") != NULL, "rank 1: '%s'", mcclGetLastError(comm));
  }
  mcclCommDestroy(comm);
  return 0;
}

/* Consistent failure (issue 16): one rank enters an all-reduce after the others' timeout. The
 * on-time ranks fail it; the late one must fail the same call, not return a right sum and fail
 * only its next call. The on-time ranks keep their connections open (they wait on a store key)
 * until the late rank is done, so that its data, and their notices, are all in its sockets:
 * exactly the case where the late rank could complete the collective. */
typedef struct {
  size_t count; /* small: recursive doubling; >= 64K floats: the ring */
  int late;     /* the late rank */
} lateArg;

static int lateRank(int r, int n, mcclStore_t* store, void* arg) {
  const lateArg* a = arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  float* buf = malloc(a->count * sizeof(float));
  for (size_t i = 0; i < a->count; i++) buf[i] = (float)(r + 1);
  /* One on time, so the failing collective is #1 and notices say "completed 1". */
  EXPECT_OK(comm, mcclAllReduce(buf, buf, a->count, mcclFloat32, mcclSum, comm, NULL, NULL));
  EXPECT(buf[0] == (float)(n * (n + 1) / 2), "rank %d: warm-up sum %g", r, buf[0]);
  for (size_t i = 0; i < a->count; i++) buf[i] = (float)(r + 1);
  mcclOpOptions_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.timeout_ms = 500;
  if (r == a->late) harnessSleepUs(2500000); /* the others time out at 0.5 s and tell it */
  mcclResult_t res = mcclAllReduce(buf, buf, a->count, mcclFloat32, mcclSum, comm, &opts, NULL);
  const char* msg = mcclGetLastError(comm);
  EXPECT(res != mcclSuccess, "rank %d of %d (%s, count %zu): the all-reduce its peers failed succeeded here "
         "(sum %g)", r, n, r == a->late ? "late" : "on time", a->count, buf[0]);
  EXPECT(strstr(msg, "allreduce #1") != NULL && strstr(msg, "timed out") != NULL,
         "rank %d: the error names neither the collective nor the timeout: %s", r, msg);
  char key[64];
  snprintf(key, sizeof(key), "late-done");
  if (r == a->late) {
    EXPECT(store->set(store->ctx, key, "1", 1) == mcclSuccess, "store set");
  } else {
    EXPECT(store->wait(store->ctx, key, 20000) == mcclSuccess, "rank %d: the late rank never finished", r);
  }
  mcclCommDestroy(comm);
  free(buf);
  return 0;
}

/* Invalid calls fail before sending anything; a valid call afterwards gives the exact result. */
static int badArguments(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  float f[4] = {1, 1, 1, 1};
  uint8_t b[4] = {1, 0, 1, 0};
  EXPECT(mcclAllReduce(b, b, 4, mcclBool, mcclAvg, comm, NULL, NULL) == mcclUnsupported, "bool avg");
  EXPECT(strstr(mcclGetLastError(comm), "avg") != NULL, "message: %s", mcclGetLastError(comm));
  EXPECT(mcclAllReduce(f, f, 4, mcclFloat32, mcclBxor, comm, NULL, NULL) == mcclUnsupported, "float bxor");
  EXPECT(mcclAllReduce(f, f, 4, (mcclDataType_t)42, mcclSum, comm, NULL, NULL) == mcclInvalidArgument, "dtype");
  EXPECT(mcclAllReduce(NULL, f, 4, mcclFloat32, mcclSum, comm, NULL, NULL) == mcclInvalidArgument, "NULL");
  EXPECT(mcclBroadcast(f, 4, mcclFloat32, n, comm, NULL, NULL) == mcclInvalidArgument, "root");
  EXPECT(strstr(mcclGetLastError(comm), "root") != NULL, "message: %s", mcclGetLastError(comm));
  mcclRequest_t req = NULL;
  EXPECT_OK(comm, mcclAllReduce(f, f, 4, mcclFloat32, mcclSum, comm, NULL, &req));
  EXPECT(mcclWait(req, 10000) == mcclSuccess, "wait: %s", mcclRequestError(req));
  EXPECT(mcclRequestSeq(req) == 0, "invalid calls consumed sequence numbers: seq %llu",
         (unsigned long long)mcclRequestSeq(req));
  mcclRequestFree(req);
  for (int i = 0; i < 4; i++) EXPECT(f[i] == (float)n, "f[%d] = %g", i, f[i]);
  EXPECT_OK(comm, mcclCommDestroy(comm));
  return 0;
}

/* Rank 0 waits on an all-reduce rank 1 never issues, and aborts: the request fails at once. */
typedef struct {
  mcclComm_t comm;
} abortArg;

static void* abortLater(void* p) {
  harnessSleepUs(200000);
  mcclCommAbort(((abortArg*)p)->comm);
  return NULL;
}

static int aborts(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  (void)n;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  if (r == 1) {
    harnessSleepUs(1500000);
    mcclCommDestroy(comm);
    return 0;
  }
  float f[4] = {0};
  mcclRequest_t req = NULL;
  EXPECT_OK(comm, mcclAllReduce(f, f, 4, mcclFloat32, mcclSum, comm, NULL, &req));
  abortArg a = {comm};
  pthread_t t;
  pthread_create(&t, NULL, abortLater, &a);
  double start = harnessSeconds();
  mcclResult_t res = mcclWait(req, 5000);
  double took = harnessSeconds() - start;
  EXPECT(res == mcclAborted, "rank 0: got %s", mcclGetErrorString(res));
  EXPECT(took < 1.5, "abort took %.2f s to unblock the waiter", took);
  pthread_join(t, NULL);
  mcclRequestFree(req);
  return 0;
}

int main(void) {
  harnessRunRanks(3, 60, peerExits, NULL);
  printf("peer exits: %s\n", harness_failures ? "FAILED" : "ok");
  int before = harness_failures;
  char* connect_was = harnessSetenvSaved("MCCL_RUNTIME_CONNECT", "1");
  harnessRunRanks(3, 60, peerGoneUnlinked, NULL);
  harnessRunRanks(5, 60, peerGoneUnlinked, NULL);
  printf("a peer gone before any rank linked to it (runtime connection): %s\n",
         harness_failures == before ? "ok" : "FAILED");
  harnessRestoreEnv("MCCL_RUNTIME_CONNECT", connect_was);
  before = harness_failures;
  harnessRunRanks(4, 60, chainRootExits, NULL);
  printf("chain broadcast's root exits: %s\n", harness_failures == before ? "ok" : "FAILED");
  for (size_t kind = 0; kind < 3; kind++) {
    before = harness_failures;
    harnessRunRanks(3, 60, zeroCount, (void*)kind);
    printf("0 elements on one rank (%s): %s\n", kind == 0 ? "all-reduce" : kind == 1 ? "broadcast" : "all-gather",
           harness_failures == before ? "ok" : "FAILED");
  }
  /* The same above MCCL_ANNOUNCE_RANKS, where the announcements are dissemination rounds: a rank
   * blocked on a peer that is itself blocked still learns of the mismatch from a third rank's
   * failure notice, read ahead during the collective (tcp.c, aheadHeader). */
  char* announce_was = harnessSetenvSaved("MCCL_ANNOUNCE_RANKS", "2"); /* (make ctest's third pass sets it) */
  for (size_t kind = 0; kind < 3; kind++) {
    before = harness_failures;
    harnessRunRanks(6, 60, zeroCount, (void*)kind);
    printf("0 elements on one rank of 6, dissemination (%s): %s\n",
           kind == 0 ? "all-reduce" : kind == 1 ? "broadcast" : "all-gather", harness_failures == before ? "ok" : "FAILED");
  }
  before = harness_failures;
  harnessRunRanks(6, 60, zeroCountEverywhere, NULL);
  printf("0 elements everywhere on 6 ranks, dissemination: %s\n", harness_failures == before ? "ok" : "FAILED");
  harnessRestoreEnv("MCCL_ANNOUNCE_RANKS", announce_was);
  before = harness_failures;
  harnessRunRanks(3, 60, zeroCountEverywhere, NULL);
  printf("0 elements everywhere: %s\n", harness_failures == before ? "ok" : "FAILED");
  before = harness_failures;
  harnessRunRanks(2, 60, mismatch, NULL);
  printf("mismatch: %s\n", harness_failures == before ? "ok" : "FAILED");
  before = harness_failures;
  harnessRunRanks(2, 60, stalled, NULL);
  printf("stalled peer: %s\n", harness_failures == before ? "ok" : "FAILED");
  before = harness_failures;
  harnessRunRanks(3, 60, badArguments, NULL);
  printf("bad arguments: %s\n", harness_failures == before ? "ok" : "FAILED");
  before = harness_failures;
  harnessRunRanks(2, 60, aborts, NULL);
  printf("abort: %s\n", harness_failures == before ? "ok" : "FAILED");
  const struct { int n; lateArg a; } late[] = {
      {2, {16, 1}}, {4, {16, 3}}, {3, {16, 2}}, {2, {1 << 18, 1}}, {4, {1 << 18, 2}},
  };
  for (size_t k = 0; k < sizeof(late) / sizeof(late[0]); k++) {
    before = harness_failures;
    harnessRunRanks(late[k].n, 60, lateRank, (void*)&late[k].a);
    printf("late rank %d of %d, %s: %s\n", late[k].a.late, late[k].n,
           late[k].a.count >= 65536 ? "ring" : "recursive doubling", harness_failures == before ? "ok" : "FAILED");
  }
  return harnessExit("test_failures");
}
