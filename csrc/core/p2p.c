/*
 * p2p.c: send and receive, matched per (sender, tag) in issue order, outside the collective
 * sequence.
 *
 * A send becomes frames of type P2P on the peer's send queue (all at once, so they travel
 * contiguously). On the receiving side the transport hands every P2P header to p2pArrive: the
 * first frame of a message (offset 0) is matched against the posted receives in posting order
 * (a receive from MCCL_ANY_SOURCE matches any sender); if none matches, the message is parked in
 * a buffer of its own until a receive claims it. Later frames of the message follow the first
 * on the same connection, so each peer has one "current" message at a time.
 *
 * Parking is bounded: the messages parked from one peer may hold at most MCCL_P2P_PARK_BYTES
 * (each counted as its size plus PARK_OVERHEAD, reserved when its first frame arrives). A message
 * that does not fit is not read: its header is held (MCCL_ARRIVE_HOLD) and nothing more is read
 * from that peer, so TCP holds the sender back, until a receive claims a parked message (room
 * again) or one is posted that matches the held message, which is then read straight into that
 * receive's buffer (so a message larger than the budget still gets through). One exception keeps
 * collectives from waiting on point-to-point traffic that shares their connection: while a
 * collective receive is posted on the peer's connection (its frames are behind the messages),
 * messages are parked past the budget (a warning says so, once per peer). The excess is then at
 * most what the peer sent before that collective. Out of memory, parking waits the same way; with
 * a collective behind it, the communicator fails with an error saying so. No message is dropped.
 *
 * A send or receive whose buffer a device is still writing (its handoff's producer, O1) waits in
 * `waiting` until the producer is done, polled at every round; it holds back the later sends to
 * (receives from) the same peer, so the per-(peer, tag) order stays the issue order, while work
 * for other peers goes on.
 *
 * Threading: caller threads only append to comm->p2p_new_* under qlock (mcclP2pSubmit). All
 * state below is the engine thread's; p2pRound runs at the start of every progress round, both
 * inside collectives and when the engine has nothing but point-to-point work.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "core/debug.h"
#include "core/param.h"
#include "device/handoff.h"

typedef struct mcclParked {
  int peer, tag;
  mcclDataType_t dtype;
  size_t count, bytes, landed;
  char* buf;                 /* grows as frames land, up to `bytes` (see parkedRoom) */
  size_t cap;
  struct mcclRequest* claim; /* a receive that matched it before it fully arrived */
  size_t cost;               /* what it counts against its peer's budget: bytes + PARK_OVERHEAD */
  struct mcclParked* next;
} mcclParked;

/* What a parked message costs beyond its payload (its record and the allocator's headers), so
 * that a flood of empty messages is bounded too. */
#define PARK_OVERHEAD (sizeof(mcclParked) + 64)

enum { CUR_NONE = 0, CUR_RECV, CUR_PARKED, CUR_DISCARD };

struct mcclP2pState {
  struct mcclRequest* waiting; /* submitted, the producer of the buffer not done yet, in order */
  char* held_send;            /* [nranks], scratch of p2pRound: a send to that peer waits */
  char* held_recv;            /* [nranks]: a receive from that peer waits */
  struct mcclRequest* recvs;  /* posted receives not matched yet, in posting order */
  struct mcclRequest* active; /* sends in flight and matched receives still landing */
  mcclParked* parked;         /* unclaimed messages, in arrival order */
  int* cur_kind;              /* [nranks]: the message now arriving from each peer */
  void** cur;
  mcclFrame* cur_frame;       /* [nranks]: its first frame (tag, seq, count, dtype) */
  uint64_t* cur_next;         /* [nranks]: the byte offset its next frame must start at */
  uint64_t* send_seq;         /* [nranks]: messages sent to each peer (frame seq, for logs) */
  int* posted_from;           /* [nranks]: unmatched receives naming each peer */
  int posted_any;             /* unmatched MCCL_ANY_SOURCE receives */
  int stalled;                /* a message in flight passed its deadline (stalledMidMessage) */
  size_t budget;              /* MCCL_P2P_PARK_BYTES */
  size_t* parked_cost;        /* [nranks]: what the parked messages from each peer cost */
  char* over_warned;          /* [nranks]: parking past the budget was logged for that peer */
};

