/*
 * test_park.c: parking of collective frames that arrive before their receive
 * (csrc/transport/park.{h,c} and its use in tcp.c). First the byte ring on its own (wrapping,
 * bounds), then rank 0's real receive path fed hand-made frames through a socketpair as "rank 1",
 * while a send to "rank 2" that nobody reads keeps rank 0 busy (a progress round reads ahead while
 * a rank has transfers posted, as during a collective): frames are read
 * ahead into the park up to its bound and no further (and by an idle engine too, between
 * collectives), handed to receives posted later in arrival
 * order with their bytes exact, checked against those receives as frames read directly are (a
 * mismatch fails naming the field), and closes, frames that do not fit and failure notices outside
 * a collective are never read ahead (mcclTransportSettle still sees the notice), while a notice
 * during a collective its sender did not complete fails it at once. Then credits (park.h): a sender stops
 * at the window until reports come, and goes on without them while its reader is stopped; a
 * receiver reports every MCCL_CREDIT_CHUNK its receives take, and a report does not hide a notice.
 * Last, 4 ranks of which one enters an all-reduce 1 s late: no rank's RSS grows by more than its
 * park bound plus 2 MiB, no sender leads by more than the window, and nothing waits in the late
 * rank's kernel buffers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "core/comm.h"
#include "core/debug.h"
#include "core/param.h"
#include "frames.h"
#include "harness.h"
#include "transport/park.h"
#include "transport/tcp.h"
#include "transport/wire.h"

/* ---- the byte ring -------------------------------------------------------------------------- */

/* Fill `e`'s payload through mcclParkSpan with bytes i*7+salt, as a reader would. */
static void parkFill(mcclPark* p, mcclParkedFrame* e, uint8_t salt) {
  char* dst;
  size_t room;
  size_t i = 0;
  for (mcclParkSpan(p, e, &dst, &room); room > 0; mcclParkSpan(p, e, &dst, &room)) {
    for (size_t k = 0; k < room; k++, i++) dst[k] = (char)(uint8_t)(i * 7 + salt);
    e->got += room;
  }
}

static int parkHolds(mcclPark* p, mcclParkedFrame* e, uint8_t salt) {
  char* out = malloc(e->frame.length + 1);
  mcclParkCopyOut(p, e, out, e->got);
  int ok = e->got == e->frame.length;
  for (size_t i = 0; i < e->got && ok; i++) ok = (uint8_t)out[i] == (uint8_t)(i * 7 + salt);
  free(out);
  return ok;
}

static void testRing(void) {
  mcclPark p;
  memset(&p, 0, sizeof(p));
  p.cap = 1000;
  EXPECT(mcclParkFits(&p, 1000) && !mcclParkFits(&p, 1001), "a frame fits iff its payload fits the whole park");
  mcclFrame a = testDataFrame(0, 400, 0), b = testDataFrame(1, 400, 0), c = testDataFrame(2, 500, 0);
  mcclParkedFrame* e = mcclParkPush(&p, &a);
  parkFill(&p, e, 1);
  e = mcclParkPush(&p, &b);
  parkFill(&p, e, 2);
  EXPECT(p.used == 800 && !mcclParkFits(&p, 201) && mcclParkFits(&p, 200), "used %zu", p.used);
  EXPECT(parkHolds(&p, mcclParkHead(&p), 1), "first frame's bytes");
  mcclParkPop(&p);
  e = mcclParkPush(&p, &c); /* 800..1000, then 0..300: wraps */
  EXPECT(e->off == 800, "third frame starts at %zu", e->off);
  parkFill(&p, e, 3);
  EXPECT(mcclParkHead(&p)->frame.step == 1 && parkHolds(&p, mcclParkHead(&p), 2), "second frame, untouched by the third");
  mcclParkPop(&p);
  EXPECT(mcclParkHead(&p)->frame.step == 2 && parkHolds(&p, mcclParkHead(&p), 3), "the wrapped frame reads back whole");
  EXPECT(p.peak == 900, "peak %zu", p.peak);
  mcclParkPop(&p);
  EXPECT(p.qlen == 0 && p.used == 0, "empty again");
  /* Empty frames (announcements) take a header each, up to MCCL_PARK_MAX_FRAMES. */
  mcclFrame z = testDataFrame(0, 0, 1);
  int n = 0;
  while (mcclParkFits(&p, 0) && n <= MCCL_PARK_MAX_FRAMES) mcclParkPush(&p, &z), n++;
  EXPECT(n == MCCL_PARK_MAX_FRAMES, "%d empty frames parked", n);
  mcclParkFree(&p);
  EXPECT(p.cap == 1000 && p.qlen == 0 && p.buf == NULL, "free keeps the bound");
  mcclPark off;
  memset(&off, 0, sizeof(off));
  EXPECT(!mcclParkFits(&off, 0), "a park of 0 bytes takes nothing (MCCL_PARK_BYTES=0)");
}

/* ---- the receive path ----------------------------------------------------------------------- */

#define SEG (64 * 1024)
#define NFRAMES 6

typedef struct {
  uint8_t* bytes; /* what "rank 1" writes: headers and payloads */
  size_t len, sent;
} Wire;

