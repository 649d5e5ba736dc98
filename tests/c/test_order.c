/*
 * test_order.c: the run order of follow-ups (include/mccl.h, "Issue order").
 *
 * A "completion thread" per rank issues collectives after the one it follows has finished, at a
 * time that differs from rank to rank, while the main thread keeps issuing collectives of its own.
 * Without holds and follow-ups the two threads' collectives would meet in different orders on
 * different ranks (a mismatch error, since their sizes differ); with them every rank runs the
 * depth-first order and every result is exact. Also: a hold never sealed times out with an error
 * naming the held collective while others wait behind it, and destroy does not wait for a hold
 * that nothing waits behind.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static void sleepUs(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* Fill `n` int32 values so that the sum over ranks is known: rank r contributes r + 1 + i % 7. */
static void fill(int32_t* x, size_t n, int rank) {
  for (size_t i = 0; i < n; i++) x[i] = rank + 1 + (int32_t)(i % 7);
}

/* Returns 1 (and says where) when a value is wrong. Thread-safe: it does not touch the
 * harness's counters, which only the main thread updates. */
static int checkSum(const int32_t* x, size_t n, int nranks, const char* what) {
  for (size_t i = 0; i < n; i++) {
    int32_t want = nranks * (nranks + 1) / 2 + nranks * (int32_t)(i % 7);
    if (x[i] != want) {
      fprintf(stderr, "%s: x[%zu] = %d, want %d\n", what, i, x[i], want);
      return 1;
    }
  }
  return 0;
}

enum { ITERS = 40 };

struct follower {
  mcclComm_t comm;
  int rank, nranks;
  mcclRequest_t parent[ITERS];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int issued;          /* parents issued so far */
  uint64_t rng;
  int failures;
};

/* The completion thread: for each parent, wait for it, dawdle (differently on each rank), issue
 * one follow-up and a follow-up of that follow-up, wait for both, then seal the parent. */
static void* followerMain(void* arg) {
  struct follower* f = arg;
  for (int it = 0; it < ITERS; it++) {
    pthread_mutex_lock(&f->mu);
    while (f->issued <= it) pthread_cond_wait(&f->cv, &f->mu);
    mcclRequest_t parent = f->parent[it];
    pthread_mutex_unlock(&f->mu);
    if (mcclWait(parent, 20000) != mcclSuccess) {
      f->failures++;
      fprintf(stderr, "rank %d: parent %d: %s\n", f->rank, it, mcclRequestError(parent));
      mcclRequestSeal(parent);
      continue;
    }
    sleepUs((long)(harnessRandom(&f->rng) % 3000));
    size_t n1 = 3000 + (size_t)it, n2 = 11 + (size_t)it;
    int32_t* a = malloc(n1 * sizeof(int32_t));
    int32_t* b = malloc(n2 * sizeof(int32_t));
    fill(a, n1, f->rank);
    fill(b, n2, f->rank);
    mcclOpOptions_t o1;
    memset(&o1, 0, sizeof(o1));
    o1.hold = 1;
    o1.follows = parent;
    mcclRequest_t r1 = NULL, r2 = NULL;
    mcclResult_t res = mcclAllReduce(a, a, n1, mcclInt32, mcclSum, f->comm, &o1, &r1);
    if (res == mcclSuccess) {
      /* A follow-up of the follow-up, issued before r1 is sealed: it runs right after r1. */
      mcclOpOptions_t o2;
      memset(&o2, 0, sizeof(o2));
      o2.follows = r1;
      res = mcclAllReduce(b, b, n2, mcclInt32, mcclSum, f->comm, &o2, &r2);
    }
    if (res != mcclSuccess) fprintf(stderr, "rank %d: issue failed: %s\n", f->rank, mcclGetLastError(NULL));
    /* Wait for whatever was issued before its buffers go. */
    mcclResult_t w1 = r1 ? mcclWait(r1, 20000) : res, w2 = r2 ? mcclWait(r2, 20000) : res;
    if (res != mcclSuccess || w1 != mcclSuccess || w2 != mcclSuccess) {
      f->failures++;
      fprintf(stderr, "rank %d: follow-ups of %d failed (%s, %s): %s / %s\n", f->rank, it, mcclGetErrorString(w1), mcclGetErrorString(w2),
              r1 ? mcclRequestError(r1) : "", r2 ? mcclRequestError(r2) : "");
    } else {
      f->failures += checkSum(a, n1, f->nranks, "follow-up");
      f->failures += checkSum(b, n2, f->nranks, "follow-up of the follow-up");
      /* Depth-first: parent, its follow-up, the follow-up's follow-up. */
      uint64_t p = mcclRequestSeq(parent);
      if (mcclRequestSeq(r1) != p + 1 || mcclRequestSeq(r2) != p + 2) {
        f->failures++;
        fprintf(stderr, "rank %d: run order: parent #%llu, follow-ups #%llu #%llu\n", f->rank,
                (unsigned long long)p, (unsigned long long)mcclRequestSeq(r1),
                (unsigned long long)mcclRequestSeq(r2));
      }
    }
    mcclRequestSeal(r1);
    mcclRequestFree(r1);
    mcclRequestFree(r2);
    if (w1 != mcclInProgress && w2 != mcclInProgress) { /* else the engine may still use them */
      free(a);
      free(b);
    }
    mcclRequestSeal(parent);
  }
  return NULL;
}

