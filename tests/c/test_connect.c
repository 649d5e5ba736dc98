/*
 * test_connect.c: runtime connection (transport/tcp.h). With 32 ranks (above MCCL_ANNOUNCE_RANKS,
 * so connected on first use by default) a rank opens sockets only to the peers its collectives
 * use: a ring all-reduce adds at most its 2 neighbours and the dissemination agreement's
 * 2 ceil(log2 n) partners, recursive doubling its log2 n partners, a send/recv its peer, and
 * all-to-all every rank. A stranger at a live listener is closed unanswered. Every result is exact.
 * Sockets are counted with fstat (S_ISSOCK) from before mcclCommInitConfig (the bootstrap store's
 * client is already open then), so every count is the communicator's listener plus its peer
 * links. (Counting from after init instead raced: a faster rank may already have dialled this one
 * for the first collective, and that link then fell out of every later count.)
 */
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static int socketsOpen(void) {
  int n = 0;
  long max = sysconf(_SC_OPEN_MAX);
  if (max < 0 || max > 65536) max = 65536;
  for (int fd = 0; fd < max; fd++) {
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) n++;
  }
  return n;
}

/* A blocking TCP connection to "host:port" or "[v6]:port", or -1. */
static int dialText(const char* text) {
  char host[128];
  const char* colon = strrchr(text, ':');
  if (colon == NULL || (size_t)(colon - text) >= sizeof(host)) return -1;
  const char* h = text;
  size_t hl = (size_t)(colon - text);
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
    h++;
    hl -= 2;
  }
  memcpy(host, h, hl);
  host[hl] = '\0';
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof(hints));
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  if (getaddrinfo(host, colon + 1, &hints, &res) != 0) return -1;
  int fd = socket(res->ai_family, SOCK_STREAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  return fd;
}

static int log2Ceil(int n) {
  int k = 0;
  while ((1 << k) < n) k++;
  return k;
}

