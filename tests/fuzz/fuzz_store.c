/*
 * fuzz_store.c: libFuzzer target for the built-in bootstrap store's server (csrc/core/tcpstore.c),
 * the other place where MCCL parses bytes from the network. Each input starts a fresh server
 * (mcclTcpStoreListen + mcclTcpStoreServe(server, 1) on a thread, the real serve loop), connects
 * one client over loopback TCP, writes the input's request stream in chunks, closes its sending
 * side and reads every reply until the server closes.
 *
 * Oracle: a model of the protocol (tcpstore.c's header comment) computes the exact reply bytes a
 * single client must get: SET -> 1; ADD -> the new 8-byte value; GET/WAIT of an existing key ->
 * its value / 1; GET/WAIT of a missing key parks the client (nobody else can set it, so nothing
 * after it is answered); a malformed request (unknown op, key length 0 or over 4096, a NUL in the
 * key, a value over 64 MiB) ends the connection. The replies must equal the model's, byte for
 * byte, and the server must return mcclSuccess once the client has gone.
 *
 * Input: u8 chunking seed (0: one write), then the request stream.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "mccl.h"

#define REQUIRE(cond)                                                    \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "fuzz_store: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      abort(); /* the harness, not the library: libFuzzer reports it */  \
    }                                                                    \
  } while (0)

/* ---- the model --------------------------------------------------------------------------- */

#define MAX_KEY 4096
#define MAX_VALUE (64u << 20)

typedef struct {
  char key[MAX_KEY + 1];
  uint8_t val[4096]; /* inputs are at most 4 KiB, so are values */
  uint32_t len;
} modelEntry;

typedef struct {
  modelEntry* kv;
  size_t nkv;
  uint8_t* out; /* the replies expected */
  size_t out_len, out_cap;
  int malformed; /* the stream ends in a request the server must refuse (it then drops us) */
} model;

static void emit(model* m, const void* p, size_t n) {
  if (m->out_len + n > m->out_cap) {
    m->out_cap = (m->out_len + n) * 2;
    m->out = realloc(m->out, m->out_cap);
    REQUIRE(m->out != NULL);
  }
  memcpy(m->out + m->out_len, p, n);
  m->out_len += n;
}

static modelEntry* find(model* m, const char* key) {
  for (size_t i = 0; i < m->nkv; i++)
    if (strcmp(m->kv[i].key, key) == 0) return &m->kv[i];
  return NULL;
}

static modelEntry* put(model* m, const char* key, const uint8_t* val, uint32_t len) {
  modelEntry* e = find(m, key);
  if (e == NULL) {
    e = &m->kv[m->nkv++];
    snprintf(e->key, sizeof(e->key), "%s", key);
  }
  REQUIRE(len <= sizeof(e->val));
  memcpy(e->val, val, len);
  e->len = len;
  return e;
}

/* The replies to `in` (the whole stream, then end of file). */
static void modelRun(model* m, const uint8_t* in, size_t len) {
  size_t pos = 0;
  for (;;) {
    size_t avail = len - pos;
    const uint8_t* p = in + pos;
    if (avail < 5) return;
    uint8_t op = p[0];
    uint32_t klen = mcclGet32(p + 1);
    if (op < 1 || op > 4 || klen == 0 || klen > MAX_KEY) {
      m->malformed = 1;
      return;
    }
    size_t need = 5 + (size_t)klen;
    uint32_t vlen = 0;
    if (op == 1) {
      if (avail < need + 4) return;
      vlen = mcclGet32(p + need);
      if (vlen > MAX_VALUE) {
        m->malformed = 1;
        return;
      }
      need += 4 + (size_t)vlen;
    } else if (op == 3) {
      need += 8;
    }
    if (avail < need) return;
    if (memchr(p + 5, '\0', klen) != NULL) {
      m->malformed = 1;
      return;
    }
    char key[MAX_KEY + 1];
    memcpy(key, p + 5, klen);
    key[klen] = '\0';
    if (op == 1) {
      put(m, key, p + 5 + klen + 4, vlen);
      uint8_t one = 1;
      emit(m, &one, 1);
    } else if (op == 3) {
      int64_t v = (int64_t)mcclGet64(p + 5 + klen);
      modelEntry* e = find(m, key);
      if (e != NULL && e->len == 8) v = (int64_t)((uint64_t)v + mcclGet64(e->val));
      uint8_t enc[8];
      mcclPut64(enc, (uint64_t)v);
      put(m, key, enc, 8);
      emit(m, enc, 8);
    } else {
      modelEntry* e = find(m, key);
      if (e == NULL) return; /* parked for good: a single client never sets it */
      if (op == 4) {
        uint8_t one = 1;
        emit(m, &one, 1);
      } else {
        uint8_t hdr[4];
        mcclPut32(hdr, e->len);
        emit(m, hdr, 4);
        emit(m, e->val, e->len);
      }
    }
    pos += need;
  }
}

