/*
 * test_p2p_flood.c: point-to-point messages that arrive before their receive are parked within
 * MCCL_P2P_PARK_BYTES per peer (default 64 MiB), and past it the receiver stops reading that
 * peer (TCP backpressure) instead of allocating (issue 16). Rank 0 sends, rank 1 receives:
 *
 *  1. The flood: 10,000 isends of 64 KiB (2,000 with MCCL_TEST_QUICK) that no receive matches yet,
 *     while rank 1 has another receive posted (so it reads rank 0's stream). Rank 1's memory must
 *     stay within the budget plus a small overhead while the flood waits, and every message must
 *     then arrive, in order, exact.
 *  2. A collective behind such a flood: rank 0 issues twice the budget of isends, then an
 *     all-reduce; rank 1 runs the all-reduce first. It must complete (the messages ahead of its
 *     frames are parked past the budget: the documented rule), and the messages arrive after.
 *  3. A message larger than the budget, with a small one behind it: held in the socket, the small
 *     one waits behind it, and once its receive is posted it is read straight into it.
 *  4. A receive behind a full budget times out (alone) with a message naming the budget; the
 *     messages ahead of it, and it, arrive afterwards.
 *
 * Memory is compared with the peak RSS (VmHWM, Linux) only in builds without a sanitizer (ASan
 * keeps freed memory in quarantine; TSan's shadow grows with it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FLOOD_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FLOOD_SANITIZED 1
#endif
#endif

#define MSG_INTS (16384) /* 64 KiB of int32 */
#define BUDGET ((size_t)64 << 20)
#define WINDOW 32        /* isends in flight on rank 0 (their buffers are reused) */

/* The resident set (`field` "VmRSS:") or its peak ("VmHWM:") in bytes; 0 where /proc is missing. */
static size_t memoryBytes(const char* field) {
  FILE* f = fopen("/proc/self/status", "r");
  if (f == NULL) return 0;
  char line[256];
  size_t kb = 0;
  while (fgets(line, sizeof(line), f) != NULL)
    if (strncmp(line, field, strlen(field)) == 0) kb = (size_t)strtoull(line + strlen(field), NULL, 10);
  fclose(f);
  return kb * 1024;
}

static int32_t word(int msg, int i) { return (int32_t)((uint32_t)msg * 2654435761u + (uint32_t)i * 40503u); }

static void fill(int32_t* p, int msg, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = word(msg, (int)i);
}

static size_t wrong(const int32_t* p, int msg, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += p[i] != word(msg, (int)i);
  return bad;
}

/* Rank 0: `count` messages of MSG_INTS with `tag`, numbered from `first`, WINDOW in flight. */
static void sendMany(mcclComm_t comm, int tag, int first, int count) {
  int32_t* bufs = malloc((size_t)WINDOW * MSG_INTS * sizeof(int32_t));
  mcclRequest_t reqs[WINDOW] = {0};
  for (int k = 0; k < count; k++) {
    int slot = k % WINDOW;
    if (reqs[slot] != NULL) {
      mcclResult_t res = mcclWait(reqs[slot], 120000);
      EXPECT(res == mcclSuccess, "send %d: %s: %s", k - WINDOW, mcclGetErrorString(res), mcclRequestError(reqs[slot]));
      mcclRequestFree(reqs[slot]);
    }
    int32_t* p = bufs + (size_t)slot * MSG_INTS;
    fill(p, first + k, MSG_INTS);
    EXPECT_OK(comm, mcclSend(p, MSG_INTS, mcclInt32, 1, tag, comm, NULL, &reqs[slot]));
  }
  for (int s = 0; s < WINDOW; s++)
    if (reqs[s] != NULL) {
      EXPECT(mcclWait(reqs[s], 120000) == mcclSuccess, "send: %s", mcclRequestError(reqs[s]));
      mcclRequestFree(reqs[s]);
    }
  free(bufs);
}

/* Rank 1: receive `count` messages with `tag` in order and check each; returns the peak RSS seen. */
static size_t recvMany(mcclComm_t comm, int tag, int first, int count) {
  int32_t* buf = malloc(MSG_INTS * sizeof(int32_t));
  size_t bad = 0, peak = 0;
  for (int k = 0; k < count; k++) {
    memset(buf, 0, MSG_INTS * sizeof(int32_t));
    mcclResult_t res = mcclRecv(buf, MSG_INTS, mcclInt32, 0, tag, comm, NULL, NULL);
    EXPECT(res == mcclSuccess, "recv %d (tag %d): %s: %s", k, tag, mcclGetErrorString(res), mcclGetLastError(comm));
    if (res != mcclSuccess) break;
    size_t w = wrong(buf, first + k, MSG_INTS);
    if (w != 0 && bad == 0) fprintf(stderr, "message %d (tag %d): %zu words wrong or out of order\n", k, tag, w);
    bad += w;
    if (k % 256 == 0) {
      size_t rss = memoryBytes("VmRSS:");
      if (rss > peak) peak = rss;
    }
  }
  EXPECT(bad == 0, "tag %d: %zu words wrong", tag, bad);
  free(buf);
  return peak;
}

