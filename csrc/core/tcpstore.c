/*
 * tcpstore.c: the built-in bootstrap store for C programs and tools (torch jobs use torch's own
 * store instead). One process serves; every rank is a client.
 *
 * Request:  op u8 (1 SET, 2 GET, 3 ADD, 4 WAIT) | key_len u32 | key | SET: val_len u32 | value
 *                                                               | ADD: delta i64
 * Reply:    SET: u8 1 | GET: val_len u32 | value (sent once the key exists) | ADD: i64 new value
 *           | WAIT: u8 1 (once the key exists)
 * Integers little-endian. A GET or WAIT for a missing key is parked until a SET or ADD creates it.
 * A request with an unknown op, a key of 0 or more than 4096 bytes or one holding a NUL byte, or a
 * value over 64 MiB ends the client's connection.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/debug.h"
#include "core/platform.h"
#include "mccl.h"
#include "transport/socket.h"
#include "transport/wire.h"

enum { OP_SET = 1, OP_GET = 2, OP_ADD = 3, OP_WAIT = 4 };
#define MAX_KEY 4096
#define MAX_VALUE (64u << 20)

typedef struct {
  char* key;
  uint8_t* val;
  uint32_t len;
} kvEntry;

typedef struct {
  int fd;
  uint8_t* in;        /* bytes received, not yet parsed */
  size_t in_len, in_cap;
  int parked_op;      /* GET or WAIT waiting for parked_key, or 0 */
  char* parked_key;
} storeClient;

struct mcclTcpStoreServer {
  int listen_fd;
  int stop_pipe[2];
  kvEntry* kv;
  size_t nkv, kv_cap;
  storeClient* clients;
  size_t nclients, clients_cap;
};

static kvEntry* kvFind(mcclTcpStoreServer_t* s, const char* key) {
  for (size_t i = 0; i < s->nkv; i++)
    if (strcmp(s->kv[i].key, key) == 0) return &s->kv[i];
  return NULL;
}

static kvEntry* kvPut(mcclTcpStoreServer_t* s, const char* key, const uint8_t* val, uint32_t len) {
  kvEntry* e = kvFind(s, key);
  if (e == NULL) {
    if (s->nkv == s->kv_cap) {
      size_t cap = s->kv_cap ? s->kv_cap * 2 : 64;
      kvEntry* kv = realloc(s->kv, cap * sizeof(kvEntry));
      if (kv == NULL) return NULL;
      s->kv = kv;
      s->kv_cap = cap;
    }
    char* k = strdup(key);
    if (k == NULL) return NULL;
    e = &s->kv[s->nkv++];
    e->key = k;
    e->val = NULL;
    e->len = 0;
  }
  uint8_t* v = malloc(len ? len : 1);
  if (v == NULL) return NULL; /* the old value stays; the client is dropped */
  memcpy(v, val, len);
  free(e->val);
  e->val = v;
  e->len = len;
  return e;
}

/* Blocking write of a whole reply (replies are small; a client that stops reading is dropped). */
static int writeAll(int fd, const void* buf, size_t len) {
  const char* p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MCCL_MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd pf = {fd, POLLOUT, 0};
      if (poll(&pf, 1, 5000) <= 0) return -1;
      continue;
    }
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int replyValue(storeClient* c, const kvEntry* e, int op) {
  if (op == OP_WAIT) {
    uint8_t one = 1;
    return writeAll(c->fd, &one, 1);
  }
  uint8_t hdr[4];
  mcclPut32(hdr, e->len);
  if (writeAll(c->fd, hdr, 4) != 0) return -1;
  return writeAll(c->fd, e->val, e->len);
}

static void wakeParked(mcclTcpStoreServer_t* s, const kvEntry* e) {
  for (size_t i = 0; i < s->nclients; i++) {
    storeClient* c = &s->clients[i];
    if (c->parked_op && strcmp(c->parked_key, e->key) == 0) {
      if (replyValue(c, e, c->parked_op) != 0) shutdown(c->fd, SHUT_RDWR);
      c->parked_op = 0;
      free(c->parked_key);
      c->parked_key = NULL;
    }
  }
}

