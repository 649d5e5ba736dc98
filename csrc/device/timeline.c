/*
 * timeline.c: monotonic 64-bit counters shared by a device and the CPU (layer "device handoff";
 * include/mccl.h documents the API).
 *
 * A timeline's value is a word of memory (its own, or one the caller maps for a device) read and
 * raised with atomic builtins, or a pair of callbacks (MPS). CPU signals also broadcast a
 * condition variable, so a CPU waiter wakes at once; a value that a device writes straight into
 * the word cannot wake anyone, so waiters poll: a short spin, then sleeps that grow to 1 ms.
 *
 * Threading: every function may be called from any thread. `mu` guards only the condition
 * variable's sleepers; the value and the error are atomics.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "core/debug.h"
#include "device/handoff.h"

struct mcclTimeline {
  uint64_t* word;          /* the value: `own` or the caller's memory; NULL with ops */
  uint64_t own;
  int narrow;              /* MCCL_TIMELINE_32BIT */
  int has_ops;
  mcclTimelineOps_t ops;
  int error;               /* mcclResult_t, atomic; mcclSuccess while healthy */
  pthread_mutex_t mu;
  pthread_cond_t cv;
};

static uint64_t readValue(mcclTimeline_t tl) {
  if (tl->has_ops) return tl->ops.read(tl->ops.ctx);
  if (tl->narrow) return __atomic_load_n((uint32_t*)tl->word, __ATOMIC_ACQUIRE);
  return __atomic_load_n(tl->word, __ATOMIC_ACQUIRE);
}

/* `cur` has reached `want` (include/mccl.h, "Value semantics"). */
static int reached(const mcclTimeline_t tl, uint64_t cur, uint64_t want) {
  if (tl->narrow) return (int32_t)((uint32_t)cur - (uint32_t)want) >= 0;
  return cur >= want;
}

MCCL_API mcclResult_t mcclTimelineCreate(uint64_t* word, int flags, const mcclTimelineOps_t* ops,
                                         mcclTimeline_t* timeline) {
  if (timeline == NULL) {
    mcclSetThreadError("mcclTimelineCreate: timeline is NULL");
    return mcclInvalidArgument;
  }
  *timeline = NULL;
  if (word != NULL && ops != NULL) {
    mcclSetThreadError("mcclTimelineCreate: give a word or ops, not both");
    return mcclInvalidArgument;
  }
  if ((flags & ~MCCL_TIMELINE_32BIT) != 0 || (ops != NULL && flags != 0)) {
    mcclSetThreadError("mcclTimelineCreate: flags %d are not 0 or MCCL_TIMELINE_32BIT (for a word)", flags);
    return mcclInvalidArgument;
  }
  if (ops != NULL && (ops->read == NULL || ops->write == NULL)) {
    mcclSetThreadError("mcclTimelineCreate: ops need both read and write");
    return mcclInvalidArgument;
  }
  if (word != NULL && ((uintptr_t)word % 8) != 0) {
    mcclSetThreadError("mcclTimelineCreate: word %p is not 8-byte aligned", (void*)word);
    return mcclInvalidArgument;
  }
  struct mcclTimeline* tl = calloc(1, sizeof(*tl));
  if (tl == NULL) {
    mcclSetThreadError("mcclTimelineCreate: out of memory");
    return mcclSystemError;
  }
  tl->word = word != NULL ? word : &tl->own;
  tl->narrow = (flags & MCCL_TIMELINE_32BIT) != 0;
  if (ops != NULL) {
    tl->has_ops = 1;
    tl->ops = *ops;
    tl->word = NULL;
  }
  tl->error = mcclSuccess;
  pthread_mutex_init(&tl->mu, NULL);
  mcclCondInit(&tl->cv);
  *timeline = tl;
  return mcclSuccess;
}

MCCL_API void mcclTimelineDestroy(mcclTimeline_t tl) {
  if (tl == NULL) return;
  pthread_mutex_destroy(&tl->mu);
  pthread_cond_destroy(&tl->cv);
  free(tl);
}

MCCL_API uint64_t mcclTimelineValue(mcclTimeline_t tl) { return tl == NULL ? 0 : readValue(tl); }

