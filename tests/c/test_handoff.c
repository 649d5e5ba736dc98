/*
 * test_handoff.c: timelines and the device handoff (include/mccl.h, "Device handoff"), with a
 * fake device: a thread per rank that plays a GPU stream. It writes a request's input only after
 * a delay and then raises the producer timeline by storing straight into its word, as
 * cuStreamWriteValue64 would; it "waits" on the consumer timeline as a stream wait would.
 *
 * Covered: timeline semantics (monotonic values, polls, waits with deadlines, waking on signal and
 * on failure, 32-bit wrap-around, argument errors); late producers (the engine must not read the
 * input early: it would sum zeros); point-to-point traffic that keeps moving while a collective
 * waits for its producer; late producers of sends and receives, which must not hold back work for
 * other peers; never-ready and failing producers; abort while waiting; requests that never run
 * because the communicator failed. On every path the consumer timeline is signalled and the
 * release callback runs exactly once, before mcclWait reports the request done.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static void sleepMs(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- timelines alone -------------------------------------------------------------------- */

struct signaller {
  mcclTimeline_t tl;
  uint64_t value;
  long delay_ms;
  mcclResult_t fail; /* mcclSuccess: signal; else fail with it */
};

static void* signalLater(void* arg) {
  struct signaller* s = arg;
  sleepMs(s->delay_ms);
  if (s->fail == mcclSuccess) mcclTimelineSignal(s->tl, s->value);
  else mcclTimelineFail(s->tl, s->fail);
  return NULL;
}

/* A device's store straight into the word (no condition variable to wake anyone). */
static void* deviceWriteLater(void* arg) {
  struct signaller* s = arg;
  sleepMs(s->delay_ms);
  __atomic_store_n((uint64_t*)s->tl, s->value, __ATOMIC_RELEASE); /* tl holds the word here */
  return NULL;
}

static uint64_t opsValue;
static int opsWrites;
static uint64_t opsRead(void* ctx) { return __atomic_load_n((uint64_t*)ctx, __ATOMIC_ACQUIRE); }
static void opsWrite(void* ctx, uint64_t v) {
  __atomic_store_n((uint64_t*)ctx, v, __ATOMIC_RELEASE);
  opsWrites++;
}