static void listRemove(struct mcclRequest** head, struct mcclRequest* req) {
  for (struct mcclRequest** p = head; *p != NULL; p = &(*p)->next)
    if (*p == req) {
      *p = req->next;
      req->next = NULL;
      return;
    }
}

static void listAppend(struct mcclRequest** head, struct mcclRequest* req) {
  req->next = NULL;
  struct mcclRequest** p = head;
  while (*p != NULL) p = &(*p)->next;
  *p = req;
}

static void finish(struct mcclRequest* req, mcclResult_t res, const char* msg) {
  free(req->xfers);
  req->xfers = NULL;
  mcclRequestFinish(req, res, msg);
  mcclRequestRelease(req); /* the engine's hold */
}

static void unposted(struct mcclP2pState* st, struct mcclRequest* req) {
  if (req->peer == MCCL_ANY_SOURCE) st->posted_any--;
  else st->posted_from[req->peer]--;
}

/* Same element type and count on both ends, or a mismatch naming both. */
static int sizesAgree(struct mcclComm* comm, struct mcclRequest* req, int from, mcclDataType_t dt,
                      size_t count) {
  if (req->op.dtype == dt && req->op.count == count) return 1;
  char msg[400];
  snprintf(msg, sizeof(msg),
           "recv mismatch: rank %d sent %zu %s elements with tag %d, but rank %d's recv #%llu "
           "expects %zu %s elements",
           from, count, mcclDtypeName(dt), req->tag, comm->rank, (unsigned long long)req->op.seq,
           req->op.count, mcclDtypeName(req->op.dtype));
  finish(req, mcclMismatch, msg);
  return 0;
}

static void deliverParked(struct mcclComm* comm, mcclParked* m, struct mcclRequest* req) {
  if (m->bytes) memcpy(req->op.recvbuf, m->buf, m->bytes);
  req->source = m->peer;
  finish(req, mcclSuccess, "");
  (void)comm;
}

static void freeParked(struct mcclP2pState* st, mcclParked* m) {
  for (mcclParked** p = &st->parked; *p != NULL; p = &(*p)->next)
    if (*p == m) {
      *p = m->next;
      break;
    }
  st->parked_cost[m->peer] -= m->cost; /* room again: a held header is asked again next round */
  free(m->buf);
  free(m);
}

/* 1 while a collective receive is posted on `peer`'s connection: its frames are behind whatever
 * that peer sent before, so nothing from that peer may wait. */
static int collectiveWaits(const struct mcclComm* comm, int peer) { return comm->tp.conns[peer].rq_head != NULL; }

/* May an unmatched message of `bytes` from `peer` be parked now? Within the budget, yes; past it
 * only when a collective waits behind it (logged once per peer). */
static int parkAllowed(struct mcclComm* comm, int peer, size_t bytes, int tag) {
  struct mcclP2pState* st = comm->p2p;
  size_t used = st->parked_cost[peer];
  if (bytes <= st->budget && used <= st->budget && st->budget - used >= bytes &&
      st->budget - used - bytes >= PARK_OVERHEAD)
    return 1;
  if (!collectiveWaits(comm, peer)) return 0;
  if (!st->over_warned[peer]) {
    st->over_warned[peer] = 1;
    WARN("rank %d: parking a %zu-byte message (tag %d) from rank %d (%s) past MCCL_P2P_PARK_BYTES (%zu bytes; "
         "%zu parked already), because a collective's frames from that rank are behind it; post the recvs "
         "of messages sent before a collective before that collective to keep within the budget",
         comm->rank, bytes, tag, peer, comm->tp.conns[peer].addr, st->budget, used);
  }
  return 1;
}

/* Make room for the first `end` bytes of a parked message. The buffer grows with the bytes that
 * actually arrive (doubling, capped at the message's size), not with the size a header claims: a
 * peer can make this rank hold at most about twice as much memory as it sent. */
