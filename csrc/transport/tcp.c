/* tcp.c: the TCP mesh's data path (layer "transport"): framed non-blocking sends and receives on
 * every connection, the sender thread, progress rounds and stall reports. Opening the mesh is
 * tcp_connect.c; failure notices, settling and closing are tcp_fail.c. */
#include "transport/tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/debug.h"
#include "core/trace.h"
#include "core/platform.h"

/* ---- data transfers ---------------------------------------------------------------------- */

/* The sending side on a thread of its own (mcclTransportStartSender). The owner appends to the
 * send queues and the sender thread pops them, both under `mu`. A socket, x->done and
 * c->send_midframe are written by the sender thread while the queue is not empty, and by the
 * owner only under `mu` with the queue empty (small frames, mcclTransportPostSend), or while the
 * thread is halted and the owner writes (owner_writes: mcclTransportHalt waited for its pass to
 * end). Whoever finishes a transfer sets x->complete after its last access to x. */
struct mcclSender {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;          /* `busy` fell, or `halted`/`stop` changed */
  int wake[2];                /* self-pipe: a queue went from empty to not, or stop */
  atomic_int wake_pending;
  int stop, busy;             /* under mu; busy: between its scan of the queues and its next
                                 wait, the thread may touch queued transfers without the lock */
  int halted;                 /* under mu, set and cleared by the owner (mcclTransportHalt) */
  atomic_int failed;          /* a write failed: result, peer, err and error say how */
  mcclResult_t result;
  int failed_peer, failed_errno;
  char error[768];
  struct pollfd* pfds;        /* nranks + 1 */
  int* pfd_peer;
  uint8_t* queued;            /* [nranks] the thread's scratch: peers with sends queued */
  uint8_t* owner_queued;      /* [nranks] the same, the owner's scratch (mcclTransportProgress) */
  _Atomic int64_t cpu_ns;     /* the thread's CPU time as of its last wait or written frame
                                 (the load rule) */
};

/* The text of a lost connection: "rank P (addr) closed the connection while rank R was ...".
 * f NULL: no frame was expected yet (only a point-to-point receive or a parked message). */
static void lostText(const mcclTransport* t, int peer, const char* what, const mcclFrame* f, int err,
                     char* out, size_t cap) {
  char desc[200];
  if (f != NULL) mcclFrameDescribe(f, desc, sizeof(desc));
  else snprintf(desc, sizeof(desc), "the next point-to-point message");
  snprintf(out, cap, "rank %d (%s) %s while rank %d was %s %s; the peer process probably exited or failed",
           peer, t->conns[peer].addr, err == 0 ? "closed the connection" : strerror(err), t->rank, what, desc);
}

/* Mark `c` dead after a socket error `err` (0: the peer closed), keeping the first reason. */
static void connLost(mcclConn* c, int err) {
  if (c->dead) return;
  c->dead = 1;
  snprintf(c->dead_reason, sizeof(c->dead_reason), "%s", err == 0 ? "closed the connection" : strerror(err));
}

static mcclResult_t peerLost(mcclTransport* t, int peer, const char* what, const mcclFrame* f, int err) {
  connLost(&t->conns[peer], err);
  lostText(t, peer, what, f, err, t->error, sizeof(t->error));
  return mcclRemoteError;
}

static void pipeWake(int fd, atomic_int* pending) {
  if (fd >= 0 && !atomic_exchange(pending, 1)) {
    char b = 1;
    ssize_t ignored = write(fd, &b, 1);
    (void)ignored;
  }
}

/* Empty a self-pipe, then clear `pending`: while it is set, a byte is in the pipe or about to be
 * written, so a waker that finds it set may skip its write. (Cleared before reading, a write that
 * raced the read would be drained and leave `pending` set over an empty pipe: every later wake
 * lost.) The caller looks at the shared state after this. */
static void pipeDrain(int fd, atomic_int* pending) {
  char drain[64];
  while (read(fd, drain, sizeof(drain)) > 0) {}
  atomic_store(pending, 0);
}

/* The payload bytes of `x` that may be written: all of them, or for a relaying send what its
 * receive has landed so far (the acquire pairs with the reader's release: those bytes are in buf). */
static size_t payloadReady(const mcclXfer* x) {
  return x->relay == NULL ? x->bytes : atomic_load_explicit(&x->relay->landed, memory_order_acquire);
}

/* A relaying send that has written everything its receive has landed so far, and not the whole
 * frame: it waits for more bytes, and being mid-frame it holds its link (nothing may cut in). */
static int relayStarved(const mcclXfer* x) {
  return x->relay != NULL && x->done >= MCCL_FRAME_BYTES && x->done - MCCL_FRAME_BYTES >= payloadReady(x) &&
         x->done < MCCL_FRAME_BYTES + x->bytes;
}

/* Write what the socket takes of x's header and the payload that may go (payloadReady), from
 * x->done on; *offered says how many bytes were offered. Returns the bytes written, or -1 with
 * errno (EAGAIN: the socket is full). */
