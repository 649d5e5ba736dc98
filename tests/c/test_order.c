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

/* Order markers (the reproduction, in C): A (large) and B (small) are issued, then a
 * marker M ("a callback attached to A now"); the callback, which issues C (B's size) and seals M,
 * runs on rank 0 at once on the main thread (as torch runs a callback attached to a finished
 * Future) and on the other ranks on a thread of its own once A finished, after a rank-dependent
 * pause; meanwhile the main thread issues D. Every rank must run A, B, C, D: B and C carry
 * different values, so an order that differs between ranks sums B with C. Also: a marker whose
 * callback issues nothing, two collectives in one callback, and a marker that follows a marker. */
struct markerJob {
  mcclComm_t comm;
  int rank;
  mcclRequest_t parent, marker;
  int32_t *c1, *c2;
  size_t n;
  int two;
  long pause_us;
  mcclResult_t res;
  mcclRequest_t r1, r2;
};

static void markerCallback(struct markerJob* j) {
  if (j->parent != NULL) mcclWait(j->parent, 20000);
  sleepUs(j->pause_us);
  mcclOpOptions_t o;
  memset(&o, 0, sizeof(o));
  o.follows = j->marker;
  j->res = mcclAllReduce(j->c1, j->c1, j->n, mcclInt32, mcclSum, j->comm, &o, &j->r1);
  if (j->res == mcclSuccess && j->two) j->res = mcclAllReduce(j->c2, j->c2, j->n + 1, mcclInt32, mcclSum, j->comm, &o, &j->r2);
  mcclRequestSeal(j->marker);
}

static void* markerThread(void* arg) {
  markerCallback(arg);
  return NULL;
}

static void fillScaled(int32_t* x, size_t n, int rank, int32_t scale) {
  for (size_t i = 0; i < n; i++) x[i] = scale * (rank + 1);
}

static int rankMarkers(int rank, int nranks, mcclStore_t* store, void* arg) {
  mcclComm_t comm = harnessCommInit(rank, nranks, store);
  if (comm == NULL) return 1;
  const size_t na = 300000, n = 4;
  int32_t* a = malloc(na * sizeof(int32_t));
  int32_t b[4], c1[4], c2[5], d[4];
  const int32_t tri = (int32_t)(nranks * (nranks + 1) / 2);
  for (int round = 0; round < 6; round++) {
    fill(a, na, rank);
    fillScaled(b, n, rank, 10);
    fillScaled(c1, n, rank, 100);
    fillScaled(c2, n + 1, rank, 1000);
    fillScaled(d, n, rank, 7);
    mcclRequest_t ra = NULL, rb = NULL, rd = NULL;
    EXPECT_OK(comm, mcclAllReduce(a, a, na, mcclInt32, mcclSum, comm, NULL, &ra));
    EXPECT_OK(comm, mcclAllReduce(b, b, n, mcclInt32, mcclSum, comm, NULL, &rb));
    struct markerJob j;
    memset(&j, 0, sizeof(j));
    j.comm = comm;
    j.rank = rank;
    j.c1 = c1;
    j.c2 = c2;
    j.n = n;
    j.two = round % 3 == 1;
    int none = round % 3 == 2; /* a callback that issues nothing */
    mcclOpOptions_t mo;
    memset(&mo, 0, sizeof(mo));
    mcclRequest_t outer = NULL;
    if (round >= 3) { /* the marker itself inside an outer marker's context */
      EXPECT_OK(comm, mcclOrderMarker(comm, NULL, &outer));
      mo.follows = outer;
    }
    EXPECT_OK(comm, mcclOrderMarker(comm, &mo, &j.marker));
    pthread_t th;
    int threaded = rank != 0 && !none;
    if (none) {
      mcclRequestSeal(j.marker);
    } else if (threaded) {
      j.parent = ra;
      j.pause_us = 2000 * rank;
      pthread_create(&th, NULL, markerThread, &j);
    } else {
      markerCallback(&j); /* inline, at once: A may still run */
    }
    if (outer != NULL) mcclRequestSeal(outer);
    EXPECT_OK(comm, mcclAllReduce(d, d, n, mcclInt32, mcclSum, comm, NULL, &rd));
    if (threaded) pthread_join(th, NULL);
    EXPECT(mcclWait(ra, 20000) == mcclSuccess && mcclWait(rb, 20000) == mcclSuccess && mcclWait(rd, 20000) == mcclSuccess,
           "rank %d round %d: %s %s %s", rank, round, mcclRequestError(ra), mcclRequestError(rb), mcclRequestError(rd));
    EXPECT(j.res == mcclSuccess, "rank %d round %d: the callback's issue failed", rank, round);
    if (!none) EXPECT(j.r1 != NULL && mcclWait(j.r1, 20000) == mcclSuccess, "rank %d round %d: C failed", rank, round);
    if (j.two) EXPECT(j.r2 != NULL && mcclWait(j.r2, 20000) == mcclSuccess, "rank %d round %d: C2 failed", rank, round);
    EXPECT(checkSum(a, na, nranks, "A") == 0, "rank %d round %d: A", rank, round);
    for (size_t i = 0; i < n; i++) {
      EXPECT(b[i] == 10 * tri, "rank %d round %d: B[%zu] = %d, want %d (combined with C?)", rank, round, i, b[i], 10 * tri);
      EXPECT(d[i] == 7 * tri, "rank %d round %d: D[%zu] = %d", rank, round, i, d[i]);
      if (!none) EXPECT(c1[i] == 100 * tri, "rank %d round %d: C[%zu] = %d", rank, round, i, c1[i]);
    }
    /* The run order: A, B, then the callback's, then D. */
    uint64_t sa = mcclRequestSeq(ra), sd = mcclRequestSeq(rd);
    uint64_t want_d = sa + 2 + (none ? 0 : 1) + (j.two ? 1 : 0);
    EXPECT(mcclRequestSeq(rb) == sa + 1 && sd == want_d, "rank %d round %d: A #%llu B #%llu D #%llu (want D #%llu)", rank,
           round, (unsigned long long)sa, (unsigned long long)mcclRequestSeq(rb), (unsigned long long)sd,
           (unsigned long long)want_d);
    if (!none) EXPECT(mcclRequestSeq(j.r1) == sa + 2, "rank %d round %d: C #%llu", rank, round,
                      (unsigned long long)mcclRequestSeq(j.r1));
    EXPECT(mcclRequestSeq(j.marker) == UINT64_MAX, "a marker takes no sequence number");
    mcclRequestFree(ra);
    mcclRequestFree(rb);
    mcclRequestFree(rd);
    mcclRequestFree(j.r1);
    mcclRequestFree(j.r2);
    mcclRequestFree(j.marker);
    mcclRequestFree(outer);
  }
  EXPECT(mcclOrderMarker(NULL, NULL, NULL) == mcclInvalidArgument, "NULL arguments");
  free(a);
  EXPECT_OK(comm, mcclCommDestroy(comm));
  return harness_failures != 0;
}

int main(void) {
  for (int n = 2; n <= 4; n++) EXPECT(harnessRunRanks(n, 120, rankMarkers, NULL) == 0, "markers, %d ranks", n);
  for (int n = 2; n <= 4; n++) EXPECT(harnessRunRanks(n, 120, rankOrder, NULL) == 0, "order, %d ranks", n);
  EXPECT(harnessRunRanks(3, 60, rankHoldTimeout, NULL) == 0, "hold timeout");
  EXPECT(harnessRunRanks(2, 60, rankHoldDestroy, NULL) == 0, "hold and destroy");
  return harnessExit("test_order");
}
