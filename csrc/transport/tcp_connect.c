/* tcp_connect.c: opening the TCP mesh (layer "transport"): listening, dialling and accepting with
 * retries, the authenticated hello of every connection, strangers closed, descriptors' limits named.
 * The data path is tcp.c; failure notices, settling and closing are tcp_fail.c. */
#include "transport/tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/debug.h"
#include "core/param.h"
#include "core/trace.h"
#include "core/platform.h"

/* ---- connection setup ------------------------------------------------------------------- */

/* PEND_CLAIMED: an incoming connection whose valid hello claims a rank that another connection
 * claimed first (claimedTwice); kept, unanswered, until the failure tells it why. */
enum { PEND_CONNECTING, PEND_SEND, PEND_RECV, PEND_CLAIMED };

typedef struct {
  int fd;
  int peer;      /* outgoing: the rank dialled; incoming: -1 until its hello is read */
  int outgoing;
  int ask;       /* outgoing to a higher rank: only its MCCL_HELLO_KIND_ASK is sent, then it closes */
  int state;
  uint8_t buf[MCCL_HELLO_BYTES];
  size_t done;
  int64_t since_ns; /* incoming: when accepted */
  char addr[MCCL_ADDR_STRLEN];
} mcclPending;

/* The room for the last reason a dial to each rank failed, for the timeout's message. */
#define MCCL_WHY_BYTES 320

struct mcclConnector {
  int listen_fd;                    /* owned; accepted connections come from here */
  mcclTransportAuth auth;
  int cap;                          /* pending slots: [0, nranks) the dial to each lower rank, or the
                                       ask to each higher one (slot == its rank), [nranks, cap)
                                       accepted connections that have not finished their hello */
  mcclPending* pend;
  int live;                         /* slots holding a socket */
  int64_t* retry_at;                /* [nranks] when a failed dial is tried again, or a higher rank
                                       is asked to dial (0: none due) */
  int64_t* asked_ns;                /* [nranks] when each higher rank was last asked (0: never) */
  int retries;                      /* entries of retry_at that are set */
  int* refused;                     /* [nranks] dials refused in a row */
  char (*last_why)[MCCL_WHY_BYTES]; /* [nranks] why the last dial to each rank failed */
  int* slot_of;                     /* [cap + 1] pollfd entry - first -> slot (-1: the listener) */
  int runtime;                      /* init is over: dials start on demand and refusals count */
  int64_t stranger_since;           /* strangerWarn's window: when it began (0: none yet) */
  int stranger_logged, stranger_quiet; /* its lines logged, and connections left unlogged */
  char needs[400];                  /* descriptorNeeds, for the messages of descriptor limits */
};

/* With every slot for unauthenticated connections taken, the one that has waited longest for its
 * hello (at least this long) makes room: idle strangers cannot lock ranks out. */
#define PENDING_EVICT_AFTER_MS 200

#define MAX_PENDING_INCOMING 256

/* The handshake's expectations of this rank (wire.c checks them). */
static int connectedRank(const void* ctx, int rank) {
  const mcclTransport* t = ctx;
  return t->conns[rank].fd >= 0;
}

static mcclWireStatus helloCheck(const mcclTransport* t, const mcclTransportAuth* auth,
                                 const uint8_t* buf, int expect_kind, int expect_rank,
                                 mcclHello* h, char* why, size_t cap) {
  mcclHelloExpect e;
  memset(&e, 0, sizeof(e));
  memcpy(e.token, auth->token, MCCL_TOKEN_BYTES);
  e.generation = auth->generation;
  e.comm_hash = auth->comm_hash;
  e.rank = t->rank;
  e.nranks = t->nranks;
  e.kind = expect_kind;
  e.peer = expect_rank;
  e.connected = connectedRank;
  e.ctx = t;
  e.runtime = t->connector != NULL && t->connector->runtime;
  return mcclHelloCheck(buf, &e, h, why, cap);
}

/* The hello (or ack, or READY) that rank `from` sends to rank `target`. */
static void helloMakeFrom(const mcclTransport* t, const mcclTransportAuth* auth, int kind, int from, int target,
                          uint8_t* out) {
  mcclHello h;
  memset(&h, 0, sizeof(h));
  h.version = MCCL_PROTOCOL_VERSION;
  h.kind = (uint16_t)kind;
  memcpy(h.token, auth->token, MCCL_TOKEN_BYTES);
  h.generation = auth->generation;
  h.comm_hash = auth->comm_hash;
  h.rank = (uint32_t)from;
  h.nranks = (uint16_t)t->nranks;
  h.target = (uint16_t)target;
  mcclHelloEncode(out, &h);
}

static void helloMake(const mcclTransport* t, const mcclTransportAuth* auth, int kind, int target,
                      uint8_t* out) {
  helloMakeFrom(t, auth, kind, t->rank, target, out);
}

/* How long a failed dial waits before the next attempt. */
#define MCCL_REDIAL_MS 50

/* Start a non-blocking connect to `addr_text` for `p`. Returns 0, or -1 with why[cap] saying what
 * failed and with errno's text, and with *fatal set when waiting cannot cure it (a descriptor limit
 * or another resource error of socket() or connect(); an address that does not parse). */