static ssize_t frameWrite(int fd, mcclXfer* x, size_t* offered) {
  struct iovec iov[2];
  int niov = 0;
  *offered = 0;
  if (x->done < MCCL_FRAME_BYTES) {
    iov[niov].iov_base = x->hdr + x->done;
    iov[niov].iov_len = MCCL_FRAME_BYTES - x->done;
    *offered += iov[niov].iov_len;
    niov++;
  }
  size_t pdone = x->done > MCCL_FRAME_BYTES ? x->done - MCCL_FRAME_BYTES : 0, ready = payloadReady(x);
  if (ready > pdone) {
    iov[niov].iov_base = x->buf + pdone;
    iov[niov].iov_len = ready - pdone;
    *offered += iov[niov].iov_len;
    niov++;
  }
  struct msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = iov;
  msg.msg_iovlen = (size_t)niov;
  return sendmsg(fd, &msg, MCCL_MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Trace records of one frame (core/trace.h): its wait and its transfer, on the peer's track. */
static void traceXfer(mcclTransport* t, int track, mcclTraceKind wait, mcclTraceKind move, const mcclXfer* x) {
  int64_t now = mcclNowNs();
  mcclTraceArgs a = {.coll = x->frame.coll, .step = x->frame.step, .seq = x->frame.seq,
                     .offset = x->frame.offset, .bytes = x->bytes};
  int64_t first = x->t_first ? x->t_first : now;
  mcclTraceSpan(t->trace, track, wait, x->t_post, first, &a);
  mcclTraceSpan(t->trace, track, move, first, now, &a);
}

/* With a trace, a write of `n` bytes (or -1) of the `offered` left of c's head frame x: note its
 * first byte, and the times the socket was full: from a write it refused or took only part of,
 * to the next write it took bytes in. */
static void traceWrite(mcclTransport* t, int peer, mcclConn* c, mcclXfer* x, ssize_t n, size_t before,
                       size_t offered) {
  if (t->trace == NULL) return;
  int64_t now = mcclNowNs();
  if (n <= 0) {
    if (c->t_full == 0) c->t_full = now;
    return;
  }
  if (before == 0 && x->t_first == 0) x->t_first = now;
  if (c->t_full) {
    mcclTraceArgs a = {.coll = x->frame.coll, .step = x->frame.step, .seq = x->frame.seq,
                       .offset = x->frame.offset, .bytes = (uint64_t)n};
    mcclTraceSpan(t->trace, mcclTraceSendTrack(peer), MCCL_TRACE_WINDOW, c->t_full, now, &a);
    c->t_full = 0;
  }
  if ((size_t)n < offered) c->t_full = now; /* a short write: the socket is full again */
}

/* The send `x` may leave: its gates (if any) all completed, and a relaying send's receive has
 * landed its first bytes (its header was checked). */
static int gatesOpen(const mcclXfer* x) {
  if (x->relay != NULL && payloadReady(x) == 0) return 0; /* its header waits for the first bytes */
  for (int i = 0; i < x->ngate; i++)
    if (!atomic_load(&x->gate[i].complete)) return 0;
  return 1;
}

/* A send that has not been admitted may be (credits, park.h): it is not a collective frame, or the
 * receiver's credit allows it, or the owner cannot read reports from that peer now
 * (credit_blind). An admitted send stays so. */
static int creditOpen(const mcclConn* c, const mcclXfer* x) {
  return x->admitted || x->frame.type != MCCL_FRAME_DATA || atomic_load(&c->credit_blind) ||
         mcclCreditAllows(&c->credit, x->bytes);
}

/* The head send of `c` must wait: for its gates, or for credit. Neither holds an admitted frame
 * (its gates were open when it was admitted), so a frame being written is never held. */
static int headHeld(const mcclConn* c) {
  const mcclXfer* h = c->sq_head;
  return h != NULL && (!gatesOpen(h) || !creditOpen(c, h));
}

/* `x` is the next frame written on `c`: count a collective frame's payload against the credit,
 * and end its credit wait in the trace. Under the sender's lock when there is a thread. */
static void admit(mcclTransport* t, int peer, mcclXfer* x) {
  mcclConn* c = &t->conns[peer];
  if (x->admitted) return;
  x->admitted = 1;
  if (x->frame.type != MCCL_FRAME_DATA) return;
  mcclCreditStart(&c->credit, x->bytes);
  if (x->t_credit != 0) {
    mcclTraceArgs a = {.coll = x->frame.coll, .step = x->frame.step, .seq = x->frame.seq,
                       .offset = x->frame.offset, .bytes = x->bytes};
    mcclTraceSpan(t->trace, mcclTraceSendTrack(peer), MCCL_TRACE_CREDIT, x->t_credit, mcclNowNs(), &a);
  }
}

/* The head of `c`, a collective frame, found the credit at the bound: count it once (and note
 * when, for the trace). */
static void creditWaits(mcclTransport* t, mcclConn* c, mcclXfer* h) {
  if (h->credit_wait) return;
  h->credit_wait = 1;
  atomic_fetch_add(&c->credit.waits, 1);
  if (t->trace) h->t_credit = mcclNowNs();
}

static void postSend(mcclTransport* t, int peer, mcclXfer* x, mcclXfer* gate, int ngate, const mcclXfer* relay) {
  mcclConn* c = &t->conns[peer];
  mcclSender* s = t->sender;
  x->relay = relay;
  x->gate = gate;
  x->ngate = gate != NULL ? ngate : 0;
  x->next = NULL;
  x->done = 0;
  atomic_store(&x->complete, 0);
  if (x->frame.type == 0) x->frame.type = MCCL_FRAME_DATA;
  x->frame.length = (uint32_t)x->bytes;
  mcclFrameEncode(x->hdr, &x->frame);
  x->t_first = 0;
  x->t_post = t->trace ? mcclNowNs() : 0;
  x->admitted = x->credit_wait = 0;
  x->t_credit = 0;
  if (s != NULL) pthread_mutex_lock(&s->mu);
  int was_empty = c->sq_head == NULL;
  /* With a sender thread, a frame under MCCL_SEND_INLINE_BYTES that finds its queue empty is
   * written by the owner itself, right away: copying it costs less than waking the sender thread
   * and being woken back when it completes (a few microseconds each way), which is what small
   * collectives' latency is made of. */
  if (s != NULL && was_empty && (x->bytes < t->inline_max || t->owner_writes) && c->fd >= 0 &&
      (!s->halted || t->owner_writes) &&
      gatesOpen(x) && creditOpen(c, x)) {
    admit(t, peer, x);
    /* The queue is empty and we hold the lock, so the thread is not writing this socket. What
     * does not fit (or fails) is queued below, from x->done on; the thread finds any error. */
    ssize_t n;
    size_t offered;
    do n = frameWrite(c->fd, x, &offered);
    while (n < 0 && errno == EINTR);
    if (n > 0) x->done = (size_t)n;
    c->send_midframe = x->done > 0 && x->done < MCCL_FRAME_BYTES + x->bytes;
    if (n > 0 && t->trace) x->t_first = mcclNowNs();
    if (x->done == MCCL_FRAME_BYTES + x->bytes) {
      pthread_mutex_unlock(&s->mu);
      if (t->trace) traceXfer(t, mcclTraceSendTrack(peer), MCCL_TRACE_SEND_QUEUED, MCCL_TRACE_SEND, x);
      atomic_store(&x->complete, 1);
      return;
    }
  }
  if (c->sq_tail) c->sq_tail->next = x;
  else c->sq_head = x;
  c->sq_tail = x;
  if (s != NULL) {
    pthread_mutex_unlock(&s->mu);
    /* A queue that was not empty is already in the thread's hands (being written, or waiting
     * for room in the socket); an empty one it has stopped looking at. */
    if (was_empty && !t->owner_writes) pipeWake(s->wake[1], &s->wake_pending);
  }
}

void mcclTransportPostSend(mcclTransport* t, int peer, mcclXfer* x) { postSend(t, peer, x, NULL, 0, NULL); }

void mcclTransportPostAfter(mcclTransport* t, int peer, mcclXfer* x, mcclXfer* gate, int ngate) {
  for (int i = 0; i < ngate; i++) gate[i].gates_send = 1; /* completing wakes the sender (recvDone) */
  postSend(t, peer, x, gate, ngate, NULL);
}

void mcclTransportPostRelay(mcclTransport* t, int peer, mcclXfer* x, mcclXfer* from) {
  from->gates_send = 1; /* its bytes wake the sender thread (connRecv, recvDone) */
  x->buf = from->buf;
  x->bytes = from->bytes;
  postSend(t, peer, x, NULL, 0, from);
}

/* The first frame behind a held head of `c` (headHeld) that may overtake it, and the one before
 * it (for unlinking), or NULL. A point-to-point frame need not wait for a collective's frame: the
 * receiver matches P2P frames by their own (source, tag) order in core/p2p.c, not by their place
 * among collective frames, and every earlier P2P frame of the queue has left already (the queue
 * is FIFO up to the held head, and this picks the first P2P frame behind it). A CREDIT frame is a
 * running total outside every order. Collective frames behind the head keep their order. Caller
 * holds the sender's lock when there is a thread. */
static mcclXfer* overtakerBehind(const mcclConn* c, mcclXfer** before) {
  mcclXfer* prev = c->sq_head;
  if (prev == NULL || !headHeld(c)) return NULL;
  for (mcclXfer* x = prev->next; x != NULL; prev = x, x = x->next)
    if ((x->frame.type == MCCL_FRAME_P2P && x->ngate == 0) || x->frame.type == MCCL_FRAME_CREDIT) {
      *before = prev;
      return x;
    }
  return NULL;
}

/* The send to write next on `peer`, or NULL: the head unless it is held (headHeld), else a frame
 * behind it that may overtake (overtakerBehind), which it moves to the head first. Either is
 * admitted: from then on it is the frame being written, and a socket that fills mid-frame resumes
 * it before anything else. A held head has not been admitted, so nothing is cut. Caller holds the
 * sender's lock when there is a thread. */
static mcclXfer* nextSend(mcclTransport* t, int peer) {
  mcclConn* c = &t->conns[peer];
  mcclXfer* h = c->sq_head;
  if (h == NULL || relayStarved(h)) return NULL; /* mid-frame: nothing may cut in */
  if (!headHeld(c)) {
    admit(t, peer, h);
    return h;
  }
  if (gatesOpen(h)) creditWaits(t, c, h);
  mcclXfer* before = NULL;
  mcclXfer* x = overtakerBehind(c, &before);
  if (x == NULL) return NULL;
  before->next = x->next;
  if (c->sq_tail == x) c->sq_tail = before;
  x->next = h;
  c->sq_head = x;
  admit(t, peer, x);
  return x;
}

/* A send of `c` may be written now (nextSend would find one). `writer`: the caller is the thread
 * that writes `c` (the sender thread, or the owner when it writes), which alone may read how far
 * the head is written (x->done), to see a relaying head starved; for the other thread such a head
 * counts as sendable (the owner then only counts the link as busy). */
static int sendable(const mcclConn* c, int writer) {
  mcclXfer* before;
  return c->sq_head != NULL && !(writer && relayStarved(c->sq_head)) &&
         (!headHeld(c) || overtakerBehind(c, &before) != NULL);
}

/* Only credit holds `c`'s sends: its head's gates are open, and nothing may overtake it. The owner
 * then keeps reading that connection for the reports (progressRound). `writer` as for sendable. */
static int creditHeld(const mcclConn* c, int writer) {
  return c->sq_head != NULL && gatesOpen(c->sq_head) && !(writer && relayStarved(c->sq_head)) &&
         !sendable(c, writer);
}

void mcclTransportPostRecv(mcclTransport* t, int peer, mcclXfer* x) {
  mcclConn* c = &t->conns[peer];
  x->next = NULL;
  x->done = 0;
  x->complete = 0;
  x->gates_send = 0;
  atomic_store_explicit(&x->landed, 0, memory_order_relaxed);
  x->frame.type = MCCL_FRAME_DATA;
  x->frame.length = (uint32_t)x->bytes;
  x->t_first = 0;
  x->t_post = t->trace ? mcclNowNs() : 0;
  if (c->rq_tail) c->rq_tail->next = x;
  else c->rq_head = x;
  c->rq_tail = x;
  c->ahead_stop = 0;
}

/* Move bytes from the head sends of `c` until the socket is full or the queue empty: returns 0
 * when the queue is empty, 1 when the socket is full, -1 after an error (described in err[cap]
 * with *err_no set; the owner marks the connection dead). With a sender thread this runs on it,
 * and the queue's head is read and popped under its lock. */
static int connSend(mcclTransport* t, int peer, char* err, size_t cap, int* err_no) {
  mcclConn* c = &t->conns[peer];
  mcclSender* s = t->sender;
  for (;;) {
    if (s != NULL) pthread_mutex_lock(&s->mu);
    mcclXfer* x = nextSend(t, peer); /* a held head holds the collective frames behind it */
    if (s != NULL) pthread_mutex_unlock(&s->mu);
    if (x == NULL) return 0;
    size_t before = x->done, offered;
    ssize_t n = frameWrite(c->fd, x, &offered);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        traceWrite(t, peer, c, x, n, before, 0);
        return 1;
      }
      if (x->frame.type == MCCL_FRAME_CREDIT) {
        /* A report the peer can no longer use (it closed: it left after its last collective,
         * say). Not an error of its own: a frame that matters fails on its own write. */
        atomic_store(&c->credit_lost, 1);
        if (s != NULL) pthread_mutex_lock(&s->mu);
        c->sq_head = x->next;
        if (c->sq_head == NULL) c->sq_tail = NULL;
        c->send_midframe = 0;
        if (s != NULL) pthread_mutex_unlock(&s->mu);
        atomic_store(&x->complete, 1);
        continue;
      }
      *err_no = errno;
      lostText(t, peer, "sending", &x->frame, errno, err, cap);
      return -1;
    }
    traceWrite(t, peer, c, x, n, before, offered);
    x->done += (size_t)n;
    c->send_midframe = x->done < MCCL_FRAME_BYTES + x->bytes;
    if (!c->send_midframe) {
      if (s != NULL) pthread_mutex_lock(&s->mu);
      c->sq_head = x->next;
      if (c->sq_head == NULL) c->sq_tail = NULL;
      if (s != NULL) pthread_mutex_unlock(&s->mu);
      if (t->trace && x->frame.type != MCCL_FRAME_CREDIT)
        traceXfer(t, mcclTraceSendTrack(peer), MCCL_TRACE_SEND_QUEUED, MCCL_TRACE_SEND, x);
      /* The load rule's figure, before the completion the owner may be waiting for: a thread
       * that never runs out of frames would otherwise not update it for a whole collective. */
      if (s != NULL && t->load_pct != 0 && pthread_equal(pthread_self(), s->thread))
        atomic_store(&s->cpu_ns, mcclThreadCpuNs());
      atomic_store(&x->complete, 1); /* the last access: the owner may reuse x from here on */
      if (s != NULL && !t->owner_writes) mcclTransportWake(t);
    }
  }
}

