/*
 * test_wire.c: the checks of bytes from peers (csrc/transport/wire.c), one rejected field at a
 * time, and the receive path of a connection (tcp.c, p2p.c) fed hand-made frames through a
 * socketpair (loopback.h): malformed and hostile frames must fail with a protocol error naming
 * the peer, never write outside the buffer they were meant for, and never block.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "loopback.h"
#include "transport/wire.h"

/* ---- hello ---------------------------------------------------------------------------------- */

static const uint8_t kToken[MCCL_TOKEN_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static int connectedTwo(const void* ctx, int rank) {
  (void)ctx;
  return rank == 2;
}

static int connectedAll(const void* ctx, int rank) {
  (void)ctx;
  (void)rank;
  return 1;
}

static mcclHelloExpect expectHello(int kind) {
  mcclHelloExpect e;
  memset(&e, 0, sizeof(e));
  memcpy(e.token, kToken, sizeof(kToken));
  e.generation = 7;
  e.comm_hash = 0x1122334455667788ull;
  e.rank = 1;
  e.nranks = 4;
  e.kind = kind;
  e.peer = kind == MCCL_HELLO_KIND_ACK ? 0 : -1;
  e.connected = connectedTwo;
  return e;
}

/* A hello that `e` accepts: rank 3 dialling rank 1, or rank 0 answering rank 1. */
static mcclHello goodHello(const mcclHelloExpect* e) {
  mcclHello h;
  memset(&h, 0, sizeof(h));
  h.version = MCCL_PROTOCOL_VERSION;
  h.kind = (uint16_t)e->kind;
  memcpy(h.token, e->token, MCCL_TOKEN_BYTES);
  h.generation = e->generation;
  h.comm_hash = e->comm_hash;
  h.rank = e->kind == MCCL_HELLO_KIND_HELLO ? 3 : (uint32_t)e->peer;
  h.nranks = (uint16_t)e->nranks;
  h.target = (uint16_t)e->rank;
  return h;
}

static void expectHelloStatus(const mcclHelloExpect* e, const mcclHello* h, mcclWireStatus want,
                              const char* word, const char* what) {
  uint8_t buf[MCCL_HELLO_BYTES];
  mcclHelloEncode(buf, h);
  char why[200];
  mcclHello out;
  mcclWireStatus got = mcclHelloCheck(buf, e, &out, why, sizeof(why));
  EXPECT(got == want, "%s: status %s, expected %s (%s)", what, mcclWireStatusName(got), mcclWireStatusName(want), why);
  if (want == MCCL_WIRE_OK) {
    EXPECT(why[0] == '\0', "%s: accepted with a reason '%s'", what, why);
    EXPECT(out.rank == h->rank && out.generation == h->generation, "%s: decoded fields differ", what);
  } else {
    EXPECT(word == NULL || strstr(why, word) != NULL, "%s: reason '%s' does not mention '%s'", what, why, word);
  }
}

static void testHello(void) {
  mcclHelloExpect e = expectHello(MCCL_HELLO_KIND_HELLO);
  mcclHello h = goodHello(&e);
  expectHelloStatus(&e, &h, MCCL_WIRE_OK, NULL, "valid hello");

  mcclHello b = h;
  b.version = MCCL_PROTOCOL_VERSION + 1;
  expectHelloStatus(&e, &b, MCCL_WIRE_BAD_VERSION, "version 4", "version");
  b = h;
  b.kind = MCCL_HELLO_KIND_ACK;
  expectHelloStatus(&e, &b, MCCL_WIRE_BAD_KIND, "kind", "kind");
  b = h;
  b.token[15] ^= 1;
  expectHelloStatus(&e, &b, MCCL_WIRE_BAD_TOKEN, "token", "token");
  b = h;
  b.generation = 8;
  expectHelloStatus(&e, &b, MCCL_WIRE_BAD_COMM, "generation 8", "generation");
  b = h;
  b.comm_hash ^= 1;
  expectHelloStatus(&e, &b, MCCL_WIRE_BAD_COMM, "communicator", "comm hash");
  b = h;
  b.nranks = 5;
  expectHelloStatus(&e, &b, MCCL_WIRE_BAD_NRANKS, "world size 5", "nranks");
  b = h;
  b.target = 0;
  expectHelloStatus(&e, &b, MCCL_WIRE_BAD_TARGET, "rank 0", "target");
  b = h;
  b.rank = 1; /* itself */
  expectHelloStatus(&e, &b, MCCL_WIRE_BAD_RANK, "claims rank 1", "own rank");
  b.rank = 0; /* lower ranks never dial higher ones */
  expectHelloStatus(&e, &b, MCCL_WIRE_BAD_RANK, "claims rank 0", "lower rank");
  b.rank = 4;
  expectHelloStatus(&e, &b, MCCL_WIRE_BAD_RANK, "claims rank 4", "rank == nranks");
  b.rank = 0x80000001u; /* negative as an int */
  expectHelloStatus(&e, &b, MCCL_WIRE_BAD_RANK, "2147483649", "rank above INT_MAX");
  b.rank = 2;
  expectHelloStatus(&e, &b, MCCL_WIRE_DUPLICATE, "duplicate", "duplicate");
  e.connected = NULL;
  expectHelloStatus(&e, &b, MCCL_WIRE_OK, NULL, "no duplicate check");

  /* With runtime connection: a NOTICE from any other rank, an ASK from a lower one, which is not
   * checked for a duplicate (its sender may have been dialled meanwhile). */
  mcclHelloExpect rt = expectHello(MCCL_HELLO_KIND_HELLO);
  rt.runtime = 1;
  b = goodHello(&rt);
  b.kind = MCCL_HELLO_KIND_ASK;
  b.rank = 0;
  expectHelloStatus(&rt, &b, MCCL_WIRE_OK, NULL, "ask from a lower rank");
  rt.runtime = 0;
  expectHelloStatus(&rt, &b, MCCL_WIRE_BAD_KIND, "kind 5", "ask without runtime connection");
  rt.runtime = 1;
  rt.connected = connectedAll;
  expectHelloStatus(&rt, &b, MCCL_WIRE_OK, NULL, "ask from a linked rank");
  b.rank = 1;
  expectHelloStatus(&rt, &b, MCCL_WIRE_BAD_RANK, "claims rank 1", "ask from itself");
  b.rank = 3;
  expectHelloStatus(&rt, &b, MCCL_WIRE_BAD_RANK, "must not ask", "ask from a higher rank");
  b.rank = 0x80000000u;
  expectHelloStatus(&rt, &b, MCCL_WIRE_BAD_RANK, "2147483648", "ask from a rank above INT_MAX");
  rt.connected = connectedTwo;
  b.kind = MCCL_HELLO_KIND_NOTICE;
  b.rank = 0;
  expectHelloStatus(&rt, &b, MCCL_WIRE_OK, NULL, "notice from a lower rank");
  b.rank = 3;
  expectHelloStatus(&rt, &b, MCCL_WIRE_OK, NULL, "notice from a higher rank");
  b.rank = 1;
  expectHelloStatus(&rt, &b, MCCL_WIRE_BAD_RANK, "claims rank 1", "notice from itself");
  b.rank = 4;
  expectHelloStatus(&rt, &b, MCCL_WIRE_BAD_RANK, "claims rank 4", "notice from rank == nranks");
  b.rank = 2;
  expectHelloStatus(&rt, &b, MCCL_WIRE_DUPLICATE, "duplicate", "notice from a linked rank");
  rt.runtime = 0;
  b.rank = 3;
  expectHelloStatus(&rt, &b, MCCL_WIRE_BAD_KIND, "kind 4", "notice without runtime connection");

  mcclHelloExpect a = expectHello(MCCL_HELLO_KIND_ACK);
  mcclHello ack = goodHello(&a);
  expectHelloStatus(&a, &ack, MCCL_WIRE_OK, NULL, "valid ack");
  b = ack;
  b.rank = 2;
  expectHelloStatus(&a, &b, MCCL_WIRE_BAD_RANK, "answered as rank 2", "ack from another rank");
  b = ack;
  b.kind = MCCL_HELLO_KIND_HELLO;
  expectHelloStatus(&a, &b, MCCL_WIRE_BAD_KIND, "kind", "hello instead of ack");

  uint8_t buf[MCCL_HELLO_BYTES];
  mcclHelloEncode(buf, &h);
  buf[0] ^= 0xff;
  char why[8];
  EXPECT(mcclHelloCheck(buf, &e, NULL, why, sizeof(why)) == MCCL_WIRE_BAD_MAGIC, "bad magic");
  EXPECT(strlen(why) == sizeof(why) - 1, "reason not truncated to the buffer: '%s'", why);
  EXPECT(mcclHelloCheck(buf, &e, NULL, NULL, 0) == MCCL_WIRE_BAD_MAGIC, "bad magic without a reason buffer");
}

/* ---- frame headers -------------------------------------------------------------------------- */

static void expectFrameStatus(const uint8_t* hdr, int p2p_ok, mcclWireStatus want, const char* word,
                              const char* what) {
  char why[300];
  mcclFrame f;
  mcclWireStatus got = mcclFrameHeaderCheck(hdr, p2p_ok, &f, why, sizeof(why));
  EXPECT(got == want, "%s: status %s, expected %s (%s)", what, mcclWireStatusName(got), mcclWireStatusName(want), why);
  if (want != MCCL_WIRE_OK)
    EXPECT(word == NULL || strstr(why, word) != NULL, "%s: reason '%s' does not mention '%s'", what, why, word);
}

static void testFrames(void) {
  uint8_t hdr[MCCL_FRAME_BYTES];
  mcclFrame f;
  memset(&f, 0, sizeof(f));
  f.type = MCCL_FRAME_DATA;
  f.coll = MCCL_COLL_ALLREDUCE;
  f.dtype = mcclFloat32;
  f.seq = 3;
  f.count = 1000;
  f.length = 4000;
  mcclFrameEncode(hdr, &f);
  expectFrameStatus(hdr, 0, MCCL_WIRE_OK, NULL, "data frame");
  hdr[1] ^= 1;
  expectFrameStatus(hdr, 0, MCCL_WIRE_BAD_MAGIC, "magic", "magic");
  mcclFrameEncode(hdr, &f);
  hdr[44] = 1; /* a call site: carried by collective frames only */
  mcclFrame site;
  expectFrameStatus(hdr, 0, MCCL_WIRE_OK, NULL, "data frame with a call site");
  EXPECT(mcclFrameHeaderCheck(hdr, 0, &site, NULL, 0) == MCCL_WIRE_OK && site.site == 1, "call site %u", site.site);
  f.type = MCCL_FRAME_ABORT;
  mcclFrameEncode(hdr, &f);
  hdr[45] = 2;
  expectFrameStatus(hdr, 0, MCCL_WIRE_BAD_RESERVED, "site word is 0x00000200", "abort frame with a call site");
  f.type = 9;
  mcclFrameEncode(hdr, &f);
  expectFrameStatus(hdr, 1, MCCL_WIRE_BAD_TYPE, "type 9", "unknown type");
  f.type = MCCL_FRAME_ABORT;
  f.length = 0xffffffffu; /* any length: the reader keeps the first MCCL_MAX_ABORT_REASON bytes */
  mcclFrameEncode(hdr, &f);
  expectFrameStatus(hdr, 0, MCCL_WIRE_OK, NULL, "abort frame");

  /* P2P: only where point-to-point traffic is expected, and always inside its message. */
  loopbackP2pHeader(hdr, 5, 0, mcclInt32, 10, 0, 40);
  expectFrameStatus(hdr, 1, MCCL_WIRE_OK, NULL, "p2p frame");
  expectFrameStatus(hdr, 0, MCCL_WIRE_BAD_TYPE, "type 3", "p2p frame where none is expected");
  loopbackP2pHeader(hdr, 5, 0, mcclInt32, 10, 36, 4);
  expectFrameStatus(hdr, 1, MCCL_WIRE_OK, NULL, "last bytes of a message");
  loopbackP2pHeader(hdr, 5, 0, mcclInt32, 10, 0, 44);
  expectFrameStatus(hdr, 1, MCCL_WIRE_BAD_EXTENT, "0+44 outside its 40-byte", "payload longer than the message");
  loopbackP2pHeader(hdr, 5, 0, mcclInt32, 10, 40, 1);
  expectFrameStatus(hdr, 1, MCCL_WIRE_BAD_EXTENT, "40+1", "payload past the end");
  loopbackP2pHeader(hdr, 5, 0, mcclInt32, 10, UINT64_MAX - 2, 8);
  expectFrameStatus(hdr, 1, MCCL_WIRE_BAD_EXTENT, NULL, "offset + length wrapping around");
  loopbackP2pHeader(hdr, 5, 0, mcclInt64, UINT64_MAX / 4, 0, 8);
  expectFrameStatus(hdr, 1, MCCL_WIRE_BAD_EXTENT, "more than memory", "count * size overflowing");
  loopbackP2pHeader(hdr, 5, 0, (mcclDataType_t)13, 10, 0, 10); /* mcclNumTypes: the first unknown */
  expectFrameStatus(hdr, 1, MCCL_WIRE_BAD_DTYPE, "dtype 13", "unknown dtype");
  loopbackP2pHeader(hdr, 5, 0, mcclUint64, 10, 0, 80); /* the last dtype, appended after bool */
  expectFrameStatus(hdr, 1, MCCL_WIRE_OK, NULL, "a uint64 message");
  EXPECT(strcmp(mcclDtypeName(mcclInt16), "int16") == 0 && strcmp(mcclDtypeName(mcclUint16), "uint16") == 0 &&
             strcmp(mcclDtypeName(mcclUint32), "uint32") == 0 && strcmp(mcclDtypeName(mcclUint64), "uint64") == 0 &&
             strcmp(mcclDtypeName(mcclBool), "bool") == 0 && strcmp(mcclDtypeName(mcclNumTypes), "unknown-dtype") == 0,
         "dtype names: %s %s %s %s", mcclDtypeName(mcclInt16), mcclDtypeName(mcclUint16), mcclDtypeName(mcclUint32),
         mcclDtypeName(mcclUint64));

  /* Matching a collective frame names the fields that differ. */
  mcclFrame want;
  memset(&want, 0, sizeof(want));
  want.type = MCCL_FRAME_DATA;
  want.coll = MCCL_COLL_BROADCAST;
  want.dtype = mcclInt8;
  want.root = 2;
  want.count = 77;
  want.length = 77;
  mcclFrame got = want;
  char why[600];
  EXPECT(mcclFrameMatch(&got, &want, why, sizeof(why)) == MCCL_WIRE_OK && why[0] == '\0', "same frame: %s", why);
  got.root = 1;
  got.seq = 4;
  EXPECT(mcclFrameMatch(&got, &want, why, sizeof(why)) == MCCL_WIRE_MISMATCH, "different root");
  EXPECT(strstr(why, "seq, root differ") != NULL && strstr(why, "root 1") != NULL && strstr(why, "root 2") != NULL,
         "mismatch reason: %s", why);
  /* Call sites: compared when both frames carry one, and named when they alone differ. */
  got = want;
  got.site = 0x1234abcdu;
  EXPECT(mcclFrameMatch(&got, &want, why, sizeof(why)) == MCCL_WIRE_OK, "a call site against none: %s", why);
  want.site = 0x1234abcdu;
  EXPECT(mcclFrameMatch(&got, &want, why, sizeof(why)) == MCCL_WIRE_OK, "the same call site: %s", why);
  want.site = 0x00c0ffeeu;
  EXPECT(mcclFrameMatch(&got, &want, why, sizeof(why)) == MCCL_WIRE_MISMATCH, "two call sites");
  EXPECT(strstr(why, "call site 1234abcd") != NULL && strstr(why, "call site 00c0ffee") != NULL &&
             strstr(why, "(site differ: one rank skipped a collective") != NULL,
         "call-site mismatch reason: %s", why);
  got.count = 78;
  EXPECT(mcclFrameMatch(&got, &want, why, sizeof(why)) == MCCL_WIRE_MISMATCH && strstr(why, "(count, site differ)"),
         "count and call site: %s", why);
}

/* ---- the receive path ----------------------------------------------------------------------- */

/* A posted collective receive, the frame that fills it, and one that does not match. */
static void testCollectiveRx(void) {
  mcclLoopback lb;
  EXPECT(loopbackOpen(&lb, 1 << 16) == 0, "loopback");
  if (lb.comm == NULL) return;
  int32_t got[8] = {0};
  mcclXfer x;
  memset(&x, 0, sizeof(x));
  x.frame.coll = MCCL_COLL_ALLREDUCE;
  x.frame.dtype = mcclInt32;
  x.frame.count = 8;
  x.buf = (char*)got;
  x.bytes = sizeof(got);
  mcclTransportPostRecv(&lb.comm->tp, 1, &x);
  mcclFrame f = x.frame;
  uint8_t hdr[MCCL_FRAME_BYTES];
  mcclFrameEncode(hdr, &f);
  int32_t payload[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  /* Header and payload in pieces of 5 bytes: every partial read path. */
  uint8_t stream[MCCL_FRAME_BYTES + sizeof(payload)];
  memcpy(stream, hdr, sizeof(hdr));
  memcpy(stream + sizeof(hdr), payload, sizeof(payload));
  mcclResult_t res = mcclSuccess;
  for (size_t off = 0; off < sizeof(stream) && res == mcclSuccess; off += 5) {
    loopbackWrite(&lb, stream + off, sizeof(stream) - off < 5 ? sizeof(stream) - off : 5);
    res = loopbackDrain(&lb, 100);
  }
  EXPECT(res == mcclSuccess && x.complete, "collective frame in pieces: %s, complete %d: %s",
         mcclGetErrorString(res), x.complete, lb.comm->tp.error);
  EXPECT(memcmp(got, payload, sizeof(got)) == 0, "payload differs");

  /* The next frame claims another count: a mismatch naming both, nothing written. */
  memset(got, 0, sizeof(got));
  mcclTransportPostRecv(&lb.comm->tp, 1, &x);
  f.count = 9;
  mcclFrameEncode(hdr, &f);
  loopbackWrite(&lb, hdr, sizeof(hdr));
  loopbackWrite(&lb, payload, sizeof(payload));
  res = loopbackDrain(&lb, 100);
  EXPECT(res == mcclMismatch, "mismatched frame gave %s", mcclGetErrorString(res));
  EXPECT(strstr(lb.comm->tp.error, "collective mismatch at rank 0: rank 1") != NULL &&
             strstr(lb.comm->tp.error, "count, length differ") == NULL &&
             strstr(lb.comm->tp.error, "(count differ)") != NULL,
         "message: %s", lb.comm->tp.error);
  EXPECT(got[0] == 0 && !x.complete, "a mismatched frame wrote its payload");
  loopbackClose(&lb);

  /* Bytes that are not a frame. */
  EXPECT(loopbackOpen(&lb, 1 << 16) == 0, "loopback");
  if (lb.comm == NULL) return;
  mcclTransportPostRecv(&lb.comm->tp, 1, &x);
  memset(hdr, 'G', sizeof(hdr));
  loopbackWrite(&lb, hdr, sizeof(hdr));
  res = loopbackDrain(&lb, 100);
  EXPECT(res == mcclProtocolError, "garbage gave %s", mcclGetErrorString(res));
  EXPECT(strstr(lb.comm->tp.error, "rank 1 (fd") != NULL && strstr(lb.comm->tp.error, "bad magic") != NULL,
         "message: %s", lb.comm->tp.error);
  loopbackClose(&lb);
}

/* An ABORT frame whose reason trickles in must not block the progress round; one whose sender
 * closes halfway through the reason fails with what arrived. */
static void testAbortRx(void) {
  for (int close_early = 0; close_early < 2; close_early++) {
    mcclLoopback lb;
    EXPECT(loopbackOpen(&lb, 1 << 16) == 0, "loopback");
    if (lb.comm == NULL) return;
    char buf[4];
    mcclXfer x;
    memset(&x, 0, sizeof(x));
    x.frame.coll = MCCL_COLL_BARRIER;
    x.buf = buf;
    x.bytes = 0;
    mcclTransportPostRecv(&lb.comm->tp, 1, &x);
    const char* reason = "rank 1: out of cheese";
    mcclFrame f;
    memset(&f, 0, sizeof(f));
    f.type = MCCL_FRAME_ABORT;
    f.length = (uint32_t)strlen(reason);
    uint8_t hdr[MCCL_FRAME_BYTES];
    mcclFrameEncode(hdr, &f);
    loopbackWrite(&lb, hdr, sizeof(hdr));
    loopbackWrite(&lb, reason, 10);
    double start = harnessSeconds();
    mcclResult_t res = loopbackDrain(&lb, 100);
    double took = harnessSeconds() - start;
    EXPECT(res == mcclSuccess, "half an abort reason gave %s: %s", mcclGetErrorString(res), lb.comm->tp.error);
    EXPECT(took < 0.1, "a partial abort reason blocked progress for %.2f s", took);
    if (close_early) {
      shutdown(lb.peer_fd, SHUT_WR);
      res = loopbackDrain(&lb, 100);
      EXPECT(res == mcclRemoteError, "abort then close gave %s", mcclGetErrorString(res));
      EXPECT(strstr(lb.comm->tp.error, "rank 1 (fd") != NULL && strstr(lb.comm->tp.error, "failed: rank 1: ou") != NULL,
             "message: %s", lb.comm->tp.error);
    } else {
      loopbackWrite(&lb, reason + 10, strlen(reason) - 10);
      res = loopbackDrain(&lb, 100);
      EXPECT(res == mcclRemoteError, "abort gave %s", mcclGetErrorString(res));
      EXPECT(strstr(lb.comm->tp.error, "failed: rank 1: out of cheese") != NULL, "message: %s", lb.comm->tp.error);
    }
    EXPECT(lb.comm->tp.conns[1].dead, "connection not marked dead after an abort");
    loopbackClose(&lb);
  }
}

static mcclResult_t waitDone(mcclLoopback* lb, struct mcclRequest* req, int* done) {
  mcclResult_t res = loopbackDrain(lb, 100);
  mcclResult_t rres = mcclTest(req, done);
  return res != mcclSuccess ? res : (*done ? rres : mcclInProgress);
}

/* Point-to-point frames through the real matching layer. */
static void testP2pRx(void) {
  const uint8_t canary = 0xC5;
  /* 1. A message in two frames lands; a frame past the message, or one continuing it with a
   * larger count, is a protocol error and writes nothing past the receive's 40 bytes. */
  for (int variant = 0; variant < 4; variant++) {
    mcclLoopback lb;
    EXPECT(loopbackOpen(&lb, 1 << 16) == 0, "loopback");
    if (lb.comm == NULL) return;
    uint8_t* buf = malloc(40 + 64);
    memset(buf, canary, 40 + 64);
    struct mcclRequest* req = loopbackRecv(&lb, buf, 10, mcclInt32, 1, 5, 10000);
    int32_t payload[1000];
    for (int i = 0; i < 1000; i++) payload[i] = i + 1;
    uint8_t hdr[MCCL_FRAME_BYTES];
    loopbackP2pHeader(hdr, 5, 0, mcclInt32, 10, 0, 24);
    loopbackWrite(&lb, hdr, sizeof(hdr));
    loopbackWrite(&lb, payload, 24);
    const char* word = NULL;
    switch (variant) {
      case 0: loopbackP2pHeader(hdr, 5, 0, mcclInt32, 10, 24, 16); break;   /* the rest */
      case 1: loopbackP2pHeader(hdr, 5, 0, mcclInt32, 10, 24, 64); word = "outside its 40-byte"; break; /* past the end */
      case 2: loopbackP2pHeader(hdr, 5, 0, mcclInt32, 1000, 24, 64); word = "does not continue"; break;
      case 3: loopbackP2pHeader(hdr, 5, 0, mcclInt32, 10, 32, 8); word = "next byte 24"; break; /* a gap */
    }
    loopbackWrite(&lb, hdr, sizeof(hdr));
    loopbackWrite(&lb, payload + 6, 64);
    int done = 0;
    mcclResult_t res = waitDone(&lb, req, &done);
    if (variant == 0) {
      EXPECT(res == mcclSuccess && done, "two-frame message: %s (%s)", mcclGetErrorString(res), lb.comm->tp.error);
      EXPECT(memcmp(buf, payload, 40) == 0, "message payload differs");
    } else {
      EXPECT(res == mcclProtocolError, "variant %d gave %s", variant, mcclGetErrorString(res));
      EXPECT(strstr(lb.comm->tp.error, word) != NULL, "variant %d message: %s", variant, lb.comm->tp.error);
    }
    size_t spoiled = 0;
    for (int i = 40; i < 40 + 64; i++) spoiled += buf[i] != canary;
    EXPECT(spoiled == 0, "variant %d wrote %zu bytes past the receive buffer", variant, spoiled);
    loopbackClose(&lb);
    mcclRequestFree(req);
    free(buf);
  }

  /* 2. A message that arrives while only a collective receive is posted is parked, then claimed
   * by a receive posted later; a frame in the middle of no message is a protocol error. */
  mcclLoopback lb;
  EXPECT(loopbackOpen(&lb, 1 << 16) == 0, "loopback");
  if (lb.comm == NULL) return;
  int64_t got = 0;
  mcclXfer x;
  memset(&x, 0, sizeof(x));
  x.frame.coll = MCCL_COLL_BARRIER;
  mcclTransportPostRecv(&lb.comm->tp, 1, &x);
  uint8_t hdr[MCCL_FRAME_BYTES];
  int64_t v = 4242;
  loopbackP2pHeader(hdr, 9, 0, mcclInt64, 1, 0, 8);
  loopbackWrite(&lb, hdr, sizeof(hdr));
  loopbackWrite(&lb, &v, 8);
  mcclFrame bf = x.frame;
  mcclFrameEncode(hdr, &bf);
  loopbackWrite(&lb, hdr, sizeof(hdr));
  mcclResult_t res = loopbackDrain(&lb, 100);
  EXPECT(res == mcclSuccess && x.complete, "barrier frame behind a message: %s", mcclGetErrorString(res));
  EXPECT(lb.comm->p2p != NULL, "no p2p state");
  struct mcclRequest* req = loopbackRecv(&lb, &got, 1, mcclInt64, MCCL_ANY_SOURCE, 9, 10000);
  int done = 0;
  res = waitDone(&lb, req, &done);
  EXPECT(res == mcclSuccess && done && got == 4242 && mcclRequestSource(req) == 1,
         "parked message: %s done %d got %lld", mcclGetErrorString(res), done, (long long)got);
  mcclRequestFree(req);
  req = loopbackRecv(&lb, &got, 1, mcclInt64, 1, 10, 10000);
  loopbackP2pHeader(hdr, 10, 1, mcclInt64, 2, 8, 8);
  loopbackWrite(&lb, hdr, sizeof(hdr));
  res = waitDone(&lb, req, &done);
  EXPECT(res == mcclProtocolError && strstr(lb.comm->tp.error, "never started") != NULL,
         "frame of no message: %s: %s", mcclGetErrorString(res), lb.comm->tp.error);
  loopbackClose(&lb);
  EXPECT(mcclTest(req, &done) == mcclAborted && done, "pending receive not failed at close");
  mcclRequestFree(req);

  /* 3. A first frame that claims a 1 TiB message parks only the bytes that arrive (memory
   * follows what a peer sends, not what it claims; under ASan a 1 TiB malloc is fatal). */
  EXPECT(loopbackOpen(&lb, 1 << 16) == 0, "loopback");
  if (lb.comm == NULL) return;
  mcclTransportPostRecv(&lb.comm->tp, 1, &x);
  loopbackP2pHeader(hdr, 11, 2, mcclInt64, (uint64_t)1 << 37, 0, 16);
  loopbackWrite(&lb, hdr, sizeof(hdr));
  int64_t two[2] = {1, 2};
  loopbackWrite(&lb, two, sizeof(two));
  loopbackP2pHeader(hdr, 11, 2, mcclInt64, (uint64_t)1 << 37, 16, 8);
  loopbackWrite(&lb, hdr, sizeof(hdr));
  loopbackWrite(&lb, two, 8);
  res = loopbackDrain(&lb, 100);
  EXPECT(res == mcclSuccess, "parking the start of a huge message: %s: %s", mcclGetErrorString(res), lb.comm->tp.error);
  loopbackClose(&lb);
}

/* A receive whose message stops arriving halfway (the sender stalled mid-message) still times
 * out: the round that finds it past its deadline fails, naming the peer, so the engine fails the
 * communicator instead of waiting forever (found by a fresh-eyes test with SIGSTOP). */
static void testP2pStalledMidMessage(void) {
  mcclLoopback lb;
  EXPECT(loopbackOpen(&lb, 1 << 16) == 0, "loopback");
  if (lb.comm == NULL) return;
  int32_t buf[10] = {0};
  struct mcclRequest* req = loopbackRecv(&lb, buf, 10, mcclInt32, 1, 5, 100);
  int32_t payload[6] = {1, 2, 3, 4, 5, 6};
  uint8_t hdr[MCCL_FRAME_BYTES];
  loopbackP2pHeader(hdr, 5, 0, mcclInt32, 10, 0, 24); /* the first 24 of 40 bytes, then nothing */
  loopbackWrite(&lb, hdr, sizeof(hdr));
  loopbackWrite(&lb, payload, 24);
  (void)loopbackDrain(&lb, 100);
  EXPECT(!mcclP2pStalled(lb.comm), "stalled before the deadline");
  int64_t until = mcclNowNs() + 2000000000LL;
  mcclResult_t res = mcclSuccess;
  while (!mcclP2pStalled(lb.comm) && mcclNowNs() < until)
    res = mcclTransportProgress(&lb.comm->tp, mcclNowNs() + 10000000LL, NULL);
  EXPECT(mcclP2pStalled(lb.comm) && res == mcclTimeout, "a half-arrived message past its deadline: %s, stalled %d",
         mcclGetErrorString(res), mcclP2pStalled(lb.comm));
  EXPECT(strstr(lb.comm->tp.error, "recv from rank 1") != NULL &&
             strstr(lb.comm->tp.error, "stalled in the middle") != NULL,
         "message: %s", lb.comm->tp.error);
  loopbackClose(&lb);
  mcclRequestFree(req);
}

/* ---- consistent failure: mcclTransportSettle ---------------------------------------------- */

/* Rank 1's failure notice: an ABORT frame saying it completed `completed` collectives. */
static void writeAbort(mcclLoopback* lb, uint64_t completed, const char* reason, size_t upto) {
  mcclFrame f;
  memset(&f, 0, sizeof(f));
  f.type = MCCL_FRAME_ABORT;
  f.seq = completed;
  f.length = (uint32_t)strlen(reason);
  uint8_t hdr[MCCL_FRAME_BYTES];
  mcclFrameEncode(hdr, &f);
  uint8_t all[MCCL_FRAME_BYTES + 200];
  memcpy(all, hdr, sizeof(hdr));
  memcpy(all + sizeof(hdr), reason, f.length);
  size_t total = sizeof(hdr) + f.length;
  loopbackWrite(lb, all, upto < total ? upto : total);
}

static void testSettle(void) {
  mcclLoopback lb;
  const char* reason = "rank 1: allreduce #6 timed out";
  /* 1. Nothing pending: the collective is settled. A notice from a rank that completed #6 does
   * not fail #5 (and stays unread); it fails #6. */
  EXPECT(loopbackOpen(&lb, 1 << 16) == 0, "loopback");
  if (lb.comm == NULL) return;
  mcclTransport* t = &lb.comm->tp;
  EXPECT(mcclTransportSettle(t, 4) == mcclSuccess && t->settled == 5, "nothing pending: settled %llu",
         (unsigned long long)t->settled);
  writeAbort(&lb, 6, reason, 1000);
  EXPECT(mcclTransportSettle(t, 5) == mcclSuccess && t->settled == 6, "a notice of rank that completed #5 failed it");
  EXPECT(!t->conns[1].dead, "the notice for a later collective was consumed");
  mcclResult_t res = mcclTransportSettle(t, 6);
  EXPECT(res == mcclRemoteError && t->settled == 6, "a notice of a rank that did not complete #6: %s",
         mcclGetErrorString(res));
  EXPECT(strstr(t->error, "rank 1 (fd") != NULL && strstr(t->error, "failed before it completed this collective (#6") != NULL &&
             strstr(t->error, "so rank 0 fails it too: rank 1: allreduce #6 timed out") != NULL,
         "message: %s", t->error);
  EXPECT(t->conns[1].dead, "connection not marked dead after a notice");
  loopbackClose(&lb);

  /* 2. A later collective's header ahead of the notice: nothing is looked past it or consumed; once
   * it is received, the notice is next. */
  EXPECT(loopbackOpen(&lb, 1 << 16) == 0, "loopback");
  if (lb.comm == NULL) return;
  t = &lb.comm->tp;
  mcclXfer x;
  memset(&x, 0, sizeof(x));
  x.frame.coll = MCCL_COLL_BARRIER;
  x.frame.seq = 3;
  mcclFrame bf = x.frame;
  bf.type = MCCL_FRAME_DATA;
  uint8_t hdr[MCCL_FRAME_BYTES];
  mcclFrameEncode(hdr, &bf);
  loopbackWrite(&lb, hdr, sizeof(hdr));
  writeAbort(&lb, 3, reason, 1000);
  EXPECT(mcclTransportSettle(t, 2) == mcclSuccess, "a collective frame ahead of a notice: %s", t->error);
  mcclTransportPostRecv(t, 1, &x);
  res = loopbackDrain(&lb, 100);
  EXPECT(res == mcclSuccess && x.complete, "the frame ahead was not received intact: %s", mcclGetErrorString(res));
  EXPECT(mcclTransportSettle(t, 3) == mcclRemoteError, "the notice behind it was not seen");
  loopbackClose(&lb);

  /* 3. A header partly read already (a receive posted from that peer kept reading), and a reason
   * that trickles in (the header read, the reason not all here). */
  for (int variant = 0; variant < 2; variant++) {
    EXPECT(loopbackOpen(&lb, 1 << 16) == 0, "loopback");
    if (lb.comm == NULL) return;
    t = &lb.comm->tp;
    int64_t v = 0;
    struct mcclRequest* req = loopbackRecv(&lb, &v, 1, mcclInt64, 1, 9, 10000);
    writeAbort(&lb, 0, reason, variant == 0 ? 20 : MCCL_FRAME_BYTES + 7);
    (void)loopbackDrain(&lb, 100);
    EXPECT(variant == 0 ? t->conns[1].rhdr_got == 20 : t->conns[1].rx_mode == MCCL_RX_ABORT,
           "variant %d: stream state %d/%zu", variant, t->conns[1].rx_mode, t->conns[1].rhdr_got);
    if (variant == 0) { /* the rest arrives before this rank completes its collective */
      uint8_t rest[MCCL_FRAME_BYTES + 64];
      mcclFrame f;
      memset(&f, 0, sizeof(f));
      f.type = MCCL_FRAME_ABORT;
      f.length = (uint32_t)strlen(reason);
      mcclFrameEncode(rest, &f);
      memcpy(rest + MCCL_FRAME_BYTES, reason, f.length);
      loopbackWrite(&lb, rest + 20, MCCL_FRAME_BYTES - 20 + f.length);
    }
    res = mcclTransportSettle(t, 0);
    EXPECT(res == mcclRemoteError, "variant %d: %s", variant, mcclGetErrorString(res));
    EXPECT(strstr(t->error, variant == 0 ? "fails it too: rank 1: allreduce #6 timed out" : "fails it too: rank 1:") != NULL,
           "variant %d message: %s", variant, t->error);
    loopbackClose(&lb);
    mcclRequestFree(req);
  }

  /* 4. What is not a notice: a point-to-point message nobody received yet ahead of it (not looked
   * past), and a close without one (a peer that exited after its last collective). */
  EXPECT(loopbackOpen(&lb, 1 << 16) == 0, "loopback");
  if (lb.comm == NULL) return;
  t = &lb.comm->tp;
  int64_t v = 7;
  loopbackP2pHeader(hdr, 7, 0, mcclInt64, 1, 0, 8);
  loopbackWrite(&lb, hdr, sizeof(hdr));
  loopbackWrite(&lb, &v, 8);
  writeAbort(&lb, 0, reason, 1000);
  EXPECT(mcclTransportSettle(t, 0) == mcclSuccess, "looked past an unreceived message: %s", t->error);
  loopbackClose(&lb);
  EXPECT(loopbackOpen(&lb, 1 << 16) == 0, "loopback");
  if (lb.comm == NULL) return;
  shutdown(lb.peer_fd, SHUT_WR);
  EXPECT(mcclTransportSettle(&lb.comm->tp, 0) == mcclSuccess, "a close without a notice failed a collective");
  /* mcclTransportFail's notice carries what this rank completed. */
  mcclTransportFail(&lb.comm->tp, "rank 0: test");
  uint8_t got[MCCL_FRAME_BYTES];
  mcclFrame f;
  memset(&f, 0, sizeof(f));
  EXPECT(recv(lb.peer_fd, got, sizeof(got), MSG_DONTWAIT) == (ssize_t)sizeof(got) &&
             mcclFrameDecode(got, &f) == 0 && f.type == MCCL_FRAME_ABORT && f.seq == 1,
         "the notice does not say 1 collective completed (seq %llu)", (unsigned long long)f.seq);
  loopbackClose(&lb);
}

/* ---- bounded parking (MCCL_P2P_PARK_BYTES is 64K in this binary) -------------------------- */

static void writeMessage(mcclLoopback* lb, int tag, uint64_t seq, size_t bytes, int salt) {
  uint8_t hdr[MCCL_FRAME_BYTES];
  loopbackP2pHeader(hdr, tag, seq, mcclUint8, bytes, 0, (uint32_t)bytes);
  loopbackWrite(lb, hdr, sizeof(hdr));
  uint8_t* p = malloc(bytes ? bytes : 1);
  for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)(salt * 7 + i * 13);
  EXPECT(loopbackWrite(lb, p, bytes) == bytes, "socket full writing a %zu-byte message", bytes);
  free(p);
}

static int messageIs(const uint8_t* p, size_t bytes, int salt) {
  for (size_t i = 0; i < bytes; i++)
    if (p[i] != (uint8_t)(salt * 7 + i * 13)) return 0;
  return 1;
}

/* Drain until `req` is done or `ms` pass; its result, or mcclInProgress. */
static mcclResult_t drainUntil(mcclLoopback* lb, struct mcclRequest* req, int ms) {
  int64_t until = mcclNowNs() + (int64_t)ms * 1000000LL;
  int done = 0;
  mcclResult_t res;
  do {
    res = waitDone(lb, req, &done);
  } while (res == mcclInProgress && mcclNowNs() < until);
  return res;
}

static void testP2pBudget(void) {
  mcclLoopback lb;
  EXPECT(loopbackOpen(&lb, 1 << 20) == 0, "loopback");
  if (lb.comm == NULL) return;
  mcclTransport* t = &lb.comm->tp;
  int64_t last = 0;
  struct mcclRequest* keep = loopbackRecv(&lb, &last, 1, mcclInt64, 1, 99, 10000); /* keeps rank 1 read */
  /* 1. Two 30000-byte messages fit in 64 KiB; the third is held in the socket. */
  const size_t m = 30000;
  for (int k = 0; k < 3; k++) writeMessage(&lb, 1, (uint64_t)k, m, k);
  mcclResult_t res = loopbackDrain(&lb, 100);
  EXPECT(res == mcclSuccess && t->conns[1].rx_held, "third message not held: %s, held %d", mcclGetErrorString(res),
         t->conns[1].rx_held);
  /* A receive for a message behind them times out saying why. */
  uint8_t* buf = malloc(200000);
  struct mcclRequest* lonely = loopbackRecv(&lb, buf, 1, mcclUint8, 1, 5, 50);
  res = drainUntil(&lb, lonely, 2000);
  EXPECT(res == mcclTimeout && strstr(mcclRequestError(lonely), "MCCL_P2P_PARK_BYTES budget of 65536") != NULL &&
             strstr(mcclRequestError(lonely), "stopped reading from rank 1") != NULL,
         "recv behind a full budget: %s: %s", mcclGetErrorString(res), mcclRequestError(lonely));
  mcclRequestFree(lonely);
  /* Receives consume parked messages, reading resumes, and all arrive in order, exact. */
  for (int k = 0; k < 3; k++) {
    memset(buf, 0, m);
    struct mcclRequest* req = loopbackRecv(&lb, buf, m, mcclUint8, 1, 1, 10000);
    res = drainUntil(&lb, req, 2000);
    EXPECT(res == mcclSuccess && messageIs(buf, m, k), "message %d: %s", k, mcclGetErrorString(res));
    mcclRequestFree(req);
  }
  EXPECT(!t->conns[1].rx_held, "still held with nothing parked");

  /* 2. A message larger than the budget is held, then read straight into its receive. */
  writeMessage(&lb, 2, 3, 100000, 9);
  res = loopbackDrain(&lb, 100);
  EXPECT(res == mcclSuccess && t->conns[1].rx_held, "a message over the budget was not held");
  struct mcclRequest* req = loopbackRecv(&lb, buf, 100000, mcclUint8, 1, 2, 10000);
  res = drainUntil(&lb, req, 2000);
  EXPECT(res == mcclSuccess && messageIs(buf, 100000, 9), "the large message: %s", mcclGetErrorString(res));
  mcclRequestFree(req);

  /* 3. Empty messages count too: 1000 of them do not all park. */
  uint8_t* empties = malloc(1000 * MCCL_FRAME_BYTES); /* one write: a unix socket counts writes, not bytes */
  for (int k = 0; k < 1000; k++) loopbackP2pHeader(empties + k * MCCL_FRAME_BYTES, 3, (uint64_t)(4 + k), mcclUint8, 0, 0, 0);
  EXPECT(loopbackWrite(&lb, empties, 1000 * MCCL_FRAME_BYTES) == 1000 * MCCL_FRAME_BYTES, "socket full");
  free(empties);
  res = loopbackDrain(&lb, 2000);
  EXPECT(res == mcclSuccess && t->conns[1].rx_held, "1000 empty messages all parked");
  for (int k = 0; k < 1000; k++) {
    req = loopbackRecv(&lb, buf, 0, mcclUint8, 1, 3, 10000);
    res = drainUntil(&lb, req, 2000);
    EXPECT(res == mcclSuccess, "empty message %d: %s", k, mcclGetErrorString(res));
    mcclRequestFree(req);
    if (res != mcclSuccess) break;
  }

  /* 4. A collective's frame behind held messages: they are parked past the budget, so the
   * collective does not wait on them; then they are all received, exact. */
  for (int k = 0; k < 3; k++) writeMessage(&lb, 4, (uint64_t)(1004 + k), 40000, 20 + k);
  mcclXfer x;
  memset(&x, 0, sizeof(x));
  x.frame.coll = MCCL_COLL_BARRIER;
  mcclFrame bf = x.frame;
  bf.type = MCCL_FRAME_DATA;
  uint8_t hdr[MCCL_FRAME_BYTES];
  mcclFrameEncode(hdr, &bf);
  loopbackWrite(&lb, hdr, sizeof(hdr));
  res = loopbackDrain(&lb, 100);
  EXPECT(res == mcclSuccess && t->conns[1].rx_held, "held before the collective: %s", mcclGetErrorString(res));
  mcclTransportPostRecv(t, 1, &x);
  int64_t until = mcclNowNs() + 2000000000LL;
  while (res == mcclSuccess && !x.complete && mcclNowNs() < until) res = loopbackDrain(&lb, 100);
  EXPECT(res == mcclSuccess && x.complete, "a collective behind held messages: %s, complete %d", mcclGetErrorString(res),
         x.complete);
  for (int k = 0; k < 3; k++) {
    req = loopbackRecv(&lb, buf, 40000, mcclUint8, 1, 4, 10000);
    res = drainUntil(&lb, req, 2000);
    EXPECT(res == mcclSuccess && messageIs(buf, 40000, 20 + k), "message %d behind a collective: %s", k,
           mcclGetErrorString(res));
    mcclRequestFree(req);
  }
  loopbackClose(&lb);
  mcclRequestFree(keep);
  free(buf);
}

/* A gated send (mcclTransportPostAfter) keeps its place on its link and holds what is queued
 * behind it until its gate receives have landed, then both leave in order; with and without the
 * sender thread (whose queues the gate's completion must wake). */
static void testGatedSend(int sender_thread) {
  mcclLoopback lb;
  EXPECT(loopbackOpen(&lb, 1 << 16) == 0, "loopback");
  if (lb.comm == NULL) return;
  mcclTransport* tp = &lb.comm->tp;
  if (sender_thread) EXPECT(mcclTransportStartSender(tp) == mcclSuccess, "sender thread: %s", tp->error);
  mcclXfer x[5]; /* two gate receives, the gated send, a send behind it, a P2P frame behind both */
  memset(x, 0, sizeof(x));
  for (int i = 0; i < 5; i++) {
    x[i].frame.coll = MCCL_COLL_BROADCAST;
    x[i].frame.dtype = mcclInt32;
    x[i].frame.count = 1;
    x[i].frame.step = MCCL_STEP_CONTROL + (uint32_t)i;
  }
  mcclTransportPostRecv(tp, 1, &x[0]);
  mcclTransportPostRecv(tp, 1, &x[1]);
  mcclTransportPostAfter(tp, 1, &x[2], &x[0], 2);
  mcclTransportPostSend(tp, 1, &x[3]);
  x[4].frame.type = MCCL_FRAME_P2P;
  mcclTransportPostSend(tp, 1, &x[4]);
  uint8_t hdr[2][MCCL_FRAME_BYTES], got[3 * MCCL_FRAME_BYTES];
  mcclFrame f0 = x[0].frame, f1 = x[1].frame;
  mcclFrameEncode(hdr[0], &f0);
  mcclFrameEncode(hdr[1], &f1);
  size_t have = 0;
  /* Only the first gate arrives: nothing may leave. */
  loopbackWrite(&lb, hdr[0], MCCL_FRAME_BYTES);
  double until = harnessSeconds() + 0.2;
  mcclResult_t res = mcclSuccess;
  while (harnessSeconds() < until && res == mcclSuccess) {
    res = loopbackDrain(&lb, 10);
    ssize_t n = recv(lb.peer_fd, got + have, sizeof(got) - have, MSG_DONTWAIT);
    if (n > 0) have += (size_t)n;
  }
  EXPECT(res == mcclSuccess && x[0].complete && !x[1].complete, "first gate: %s %s", mcclGetErrorString(res), tp->error);
  /* Only the P2P frame overtakes the gated send (docs/algorithms.md); the collective frame
   * behind the gate waits. */
  mcclFrame p;
  EXPECT(have == MCCL_FRAME_BYTES && mcclFrameDecode(got, &p) == 0 && p.type == MCCL_FRAME_P2P,
         "thread %d: %zu bytes left before the second gate (the P2P frame's %d expected)", sender_thread, have,
         MCCL_FRAME_BYTES);
  EXPECT(x[4].complete && !x[2].complete && !x[3].complete, "thread %d: only the P2P send completed", sender_thread);
  have = 0;
  /* The second gate: the gated send, then the one behind it. */
  loopbackWrite(&lb, hdr[1], MCCL_FRAME_BYTES);
  until = harnessSeconds() + 5;
  while (harnessSeconds() < until && res == mcclSuccess && have < 2 * MCCL_FRAME_BYTES) {
    res = loopbackDrain(&lb, 10);
    ssize_t n = recv(lb.peer_fd, got + have, sizeof(got) - have, MSG_DONTWAIT);
    if (n > 0) have += (size_t)n;
  }
  mcclFrame a, b;
  int ok = have == 2 * MCCL_FRAME_BYTES && mcclFrameDecode(got, &a) == 0 &&
           mcclFrameDecode(got + MCCL_FRAME_BYTES, &b) == 0;
  EXPECT(ok && a.step == MCCL_STEP_CONTROL + 2 && b.step == MCCL_STEP_CONTROL + 3,
         "thread %d: after both gates %zu bytes, steps in order: %d", sender_thread, have, ok);
  until = harnessSeconds() + 5;
  while (harnessSeconds() < until && !(x[2].complete && x[3].complete)) (void)loopbackDrain(&lb, 10);
  EXPECT(x[2].complete && x[3].complete, "thread %d: both sends complete", sender_thread);
  loopbackClose(&lb);
}

int main(void) {
  /* Before the parameters are read (once per process): a small budget for testP2pBudget. The
   * other tests park less than this. */
  setenv("MCCL_P2P_PARK_BYTES", "64K", 1);
  testHello();
  testFrames();
  testCollectiveRx();
  testAbortRx();
  testP2pRx();
  testP2pStalledMidMessage();
  testSettle();
  testP2pBudget();
  testGatedSend(0);
  testGatedSend(1);
  return harnessExit("test_wire");
}