static int parkedRoom(mcclParked* m, size_t end) {
  if (end <= m->cap) return 0;
  size_t want = m->cap * 2 > end ? m->cap * 2 : end;
  if (want < 4096) want = 4096;
  if (want > m->bytes) want = m->bytes;
  char* p = realloc(m->buf, want);
  if (p == NULL) return -1;
  m->buf = p;
  m->cap = want;
  return 0;
}

/* A receive is posted: take the oldest parked message it matches, or wait in the posted list. */
static void postRecv(struct mcclComm* comm, struct mcclRequest* req) {
  struct mcclP2pState* st = comm->p2p;
  for (mcclParked* m = st->parked; m != NULL; m = m->next) {
    if (m->claim != NULL || m->tag != req->tag || (req->peer != MCCL_ANY_SOURCE && req->peer != m->peer))
      continue;
    if (!sizesAgree(comm, req, m->peer, m->dtype, m->count)) {
      if (m->landed == m->bytes) freeParked(st, m);
      return;
    }
    if (m->landed == m->bytes) {
      deliverParked(comm, m, req);
      freeParked(st, m);
    } else {
      m->claim = req; /* delivered when its last frame lands */
    }
    return;
  }
  listAppend(&st->recvs, req);
  if (req->peer == MCCL_ANY_SOURCE) st->posted_any++;
  else st->posted_from[req->peer]++;
}

static void postSend(struct mcclComm* comm, struct mcclRequest* req) {
  struct mcclP2pState* st = comm->p2p;
  size_t seg = comm->algo.segment_bytes;
  int n = req->bytes == 0 ? 1 : (int)((req->bytes + seg - 1) / seg);
  req->xfers = calloc((size_t)n, sizeof(mcclXfer));
  if (req->xfers == NULL) {
    finish(req, mcclSystemError, "out of memory for the frames of a send");
    return;
  }
  req->nxfers = n;
  uint64_t seq = st->send_seq[req->peer]++;
  for (int i = 0; i < n; i++) {
    mcclXfer* x = &req->xfers[i];
    size_t off = (size_t)i * seg, len = req->bytes - off < seg ? req->bytes - off : seg;
    if (req->bytes == 0) len = 0;
    x->frame.type = MCCL_FRAME_P2P;
    x->frame.coll = MCCL_COLL_SEND;
    x->frame.dtype = (uint8_t)req->op.dtype;
    x->frame.seq = seq;
    x->frame.count = req->op.count;
    x->frame.offset = off;
    x->frame.root = (uint32_t)req->tag;
    x->buf = (char*)req->op.sendbuf + off;
    x->bytes = len;
    mcclTransportPostSend(&comm->tp, req->peer, x);
  }
  listAppend(&st->active, req);
}

/* A send that is not fully written, or a receive whose message is partly here, when its deadline
 * passes: the peer stopped reading or stalled mid-message. The connection cannot carry anything
 * else (the rest of a frame would still come, into a buffer its owner got back; a frame half
 * written cannot be taken back), so the round fails with mcclTimeout and the engine fails the
 * communicator (mcclP2pStalled), naming the peer. */
static mcclResult_t stalledMidMessage(struct mcclComm* comm, struct mcclRequest* req, int peer) {
  int send = req->op.coll == MCCL_COLL_SEND;
  snprintf(comm->tp.error, sizeof(comm->tp.error),
           "%s rank %d (%s) with tag %d timed out after %lld ms %s; the connection cannot be used any more",
           send ? "send to" : "recv from", peer, comm->tp.conns[peer].addr, req->tag, (long long)req->timeout_ms,
           send ? "before the message was written: that rank stopped reading (stalled, or it never "
                  "posted a matching recv)"
                : "with part of the message received: that rank stalled in the middle of sending it");
  comm->p2p->stalled = 1;
  return mcclTimeout;
}

int mcclP2pStalled(struct mcclComm* comm) { return comm->p2p != NULL && comm->p2p->stalled; }