void mcclTransportAdopt(mcclTransport* t, int peer, int fd) {
  mcclSender* s = t->sender;
  if (s != NULL) pthread_mutex_lock(&s->mu); /* the thread reads fds under it */
  t->conns[peer].fd = fd;
  t->conns[peer].rx_lowat = 0; /* a new socket's mark is the kernel's */
  int queued = t->conns[peer].sq_head != NULL;
  if (s != NULL) {
    pthread_mutex_unlock(&s->mu);
    if (queued) pipeWake(s->wake[1], &s->wake_pending); /* sends that waited for the connection */
  }
}

/* The sender thread: write every queue until its socket is full, then wait for room in those
 * sockets or for a queue to fill. */
static void* senderMain(void* arg) {
  mcclTransport* t = arg;
  mcclSender* s = t->sender;
  mcclThreadSetName("mccl-send");
  pthread_mutex_lock(&s->mu);
  for (;;) {
    if (t->load_pct != 0) atomic_store(&s->cpu_ns, mcclThreadCpuNs());
    while ((s->halted || atomic_load(&s->failed)) && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
    if (s->stop) break;
    s->busy = 1;
    for (int r = 0; r < t->nranks; r++) s->queued[r] = sendable(&t->conns[r], 1) && t->conns[r].fd >= 0;
    pthread_mutex_unlock(&s->mu);
    int np = 0;
    for (int r = 0; r < t->nranks && !atomic_load(&s->failed); r++) {
      mcclConn* c = &t->conns[r];
      if (!s->queued[r]) continue;
      if (!c->send_blocked) {
        int st = connSend(t, r, s->error, sizeof(s->error), &s->failed_errno);
        if (st < 0) {
          s->result = mcclRemoteError;
          s->failed_peer = r;
          atomic_store(&s->failed, 1);
          mcclTransportWake(t);
          break;
        }
        c->send_blocked = st == 1;
      }
      if (c->send_blocked) {
        s->pfds[np].fd = c->fd;
        s->pfds[np].events = POLLOUT;
        s->pfd_peer[np++] = r;
      }
    }
    if (!atomic_load(&s->failed)) {
      s->pfds[np].fd = s->wake[0];
      s->pfds[np].events = POLLIN;
      s->pfds[np].revents = 0;
      if (t->load_pct != 0) atomic_store(&s->cpu_ns, mcclThreadCpuNs());
      if (poll(s->pfds, (nfds_t)np + 1, 1000) > 0) {
        for (int k = 0; k < np; k++)
          if (s->pfds[k].revents != 0) t->conns[s->pfd_peer[k]].send_blocked = 0;
        if (s->pfds[np].revents & POLLIN) pipeDrain(s->wake[0], &s->wake_pending);
      }
    }
    pthread_mutex_lock(&s->mu);
    s->busy = 0;
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static void senderFree(mcclSender* s) {
  for (int k = 0; k < 2; k++)
    if (s->wake[k] >= 0) close(s->wake[k]);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s->pfds);
  free(s->pfd_peer);
  free(s->queued);
  free(s);
}

mcclResult_t mcclTransportStartSender(mcclTransport* t) {
  if (t->sender != NULL || t->nranks < 2) return mcclSuccess;
  mcclSender* s = calloc(1, sizeof(*s));
  if (s == NULL) {
    snprintf(t->error, sizeof(t->error), "cannot set up the sender thread: out of memory");
    return mcclSystemError;
  }
  s->wake[0] = s->wake[1] = -1;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->pfds = calloc((size_t)t->nranks + 1, sizeof(struct pollfd));
  s->pfd_peer = calloc((size_t)t->nranks + 1, sizeof(int));
  s->queued = calloc((size_t)t->nranks * 2, 1);
  const char* why = NULL;
  if (!s->pfds || !s->pfd_peer || !s->queued) why = "out of memory";
  else if (pipe(s->wake) != 0) why = strerror(errno);
  if (why != NULL) {
    snprintf(t->error, sizeof(t->error), "cannot set up the sender thread: %s", why);
    senderFree(s);
    return mcclSystemError;
  }
  s->owner_queued = s->queued + t->nranks;
  for (int k = 0; k < 2; k++) {
    fcntl(s->wake[k], F_SETFL, O_NONBLOCK);
    fcntl(s->wake[k], F_SETFD, FD_CLOEXEC);
  }
  for (int r = 0; r < t->nranks; r++) t->conns[r].send_blocked = 0;
  /* Under the load rule the owner writes until its load says otherwise (mcclTransportCollectiveEnd). */
  s->halted = t->owner_writes = t->load_pct != 0;
  t->sender = s;
  int rc = pthread_create(&s->thread, NULL, senderMain, t);
  if (rc != 0) {
    t->sender = NULL;
    t->owner_writes = 0;
    snprintf(t->error, sizeof(t->error), "cannot start the sender thread: %s", strerror(rc));
    senderFree(s);
    return mcclSystemError;
  }
  mcclThreadSetNameOf(s->thread, "mccl-send");
  return mcclSuccess;
}

void mcclTransportStopSender(mcclTransport* t) {
  mcclSender* s = t->sender;
  if (s == NULL) return;
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pipeWake(s->wake[1], &s->wake_pending);
  pthread_join(s->thread, NULL);
  t->sender = NULL;
  t->owner_writes = t->copy_owned = 0; /* no thread: the owner writes, as it always does then */
  senderFree(s);
}

/* The sender thread's failure, reported on the owner's thread as a receive error would be. */
static mcclResult_t senderFailed(mcclTransport* t) {
  mcclSender* s = t->sender;
  pthread_mutex_lock(&s->mu); /* pairs with the thread's writes before `failed` */
  connLost(&t->conns[s->failed_peer], s->failed_errno);
  snprintf(t->error, sizeof(t->error), "%s", s->error);
  mcclResult_t res = s->result;
  pthread_mutex_unlock(&s->mu);
  return res;
}

/* Compare an arrived header with the one posted (wire.c); mcclMismatch with both described. */
static mcclResult_t frameCheck(mcclTransport* t, int peer, const mcclFrame* got, const mcclFrame* want) {
  char why[640];
  if (mcclFrameMatch(got, want, why, sizeof(why)) == MCCL_WIRE_OK) return mcclSuccess;
  snprintf(t->error, sizeof(t->error),
           "collective mismatch at rank %d: rank %d (%s) %s; every rank must issue the same "
           "collectives with the same sizes, dtypes, ops and roots in the same order",
           t->rank, peer, t->conns[peer].addr, why);
  return mcclMismatch;
}

/* Does `c` have a reader for the bytes that arrive next? A collective header that neither a
 * posted receive nor the park can take stops reading until one is posted (TCP then holds the
 * sender back). */
static int wanted(const mcclTransport* t, int peer) {
  const mcclConn* c = &t->conns[peer];
  if (c->rx_held) return 0; /* the owner of the P2P frame being read will say when */
  if (c->rq_head != NULL || c->rx_mode == MCCL_RX_P2P || c->rx_mode == MCCL_RX_COLL ||
      c->rx_mode == MCCL_RX_ABORT || c->rx_mode == MCCL_RX_PARK)
    return 1;
  if (c->rx_mode == MCCL_RX_PEEKED) return 0;
  return t->p2p.wanted != NULL && t->p2p.wanted(t->p2p.ctx, peer);
}

/* Nothing is wanted from `c`, but a collective frame arriving now could be parked (park.h). */
static int readAhead(const mcclConn* c) {
  return c->rx_mode == MCCL_RX_HEADER && c->rhdr_got == 0 && !c->ahead_stop && !c->rx_held &&
         c->fd >= 0 && !c->dead && mcclParkFits(&c->park, 0);
}

/* Report to `peer` what this rank's receives took from it (credit.taken, in a CREDIT frame: park.h),
 * unless the last report is still queued: progressRound reports the rest once that has left. The
 * frame goes at once when the queue is empty (as a small send does), else right behind the head
 * (which may be partly written; a held head is overtaken, nextSend). */
static void creditPost(mcclTransport* t, int peer) {
  mcclConn* c = &t->conns[peer];
  mcclSender* s = t->sender;
  mcclXfer* x = &c->credit_x;
  if (c->credit_queued) {
    if (!atomic_load(&x->complete)) return;
    c->credit_queued = 0;
  }
  if (c->fd < 0 || c->dead || atomic_load(&c->credit_lost)) return;
  memset(&x->frame, 0, sizeof(x->frame));
  x->frame.type = MCCL_FRAME_CREDIT;
  x->frame.seq = c->credit.taken;
  mcclFrameEncode(x->hdr, &x->frame);
  x->next = NULL;
  x->buf = NULL;
  x->bytes = x->done = 0;
  x->gate = NULL;
  x->ngate = 0;
  x->relay = NULL;
  x->admitted = 1;
  x->credit_wait = 0;
  x->t_credit = x->t_first = x->t_post = 0;
  atomic_store(&x->complete, 0);
  c->credit.reported = c->credit.taken;
  c->credit_queued = 1;
  if (t->trace) { /* the report's latency, to its grant in the peer's trace (python -m mccl.trace) */
    mcclTraceArgs a = {.coll = c->taken_coll, .seq = c->taken_seq, .bytes = c->credit.taken};
    int64_t now = mcclNowNs();
    mcclTraceSpan(t->trace, mcclTraceRecvTrack(peer), MCCL_TRACE_REPORT, now, now, &a);
  }
  if (s != NULL) pthread_mutex_lock(&s->mu);
  if (c->sq_head == NULL && (s == NULL || !s->halted || t->owner_writes)) {
    /* Nobody is writing this socket (an empty queue, and the lock): write it now. */
    ssize_t n;
    size_t offered;
    do n = frameWrite(c->fd, x, &offered);
    while (n < 0 && errno == EINTR);
    if (n > 0) x->done = (size_t)n;
    if (x->done == MCCL_FRAME_BYTES || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
      if (n < 0) atomic_store(&c->credit_lost, 1); /* as in connSend: not an error of its own */
      if (s != NULL) pthread_mutex_unlock(&s->mu);
      atomic_store(&x->complete, 1);
      c->credit_queued = 0;
      return;
    }
    c->send_midframe = x->done > 0;
  }
  if (c->sq_head == NULL) {
    c->sq_head = c->sq_tail = x;
  } else {
    x->next = c->sq_head->next;
    c->sq_head->next = x;
    if (c->sq_tail == c->sq_head) c->sq_tail = x;
  }
  if (s != NULL) {
    pthread_mutex_unlock(&s->mu);
    if (!t->owner_writes) pipeWake(s->wake[1], &s->wake_pending);
  }
}

/* A CREDIT frame from `peer`: its receives took f->seq bytes in all (park.h). */
static mcclResult_t creditArrived(mcclTransport* t, int peer, const mcclFrame* f) {
  mcclConn* c = &t->conns[peer];
  char why[200];
  if (mcclCreditGrant(&c->credit, f->seq, why, sizeof(why)) != 0) {
    snprintf(t->error, sizeof(t->error), "rank %d (%s) sent %s", peer, c->addr, why);
    return mcclProtocolError;
  }
  if (t->trace) {
    mcclTraceArgs a = {.bytes = f->seq};
    int64_t now = mcclNowNs();
    mcclTraceSpan(t->trace, mcclTraceSendTrack(peer), MCCL_TRACE_GRANT, now, now, &a);
  }
  /* A send held for credit sits in the sender thread's queues, which it stopped looking at. */
  if (t->sender != NULL && !t->owner_writes && c->credit.window > 0)
    pipeWake(t->sender->wake[1], &t->sender->wake_pending);
  return mcclSuccess;
}

/* The owner stops reading `peer` (it holds a frame it cannot place): reports from it cannot
 * arrive, so sends to it stop waiting for them (credit_blind, tcp.h). progressRound clears it
 * once the connection is read again. */
static void readerStops(mcclTransport* t, int peer) {
  mcclConn* c = &t->conns[peer];
  if (c->credit.window > 0 && !atomic_exchange(&c->credit_blind, 1) && t->sender != NULL)
    pipeWake(t->sender->wake[1], &t->sender->wake_pending);
}

/* `got` payload bytes of the receive `x` have landed (not all of them: recvDone says that). A
 * send relaying it (mcclTransportPostRelay) may forward them: the sender thread is woken, or the
 * owner writes them at the end of its round (relay_moved). */
static void relayLanded(mcclTransport* t, mcclXfer* x, size_t got) {
  atomic_store_explicit(&x->landed, got, memory_order_release);
  if (!x->gates_send) return;
  t->relay_moved = 1;
  if (t->sender != NULL && !t->owner_writes) pipeWake(t->sender->wake[1], &t->sender->wake_pending);
}

/* The head posted receive of `c` has all its bytes: complete it (the transport's last access
 * but for a send relaying it, which reads `landed` and the buffer until it completes itself),
 * and report what the receives took when a report is due. */
static void recvDone(mcclTransport* t, mcclConn* c) {
  mcclXfer* x = c->rq_head;
  const int wake = x->gates_send && t->sender != NULL && !t->owner_writes;
  atomic_store_explicit(&x->landed, x->bytes, memory_order_release);
  if (x->gates_send) t->relay_moved = 1;
  c->rq_head = x->next;
  if (c->rq_head == NULL) c->rq_tail = NULL;
  c->credit.taken += x->bytes;
  c->taken_coll = x->frame.coll;
  c->taken_seq = x->frame.seq;
  x->complete = 1;
  /* A send waiting for this receive sits in the sender thread's queues, which it stopped
   * looking at; without a thread, the owner's next round finds it sendable. */
  if (wake) pipeWake(t->sender->wake[1], &t->sender->wake_pending);
  if (mcclCreditDue(&c->credit)) creditPost(t, (int)(c - t->conns));
}

/* Is `got` a frame of the collective in progress (t->running) that says its sender issued another
 * collective in its place (mcclTransportCollectiveBegin)? Then `want` is the header it should
 * have had (with got's step, offset, length and count, which are not compared). */
static int otherCollective(const mcclTransport* t, const mcclFrame* got, mcclFrame* want) {
  if (t->running == 0 || got->type != MCCL_FRAME_DATA || got->seq != t->running - 1) return 0;
  *want = t->running_id;
  want->step = got->step;
  want->offset = got->offset;
  want->length = got->length;
  want->count = got->count;
  return mcclFrameMatch(got, want, NULL, 0) != MCCL_WIRE_OK;
}

/* A collective frame's header has arrived, whether or not its receive is posted: fail the
 * collective in progress with mcclMismatch if the frame says its sender issued another one. */
static mcclResult_t sameCollective(mcclTransport* t, int peer, const mcclFrame* got) {
  mcclFrame want;
  return otherCollective(t, got, &want) ? frameCheck(t, peer, got, &want) : mcclSuccess;
}

/* Must the peeked header `h` be read now, although nothing waits for it? A CREDIT frame, a
 * failure notice whose sender did not complete the collective in progress (it concerns that
 * collective, which mcclTransportSettle would fail anyway: read now, a rank blocked on another
 * blocked rank learns of it at once), and a frame of the collective in progress that says its
 * sender issued another collective (sameCollective fails it). A notice from a sender that
 * completed it (it failed a later one) waits, as between collectives. */
static int readNow(const mcclTransport* t, const uint8_t* h) {
  mcclFrame f, want;
  char why[300];
  if (h[4] == MCCL_FRAME_CREDIT) return 1;
  if (t->running == 0 || mcclFrameHeaderCheck(h, t->p2p.arrive != NULL, &f, why, sizeof(why)) != MCCL_WIRE_OK)
    return 0;
  return (f.type == MCCL_FRAME_ABORT && f.seq < t->running) || otherCollective(t, &f, &want);
}

/* Reading ahead: look at the next header without taking it, and take it only when it is a
 * collective frame that fits the park, or one that must be read now (readNow). Returns 1 when
 * c->rhdr now holds it, 0 when nothing may be read now (the socket is empty, or its next bytes
 * are not for the park: ahead_stop is set). */
static int aheadHeader(const mcclTransport* t, mcclConn* c) {
  ssize_t n;
  do n = recv(c->fd, c->rhdr, MCCL_FRAME_BYTES, MSG_PEEK | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
  int now = n == MCCL_FRAME_BYTES && readNow(t, c->rhdr); /* never parked */
  if (n != MCCL_FRAME_BYTES || mcclGet32(c->rhdr) != MCCL_WIRE_MAGIC ||
      (!now && (c->rhdr[4] != MCCL_FRAME_DATA || !mcclParkFits(&c->park, mcclGet32(c->rhdr + 32))))) {
    c->ahead_stop = 1; /* a close, an error, a partial header or another frame: its reader decides */
    return 0;
  }
  do n = recv(c->fd, c->rhdr, MCCL_FRAME_BYTES, MSG_DONTWAIT); /* the bytes just looked at */
  while (n < 0 && errno == EINTR);
  if (n != MCCL_FRAME_BYTES) {
    c->ahead_stop = 1;
    return 0;
  }
  return 1;
}

/* Start parking the collective frame whose header is c->rx_frame. Returns 0 when it cannot be
 * parked (no room, or no memory: it then waits for its receive, as without a park). */
static int parkStart(mcclTransport* t, int peer) {
  mcclConn* c = &t->conns[peer];
  if (!mcclParkFits(&c->park, c->rx_frame.length)) return 0;
  mcclParkedFrame* e = mcclParkPush(&c->park, &c->rx_frame);
  if (e == NULL) return 0;
  if (c->park.parked == 1) INFO(MCCL_SUB_NET, "rank %d: parking collective frames from rank %d that arrive before their receive, up to %zu bytes (MCCL_PARK_BYTES)",
                                t->rank, peer, c->park.cap);
  if (t->trace) e->t_first = mcclNowNs();
  c->rx_mode = MCCL_RX_PARK;
  c->rx_left = c->rx_frame.length;
  mcclParkSpan(&c->park, e, &c->rx_dst, &c->rx_room);
  return 1;
}

/* Give parked frames to the receives posted since, oldest first, each checked as a frame read
 * straight into its receive would be. A frame still arriving into the park goes on straight
 * into its receive's buffer. */
static mcclResult_t parkDrain(mcclTransport* t, int peer) {
  mcclConn* c = &t->conns[peer];
  mcclParkedFrame* e;
  int popped = 0;
  while (c->rq_head != NULL && (e = mcclParkHead(&c->park)) != NULL) {
    mcclXfer* x = c->rq_head;
    MCCLCHECK(frameCheck(t, peer, &e->frame, &x->frame));
    int arriving = c->rx_mode == MCCL_RX_PARK && c->park.qlen == 1;
    if (t->trace && x->t_first == 0) x->t_first = arriving ? e->t_first : mcclNowNs();
    mcclParkCopyOut(&c->park, e, x->buf, e->got);
    size_t got = e->got;
    mcclParkPop(&c->park);
    popped = 1;
    if (arriving) { /* the rest of its payload goes to the receive itself */
      if (got > 0) relayLanded(t, x, got);
      c->rx_mode = MCCL_RX_COLL;
      c->rx_dst = x->buf + got;
      c->rx_room = c->rx_left;
      break;
    }
    recvDone(t, c); /* (its arrival is in the trace already: a "park" span on this link's track) */
  }
  if (popped) c->ahead_stop = 0;
  return mcclSuccess;
}

/* A peer's ABORT frame was read, its reason as far as it arrived before the peer closed: fail
 * with it. */
static mcclResult_t abortArrived(mcclTransport* t, int peer) {
  mcclConn* c = &t->conns[peer];
  size_t have = (size_t)(c->rx_dst - c->abort_reason);
  c->abort_reason[have] = '\0';
  c->rx_mode = MCCL_RX_HEADER;
  c->rx_dst = NULL;
  c->rx_left = 0;
  c->dead = 1;
  snprintf(c->dead_reason, sizeof(c->dead_reason), "failed: %.140s", c->abort_reason);
  snprintf(t->error, sizeof(t->error), "rank %d (%s) failed: %s", peer, c->addr, c->abort_reason);
  return mcclRemoteError;
}

/* Ask the owner of the P2P frame being read where its next bytes go (see mcclP2pHooks.arrive).
 * An owner that holds the frame sets c->rx_held: nothing more is read from `peer` until a later
 * call of this function (progressRound asks at the start of every round) is answered otherwise. */
static mcclResult_t p2pRoom(mcclTransport* t, int peer) {
  mcclConn* c = &t->conns[peer];
  char why[300] = "";
  char* dst = NULL;
  size_t room = 0, done = c->rx_frame.length - c->rx_left;
  c->rx_held = 0;
  int rc = t->p2p.arrive(t->p2p.ctx, peer, &c->rx_frame, done, &dst, &room, why, sizeof(why));
  if (rc == MCCL_ARRIVE_HOLD) {
    c->rx_held = 1;
    c->rx_dst = NULL;
    c->rx_room = 0;
    readerStops(t, peer);
    return mcclSuccess;
  }
  if (rc == MCCL_ARRIVE_NOMEM) {
    snprintf(t->error, sizeof(t->error), "rank %d cannot take a point-to-point message from rank %d (%s): %s",
             t->rank, peer, c->addr, why);
    return mcclSystemError;
  }
  if (rc != MCCL_ARRIVE_OK) {
    snprintf(t->error, sizeof(t->error), "rank %d (%s) sent %s", peer, c->addr, why);
    return mcclProtocolError;
  }
  if (room > c->rx_left || (room == 0 && c->rx_left > 0)) {
    snprintf(t->error, sizeof(t->error), "internal: room for %zu bytes of a frame with %zu left", room, c->rx_left);
    return mcclInternalError;
  }
  c->rx_dst = dst;
  c->rx_room = room;
  return mcclSuccess;
}

/* mcclTransportWatchIn (tcp.h): the mark follows what the reader waits for. */
void mcclTransportWatchIn(mcclTransport* t, mcclConn* c, int any) {
  size_t want = 1;
  if (!any && t->lowat_max > 0) {
    if (c->rx_mode == MCCL_RX_HEADER) want = MCCL_FRAME_BYTES - c->rhdr_got;
    else if (c->rx_mode != MCCL_RX_PEEKED && !c->rx_held && c->rx_left > 0 && c->rx_room > 0) want = c->rx_room;
    if (want > (size_t)t->lowat_max) want = (size_t)t->lowat_max;
  }
  int v = (int)want;
  if (v == (c->rx_lowat > 0 ? c->rx_lowat : 1) || c->fd < 0) return;
  /* Linux caps the mark at half the receive buffer (and grows an autotuned one to hold it), macOS
   * at the buffer: a mark the window cannot fill is never set. The call fails only for a
   * descriptor that is no longer a live socket, whose poll and read then report that. */
  if (setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)) == 0) c->rx_lowat = v;
}

/* Read from `c` while someone wants its bytes and the socket has them. Frames arrive as a header
 * then a payload. Every header is checked first (mcclFrameHeaderCheck); then a DATA header is
 * matched against the head posted receive and its payload read straight into that receive's
 * buffer, a P2P header asks the owner where the payload goes, and an ABORT header's reason is
 * read (at most MCCL_MAX_ABORT_REASON bytes) before failing with it. No call blocks: a partial
 * header or payload waits in the connection's state for the next round. */
static mcclResult_t connRecv(mcclTransport* t, int peer) {
  mcclConn* c = &t->conns[peer];
  char sink[4096];
  for (;;) {
    int need = wanted(t, peer); /* else only reading ahead, into the park */
    if (!need && !readAhead(c)) break;
    const mcclFrame* what = c->rq_head ? &c->rq_head->frame : (c->rx_mode != MCCL_RX_HEADER ? &c->rx_frame : NULL);
    int reading = c->rx_mode == MCCL_RX_HEADER || (c->rx_mode != MCCL_RX_PEEKED && c->rx_left > 0);
    ssize_t n = 0;
    if (c->rx_mode == MCCL_RX_HEADER && c->rhdr_got == 0 && !need) {
      if (!aheadHeader(t, c)) {
        if (c->ahead_stop) readerStops(t, peer);
        return mcclSuccess;
      }
      n = MCCL_FRAME_BYTES;
    } else if (c->rx_mode == MCCL_RX_HEADER) {
      n = recv(c->fd, c->rhdr + c->rhdr_got, MCCL_FRAME_BYTES - c->rhdr_got, MSG_DONTWAIT);
    } else if (reading) {
      size_t want = c->rx_dst ? c->rx_room : (c->rx_room < sizeof(sink) ? c->rx_room : sizeof(sink));
      n = recv(c->fd, c->rx_dst ? c->rx_dst : sink, want, MSG_DONTWAIT);
    }
    if (reading) {
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return mcclSuccess;
        if (c->rx_mode == MCCL_RX_ABORT) return abortArrived(t, peer);
        return peerLost(t, peer, "receiving", what, errno);
      }
      if (n == 0) {
        if (c->rx_mode == MCCL_RX_ABORT) return abortArrived(t, peer);
        return peerLost(t, peer, "receiving", what, 0);
      }
    }
    if (c->rx_mode == MCCL_RX_HEADER) {
      c->rhdr_got += (size_t)n;
      if (c->rhdr_got < MCCL_FRAME_BYTES) continue;
      c->rhdr_got = 0;
      char why[300];
      if (mcclFrameHeaderCheck(c->rhdr, t->p2p.arrive != NULL, &c->rx_frame, why, sizeof(why)) != MCCL_WIRE_OK) {
        snprintf(t->error, sizeof(t->error), "rank %d (%s) sent %s", peer, c->addr, why);
        return mcclProtocolError;
      }
      MCCLCHECK(sameCollective(t, peer, &c->rx_frame)); /* (DATA frames of the collective in progress) */
      if (c->rx_frame.type == MCCL_FRAME_ABORT) {
        c->rx_mode = MCCL_RX_ABORT;
        c->rx_dst = c->abort_reason;
        c->rx_left = c->rx_frame.length < MCCL_MAX_ABORT_REASON ? c->rx_frame.length : MCCL_MAX_ABORT_REASON;
        c->rx_room = c->rx_left;
      } else if (c->rx_frame.type == MCCL_FRAME_P2P) {
        c->rx_mode = MCCL_RX_P2P;
        c->rx_left = c->rx_frame.length;
        MCCLCHECK(p2pRoom(t, peer));
        if (c->rx_held) return mcclSuccess;
      } else if (c->rx_frame.type == MCCL_FRAME_CREDIT) {
        MCCLCHECK(creditArrived(t, peer, &c->rx_frame));
        continue; /* a header alone: the next frame's header follows */
      } else if ((c->rq_head == NULL || c->park.qlen > 0) && parkStart(t, peer)) {
        /* no receive for it yet (or older frames are parked): into the park */
      } else {
        c->rx_mode = MCCL_RX_PEEKED;
        if (c->rq_head == NULL || c->park.qlen > 0) readerStops(t, peer);
      }
    } else if (reading) {
      if (c->rx_mode == MCCL_RX_COLL && t->trace && c->rq_head->t_first == 0) c->rq_head->t_first = mcclNowNs();
      if (c->rx_dst) c->rx_dst += n;
      c->rx_left -= (size_t)n;
      c->rx_room -= (size_t)n;
      if (c->rx_mode == MCCL_RX_COLL && c->rx_left > 0) relayLanded(t, c->rq_head, c->rq_head->bytes - c->rx_left);
      if (c->rx_mode == MCCL_RX_PARK) {
        mcclParkedFrame* e = mcclParkTail(&c->park);
        e->got += (size_t)n;
        if (c->rx_room == 0 && c->rx_left > 0) mcclParkSpan(&c->park, e, &c->rx_dst, &c->rx_room); /* wraps */
      }
      if (c->rx_mode == MCCL_RX_P2P && c->rx_room == 0 && c->rx_left > 0) {
        MCCLCHECK(p2pRoom(t, peer));
        if (c->rx_held) return mcclSuccess;
      }
    }
    if (c->rx_mode == MCCL_RX_PEEKED) {
      /* wait for the algorithm to post its receive (behind the parked frames' receives) */
      if (c->rq_head == NULL || c->park.qlen > 0) return mcclSuccess;
      MCCLCHECK(frameCheck(t, peer, &c->rx_frame, &c->rq_head->frame));
      c->rx_mode = MCCL_RX_COLL;
      c->rx_dst = c->rq_head->buf;
      c->rx_left = c->rq_head->bytes;
      c->rx_room = c->rx_left;
    }
    if (c->rx_left > 0) continue;
    if (c->rx_mode == MCCL_RX_COLL) {
      if (t->trace) traceXfer(t, mcclTraceRecvTrack(peer), MCCL_TRACE_RECV_WAIT, MCCL_TRACE_RECV, c->rq_head);
      recvDone(t, c);
    } else if (c->rx_mode == MCCL_RX_P2P) {
      t->p2p.landed(t->p2p.ctx, peer, &c->rx_frame);
    } else if (c->rx_mode == MCCL_RX_ABORT) {
      return abortArrived(t, peer);
    } else if (c->rx_mode == MCCL_RX_PARK && t->trace) { /* its bytes' arrival, on the wire's track */
      mcclParkedFrame* e = mcclParkTail(&c->park);
      mcclTraceArgs a = {.coll = e->frame.coll, .step = e->frame.step, .seq = e->frame.seq,
                         .offset = e->frame.offset, .bytes = e->frame.length};
      mcclTraceSpan(t->trace, mcclTraceRecvTrack(peer), MCCL_TRACE_PARK, e->t_first, mcclNowNs(), &a);
    }
    c->rx_mode = MCCL_RX_HEADER;
    c->rx_dst = NULL;
  }
  return mcclSuccess;
}