static void timelineBasics(void) {
  mcclTimeline_t tl = NULL;
  EXPECT_OK(NULL, mcclTimelineCreate(NULL, 0, NULL, &tl));
  EXPECT(mcclTimelineValue(tl) == 0, "a new timeline starts at 0");
  EXPECT(mcclTimelinePoll(tl, 0) == mcclSuccess, "value 0 is reached at once");
  EXPECT(mcclTimelinePoll(tl, 1) == mcclInProgress, "value 1 is not");
  EXPECT_OK(NULL, mcclTimelineSignal(tl, 5));
  EXPECT_OK(NULL, mcclTimelineSignal(tl, 3)); /* never lowers */
  EXPECT(mcclTimelineValue(tl) == 5, "value %llu after signals 5 then 3", (unsigned long long)mcclTimelineValue(tl));
  EXPECT(mcclTimelinePoll(tl, 5) == mcclSuccess && mcclTimelinePoll(tl, 6) == mcclInProgress, "poll around 5");

  /* A wait with a deadline times out on time. */
  double t0 = harnessSeconds();
  mcclResult_t res = mcclTimelineWait(tl, 6, 150);
  double took = harnessSeconds() - t0;
  EXPECT(res == mcclTimeout, "wait for an unreached value: %s", mcclGetErrorString(res));
  EXPECT(took >= 0.14 && took < 1.0, "the 150 ms wait took %.3f s", took);

  /* A CPU signal from another thread wakes a waiter at once. */
  struct signaller s = {tl, 9, 100, mcclSuccess};
  pthread_t th;
  pthread_create(&th, NULL, signalLater, &s);
  t0 = harnessSeconds();
  res = mcclTimelineWait(tl, 8, 5000);
  took = harnessSeconds() - t0;
  pthread_join(th, NULL);
  EXPECT(res == mcclSuccess, "wait woken by a signal: %s", mcclGetErrorString(res));
  EXPECT(took < 0.5, "woke %.3f s after the wait started (signal at 0.1 s)", took);

  /* Failure wakes waiters and sticks, but values reached before still count. */
  s = (struct signaller){tl, 0, 100, mcclAborted};
  pthread_create(&th, NULL, signalLater, &s);
  t0 = harnessSeconds();
  res = mcclTimelineWait(tl, 100, -1);
  took = harnessSeconds() - t0;
  pthread_join(th, NULL);
  EXPECT(res == mcclAborted, "a wait with no deadline ends with the failure: %s", mcclGetErrorString(res));
  EXPECT(took < 0.5, "the failure woke the waiter after %.3f s", took);
  EXPECT(mcclTimelinePoll(tl, 9) == mcclSuccess, "a value reached before the failure is still reached");
  EXPECT(mcclTimelinePoll(tl, 10) == mcclAborted, "an unreached value reports the failure");
  EXPECT_OK(NULL, mcclTimelineFail(tl, mcclSystemError));
  EXPECT(mcclTimelinePoll(tl, 10) == mcclAborted, "the first failure sticks");
  mcclTimelineDestroy(tl);

  /* A word written by a "device" without any signal is seen by a waiter within its slices. */
  uint64_t word __attribute__((aligned(8))) = 41;
  EXPECT_OK(NULL, mcclTimelineCreate(&word, 0, NULL, &tl));
  EXPECT(mcclTimelineValue(tl) == 41, "the word's contents are the initial value");
  struct signaller d = {(mcclTimeline_t)(void*)&word, 42, 50, mcclSuccess};
  pthread_create(&th, NULL, deviceWriteLater, &d);
  t0 = harnessSeconds();
  res = mcclTimelineWait(tl, 42, 5000);
  took = harnessSeconds() - t0;
  pthread_join(th, NULL);
  EXPECT(res == mcclSuccess && took < 0.5, "a device write noticed after %.3f s (%s)", took, mcclGetErrorString(res));
  mcclTimelineDestroy(tl);

  /* 32-bit words wrap around as CUDA's 32-bit stream waits do. */
  uint64_t narrow __attribute__((aligned(8))) = 0xfffffff0u;
  EXPECT_OK(NULL, mcclTimelineCreate(&narrow, MCCL_TIMELINE_32BIT, NULL, &tl));
  EXPECT(mcclTimelinePoll(tl, 0xfffffff0u) == mcclSuccess, "32-bit: the initial value is reached");
  EXPECT(mcclTimelinePoll(tl, 0x100000005ull) == mcclInProgress, "32-bit: 5 past the wrap is not reached yet");
  EXPECT_OK(NULL, mcclTimelineSignal(tl, 0x100000005ull));
  EXPECT((uint32_t)narrow == 5u, "32-bit: the low half holds 5 after the wrap, not %u", (uint32_t)narrow);
  EXPECT(mcclTimelinePoll(tl, 0xfffffff8u) == mcclSuccess, "32-bit: a value before the wrap is reached");
  EXPECT_OK(NULL, mcclTimelineSignal(tl, 0xfffffff8u)); /* older: must not lower it */
  EXPECT((uint32_t)narrow == 5u, "32-bit: an older value lowered the word to %u", (uint32_t)narrow);
  mcclTimelineDestroy(tl);

  /* Callbacks (the MPS form). */
  mcclTimelineOps_t ops = {&opsValue, opsRead, opsWrite};
  EXPECT_OK(NULL, mcclTimelineCreate(NULL, 0, &ops, &tl));
  EXPECT_OK(NULL, mcclTimelineSignal(tl, 7));
  EXPECT_OK(NULL, mcclTimelineSignal(tl, 7)); /* already there: no second write */
  EXPECT(opsValue == 7 && opsWrites == 1, "ops: value %llu after %d writes", (unsigned long long)opsValue, opsWrites);
  EXPECT(mcclTimelinePoll(tl, 7) == mcclSuccess, "ops: poll reads through the callback");
  mcclTimelineDestroy(tl);

  /* Bad arguments are refused with a reason. */
  uint64_t w __attribute__((aligned(8))) = 0;
  EXPECT(mcclTimelineCreate(&w, 0, &ops, &tl) == mcclInvalidArgument && tl == NULL, "word and ops together");
  EXPECT(mcclTimelineCreate(&w, 4, NULL, &tl) == mcclInvalidArgument, "unknown flags");
  EXPECT(mcclTimelineCreate((uint64_t*)((char*)&w + 4), 0, NULL, &tl) == mcclInvalidArgument, "a misaligned word");
  EXPECT(mcclTimelineCreate(NULL, 0, NULL, NULL) == mcclInvalidArgument, "no output");
  EXPECT(strstr(mcclGetLastError(NULL), "timeline") != NULL, "message: %s", mcclGetLastError(NULL));
  EXPECT(mcclTimelineSignal(NULL, 1) == mcclInvalidArgument && mcclTimelinePoll(NULL, 1) == mcclInvalidArgument &&
             mcclTimelineWait(NULL, 1, 0) == mcclInvalidArgument,
         "NULL timelines are refused");
  EXPECT_OK(NULL, mcclTimelineCreate(NULL, 0, NULL, &tl));
  EXPECT(mcclTimelineFail(tl, mcclSuccess) == mcclInvalidArgument && mcclTimelineFail(tl, mcclInProgress) == mcclInvalidArgument,
         "Fail needs an error code");
  mcclTimelineDestroy(tl);
  mcclTimelineDestroy(NULL);
}