/* Post the waiting requests whose producer is done, in submission order, except behind an
 * earlier one for the same peer (and direction) that still waits; a receive from any source waits
 * behind every earlier waiting receive, and holds back every later one. A producer that failed, or
 * is not done by the request's deadline, fails that request alone (nothing of it is on the wire). */
static void postReady(struct mcclComm* comm, int64_t now) {
  struct mcclP2pState* st = comm->p2p;
  if (st->waiting == NULL) return;
  memset(st->held_send, 0, (size_t)comm->nranks);
  memset(st->held_recv, 0, (size_t)comm->nranks);
  int held_any = 0; /* a receive waits: later any-source receives must wait too */
  int held_any_src = 0; /* an any-source receive waits: every later receive must wait */
  for (struct mcclRequest *req = st->waiting, *next; req != NULL; req = next) {
    next = req->next;
    int send = req->op.coll == MCCL_COLL_SEND, any = !send && req->peer == MCCL_ANY_SOURCE;
    int behind = send ? st->held_send[req->peer]
                      : (held_any_src || (any ? held_any : st->held_recv[req->peer]));
    mcclResult_t res = behind ? mcclInProgress : mcclHandoffProducerPoll(&req->handoff);
    if (res == mcclInProgress && now < req->deadline_ns) {
      if (send) st->held_send[req->peer] = 1;
      else if (any) held_any_src = held_any = 1;
      else st->held_recv[req->peer] = held_any = 1;
      continue;
    }
    listRemove(&st->waiting, req);
    if (res == mcclSuccess) {
      if (send) postSend(comm, req);
      else postRecv(comm, req);
      continue;
    }
    char msg[200];
    snprintf(msg, sizeof(msg), "the device work that writes the %s buffer %s", send ? "send" : "recv",
             res == mcclInProgress ? "had not finished when the timeout passed" : "failed");
    finish(req, res == mcclInProgress ? mcclTimeout : res, msg);
  }
}

/* Start of every progress round: post what callers submitted, retire finished sends, time out
 * receives nobody sent to, and fail the round when a message in flight passes its deadline. */
static mcclResult_t p2pRound(void* ctx) {
  struct mcclComm* comm = ctx;
  struct mcclP2pState* st = comm->p2p;
  pthread_mutex_lock(&comm->qlock);
  struct mcclRequest* fresh = comm->p2p_new_head;
  comm->p2p_new_head = comm->p2p_new_tail = NULL;
  pthread_mutex_unlock(&comm->qlock);
  while (fresh != NULL) {
    struct mcclRequest* req = fresh;
    fresh = fresh->next;
    req->deadline_ns = mcclDeadlineNs(req->timeout_ms);
    listAppend(&st->waiting, req);
  }
  int64_t now = mcclNowNs();
  postReady(comm, now);
  for (struct mcclRequest *req = st->active, *next; req != NULL; req = next) {
    next = req->next;
    if (req->op.coll != MCCL_COLL_SEND) continue;
    int done = 1;
    for (int i = 0; i < req->nxfers && done; i++) done = req->xfers[i].complete;
    if (done) {
      listRemove(&st->active, req);
      finish(req, mcclSuccess, "");
    }
  }
  for (struct mcclRequest *req = st->recvs, *next; req != NULL; req = next) {
    next = req->next;
    if (now < req->deadline_ns) continue;
    listRemove(&st->recvs, req);
    unposted(st, req);
    char msg[700];
    if (req->peer == MCCL_ANY_SOURCE)
      snprintf(msg, sizeof(msg), "recv (tag %d, any source) timed out after %lld ms: no rank sent a matching message",
               req->tag, (long long)req->timeout_ms);
    else
      snprintf(msg, sizeof(msg), "recv from rank %d (%s) with tag %d timed out after %lld ms: no matching send arrived",
               req->peer, comm->tp.conns[req->peer].addr, req->tag, (long long)req->timeout_ms);
    /* The message may be behind others that no recv claimed, which this rank stopped reading. */
    for (int p = 0; p < comm->nranks; p++) {
      if (!comm->tp.conns[p].rx_held || (req->peer != MCCL_ANY_SOURCE && req->peer != p)) continue;
      const mcclFrame* held = &comm->tp.conns[p].rx_frame;
      size_t len = strlen(msg), upcoming = (size_t)held->count * mcclDataTypeSize((mcclDataType_t)held->dtype);
      snprintf(msg + len, sizeof(msg) - len,
               "; this rank stopped reading from rank %d: its messages that no recv has claimed (%zu bytes "
               "parked) and the next one (tag %u, %zu bytes, waiting in the socket) exceed the "
               "MCCL_P2P_PARK_BYTES budget of %zu bytes, so the message may be behind them: post their recvs "
               "first, or raise the budget", p, st->parked_cost[p], held->root, upcoming, st->budget);
      break;
    }
    finish(req, mcclTimeout, msg);
  }
  for (struct mcclRequest* req = st->active; req != NULL; req = req->next)
    if (now >= req->deadline_ns) return stalledMidMessage(comm, req, req->op.coll == MCCL_COLL_SEND ? req->peer : req->source);
  for (mcclParked* m = st->parked; m != NULL; m = m->next)
    if (m->claim != NULL && now >= m->claim->deadline_ns) return stalledMidMessage(comm, m->claim, m->peer);
  return mcclSuccess;
}