static void wireAdd(Wire* w, const mcclFrame* f, const void* payload) {
  w->bytes = realloc(w->bytes, w->len + MCCL_FRAME_BYTES + f->length);
  mcclFrameEncode(w->bytes + w->len, f);
  memcpy(w->bytes + w->len + MCCL_FRAME_BYTES, payload, f->length);
  w->len += MCCL_FRAME_BYTES + f->length;
}

/* Write what the socket takes; 1 when everything is written. */
static int wirePump(Wire* w, int fd) {
  while (w->sent < w->len) {
    ssize_t n = send(fd, w->bytes + w->sent, w->len - w->sent, MSG_DONTWAIT);
    if (n <= 0) return 0;
    w->sent += (size_t)n;
  }
  return 1;
}

/* Rank 0 of 3: rank 1 is `peer_fd` (the test writes its frames there), rank 2 is `busy_fd`, where
 * a send of 8 MiB that is never read stays posted. */
typedef struct {
  mcclTransport tp;
  int peer_fd, busy_fd;
  mcclXfer busy;
  char* busy_buf;
} Rig;

static int rigOpen(Rig* g) {
  memset(g, 0, sizeof(*g));
  int a[2], b[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a) != 0) return -1;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, b) != 0) return -1;
  int fds[3] = {-1, a[0], b[0]};
  if (mcclTransportFromFds(&g->tp, 0, 3, fds) != mcclSuccess) return -1;
  g->peer_fd = a[1];
  g->busy_fd = b[1];
  fcntl(g->peer_fd, F_SETFL, fcntl(g->peer_fd, F_GETFL, 0) | O_NONBLOCK);
  g->busy_buf = calloc(1, 8 << 20);
  g->busy.frame = testDataFrame(0, 8 << 20, 0);
  g->busy.buf = g->busy_buf;
  g->busy.bytes = 8 << 20;
  mcclTransportPostSend(&g->tp, 2, &g->busy);
  return 0;
}

static void rigClose(Rig* g) {
  mcclTransportClose(&g->tp);
  if (g->peer_fd >= 0) close(g->peer_fd);
  close(g->busy_fd);
  free(g->busy_buf);
}

static mcclResult_t progress(Rig* g) {
  mcclResult_t res = mcclTransportProgress(&g->tp, mcclNowNs() + 2 * 1000000LL, NULL);
  return res == mcclTimeout ? mcclSuccess : res; /* the busy send never completes */
}

static void payloadOf(int i, float* out, size_t n) {
  for (size_t k = 0; k < n; k++) out[k] = (float)(i * 100000 + (int)k);
}

/* Frames F0..F5 of 64 KiB arrive with no receive posted; the park (3 frames' worth) takes F0..F2
 * and reading stops there; receives posted afterwards get every frame exact, in order. */
static void testReadAheadBound(void) {
  Rig lb;
  EXPECT(rigOpen(&lb) == 0, "rig");
  mcclConn* c = &lb.tp.conns[1];
  c->park.cap = 3 * SEG;
  Wire w = {0};
  float* src = malloc(SEG);
  for (int i = 0; i < NFRAMES; i++) {
    payloadOf(i, src, SEG / sizeof(float));
    mcclFrame f = testDataFrame((uint32_t)i, SEG, 0);
    wireAdd(&w, &f, src);
  }
  for (int round = 0; round < 200; round++) {
    wirePump(&w, lb.peer_fd);
    EXPECT(progress(&lb) == mcclSuccess, "progress: %s", lb.tp.error);
  }
  EXPECT(c->park.qlen == 3 && c->park.used == 3 * SEG, "parked %d frames, %zu bytes", c->park.qlen, c->park.used);
  EXPECT(c->park.peak <= c->park.cap, "peak %zu over the bound %zu", c->park.peak, c->park.cap);
  EXPECT(c->ahead_stop == 1 && c->rx_mode == MCCL_RX_HEADER, "the fourth frame is left to TCP (mode %d)", c->rx_mode);

  mcclXfer x[NFRAMES];
  float* dst[NFRAMES];
  memset(x, 0, sizeof(x));
  for (int i = 0; i < NFRAMES; i++) {
    dst[i] = calloc(1, SEG);
    x[i].frame = testDataFrame((uint32_t)i, SEG, 0);
    x[i].buf = (char*)dst[i];
    x[i].bytes = SEG;
    mcclTransportPostRecv(&lb.tp, 1, &x[i]);
  }
  int64_t until = mcclNowNs() + 5000 * 1000000LL;
  while (!atomic_load(&x[NFRAMES - 1].complete) && mcclNowNs() < until) {
    wirePump(&w, lb.peer_fd);
    mcclResult_t res = progress(&lb);
    EXPECT(res == mcclSuccess, "progress: %s", lb.tp.error);
    if (res != mcclSuccess) break;
  }
  for (int i = 0; i < NFRAMES; i++) {
    payloadOf(i, src, SEG / sizeof(float));
    EXPECT(atomic_load(&x[i].complete) && memcmp(src, dst[i], SEG) == 0, "frame %d complete and exact", i);
    free(dst[i]);
  }
  EXPECT(c->park.qlen == 0 && c->park.parked == 3, "park empty at the end (%d left, %llu parked in all)",
         c->park.qlen, (unsigned long long)c->park.parked);
  char desc[64];
  EXPECT(mcclTransportUnread(&lb.tp, desc, sizeof(desc)) == 0, "nothing unread: %s", desc);
  free(src);
  free(w.bytes);
  rigClose(&lb);
}