static int floodMain(int r, int n, mcclStore_t* store, void* arg) {
  (void)n;
  (void)arg;
  const int quick = getenv("MCCL_TEST_QUICK") != NULL;
  const int flood = quick ? 2000 : 10000;
  mcclComm_t comm = harnessCommInit(r, 2, store);
  if (comm == NULL) return 1;
  /* 1. The flood, with a receive for the message after it posted from the start. */
  if (r == 0) {
    sendMany(comm, 1, 0, flood);
    int64_t end = flood;
    EXPECT_OK(comm, mcclSend(&end, 1, mcclInt64, 1, 2, comm, NULL, NULL));
  } else {
    size_t base = memoryBytes("VmRSS:");
    int64_t end = -1;
    mcclRequest_t last;
    EXPECT_OK(comm, mcclRecv(&end, 1, mcclInt64, 0, 2, comm, NULL, &last));
    harnessSleepUs(1500000); /* rank 0 fills the budget and the sockets, then waits */
    size_t waiting = memoryBytes("VmRSS:");
    size_t peak = recvMany(comm, 1, 0, flood);
    EXPECT(mcclWait(last, 60000) == mcclSuccess && end == flood, "the message after the flood: %lld: %s",
           (long long)end, mcclRequestError(last));
    mcclRequestFree(last);
    size_t hwm = memoryBytes("VmHWM:");
    printf("flood of %d x 64 KiB: receiver RSS %.1f MiB before, %.1f MiB while the flood waited, peak %.1f MiB "
           "(budget %zu MiB)\n", flood, (double)base / 1048576, (double)waiting / 1048576,
           (double)(hwm > peak ? hwm : peak) / 1048576, BUDGET >> 20);
#ifndef FLOOD_SANITIZED
    if (base > 0) {
      size_t bound = base + BUDGET + ((size_t)24 << 20);
      EXPECT(hwm <= bound, "receiver peak RSS %zu MiB over budget + 24 MiB above %zu MiB", hwm >> 20, base >> 20);
    }
#endif
  }
  /* 2. An all-reduce behind twice the budget of unreceived messages. */
  const int ahead = (int)(2 * BUDGET / (MSG_INTS * 4));
  float f = 1;
  if (r == 0) sendMany(comm, 3, 100000, ahead);
  EXPECT_OK(comm, mcclAllReduce(&f, &f, 1, mcclFloat32, mcclSum, comm, NULL, NULL));
  EXPECT(f == 2.0f, "all-reduce behind the messages: %g", f);
  if (r == 1) (void)recvMany(comm, 3, 100000, ahead);
  /* 3. A message larger than the budget, then a small one. */
  const size_t big = BUDGET / 4 + (1 << 20); /* int32 elements: 65 MiB */
  int32_t* bigbuf = malloc(big * sizeof(int32_t));
  int64_t small = 0;
  if (r == 0) {
    fill(bigbuf, 7, big);
    mcclRequest_t rq;
    EXPECT_OK(comm, mcclSend(bigbuf, big, mcclInt32, 1, 4, comm, NULL, &rq));
    small = 77;
    EXPECT_OK(comm, mcclSend(&small, 1, mcclInt64, 1, 5, comm, NULL, NULL));
    EXPECT(mcclWait(rq, 60000) == mcclSuccess, "big send: %s", mcclRequestError(rq));
    mcclRequestFree(rq);
  } else {
    mcclRequest_t sq;
    EXPECT_OK(comm, mcclRecv(&small, 1, mcclInt64, 0, 5, comm, NULL, &sq));
    harnessSleepUs(500000);
    int done = 1;
    EXPECT(mcclTest(sq, &done) == mcclSuccess && !done, "the small message overtook the large one");
    memset(bigbuf, 0, big * sizeof(int32_t));
    size_t before = memoryBytes("VmRSS:");
    EXPECT_OK(comm, mcclRecv(bigbuf, big, mcclInt32, 0, 4, comm, NULL, NULL));
    EXPECT(wrong(bigbuf, 7, big) == 0, "the large message arrived wrong");
    EXPECT(mcclWait(sq, 60000) == mcclSuccess && small == 77, "the small message: %lld", (long long)small);
    mcclRequestFree(sq);
#ifndef FLOOD_SANITIZED
    size_t after = memoryBytes("VmRSS:");
    /* Its buffer was touched by the memset already: straight into it costs nothing more. */
    EXPECT(before == 0 || after <= before + ((size_t)24 << 20), "the large message was parked: RSS %zu -> %zu MiB",
           before >> 20, after >> 20);
#endif
  }
  free(bigbuf);
  /* 4. A receive behind a full budget: a timeout naming the budget, then everything arrives. */
  const int fillers = (int)(BUDGET / (MSG_INTS * 4)) + 64;
  if (r == 0) {
    sendMany(comm, 6, 200000, fillers);
    int64_t v = 99;
    EXPECT_OK(comm, mcclSend(&v, 1, mcclInt64, 1, 7, comm, NULL, NULL));
  } else {
    int64_t v = 0;
    mcclOpOptions_t opts;
    memset(&opts, 0, sizeof(opts));
    opts.timeout_ms = 1500;
    mcclResult_t res = mcclRecv(&v, 1, mcclInt64, 0, 7, comm, &opts, NULL);
    EXPECT(res == mcclTimeout && strstr(mcclGetLastError(comm), "MCCL_P2P_PARK_BYTES") != NULL,
           "a recv behind a full budget: %s: %s", mcclGetErrorString(res), mcclGetLastError(comm));
    (void)recvMany(comm, 6, 200000, fillers);
    EXPECT_OK(comm, mcclRecv(&v, 1, mcclInt64, 0, 7, comm, NULL, NULL));
    EXPECT(v == 99, "the message behind the full budget: %lld", (long long)v);
  }
  EXPECT_OK(comm, mcclBarrier(comm, NULL, NULL));
  EXPECT_OK(comm, mcclCommDestroy(comm));
  return 0;
}

int main(void) {
  int before = harness_failures;
  harnessRunRanks(2, 240, floodMain, NULL);
  printf("bounded point-to-point parking: %s\n", harness_failures == before ? "ok" : "FAILED");
  return harnessExit("test_p2p_flood");
}