/* ---- the fake device -------------------------------------------------------------------- */

/* What a release callback saw. */
struct release {
  atomic_int calls;
  atomic_int result;
  mcclTimeline_t consumer; /* must already be signalled when the callback runs */
  uint64_t consumer_value;
  atomic_int consumer_first;
};

static void onRelease(void* ctx, mcclResult_t result) {
  struct release* r = ctx;
  atomic_store(&r->result, (int)result);
  if (mcclTimelinePoll(r->consumer, r->consumer_value) == mcclSuccess) atomic_store(&r->consumer_first, 1);
  atomic_fetch_add(&r->calls, 1);
}

/* One request's device side: a producer timeline the "stream" raises after writing the input. */
struct fake {
  uint64_t word __attribute__((aligned(8))); /* producer, written like a device would */
  mcclTimeline_t producer, consumer;
  struct release rel;
  mcclHandoff_t handoff;
  /* the "kernel": */
  float* buf;
  size_t count;
  float value;
  long delay_ms;
};

static void fakeInit(struct fake* f, uint64_t ticket) {
  memset(f, 0, sizeof(*f));
  f->word = ticket - 1;
  mcclTimelineCreate(&f->word, 0, NULL, &f->producer);
  mcclTimelineCreate(NULL, 0, NULL, &f->consumer);
  f->rel.consumer = f->consumer;
  f->rel.consumer_value = ticket;
  atomic_init(&f->rel.calls, 0);
  atomic_init(&f->rel.result, -1);
  atomic_init(&f->rel.consumer_first, 0);
  f->handoff = (mcclHandoff_t){f->producer, ticket, f->consumer, ticket, &f->rel, onRelease};
}

static void fakeFree(struct fake* f) {
  mcclTimelineDestroy(f->producer);
  mcclTimelineDestroy(f->consumer);
}

/* The stream: after delay_ms, write the input, then raise the producer word (delay < 0: never). */
static void* streamMain(void* arg) {
  struct fake* f = arg;
  if (f->delay_ms < 0) return NULL;
  sleepMs(f->delay_ms);
  for (size_t i = 0; i < f->count; i++) f->buf[i] = f->value;
  __atomic_store_n(&f->word, f->handoff.producer_value, __ATOMIC_RELEASE);
  return NULL;
}

/* The release ran exactly once with `want`, after the consumer was signalled. */
static void expectReleased(int r, struct fake* f, mcclResult_t want, const char* what) {
  EXPECT(atomic_load(&f->rel.calls) == 1, "rank %d %s: release ran %d times", r, what, atomic_load(&f->rel.calls));
  EXPECT(atomic_load(&f->rel.result) == (int)want, "rank %d %s: released with %s, want %s", r, what,
         mcclGetErrorString((mcclResult_t)atomic_load(&f->rel.result)), mcclGetErrorString(want));
  EXPECT(atomic_load(&f->rel.consumer_first) == 1, "rank %d %s: the consumer was not signalled before the callback", r, what);
  EXPECT(mcclTimelinePoll(f->consumer, f->handoff.consumer_value) == mcclSuccess, "rank %d %s: consumer not signalled", r, what);
}

/* Late producers: every rank's input is written 50-350 ms after issue (differently per rank);
 * issuing returns at once, the results are exact, and point-to-point messages between the ranks
 * complete while the collective still waits. Then a send whose producer is late does not hold
 * back a send to another peer. */