static int rankMain(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  const int base = socketsOpen(); /* before init: the store's client and whatever else is open */
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  const int lg = log2Ceil(n);

  /* A ring all-reduce (above MCCL_RING_THRESHOLD): integer values, exact. */
  const size_t count = (1u << 20) / 4 + 3;
  float* buf = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; i++) buf[i] = (float)((size_t)r * 7 + i % 13);
  EXPECT_OK(comm, mcclAllReduce(buf, buf, count, mcclFloat32, mcclSum, comm, NULL, NULL));
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) {
    double want = 7.0 * n * (n - 1) / 2 + (double)n * (double)(i % 13);
    bad += buf[i] != (float)want;
  }
  EXPECT(bad == 0, "ring all-reduce: %zu of %zu elements wrong on rank %d", bad, count, r);
  int ring = socketsOpen() - base;
  EXPECT(ring <= 1 + 2 + 2 * lg, "rank %d: %d sockets after a ring all-reduce, more than the listener + 2 + 2 x %d", r,
         ring, lg);
  /* Each count is taken before a collective over the same peers that no rank can leave before
   * every rank has counted: no faster rank dials this one for the next step meanwhile. */
  EXPECT_OK(comm, mcclAllReduce(buf, buf, count, mcclFloat32, mcclMax, comm, NULL, NULL));

  /* Recursive doubling (a small all-reduce). */
  int64_t v = r + 1;
  EXPECT_OK(comm, mcclAllReduce(&v, &v, 1, mcclInt64, mcclSum, comm, NULL, NULL));
  EXPECT(v == (int64_t)n * (n + 1) / 2, "small all-reduce on rank %d: %lld", r, (long long)v);
  int doubling = socketsOpen() - base;
  EXPECT(doubling <= 1 + 2 + 3 * lg, "rank %d: %d sockets after recursive doubling, more than the listener + 2 + 3 x %d",
         r, doubling, lg);
  EXPECT_OK(comm, mcclAllReduce(&v, &v, 1, mcclInt64, mcclMax, comm, NULL, NULL));

  /* Point-to-point to a rank no collective above used (3 away), in both directions. */
  int to = (r + 3) % n, from = (r - 3 + n) % n;
  int32_t out[64], in[64];
  for (int i = 0; i < 64; i++) out[i] = r * 100 + i;
  mcclRequest_t req;
  EXPECT_OK(comm, mcclSend(out, 64, mcclInt32, to, 9, comm, NULL, &req));
  EXPECT_OK(comm, mcclRecv(in, 64, mcclInt32, from, 9, comm, NULL, NULL));
  EXPECT_OK(comm, mcclWait(req, 30000));
  mcclRequestFree(req);
  bad = 0;
  for (int i = 0; i < 64; i++) bad += in[i] != from * 100 + i;
  EXPECT(bad == 0, "send/recv on rank %d: %zu wrong", r, bad);
  int p2p = socketsOpen() - base;
  EXPECT(p2p <= doubling + 2, "rank %d: %d sockets after send/recv, more than %d + 2", r, p2p, doubling);
  EXPECT_OK(comm, mcclAllReduce(&v, &v, 1, mcclInt64, mcclMax, comm, NULL, NULL));

  /* All-to-all needs every peer. */
  int32_t* a = malloc((size_t)n * 4 * sizeof(int32_t));
  int32_t* b = malloc((size_t)n * 4 * sizeof(int32_t));
  for (int i = 0; i < n * 4; i++) a[i] = r * 1000 + i;
  EXPECT_OK(comm, mcclAllToAll(a, b, 4, mcclInt32, comm, NULL, NULL));
  bad = 0;
  for (int p = 0; p < n; p++)
    for (int j = 0; j < 4; j++) bad += b[p * 4 + j] != p * 1000 + r * 4 + j;
  EXPECT(bad == 0, "all-to-all on rank %d: %zu wrong", r, bad);
  int all = socketsOpen() - base;
  EXPECT(all == n, "rank %d: %d sockets after all-to-all, expected %d (the listener and one per peer)", r, all, n);
  /* A stranger at a live rank's listener (it stays open with runtime connection): rank 0 sends
   * the highest rank, which no rank ever dials, one hello's worth of garbage while that rank waits
   * in the next all-reduce; it must be closed unanswered, and the all-reduce must stay exact. */
  if (r == 0) {
    char addr[128], key[64];
    size_t alen = 0;
    snprintf(key, sizeof(key), "mccl/test/g0/addr/%d", n - 1);
    EXPECT(store->get(store->ctx, key, addr, sizeof(addr) - 1, &alen, 10000) == mcclSuccess, "store key %s", key);
    addr[alen] = '\0';
    int fd = dialText(addr);
    EXPECT(fd >= 0, "cannot dial rank %d at %s", n - 1, addr);
    if (fd >= 0) {
      char junk[48];
      memset(junk, 0x5a, sizeof(junk));
      EXPECT(write(fd, junk, sizeof(junk)) == (ssize_t)sizeof(junk), "writing garbage");
      struct pollfd pf = {fd, POLLIN, 0};
      char c;
      EXPECT(poll(&pf, 1, 20000) == 1 && read(fd, &c, 1) == 0,
             "rank %d did not close a stranger's connection (unanswered) within 20 s", n - 1);
      close(fd);
    }
  }
  v = r + 1;
  EXPECT_OK(comm, mcclAllReduce(&v, &v, 1, mcclInt64, mcclSum, comm, NULL, NULL));
  EXPECT(v == (int64_t)n * (n + 1) / 2, "all-reduce after the stranger on rank %d: %lld", r, (long long)v);
  if (r == 0)
    printf("32 ranks, sockets of rank 0's communicator (its listener included): after a ring all-reduce %d, "
           "+ doubling %d, + send/recv %d, + all-to-all %d\n",
           ring, doubling, p2p, all);

  free(buf);
  free(a);
  free(b);
  EXPECT_OK(comm, mcclCommDestroy(comm));
  return harness_failures != 0;
}

int main(void) {
  EXPECT(harnessRunRanks(32, 120, rankMain, NULL) == 0, "32 ranks connected on first use");
  return harnessExit("test_connect");
}