static int dial(mcclPending* p, const char* addr_text, char* why, size_t cap, int* fatal) {
  *fatal = 0;
  mcclSockaddr addr;
  if (mcclSockaddrParse(addr_text, &addr) != 0) {
    snprintf(why, cap, "its published address '%s' is not a numeric host:port", addr_text);
    *fatal = 1;
    return -1;
  }
  int fd = mcclSocketOpen(addr.sa.sa_family);
  if (fd < 0) {
    int err = errno;
    char text[MCCL_WHY_BYTES];
    mcclSocketErrorText(err, text, sizeof(text));
    snprintf(why, cap, "socket(): %s", text);
    *fatal = mcclSocketResourceError(err);
    return -1;
  }
  if (mcclSocketTune(fd) != 0) {
    int err = errno;
    close(fd);
    snprintf(why, cap, "setting socket options: %s", strerror(err));
    return -1;
  }
  int rc = connect(fd, &addr.sa, mcclSockaddrLen(&addr));
  if (rc != 0 && errno != EINPROGRESS && errno != EINTR) { /* EINTR: it goes on in the background */
    int err = errno;
    close(fd);
    snprintf(why, cap, "connect(): %s", strerror(err));
    *fatal = mcclSocketResourceError(err);
    return -1;
  }
  p->fd = fd;
  p->state = PEND_CONNECTING;
  p->done = 0;
  return 0;
}

/* What a group of this size holds open on each rank, for the messages of descriptor limits. */
static void descriptorNeeds(const mcclTransport* t, char* out, size_t cap) {
  snprintf(out, cap,
           "a communicator of %d ranks keeps up to %d descriptors open on each rank (%d connections and "
           "two wake-up pipes) and one more, its listening socket, while it initialises, besides the "
           "descriptors of the bootstrap store and the rest of the process (docs/FAILURES.md, "
           "\"Descriptors\"); raise the limit (ulimit -n) or start fewer ranks per process",
           t->nranks, t->nranks - 1 + 4, t->nranks - 1);
}

/* accept() errors that mean only that one connection went away before it was accepted (Linux
 * passes pending network errors of the new socket on this way): take the next one. */
static int acceptRetry(int err) {
  switch (err) {
    case EINTR:
    case ECONNABORTED:
    case EPROTO:
    case EPERM: /* a firewall rule refused this connection */
    case ENETDOWN:
    case ENETUNREACH:
    case EHOSTDOWN:
    case EHOSTUNREACH:
    case ENOPROTOOPT:
    case EOPNOTSUPP:
    case ETIMEDOUT:
      return 1;
    default:
      return 0;
  }
}

/* At most this many connections are accepted in one pass, so that no error a kernel keeps
 * returning can make the loop spin without polling. */
#define MCCL_ACCEPTS_PER_PASS 64


/* The memory and the wake pipe of a transport with no connections yet. */
static mcclResult_t transportAlloc(mcclTransport* t, int rank, int nranks) {
  memset(t, 0, sizeof(*t));
  t->rank = rank;
  t->nranks = nranks;
  t->wake[0] = t->wake[1] = -1;
  t->conns = calloc((size_t)nranks, sizeof(mcclConn));
  size_t npoll = (size_t)nranks + 1 + (size_t)mcclConnectorMaxPoll(nranks);
  t->pfds = calloc(npoll, sizeof(struct pollfd));
  t->pfd_peer = calloc(npoll, sizeof(int));
  if (!t->conns || !t->pfds || !t->pfd_peer) {
    snprintf(t->error, sizeof(t->error), "out of memory setting up %d connections", nranks);
    return mcclSystemError;
  }
  size_t park = mcclParkBytes();
  t->lowat_max = (int)mcclParamInt("MCCL_RECV_LOWAT");
  t->inline_max = (size_t)mcclParamInt("MCCL_SEND_INLINE_BYTES");
  t->copy_handoff = (int)mcclParamInt("MCCL_SEND_THREAD_COPY");
  t->load_pct = mcclThreadCpuNs() < 0 ? 0 : (int)mcclParamInt("MCCL_SEND_THREAD_LOAD");
  for (int r = 0; r < nranks; r++) {
    t->conns[r].fd = -1;
    t->conns[r].park.cap = park;
    mcclCreditInit(&t->conns[r].credit, park);
  }
  if (pipe(t->wake) != 0) {
    snprintf(t->error, sizeof(t->error), "pipe() failed: %s", strerror(errno));
    return mcclSystemError;
  }
  fcntl(t->wake[0], F_SETFL, O_NONBLOCK);
  fcntl(t->wake[1], F_SETFL, O_NONBLOCK);
  fcntl(t->wake[0], F_SETFD, FD_CLOEXEC);
  fcntl(t->wake[1], F_SETFD, FD_CLOEXEC);
  return mcclSuccess;
}

/* A peer's connection ended while the mesh was being confirmed: its init failed. The store
 * (`watch`) has its reason, published before it closed. */
/* Every MCCL_INIT_WATCH_MS while the mesh opens: has another rank given up on this init? 1 with
 * its reason in t->error, else 0. */
static int watchSaysFailed(mcclTransport* t, const mcclTransportWatch* watch, int64_t now, int64_t* next_watch) {
  if (watch == NULL || watch->failed == NULL || now < *next_watch) return 0;
  *next_watch = now + MCCL_INIT_WATCH_MS * 1000000LL;
  char why[sizeof(t->error)];
  if (!watch->failed(watch->ctx, why, sizeof(why))) return 0;
  snprintf(t->error, sizeof(t->error), "%s", why);
  return 1;
}

static mcclResult_t readyLost(mcclTransport* t, const mcclTransportWatch* watch, int peer, int err) {
  char why[sizeof(t->error)];
  if (watch != NULL && watch->failed != NULL && watch->failed(watch->ctx, why, sizeof(why))) {
    snprintf(t->error, sizeof(t->error), "%s", why);
  } else {
    snprintf(t->error, sizeof(t->error), "rank %d (%s) %s before every rank had opened its connections: its "
             "init failed (see that rank's error)", peer, t->conns[peer].addr,
             err == 0 ? "closed its connection" : strerror(err));
  }
  return mcclRemoteError;
}

/* The last step of opening the mesh. A rank whose own connections are all open may not return
 * yet: a peer may still fail its init (a descriptor limit while it accepts the others, say), and
 * the communicators of the ranks that returned could not work. So every rank sends READY on every
 * connection once its own mesh is open, and returns once every peer's READY has arrived (one
 * message each way, no round trip more than the slowest rank's mesh). A peer that closes instead
 * failed, and the store says why; `watch` is also polled while waiting. */
