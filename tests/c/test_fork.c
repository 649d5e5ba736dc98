/*
 * test_fork.c: a rank forks while its communicator is busy (a large all-reduce in flight, the
 * engine and sender threads running), as a DataLoader worker would.
 *
 * In the child every call on the inherited communicator must fail at once with
 * mcclInvalidUsage, saying that it was created in the parent (by pid) and cannot be used after
 * fork(), although the group's timeout is long; destroying it must be safe; and a new
 * communicator made in the child (the children of all ranks form one) must work. The parent's
 * job must go on untouched: the all-reduce in flight, and those after it while the child is alive
 * and after it exited, give exact results on every rank.
 *
 * Under ThreadSanitizer the child does not make a new communicator: TSan cannot start threads in
 * the child of a multi-threaded process (it stops the process), so that part runs in the other
 * builds only.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif
#ifndef UNDER_TSAN
#define UNDER_TSAN 0
#endif

/* An all-reduce SUM of `count` floats, rank r contributing (i % 13) + r: exact. */
static void allReduceExact(mcclComm_t comm, int r, int n, size_t count, mcclAlgorithm_t algo, const char* what) {
  float* buf = calloc(count + 1, sizeof(float));
  if (buf == NULL) {
    EXPECT(0, "%s: out of memory", what);
    return;
  }
  for (size_t i = 0; i < count; i++) buf[i] = (float)(i % 13) + (float)r;
  mcclOpOptions_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.algorithm = algo;
  EXPECT_OK(comm, mcclAllReduce(buf, buf, count, mcclFloat32, mcclSum, comm, &opts, NULL));
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) bad += buf[i] != (float)(n * (int)(i % 13) + n * (n - 1) / 2);
  EXPECT(bad == 0, "%s: rank %d n=%d count=%zu: %zu wrong", what, r, n, count, bad);
  harnessReport(harnessDigest(buf, count * sizeof(float)));
  free(buf);
}

/* In the child: `res` and the thread's message must say that the communicator is the parent's. */
static void expectForkError(mcclResult_t res, double took, const char* call) {
  const char* msg = mcclGetLastError(NULL);
  char pid[64];
  snprintf(pid, sizeof(pid), "created in process %ld", (long)getppid());
  EXPECT(res == mcclInvalidUsage, "child: %s returned %s: %s", call, mcclGetErrorString(res), msg);
  EXPECT(took < 0.5, "child: %s took %.2f s", call, took);
  EXPECT(strstr(msg, pid) != NULL && strstr(msg, "cannot be used after fork()") != NULL, "child: %s: '%s'", call,
         msg);
}

/* The child's whole life; returns its exit status. */
static int childMain(mcclComm_t inherited, int r, int n) {
  int before = harness_failures;
  float x[4] = {1, 2, 3, 4};
  double t = harnessSeconds();
  mcclResult_t res = mcclAllReduce(x, x, 4, mcclFloat32, mcclSum, inherited, NULL, NULL);
  expectForkError(res, harnessSeconds() - t, "mcclAllReduce");
  EXPECT(x[0] == 1 && x[3] == 4, "child: the failed all-reduce wrote its buffer");
  mcclRequest_t req = NULL;
  t = harnessSeconds();
  res = mcclAllReduce(x, x, 4, mcclFloat32, mcclSum, inherited, NULL, &req);
  expectForkError(res, harnessSeconds() - t, "mcclAllReduce (non-blocking)");
  EXPECT(req == NULL, "child: a request was returned for a failed call");
  t = harnessSeconds();
  expectForkError(mcclBarrier(inherited, NULL, NULL), harnessSeconds() - t, "mcclBarrier");
  t = harnessSeconds();
  expectForkError(mcclBroadcast(x, 4, mcclFloat32, 0, inherited, NULL, NULL), harnessSeconds() - t, "mcclBroadcast");
  t = harnessSeconds();
  expectForkError(mcclSend(x, 4, mcclFloat32, (r + 1) % n, 0, inherited, NULL, NULL), harnessSeconds() - t, "mcclSend");
  int value = -1;
  expectForkError(mcclCommRank(inherited, &value), 0, "mcclCommRank");
  expectForkError(mcclCommCount(inherited, &value), 0, "mcclCommCount");
  mcclResult_t async = mcclSuccess;
  expectForkError(mcclCommGetAsyncError(inherited, &async), 0, "mcclCommGetAsyncError");
  EXPECT(async == mcclInvalidUsage, "child: async error %s", mcclGetErrorString(async));
  EXPECT(strstr(mcclGetLastError(inherited), "cannot be used after fork()") != NULL, "child: last error '%s'",
         mcclGetLastError(inherited));
  t = harnessSeconds();
  EXPECT(mcclCommDestroy(inherited) == mcclSuccess, "child: destroy: %s", mcclGetLastError(NULL));
  EXPECT(harnessSeconds() - t < 0.5, "child: destroying the inherited communicator took %.2f s", harnessSeconds() - t);

  /* A communicator of the children, over a store connection of their own (the rank's belongs to
   * the parent). */
  if (!UNDER_TSAN) {
    mcclStore_t store;
    if (mcclTcpStoreConnect("127.0.0.1", harness_store_port, 10000, &store) != mcclSuccess) {
      EXPECT(0, "child of rank %d: cannot reach the store: %s", r, mcclGetLastError(NULL));
    } else {
      mcclCommConfig_t cfg;
      mcclCommConfigInit(&cfg);
      cfg.rank = r;
      cfg.nranks = n;
      cfg.store = store;
      cfg.name = "children";
      cfg.timeout_ms = 30000;
      cfg.peer_hint = "127.0.0.1";
      mcclComm_t comm = NULL;
      res = mcclCommInitConfig(&comm, &cfg);
      EXPECT(res == mcclSuccess, "child of rank %d: a new communicator: %s", r, mcclGetLastError(NULL));
      if (res == mcclSuccess) {
        allReduceExact(comm, r, n, 1000, mcclAlgoTree, "children, tree");
        allReduceExact(comm, r, n, 300000, mcclAlgoRing, "children, ring");
        EXPECT_OK(comm, mcclCommDestroy(comm));
      }
      mcclTcpStoreClose(&store);
    }
  }
  return harness_failures != before ? 1 : 0;
}

