/* handoff.c: producer poll and consumer release at the engine's edge (see handoff.h). */
#include "device/handoff.h"

#include <stddef.h>

mcclResult_t mcclHandoffProducerPoll(const mcclHandoff_t* h) {
  if (h == NULL || h->producer == NULL) return mcclSuccess;
  return mcclTimelinePoll(h->producer, h->producer_value);
}

void mcclHandoffRelease(const mcclHandoff_t* h, mcclResult_t result) {
  if (h == NULL) return;
  /* The device side first: a stream waiting on this value must never wait forever, whatever the
   * callback does next. */
  if (h->consumer != NULL) mcclTimelineSignal(h->consumer, h->consumer_value);
  if (h->consumer_release != NULL) h->consumer_release(h->ctx, result);
}
