/*
 * handoff.h: the device handoff seam (layer "device handoff"; ARCHITECTURE.md, rules O1-O3).
 *
 * The engine calls mcclHandoffProducerWait before it reads a request's buffers and
 * mcclHandoffRelease after it wrote the last byte (or the request failed). For CPU memory both
 * are no-ops apart from the release callback; CUDA and MPS tensors supply callbacks through
 * mcclHandoff_t (include/mccl.h) that wait on, or signal, their stream's events.
 */
#ifndef MCCL_HANDOFF_H_
#define MCCL_HANDOFF_H_

#include "mccl.h"

/* O1: returns when the producer's writes are visible to the engine, or an error / mcclTimeout. */
mcclResult_t mcclHandoffProducerWait(const mcclHandoff_t* h, int64_t timeout_ms);

/* O2: tells the consumer the buffers are final (or the request failed); called exactly once. */
void mcclHandoffRelease(const mcclHandoff_t* h, mcclResult_t result);

#endif