/* A P2P header arrived (the transport checked that its payload lies inside its message), or the
 * room given for a frame's payload is used up (`done` > 0: say where its next bytes go). The
 * first frame of a message (offset 0, no message in progress from `peer`) is matched or parked;
 * every later frame must continue that message: same tag, sequence, count and dtype, starting
 * where the previous frame ended. Anything else is a protocol error, since a frame that claimed
 * another message's size could otherwise write past the buffer chosen for this one. */
static int p2pArrive(void* ctx, int peer, const mcclFrame* f, size_t done, char** dst, size_t* room,
                     char* why, size_t cap) {
  struct mcclComm* comm = ctx;
  struct mcclP2pState* st = comm->p2p;
  mcclDataType_t dt = (mcclDataType_t)f->dtype;
  size_t esz = mcclDataTypeSize(dt);
  *dst = NULL;
  *room = f->length - done;
  if (done > 0) {
    /* More room for the frame in progress: only a parked message's buffer runs out. */
  } else if (st->cur_kind[peer] != CUR_NONE) {
    const mcclFrame* first = &st->cur_frame[peer];
    if (f->root != first->root || f->seq != first->seq || f->count != first->count ||
        f->dtype != first->dtype || f->offset != st->cur_next[peer]) {
      snprintf(why, cap,
               "a send/recv frame (tag %u, message #%llu, %llu %s elements, bytes %llu+%u) that does "
               "not continue the message in progress (tag %u, message #%llu, %llu %s elements, next "
               "byte %llu)",
               f->root, (unsigned long long)f->seq, (unsigned long long)f->count, mcclDtypeName(f->dtype),
               (unsigned long long)f->offset, f->length, first->root, (unsigned long long)first->seq,
               (unsigned long long)first->count, mcclDtypeName(first->dtype),
               (unsigned long long)st->cur_next[peer]);
      return MCCL_ARRIVE_BROKEN;
    }
  } else {
    if (f->offset != 0) {
      snprintf(why, cap, "a send/recv frame at byte %llu of a message (tag %u, #%llu) that never started",
               (unsigned long long)f->offset, f->root, (unsigned long long)f->seq);
      return MCCL_ARRIVE_BROKEN;
    }
    int tag = (int)f->root;
    struct mcclRequest* req = st->recvs;
    while (req != NULL && !(req->tag == tag && (req->peer == MCCL_ANY_SOURCE || req->peer == peer))) req = req->next;
    /* Nothing changes before this point: a held header is asked again, with the same frame. */
    mcclParked* m = NULL;
    if (req == NULL) {
      size_t bytes = (size_t)f->count * esz;
      if (!parkAllowed(comm, peer, bytes, tag)) return MCCL_ARRIVE_HOLD;
      m = calloc(1, sizeof(*m));
      if (m == NULL) {
        if (!collectiveWaits(comm, peer)) return MCCL_ARRIVE_HOLD; /* memory may come back */
        snprintf(why, cap, "out of memory parking a %zu-byte message (tag %d) while a collective's frames "
                 "from that rank are behind it", bytes, tag);
        return MCCL_ARRIVE_NOMEM;
      }
    }
    st->cur_frame[peer] = *f;
    st->cur_next[peer] = 0;
    st->cur_kind[peer] = CUR_DISCARD;
    if (req != NULL) {
      listRemove(&st->recvs, req);
      unposted(st, req);
      if (sizesAgree(comm, req, peer, dt, (size_t)f->count)) {
        req->source = peer;
        req->landed = 0;
        listAppend(&st->active, req);
        st->cur_kind[peer] = CUR_RECV;
        st->cur[peer] = req;
      }
    } else {
      m->peer = peer;
      m->tag = tag;
      m->dtype = dt;
      m->count = (size_t)f->count;
      m->bytes = (size_t)f->count * esz;
      m->cost = m->bytes + PARK_OVERHEAD;
      st->parked_cost[peer] += m->cost;
      mcclParked** p = &st->parked;
      while (*p != NULL) p = &(*p)->next;
      *p = m;
      st->cur_kind[peer] = CUR_PARKED;
      st->cur[peer] = m;
    }
  }
  if (*room == 0) return MCCL_ARRIVE_OK; /* nothing lands (the buffer of an empty message may be NULL) */
  size_t at = (size_t)f->offset + done; /* where the next byte goes in the message */
  switch (st->cur_kind[peer]) {
    case CUR_RECV: *dst = (char*)((struct mcclRequest*)st->cur[peer])->op.recvbuf + at; break;
    case CUR_PARKED: {
      /* Room for at most the next 64 KiB (parkedRoom then doubles the buffer if that is more):
       * the buffer stays within about twice the bytes received, whatever the header claims. */
      mcclParked* m = st->cur[peer];
      size_t step = *room < 65536 ? *room : 65536;
      if (parkedRoom(m, at + step) != 0) {
        /* Wait for memory with the rest of the message in the socket (asked again every round),
         * unless a collective waits behind it. */
        if (!collectiveWaits(comm, peer)) return MCCL_ARRIVE_HOLD;
        snprintf(why, cap, "out of memory parking %zu bytes of a %zu-byte message (tag %d) while a collective's "
                 "frames from that rank are behind it", at + step, m->bytes, m->tag);
        return MCCL_ARRIVE_NOMEM;
      }
      *dst = m->buf + at;
      if (*room > m->cap - at) *room = m->cap - at;
      break;
    }
    default: break;
  }
  return MCCL_ARRIVE_OK;
}