static int lateProducer(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  const size_t count = 300000; /* large enough for the ring */
  float* buf = calloc(count, sizeof(float));
  struct fake f;
  fakeInit(&f, 1);
  f.buf = buf;
  f.count = count;
  f.value = (float)(r + 1);
  f.delay_ms = 350 - 150 * r;
  mcclOpOptions_t o;
  memset(&o, 0, sizeof(o));
  o.handoff = &f.handoff;
  o.timeout_ms = 10000;
  double t0 = harnessSeconds();
  mcclRequest_t req = NULL;
  EXPECT_OK(comm, mcclAllReduce(buf, buf, count, mcclFloat32, mcclSum, comm, &o, &req));
  double issue = harnessSeconds() - t0;
  EXPECT(issue < 0.05, "rank %d: issuing took %.3f s with a late producer", r, issue);
  pthread_t stream;
  pthread_create(&stream, NULL, streamMain, &f);
  /* Point-to-point around the ring while the collective waits for its producer. */
  int32_t out = r, in = -1;
  mcclRequest_t s = NULL, q = NULL;
  EXPECT_OK(comm, mcclSend(&out, 1, mcclInt32, (r + 1) % n, 7, comm, NULL, &s));
  EXPECT_OK(comm, mcclRecv(&in, 1, mcclInt32, (r + n - 1) % n, 7, comm, NULL, &q));
  EXPECT_OK(comm, mcclWait(s, 5000));
  EXPECT_OK(comm, mcclWait(q, 5000));
  double p2p = harnessSeconds() - t0;
  EXPECT(in == (r + n - 1) % n, "rank %d: received %d", r, in);
  int done = 1;
  mcclTest(req, &done);
  /* The slowest producer is rank 0's, at 350 ms. */
  EXPECT(!done && p2p < 0.3, "rank %d: point-to-point took %.3f s, the collective %s", r, p2p,
         done ? "had already finished" : "still waits");
  EXPECT_OK(comm, mcclWait(req, -1));
  pthread_join(stream, NULL);
  float want = (float)(n * (n + 1) / 2);
  size_t wrong = 0;
  for (size_t i = 0; i < count; i++) wrong += buf[i] != want;
  EXPECT(wrong == 0, "rank %d: %zu of %zu elements differ from %g (the engine read before the producer?)", r,
         wrong, count, (double)want);
  expectReleased(r, &f, mcclSuccess, "late producer");
  harnessReport(harnessDigest(buf, count * sizeof(float)));
  mcclRequestFree(req);
  mcclRequestFree(s);
  mcclRequestFree(q);
  fakeFree(&f);

  /* Rank 0 sends to rank 1 with a producer that finishes after 300 ms, then to rank 2 with none:
   * rank 2 gets its message at once. */
  if (n >= 3 && r <= 2) {
    int32_t msg[4] = {0, 0, 0, 0};
    if (r == 0) {
      struct fake g;
      fakeInit(&g, 5);
      int32_t late[4] = {0, 0, 0, 0};
      g.buf = (float*)late;
      g.count = 4;
      g.value = 0; /* written below as integers */
      g.delay_ms = -1;
      mcclOpOptions_t og;
      memset(&og, 0, sizeof(og));
      og.handoff = &g.handoff;
      mcclRequest_t a = NULL, b = NULL;
      int32_t now[4] = {5, 6, 7, 8};
      EXPECT_OK(comm, mcclSend(late, 4, mcclInt32, 1, 3, comm, &og, &a));
      EXPECT_OK(comm, mcclSend(now, 4, mcclInt32, 2, 3, comm, NULL, &b));
      EXPECT_OK(comm, mcclWait(b, 5000));
      sleepMs(300);
      for (int i = 0; i < 4; i++) late[i] = 11 + i;
      __atomic_store_n(&g.word, 5, __ATOMIC_RELEASE);
      EXPECT_OK(comm, mcclWait(a, 5000));
      expectReleased(r, &g, mcclSuccess, "late send");
      mcclRequestFree(a);
      mcclRequestFree(b);
      fakeFree(&g);
    } else {
      t0 = harnessSeconds();
      EXPECT_OK(comm, mcclRecv(msg, 4, mcclInt32, 0, 3, comm, NULL, NULL));
      double took = harnessSeconds() - t0;
      int32_t base = r == 1 ? 11 : 5;
      for (int i = 0; i < 4; i++) EXPECT(msg[i] == base + i, "rank %d: msg[%d] = %d", r, i, msg[i]);
      if (r == 2) EXPECT(took < 0.25, "rank 2 waited %.3f s behind a send to another peer", took);
      else EXPECT(took >= 0.2, "rank 1 got the late send after only %.3f s", took);
    }
  }
  /* A receive whose producer (the device's copy-out of the output) is late is not posted before
   * it is done; the message parks meanwhile and lands once it is. */
  if (n >= 2 && r <= 1) {
    int32_t v[3] = {-1, -1, -1};
    if (r == 1) {
      struct fake g;
      fakeInit(&g, 9);
      g.delay_ms = -1;
      mcclOpOptions_t og;
      memset(&og, 0, sizeof(og));
      og.handoff = &g.handoff;
      mcclRequest_t a = NULL;
      EXPECT_OK(comm, mcclRecv(v, 3, mcclInt32, 0, 4, comm, &og, &a));
      sleepMs(200);
      int done2 = 1;
      mcclTest(a, &done2);
      EXPECT(!done2, "rank 1: a receive finished before its producer");
      v[0] = v[1] = v[2] = 0; /* the device's write, which must not land after the message */
      __atomic_store_n(&g.word, 9, __ATOMIC_RELEASE);
      EXPECT_OK(comm, mcclWait(a, 5000));
      for (int i = 0; i < 3; i++) EXPECT(v[i] == 21 + i, "rank 1: v[%d] = %d", i, v[i]);
      expectReleased(r, &g, mcclSuccess, "late recv");
      mcclRequestFree(a);
      fakeFree(&g);
    } else {
      int32_t m[3] = {21, 22, 23};
      EXPECT_OK(comm, mcclSend(m, 3, mcclInt32, 1, 4, comm, NULL, NULL));
    }
  }
  EXPECT_OK(comm, mcclBarrier(comm, NULL, NULL));
  mcclCommDestroy(comm);
  free(buf);
  return 0;
}

