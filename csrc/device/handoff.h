/*
 * handoff.h: the device handoff seam (layer "device handoff"; ARCHITECTURE.md, rules O1-O3).
 *
 * The engine polls mcclHandoffProducerPoll before it reads any byte of a request's buffers and
 * calls mcclHandoffRelease once the request is finished (its last byte written, or failed). For
 * CPU memory the handoff names no timeline: the poll is ready at once and the release only runs
 * the callback. For device memory the producer and consumer timelines (include/mccl.h) order the
 * engine against the device's stream without either side blocking the other.
 */
#ifndef MCCL_HANDOFF_H_
#define MCCL_HANDOFF_H_

#include <stdint.h>

#include "mccl.h"

/* O1, non-blocking: mcclSuccess when the producer's writes are visible to the engine (or there is
 * no producer), mcclInProgress while they are not, or the producer timeline's error. */
mcclResult_t mcclHandoffProducerPoll(const mcclHandoff_t* h);

/* O2: signal the consumer timeline, then run consumer_release. The caller guarantees it is
 * called exactly once per request (mcclRequestFinish). */
void mcclHandoffRelease(const mcclHandoff_t* h, mcclResult_t result);

/* mcclTimelineWait with an absolute deadline (mcclNowNs clock; < 0: none) and a cap on each
 * sleep (a device's own writes are noticed within about that long). */
mcclResult_t mcclTimelineWaitUntil(mcclTimeline_t tl, uint64_t value, int64_t deadline_ns,
                                   int64_t max_slice_ns);

#endif
