/*
 * fuzz_rx.c: libFuzzer target for the state machine that consumes a peer's byte stream: rank 0's
 * receive path (transport/tcp.c connRecv with the wire.c checks, core/p2p.c matching, parking and
 * delivery), fed arbitrary bytes from "rank 1" through a socketpair in arbitrary chunks, while
 * collective and point-to-point receives are posted at arbitrary moments (tests/c/loopback.h;
 * input layout in tests/fuzz/fuzz_common.h).
 *
 * Every receive buffer is malloc'd at exactly its size, so ASan reports any byte written outside
 * it. Beyond that the target checks that every error is one a peer can cause (a protocol error,
 * a mismatch, a lost or aborting peer) and comes with a NUL-terminated message, that only posted
 * receives complete, and that failing and closing afterwards (mcclTransportFail, destroy) finish
 * every point-to-point receive with a documented result. After an error it does what the engine
 * does (mcclTransportFail), so that path runs on every kind of broken stream too.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "fuzz_common.h"
#include "loopback.h"
#include "mccl.h"

#define REQUIRE(cond)                                                 \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "fuzz_rx: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      abort(); /* the harness, not the library: libFuzzer reports it */ \
    }                                                                 \
  } while (0)

typedef struct {
  mcclXfer x;
  int post_at;
  int posted;
} collRecv;

typedef struct {
  void* buf;
  size_t count;
  mcclDataType_t dtype;
  int peer, tag, post_at;
  int64_t timeout_ms;
  struct mcclRequest* req;
} p2pRecv;

/* Errors a peer's bytes may cause. Anything else (a timeout aside, which a drain never waits
 * for) would be the library's own fault. */