/* ---- the server under test ------------------------------------------------------------------ */

typedef struct {
  mcclTcpStoreServer_t* server;
  mcclResult_t result;
} serveArg;

static void* serveThread(void* p) {
  serveArg* a = p;
  a->result = mcclTcpStoreServe(a->server, 1);
  return NULL;
}

/* Read what has arrived (or wait up to `ms` for something); -1 at end of stream. */
static int readSome(int fd, uint8_t** buf, size_t* len, size_t* cap, int ms) {
  struct pollfd pf = {fd, POLLIN, 0};
  if (poll(&pf, 1, ms) <= 0) return 0;
  if (*cap - *len < 65536) {
    *cap = *cap * 2 + 65536;
    *buf = realloc(*buf, *cap);
    REQUIRE(*buf != NULL);
  }
  ssize_t n = recv(fd, *buf + *len, *cap - *len, MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return -1; /* EOF or reset */
  if (n > 0) *len += (size_t)n;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 4096) return 0;
  uint32_t rng = (uint32_t)data[0] * 2654435761u;
  const uint8_t* stream = data + 1;
  size_t stream_len = size - 1;

  model m;
  memset(&m, 0, sizeof(m));
  m.kv = calloc(stream_len / 5 + 1, sizeof(modelEntry));
  REQUIRE(m.kv != NULL);
  modelRun(&m, stream, stream_len);

  int port = 0;
  serveArg a = {NULL, mcclInternalError};
  REQUIRE(mcclTcpStoreListen("127.0.0.1", 0, &port, &a.server) == mcclSuccess);
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, serveThread, &a) == 0);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  struct sockaddr_in sin;
  memset(&sin, 0, sizeof(sin));
  sin.sin_family = AF_INET;
  sin.sin_port = htons((uint16_t)port);
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  /* libFuzzer's timer signal (-timeout) interrupts blocking calls: retry them. */
  int rc;
  do {
    rc = connect(fd, (struct sockaddr*)&sin, sizeof(sin));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0 && errno == EISCONN) rc = 0; /* an interrupted connect that completed meanwhile */
  if (rc != 0 && (errno == EALREADY || errno == EINPROGRESS)) {
    struct pollfd pf = {fd, POLLOUT, 0};
    while (poll(&pf, 1, 10000) < 0 && errno == EINTR) {}
    int err = 0;
    socklen_t el = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    rc = err == 0 ? 0 : -1;
    errno = err;
  }
  if (rc != 0) {
    fprintf(stderr, "fuzz_store: connect to 127.0.0.1:%d: %s\n", port, strerror(errno));
    REQUIRE(0);
  }
  /* Closing with unread replies must not turn into a reset that hides them: replies are read
   * while writing, and the socket is closed only after end of stream. */
  uint8_t* got = NULL;
  size_t got_len = 0, got_cap = 0;
  int eof = 0;
  size_t pos = 0;
  while (pos < stream_len && !eof) {
    size_t n = stream_len - pos;
    if (data[0] != 0) {
      rng = rng * 1103515245u + 12345u;
      size_t piece = 1 + (rng >> 16) % 48;
      if (piece < n) n = piece;
    }
    ssize_t w = send(fd, stream + pos, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break; /* the server dropped us (a malformed request): fine, see below */
    pos += (size_t)w;
    if (readSome(fd, &got, &got_len, &got_cap, 0) < 0) eof = 1;
  }
  shutdown(fd, SHUT_WR);
  for (int waited = 0; !eof && waited < 10000; waited += 100)
    if (readSome(fd, &got, &got_len, &got_cap, 100) < 0) eof = 1;
  REQUIRE(eof); /* the server must close once the client is done (within 10 s) */
  close(fd);
  pthread_join(th, NULL);
  REQUIRE(a.result == mcclSuccess);
  mcclTcpStoreFree(a.server);
  /* A server that refuses a request closes with our later bytes unread, which makes the kernel
   * reset the connection and may discard replies we had not read yet: then only a prefix of the
   * model's replies is certain. */
  int ok = m.malformed ? got_len <= m.out_len : got_len == m.out_len;
  if (!ok || (got_len > 0 && memcmp(got, m.out, got_len) != 0)) {
    fprintf(stderr, "fuzz_store: %zu reply bytes differ from the model's %zu%s\n", got_len, m.out_len,
            m.malformed ? " (a prefix of them, the stream being malformed)" : "");
    REQUIRE(0);
  }
  free(got);
  free(m.out);
  free(m.kv);
  return 0;
}