/* Parse and serve complete requests in c->in. Returns -1 to drop the client. */
static int serveClient(mcclTcpStoreServer_t* s, storeClient* c) {
  size_t pos = 0;
  while (c->parked_op == 0) {
    size_t avail = c->in_len - pos;
    const uint8_t* p = c->in + pos;
    if (avail < 5) break;
    uint8_t op = p[0];
    uint32_t klen = mcclGet32(p + 1);
    if (op < OP_SET || op > OP_WAIT || klen == 0 || klen > MAX_KEY) return -1;
    size_t need = 5 + (size_t)klen;
    uint32_t vlen = 0;
    if (op == OP_SET) {
      if (avail < need + 4) break;
      vlen = mcclGet32(p + need);
      if (vlen > MAX_VALUE) return -1;
      need += 4 + vlen;
    } else if (op == OP_ADD) {
      need += 8;
    }
    if (avail < need) break;
    /* Keys are C strings everywhere else: "a\0b" would silently be the key "a". */
    if (memchr(p + 5, '\0', klen) != NULL) return -1;
    char key[MAX_KEY + 1];
    memcpy(key, p + 5, klen);
    key[klen] = '\0';
    if (op == OP_SET) {
      kvEntry* e = kvPut(s, key, p + 5 + klen + 4, vlen);
      uint8_t one = 1;
      if (e == NULL || writeAll(c->fd, &one, 1) != 0) return -1;
      wakeParked(s, e);
    } else if (op == OP_ADD) {
      /* Two's complement wrap-around, in unsigned arithmetic: a signed overflow would be
       * undefined behaviour, and the counter's bytes come from clients. */
      uint64_t v = mcclGet64(p + 5 + klen);
      kvEntry* e = kvFind(s, key);
      if (e != NULL && e->len == 8) v += mcclGet64(e->val);
      uint8_t enc[8];
      mcclPut64(enc, v);
      e = kvPut(s, key, enc, 8);
      if (e == NULL || writeAll(c->fd, enc, 8) != 0) return -1;
      wakeParked(s, e);
    } else {
      kvEntry* e = kvFind(s, key);
      if (e != NULL) {
        if (replyValue(c, e, op) != 0) return -1;
      } else {
        c->parked_op = op;
        c->parked_key = strdup(key);
      }
    }
    pos += need;
  }
  memmove(c->in, c->in + pos, c->in_len - pos);
  c->in_len -= pos;
  return 0;
}

MCCL_API mcclResult_t mcclTcpStoreListen(const char* host, int port, int* port_out,
                                         mcclTcpStoreServer_t** server) {
  mcclSockaddr addr;
  char text[MCCL_ADDR_STRLEN];
  if (port_out == NULL || server == NULL) {
    mcclSetThreadError("mcclTcpStoreListen: %s is NULL", port_out == NULL ? "port_out" : "server");
    return mcclInvalidArgument;
  }
  if (port < 0 || port > 65535) {
    mcclSetThreadError("mcclTcpStoreListen: port %d is outside 0..65535 (0: an ephemeral port)", port);
    return mcclInvalidArgument;
  }
  snprintf(text, sizeof(text), "%s:%d", host ? host : "0.0.0.0", port > 0 ? port : 1);
  if (mcclSockaddrParse(text, &addr) != 0) {
    mcclSetThreadError("mcclTcpStoreListen: host '%s' is not a numeric IPv4 or [IPv6] address", host);
    return mcclInvalidArgument;
  }
  if (port <= 0) addr.sin.sin_port = 0; /* same offset for sin6_port */
  int fd;
  MCCLCHECK(mcclSocketListen(&addr, &fd));
  mcclTcpStoreServer_t* s = calloc(1, sizeof(*s));
  if (s == NULL || pipe(s->stop_pipe) != 0) {
    close(fd);
    free(s);
    return mcclSystemError;
  }
  s->listen_fd = fd;
  *port_out = ntohs(addr.sa.sa_family == AF_INET6 ? addr.sin6.sin6_port : addr.sin.sin_port);
  *server = s;
  return mcclSuccess;
}