/* A parked frame is checked against the receive it is given to: another step is a mismatch. */
static void testParkedMismatch(void) {
  Rig lb;
  EXPECT(rigOpen(&lb) == 0, "rig");
  Wire w = {0};
  char payload[256] = {0};
  mcclFrame f = testDataFrame(9, sizeof(payload), 0);
  wireAdd(&w, &f, payload);
  for (int round = 0; round < 20; round++) {
    wirePump(&w, lb.peer_fd);
    EXPECT(progress(&lb) == mcclSuccess, "progress: %s", lb.tp.error);
  }
  EXPECT(lb.tp.conns[1].park.qlen == 1, "parked");
  char out[256];
  mcclXfer x;
  memset(&x, 0, sizeof(x));
  x.frame = testDataFrame(10, sizeof(out), 0);
  x.buf = out;
  x.bytes = sizeof(out);
  mcclTransportPostRecv(&lb.tp, 1, &x);
  mcclResult_t res = progress(&lb);
  EXPECT(res == mcclMismatch && strstr(lb.tp.error, "step") != NULL, "%s: %s", mcclGetErrorString(res),
         lb.tp.error);
  EXPECT(!atomic_load(&x.complete), "the mismatched receive did not complete");
  free(w.bytes);
  rigClose(&lb);
}

/* Rank 1's failure notice "boom": from a rank that completed no collective, or (behind_parked)
 * behind a frame of collective #1, from a rank that completed #0. */
static void noticeWire(Wire* w, int behind_parked) {
  char payload[128] = {0};
  if (behind_parked) {
    mcclFrame f = testDataFrame(0, sizeof(payload), 1); /* collective #1's: the peer completed #0 */
    wireAdd(w, &f, payload);
  }
  const char reason[] = "boom";
  mcclFrame a;
  memset(&a, 0, sizeof(a));
  a.type = MCCL_FRAME_ABORT;
  a.seq = behind_parked ? 1 : 0; /* collectives its sender completed */
  a.length = sizeof(reason) - 1;
  wireAdd(w, &a, reason);
}

/* Outside a collective a failure notice is never read ahead: it stays in the socket for mcclTransportSettle, which
 * fails the collective the notice's sender did not complete; behind a parked frame of the next
 * collective it cannot concern this one. */
static void testNoticeNotReadAhead(int behind_parked) {
  Rig lb;
  EXPECT(rigOpen(&lb) == 0, "rig");
  mcclConn* c = &lb.tp.conns[1];
  Wire w = {0};
  noticeWire(&w, behind_parked);
  for (int round = 0; round < 20; round++) {
    wirePump(&w, lb.peer_fd);
    EXPECT(progress(&lb) == mcclSuccess, "progress: %s", lb.tp.error);
  }
  EXPECT(c->park.qlen == (behind_parked ? 1 : 0) && c->ahead_stop == 1 && c->rx_mode == MCCL_RX_HEADER && !c->dead,
         "parked %d, ahead_stop %d, mode %d, dead %d", c->park.qlen, c->ahead_stop, c->rx_mode, c->dead);
  uint8_t peek[MCCL_FRAME_BYTES];
  EXPECT(recv(c->fd, peek, sizeof(peek), MSG_PEEK | MSG_DONTWAIT) == (ssize_t)sizeof(peek) && peek[4] == MCCL_FRAME_ABORT,
         "the notice is still in the socket");
  mcclResult_t res = mcclTransportSettle(&lb.tp, 0);
  if (behind_parked)
    EXPECT(res == mcclSuccess, "collective #0 settles: the notice's sender completed it (%s)", lb.tp.error);
  else
    EXPECT(res == mcclRemoteError && strstr(lb.tp.error, "boom") != NULL, "settle: %s: %s",
           mcclGetErrorString(res), lb.tp.error);
  free(w.bytes);
  rigClose(&lb);
}

/* During collective #0 (mcclTransportCollectiveBegin) a notice from a rank that did not complete
 * it is read ahead and fails the collective at once, naming the rank and its reason, on a link
 * where nothing is posted; one from a rank that completed #0 (behind its parked frame of #1)
 * waits for #1. A notice that arrived between collectives is looked at again when #0 begins. */