/* A producer that never finishes (rank 0) or fails (rank 1): the request fails on that rank with
 * a timeout / the producer's error, every other rank fails too, within the timeout, and every
 * rank's release runs once, after its consumer was signalled. Then a request issued on the failed
 * communicator is never run and is released just the same. */
static int badProducer(int r, int n, mcclStore_t* store, void* arg) {
  int failing = arg != NULL;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  float buf[64] = {0};
  struct fake f;
  fakeInit(&f, 1);
  f.buf = buf;
  f.count = 64;
  f.value = 1;
  f.delay_ms = r == 0 ? -1 : 10;
  mcclOpOptions_t o;
  memset(&o, 0, sizeof(o));
  o.handoff = &f.handoff;
  o.timeout_ms = 1000;
  mcclRequest_t req = NULL;
  double t0 = harnessSeconds();
  EXPECT_OK(comm, mcclAllReduce(buf, buf, 64, mcclFloat32, mcclSum, comm, &o, &req));
  pthread_t stream;
  pthread_create(&stream, NULL, streamMain, &f);
  if (failing && r == 0) {
    sleepMs(100);
    mcclTimelineFail(f.producer, mcclSystemError);
  }
  mcclResult_t res = mcclWait(req, 20000);
  double took = harnessSeconds() - t0;
  pthread_join(stream, NULL);
  mcclResult_t want0 = failing ? mcclSystemError : mcclTimeout;
  if (r == 0) {
    EXPECT(res == want0, "rank 0: %s, want %s", mcclGetErrorString(res), mcclGetErrorString(want0));
    EXPECT(strstr(mcclRequestError(req), "device work") != NULL, "rank 0: message '%s'", mcclRequestError(req));
  } else {
    EXPECT(res != mcclSuccess && res != mcclInProgress, "rank %d: %s", r, mcclGetErrorString(res));
  }
  EXPECT(took < 4.0, "rank %d: failed after %.2f s (timeout 1 s)", r, took);
  expectReleased(r, &f, res, failing ? "failing producer" : "never-ready producer");
  mcclRequestFree(req);
  fakeFree(&f);

  struct fake g;
  fakeInit(&g, 2);
  o.handoff = &g.handoff;
  mcclRequest_t late = NULL;
  EXPECT_OK(comm, mcclAllReduce(buf, buf, 64, mcclFloat32, mcclSum, comm, &o, &late));
  res = mcclWait(late, 5000);
  EXPECT(res != mcclSuccess && res != mcclInProgress, "rank %d: a request on a failed communicator: %s", r,
         mcclGetErrorString(res));
  expectReleased(r, &g, res, "request never run");
  mcclRequestFree(late);
  fakeFree(&g);
  mcclCommDestroy(comm);
  return 0;
}