static void p2pLanded(void* ctx, int peer, const mcclFrame* f) {
  struct mcclComm* comm = ctx;
  struct mcclP2pState* st = comm->p2p;
  size_t total = (size_t)f->count * mcclDataTypeSize((mcclDataType_t)f->dtype);
  st->cur_next[peer] += f->length;
  int last = st->cur_next[peer] >= total;
  if (st->cur_kind[peer] == CUR_RECV && last) {
    struct mcclRequest* req = st->cur[peer];
    listRemove(&st->active, req);
    finish(req, mcclSuccess, "");
  } else if (st->cur_kind[peer] == CUR_PARKED) {
    mcclParked* m = st->cur[peer];
    m->landed += f->length;
    if (last && m->claim != NULL) {
      deliverParked(comm, m, m->claim);
      freeParked(st, m);
    }
  }
  if (last) st->cur_kind[peer] = CUR_NONE;
}

static int p2pWanted(void* ctx, int peer) {
  struct mcclP2pState* st = ((struct mcclComm*)ctx)->p2p;
  return st->posted_any > 0 || st->posted_from[peer] > 0 || st->cur_kind[peer] != CUR_NONE;
}

mcclResult_t mcclP2pInit(struct mcclComm* comm) {
  struct mcclP2pState* st = calloc(1, sizeof(*st));
  size_t n = (size_t)comm->nranks;
  if (st == NULL) return mcclSystemError;
  st->cur_kind = calloc(n, sizeof(int));
  st->cur = calloc(n, sizeof(void*));
  st->send_seq = calloc(n, sizeof(uint64_t));
  st->posted_from = calloc(n, sizeof(int));
  st->cur_frame = calloc(n, sizeof(mcclFrame));
  st->cur_next = calloc(n, sizeof(uint64_t));
  st->held_send = calloc(n, 1);
  st->held_recv = calloc(n, 1);
  st->parked_cost = calloc(n, sizeof(size_t));
  st->over_warned = calloc(n, 1);
  st->budget = (size_t)mcclParamInt("MCCL_P2P_PARK_BYTES");
  comm->p2p = st;
  if (!st->cur_kind || !st->cur || !st->send_seq || !st->posted_from || !st->cur_frame || !st->cur_next ||
      !st->held_send || !st->held_recv || !st->parked_cost || !st->over_warned)
    return mcclSystemError;
  comm->tp.p2p = (mcclP2pHooks){comm, p2pArrive, p2pLanded, p2pWanted, p2pRound};
  static atomic_flag logged = ATOMIC_FLAG_INIT;
  if (comm->nranks > 1 && !atomic_flag_test_and_set(&logged))
    INFO(MCCL_SUB_INIT, "point-to-point: up to %zu bytes of messages that arrive before their recv are parked "
         "per peer (MCCL_P2P_PARK_BYTES); past that, reading from that peer waits until recvs claim them",
         st->budget);
  return mcclSuccess;
}