static void testNoticeDuringCollective(int behind_parked, int before_begin) {
  Rig lb;
  EXPECT(rigOpen(&lb) == 0, "rig");
  mcclConn* c = &lb.tp.conns[1];
  Wire w = {0};
  noticeWire(&w, behind_parked);
  mcclResult_t res = mcclSuccess;
  if (before_begin) { /* it arrives between collectives: left in the socket */
    for (int round = 0; round < 20; round++) {
      wirePump(&w, lb.peer_fd);
      EXPECT(progress(&lb) == mcclSuccess, "progress between collectives: %s", lb.tp.error);
    }
    EXPECT(c->ahead_stop == 1 && !c->dead, "between collectives the notice waits (ahead_stop %d)", c->ahead_stop);
  }
  const mcclFrame id = testDataFrame(0, 0, 0); /* collective #0: an all-reduce */
  EXPECT(mcclTransportCollectiveBegin(&lb.tp, &id, 0, 0) == mcclSuccess, "begin: %s", lb.tp.error);
  for (int round = 0; round < 20 && res == mcclSuccess; round++) {
    wirePump(&w, lb.peer_fd);
    res = progress(&lb);
  }
  if (behind_parked) {
    EXPECT(res == mcclSuccess && c->park.qlen == 1 && !c->dead, "a notice behind collective #1's frame waits: %s (%s)",
           mcclGetErrorString(res), lb.tp.error);
  } else {
    EXPECT(res == mcclRemoteError && strstr(lb.tp.error, "rank 1") != NULL && strstr(lb.tp.error, "boom") != NULL,
           "the notice fails collective #0 at once: %s: %s", mcclGetErrorString(res), lb.tp.error);
    EXPECT(c->dead, "rank 1 is marked failed");
  }
  mcclTransportCollectiveEnd(&lb.tp, res);
  free(w.bytes);
  rigClose(&lb);
}

/* During collective #0 (an all-reduce), frames that arrive before their receive are checked
 * against it at once: rank 1's frame of an all-gather #0 (it issued another collective in that
 * place) fails the collective with a mismatch naming the kinds, whether the frame fits the park or
 * not (`big`: larger than the park, left unread before); a frame of the same collective with
 * another count (an algorithm's phase) is parked, as is any frame of collective #1. `early`: the
 * frame arrives before the collective begins (parked unchecked while idle, or left in the socket
 * when big); then mcclTransportCollectiveBegin (small) or the first progress (big) fails. */
static void testOtherCollectiveAtOnce(int big, int same, int early) {
  Rig lb;
  EXPECT(rigOpen(&lb) == 0, "rig");
  mcclConn* c = &lb.tp.conns[1];
  c->park.cap = 2 * SEG;
  Wire w = {0};
  const uint32_t len = big ? 3 * SEG : 256;
  char* payload = calloc(1, len);
  mcclFrame f = testDataFrame(0, len, same == 2 ? 1 : 0);
  if (same == 1) f.count = 3 << 20; /* the same collective, another phase's count */
  else if (same == 0) f.coll = MCCL_COLL_ALLGATHER;
  wireAdd(&w, &f, payload);
  const mcclFrame id = testDataFrame(0, 0, 0);
  for (int round = 0; early && round < 20; round++) {
    wirePump(&w, lb.peer_fd);
    EXPECT(progress(&lb) == mcclSuccess, "idle progress: %s", lb.tp.error);
  }
  EXPECT(!early || c->park.qlen == (big ? 0 : 1), "parked %d before the collective", c->park.qlen);
  mcclResult_t res = mcclTransportCollectiveBegin(&lb.tp, &id, 0, 0);
  EXPECT(res == (early && !big && !same ? mcclMismatch : mcclSuccess), "begin: %s: %s", mcclGetErrorString(res),
         lb.tp.error);
  for (int round = 0; round < 20 && res == mcclSuccess; round++) {
    wirePump(&w, lb.peer_fd);
    res = progress(&lb);
  }
  if (same) {
    EXPECT(res == mcclSuccess && c->park.qlen == (big ? 0 : 1), "%s, %s: %s (%s), parked %d",
           same == 1 ? "another count" : "collective #1", big ? "big" : "small", mcclGetErrorString(res),
           lb.tp.error, c->park.qlen);
  } else {
    EXPECT(res == mcclMismatch && strstr(lb.tp.error, "coll") != NULL && strstr(lb.tp.error, "rank 1") != NULL,
           "another collective (%s): %s: %s", big ? "big" : "small", mcclGetErrorString(res), lb.tp.error);
  }
  mcclTransportCollectiveEnd(&lb.tp, res);
  free(payload);
  free(w.bytes);
  rigClose(&lb);
}

/* A peer that sent a frame and closed: the frame is parked, the close is not read ahead; the
 * receive for the frame completes, and only a receive for more fails, naming the close. */
static void testCloseAfterParked(void) {
  Rig lb;
  EXPECT(rigOpen(&lb) == 0, "rig");
  Wire w = {0};
  char payload[1000];
  for (size_t i = 0; i < sizeof(payload); i++) payload[i] = (char)i;
  mcclFrame f = testDataFrame(0, sizeof(payload), 0);
  wireAdd(&w, &f, payload);
  EXPECT(wirePump(&w, lb.peer_fd), "written");
  close(lb.peer_fd);
  lb.peer_fd = -1;
  for (int round = 0; round < 20; round++) EXPECT(progress(&lb) == mcclSuccess, "progress: %s", lb.tp.error);
  EXPECT(lb.tp.conns[1].park.qlen == 1, "parked");
  char out[1000], more[1000];
  mcclXfer x[2];
  memset(x, 0, sizeof(x));
  x[0].frame = testDataFrame(0, sizeof(out), 0);
  x[0].buf = out;
  x[0].bytes = sizeof(out);
  x[1].frame = testDataFrame(1, sizeof(more), 0);
  x[1].buf = more;
  x[1].bytes = sizeof(more);
  mcclTransportPostRecv(&lb.tp, 1, &x[0]);
  mcclTransportPostRecv(&lb.tp, 1, &x[1]);
  mcclResult_t res = mcclSuccess;
  for (int round = 0; round < 20 && res == mcclSuccess; round++) res = progress(&lb);
  EXPECT(atomic_load(&x[0].complete) && memcmp(out, payload, sizeof(out)) == 0, "the parked frame arrived whole");
  EXPECT(res == mcclRemoteError && strstr(lb.tp.error, "closed the connection") != NULL, "%s: %s",
         mcclGetErrorString(res), lb.tp.error);
  free(w.bytes);
  rigClose(&lb);
}