struct aborter {
  mcclComm_t comm;
  long delay_ms;
};

static void* abortLater(void* arg) {
  struct aborter* a = arg;
  sleepMs(a->delay_ms);
  mcclCommAbort(a->comm);
  return NULL;
}

/* Abort while the engine waits for a producer that never finishes: the request fails with
 * mcclAborted at once, its consumer is signalled and its release runs once; so does a request
 * queued behind it and a send waiting for its producer. */
static int abortWhileWaiting(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  (void)n;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  EXPECT_OK(comm, mcclBarrier(comm, NULL, NULL));
  float a[16] = {0}, b[16] = {0};
  int32_t s[2] = {1, 2};
  struct fake f, g, h;
  fakeInit(&f, 1);
  fakeInit(&g, 2);
  fakeInit(&h, 3);
  mcclOpOptions_t o;
  memset(&o, 0, sizeof(o));
  o.timeout_ms = 30000;
  mcclRequest_t ra = NULL, rb = NULL, rs = NULL;
  o.handoff = &f.handoff;
  EXPECT_OK(comm, mcclAllReduce(a, a, 16, mcclFloat32, mcclSum, comm, &o, &ra));
  o.handoff = &g.handoff;
  EXPECT_OK(comm, mcclAllReduce(b, b, 16, mcclFloat32, mcclSum, comm, &o, &rb));
  o.handoff = &h.handoff;
  EXPECT_OK(comm, mcclSend(s, 2, mcclInt32, (r + 1) % n, 1, comm, &o, &rs));
  struct aborter ab = {comm, 200};
  pthread_t th;
  double t0 = harnessSeconds();
  pthread_create(&th, NULL, abortLater, &ab);
  mcclResult_t res = mcclWait(ra, 10000);
  double took = harnessSeconds() - t0;
  pthread_join(th, NULL);
  EXPECT(res == mcclAborted, "rank %d: the waiting request ended with %s", r, mcclGetErrorString(res));
  EXPECT(took < 2.0, "rank %d: abort took %.2f s to end the wait", r, took);
  EXPECT(mcclWait(rb, 5000) == mcclAborted, "rank %d: the queued request", r);
  EXPECT(mcclWait(rs, 5000) == mcclAborted, "rank %d: the waiting send", r);
  expectReleased(r, &f, mcclAborted, "abort (waiting)");
  expectReleased(r, &g, mcclAborted, "abort (queued)");
  expectReleased(r, &h, mcclAborted, "abort (send)");
  mcclRequestFree(ra);
  mcclRequestFree(rb);
  mcclRequestFree(rs);
  fakeFree(&f);
  fakeFree(&g);
  fakeFree(&h);
  return 0;
}

/* A call that fails at issue never touches the handoff. */
static int issueError(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  struct fake f;
  fakeInit(&f, 1);
  mcclOpOptions_t o;
  memset(&o, 0, sizeof(o));
  o.handoff = &f.handoff;
  float x[4] = {0};
  mcclRequest_t req = NULL;
  EXPECT(mcclAllReduce(x, x, 4, mcclNumTypes, mcclSum, comm, &o, &req) == mcclInvalidArgument, "rank %d", r);
  EXPECT(atomic_load(&f.rel.calls) == 0, "rank %d: a refused call released its handoff", r);
  EXPECT(mcclTimelinePoll(f.consumer, 1) == mcclInProgress, "rank %d: a refused call signalled its consumer", r);
  fakeFree(&f);
  mcclCommDestroy(comm);
  return 0;
}

int main(void) {
  timelineBasics();
  harnessRunRanks(3, 60, lateProducer, NULL);
  harnessRunRanks(2, 60, badProducer, NULL);
  harnessRunRanks(2, 60, badProducer, (void*)1);
  harnessRunRanks(2, 60, abortWhileWaiting, NULL);
  harnessRunRanks(2, 60, issueError, NULL);
  return harnessExit("test_handoff");
}