static int rankMain(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  allReduceExact(comm, r, n, 1000, mcclAlgoAuto, "before the fork");
  /* A ring all-reduce in flight across the fork. */
  const size_t big = (size_t)4 << 20;
  float* buf = malloc(big * sizeof(float));
  if (buf == NULL) return 1;
  for (size_t i = 0; i < big; i++) buf[i] = (float)(i % 13) + (float)r;
  mcclOpOptions_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.algorithm = mcclAlgoRing;
  mcclRequest_t req = NULL;
  EXPECT_OK(comm, mcclAllReduce(buf, buf, big, mcclFloat32, mcclSum, comm, &opts, &req));
  fflush(stdout);
  fflush(stderr);
  pid_t child = fork();
  if (child == 0) _exit(childMain(comm, r, n));
  EXPECT(child > 0, "rank %d: fork failed", r);
  EXPECT(req != NULL && mcclWait(req, -1) == mcclSuccess, "rank %d: the all-reduce across the fork: %s", r,
         req ? mcclRequestError(req) : "no request");
  size_t bad = 0;
  for (size_t i = 0; i < big; i++) bad += buf[i] != (float)(n * (int)(i % 13) + n * (n - 1) / 2);
  EXPECT(bad == 0, "rank %d: the all-reduce across the fork: %zu wrong", r, bad);
  mcclRequestFree(req);
  free(buf);
  /* While the child lives (it is making its own communicator now), and after it exited. */
  allReduceExact(comm, r, n, 1000, mcclAlgoTree, "parent, child alive");
  allReduceExact(comm, r, n, 300000, mcclAlgoRing, "parent, child alive");
  int status = 0;
  double until = harnessSeconds() + 60;
  pid_t got = 0;
  while ((got = waitpid(child, &status, WNOHANG)) == 0 && harnessSeconds() < until) harnessSleepUs(10000);
  if (got == 0) {
    /* Where it hangs, for the log (once seen under ASan in CI, cause unknown: bench/NOTES.md). */
    if (access("/usr/bin/gdb", X_OK) == 0) {
      char cmd[160];
      snprintf(cmd, sizeof(cmd), "timeout 60 /usr/bin/gdb -batch -p %ld -ex 'thread apply all bt' 2>&1 | tail -n 80",
               (long)child);
      int ignored = system(cmd);
      (void)ignored;
    }
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    EXPECT(0, "rank %d: its child did not finish within 60 s", r);
  } else {
    EXPECT(got == child && WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d: its child %s %d", r,
           WIFEXITED(status) ? "exited with status" : "was killed by signal",
           WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  }
  allReduceExact(comm, r, n, 1000, mcclAlgoTree, "parent, child gone");
  allReduceExact(comm, r, n, 300000, mcclAlgoRing, "parent, child gone");
  EXPECT_OK(comm, mcclBarrier(comm, NULL, NULL));
  EXPECT_OK(comm, mcclCommDestroy(comm));
  return 0;
}

int main(void) {
  for (int n = 2; n <= 3; n++) {
    int before = harness_failures;
    harnessRunRanks(n, 120, rankMain, NULL);
    printf("fork on %d ranks: %s\n", n, harness_failures == before ? "ok" : "FAILED");
    fflush(stdout);
  }
  return harnessExit("test_fork");
}