static mcclResult_t meshReady(mcclTransport* t, const mcclTransportAuth* auth, const mcclTransportWatch* watch,
                              int64_t deadline_ns) {
  int n = t->nranks;
  uint8_t(*out)[MCCL_HELLO_BYTES] = calloc((size_t)n, MCCL_HELLO_BYTES);
  uint8_t(*in)[MCCL_HELLO_BYTES] = calloc((size_t)n, MCCL_HELLO_BYTES);
  size_t* moved = calloc((size_t)n * 2, sizeof(size_t)); /* [sent | received] bytes per peer */
  mcclResult_t res = mcclSuccess;
  if (out == NULL || in == NULL || moved == NULL) {
    snprintf(t->error, sizeof(t->error), "out of memory confirming %d connections", n);
    res = mcclSystemError;
    goto done;
  }
  size_t *sent = moved, *got = moved + n;
  int left = 0;
  for (int r = 0; r < n; r++)
    if (r != t->rank) {
      helloMakeFrom(t, auth, MCCL_HELLO_KIND_READY, t->rank, r, out[r]);
      left += 2;
    }
  int64_t next_watch = mcclNowNs() + MCCL_INIT_WATCH_MS * 1000000LL;
  while (left > 0) {
    int np = 0;
    for (int r = 0; r < n; r++) {
      if (r == t->rank) continue;
      short ev = (short)((sent[r] < MCCL_HELLO_BYTES ? POLLOUT : 0) | (got[r] < MCCL_HELLO_BYTES ? POLLIN : 0));
      if (ev == 0) continue;
      t->pfds[np].fd = t->conns[r].fd;
      t->pfds[np].events = ev;
      t->pfds[np].revents = 0;
      t->pfd_peer[np++] = r;
    }
    int64_t now = mcclNowNs();
    if (now >= deadline_ns) {
      char missing[300] = "";
      size_t len = 0;
      for (int k = 0; k < np && len + 20 < sizeof(missing); k++)
        if (got[t->pfd_peer[k]] < MCCL_HELLO_BYTES)
          len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%d", len ? ", " : "", t->pfd_peer[k]);
      snprintf(t->error, sizeof(t->error), "timed out: rank %d (%s) opened all its connections, but rank %s did "
               "not say it had opened all of its own (see their errors)", t->rank, t->self_addr, missing);
      res = mcclTimeout;
      goto done;
    }
    if (watchSaysFailed(t, watch, now, &next_watch)) {
      res = mcclRemoteError;
      goto done;
    }
    int64_t wait_ms = (deadline_ns - now) / 1000000LL;
    if (wait_ms > 50) wait_ms = 50;
    /* The listener too: every peer is linked, so a valid hello now claims a linked rank (an
     * impostor that connected first, tcp_connect.c claimedTwice) and fails the mesh, naming both. */
    const int nlinks = np;
    if ((res = mcclConnectorPollAdd(t, t->pfds, &np, &wait_ms)) != mcclSuccess) goto done;
    if (wait_ms < 1) wait_ms = 1;
    if (poll(t->pfds, (nfds_t)np, (int)wait_ms) < 0 && errno != EINTR) {
      snprintf(t->error, sizeof(t->error), "poll() failed: %s", strerror(errno));
      res = mcclSystemError;
      goto done;
    }
    if ((res = mcclConnectorHandle(t, t->pfds, nlinks, np)) != mcclSuccess) goto done;
    np = nlinks;
    for (int k = 0; k < np; k++) {
      int r = t->pfd_peer[k], fd = t->conns[r].fd;
      short re = t->pfds[k].revents;
      if (re == 0) continue;
      if (sent[r] < MCCL_HELLO_BYTES && (re & (POLLOUT | POLLERR | POLLHUP))) {
        ssize_t w = send(fd, out[r] + sent[r], MCCL_HELLO_BYTES - sent[r], MCCL_MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0 && (sent[r] += (size_t)w) == MCCL_HELLO_BYTES) left--;
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          res = readyLost(t, watch, r, errno);
          goto done;
        }
      }
      if (got[r] < MCCL_HELLO_BYTES && (re & (POLLIN | POLLERR | POLLHUP))) {
        ssize_t m = recv(fd, in[r] + got[r], MCCL_HELLO_BYTES - got[r], MSG_DONTWAIT);
        if (m == 0 || (m < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          res = readyLost(t, watch, r, m == 0 ? 0 : errno);
          goto done;
        }
        if (m > 0 && (got[r] += (size_t)m) == MCCL_HELLO_BYTES) {
          uint8_t want[MCCL_HELLO_BYTES];
          helloMakeFrom(t, auth, MCCL_HELLO_KIND_READY, r, t->rank, want);
          if (memcmp(want, in[r], MCCL_HELLO_BYTES) != 0) {
            snprintf(t->error, sizeof(t->error), "rank %d (%s) sent something other than READY after its "
                     "handshake", r, t->conns[r].addr);
            res = mcclProtocolError;
            goto done;
          }
          left--;
        }
      }
    }
  }
done:
  free(out);
  free(in);
  free(moved);
  return res;
}

mcclResult_t mcclTransportFromFds(mcclTransport* t, int rank, int nranks, const int* fds) {
  mcclResult_t res = transportAlloc(t, rank, nranks);
  if (res != mcclSuccess) return res;
  for (int r = 0; r < nranks; r++) {
    snprintf(t->conns[r].addr, sizeof(t->conns[r].addr), "fd %d", fds[r]);
    if (r == rank || fds[r] < 0) continue;
    if (mcclSocketTune(fds[r]) != 0) {
      int flags = fcntl(fds[r], F_GETFL, 0); /* not TCP (a socketpair): non-blocking is enough */
      if (flags < 0 || fcntl(fds[r], F_SETFL, flags | O_NONBLOCK) != 0) {
        snprintf(t->error, sizeof(t->error), "fd %d: %s", fds[r], strerror(errno));
        return mcclSystemError;
      }
    }
    t->conns[r].fd = fds[r];
  }
  snprintf(t->self_addr, sizeof(t->self_addr), "self");
  return mcclSuccess;
}