static void wakeAll(mcclTimeline_t tl) {
  pthread_mutex_lock(&tl->mu);
  pthread_cond_broadcast(&tl->cv);
  pthread_mutex_unlock(&tl->mu);
}

MCCL_API mcclResult_t mcclTimelineSignal(mcclTimeline_t tl, uint64_t value) {
  if (tl == NULL) {
    mcclSetThreadError("mcclTimelineSignal: timeline is NULL");
    return mcclInvalidArgument;
  }
  if (tl->has_ops) {
    if (!reached(tl, tl->ops.read(tl->ops.ctx), value)) tl->ops.write(tl->ops.ctx, value);
  } else if (tl->narrow) {
    uint32_t* w = (uint32_t*)tl->word;
    uint32_t cur = __atomic_load_n(w, __ATOMIC_RELAXED);
    while (!reached(tl, cur, value) &&
           !__atomic_compare_exchange_n(w, &cur, (uint32_t)value, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
    }
  } else {
    uint64_t cur = __atomic_load_n(tl->word, __ATOMIC_RELAXED);
    while (cur < value &&
           !__atomic_compare_exchange_n(tl->word, &cur, value, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
    }
  }
  wakeAll(tl);
  return mcclSuccess;
}

MCCL_API mcclResult_t mcclTimelineFail(mcclTimeline_t tl, mcclResult_t error) {
  if (tl == NULL || error == mcclSuccess || error == mcclInProgress || (unsigned)error >= mcclNumResults) {
    mcclSetThreadError("mcclTimelineFail: %s", tl == NULL ? "timeline is NULL" : "not an error code");
    return mcclInvalidArgument;
  }
  int expected = mcclSuccess;
  __atomic_compare_exchange_n(&tl->error, &expected, (int)error, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  wakeAll(tl);
  return mcclSuccess;
}

MCCL_API mcclResult_t mcclTimelinePoll(mcclTimeline_t tl, uint64_t value) {
  if (tl == NULL) {
    mcclSetThreadError("mcclTimelinePoll: timeline is NULL");
    return mcclInvalidArgument;
  }
  if (reached(tl, readValue(tl), value)) return mcclSuccess;
  int err = __atomic_load_n(&tl->error, __ATOMIC_ACQUIRE);
  if (err != mcclSuccess) {
    /* The value may have landed between the two reads: a reached value is never an error. */
    return reached(tl, readValue(tl), value) ? mcclSuccess : (mcclResult_t)err;
  }
  return mcclInProgress;
}

/* Sleep on the condition variable for `ns` (CPU signals end it early). */
static void sleepFor(mcclTimeline_t tl, int64_t ns) {
  int64_t until = mcclNowNs() + ns;
  pthread_mutex_lock(&tl->mu);
  mcclCondWaitUntil(&tl->cv, &tl->mu, until);
  pthread_mutex_unlock(&tl->mu);
}

mcclResult_t mcclTimelineWaitUntil(mcclTimeline_t tl, uint64_t value, int64_t deadline_ns,
                                   int64_t max_slice_ns) {
  int64_t slice = 20 * 1000; /* 20 us, doubling up to max_slice_ns */
  for (int spin = 0;; spin++) {
    mcclResult_t res = mcclTimelinePoll(tl, value);
    if (res != mcclInProgress) return res;
    int64_t now = mcclNowNs();
    if (deadline_ns >= 0 && now >= deadline_ns) return mcclTimeout;
    if (spin < 64) continue; /* a device write usually lands within microseconds */
    int64_t ns = slice;
    if (deadline_ns >= 0 && deadline_ns - now < ns) ns = deadline_ns - now;
    sleepFor(tl, ns);
    if (slice < max_slice_ns) slice *= 2;
    if (slice > max_slice_ns) slice = max_slice_ns;
  }
}

MCCL_API mcclResult_t mcclTimelineWait(mcclTimeline_t tl, uint64_t value, int64_t timeout_ms) {
  if (tl == NULL) {
    mcclSetThreadError("mcclTimelineWait: timeline is NULL");
    return mcclInvalidArgument;
  }
  int64_t deadline = timeout_ms < 0 ? -1 : mcclDeadlineNs(timeout_ms);
  return mcclTimelineWaitUntil(tl, value, deadline, 1000 * 1000);
}
