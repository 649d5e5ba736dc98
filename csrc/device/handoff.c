/* handoff.c: producer/consumer tickets at the engine's edge. CPU memory needs neither a wait nor
 * a signal; device memory plugs its callbacks in through mcclHandoff_t. */
#include "device/handoff.h"

#include <stddef.h>

mcclResult_t mcclHandoffProducerWait(const mcclHandoff_t* h, int64_t timeout_ms) {
  if (h == NULL || h->producer_wait == NULL) return mcclSuccess;
  return h->producer_wait(h->ctx, timeout_ms);
}

void mcclHandoffRelease(const mcclHandoff_t* h, mcclResult_t result) {
  if (h != NULL && h->consumer_release != NULL) h->consumer_release(h->ctx, result);
}