/* ---- credits -------------------------------------------------------------------------------- */

/* Read everything "rank 1" has been sent by rank 0 so far into `got` (grown as needed). */
static void drainPeer(int fd, uint8_t** got, size_t* len, size_t* cap) {
  for (;;) {
    if (*cap - *len < 65536) {
      *cap = *cap * 2 + 65536;
      *got = realloc(*got, *cap);
    }
    ssize_t n = recv(fd, *got + *len, *cap - *len, MSG_DONTWAIT);
    if (n <= 0) return;
    *len += (size_t)n;
  }
}

static void sendCredit(int fd, uint64_t total) {
  mcclFrame f;
  memset(&f, 0, sizeof(f));
  f.type = MCCL_FRAME_CREDIT;
  f.seq = total;
  uint8_t hdr[MCCL_FRAME_BYTES];
  mcclFrameEncode(hdr, &f);
  EXPECT(send(fd, hdr, sizeof(hdr), 0) == (ssize_t)sizeof(hdr), "credit written");
}

#define CFRAMES 24
#define CWINDOW (16 * SEG) /* 1 MiB: the lead may reach it (above MCCL_CREDIT_CHUNK) */

/* Rank 0 posts 24 collective frames of 64 KiB to "rank 1", which reads every byte (so TCP holds
 * nothing back) but reports nothing: exactly the window's worth (16 frames) leaves, the 17th waits
 * for credit. A report of 8 frames taken lets 8 more go; a report of all lets the rest go; every
 * frame arrives exact and in order. A report of more than was sent is a protocol error. */
static void testCreditBound(void) {
  Rig lb;
  EXPECT(rigOpen(&lb) == 0, "rig");
  mcclConn* c = &lb.tp.conns[1];
  c->credit.window = CWINDOW;
  mcclXfer x[CFRAMES];
  float* src[CFRAMES];
  memset(x, 0, sizeof(x));
  for (int i = 0; i < CFRAMES; i++) {
    src[i] = malloc(SEG);
    payloadOf(i, src[i], SEG / sizeof(float));
    x[i].frame = testDataFrame((uint32_t)i, SEG, 0);
    x[i].buf = (char*)src[i];
    x[i].bytes = SEG;
    mcclTransportPostSend(&lb.tp, 1, &x[i]);
  }
  uint8_t* got = NULL;
  size_t len = 0, cap = 0;
  const size_t frame = MCCL_FRAME_BYTES + SEG;
  for (int round = 0; round < 200; round++) {
    EXPECT(progress(&lb) == mcclSuccess, "progress: %s", lb.tp.error);
    drainPeer(lb.peer_fd, &got, &len, &cap);
  }
  EXPECT(len == 16 * frame, "before any report: %zu bytes left, %zu expected (the window)", len, 16 * frame);
  /* A timeout now names the rank whose receives hold the credit back, in the words every timeout
   * uses for the rank it waited on ("was waiting for rank N (address) to ..."). */
  mcclResult_t stalled = mcclTransportProgress(&lb.tp, mcclNowNs() + 2 * 1000000LL, NULL);
  EXPECT(stalled == mcclTimeout && strstr(lb.tp.error, "was waiting for rank 1 (") != NULL &&
             strstr(lb.tp.error, " to take ") != NULL && strstr(lb.tp.error, "MCCL_CREDITS") != NULL,
         "the credit stall's timeout: %s: %s", mcclGetErrorString(stalled), lb.tp.error);
  EXPECT(atomic_load(&c->credit.waits) == 1 && atomic_load(&c->credit.peak) == CWINDOW,
         "waits %llu, peak lead %llu", (unsigned long long)atomic_load(&c->credit.waits),
         (unsigned long long)atomic_load(&c->credit.peak));
  sendCredit(lb.peer_fd, 8 * SEG);
  for (int round = 0; round < 200; round++) {
    EXPECT(progress(&lb) == mcclSuccess, "progress: %s", lb.tp.error);
    drainPeer(lb.peer_fd, &got, &len, &cap);
  }
  EXPECT(len == 24 * frame - 0 * frame && atomic_load(&c->credit.granted) == 8 * SEG,
         "after a report of 8 frames: %zu bytes left (%zu expected)", len, 24 * frame);
  EXPECT(atomic_load(&x[CFRAMES - 1].complete), "the last frame was written");
  /* (8 taken + 16 window = 24: all of them.) */
  for (int i = 0; i < CFRAMES && len == CFRAMES * frame; i++) {
    mcclFrame f;
    EXPECT(mcclFrameDecode(got + (size_t)i * frame, &f) == 0 && f.type == MCCL_FRAME_DATA && f.step == (uint32_t)i,
           "frame %d in order", i);
    EXPECT(memcmp(got + (size_t)i * frame + MCCL_FRAME_BYTES, src[i], SEG) == 0, "frame %d exact", i);
  }
  sendCredit(lb.peer_fd, CFRAMES * SEG);
  EXPECT(progress(&lb) == mcclSuccess && atomic_load(&c->credit.granted) == CFRAMES * SEG, "report of all: %s",
         lb.tp.error);
  /* Left: the rig's 8 MiB send to rank 2, which reads nothing. */
  stalled = mcclTransportProgress(&lb.tp, mcclNowNs() + 2 * 1000000LL, NULL);
  EXPECT(stalled == mcclTimeout && strstr(lb.tp.error, "was waiting for rank 2 (") != NULL &&
             strstr(lb.tp.error, "it stopped reading") != NULL,
         "the unread send's timeout: %s: %s", mcclGetErrorString(stalled), lb.tp.error);
  sendCredit(lb.peer_fd, CFRAMES * SEG + 1);
  mcclResult_t res = progress(&lb);
  EXPECT(res == mcclProtocolError && strstr(lb.tp.error, "credit") != NULL && strstr(lb.tp.error, "rank 1") != NULL,
         "a report of more than was sent: %s: %s", mcclGetErrorString(res), lb.tp.error);
  for (int i = 0; i < CFRAMES; i++) free(src[i]);
  free(got);
  rigClose(&lb);
}