static void describeStall(mcclTransport* t) {
  mcclSender* snd = t->sender; /* its lock keeps the queues' heads in place while read */
  for (int r = 0; r < t->nranks; r++) {
    mcclConn* c = &t->conns[r];
    if (c->fd >= 0 || c->dead || r == t->rank || (c->rq_head == NULL && c->sq_head == NULL)) continue;
    char why[400];
    mcclConnectorDescribe(t, r, why, sizeof(why));
    snprintf(t->error, sizeof(t->error), "timed out: rank %d needs a connection to rank %d (%s), which it does "
             "not have: %s", t->rank, r, c->addr, why);
    return;
  }
  for (int r = 0; r < t->nranks; r++) {
    mcclConn* c = &t->conns[r];
    char desc[200];
    if (c->rq_head != NULL) {
      mcclFrameDescribe(c->rx_mode == MCCL_RX_COLL ? &c->rx_frame : &c->rq_head->frame, desc, sizeof(desc));
      snprintf(t->error, sizeof(t->error),
               "timed out: rank %d was waiting for rank %d (%s) to send %s; that rank is "
               "stalled, slower than the timeout, issued different collectives, or is itself "
               "waiting for another rank (see that rank's error)",
               t->rank, r, c->addr, desc);
      return;
    }
  }
  if (snd != NULL) pthread_mutex_lock(&snd->mu);
  const int writer = snd == NULL || t->owner_writes; /* else the sender thread writes (sendable) */
  int found = 0;
  for (int r = 0; r < t->nranks && !found; r++) {
    mcclConn* c = &t->conns[r];
    char desc[200];
    if (creditHeld(c, writer)) {
      mcclFrameDescribe(&c->sq_head->frame, desc, sizeof(desc));
      snprintf(t->error, sizeof(t->error),
               "timed out: rank %d was waiting for rank %d (%s) to take %s: its receives have not "
               "taken the %llu bytes sent before it (credit, MCCL_CREDITS); that rank is stalled or "
               "issued different collectives", t->rank, r, c->addr, desc,
               (unsigned long long)(atomic_load(&c->credit.sent) - atomic_load(&c->credit.granted)));
      found = 1;
    } else if (sendable(c, writer)) { /* a gated send waits for this rank's own receives, described above */
      mcclXfer* before;
      mcclXfer* x = !headHeld(c) ? c->sq_head : overtakerBehind(c, &before);
      mcclFrameDescribe(&x->frame, desc, sizeof(desc));
      snprintf(t->error, sizeof(t->error),
               "timed out: rank %d was waiting for rank %d (%s) to read %s: it stopped reading; "
               "that rank is stalled or issued different collectives",
               t->rank, r, c->addr, desc);
      found = 1;
    }
  }
  if (snd != NULL) pthread_mutex_unlock(&snd->mu);
  if (!found) snprintf(t->error, sizeof(t->error), "timed out");
}