/* ---- the connector ----------------------------------------------------------------------- */


/* Refusals in a row after which a dial during collectives fails (MCCL_REDIAL_MS apart): nothing
 * listens at the peer's address any more (tcp.h, mcclTransportInit). */
#define MCCL_REFUSALS_FATAL 3

int mcclConnectorMaxPoll(int nranks) { return nranks + MAX_PENDING_INCOMING + 1; }

static void slotClose(mcclConnector* k, mcclPending* p) {
  if (p->fd < 0) return;
  close(p->fd);
  p->fd = -1;
  k->live--;
}

/* The slot's socket became a link: it is the transport's now. If the peer has one already (its
 * NOTICE came in while this rank's dial to it was under way), the later one is closed. */
static void slotAdopt(mcclTransport* t, mcclPending* p) {
  if (t->conns[p->peer].fd >= 0) {
    slotClose(t->connector, p);
    return;
  }
  mcclTransportAdopt(t, p->peer, p->fd);
  p->fd = -1;
  t->connector->live--;
}

static void retryLater(mcclConnector* k, int peer, int64_t after_ms) {
  if (k->retry_at[peer] == 0) k->retries++;
  k->retry_at[peer] = mcclNowNs() + after_ms * 1000000LL;
}

/* An attempt on `p` failed for a reason that may pass: a dial is retried shortly; an ask is made
 * again by mcclConnectorWant while the link is wanted, without the wait between asks. */
static void attemptFailed(mcclConnector* k, const mcclPending* p) {
  if (p->ask) k->asked_ns[p->peer] = 0;
  else retryLater(k, p->peer, MCCL_REDIAL_MS);
}

/* Connections closed before their handshake (strangers, a flood, a listener out of slots) are
 * logged one by one up to STRANGER_LINES per STRANGER_WINDOW_MS, then counted: the first line of
 * the next window (or the connector's end) says how many went unlogged. */
#define STRANGER_LINES 8
#define STRANGER_WINDOW_MS 10000

