/*
 * test_lowat.c: the receive low-water mark (MCCL_RECV_LOWAT, mcclTransportWatchIn in tcp.c).
 * Rank 0's real receive path over a TCP loopback connection (SO_RCVLOWAT means nothing on a
 * socketpair), fed hand-made frames by the test as "rank 1":
 *  - while a 256 KiB frame is partly read, the mark asks for exactly the rest of it, and poll()
 *    does not wake the engine for a part of that rest (the receive makes no progress);
 *  - once the rest is there the frame completes, exact;
 *  - a small frame after it is read at once: the mark went back to one header (a mark left at the
 *    last frame's rest would hold it until the progress deadline);
 *  - the mark is capped at MCCL_RECV_LOWAT, and with 0 it stays the kernel's 1.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/comm.h"
#include "core/debug.h"
#include "frames.h"
#include "harness.h"
#include "transport/tcp.h"
#include "transport/wire.h"

#define BIG (256 * 1024)
#define FIRST (100 * 1024) /* payload bytes written with the header */
#define MORE (10 * 1024)   /* then these, short of the rest */
#define SMALL 64

/* A connected TCP pair on 127.0.0.1: *a is the transport's end, *b the test's. */
static int tcpPair(int* a, int* b) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  if (l < 0 || bind(l, (struct sockaddr*)&sa, sizeof(sa)) != 0 || listen(l, 1) != 0 ||
      getsockname(l, (struct sockaddr*)&sa, &len) != 0)
    return -1;
  *b = socket(AF_INET, SOCK_STREAM, 0);
  if (*b < 0 || connect(*b, (struct sockaddr*)&sa, sizeof(sa)) != 0) return -1;
  *a = accept(l, NULL, NULL);
  close(l);
  return *a >= 0 ? 0 : -1;
}

static void sendAll(int fd, const void* p, size_t n) {
  const char* c = p;
  while (n > 0) {
    ssize_t k = send(fd, c, n, 0);
    if (k <= 0) break;
    c += k;
    n -= (size_t)k;
  }
}

static int markOf(int fd) {
  int v = -1;
  socklen_t len = sizeof(v);
  getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, &len);
  return v;
}

/* Progress rounds of 20 ms each until `x` completes or `rounds` are done; the rounds it took. */
static int progressUntil(mcclTransport* t, mcclXfer* x, int rounds) {
  for (int i = 0; i < rounds; i++) {
    if (atomic_load(&x->complete)) return i;
    mcclResult_t res = mcclTransportProgress(t, mcclNowNs() + 20 * 1000000LL, NULL);
    if (res != mcclSuccess && res != mcclTimeout) {
      EXPECT(0, "progress: %s", t->error);
      return rounds;
    }
  }
  return atomic_load(&x->complete) ? rounds : rounds + 1;
}