/* The owner writes `peer`'s queue (no sender thread, or it is halted) until the socket is full;
 * a write error marks the connection dead and fails the round. */
static mcclResult_t ownerSend(mcclTransport* t, int peer) {
  int err_no = 0;
  if (connSend(t, peer, t->error, sizeof(t->error), &err_no) >= 0) return mcclSuccess;
  connLost(&t->conns[peer], err_no);
  return mcclRemoteError;
}

static mcclResult_t progressRound(mcclTransport* t, int64_t deadline_ns, atomic_int* abort_flag) {
  mcclSender* snd = t->sender;
  if (snd != NULL && atomic_load(&snd->failed)) return senderFailed(t);
  if (t->p2p.round != NULL) MCCLCHECK(t->p2p.round(t->p2p.ctx));
  int ready = 0;
  /* A P2P frame its owner held (a budget was full): ask again, since the round may have freed
   * room, posted its receive, or posted a collective receive that must not wait behind it. */
  for (int r = 0; r < t->nranks; r++) {
    mcclConn* c = &t->conns[r];
    if (!c->rx_held || c->dead) continue;
    MCCLCHECK(p2pRoom(t, r));
    if (!c->rx_held) {
      MCCLCHECK(connRecv(t, r));
      ready = 1;
    }
  }
  /* Receives posted since the last round take the parked frames first. A header read earlier
   * and held for lack of a posted receive (or of park room) needs no poll once one is posted,
   * or once the park has room for it: its bytes are already here (an empty frame has no more). */
  for (int r = 0; r < t->nranks; r++) {
    mcclConn* c = &t->conns[r];
    if (c->park.qlen > 0 && c->rq_head != NULL) {
      MCCLCHECK(parkDrain(t, r));
      ready = 1;
    }
    if (c->rx_mode == MCCL_RX_PEEKED && c->rq_head != NULL && c->park.qlen == 0) {
      MCCLCHECK(connRecv(t, r));
      ready = 1;
    } else if (c->rx_mode == MCCL_RX_PEEKED && c->rq_head == NULL && parkStart(t, r)) {
      MCCLCHECK(connRecv(t, r));
      ready = 1;
    }
  }
  /* Credits (park.h): a report that waited for the last one to leave goes now; and a connection
   * this round will not read cannot deliver reports, so sends to that peer stop waiting for them
   * (credit_blind), while one it reads again brings them back under the credit. */
  for (int r = 0; r < t->nranks; r++) {
    mcclConn* c = &t->conns[r];
    if (r == t->rank || c->fd < 0 || c->dead) continue;
    if (mcclCreditDue(&c->credit)) creditPost(t, r);
    if (c->credit.window == 0) continue;
    int blind = !(wanted(t, r) || readAhead(c));
    if (atomic_exchange(&c->credit_blind, blind) != blind && blind && snd != NULL)
      pipeWake(snd->wake[1], &snd->wake_pending);
  }
  /* With a sender thread, queued sends are its to write: this thread only waits for their
   * completions (its wake pipe) while any are queued. Sends held for credit keep the round
   * busy: it reads their connection for the report. In a copy-only schedule without the
   * handoff (owner_writes) this thread writes them, as without a sender thread. */
  if (t->owner_writes) snd = NULL;
  if (snd != NULL) {
    pthread_mutex_lock(&snd->mu);
    for (int r = 0; r < t->nranks; r++)
      snd->owner_queued[r] = sendable(&t->conns[r], 0) ? 1 : creditHeld(&t->conns[r], 0) ? 2 : 0;
    pthread_mutex_unlock(&snd->mu);
  }
  int np = 0, busy = 0;
  for (int r = 0; r < t->nranks; r++) {
    mcclConn* c = &t->conns[r];
    if (r == t->rank) continue;
    int need = wanted(t, r), wr = snd != NULL ? snd->owner_queued[r] == 1 : sendable(c, 1);
    int held = snd != NULL ? snd->owner_queued[r] == 2 : creditHeld(c, 1);
    int rd = need || readAhead(c);
    if (!rd && !wr && !held) continue;
    busy |= need || wr || held;
    if (c->fd < 0 && !c->dead && t->connector != NULL) {
      MCCLCHECK(mcclConnectorWant(t, r, wr || held)); /* the transfers wait for the connection */
      continue;
    }
    if (c->fd < 0 || c->dead) {
      snprintf(t->error, sizeof(t->error), "rank %d (%s) is no longer connected (%s)", r, c->addr,
               c->dead ? c->dead_reason : "never connected");
      return mcclRemoteError;
    }
    short events = (short)((rd ? POLLIN : 0) | (wr && snd == NULL ? POLLOUT : 0));
    if (events == 0) continue;
    if (rd) mcclTransportWatchIn(t, c, 0);
    t->pfds[np].fd = c->fd;
    t->pfds[np].events = events;
    t->pfd_peer[np] = r;
    np++;
  }
  /* Reading ahead alone keeps nobody waiting: with nothing posted the round is idle. */
  t->idle = !busy;
  if (t->idle) return mcclSuccess;
  int64_t now = mcclNowNs();
  int64_t wait_ms = (deadline_ns - now + 999999) / 1000000;
  if (wait_ms > 1000) wait_ms = 1000; /* re-check the abort flag at least once a second */
  int nconn = np;
  if (t->connector != NULL) MCCLCHECK(mcclConnectorPollAdd(t, t->pfds, &np, &wait_ms));
  if (wait_ms < 0 || ready) wait_ms = 0;
  t->pfds[np].fd = t->wake[0];
  t->pfds[np].events = POLLIN;
  t->pfds[np].revents = 0;
  int n = poll(t->pfds, (nfds_t)np + 1, (int)wait_ms);
  if (abort_flag != NULL && atomic_load(abort_flag)) {
    snprintf(t->error, sizeof(t->error), "the communicator was aborted");
    return mcclAborted;
  }
  if (n < 0) {
    if (errno == EINTR) return mcclSuccess;
    snprintf(t->error, sizeof(t->error), "poll() failed: %s", strerror(errno));
    return mcclSystemError;
  }
  if (n == 0) {
    if (!ready && mcclNowNs() >= deadline_ns) {
      describeStall(t);
      return mcclTimeout;
    }
    return mcclSuccess;
  }
  if (t->pfds[np].revents & POLLIN) pipeDrain(t->wake[0], &t->wake_pending);
  if (t->connector != NULL) MCCLCHECK(mcclConnectorHandle(t, t->pfds, nconn, np));
  for (int k = 0; k < nconn; k++) {
    short re = t->pfds[k].revents;
    if (re == 0) continue;
    int peer = t->pfd_peer[k];
    if (re & (POLLIN | POLLERR | POLLHUP)) MCCLCHECK(connRecv(t, peer));
    if (snd == NULL && (re & (POLLOUT | POLLERR | POLLHUP))) MCCLCHECK(ownerSend(t, peer));
  }
  /* Bytes just read that relaying sends may forward (mcclTransportPostRelay) go now, rather than
   * after another poll: that is the hop's latency a cut-through chain saves. */
  if (snd == NULL && t->relay_moved) {
    t->relay_moved = 0;
    for (int r = 0; r < t->nranks; r++) {
      mcclConn* c = &t->conns[r];
      mcclXfer* h = c->sq_head;
      if (h == NULL || h->relay == NULL || c->fd < 0 || c->dead || !sendable(c, 1)) continue;
      MCCLCHECK(ownerSend(t, r));
    }
  }
  return mcclSuccess;
}