static int rankOrder(int rank, int nranks, mcclStore_t* store, void* arg) {
  mcclComm_t comm = harnessCommInit(rank, nranks, store);
  if (comm == NULL) return 1;
  struct follower f;
  memset(&f, 0, sizeof(f));
  f.comm = comm;
  f.rank = rank;
  f.nranks = nranks;
  f.rng = 0x9e3779b97f4a7c15ULL * (uint64_t)(rank + 1);
  pthread_mutex_init(&f.mu, NULL);
  pthread_cond_init(&f.cv, NULL);
  pthread_t th;
  pthread_create(&th, NULL, followerMain, &f);

  /* The main thread: a held parent, then (after a rank-dependent pause) a plain collective of
   * another size, so that it races the follower's follow-ups. */
  size_t np = 257, nm = 70000;
  int32_t* parents = malloc(ITERS * np * sizeof(int32_t));
  int32_t* mains = malloc(ITERS * nm * sizeof(int32_t));
  mcclRequest_t mreq[ITERS];
  uint64_t rng = 12345u + (uint64_t)rank;
  for (int it = 0; it < ITERS; it++) {
    fill(parents + it * np, np, rank);
    fill(mains + it * nm, nm, rank);
    mcclOpOptions_t o;
    memset(&o, 0, sizeof(o));
    o.hold = 1;
    mcclRequest_t p = NULL;
    EXPECT_OK(comm, mcclAllReduce(parents + it * np, parents + it * np, np, mcclInt32, mcclSum, comm, &o, &p));
    pthread_mutex_lock(&f.mu);
    f.parent[it] = p;
    f.issued = it + 1;
    pthread_cond_signal(&f.cv);
    pthread_mutex_unlock(&f.mu);
    sleepUs((long)(harnessRandom(&rng) % 2000));
    mreq[it] = NULL;
    EXPECT_OK(comm, mcclAllReduce(mains + it * nm, mains + it * nm, nm, mcclInt32, mcclSum, comm, NULL, &mreq[it]));
  }
  int bad = 0;
  for (int it = 0; it < ITERS; it++) {
    mcclResult_t res = mcclWait(mreq[it], 30000);
    EXPECT(res == mcclSuccess, "main %d: %s", it, mcclRequestError(mreq[it]));
    if (res == mcclSuccess) bad += checkSum(mains + it * nm, nm, nranks, "main");
    mcclRequestFree(mreq[it]);
  }
  pthread_join(th, NULL);
  for (int it = 0; it < ITERS; it++) {
    bad += checkSum(parents + it * np, np, nranks, "parent");
    mcclRequestFree(f.parent[it]);
  }
  EXPECT(f.failures == 0 && bad == 0, "rank %d: %d follower failures, %d wrong results", rank, f.failures, bad);
  free(parents);
  free(mains);
  EXPECT_OK(comm, mcclCommDestroy(comm));
  return harness_failures != 0;
}