/* While rank 0 leaves a frame of rank 1's in the socket because no receive and no park can take
 * it, it reads nothing from rank 1, so no report could reach it: its sends to rank 1 then go on past the window (TCP's
 * window alone holds them, as with MCCL_CREDITS=0) instead of waiting for ever. */
static void testCreditBlind(void) {
  Rig lb;
  EXPECT(rigOpen(&lb) == 0, "rig");
  mcclConn* c = &lb.tp.conns[1];
  c->credit.window = CWINDOW;
  c->park.cap = SEG / 2;
  Wire w = {0};
  char* big = calloc(1, SEG);
  mcclFrame f = testDataFrame(0, SEG, 1); /* larger than the park: held, unread */
  wireAdd(&w, &f, big);
  EXPECT(wirePump(&w, lb.peer_fd), "written");
  mcclXfer x[CFRAMES];
  memset(x, 0, sizeof(x));
  for (int i = 0; i < CFRAMES; i++) {
    x[i].frame = testDataFrame((uint32_t)i, SEG, 0);
    x[i].buf = big;
    x[i].bytes = SEG;
    mcclTransportPostSend(&lb.tp, 1, &x[i]);
  }
  uint8_t* got = NULL;
  size_t len = 0, cap = 0;
  for (int round = 0; round < 200 && !atomic_load(&x[CFRAMES - 1].complete); round++) {
    EXPECT(progress(&lb) == mcclSuccess, "progress: %s", lb.tp.error);
    drainPeer(lb.peer_fd, &got, &len, &cap);
  }
  EXPECT(c->ahead_stop == 1 && atomic_load(&c->credit_blind) == 1, "left in the socket (stop %d, blind %d)",
         c->ahead_stop, atomic_load(&c->credit_blind));
  EXPECT(atomic_load(&x[CFRAMES - 1].complete), "all %d frames left without a report", CFRAMES);
  free(got);
  free(big);
  free(w.bytes);
  rigClose(&lb);
}

/* The receiving side: rank 0's receives take "rank 1"'s frames, and each MCCL_CREDIT_CHUNK taken
 * is reported in a CREDIT frame carrying the running total. A report at the front of the stream
 * does not hide a failure notice behind it from mcclTransportSettle, and is not "unread". */