/* The owner halts the sender thread (it stops at the end of its pass) or lets it go on. */
static void senderSetHalted(mcclSender* s, int halted) {
  pthread_mutex_lock(&s->mu);
  s->halted = halted;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pipeWake(s->wake[1], &s->wake_pending);
}

mcclResult_t mcclTransportProgress(mcclTransport* t, int64_t deadline_ns, atomic_int* abort_flag) {
  mcclSender* snd = t->sender;
  if (snd != NULL && snd->halted && !t->owner_writes) senderSetHalted(snd, 0); /* only this thread writes `halted` */
  mcclResult_t res = progressRound(t, deadline_ns, abort_flag);
  /* The caller unwinds on an error, and the transfers it posted go with its frames. */
  if (res != mcclSuccess) mcclTransportHalt(t);
  return res;
}

/* The owner takes the writing over (on = 1: the sender thread halted, as it may be mid-frame, the
 * owner resumes that frame from x->done as the thread would have) or hands it back (0; -1 after
 * an error: the thread stays halted, mcclTransportHalt's contract, the posted transfers are going
 * away). Handing back lets the thread take the queues at once, credit reports queued behind the
 * last frame included, rather than at the next collective's first progress round. */
static void ownerWrites(mcclTransport* t, int on) {
  if (on > 0) {
    mcclTransportHalt(t);
    t->owner_writes = 1;
    return;
  }
  t->owner_writes = 0;
  if (on == 0) senderSetHalted(t->sender, 0);
}