static void run(int lowat_max) {
  int a = -1, b = -1;
  EXPECT(tcpPair(&a, &b) == 0, "a TCP pair on loopback");
  mcclTransport tp;
  int fds[2] = {-1, a};
  EXPECT(mcclTransportFromFds(&tp, 0, 2, fds) == mcclSuccess, "transport: %s", tp.error);
  tp.lowat_max = lowat_max;
  mcclConn* c = &tp.conns[1];
  const int cap = lowat_max > 0 ? lowat_max : 1;

  uint8_t* src = malloc(BIG);
  uint8_t* dst = calloc(1, BIG);
  for (int i = 0; i < BIG; i++) src[i] = (uint8_t)(i * 7 + 3);
  mcclXfer x;
  memset(&x, 0, sizeof(x));
  x.frame = testDataFrame(0, BIG, 0);
  x.buf = (char*)dst;
  x.bytes = BIG;
  mcclTransportPostRecv(&tp, 1, &x);

  uint8_t hdr[MCCL_FRAME_BYTES];
  mcclFrameEncode(hdr, &x.frame);
  sendAll(b, hdr, sizeof(hdr));
  sendAll(b, src, FIRST);
  /* Until everything written so far is read (loopback delivers it within a round or two). */
  for (int i = 0; i < 50 && c->rx_left != BIG - FIRST; i++) mcclTransportProgress(&tp, mcclNowNs() + 20 * 1000000LL, NULL);
  EXPECT(c->rx_mode == MCCL_RX_COLL && c->rx_left == BIG - FIRST, "header and %d payload bytes read (left %zu)", FIRST,
         c->rx_left);
  mcclTransportProgress(&tp, mcclNowNs() + 20 * 1000000LL, NULL); /* a round that polls for the rest */
  int want = lowat_max == 0 ? 1 : (BIG - FIRST < cap ? BIG - FIRST : cap);
  EXPECT(markOf(a) == want, "mid-payload mark %d, want %d (the rest, capped at %d)", markOf(a), want, cap);

  sendAll(b, src + FIRST, MORE);
  usleep(20000);
  for (int i = 0; i < 5; i++) mcclTransportProgress(&tp, mcclNowNs() + 20 * 1000000LL, NULL);
  if (MORE < want) {
    struct pollfd pf = {a, POLLIN, 0};
    EXPECT(poll(&pf, 1, 0) == 0, "%d bytes under a mark of %d do not make the socket readable", MORE, want);
    EXPECT(c->rx_left == BIG - FIRST, "so no round read them (left %zu)", c->rx_left);
  } else {
    EXPECT(c->rx_left == BIG - FIRST - MORE, "%d bytes at a mark of %d are read (left %zu)", MORE, want, c->rx_left);
  }

  sendAll(b, src + FIRST + MORE, BIG - FIRST - MORE);
  EXPECT(progressUntil(&tp, &x, 100) < 100, "the frame completes once its rest is there");
  EXPECT(memcmp(src, dst, BIG) == 0, "and its bytes are exact");

  /* The next frame is one header and 64 bytes: read within a round of its arrival. */
  mcclXfer y;
  uint8_t small_src[SMALL], small_dst[SMALL];
  for (int i = 0; i < SMALL; i++) small_src[i] = (uint8_t)(200 - i);
  memset(&y, 0, sizeof(y));
  y.frame = testDataFrame(1, SMALL, 0);
  y.buf = (char*)small_dst;
  y.bytes = SMALL;
  mcclTransportPostRecv(&tp, 1, &y);
  mcclTransportProgress(&tp, mcclNowNs() + 5 * 1000000LL, NULL); /* polls with the header's mark */
  EXPECT(markOf(a) == (lowat_max == 0 ? 1 : (MCCL_FRAME_BYTES < cap ? MCCL_FRAME_BYTES : cap)),
         "between frames the mark is one header (%d)", markOf(a));
  mcclFrameEncode(hdr, &y.frame);
  sendAll(b, hdr, sizeof(hdr));
  sendAll(b, small_src, SMALL);
  int64_t t0 = mcclNowNs();
  /* One progress call with a 2 s deadline: it must return with the frame long before. */
  for (int i = 0; i < 3 && !atomic_load(&y.complete); i++) mcclTransportProgress(&tp, mcclNowNs() + 2000 * 1000000LL, NULL);
  double ms = (double)(mcclNowNs() - t0) / 1e6;
  EXPECT(atomic_load(&y.complete) && memcmp(small_src, small_dst, SMALL) == 0, "the small frame arrived, exact");
  EXPECT(ms < 500.0, "and was read at once (%.1f ms)", ms);

  mcclTransportClose(&tp);
  close(b);
  free(src);
  free(dst);
}

int main(void) {
  run(512 * 1024); /* the default: the mark asks for the whole rest */
  run(32 * 1024);  /* capped below the rest */
  run(0);          /* off: the kernel's 1 */
  return harnessExit("test_lowat");
}
