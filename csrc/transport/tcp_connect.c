/* tcp_connect.c: opening the TCP mesh (layer "transport"): listening, dialling and accepting with
 * retries, the authenticated hello of every connection, strangers closed, descriptors' limits named.
 * The data path is tcp.c; failure notices, settling and closing are tcp_fail.c. */
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

/* ---- connection setup ------------------------------------------------------------------- */

enum { PEND_CONNECTING, PEND_SEND, PEND_RECV };

typedef struct {
  int fd;
  int peer;      /* outgoing: the rank dialled; incoming: -1 until its hello is read */
  int outgoing;
  int state;
  uint8_t buf[MCCL_HELLO_BYTES];
  size_t done;
  int64_t since_ns; /* incoming: when accepted */
  char addr[MCCL_ADDR_STRLEN];
} mcclPending;

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

/* The room for the last reason a dial to each rank failed, for the timeout's message. */
#define MCCL_WHY_BYTES 320

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

static void pendingClose(mcclPending* p) {
  if (p->fd >= 0) close(p->fd);
  p->fd = -1;
}

/* The memory and the wake pipe of a transport with no connections yet. */
static mcclResult_t transportAlloc(mcclTransport* t, int rank, int nranks) {
  memset(t, 0, sizeof(*t));
  t->rank = rank;
  t->nranks = nranks;
  t->wake[0] = t->wake[1] = -1;
  t->conns = calloc((size_t)nranks, sizeof(mcclConn));
  t->pfds = calloc((size_t)nranks + 1, sizeof(struct pollfd));
  t->pfd_peer = calloc((size_t)nranks + 1, sizeof(int));
  if (!t->conns || !t->pfds || !t->pfd_peer) {
    snprintf(t->error, sizeof(t->error), "out of memory setting up %d connections", nranks);
    return mcclSystemError;
  }
  size_t park = mcclParkBytes();
  for (int r = 0; r < nranks; r++) {
    t->conns[r].fd = -1;
    t->conns[r].park.cap = park;
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
    if (wait_ms < 1) wait_ms = 1;
    if (poll(t->pfds, (nfds_t)np, (int)wait_ms) < 0 && errno != EINTR) {
      snprintf(t->error, sizeof(t->error), "poll() failed: %s", strerror(errno));
      res = mcclSystemError;
      goto done;
    }
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

mcclResult_t mcclTransportInit(mcclTransport* t, int rank, int nranks, int listen_fd,
                               char (*peer_addrs)[MCCL_ADDR_STRLEN], const mcclTransportAuth* auth,
                               const mcclTransportWatch* watch, int64_t deadline_ns) {
  int npend_cap = nranks + MAX_PENDING_INCOMING;
  mcclPending* pend = calloc((size_t)npend_cap, sizeof(mcclPending));
  struct pollfd* pfds = calloc((size_t)npend_cap + 1, sizeof(struct pollfd));
  int64_t* retry_at = calloc((size_t)nranks, sizeof(int64_t));
  char (*last_why)[MCCL_WHY_BYTES] = calloc((size_t)nranks, sizeof(*last_why));
  char needs[400];
  if (pend != NULL) /* before any failure can reach `done`, which closes every slot's fd */
    for (int r = 0; r < npend_cap; r++) pend[r].fd = -1;
  mcclResult_t res = transportAlloc(t, rank, nranks);
  if (res != mcclSuccess) goto done;
  if (!pend || !pfds || !retry_at || !last_why) {
    snprintf(t->error, sizeof(t->error), "out of memory setting up %d connections", nranks);
    res = mcclSystemError;
    goto done;
  }
  for (int r = 0; r < nranks; r++)
    snprintf(t->conns[r].addr, sizeof(t->conns[r].addr), "%s", peer_addrs[r]);
  snprintf(t->self_addr, sizeof(t->self_addr), "%s", peer_addrs[rank]);

  descriptorNeeds(t, needs, sizeof(needs));

  /* Outgoing: one pending slot per lower rank (slot index == rank). Dials that fail for a reason
   * waiting can cure are retried; the others end init now, naming the cause. */
  int remaining = nranks - 1, fatal = 0;
  for (int r = 0; r < rank; r++) {
    pend[r].peer = r;
    pend[r].outgoing = 1;
    snprintf(pend[r].addr, sizeof(pend[r].addr), "%s", peer_addrs[r]);
  }
  int fatal_peer = -1; /* the rank whose dial failed with `fatal` set */
  for (int r = 0; r < rank && !fatal; r++)
    if (dial(&pend[r], peer_addrs[r], last_why[r], sizeof(last_why[r]), &fatal) != 0) {
      if (fatal) fatal_peer = r;
      else retry_at[r] = mcclNowNs() + MCCL_REDIAL_MS * 1000000LL;
    }
  int64_t next_watch = mcclNowNs() + MCCL_INIT_WATCH_MS * 1000000LL;

  while (remaining > 0) {
    int64_t now = mcclNowNs();
    /* Redial peers whose earlier attempt failed. */
    for (int r = 0; r < rank && !fatal; r++)
      if (t->conns[r].fd < 0 && pend[r].fd < 0 && retry_at[r] && now >= retry_at[r]) {
        retry_at[r] = 0;
        if (dial(&pend[r], peer_addrs[r], last_why[r], sizeof(last_why[r]), &fatal) != 0) {
          if (fatal) fatal_peer = r;
          else retry_at[r] = now + MCCL_REDIAL_MS * 1000000LL;
        }
      }
    if (fatal) {
      int r = fatal_peer;
      snprintf(t->error, sizeof(t->error), "rank %d (%s) cannot dial rank %d at %s: %s; %s", rank,
               t->self_addr, r, peer_addrs[r], last_why[r], needs);
      res = strncmp(last_why[r], "its published", 13) == 0 ? mcclInvalidArgument : mcclSystemError;
      goto done;
    }
    if (watchSaysFailed(t, watch, now, &next_watch)) {
      res = mcclRemoteError;
      goto done;
    }
    if (now >= deadline_ns) {
      char missing[600] = "";
      size_t len = 0;
      for (int r = 0; r < nranks && len + 100 < sizeof(missing); r++) {
        if (r == rank || t->conns[r].fd >= 0) continue;
        len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%d (%s%s%s)",
                                len ? ", " : "", r, peer_addrs[r], last_why[r][0] ? ": " : "",
                                last_why[r]);
      }
      snprintf(t->error, sizeof(t->error),
               "timed out connecting rank %d (%s) to its peers; still missing rank %s", rank,
               t->self_addr, missing);
      res = mcclTimeout;
      goto done;
    }
    int np = 0;
    pfds[np].fd = listen_fd;
    pfds[np].events = POLLIN;
    np++;
    int slot_of[npend_cap + 1];
    for (int i = 0; i < npend_cap; i++) {
      if (pend[i].fd < 0) continue;
      pfds[np].fd = pend[i].fd;
      pfds[np].events = (pend[i].state == PEND_RECV) ? POLLIN : POLLOUT;
      slot_of[np] = i;
      np++;
    }
    int wait_ms = (int)((deadline_ns - now) / 1000000LL);
    if (wait_ms > 50) wait_ms = 50;
    if (wait_ms < 1) wait_ms = 1;
    int n = poll(pfds, (nfds_t)np, wait_ms);
    if (n < 0 && errno != EINTR) {
      snprintf(t->error, sizeof(t->error), "poll() failed: %s", strerror(errno));
      res = mcclSystemError;
      goto done;
    }
    if (n <= 0) continue;
    if (pfds[0].revents & POLLIN) {
      for (int k = 0; k < MCCL_ACCEPTS_PER_PASS; k++) {
        mcclSockaddr from;
        socklen_t fromlen = sizeof(from.ss);
        int fd = mcclSocketAccept(listen_fd, &from.sa, &fromlen);
        if (fd < 0) {
          int err = errno;
          if (err == EAGAIN || err == EWOULDBLOCK) break;
          if (acceptRetry(err)) continue;
          /* The connection stays queued, so the listener stays readable: polling again would spin
           * until the deadline. A descriptor limit does not lift while this rank waits. */
          char text[MCCL_WHY_BYTES];
          mcclSocketErrorText(err, text, sizeof(text));
          snprintf(t->error, sizeof(t->error), "rank %d (%s) cannot accept the connections of its peers: "
                   "accept(): %s; %s", rank, t->self_addr, text, needs);
          res = mcclSystemError;
          goto done;
        }
        int slot = -1, oldest = -1;
        for (int i = nranks; i < npend_cap && slot < 0; i++) {
          if (pend[i].fd < 0) slot = i;
          else if (oldest < 0 || pend[i].since_ns < pend[oldest].since_ns) oldest = i;
        }
        char text[MCCL_ADDR_STRLEN];
        mcclSockaddrFormat(&from, text, sizeof(text));
        if (slot < 0 && oldest >= 0 && mcclNowNs() - pend[oldest].since_ns >= PENDING_EVICT_AFTER_MS * 1000000LL) {
          WARN("rank %d: closed connection from %s: no hello after %.1f s while more connections wait",
               rank, pend[oldest].addr, (double)(mcclNowNs() - pend[oldest].since_ns) / 1e9);
          close(pend[oldest].fd);
          pend[oldest].fd = -1;
          slot = oldest;
        }
        if (slot < 0) {
          WARN("rank %d: refused connection from %s: too many unauthenticated connections", rank, text);
          close(fd);
          continue;
        }
        if (mcclSocketTune(fd) != 0) {
          WARN("rank %d: closed connection from %s: setting its socket options failed: %s", rank, text,
               strerror(errno));
          close(fd);
          continue;
        }
        memset(&pend[slot], 0, sizeof(pend[slot]));
        pend[slot].fd = fd;
        pend[slot].peer = -1;
        pend[slot].state = PEND_RECV;
        pend[slot].since_ns = mcclNowNs();
        snprintf(pend[slot].addr, sizeof(pend[slot].addr), "%s", text);
      }
    }
    for (int k = 1; k < np; k++) {
      if (pfds[k].revents == 0) continue;
      mcclPending* p = &pend[slot_of[k]];
      if (p->fd != pfds[k].fd) continue; /* evicted above; the slot holds a newer connection */
      char why[160];
      const char* reject = NULL;
      if (p->state == PEND_CONNECTING) {
        int err = 0;
        socklen_t el = sizeof(err);
        getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &err, &el);
        if (err != 0) {
          snprintf(last_why[p->peer], sizeof(last_why[0]), "connect(): %s", strerror(err));
          pendingClose(p);
          retry_at[p->peer] = mcclNowNs() + MCCL_REDIAL_MS * 1000000LL;
          continue;
        }
        helloMake(t, auth, MCCL_HELLO_KIND_HELLO, p->peer, p->buf);
        p->state = PEND_SEND;
        p->done = 0;
      }
      if (p->state == PEND_SEND) {
        ssize_t w = send(p->fd, p->buf + p->done, MCCL_HELLO_BYTES - p->done, MCCL_MSG_NOSIGNAL);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (w <= 0) {
          reject = strerror(errno);
        } else if ((p->done += (size_t)w) == MCCL_HELLO_BYTES) {
          if (p->outgoing) {
            p->state = PEND_RECV;
            p->done = 0;
          } else { /* ack sent: the incoming connection is established */
            t->conns[p->peer].fd = p->fd;
            p->fd = -1;
            remaining--;
            INFO(MCCL_SUB_INIT, "rank %d: accepted rank %d from %s", rank, p->peer, p->addr);
          }
        }
      } else if (p->state == PEND_RECV) {
        ssize_t r = recv(p->fd, p->buf + p->done, MCCL_HELLO_BYTES - p->done, 0);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (r <= 0) {
          reject = r == 0 ? "closed before finishing the handshake" : strerror(errno);
        } else if ((p->done += (size_t)r) == MCCL_HELLO_BYTES) {
          mcclHello h;
          if (helloCheck(t, auth, p->buf, p->outgoing ? MCCL_HELLO_KIND_ACK : MCCL_HELLO_KIND_HELLO,
                         p->peer, &h, why, sizeof(why)) != MCCL_WIRE_OK)
            reject = why;
          if (reject == NULL && p->outgoing) {
            t->conns[p->peer].fd = p->fd;
            p->fd = -1;
            remaining--;
            INFO(MCCL_SUB_INIT, "rank %d: connected to rank %d at %s", rank, p->peer, p->addr);
          } else if (reject == NULL) {
            p->peer = (int)h.rank;
            helloMake(t, auth, MCCL_HELLO_KIND_ACK, p->peer, p->buf);
            p->state = PEND_SEND;
            p->done = 0;
            /* Reserve the rank now so that a duplicate hello is refused. */
            for (int i = nranks; i < npend_cap; i++)
              if (&pend[i] != p && pend[i].fd >= 0 && pend[i].peer == p->peer) {
                WARN("rank %d: closing duplicate connection for rank %d from %s", rank, p->peer, pend[i].addr);
                pendingClose(&pend[i]);
              }
          }
        }
      }
      if (reject != NULL) {
        if (p->outgoing) {
          snprintf(last_why[p->peer], sizeof(last_why[0]), "%s", reject);
          INFO(MCCL_SUB_INIT, "rank %d: handshake with rank %d at %s failed (%s); retrying", rank,
               p->peer, p->addr, reject);
          pendingClose(p);
          retry_at[p->peer] = mcclNowNs() + 100 * 1000000LL;
        } else {
          WARN("rank %d: rejected connection from %s: %s", rank, p->addr, reject);
          pendingClose(p);
        }
      }
    }
  }
  res = meshReady(t, auth, watch, deadline_ns);
done:
  if (pend != NULL)
    for (int i = 0; i < npend_cap; i++) pendingClose(&pend[i]);
  free(pend);
  free(pfds);
  free(retry_at);
  free(last_why);
  return res;
}