static void checkResult(mcclLoopback* lb, mcclResult_t res) {
  if (res == mcclSuccess) return;
  REQUIRE(res == mcclProtocolError || res == mcclMismatch || res == mcclRemoteError);
  REQUIRE(lb->comm->tp.error[0] != '\0');
  REQUIRE(memchr(lb->comm->tp.error, '\0', sizeof(lb->comm->tp.error)) != NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 1 << 16) return 0;
  fuzzCursor cur = {data, size};
  int ncoll = (int)fuzzTake(&cur, 1) & 7;
  int np2p = (int)fuzzTake(&cur, 1) & 7;
  int flags = (int)fuzzTake(&cur, 1);
  collRecv colls[8];
  p2pRecv p2ps[8];
  memset(colls, 0, sizeof(colls));
  memset(p2ps, 0, sizeof(p2ps));
  for (int i = 0; i < ncoll; i++) {
    mcclFrame* f = &colls[i].x.frame;
    f->coll = (uint8_t)fuzzTake(&cur, 1);
    f->dtype = (uint8_t)fuzzTake(&cur, 1);
    f->op = (uint8_t)fuzzTake(&cur, 1);
    f->step = (uint32_t)fuzzTake(&cur, 1);
    f->seq = fuzzTake(&cur, 4);
    f->count = fuzzTake(&cur, 4) & 0xffff;
    f->offset = fuzzTake(&cur, 2);
    size_t len = (size_t)fuzzTake(&cur, 2) & 1023;
    f->root = (uint32_t)fuzzTake(&cur, 1);
    colls[i].post_at = (int)fuzzTake(&cur, 1);
    colls[i].x.bytes = len;
    colls[i].x.buf = malloc(len ? len : 1);
  }
  for (int i = 0; i < np2p; i++) {
    p2pRecv* p = &p2ps[i];
    p->tag = (int)fuzzTake(&cur, 1);
    p->peer = (fuzzTake(&cur, 1) & 1) ? 1 : MCCL_ANY_SOURCE;
    p->dtype = (mcclDataType_t)(fuzzTake(&cur, 1) % mcclNumTypes);
    p->count = (size_t)fuzzTake(&cur, 2) & 1023;
    p->timeout_ms = (int64_t)fuzzTake(&cur, 1);
    p->post_at = (int)fuzzTake(&cur, 1);
    fuzzTake(&cur, 1);
    size_t bytes = p->count * mcclDataTypeSize(p->dtype);
    p->buf = bytes ? malloc(bytes) : NULL;
  }
  const uint8_t* stream = cur.p;
  size_t stream_len = cur.left;

  mcclLoopback lb;
  if (loopbackOpen(&lb, 4096) != 0) goto out;
  if (!(flags & 1)) memset(&lb.comm->tp.p2p, 0, sizeof(lb.comm->tp.p2p));

  /* Chunks: seed 0 writes everything at once; otherwise 1..64-byte pieces from a tiny LCG. */
  uint32_t rng = (uint32_t)(flags >> 4) * 2654435761u;
  size_t pos = 0;
  mcclResult_t res = mcclSuccess;
  for (int chunk = 0; res == mcclSuccess; chunk++) {
    for (int i = 0; i < ncoll; i++)
      if (!colls[i].posted && (colls[i].post_at == chunk || (pos >= stream_len && colls[i].post_at >= chunk))) {
        mcclTransportPostRecv(&lb.comm->tp, 1, &colls[i].x);
        colls[i].posted = 1;
      }
    if (flags & 1)
      for (int i = 0; i < np2p; i++)
        if (p2ps[i].req == NULL && (p2ps[i].post_at == chunk || (pos >= stream_len && p2ps[i].post_at >= chunk)))
          p2ps[i].req = loopbackRecv(&lb, p2ps[i].buf, p2ps[i].count, p2ps[i].dtype, p2ps[i].peer, p2ps[i].tag,
                                     p2ps[i].timeout_ms ? p2ps[i].timeout_ms : 10000);
    if (pos >= stream_len) {
      res = loopbackDrain(&lb, 1000);
      break;
    }
    size_t n = stream_len - pos;
    if (flags >> 4) {
      rng = rng * 1103515245u + 12345u;
      size_t piece = 1 + (rng >> 16) % 64;
      if (piece < n) n = piece;
    }
    /* The socketpair holds far more than the 64 KiB an input may carry. */
    REQUIRE(loopbackWrite(&lb, stream + pos, n) == n);
    pos += n;
    res = loopbackDrain(&lb, 1000);
  }
  checkResult(&lb, res);
  if (res == mcclSuccess && (flags & 2)) {
    shutdown(lb.peer_fd, SHUT_WR); /* rank 1 goes away: whoever still waits on it must fail */
    res = loopbackDrain(&lb, 1000);
    checkResult(&lb, res);
  }
  for (int i = 0; i < ncoll; i++) REQUIRE(!colls[i].x.complete || colls[i].posted);
  if (getenv("FUZZ_VERBOSE") != NULL) { /* for reading what one input does: FUZZ_VERBOSE=1 fuzz_rx <file> */
    fprintf(stderr, "fuzz_rx: %zu stream bytes, %d collective and %d p2p receives, p2p hooks %s: %s%s%s\n",
            stream_len, ncoll, np2p, (flags & 1) ? "on" : "off", mcclGetErrorString(res),
            res != mcclSuccess ? ": " : "", res != mcclSuccess ? lb.comm->tp.error : "");
    for (int i = 0; i < ncoll; i++)
      fprintf(stderr, "  collective receive %d (%zu bytes): %s\n", i, colls[i].x.bytes,
              colls[i].x.complete ? "complete" : colls[i].posted ? "pending" : "not posted");
  }
  if (res == mcclSuccess) {
    char desc[64];
    mcclTransportUnread(&lb.comm->tp, desc, sizeof(desc));
  } else {
    /* What the engine does after an error; rank 1's side is shut first so the linger is short. */
    shutdown(lb.peer_fd, SHUT_WR);
    mcclTransportFail(&lb.comm->tp, "fuzz: failing after an error");
  }
  loopbackClose(&lb); /* fails every receive still pending */
  for (int i = 0; i < np2p; i++) {
    if (p2ps[i].req == NULL) continue;
    int done = 0;
    mcclResult_t r = mcclTest(p2ps[i].req, &done);
    REQUIRE(done); /* loopbackClose finished every one */
    if (getenv("FUZZ_VERBOSE") != NULL)
      fprintf(stderr, "  p2p receive %d (tag %d, %zu elements): %s %s\n", i, p2ps[i].tag, p2ps[i].count,
              mcclGetErrorString(r), mcclRequestError(p2ps[i].req));
    REQUIRE(r == mcclSuccess || r == mcclAborted || r == mcclMismatch || r == mcclTimeout || r == mcclSystemError);
    mcclRequestFree(p2ps[i].req);
  }
out:
  for (int i = 0; i < ncoll; i++) free(colls[i].x.buf);
  for (int i = 0; i < np2p; i++) free(p2ps[i].buf);
  return 0;
}