MCCL_API mcclResult_t mcclTcpStoreServe(mcclTcpStoreServer_t* s, int expected_clients) {
  if (s == NULL) {
    mcclSetThreadError("mcclTcpStoreServe: server is NULL");
    return mcclInvalidArgument;
  }
  if (expected_clients < 0) {
    mcclSetThreadError("mcclTcpStoreServe: expected_clients %d is negative (0: serve until stopped)",
                       expected_clients);
    return mcclInvalidArgument;
  }
  int seen = 0;
  for (;;) {
    if (expected_clients > 0 && seen >= expected_clients && s->nclients == 0) return mcclSuccess;
    size_t n = s->nclients + 2;
    struct pollfd pfds[n];
    pfds[0].fd = s->listen_fd;
    pfds[0].events = POLLIN;
    pfds[1].fd = s->stop_pipe[0];
    pfds[1].events = POLLIN;
    for (size_t i = 0; i < s->nclients; i++) {
      pfds[i + 2].fd = s->clients[i].fd;
      pfds[i + 2].events = POLLIN;
    }
    int rc = poll(pfds, (nfds_t)n, 1000);
    if (rc < 0 && errno != EINTR) return mcclSystemError;
    if (rc <= 0) continue;
    if (pfds[1].revents) return mcclSuccess;
    for (size_t i = s->nclients; i-- > 0;) {
      storeClient* c = &s->clients[i];
      if (!pfds[i + 2].revents) continue;
      int drop = 0;
      if (c->in_cap - c->in_len < 65536) {
        size_t cap = c->in_cap * 2 + 65536;
        uint8_t* in = realloc(c->in, cap);
        if (in == NULL) drop = 1;
        else { c->in = in; c->in_cap = cap; }
      }
      if (!drop) {
        ssize_t got = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
        if (got <= 0 && !(got < 0 && (errno == EINTR || errno == EAGAIN))) drop = 1;
        else if (got > 0) {
          c->in_len += (size_t)got;
          if (serveClient(s, c) != 0) drop = 1;
        }
      }
      if (drop) {
        close(c->fd);
        free(c->in);
        free(c->parked_key);
        s->clients[i] = s->clients[--s->nclients];
      }
    }
    if (pfds[0].revents & POLLIN) {
      int fd = mcclSocketAccept(s->listen_fd, NULL, NULL);
      if (fd >= 0) {
        int one = 1; /* answers are small; do not let them wait for the client's ACK */
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (s->nclients == s->clients_cap) {
          size_t cap = s->clients_cap ? s->clients_cap * 2 : 16;
          storeClient* cl = realloc(s->clients, cap * sizeof(storeClient));
          if (cl == NULL) { close(fd); continue; }
          s->clients = cl;
          s->clients_cap = cap;
        }
        memset(&s->clients[s->nclients], 0, sizeof(storeClient));
        s->clients[s->nclients++].fd = fd;
        seen++;
      }
    }
  }
}

MCCL_API void mcclTcpStoreStop(mcclTcpStoreServer_t* s) {
  if (s == NULL) return; /* nothing to stop (void: no result to report) */
  char b = 1;
  ssize_t ignored = write(s->stop_pipe[1], &b, 1);
  (void)ignored;
}

MCCL_API void mcclTcpStoreFree(mcclTcpStoreServer_t* s) {
  if (s == NULL) return;
  close(s->listen_fd);
  close(s->stop_pipe[0]);
  close(s->stop_pipe[1]);
  for (size_t i = 0; i < s->nclients; i++) {
    close(s->clients[i].fd);
    free(s->clients[i].in);
    free(s->clients[i].parked_key);
  }
  for (size_t i = 0; i < s->nkv; i++) {
    free(s->kv[i].key);
    free(s->kv[i].val);
  }
  free(s->clients);
  free(s->kv);
  free(s);
}

/* ---- client ----------------------------------------------------------------------------- */

typedef struct {
  int fd;
  int broken; /* a timed-out request leaves the stream unsynchronised */
  pthread_mutex_t mu;
} storeConn;

static mcclResult_t readFull(storeConn* sc, void* buf, size_t len, int64_t timeout_ms) {
  char* p = buf;
  int64_t deadline = mcclDeadlineNs(timeout_ms);
  while (len > 0) {
    int64_t left = (deadline - mcclNowNs()) / 1000000LL;
    if (left <= 0) { sc->broken = 1; return mcclTimeout; }
    struct pollfd pf = {sc->fd, POLLIN, 0};
    int rc = poll(&pf, 1, left > 1000 ? 1000 : (int)left);
    if (rc < 0 && errno != EINTR) { sc->broken = 1; return mcclSystemError; }
    if (rc <= 0) continue;
    ssize_t n = recv(sc->fd, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) { sc->broken = 1; return mcclRemoteError; }
    p += n;
    len -= (size_t)n;
  }
  return mcclSuccess;
}

static mcclResult_t sendRequest(storeConn* sc, uint8_t op, const char* key, const void* extra, size_t extra_len,
                                const void* val, size_t val_len) {
  if (sc->broken) return mcclRemoteError;
  /* One write per request: split writes meet Nagle's algorithm and the server's delayed ACK, and
   * every request would wait ~40 ms for it. */
  size_t klen = strlen(key), total = 5 + klen + extra_len + val_len;
  uint8_t* req = malloc(total);
  if (req == NULL) return mcclSystemError;
  req[0] = op;
  mcclPut32(req + 1, (uint32_t)klen);
  memcpy(req + 5, key, klen);
  if (extra_len) memcpy(req + 5 + klen, extra, extra_len);
  if (val_len) memcpy(req + 5 + klen + extra_len, val, val_len);
  int bad = writeAll(sc->fd, req, total);
  free(req);
  if (bad) {
    sc->broken = 1;
    return mcclRemoteError;
  }
  return mcclSuccess;
}

static mcclResult_t clientSet(void* ctx, const char* key, const void* value, size_t len) {
  storeConn* sc = ctx;
  uint8_t vlen[4], ack;
  mcclPut32(vlen, (uint32_t)len);
  pthread_mutex_lock(&sc->mu);
  mcclResult_t res = sendRequest(sc, OP_SET, key, vlen, 4, value, len);
  if (res == mcclSuccess) res = readFull(sc, &ack, 1, 60000);
  pthread_mutex_unlock(&sc->mu);
  return res;
}