static void strangerQuietReport(mcclTransport* t, mcclConnector* k) {
  if (k->stranger_quiet > 0)
    WARN("rank %d: %d more connections were closed before their handshake in %.1f s (not logged one by one)",
         t->rank, k->stranger_quiet, (double)(mcclNowNs() - k->stranger_since) / 1e9);
  k->stranger_quiet = 0;
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void strangerWarn(mcclTransport* t, mcclConnector* k, const char* fmt, ...) {
  int64_t now = mcclNowNs();
  if (k->stranger_since == 0 || now - k->stranger_since >= STRANGER_WINDOW_MS * 1000000LL) {
    strangerQuietReport(t, k);
    k->stranger_since = now;
    k->stranger_logged = 0;
  }
  if (k->stranger_logged >= STRANGER_LINES) {
    k->stranger_quiet++;
    return;
  }
  char line[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  k->stranger_logged++;
  if (k->stranger_logged == STRANGER_LINES)
    WARN("rank %d: %s (more such lines in this %d s window are only counted)", t->rank, line,
         STRANGER_WINDOW_MS / 1000);
  else
    WARN("rank %d: %s", t->rank, line);
}

static mcclResult_t connectorOpen(mcclTransport* t, int listen_fd, const mcclTransportAuth* auth) {
  mcclConnector* k = calloc(1, sizeof(*k));
  int n = t->nranks;
  if (k != NULL) {
    k->cap = n + MAX_PENDING_INCOMING;
    k->pend = calloc((size_t)k->cap, sizeof(mcclPending));
    k->retry_at = calloc((size_t)n, sizeof(int64_t));
    k->asked_ns = calloc((size_t)n, sizeof(int64_t));
    k->refused = calloc((size_t)n, sizeof(int));
    k->last_why = calloc((size_t)n, sizeof(*k->last_why));
    k->slot_of = calloc((size_t)k->cap + 1, sizeof(int));
  }
  if (k == NULL || !k->pend || !k->retry_at || !k->asked_ns || !k->refused || !k->last_why || !k->slot_of) {
    if (k != NULL) {
      free(k->pend);
      free(k->retry_at);
      free(k->asked_ns);
      free(k->refused);
      free(k->last_why);
      free(k->slot_of);
      free(k);
    }
    if (listen_fd >= 0) close(listen_fd);
    snprintf(t->error, sizeof(t->error), "out of memory setting up %d connections", n);
    return mcclSystemError;
  }
  for (int i = 0; i < k->cap; i++) k->pend[i].fd = -1;
  k->listen_fd = listen_fd;
  k->auth = *auth;
  descriptorNeeds(t, k->needs, sizeof(k->needs));
  t->connector = k;
  return mcclSuccess;
}

void mcclConnectorFree(mcclTransport* t) {
  mcclConnector* k = t->connector;
  if (k == NULL) return;
  strangerQuietReport(t, k);
  for (int i = 0; i < k->cap; i++) slotClose(k, &k->pend[i]);
  if (k->listen_fd >= 0) close(k->listen_fd);
  free(k->pend);
  free(k->retry_at);
  free(k->asked_ns);
  free(k->refused);
  free(k->last_why);
  free(k->slot_of);
  free(k);
  t->connector = NULL;
}

void mcclTransportForgetDescriptors(mcclTransport* t) {
  if (t->conns != NULL)
    for (int r = 0; r < t->nranks; r++)
      if (t->conns[r].fd >= 0) {
        close(t->conns[r].fd);
        t->conns[r].fd = -1;
      }
  for (int k = 0; k < 2; k++)
    if (t->wake[k] >= 0) {
      close(t->wake[k]);
      t->wake[k] = -1;
    }
  mcclConnector* c = t->connector;
  if (c == NULL) return;
  for (int i = 0; i < c->cap; i++)
    if (c->pend[i].fd >= 0) {
      close(c->pend[i].fd);
      c->pend[i].fd = -1;
    }
  if (c->listen_fd >= 0) close(c->listen_fd);
  c->listen_fd = -1;
}

int mcclTransportConnected(const mcclTransport* t) {
  int n = 0;
  for (int r = 0; r < t->nranks; r++) n += r != t->rank && t->conns[r].fd >= 0;
  return n;
}

/* Dial lower rank `r` now, or higher rank `r` to ask it to dial (MCCL_HELLO_KIND_ASK). A failure
 * that may pass schedules a retry of a dial (an ask is made again while the link is wanted,
 * mcclConnectorWant); the others fail. */
static mcclResult_t startDial(mcclTransport* t, int r) {
  mcclConnector* k = t->connector;
  mcclPending* p = &k->pend[r];
  if (k->retry_at[r] != 0) k->retries--;
  k->retry_at[r] = 0;
  p->peer = r;
  p->outgoing = 1;
  p->ask = r > t->rank;
  if (p->ask) k->asked_ns[r] = mcclNowNs();
  snprintf(p->addr, sizeof(p->addr), "%s", t->conns[r].addr);
  int fatal = 0;
  if (dial(p, t->conns[r].addr, k->last_why[r], sizeof(k->last_why[r]), &fatal) == 0) {
    k->live++;
    return mcclSuccess;
  }
  if (!fatal) {
    attemptFailed(k, p);
    return mcclSuccess;
  }
  snprintf(t->error, sizeof(t->error), "rank %d (%s) cannot dial rank %d at %s: %s; %s", t->rank, t->self_addr, r,
           t->conns[r].addr, k->last_why[r], k->needs);
  return strncmp(k->last_why[r], "its published", 13) == 0 ? mcclInvalidArgument : mcclSystemError;
}

/* A higher rank that this rank has a send for and that has not dialled within this long is asked
 * to (MCCL_HELLO_KIND_ASK); while the send waits, asked again after MCCL_ASK_AGAIN_MS. The higher
 * rank of a pair dials when it needs the lower one, so the ask matters only where it does not: it
 * issued another collective that needs nothing from this rank, whose frames then show the mismatch
 * when the link opens (or it is late, and the ask only opens the link sooner). A receive alone
 * asks nothing: a higher rank that sends to this one dials it. */
#define MCCL_ASK_AFTER_MS 50
#define MCCL_ASK_AGAIN_MS 1000

mcclResult_t mcclConnectorWant(mcclTransport* t, int peer, int sending) {
  mcclConnector* k = t->connector;
  if (t->conns[peer].fd >= 0) return mcclSuccess;
  if (k->pend[peer].fd >= 0 || k->retry_at[peer] != 0) return mcclSuccess; /* under way, or due */
  if (peer < t->rank) return startDial(t, peer);
  if (!sending) return mcclSuccess;
  int64_t after_ms = MCCL_ASK_AFTER_MS;
  if (k->asked_ns[peer] != 0) { /* at least MCCL_ASK_AGAIN_MS after the last ask */
    const int64_t again_ms = (k->asked_ns[peer] - mcclNowNs()) / 1000000LL + MCCL_ASK_AGAIN_MS;
    if (again_ms > after_ms) after_ms = again_ms;
  }
  retryLater(k, peer, after_ms);
  return mcclSuccess;
}

mcclResult_t mcclConnectorPollAdd(mcclTransport* t, struct pollfd* pfds, int* np, int64_t* wait_ms) {
  mcclConnector* k = t->connector;
  if (k->retries > 0) {
    int64_t now = mcclNowNs();
    for (int r = 0; r < t->nranks; r++) {
      int64_t at = k->retry_at[r];
      if (at == 0) continue;
      if (t->conns[r].fd >= 0) { /* linked meanwhile (its NOTICE, or its dial): nothing to do */
        k->retry_at[r] = 0;
        k->retries--;
        continue;
      }
      if (now >= at) {
        MCCLCHECK(startDial(t, r));
        continue;
      }
      int64_t ms = (at - now + 999999) / 1000000;
      if (ms < *wait_ms) *wait_ms = ms;
    }
  }
  int first = *np, e = first;
  if (k->listen_fd >= 0) {
    pfds[e].fd = k->listen_fd;
    pfds[e].events = POLLIN;
    pfds[e].revents = 0;
    k->slot_of[e++ - first] = -1;
  }
  for (int i = 0; i < k->cap && k->live > 0; i++) {
    mcclPending* p = &k->pend[i];
    if (p->fd < 0) continue;
    pfds[e].fd = p->fd;
    pfds[e].events = p->state == PEND_RECV ? POLLIN : POLLOUT;
    pfds[e].revents = 0;
    k->slot_of[e++ - first] = i;
  }
  *np = e;
  return mcclSuccess;
}

/* Take every connection waiting on the listener into a slot of its own, for its hello. */
static mcclResult_t acceptAll(mcclTransport* t) {
  mcclConnector* k = t->connector;
  for (int a = 0; a < MCCL_ACCEPTS_PER_PASS; a++) {
    mcclSockaddr from;
    socklen_t fromlen = sizeof(from.ss);
    int fd = mcclSocketAccept(k->listen_fd, &from.sa, &fromlen);
    if (fd < 0) {
      int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      if (acceptRetry(err)) continue;
      /* The connection stays queued, so the listener stays readable: polling again would spin
       * until the deadline. A descriptor limit does not lift while this rank waits. */
      char text[MCCL_WHY_BYTES];
      mcclSocketErrorText(err, text, sizeof(text));
      snprintf(t->error, sizeof(t->error), "rank %d (%s) cannot accept the connections of its peers: "
               "accept(): %s; %s", t->rank, t->self_addr, text, k->needs);
      return mcclSystemError;
    }
    int slot = -1, oldest = -1;
    for (int i = t->nranks; i < k->cap && slot < 0; i++) {
      if (k->pend[i].fd < 0) slot = i;
      else if (oldest < 0 || k->pend[i].since_ns < k->pend[oldest].since_ns) oldest = i;
    }
    char text[MCCL_ADDR_STRLEN];
    mcclSockaddrFormat(&from, text, sizeof(text));
    if (slot < 0 && oldest >= 0 && mcclNowNs() - k->pend[oldest].since_ns >= PENDING_EVICT_AFTER_MS * 1000000LL) {
      strangerWarn(t, k, "closed connection from %s: no hello after %.1f s while more connections wait",
           k->pend[oldest].addr, (double)(mcclNowNs() - k->pend[oldest].since_ns) / 1e9);
      slotClose(k, &k->pend[oldest]);
      slot = oldest;
    }
    if (slot < 0) {
      strangerWarn(t, k, "refused connection from %s: too many unauthenticated connections", text);
      close(fd);
      continue;
    }
    if (mcclSocketTune(fd) != 0) {
      strangerWarn(t, k, "closed connection from %s: setting its socket options failed: %s", text,
           strerror(errno));
      close(fd);
      continue;
    }
    mcclPending* p = &k->pend[slot];
    memset(p, 0, sizeof(*p));
    p->fd = fd;
    p->peer = -1;
    p->state = PEND_RECV;
    p->since_ns = mcclNowNs();
    snprintf(p->addr, sizeof(p->addr), "%s", text);
    k->live++;
  }
  return mcclSuccess;
}

/* A second connection whose hello carries the job's token claims `rank`, which another connection
 * (from `first`, NULL: the rank's link) claimed already. A rank dials a peer again only after its
 * last connection to it failed, so one of the two is not that rank: a process that read the token
 * from the rendezvous store (docs/FAILURES.md), or a second copy of the rank. Which one is real
 * cannot be told, and the first may have delivered frames already: the communicator fails, on
 * every rank (the ABORT), and the second claimant hears why (mcclConnectorTellClaimants). */
static mcclResult_t claimedTwice(mcclTransport* t, mcclPending* p, int rank, const char* first) {
  char linked[MCCL_ADDR_STRLEN] = "?";
  if (first == NULL) {
    mcclSockaddr a;
    socklen_t len = sizeof(a.ss);
    if (getpeername(t->conns[rank].fd, &a.sa, &len) == 0) mcclSockaddrFormat(&a, linked, sizeof(linked));
    first = linked;
  }
  p->peer = rank;
  p->state = PEND_CLAIMED;
  snprintf(t->error, sizeof(t->error), "rank %d: two connections with the job token claim to be rank %d, from %s "
           "(first) and from %s: one of them is not rank %d (a process that read the token from the rendezvous "
           "store, or rank %d started twice), and this rank cannot tell which, so the communicator fails",
           t->rank, rank, first, p->addr, rank, rank);
  return mcclProtocolError;
}

/* One step of a slot's handshake, its socket being ready for it. */
static mcclResult_t pendingStep(mcclTransport* t, mcclPending* p) {
  mcclConnector* k = t->connector;
  char why[160];
  const char* reject = NULL;
  if (p->state == PEND_CLAIMED) return mcclSuccess;
  if (p->state == PEND_CONNECTING) {
    int err = 0;
    socklen_t el = sizeof(err);
    getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err != 0) {
      int peer = p->peer;
      snprintf(k->last_why[peer], sizeof(k->last_why[0]), "connect(): %s", strerror(err));
      slotClose(k, p);
      if (k->runtime && err == ECONNREFUSED && ++k->refused[peer] >= MCCL_REFUSALS_FATAL) {
        snprintf(t->error, sizeof(t->error), "rank %d (%s) refused rank %d's connection %d times in a row: "
                 "nothing listens there any more, so its communicator is gone (its process exited, or its "
                 "communicator failed or was destroyed; see that rank's error)", peer, t->conns[peer].addr,
                 t->rank, k->refused[peer]);
        return mcclRemoteError;
      }
      attemptFailed(k, p);
      return mcclSuccess;
    }
    k->refused[p->peer] = 0;
    helloMake(t, &k->auth, p->ask ? MCCL_HELLO_KIND_ASK : MCCL_HELLO_KIND_HELLO, p->peer, p->buf);
    p->state = PEND_SEND;
    p->done = 0;
  }
  if (p->state == PEND_SEND) {
    ssize_t w = send(p->fd, p->buf + p->done, MCCL_HELLO_BYTES - p->done, MCCL_MSG_NOSIGNAL);
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return mcclSuccess;
    if (w <= 0) {
      reject = strerror(errno);
    } else if ((p->done += (size_t)w) == MCCL_HELLO_BYTES) {
      if (p->ask) { /* nothing answers an ask: the peer dials back */
        INFO(MCCL_SUB_INIT, "rank %d: asked rank %d at %s to connect to it", t->rank, p->peer, p->addr);
        slotClose(k, p);
      } else if (p->outgoing) {
        p->state = PEND_RECV;
        p->done = 0;
      } else { /* ack sent: the incoming connection is established */
        INFO(MCCL_SUB_INIT, "rank %d: accepted rank %d from %s", t->rank, p->peer, p->addr);
        slotAdopt(t, p);
      }
    }
  } else if (p->state == PEND_RECV) {
    ssize_t r = recv(p->fd, p->buf + p->done, MCCL_HELLO_BYTES - p->done, 0);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return mcclSuccess;
    if (r <= 0) {
      reject = r == 0 ? "closed before finishing the handshake" : strerror(errno);
    } else if ((p->done += (size_t)r) == MCCL_HELLO_BYTES) {
      mcclHello h;
      mcclWireStatus st = helloCheck(t, &k->auth, p->buf, p->outgoing ? MCCL_HELLO_KIND_ACK : MCCL_HELLO_KIND_HELLO,
                                     p->peer, &h, why, sizeof(why));
      if (st == MCCL_WIRE_DUPLICATE && !p->outgoing && h.kind == MCCL_HELLO_KIND_HELLO)
        return claimedTwice(t, p, (int)h.rank, NULL);
      if (st != MCCL_WIRE_OK) reject = why;
      if (reject == NULL && p->outgoing) {
        INFO(MCCL_SUB_INIT, "rank %d: connected to rank %d at %s", t->rank, p->peer, p->addr);
        slotAdopt(t, p);
      } else if (reject == NULL && h.kind == MCCL_HELLO_KIND_ASK) {
        INFO(MCCL_SUB_INIT, "rank %d: rank %u (%s) asked it to connect", t->rank, h.rank, p->addr);
        slotClose(k, p);
        return mcclConnectorWant(t, (int)h.rank, 0); /* a lower rank: dialled now, unless linked or under way */
      } else if (reject == NULL && h.kind == MCCL_HELLO_KIND_NOTICE) {
        p->peer = (int)h.rank; /* its ABORT frame follows: the link reads it (wire.h) */
        INFO(MCCL_SUB_INIT, "rank %d: rank %d (%s) connected to say it failed", t->rank, p->peer, p->addr);
        slotAdopt(t, p);
      } else if (reject == NULL) {
        for (int i = t->nranks; i < k->cap; i++) /* a hello for this rank acked but not yet adopted */
          if (&k->pend[i] != p && k->pend[i].fd >= 0 && k->pend[i].peer == (int)h.rank)
            return claimedTwice(t, p, (int)h.rank, k->pend[i].addr);
        p->peer = (int)h.rank;
        helloMake(t, &k->auth, MCCL_HELLO_KIND_ACK, p->peer, p->buf);
        p->state = PEND_SEND;
        p->done = 0;
      }
    }
  }
  if (reject != NULL) {
    if (p->outgoing) {
      snprintf(k->last_why[p->peer], sizeof(k->last_why[0]), "%s", reject);
      INFO(MCCL_SUB_INIT, "rank %d: handshake with rank %d at %s failed (%s); retrying", t->rank, p->peer, p->addr,
           reject);
      slotClose(k, p);
      retryLater(k, p->peer, 100);
    } else {
      strangerWarn(t, k, "rejected connection from %s: %s", p->addr, reject);
      slotClose(k, p);
    }
  }
  return mcclSuccess;
}

mcclResult_t mcclConnectorHandle(mcclTransport* t, const struct pollfd* pfds, int first, int np) {
  mcclConnector* k = t->connector;
  for (int e = first; e < np; e++) {
    if (pfds[e].revents == 0) continue;
    int slot = k->slot_of[e - first];
    if (slot < 0) {
      MCCLCHECK(acceptAll(t));
      continue;
    }
    mcclPending* p = &k->pend[slot];
    if (p->fd != pfds[e].fd) continue; /* evicted above; the slot holds a newer connection */
    MCCLCHECK(pendingStep(t, p));
  }
  return mcclSuccess;
}

void mcclConnectorDescribe(const mcclTransport* t, int peer, char* out, size_t cap) {
  const mcclConnector* k = t->connector;
  if (k == NULL) {
    snprintf(out, cap, "it never connected");
  } else if (peer > t->rank && k->asked_ns[peer] != 0) {
    snprintf(out, cap, "it has not connected to this rank, which last asked it to %.1f s ago (the higher rank "
             "of a pair dials): it is stalled or busy outside the library, or exited",
             (double)(mcclNowNs() - k->asked_ns[peer]) / 1e9);
  } else if (peer > t->rank) {
    snprintf(out, cap, "it has not connected to this rank (the higher rank of a pair dials, asked to by the "
             "lower one if that needs it first)%s%s", k->last_why[peer][0] ? "; asking it failed: " : "",
             k->last_why[peer]);
  } else if (k->pend[peer].fd >= 0) {
    snprintf(out, cap, "this rank's connection to it is open but its handshake is unanswered: that rank is "
             "stalled or busy outside the library%s%s", k->last_why[peer][0] ? "; an earlier dial: " : "",
             k->last_why[peer]);
  } else {
    snprintf(out, cap, "this rank's dials to it failed: %s", k->last_why[peer][0] ? k->last_why[peer] : "not yet dialled");
  }
}

mcclResult_t mcclTransportInit(mcclTransport* t, int rank, int nranks, int listen_fd,
                               char (*peer_addrs)[MCCL_ADDR_STRLEN], const mcclTransportAuth* auth,
                               const mcclTransportWatch* watch, int64_t deadline_ns, int runtime_connect) {
  mcclResult_t res = transportAlloc(t, rank, nranks);
  if (res != mcclSuccess) {
    if (listen_fd >= 0) close(listen_fd);
    return res;
  }
  for (int r = 0; r < nranks; r++)
    snprintf(t->conns[r].addr, sizeof(t->conns[r].addr), "%s", peer_addrs[r]);
  snprintf(t->self_addr, sizeof(t->self_addr), "%s", peer_addrs[rank]);
  if (nranks < 2) {
    if (listen_fd >= 0) close(listen_fd);
    return mcclSuccess;
  }
  MCCLCHECK(connectorOpen(t, listen_fd, auth));
  mcclConnector* k = t->connector;
  if (runtime_connect) {
    k->runtime = 1;
    INFO(MCCL_SUB_INIT, "rank %d: connects to its peers when it first needs them (MCCL_RUNTIME_CONNECT)", rank);
    return mcclSuccess;
  }
  /* The eager mesh: a dial to every lower rank; dials that fail for a reason waiting can cure
   * are retried; the others end init now, naming the cause. */
  for (int r = 0; r < rank; r++)
    if ((res = startDial(t, r)) != mcclSuccess) goto done;
  int64_t next_watch = mcclNowNs() + MCCL_INIT_WATCH_MS * 1000000LL;
  while (mcclTransportConnected(t) < nranks - 1) {
    int64_t now = mcclNowNs();
    if (watchSaysFailed(t, watch, now, &next_watch)) {
      res = mcclRemoteError;
      goto done;
    }
    if (now >= deadline_ns) {
      char missing[600] = "";
      size_t len = 0;
      for (int r = 0; r < nranks && len + 100 < sizeof(missing); r++) {
        if (r == rank || t->conns[r].fd >= 0) continue;
        const char* why = r < rank ? k->last_why[r] : "";
        len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%d (%s%s%s)", len ? ", " : "", r,
                                peer_addrs[r], why[0] ? ": " : "", why);
      }
      snprintf(t->error, sizeof(t->error), "timed out connecting rank %d (%s) to its peers; still missing rank %s",
               rank, t->self_addr, missing);
      res = mcclTimeout;
      goto done;
    }
    int64_t wait_ms = (deadline_ns - now) / 1000000LL;
    if (wait_ms > 50) wait_ms = 50;
    int np = 0;
    if ((res = mcclConnectorPollAdd(t, t->pfds, &np, &wait_ms)) != mcclSuccess) goto done;
    if (wait_ms < 1) wait_ms = 1;
    int n = poll(t->pfds, (nfds_t)np, (int)wait_ms);
    if (n < 0 && errno != EINTR) {
      snprintf(t->error, sizeof(t->error), "poll() failed: %s", strerror(errno));
      res = mcclSystemError;
      goto done;
    }
    if (n > 0 && (res = mcclConnectorHandle(t, t->pfds, 0, np)) != mcclSuccess) goto done;
  }
  res = meshReady(t, auth, watch, deadline_ns);
done:
  mcclConnectorFree(t); /* the mesh is complete (or failed): nobody else may connect */
  return res;
}

