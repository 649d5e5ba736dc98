/* park.c: bounded per-peer parking of collective frames that arrive ahead of their receive, and
 * the credits that keep a sender within that bound (park.h). Pure bookkeeping: no sockets, no
 * locks. */
#include "transport/park.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/param.h"

size_t mcclParkBytes(void) {
  int64_t v = mcclParamInt("MCCL_PARK_BYTES");
  if (v >= 0) return (size_t)v;
  return (size_t)(mcclParamInt("MCCL_PIPELINE_DEPTH") + 2) * (size_t)mcclParamInt("MCCL_SEGMENT_BYTES");
}

int mcclParkFits(const mcclPark* p, size_t bytes) {
  return p->cap > 0 && p->qlen < MCCL_PARK_MAX_FRAMES && bytes <= p->cap - p->used;
}

mcclParkedFrame* mcclParkPush(mcclPark* p, const mcclFrame* f) {
  if (f->length > 0 && p->buf == NULL && (p->buf = malloc(p->cap)) == NULL) return NULL;
  if (p->qlen == p->qcap) {
    int ncap = p->qcap ? 2 * p->qcap : 16;
    mcclParkedFrame* nq = malloc((size_t)ncap * sizeof(*nq));
    if (nq == NULL) return NULL;
    for (int i = 0; i < p->qlen; i++) nq[i] = p->q[(p->qhead + i) % p->qcap];
    free(p->q);
    p->q = nq;
    p->qcap = ncap;
    p->qhead = 0;
  }
  mcclParkedFrame* e = &p->q[(p->qhead + p->qlen) % p->qcap];
  p->qlen++;
  e->frame = *f;
  e->off = p->cap ? (p->head + p->used) % p->cap : 0;
  e->got = 0;
  e->t_first = 0;
  p->used += f->length;
  if (p->used > p->peak) p->peak = p->used;
  p->parked++;
  return e;
}

mcclParkedFrame* mcclParkHead(mcclPark* p) { return p->qlen ? &p->q[p->qhead] : NULL; }

mcclParkedFrame* mcclParkTail(mcclPark* p) { return p->qlen ? &p->q[(p->qhead + p->qlen - 1) % p->qcap] : NULL; }

mcclParkedFrame* mcclParkAt(mcclPark* p, int i) { return &p->q[(p->qhead + i) % p->qcap]; }

void mcclParkSpan(const mcclPark* p, const mcclParkedFrame* e, char** dst, size_t* room) {
  size_t left = e->frame.length - e->got;
  if (left == 0) {
    *dst = NULL;
    *room = 0;
    return;
  }
  size_t pos = (e->off + e->got) % p->cap;
  *dst = p->buf + pos;
  *room = left < p->cap - pos ? left : p->cap - pos;
}

void mcclParkCopyOut(const mcclPark* p, const mcclParkedFrame* e, char* dst, size_t n) {
  if (n == 0) return;
  size_t first = p->cap - e->off < n ? p->cap - e->off : n;
  memcpy(dst, p->buf + e->off, first);
  if (n > first) memcpy(dst + first, p->buf, n - first);
}

void mcclParkPop(mcclPark* p) {
  if (p->qlen == 0) return;
  mcclParkedFrame* e = &p->q[p->qhead];
  if (p->cap) p->head = (p->head + e->frame.length) % p->cap;
  p->used -= e->frame.length;
  p->qhead = (p->qhead + 1) % p->qcap;
  if (--p->qlen == 0) p->head = 0;
}

void mcclParkFree(mcclPark* p) {
  free(p->buf);
  free(p->q);
  size_t cap = p->cap;
  memset(p, 0, sizeof(*p));
  p->cap = cap;
}

/* ---- credits ------------------------------------------------------------------------------- */

void mcclCreditInit(mcclCredit* k, size_t park_bytes) {
  memset(k, 0, sizeof(*k));
  k->window = mcclParamInt("MCCL_CREDITS") == 0 ? 0 : park_bytes;
}

int mcclCreditAllows(const mcclCredit* k, size_t bytes) {
  if (k->window == 0) return 1;
  uint64_t lead = atomic_load(&k->sent) - atomic_load(&k->granted);
  return lead < MCCL_CREDIT_CHUNK || lead + bytes <= k->window;
}

void mcclCreditStart(mcclCredit* k, size_t bytes) {
  uint64_t sent = atomic_fetch_add(&k->sent, bytes) + bytes;
  uint64_t lead = sent - atomic_load(&k->granted);
  if (lead > atomic_load(&k->peak)) atomic_store(&k->peak, lead); /* one writer: the sending thread */
}

int mcclCreditGrant(mcclCredit* k, uint64_t total, char* why, size_t cap) {
  uint64_t sent = atomic_load(&k->sent), granted = atomic_load(&k->granted);
  if (total < granted || total > sent) {
    snprintf(why, cap, "a credit for %llu bytes taken, but %llu were reported before and %llu sent",
             (unsigned long long)total, (unsigned long long)granted, (unsigned long long)sent);
    return -1;
  }
  atomic_store(&k->granted, total);
  return 0;
}

int mcclCreditDue(const mcclCredit* k) { return k->taken - k->reported >= MCCL_CREDIT_CHUNK; }