static mcclResult_t clientGet(void* ctx, const char* key, void* buf, size_t cap, size_t* len, int64_t timeout_ms) {
  storeConn* sc = ctx;
  uint8_t hdr[4];
  pthread_mutex_lock(&sc->mu);
  mcclResult_t res = sendRequest(sc, OP_GET, key, NULL, 0, NULL, 0);
  if (res == mcclSuccess) res = readFull(sc, hdr, 4, timeout_ms);
  if (res == mcclSuccess) {
    uint32_t n = mcclGet32(hdr);
    *len = n;
    char* tmp = malloc(n ? n : 1);
    res = tmp ? readFull(sc, tmp, n, 60000) : mcclSystemError;
    if (res == mcclSuccess) memcpy(buf, tmp, n < cap ? n : cap);
    free(tmp);
  }
  pthread_mutex_unlock(&sc->mu);
  return res;
}

static mcclResult_t clientWait(void* ctx, const char* key, int64_t timeout_ms) {
  storeConn* sc = ctx;
  uint8_t ack;
  pthread_mutex_lock(&sc->mu);
  mcclResult_t res = sendRequest(sc, OP_WAIT, key, NULL, 0, NULL, 0);
  if (res == mcclSuccess) res = readFull(sc, &ack, 1, timeout_ms);
  pthread_mutex_unlock(&sc->mu);
  return res;
}

static mcclResult_t clientAdd(void* ctx, const char* key, int64_t delta, int64_t* result) {
  storeConn* sc = ctx;
  uint8_t enc[8];
  mcclPut64(enc, (uint64_t)delta);
  pthread_mutex_lock(&sc->mu);
  mcclResult_t res = sendRequest(sc, OP_ADD, key, enc, 8, NULL, 0);
  if (res == mcclSuccess) res = readFull(sc, enc, 8, 60000);
  if (res == mcclSuccess) *result = (int64_t)mcclGet64(enc);
  pthread_mutex_unlock(&sc->mu);
  return res;
}

MCCL_API mcclResult_t mcclTcpStoreConnect(const char* host, int port, int64_t timeout_ms, mcclStore_t* store) {
  mcclSockaddr addr;
  char text[MCCL_ADDR_STRLEN];
  if (host == NULL || store == NULL) {
    mcclSetThreadError("mcclTcpStoreConnect: %s is NULL", host == NULL ? "host" : "store");
    return mcclInvalidArgument;
  }
  if (port < 1 || port > 65535) {
    mcclSetThreadError("mcclTcpStoreConnect: port %d is outside 1..65535", port);
    return mcclInvalidArgument;
  }
  if (timeout_ms < 0) {
    mcclSetThreadError("mcclTcpStoreConnect: timeout_ms %lld is negative", (long long)timeout_ms);
    return mcclInvalidArgument;
  }
  snprintf(text, sizeof(text), "%s:%d", host, port);
  if (mcclSockaddrParse(text, &addr) != 0) {
    mcclSetThreadError("mcclTcpStoreConnect: host '%s' is not a numeric IPv4 or [IPv6] address", host);
    return mcclInvalidArgument;
  }
  int64_t deadline = mcclDeadlineNs(timeout_ms);
  for (;;) {
    int fd = mcclSocketOpen(addr.sa.sa_family);
    if (fd < 0) return mcclSystemError;
    if (connect(fd, &addr.sa, mcclSockaddrLen(&addr)) == 0) {
      int one = 1; /* requests are small and each waits for its answer */
      (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      storeConn* sc = calloc(1, sizeof(*sc));
      if (sc == NULL) { close(fd); return mcclSystemError; }
      sc->fd = fd;
      pthread_mutex_init(&sc->mu, NULL);
      store->ctx = sc;
      store->set = clientSet;
      store->get = clientGet;
      store->wait = clientWait;
      store->add = clientAdd;
      return mcclSuccess;
    }
    int err = errno;
    close(fd);
    if (mcclNowNs() >= deadline) {
      mcclSetThreadError("mcclTcpStoreConnect: cannot reach the store at %s: %s", text, strerror(err));
      return mcclTimeout;
    }
    struct timespec pause = {0, 20 * 1000000L}; /* 20 ms between attempts */
    nanosleep(&pause, NULL);
  }
}

MCCL_API void mcclTcpStoreClose(mcclStore_t* store) {
  if (store == NULL || store->ctx == NULL) return;
  storeConn* sc = store->ctx;
  close(sc->fd);
  pthread_mutex_destroy(&sc->mu);
  free(sc);
  store->ctx = NULL;
}