void mcclTransportCopySchedule(mcclTransport* t, int on, size_t frame_bytes) {
  if (t->sender == NULL) return;
  if (on > 0) {
    if (t->owner_writes || t->copy_handoff || frame_bytes < t->inline_max) return;
    ownerWrites(t, 1);
    t->copy_owned = 1;
    return;
  }
  if (!t->copy_owned) return; /* the load rule's writes, or the thread's: not this schedule's */
  t->copy_owned = 0;
  ownerWrites(t, on);
}

/* The load rule's window: at least this much wall time of measured collectives per decision, and
 * collectives from this size up (smaller ones are latency-bound and their frames mostly written
 * inline anyway: postSend). */
enum { kLoadWindowNs = 50 * 1000000, kLoadMinBytes = 1 << 20 };

/* The load rule's part of mcclTransportCollectiveBegin. */
static void loadBegin(mcclTransport* t, size_t bytes, int overlap) {
  t->load_t0 = 0;
  if (t->sender == NULL || t->load_pct == 0) return;
  if (overlap) { /* not measured: the thread writes it whatever the load */
    if (t->owner_writes && !t->copy_owned && bytes >= t->inline_max) { /* (smaller: written inline anyway) */
      ownerWrites(t, 0);
      t->load_lent = 1;
      t->load_lends++;
    }
    return;
  }
  if (t->load_pct > 0 && bytes < kLoadMinBytes) return;
  t->load_cpu0 = mcclThreadCpuNs() + atomic_load(&t->sender->cpu_ns);
  t->load_t0 = mcclNowNs();
}

