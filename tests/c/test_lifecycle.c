/*
 * test_lifecycle.c: abort and destroy while other threads use the communicator (issue 16), the
 * way the torch shim does: threads issue under a shared lock that abort/destroy take exclusively
 * (so no call starts on a freed communicator), and wait on, test, query and free their requests
 * with no lock at all, before, during and after the abort. Under ASan and TSan (make asan/tsan)
 * this must report nothing; every thread must end within seconds, every request with a result.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

enum { THREADS = 3 };

struct shared {
  mcclComm_t comm;
  pthread_rwlock_t lock; /* shared: issuing; exclusive: abort/destroy */
  int stopped;           /* under lock */
  atomic_int ok, failed, bad;
};

static void* worker(void* arg) {
  struct shared* s = arg;
  float buf[64];
  for (int it = 0; it < 100000; it++) {
    for (int i = 0; i < 64; i++) buf[i] = 1.0f;
    mcclRequest_t req = NULL;
    pthread_rwlock_rdlock(&s->lock);
    if (s->stopped) {
      pthread_rwlock_unlock(&s->lock);
      break;
    }
    mcclResult_t res = mcclAllReduce(buf, buf, 64, mcclFloat32, mcclSum, s->comm, NULL, &req);
    mcclComm_t comm = s->comm;
    pthread_rwlock_unlock(&s->lock);
    if (res != mcclSuccess) { /* the communicator failed (threads race: a mismatch is possible) */
      atomic_fetch_add(&s->failed, 1);
      continue;
    }
    int done = 0;
    mcclTest(req, &done);
    res = mcclWait(req, 20000);
    /* The request keeps the communicator's memory: its error state may be read, its run order too. */
    mcclResult_t async = mcclSuccess;
    mcclCommGetAsyncError(comm, &async);
    (void)mcclRequestSeq(req);
    const char* msg = mcclRequestError(req);
    if (res == mcclSuccess) atomic_fetch_add(&s->ok, 1);
    else if (res == mcclInProgress || msg == NULL) atomic_fetch_add(&s->bad, 1);
    else atomic_fetch_add(&s->failed, 1);
    mcclRequestFree(req);
  }
  return NULL;
}

/* arg: NULL aborts, non-NULL destroys. */
static int rankRace(int rank, int nranks, mcclStore_t* store, void* arg) {
  struct shared s;
  memset(&s, 0, sizeof(s));
  s.comm = harnessCommInit(rank, nranks, store);
  if (s.comm == NULL) return 1;
  pthread_rwlock_init(&s.lock, NULL);
  pthread_t th[THREADS];
  for (int k = 0; k < THREADS; k++) pthread_create(&th[k], NULL, worker, &s);
  harnessSleepUs(200 * 1000);
  double t0 = harnessSeconds();
  pthread_rwlock_wrlock(&s.lock);
  s.stopped = 1;
  mcclComm_t comm = s.comm;
  s.comm = NULL;
  pthread_rwlock_unlock(&s.lock);
  /* Outside the lock, as the shim does: the threads wait on their requests meanwhile. */
  mcclResult_t res = arg == NULL ? mcclCommAbort(comm) : mcclCommDestroy(comm);
  EXPECT(res == mcclSuccess, "rank %d: %s returned %s", rank, arg == NULL ? "abort" : "destroy", mcclGetErrorString(res));
  for (int k = 0; k < THREADS; k++) pthread_join(th[k], NULL);
  double took = harnessSeconds() - t0;
  EXPECT(took < 25.0, "rank %d: the threads ended %.1f s after the %s", rank, took, arg == NULL ? "abort" : "destroy");
  EXPECT(atomic_load(&s.bad) == 0, "rank %d: %d requests ended without a result", rank, atomic_load(&s.bad));
  EXPECT(atomic_load(&s.ok) + atomic_load(&s.failed) > 0, "rank %d: nothing ran", rank);
  pthread_rwlock_destroy(&s.lock);
  return harness_failures != 0;
}

int main(void) {
  EXPECT(harnessRunRanks(2, 60, rankRace, NULL) == 0, "abort while threads wait");
  EXPECT(harnessRunRanks(2, 60, rankRace, (void*)1) == 0, "destroy while threads wait");
  return harnessExit("test_lifecycle");
}
