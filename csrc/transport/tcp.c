/* tcp.c: the TCP mesh: authenticated connection setup, framed non-blocking I/O, progress. */
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
  for (int r = 0; r < nranks; r++) t->conns[r].fd = -1;
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
    if (watch != NULL && watch->failed != NULL && now >= next_watch) {
      next_watch = now + MCCL_INIT_WATCH_MS * 1000000LL;
      char why[sizeof(t->error)];
      if (watch->failed(watch->ctx, why, sizeof(why))) {
        snprintf(t->error, sizeof(t->error), "%s", why);
        res = mcclRemoteError;
        goto done;
      }
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
    if (watch != NULL && watch->failed != NULL && now >= next_watch) {
      next_watch = now + MCCL_INIT_WATCH_MS * 1000000LL;
      char why[sizeof(t->error)];
      if (watch->failed(watch->ctx, why, sizeof(why))) {
        snprintf(t->error, sizeof(t->error), "%s", why);
        res = mcclRemoteError;
        goto done;
      }
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

/* ---- data transfers ---------------------------------------------------------------------- */

/* The sending side on a thread of its own (mcclTransportStartSender). The owner appends to the
 * send queues and the sender thread pops them, both under `mu`. A socket, x->done and
 * c->send_midframe are written by the sender thread while the queue is not empty, and by the
 * owner only under `mu` with the queue empty (small frames, mcclTransportPostSend). Whoever
 * finishes a transfer sets x->complete after its last access to x. */
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

/* Write what the socket takes of x's header and payload, from x->done on. Returns the bytes
 * written, or -1 with errno (EAGAIN: the socket is full). */
static ssize_t frameWrite(int fd, mcclXfer* x) {
  struct iovec iov[2];
  int niov = 0;
  if (x->done < MCCL_FRAME_BYTES) {
    iov[niov].iov_base = x->hdr + x->done;
    iov[niov].iov_len = MCCL_FRAME_BYTES - x->done;
    niov++;
  }
  size_t pdone = x->done > MCCL_FRAME_BYTES ? x->done - MCCL_FRAME_BYTES : 0;
  if (x->bytes > pdone) {
    iov[niov].iov_base = x->buf + pdone;
    iov[niov].iov_len = x->bytes - pdone;
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

/* With a sender thread, a frame smaller than this that finds its queue empty is written by the
 * owner itself, right away: copying it costs less than waking the sender thread and being woken
 * back (a few microseconds each way), which is what small collectives' latency is made of. */
#define MCCL_SEND_INLINE_BYTES (64 * 1024)

void mcclTransportPostSend(mcclTransport* t, int peer, mcclXfer* x) {
  mcclConn* c = &t->conns[peer];
  mcclSender* s = t->sender;
  x->next = NULL;
  x->done = 0;
  atomic_store(&x->complete, 0);
  if (x->frame.type == 0) x->frame.type = MCCL_FRAME_DATA;
  x->frame.length = (uint32_t)x->bytes;
  mcclFrameEncode(x->hdr, &x->frame);
  x->t_first = 0;
  x->t_post = t->trace ? mcclNowNs() : 0;
  if (s != NULL) pthread_mutex_lock(&s->mu);
  int was_empty = c->sq_head == NULL;
  if (s != NULL && was_empty && x->bytes < MCCL_SEND_INLINE_BYTES && c->fd >= 0 && !s->halted) {
    /* The queue is empty and we hold the lock, so the thread is not writing this socket. What
     * does not fit (or fails) is queued below, from x->done on; the thread finds any error. */
    ssize_t n;
    do n = frameWrite(c->fd, x);
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
    if (was_empty) pipeWake(s->wake[1], &s->wake_pending);
  }
}

void mcclTransportPostRecv(mcclTransport* t, int peer, mcclXfer* x) {
  mcclConn* c = &t->conns[peer];
  x->next = NULL;
  x->done = 0;
  x->complete = 0;
  x->frame.type = MCCL_FRAME_DATA;
  x->frame.length = (uint32_t)x->bytes;
  x->t_first = 0;
  x->t_post = t->trace ? mcclNowNs() : 0;
  if (c->rq_tail) c->rq_tail->next = x;
  else c->rq_head = x;
  c->rq_tail = x;
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
    mcclXfer* x = c->sq_head;
    if (s != NULL) pthread_mutex_unlock(&s->mu);
    if (x == NULL) return 0;
    size_t before = x->done;
    ssize_t n = frameWrite(c->fd, x);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        traceWrite(t, peer, c, x, n, before, 0);
        return 1;
      }
      *err_no = errno;
      lostText(t, peer, "sending", &x->frame, errno, err, cap);
      return -1;
    }
    traceWrite(t, peer, c, x, n, before, MCCL_FRAME_BYTES + x->bytes - before);
    x->done += (size_t)n;
    c->send_midframe = x->done < MCCL_FRAME_BYTES + x->bytes;
    if (!c->send_midframe) {
      if (s != NULL) pthread_mutex_lock(&s->mu);
      c->sq_head = x->next;
      if (c->sq_head == NULL) c->sq_tail = NULL;
      if (s != NULL) pthread_mutex_unlock(&s->mu);
      if (t->trace) traceXfer(t, mcclTraceSendTrack(peer), MCCL_TRACE_SEND_QUEUED, MCCL_TRACE_SEND, x);
      atomic_store(&x->complete, 1); /* the last access: the owner may reuse x from here on */
      if (s != NULL) mcclTransportWake(t);
    }
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
    while ((s->halted || atomic_load(&s->failed)) && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
    if (s->stop) break;
    s->busy = 1;
    for (int r = 0; r < t->nranks; r++) s->queued[r] = t->conns[r].sq_head != NULL && t->conns[r].fd >= 0;
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
  t->sender = s;
  int rc = pthread_create(&s->thread, NULL, senderMain, t);
  if (rc != 0) {
    t->sender = NULL;
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
  char why[600];
  if (mcclFrameMatch(got, want, why, sizeof(why)) == MCCL_WIRE_OK) return mcclSuccess;
  snprintf(t->error, sizeof(t->error),
           "collective mismatch at rank %d: rank %d (%s) %s; every rank must issue the same "
           "collectives with the same sizes, dtypes, ops and roots in the same order",
           t->rank, peer, t->conns[peer].addr, why);
  return mcclMismatch;
}

/* Does `c` have a reader for the bytes that arrive next? A collective header that no posted
 * receive claims yet stops reading until one is posted (TCP then holds the sender back). */
static int wantRead(const mcclTransport* t, int peer) {
  const mcclConn* c = &t->conns[peer];
  if (c->rx_held) return 0; /* the owner of the P2P frame being read will say when */
  if (c->rq_head != NULL || c->rx_mode == MCCL_RX_P2P || c->rx_mode == MCCL_RX_COLL ||
      c->rx_mode == MCCL_RX_ABORT)
    return 1;
  if (c->rx_mode == MCCL_RX_PEEKED) return 0;
  return t->p2p.wanted != NULL && t->p2p.wanted(t->p2p.ctx, peer);
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

/* Read from `c` while someone wants its bytes and the socket has them. Frames arrive as a header
 * then a payload. Every header is checked first (mcclFrameHeaderCheck); then a DATA header is
 * matched against the head posted receive and its payload read straight into that receive's
 * buffer, a P2P header asks the owner where the payload goes, and an ABORT header's reason is
 * read (at most MCCL_MAX_ABORT_REASON bytes) before failing with it. No call blocks: a partial
 * header or payload waits in the connection's state for the next round. */
static mcclResult_t connRecv(mcclTransport* t, int peer) {
  mcclConn* c = &t->conns[peer];
  char sink[4096];
  while (wantRead(t, peer)) {
    const mcclFrame* what = c->rq_head ? &c->rq_head->frame : (c->rx_mode != MCCL_RX_HEADER ? &c->rx_frame : NULL);
    int reading = c->rx_mode == MCCL_RX_HEADER || (c->rx_mode != MCCL_RX_PEEKED && c->rx_left > 0);
    ssize_t n = 0;
    if (c->rx_mode == MCCL_RX_HEADER) {
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
      } else {
        c->rx_mode = MCCL_RX_PEEKED;
      }
    } else if (reading) {
      if (c->rx_mode == MCCL_RX_COLL && t->trace && c->rq_head->t_first == 0) c->rq_head->t_first = mcclNowNs();
      if (c->rx_dst) c->rx_dst += n;
      c->rx_left -= (size_t)n;
      c->rx_room -= (size_t)n;
      if (c->rx_mode == MCCL_RX_P2P && c->rx_room == 0 && c->rx_left > 0) {
        MCCLCHECK(p2pRoom(t, peer));
        if (c->rx_held) return mcclSuccess;
      }
    }
    if (c->rx_mode == MCCL_RX_PEEKED) {
      if (c->rq_head == NULL) return mcclSuccess; /* wait for the algorithm to post its receive */
      MCCLCHECK(frameCheck(t, peer, &c->rx_frame, &c->rq_head->frame));
      c->rx_mode = MCCL_RX_COLL;
      c->rx_dst = c->rq_head->buf;
      c->rx_left = c->rq_head->bytes;
      c->rx_room = c->rx_left;
    }
    if (c->rx_left > 0) continue;
    if (c->rx_mode == MCCL_RX_COLL) {
      mcclXfer* x = c->rq_head;
      if (t->trace) traceXfer(t, mcclTraceRecvTrack(peer), MCCL_TRACE_RECV_WAIT, MCCL_TRACE_RECV, x);
      x->complete = 1;
      c->rq_head = x->next;
      if (c->rq_head == NULL) c->rq_tail = NULL;
    } else if (c->rx_mode == MCCL_RX_P2P) {
      t->p2p.landed(t->p2p.ctx, peer, &c->rx_frame);
    } else if (c->rx_mode == MCCL_RX_ABORT) {
      return abortArrived(t, peer);
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
  int found = 0;
  for (int r = 0; r < t->nranks && !found; r++) {
    mcclConn* c = &t->conns[r];
    char desc[200];
    if (c->sq_head != NULL) {
      mcclFrameDescribe(&c->sq_head->frame, desc, sizeof(desc));
      snprintf(t->error, sizeof(t->error),
               "timed out: rank %d could not send %s to rank %d (%s), which stopped reading; "
               "that rank is stalled or issued different collectives",
               t->rank, desc, r, c->addr);
      found = 1;
    }
  }
  if (snd != NULL) pthread_mutex_unlock(&snd->mu);
  if (!found) snprintf(t->error, sizeof(t->error), "timed out");
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
  /* A header read earlier and held for lack of a posted receive needs no poll once one is
   * posted: its bytes are already here (an empty frame has no more). */
  for (int r = 0; r < t->nranks; r++) {
    if (t->conns[r].rx_mode == MCCL_RX_PEEKED && t->conns[r].rq_head != NULL) {
      MCCLCHECK(connRecv(t, r));
      ready = 1;
    }
  }
  /* With a sender thread, queued sends are its to write: this thread only waits for their
   * completions (its wake pipe) while any are queued. */
  if (snd != NULL) {
    pthread_mutex_lock(&snd->mu);
    for (int r = 0; r < t->nranks; r++) snd->owner_queued[r] = t->conns[r].sq_head != NULL;
    pthread_mutex_unlock(&snd->mu);
  }
  int np = 0, sending = 0;
  for (int r = 0; r < t->nranks; r++) {
    mcclConn* c = &t->conns[r];
    if (r == t->rank) continue;
    int rd = wantRead(t, r), wr = snd != NULL ? snd->owner_queued[r] : c->sq_head != NULL;
    if (!rd && !wr) continue;
    if (c->fd < 0 || c->dead) {
      snprintf(t->error, sizeof(t->error), "rank %d (%s) is no longer connected (%s)", r, c->addr,
               c->dead ? c->dead_reason : "never connected");
      return mcclRemoteError;
    }
    if (snd != NULL && wr) sending = 1;
    short events = (short)((rd ? POLLIN : 0) | (wr && snd == NULL ? POLLOUT : 0));
    if (events == 0) continue;
    t->pfds[np].fd = c->fd;
    t->pfds[np].events = events;
    t->pfd_peer[np] = r;
    np++;
  }
  t->idle = np == 0 && !sending;
  if (t->idle) return mcclSuccess;
  t->pfds[np].fd = t->wake[0];
  t->pfds[np].events = POLLIN;
  int64_t now = mcclNowNs();
  int64_t wait_ms = (deadline_ns - now + 999999) / 1000000;
  if (wait_ms > 1000) wait_ms = 1000; /* re-check the abort flag at least once a second */
  if (wait_ms < 0 || ready) wait_ms = 0;
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
  for (int k = 0; k < np; k++) {
    short re = t->pfds[k].revents;
    if (re == 0) continue;
    int peer = t->pfd_peer[k];
    if (re & (POLLIN | POLLERR | POLLHUP)) MCCLCHECK(connRecv(t, peer));
    if (snd == NULL && (re & (POLLOUT | POLLERR | POLLHUP))) {
      int err_no = 0;
      if (connSend(t, peer, t->error, sizeof(t->error), &err_no) < 0) {
        connLost(&t->conns[peer], err_no);
        return mcclRemoteError;
      }
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
  if (snd != NULL && snd->halted) senderSetHalted(snd, 0); /* only this thread writes `halted` */
  mcclResult_t res = progressRound(t, deadline_ns, abort_flag);
  /* The caller unwinds on an error, and the transfers it posted go with its frames. */
  if (res != mcclSuccess) mcclTransportHalt(t);
  return res;
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
  }
  if (s != NULL) pthread_mutex_unlock(&s->mu);
}

void mcclTransportWake(mcclTransport* t) { pipeWake(t->wake[1], &t->wake_pending); }

/* How long a failing rank keeps reading after it said why, so that closing its sockets with
 * unread bytes (which makes the kernel send a reset) cannot destroy the ABORT frame before the
 * peer has read it. */
#define MCCL_FAIL_LINGER_MS 250

/* Never dereferences posted transfers: after an error their owners may have returned. */
void mcclTransportFail(mcclTransport* t, const char* full_reason) {
  /* A reason that wraps a peer's reason ("rank 1: ... failed: rank 2 (addr) failed: ...") holds
   * the root cause at its end: when too long for a frame, keep its head and its tail. */
  char clipped[MCCL_MAX_ABORT_REASON + 1];
  const char* reason = full_reason;
  size_t len = strlen(full_reason);
  if (len > MCCL_MAX_ABORT_REASON) {
    const size_t head = 120, gap = 5, tail = MCCL_MAX_ABORT_REASON - head - gap;
    memcpy(clipped, full_reason, head);
    memcpy(clipped + head, " ... ", gap);
    memcpy(clipped + head + gap, full_reason + len - tail, tail);
    clipped[MCCL_MAX_ABORT_REASON] = '\0';
    reason = clipped;
    len = MCCL_MAX_ABORT_REASON;
  }
  mcclTransportStopSender(t); /* what is half-written stays so: send_midframe is final */
  /* Peers that already failed or closed have spoken; the others may yet, during the linger. */
  char* heard = calloc((size_t)t->nranks, 1);
  for (int r = 0; r < t->nranks && heard != NULL; r++) heard[r] = r == t->rank || t->conns[r].fd < 0 || t->conns[r].dead;
  for (int r = 0; r < t->nranks; r++) {
    mcclConn* c = &t->conns[r];
    if (c->fd < 0) continue;
    /* Only where no frame is half-written: otherwise the ABORT header would land mid-payload.
     * (The posted transfers themselves may be gone: the failed algorithm has returned.) */
    if (!c->dead && !c->send_midframe) {
      mcclFrame f;
      memset(&f, 0, sizeof(f));
      f.type = MCCL_FRAME_ABORT;
      f.seq = t->settled; /* peers completing a collective this rank did not complete fail it too */
      f.length = (uint32_t)len;
      uint8_t hdr[MCCL_FRAME_BYTES];
      mcclFrameEncode(hdr, &f);
      struct iovec iov[2] = {{hdr, sizeof(hdr)}, {(void*)reason, len}};
      struct msghdr msg;
      memset(&msg, 0, sizeof(msg));
      msg.msg_iov = iov;
      msg.msg_iovlen = 2;
      ssize_t ignored = sendmsg(c->fd, &msg, MCCL_MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)ignored;
    }
    shutdown(c->fd, SHUT_WR); /* FIN after the ABORT frame: peers blocked on us fail now */
    c->dead = 1;
    if (c->dead_reason[0] == '\0') snprintf(c->dead_reason, sizeof(c->dead_reason), "this rank failed");
  }
  mcclTransportCancel(t);
  /* Linger: discard what peers still send until each has closed too, or the linger time is up.
   * Past MCCL_FAIL_LINGER_MS it goes on (to four times that) only while two or more peers are
   * still unheard, so that under load a slow live peer is not taken for the stalled one. */
  int64_t start = mcclNowNs();
  int64_t until = start + MCCL_FAIL_LINGER_MS * 1000000LL, until_max = start + 4 * MCCL_FAIL_LINGER_MS * 1000000LL;
  for (;;) {
    int np = 0, unheard = 0;
    for (int r = 0; r < t->nranks; r++) {
      if (t->conns[r].fd < 0 || t->conns[r].dead == 2) continue;
      if (heard != NULL && !heard[r]) unheard++;
      t->pfds[np].fd = t->conns[r].fd;
      t->pfds[np].events = POLLIN;
      t->pfd_peer[np++] = r;
    }
    int64_t now = mcclNowNs();
    int64_t end = (now >= until && unheard <= 1) || heard == NULL ? until : until_max;
    int64_t left_ms = (end - now) / 1000000LL;
    if (np == 0 || left_ms <= 0) break;
    if (left_ms > MCCL_FAIL_LINGER_MS) left_ms = MCCL_FAIL_LINGER_MS;
    if (poll(t->pfds, (nfds_t)np, (int)left_ms) < 0) break;
    for (int k = 0; k < np; k++) {
      if (t->pfds[k].revents == 0) continue;
      char sink[65536];
      ssize_t n = recv(t->pfds[k].fd, sink, sizeof(sink), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) t->conns[t->pfd_peer[k]].dead = 2;
      if (heard != NULL && n >= 0) heard[t->pfd_peer[k]] = 1;
    }
  }
  t->silent[0] = '\0';
  int nsilent = 0, nother = 0;
  for (int r = 0; r < t->nranks && heard != NULL; r++) {
    if (r == t->rank) continue;
    nother++;
    if (heard[r] || t->conns[r].dead == 2) continue;
    size_t used = strlen(t->silent);
    if (nsilent++ < 4 && used + MCCL_ADDR_STRLEN + 16 < sizeof(t->silent))
      snprintf(t->silent + used, sizeof(t->silent) - used, "%srank %d (%s)", used ? ", " : "", r, t->conns[r].addr);
  }
  if (nsilent == nother) t->silent[0] = '\0'; /* everyone silent: this rank is the one cut off */
  free(heard);
}

/* The failure notice `f` (an ABORT header) from `peer`, with `reason` (`len` bytes, as far as it
 * arrived), says that peer did not complete collective `seq`: fail it here too. */
static mcclResult_t settleFailed(mcclTransport* t, int peer, const mcclFrame* f, const char* reason,
                                 size_t len, uint64_t seq) {
  mcclConn* c = &t->conns[peer];
  memcpy(c->abort_reason, reason, len);
  c->abort_reason[len] = '\0';
  c->rx_mode = MCCL_RX_HEADER;
  c->rx_dst = NULL;
  c->rx_left = 0;
  c->rhdr_got = 0;
  c->dead = 1;
  snprintf(c->dead_reason, sizeof(c->dead_reason), "failed: %.140s", c->abort_reason);
  snprintf(t->error, sizeof(t->error),
           "rank %d (%s) failed before it completed this collective (#%llu; it completed %llu), so rank "
           "%d fails it too: %s", peer, c->addr, (unsigned long long)seq, (unsigned long long)f->seq,
           t->rank, c->abort_reason);
  return mcclRemoteError;
}

/* One peer's connection, readable when the collective `seq` completed: is its next frame a notice
 * that the peer failed before completing `seq`? Looks with MSG_PEEK, so anything else (the peer's
 * next collective, a point-to-point message, a close) is left exactly as it was. */
static mcclResult_t settlePeer(mcclTransport* t, int peer, uint64_t seq) {
  mcclConn* c = &t->conns[peer];
  uint8_t buf[MCCL_FRAME_BYTES + MCCL_MAX_ABORT_REASON];
  size_t have = c->rhdr_got; /* a header partly read already */
  memcpy(buf, c->rhdr, have);
  ssize_t n;
  do n = recv(c->fd, buf + have, sizeof(buf) - have, MSG_PEEK | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n <= 0 || have + (size_t)n < MCCL_FRAME_BYTES) return mcclSuccess;
  size_t got = have + (size_t)n;
  mcclFrame f;
  char why[300];
  if (mcclFrameHeaderCheck(buf, t->p2p.arrive != NULL, &f, why, sizeof(why)) != MCCL_WIRE_OK)
    return mcclSuccess; /* the receive path reports a broken frame when it gets there */
  if (f.type != MCCL_FRAME_ABORT || f.seq > seq) return mcclSuccess;
  size_t len = f.length < MCCL_MAX_ABORT_REASON ? f.length : MCCL_MAX_ABORT_REASON;
  if (len > got - MCCL_FRAME_BYTES) len = got - MCCL_FRAME_BYTES;
  /* Consume what was looked at (it is in the socket, so the reads cannot block or come short of
   * it for long), which keeps the stream in step with rx_mode. */
  size_t take = MCCL_FRAME_BYTES - have + len;
  uint8_t sink[MCCL_FRAME_BYTES + MCCL_MAX_ABORT_REASON];
  while (take > 0) {
    ssize_t r = recv(c->fd, sink, take, MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    take -= (size_t)r;
  }
  return settleFailed(t, peer, &f, (const char*)buf + MCCL_FRAME_BYTES, len, seq);
}

mcclResult_t mcclTransportSettle(mcclTransport* t, uint64_t seq) {
  int np = 0;
  for (int r = 0; r < t->nranks; r++) {
    mcclConn* c = &t->conns[r];
    if (r == t->rank || c->fd < 0 || c->dead) continue;
    if (c->rx_mode == MCCL_RX_ABORT) {
      /* The header arrived in a progress round that then found the socket empty mid-reason. */
      if (c->rx_frame.seq > seq) continue;
      size_t have = (size_t)(c->rx_dst - c->abort_reason);
      if (c->rx_left > 0) { /* what more of the reason is here already */
        ssize_t r2 = recv(c->fd, c->rx_dst, c->rx_left, MSG_DONTWAIT);
        if (r2 > 0) have += (size_t)r2;
      }
      char reason[MCCL_MAX_ABORT_REASON + 1];
      memcpy(reason, c->abort_reason, have);
      return settleFailed(t, r, &c->rx_frame, reason, have, seq);
    }
    /* A frame in progress or held, or a collective header waiting for its receive (a later
     * collective's: the peer completed this one), comes before any notice. */
    if (c->rx_mode != MCCL_RX_HEADER || c->rx_held) continue;
    t->pfds[np].fd = c->fd;
    t->pfds[np].events = POLLIN;
    t->pfds[np].revents = 0;
    t->pfd_peer[np++] = r;
  }
  if (np > 0 && poll(t->pfds, (nfds_t)np, 0) > 0) {
    for (int k = 0; k < np; k++)
      if (t->pfds[k].revents & POLLIN) MCCLCHECK(settlePeer(t, t->pfd_peer[k], seq));
  }
  t->settled = seq + 1;
  return mcclSuccess;
}

int mcclTransportSingleHost(const mcclTransport* t) {
  const char* colon = strrchr(t->self_addr, ':');
  if (colon == NULL || t->nranks < 2) return 0;
  size_t host_len = (size_t)(colon - t->self_addr) + 1; /* with the ':': 10.0.0.1 is not 10.0.0.12 */
  for (int r = 0; r < t->nranks; r++)
    if (r != t->rank && strncmp(t->conns[r].addr, t->self_addr, host_len) != 0) return 0;
  return 1;
}

int mcclTransportUnread(mcclTransport* t, char* desc, size_t cap) {
  int found = 0;
  size_t len = 0;
  desc[0] = '\0';
  for (int r = 0; r < t->nranks && t->conns != NULL; r++) {
    mcclConn* c = &t->conns[r];
    if (c->fd < 0 || c->dead) continue;
    char b;
    int pending = c->rx_mode != MCCL_RX_HEADER || c->rhdr_got > 0 ||
                  recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 1;
    if (!pending) continue;
    found++;
    if (len + 40 < cap) len += (size_t)snprintf(desc + len, cap - len, "%s%d", len ? ", " : "", r);
  }
  return found;
}

void mcclTransportClose(mcclTransport* t) {
  mcclTransportStopSender(t);
  if (t->conns != NULL)
    for (int r = 0; r < t->nranks; r++)
      if (t->conns[r].fd >= 0) close(t->conns[r].fd);
  if (t->wake[0] >= 0) close(t->wake[0]);
  if (t->wake[1] >= 0) close(t->wake[1]);
  free(t->conns);
  free(t->pfds);
  free(t->pfd_peer);
  t->conns = NULL;
  t->pfds = NULL;
  t->pfd_peer = NULL;
  t->wake[0] = t->wake[1] = -1;
}