mcclResult_t mcclTransportCollectiveBegin(mcclTransport* t, const mcclFrame* id, size_t bytes, int overlap) {
  t->running = id->seq + 1;
  t->running_id = *id;
  loadBegin(t, bytes, overlap);
  for (int r = 0; r < t->nranks; r++) {
    mcclConn* c = &t->conns[r];
    /* Links that stopped reading ahead (at a notice between collectives or from a later one, or
     * at a frame the park could not take) look again: it may concern this collective. */
    c->ahead_stop = 0;
    /* Frames of this collective that arrived before it began (read ahead while idle, or a header
     * held for its receive) are checked now, as those arriving from now on will be. */
    for (int i = 0; i < c->park.qlen; i++) MCCLCHECK(sameCollective(t, r, &mcclParkAt(&c->park, i)->frame));
    if (c->rx_mode == MCCL_RX_PEEKED) MCCLCHECK(sameCollective(t, r, &c->rx_frame));
  }
  return mcclSuccess;
}

int mcclLoadRuleWant(int helped, int64_t pct, int load_pct, int* low) {
  if (!helped) {
    *low = 0;
    return pct >= load_pct;
  }
  /* Hysteresis in level: the handoff itself costs CPU (a wake-up each way per frame), so the
   * threads' load while helped is compared against 70% of the bound. And in time: a window that
   * straddles the start of other collectives (their first iterations, the ranks' skew: wall time
   * with little CPU) reads low, so the writing goes back only after two such windows in a row.
   * On 8 emulated hosts at 10 Gbit/s one low window was enough to hand back 6-11 times per
   * invocation, at 29-59% where the steady state with the thread writing is 64-87%
   * (bench/NOTES.md, 2026-12-07, tenth session). */
  *low = pct * 10 < (int64_t)load_pct * 7 ? *low + 1 : 0;
  return *low < 2;
}

void mcclTransportCollectiveEnd(mcclTransport* t, mcclResult_t res) {
  mcclSender* s = t->sender;
  t->running = 0;
  if (t->load_lent) { /* back to the owner (after an error too: the thread stays halted then) */
    t->load_lent = 0;
    if (s != NULL) ownerWrites(t, 1);
    return;
  }
  if (t->load_t0 == 0 || s == NULL || res != mcclSuccess) return; /* an error fails the communicator */
  int64_t wall = mcclNowNs() - t->load_t0;
  t->load_wall += wall;
  t->load_cpu += mcclThreadCpuNs() + atomic_load(&s->cpu_ns) - t->load_cpu0;
  t->load_t0 = 0;
  const int helped = !t->owner_writes;
  int want = !helped; /* MCCL_SEND_THREAD_LOAD=-1: every measured collective changes hands */
  int64_t pct = -1;
  if (t->load_pct > 0) {
    if (t->load_wall < kLoadWindowNs) return;
    pct = t->load_cpu * 100 / t->load_wall;
    want = mcclLoadRuleWant(helped, pct, t->load_pct, &t->load_low);
  }
  if (want != helped) {
    ownerWrites(t, want ? 0 : 1);
    t->load_flips++;
    if (pct >= 0)
      INFO(MCCL_SUB_NET, "rank %d: %s used %lld%% of a core over %.0f ms of collectives (MCCL_SEND_THREAD_LOAD=%d): "
           "frames now written by %s", t->rank, helped ? "mccl-engine and mccl-send" : "mccl-engine",
           (long long)pct, (double)t->load_wall / 1e6, t->load_pct, want ? "mccl-send" : "mccl-engine");
  }
  t->load_wall = t->load_cpu = 0;
}

void mcclTransportHalt(mcclTransport* t) {
  mcclSender* s = t->sender;
  if (s == NULL) return;
  senderSetHalted(s, 1);
  pthread_mutex_lock(&s->mu);
  while (s->busy) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

void mcclTransportIdleWait(mcclTransport* t, int timeout_ms) {
  struct pollfd pf = {t->wake[0], POLLIN, 0};
  if (t->wake[0] >= 0 && poll(&pf, 1, timeout_ms) > 0) pipeDrain(t->wake[0], &t->wake_pending);
}

void mcclTransportCancel(mcclTransport* t) {
  mcclSender* s = t->sender;
  mcclTransportHalt(t); /* off the queues until the next progress round */
  if (s != NULL) pthread_mutex_lock(&s->mu);
  for (int r = 0; r < t->nranks; r++) {
    t->conns[r].sq_head = t->conns[r].sq_tail = NULL;
    t->conns[r].rq_head = t->conns[r].rq_tail = NULL;
    t->conns[r].credit_queued = 0; /* its report went with the queue */
  }
  if (s != NULL) pthread_mutex_unlock(&s->mu);
}

void mcclTransportWake(mcclTransport* t) { pipeWake(t->wake[1], &t->wake_pending); }

mcclResult_t mcclTransportReadAhead(mcclTransport* t, int timeout_ms, int* polled) {
  *polled = 0;
  int np = 0;
  for (int r = 0; r < t->nranks; r++) {
    mcclConn* c = &t->conns[r];
    if (r == t->rank || c->fd < 0 || c->dead || c->rq_head != NULL) continue;
    if (!readAhead(c) && c->rx_mode != MCCL_RX_PARK) continue; /* (a frame half parked: its rest) */
    mcclTransportWatchIn(t, c, 0);
    t->pfds[np].fd = c->fd;
    t->pfds[np].events = POLLIN;
    t->pfd_peer[np] = r;
    np++;
  }
  /* With runtime connection the listener and the handshakes are served too: a peer that dials
   * this idle rank (for a point-to-point send, say) is not kept waiting for its next collective. */
  int nconn = np;
  int64_t wait_ms = timeout_ms;
  if (t->connector != NULL) MCCLCHECK(mcclConnectorPollAdd(t, t->pfds, &np, &wait_ms));
  if (np == 0 || t->wake[0] < 0) return mcclSuccess;
  *polled = 1;
  t->pfds[np].fd = t->wake[0];
  t->pfds[np].events = POLLIN;
  t->pfds[np].revents = 0;
  int n = poll(t->pfds, (nfds_t)np + 1, (int)wait_ms);
  if (n <= 0) return mcclSuccess; /* nothing came, or a signal: the owner looks at its queue again */
  if (t->pfds[np].revents & POLLIN) pipeDrain(t->wake[0], &t->wake_pending);
  if (t->connector != NULL) MCCLCHECK(mcclConnectorHandle(t, t->pfds, nconn, np));
  for (int k = 0; k < nconn; k++)
    if (t->pfds[k].revents != 0) MCCLCHECK(connRecv(t, t->pfd_peer[k]));
  return mcclSuccess;
}


mcclResult_t mcclTransportTakeCredits(mcclTransport* t, int peer) {
  mcclConn* c = &t->conns[peer];
  while (c->fd >= 0 && !c->dead && c->rx_mode == MCCL_RX_HEADER) {
    uint8_t h[MCCL_FRAME_BYTES];
    size_t have = c->rhdr_got; /* a header partly read already */
    memcpy(h, c->rhdr, have);
    ssize_t n;
    do n = recv(c->fd, h + have, MCCL_FRAME_BYTES - have, MSG_PEEK | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    mcclFrame f;
    if (n <= 0 || have + (size_t)n < MCCL_FRAME_BYTES || h[4] != MCCL_FRAME_CREDIT ||
        mcclFrameHeaderCheck(h, t->p2p.arrive != NULL, &f, NULL, 0) != MCCL_WIRE_OK)
      return mcclSuccess; /* anything else is the reader's (a broken header it reports itself) */
    do n = recv(c->fd, h + have, MCCL_FRAME_BYTES - have, MSG_DONTWAIT); /* the bytes looked at */
    while (n < 0 && errno == EINTR);
    c->rhdr_got = 0;
    MCCLCHECK(creditArrived(t, peer, &f));
  }
  return mcclSuccess;
}