void mcclConnectorFailing(mcclTransport* t) {
  mcclConnector* k = t->connector;
  if (k == NULL) return;
  for (int i = 0; i < k->cap; i++) {
    mcclPending* p = &k->pend[i];
    if (p->fd < 0) continue;
    /* A dial whose hello is out may be its peer's link already (it adopts it as it acks). */
    if (p->outgoing && p->state == PEND_RECV && t->conns[p->peer].fd < 0) slotAdopt(t, p);
    else if (!(k->runtime && p->state == PEND_CLAIMED)) slotClose(k, p);
  }
}

/* A hello (a NOTICE, or an ACK) and then the ABORT frame (`hdr`, `len` bytes of reason), in one
 * non-blocking write: 0 when all of it went, else -1. */
static int helloAndAbort(int fd, const uint8_t hello[MCCL_HELLO_BYTES], const uint8_t* hdr, const char* reason,
                         size_t len) {
  struct iovec iov[3] = {{(void*)hello, MCCL_HELLO_BYTES}, {(void*)hdr, MCCL_FRAME_BYTES}, {(void*)reason, len}};
  struct msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = iov;
  msg.msg_iovlen = 3;
  ssize_t n = sendmsg(fd, &msg, MCCL_MSG_NOSIGNAL | MSG_DONTWAIT);
  return n == (ssize_t)(MCCL_HELLO_BYTES + MCCL_FRAME_BYTES + len) ? 0 : -1;
}