int mcclP2pBusy(struct mcclComm* comm) {
  struct mcclP2pState* st = comm->p2p;
  return comm->p2p_new_head != NULL || st->waiting != NULL || st->recvs != NULL || st->active != NULL;
}

int mcclP2pWaiting(struct mcclComm* comm) { return comm->p2p != NULL && comm->p2p->waiting != NULL; }

void mcclP2pFailAll(struct mcclComm* comm, mcclResult_t res, const char* msg) {
  struct mcclP2pState* st = comm->p2p;
  if (st == NULL) return;
  pthread_mutex_lock(&comm->qlock);
  struct mcclRequest* fresh = comm->p2p_new_head;
  comm->p2p_new_head = comm->p2p_new_tail = NULL;
  pthread_mutex_unlock(&comm->qlock);
  struct mcclRequest* lists[4] = {fresh, st->waiting, st->recvs, st->active};
  st->waiting = st->recvs = st->active = NULL;
  for (int k = 0; k < 4; k++)
    for (struct mcclRequest *req = lists[k], *next; req != NULL; req = next) {
      next = req->next;
      finish(req, res, msg);
    }
  for (mcclParked* m = st->parked; m != NULL; m = m->next)
    if (m->claim != NULL) {
      finish(m->claim, res, msg);
      m->claim = NULL;
    }
  memset(st->posted_from, 0, sizeof(int) * (size_t)comm->nranks);
  memset(st->cur_kind, 0, sizeof(int) * (size_t)comm->nranks);
  st->posted_any = 0;
}

void mcclP2pFree(struct mcclComm* comm) {
  struct mcclP2pState* st = comm->p2p;
  if (st == NULL) return;
  while (st->parked != NULL) freeParked(st, st->parked);
  free(st->cur_kind);
  free(st->cur);
  free(st->send_seq);
  free(st->posted_from);
  free(st->cur_frame);
  free(st->cur_next);
  free(st->held_send);
  free(st->held_recv);
  free(st->parked_cost);
  free(st->over_warned);
  free(st);
  comm->p2p = NULL;
}

void mcclP2pSubmit(struct mcclComm* comm, struct mcclRequest* req) {
  pthread_mutex_lock(&comm->qlock);
  if (comm->p2p_new_tail) comm->p2p_new_tail->next = req;
  else comm->p2p_new_head = req;
  comm->p2p_new_tail = req;
  pthread_cond_signal(&comm->qcond);
  pthread_mutex_unlock(&comm->qlock);
  mcclTransportWake(&comm->tp);
}