static void testCreditReport(void) {
  Rig lb;
  EXPECT(rigOpen(&lb) == 0, "rig");
  Wire w = {0};
  char* payload = calloc(1, SEG);
  const int nframes = 2 * MCCL_CREDIT_CHUNK / SEG + 1;
  mcclXfer* x = calloc((size_t)nframes, sizeof(mcclXfer));
  char* dst = malloc((size_t)nframes * SEG);
  for (int i = 0; i < nframes; i++) {
    mcclFrame f = testDataFrame((uint32_t)i, SEG, 0);
    wireAdd(&w, &f, payload);
    x[i].frame = f;
    x[i].buf = dst + (size_t)i * SEG;
    x[i].bytes = SEG;
    mcclTransportPostRecv(&lb.tp, 1, &x[i]);
  }
  int64_t until = mcclNowNs() + 5000 * 1000000LL;
  while (!atomic_load(&x[nframes - 1].complete) && mcclNowNs() < until) {
    wirePump(&w, lb.peer_fd);
    EXPECT(progress(&lb) == mcclSuccess, "progress: %s", lb.tp.error);
  }
  uint8_t* got = NULL;
  size_t len = 0, cap = 0;
  drainPeer(lb.peer_fd, &got, &len, &cap);
  EXPECT(len == 2 * MCCL_FRAME_BYTES, "%zu bytes of reports, 2 expected", len);
  for (int k = 0; k < 2 && len == 2 * MCCL_FRAME_BYTES; k++) {
    mcclFrame f;
    char why[200];
    EXPECT(mcclFrameHeaderCheck(got + k * MCCL_FRAME_BYTES, 1, &f, why, sizeof(why)) == MCCL_WIRE_OK &&
               f.type == MCCL_FRAME_CREDIT && f.seq == (uint64_t)(k + 1) * MCCL_CREDIT_CHUNK,
           "report %d: type %u, total %llu (%s)", k, f.type, (unsigned long long)f.seq, why);
  }
  free(w.bytes);
  memset(&w, 0, sizeof(w));
  /* Now "rank 1" reports (a total of 0 is valid: nothing was sent) and then fails. */
  sendCredit(lb.peer_fd, 0);
  char desc[64];
  EXPECT(mcclTransportUnread(&lb.tp, desc, sizeof(desc)) == 0, "a report alone is not unread: %s", desc);
  sendCredit(lb.peer_fd, 0);
  const char reason[] = "boom";
  mcclFrame a;
  memset(&a, 0, sizeof(a));
  a.type = MCCL_FRAME_ABORT;
  a.length = sizeof(reason) - 1;
  wireAdd(&w, &a, reason);
  EXPECT(wirePump(&w, lb.peer_fd), "notice written");
  mcclResult_t res = mcclTransportSettle(&lb.tp, 0);
  EXPECT(res == mcclRemoteError && strstr(lb.tp.error, "boom") != NULL, "settle behind a report: %s: %s",
         mcclGetErrorString(res), lb.tp.error);
  free(got);
  free(x);
  free(dst);
  free(payload);
  free(w.bytes);
  rigClose(&lb);
}

/* ---- memory under skew ---------------------------------------------------------------------- */

#define SKEW_COUNT (16u << 20)

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif
#ifndef UNDER_SANITIZER
#define UNDER_SANITIZER 0
#endif /* 64 MiB of float32 per rank */

/* This process's resident set, "VmRSS" or "VmHWM" (peak), in bytes (0 when unreadable). */
static size_t procStatusBytes(const char* key) {
  FILE* f = fopen("/proc/self/status", "r");
  if (f == NULL) return 0;
  char line[256];
  size_t kb = 0, klen = strlen(key);
  while (fgets(line, sizeof(line), f) != NULL)
    if (strncmp(line, key, klen) == 0 && line[klen] == ':') kb = (size_t)strtoull(line + klen + 1, NULL, 10);
  fclose(f);
  return kb * 1024;
}

/* 4 ranks all-reduce 64 MiB, the last entering 1 s after the others: the ranks that run ahead
 * park what their peers send (a trace of this test shows most frames parked: loopback runs
 * ahead), but no more than the park bound: no connection's park ever holds more than that bound,
 * and (in builds without a sanitizer) no rank's peak RSS grows by more than that bound plus 2 MiB
 * over what it had after an unskewed warm-up of the same size. How much an unbounded
 * park would take here varies from run to run (with MCCL_PARK_BYTES=64M: 0 to 25 MiB on one
 * rank), so this bounds the growth; it does not show that a larger park would break the bound
 * every time. Results exact. */