void mcclConnectorTellClaimants(mcclTransport* t, const uint8_t* hdr, const char* reason, size_t len) {
  mcclConnector* k = t->connector;
  if (k == NULL) return;
  for (int i = t->nranks; i < k->cap; i++) {
    mcclPending* p = &k->pend[i];
    if (p->fd < 0 || p->state != PEND_CLAIMED) continue;
    uint8_t ack[MCCL_HELLO_BYTES];
    helloMake(t, &k->auth, MCCL_HELLO_KIND_ACK, p->peer, ack);
    (void)helloAndAbort(p->fd, ack, hdr, reason, len); /* a fresh socket's buffer takes it */
    shutdown(p->fd, SHUT_WR); /* its hello was read whole: closing sends no reset */
    slotClose(k, p);
  }
}

int mcclConnectorListener(const mcclTransport* t) {
  return t->connector != NULL ? t->connector->listen_fd : -1;
}

void mcclConnectorCloseWaiting(mcclTransport* t) {
  mcclConnector* k = t->connector;
  for (int a = 0; a < MCCL_ACCEPTS_PER_PASS && k != NULL && k->listen_fd >= 0; a++) {
    int fd = mcclSocketAccept(k->listen_fd, NULL, NULL);
    if (fd >= 0) close(fd);
    else if (!acceptRetry(errno)) break; /* nothing waiting (EAGAIN), or a listener error */
  }
}

int mcclConnectorNoticeDial(mcclTransport* t, int peer) {
  mcclPending p;
  memset(&p, 0, sizeof(p));
  p.fd = -1;
  char why[MCCL_WHY_BYTES];
  int fatal = 0;
  return dial(&p, t->conns[peer].addr, why, sizeof(why), &fatal) == 0 ? p.fd : -1;
}

int mcclConnectorNoticeSend(mcclTransport* t, int fd, int peer, const uint8_t* hdr, const char* reason,
                            size_t len) {
  int err = 0;
  socklen_t el = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) return -1;
  uint8_t hello[MCCL_HELLO_BYTES];
  helloMake(t, &t->connector->auth, MCCL_HELLO_KIND_NOTICE, peer, hello);
  return helloAndAbort(fd, hello, hdr, reason, len);
}