/* A hold never sealed while another collective waits behind it: the communicator fails with a
 * timeout naming the held collective, on every rank, and destroy returns. */
static int rankHoldTimeout(int rank, int nranks, mcclStore_t* store, void* arg) {
  mcclComm_t comm = harnessCommInit(rank, nranks, store);
  if (comm == NULL) return 1;
  int32_t x[16], y[16];
  fill(x, 16, rank);
  fill(y, 16, rank);
  mcclOpOptions_t o;
  memset(&o, 0, sizeof(o));
  o.hold = 1;
  o.timeout_ms = 700;
  mcclRequest_t held = NULL, after = NULL;
  EXPECT_OK(comm, mcclAllReduce(x, x, 16, mcclInt32, mcclSum, comm, &o, &held));
  EXPECT(mcclWait(held, 10000) == mcclSuccess, "held: %s", mcclRequestError(held));
  EXPECT_OK(comm, mcclAllReduce(y, y, 16, mcclInt32, mcclSum, comm, NULL, &after));
  int64_t t0 = (int64_t)time(NULL);
  mcclResult_t res = mcclWait(after, 10000);
  EXPECT(res == mcclTimeout, "the collective behind a hold never sealed: %s (%s)", mcclGetErrorString(res),
         mcclRequestError(after));
  EXPECT(strstr(mcclRequestError(after), "callbacks of allreduce #0") != NULL, "message: %s",
         mcclRequestError(after));
  EXPECT((int64_t)time(NULL) - t0 <= 3, "took %lld s", (long long)((int64_t)time(NULL) - t0));
  int32_t before = y[0];
  EXPECT(before == rank + 1, "the output was written: %d", before);
  mcclRequestFree(after);
  mcclRequestFree(held);
  EXPECT_OK(comm, mcclCommDestroy(comm));
  return harness_failures != 0;
}

/* A hold nothing waits behind does not keep destroy waiting; a request freed after destroy is
 * still safe to query and seal (the communicator's memory lives until its last request goes). */
static int rankHoldDestroy(int rank, int nranks, mcclStore_t* store, void* arg) {
  mcclComm_t comm = harnessCommInit(rank, nranks, store);
  if (comm == NULL) return 1;
  int32_t x[8];
  fill(x, 8, rank);
  mcclOpOptions_t o;
  memset(&o, 0, sizeof(o));
  o.hold = 1;
  mcclRequest_t held = NULL;
  EXPECT_OK(comm, mcclAllReduce(x, x, 8, mcclInt32, mcclSum, comm, &o, &held));
  EXPECT(mcclWait(held, 10000) == mcclSuccess, "held: %s", mcclRequestError(held));
  EXPECT(checkSum(x, 8, nranks, "held") == 0, "held all-reduce result");
  EXPECT_OK(comm, mcclCommDestroy(comm));
  EXPECT(mcclRequestSeq(held) == 0, "seq %llu", (unsigned long long)mcclRequestSeq(held));
  EXPECT(mcclRequestSeal(held) == mcclSuccess, "seal after destroy");
  mcclRequestFree(held);
  return harness_failures != 0;
}

int main(void) {
  for (int n = 2; n <= 4; n++) EXPECT(harnessRunRanks(n, 120, rankOrder, NULL) == 0, "order, %d ranks", n);
  EXPECT(harnessRunRanks(3, 60, rankHoldTimeout, NULL) == 0, "hold timeout");
  EXPECT(harnessRunRanks(2, 60, rankHoldDestroy, NULL) == 0, "hold and destroy");
  return harnessExit("test_order");
}