static int skewedRank(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  float* buf = malloc((size_t)SKEW_COUNT * sizeof(float));
  for (size_t i = 0; i < SKEW_COUNT; i++) buf[i] = (float)((i % 1000) + (size_t)r);
  EXPECT_OK(comm, mcclAllReduce(buf, buf, SKEW_COUNT, mcclFloat32, mcclSum, comm, NULL, NULL));
  for (size_t i = 0; i < SKEW_COUNT; i++) buf[i] = (float)((i % 1000) + (size_t)r);
  EXPECT_OK(comm, mcclBarrier(comm, NULL, NULL));
  FILE* clear = fopen("/proc/self/clear_refs", "w"); /* "5": reset the peak to the current RSS */
  int peak_ok = clear != NULL && fputs("5", clear) >= 0;
  if (clear != NULL) peak_ok = fclose(clear) == 0 && peak_ok;
  size_t before = procStatusBytes("VmRSS");
  if (r == n - 1) {
    harnessSleepUs(1000 * 1000);
    /* Credits: what the others sent ahead of this rank's receives is in its parks (the idle
     * engine read it there), not in the kernel: every sender stopped at the window. Without
     * credits (MCCL_CREDITS=0) the kernel holds what the socket buffers take (MiBs here). */
    for (int p = 0; p < n; p++) {
      int pending = -1;
      if (p == r || comm->tp.conns[p].fd < 0) continue;
      EXPECT(ioctl(comm->tp.conns[p].fd, FIONREAD, &pending) == 0, "FIONREAD");
      if (mcclParamInt("MCCL_CREDITS") && mcclParamInt("MCCL_IDLE_READ"))
        EXPECT(pending <= 64 * 1024, "rank %d: %d bytes from rank %d waiting in the kernel after 1 s (credits on)",
               r, pending, p);
      printf("rank %d: %d bytes from rank %d in the kernel after 1 s (MCCL_CREDITS=%d)\n", r, pending, p,
             (int)mcclParamInt("MCCL_CREDITS"));
    }
  }
  EXPECT_OK(comm, mcclAllReduce(buf, buf, SKEW_COUNT, mcclFloat32, mcclSum, comm, NULL, NULL));
  size_t after = procStatusBytes(peak_ok ? "VmHWM" : "VmRSS");
  /* The park's own count, in every build: no connection ever held more than the bound. Read
   * after the collective completed (its completion orders the engine's writes before this). */
  size_t peak = 0;
  for (int p = 0; p < n; p++)
    if (p != r && comm->tp.conns[p].park.peak > peak) peak = comm->tp.conns[p].park.peak;
  EXPECT(peak <= mcclParkBytes(), "rank %d: a park held %zu bytes (bound %zu)", r, peak, mcclParkBytes());
  /* And no sender ever led its receiver by more than the window (park.h: the ring's segments). */
  uint64_t lead = 0;
  for (int p = 0; p < n; p++)
    if (p != r && atomic_load(&comm->tp.conns[p].credit.peak) > lead) lead = atomic_load(&comm->tp.conns[p].credit.peak);
  if (mcclParamInt("MCCL_CREDITS"))
    EXPECT(lead <= mcclParkBytes(), "rank %d: led a receiver by %llu bytes (window %zu)", r, (unsigned long long)lead,
           mcclParkBytes());
  /* The process's: a sanitizer's allocator and shadow memory add resident pages that are not
   * ours (tsan: 7.8 MiB here in one CI run), so the RSS bound holds only in plain builds. */
  size_t bound = mcclParkBytes() + (2u << 20);
  EXPECT(before > 0 && (UNDER_SANITIZER || after <= before + bound),
         "rank %d: RSS grew by %.2f MiB under a 1 s skew (bound %.2f MiB)", r,
         ((double)after - (double)before) / (1 << 20), (double)bound / (1 << 20));
  int exact = 1;
  for (size_t i = 0; i < SKEW_COUNT && exact; i++) exact = buf[i] == (float)(4 * (i % 1000) + 6);
  EXPECT(exact, "rank %d: skewed all-reduce exact", r);
  harnessReport(harnessDigest(buf, (size_t)SKEW_COUNT * sizeof(float)));
  mcclCommDestroy(comm);
  free(buf);
  return 0;
}

/* Between collectives the engine reads ahead too (mcclTransportReadAhead): rank 0 starts a
 * 64 KiB all-reduce while rank 1 sleeps 300 ms with nothing posted; by the time rank 1 joins,
 * rank 0's frames have left rank 1's socket (FIONREAD 0: they are in its park), and the result
 * is exact. With MCCL_IDLE_READ=0 the frames wait in the kernel (checked when so run). */
#define IDLE_COUNT (16 * 1024)
static int idleRank(int r, int n, mcclStore_t* store, void* arg) {
  (void)arg;
  mcclComm_t comm = harnessCommInit(r, n, store);
  if (comm == NULL) return 1;
  float* buf = malloc(IDLE_COUNT * sizeof(float));
  for (size_t i = 0; i < IDLE_COUNT; i++) buf[i] = (float)((i % 100) + (size_t)r);
  EXPECT_OK(comm, mcclBarrier(comm, NULL, NULL));
  if (r == 1) {
    harnessSleepUs(300 * 1000);
    int pending = -1, idle_read = (int)mcclParamInt("MCCL_IDLE_READ");
    EXPECT(ioctl(comm->tp.conns[0].fd, FIONREAD, &pending) == 0 && (idle_read ? pending == 0 : pending > 0),
           "rank 1: %d bytes of rank 0's frames in the socket after 300 ms idle (MCCL_IDLE_READ=%d)", pending,
           idle_read);
  }
  EXPECT_OK(comm, mcclAllReduce(buf, buf, IDLE_COUNT, mcclFloat32, mcclSum, comm, NULL, NULL));
  int exact = 1;
  for (size_t i = 0; i < IDLE_COUNT && exact; i++) exact = buf[i] == (float)(2 * (i % 100) + 1);
  EXPECT(exact, "rank %d: all-reduce joined late exact", r);
  mcclCommDestroy(comm);
  free(buf);
  return 0;
}

int main(void) {
  testRing();
  testReadAheadBound();
  testParkedMismatch();
  testNoticeNotReadAhead(0);
  testNoticeNotReadAhead(1);
  testNoticeDuringCollective(0, 0);
  testNoticeDuringCollective(0, 1);
  testNoticeDuringCollective(1, 0);
  for (int big = 0; big < 2; big++)
    for (int same = 0; same < 3; same++)
      for (int early = 0; early < 2; early++) testOtherCollectiveAtOnce(big, same, early);
  testCloseAfterParked();
  testCreditBound();
  testCreditBlind();
  testCreditReport();
  EXPECT(harnessRunRanks(2, 60, idleRank, NULL) == 0, "2 ranks, read ahead while idle: every rank passed");
  EXPECT(harnessRunRanks(4, 60, skewedRank, NULL) == 0, "4 ranks, one 1 s late: every rank passed");
  return harnessExit("test_park");
}
