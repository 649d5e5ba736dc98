/*
 * gen_corpus.c: writes the checked-in seed corpus of the fuzz targets from valid messages built
 * with the library's own encoders (wire.h), so the fuzzers start from bytes the library accepts
 * and mutate outward. `make fuzz-corpus` runs it; its output is tests/fuzz/corpus/{wire,rx,store}/.
 *
 * Usage: gen_corpus <corpus dir>
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"
#include "mccl.h"

static const char* g_dir;

static void emit(const char* target, const char* name, const uint8_t* data, size_t len) {
  char path[512];
  snprintf(path, sizeof(path), "%s/%s", g_dir, target);
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    perror(path);
    exit(1);
  }
  snprintf(path, sizeof(path), "%s/%s/%s", g_dir, target, name);
  FILE* f = fopen(path, "wb");
  if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

static mcclHello hello(int kind, uint32_t rank, uint16_t target) {
  mcclHello h;
  memset(&h, 0, sizeof(h));
  h.version = MCCL_PROTOCOL_VERSION;
  h.kind = (uint16_t)kind;
  memcpy(h.token, kFuzzToken, MCCL_TOKEN_BYTES);
  h.generation = FUZZ_GENERATION;
  h.comm_hash = FUZZ_COMM_HASH;
  h.rank = rank;
  h.nranks = FUZZ_NRANKS;
  h.target = target;
  return h;
}

static mcclFrame dataFrame(int coll, int dtype, int op, uint64_t seq, uint64_t count, uint64_t offset,
                           uint32_t length, uint32_t step, uint32_t root) {
  mcclFrame f;
  memset(&f, 0, sizeof(f));
  f.type = MCCL_FRAME_DATA;
  f.coll = (uint8_t)coll;
  f.dtype = (uint8_t)dtype;
  f.op = (uint8_t)op;
  f.seq = seq;
  f.count = count;
  f.offset = offset;
  f.length = length;
  f.step = step;
  f.root = root;
  return f;
}

static mcclFrame p2pFrame(int tag, uint64_t msg, int dtype, uint64_t count, uint64_t offset, uint32_t length) {
  mcclFrame f = dataFrame(MCCL_COLL_SEND, dtype, 0, msg, count, offset, length, 0, (uint32_t)tag);
  f.type = MCCL_FRAME_P2P;
  return f;
}

/* ---- fuzz_wire seeds ------------------------------------------------------------------------ */

static void wireSeeds(void) {
  uint8_t buf[3 + 2 * MCCL_FRAME_BYTES];
  /* A hello from rank 6 to rank 2 (who = 2), and an ack from rank 0 to rank 3 (who = 3). */
  buf[0] = 0; buf[1] = 200; buf[2] = 2;
  mcclHello h = hello(MCCL_HELLO_KIND_HELLO, 6, 2);
  mcclHelloEncode(buf + 3, &h);
  emit("wire", "hello", buf, 3 + MCCL_HELLO_BYTES);
  buf[0] = 1; buf[1] = 16; buf[2] = 3;
  h = hello(MCCL_HELLO_KIND_ACK, 0, 3);
  mcclHelloEncode(buf + 3, &h);
  emit("wire", "ack", buf, 3 + MCCL_HELLO_BYTES);
  /* Frame headers: a ring all-reduce segment, an abort, a P2P frame, a credit; and a matching pair. */
  buf[0] = 2 | 4; buf[1] = 255; buf[2] = 0;
  mcclFrame f = dataFrame(MCCL_COLL_ALLREDUCE, mcclFloat32, mcclSum, 17, 1 << 20, 262144, 262144, 3, 0);
  mcclFrameEncode(buf + 3, &f);
  emit("wire", "frame-data", buf, 3 + MCCL_FRAME_BYTES);
  f = dataFrame(0, 0, 0, 0, 0, 0, 40, 0, 0);
  f.type = MCCL_FRAME_ABORT;
  mcclFrameEncode(buf + 3, &f);
  emit("wire", "frame-abort", buf, 3 + MCCL_FRAME_BYTES);
  f = p2pFrame(5, 2, mcclInt64, 1000, 4096, 3904);
  mcclFrameEncode(buf + 3, &f);
  emit("wire", "frame-p2p", buf, 3 + MCCL_FRAME_BYTES);
  memset(&f, 0, sizeof(f));
  f.type = MCCL_FRAME_CREDIT;
  f.seq = 3u << 20;
  mcclFrameEncode(buf + 3, &f);
  emit("wire", "frame-credit", buf, 3 + MCCL_FRAME_BYTES);
  buf[0] = 3 | 4; buf[1] = 64;
  f = dataFrame(MCCL_COLL_BROADCAST, mcclBfloat16, mcclSum, 4, 999, 0, 1998, 1, 2);
  mcclFrameEncode(buf + 3, &f);
  f.root = 1;
  mcclFrameEncode(buf + 3 + MCCL_FRAME_BYTES, &f);
  emit("wire", "match-pair", buf, sizeof(buf));
}

/* ---- fuzz_rx seeds -------------------------------------------------------------------------- */

typedef struct {
  uint8_t b[8192];
  size_t n;
} seed;

static void rxHeader(seed* s, int ncoll, int np2p, int flags) {
  s->n = 0;
  s->n = fuzzPut(s->b, s->n, (uint64_t)ncoll, 1);
  s->n = fuzzPut(s->b, s->n, (uint64_t)np2p, 1);
  s->n = fuzzPut(s->b, s->n, (uint64_t)flags, 1);
}

/* A posted collective receive expecting frame `f` (its length is the buffer's size). */
static void rxColl(seed* s, const mcclFrame* f, int post_at) {
  s->n = fuzzPut(s->b, s->n, f->coll, 1);
  s->n = fuzzPut(s->b, s->n, f->dtype, 1);
  s->n = fuzzPut(s->b, s->n, f->op, 1);
  s->n = fuzzPut(s->b, s->n, f->step, 1);
  s->n = fuzzPut(s->b, s->n, f->seq, 4);
  s->n = fuzzPut(s->b, s->n, f->count, 4);
  s->n = fuzzPut(s->b, s->n, f->offset, 2);
  s->n = fuzzPut(s->b, s->n, f->length, 2);
  s->n = fuzzPut(s->b, s->n, f->root, 1);
  s->n = fuzzPut(s->b, s->n, (uint64_t)post_at, 1);
}

static void rxP2p(seed* s, int tag, int from_rank1, int dtype, int count, int timeout_ms, int post_at) {
  s->n = fuzzPut(s->b, s->n, (uint64_t)tag, 1);
  s->n = fuzzPut(s->b, s->n, (uint64_t)from_rank1, 1);
  s->n = fuzzPut(s->b, s->n, (uint64_t)dtype, 1);
  s->n = fuzzPut(s->b, s->n, (uint64_t)count, 2);
  s->n = fuzzPut(s->b, s->n, (uint64_t)timeout_ms, 1);
  s->n = fuzzPut(s->b, s->n, (uint64_t)post_at, 1);
  s->n = fuzzPut(s->b, s->n, 0, 1);
}

/* A frame on the stream: header, then `length` payload bytes counting up from `fill`. */
static void rxFrame(seed* s, const mcclFrame* f, int fill) {
  mcclFrameEncode(s->b + s->n, f);
  s->n += MCCL_FRAME_BYTES;
  for (uint32_t i = 0; i < f->length; i++) s->b[s->n++] = (uint8_t)(fill + (int)i);
}

static void rxSeeds(void) {
  seed s;
  /* 1. Two collective segments of a ring step, in small chunks, receives posted up front. */
  mcclFrame a = dataFrame(MCCL_COLL_ALLREDUCE, mcclFloat32, mcclSum, 7, 128, 0, 256, 1, 0);
  mcclFrame b = dataFrame(MCCL_COLL_ALLREDUCE, mcclFloat32, mcclSum, 7, 128, 256, 256, 1, 0);
  rxHeader(&s, 2, 0, 0x50);
  rxColl(&s, &a, 0);
  rxColl(&s, &b, 0);
  rxFrame(&s, &a, 1);
  rxFrame(&s, &b, 2);
  emit("rx", "coll-two-segments", s.b, s.n);
  /* 2. The same, the second receive posted late (the header waits, peeked) and rank 1 leaves. */
  rxHeader(&s, 2, 0, 0x32);
  rxColl(&s, &a, 0);
  rxColl(&s, &b, 9);
  rxFrame(&s, &a, 1);
  rxFrame(&s, &b, 2);
  emit("rx", "coll-late-post", s.b, s.n);
  /* 3. A collective frame that does not match (another root). */
  mcclFrame c = dataFrame(MCCL_COLL_BROADCAST, mcclInt8, mcclSum, 2, 64, 0, 64, 0, 1);
  rxHeader(&s, 1, 0, 0);
  rxColl(&s, &c, 0);
  c.root = 0;
  rxFrame(&s, &c, 3);
  emit("rx", "coll-mismatch", s.b, s.n);
  /* 4. A point-to-point message in three frames, receive posted first. */
  rxHeader(&s, 0, 1, 0x41);
  rxP2p(&s, 5, 1, mcclInt32, 100, 0, 0);
  mcclFrame p = p2pFrame(5, 0, mcclInt32, 100, 0, 160);
  rxFrame(&s, &p, 10);
  p.offset = 160;
  rxFrame(&s, &p, 20);
  p.offset = 320;
  p.length = 80;
  rxFrame(&s, &p, 30);
  emit("rx", "p2p-three-frames", s.b, s.n);
  /* 5. Messages that arrive before their receives (parked, behind a barrier frame), an empty
   * one, then any-source receives posted at the end. */
  mcclFrame bar = dataFrame(MCCL_COLL_BARRIER, mcclUint8, mcclSum, 1, 0, 0, 0, 0, 0);
  rxHeader(&s, 1, 3, 0x61);
  rxColl(&s, &bar, 0);
  rxP2p(&s, 9, 0, mcclInt64, 3, 0, 255);
  rxP2p(&s, 8, 1, mcclFloat16, 0, 0, 255);
  rxP2p(&s, 9, 1, mcclInt64, 2, 50, 255);
  p = p2pFrame(9, 0, mcclInt64, 3, 0, 24);
  rxFrame(&s, &p, 40);
  p = p2pFrame(8, 1, mcclFloat16, 0, 0, 0);
  rxFrame(&s, &p, 0);
  rxFrame(&s, &bar, 0);
  emit("rx", "p2p-parked", s.b, s.n);
  /* 6. A size mismatch on a matched receive (the rest of the message is discarded), then a
   * good one. */
  rxHeader(&s, 0, 2, 0x01);
  rxP2p(&s, 3, 1, mcclUint8, 10, 0, 0);
  rxP2p(&s, 4, 1, mcclUint8, 10, 0, 0);
  p = p2pFrame(3, 0, mcclUint8, 12, 0, 6);
  rxFrame(&s, &p, 50);
  p.offset = 6;
  rxFrame(&s, &p, 56);
  p = p2pFrame(4, 1, mcclUint8, 10, 0, 10);
  rxFrame(&s, &p, 60);
  emit("rx", "p2p-mismatch", s.b, s.n);
  /* 7. An abort with its reason, arriving in pieces while a collective receive waits. */
  rxHeader(&s, 1, 0, 0x20);
  rxColl(&s, &a, 0);
  mcclFrame ab = dataFrame(0, 0, 0, 0, 0, 0, 30, 0, 0);
  ab.type = MCCL_FRAME_ABORT;
  mcclFrameEncode(s.b + s.n, &ab);
  s.n += MCCL_FRAME_BYTES;
  memcpy(s.b + s.n, "rank 1: allreduce #7 timed out", 30);
  s.n += 30;
  emit("rx", "abort", s.b, s.n);
  /* 8. Point-to-point frames interleaved with collective frames, hooks on, rank 1 leaves. */
  rxHeader(&s, 2, 1, 0x73);
  rxColl(&s, &a, 0);
  rxColl(&s, &b, 1);
  rxP2p(&s, 1, 1, mcclBfloat16, 64, 0, 3);
  p = p2pFrame(1, 0, mcclBfloat16, 64, 0, 64);
  rxFrame(&s, &p, 70);
  rxFrame(&s, &a, 1);
  p.offset = 64;
  rxFrame(&s, &p, 80);
  rxFrame(&s, &b, 2);
  emit("rx", "mixed", s.b, s.n);
  /* 9. Regression: an unclaimed message whose first frame claims a 4 GiB payload and sends 100
   * bytes. The parked buffer must follow the bytes that arrive (libFuzzer fails any malloc over
   * its 2 GiB limit; this once asked for 4 GiB). */
  rxHeader(&s, 1, 0, 0x01);
  rxColl(&s, &bar, 0);
  p = p2pFrame(12, 0, mcclUint8, (uint64_t)1 << 40, 0, 0xffffffffu);
  mcclFrameEncode(s.b + s.n, &p);
  s.n += MCCL_FRAME_BYTES;
  for (int i = 0; i < 100; i++) s.b[s.n++] = (uint8_t)i;
  emit("rx", "regress-parked-4g-frame", s.b, s.n);
}

/* ---- fuzz_store seeds ----------------------------------------------------------------------- */

/* A request of the store protocol (tcpstore.c): op u8, key_len u32, key, then the value (SET:
 * len u32 + bytes) or the delta (ADD: i64). */
static size_t storeReq(uint8_t* out, size_t pos, int op, const char* key, const void* val, uint32_t vlen,
                       int64_t delta) {
  size_t klen = strlen(key);
  pos = fuzzPut(out, pos, (uint64_t)op, 1);
  pos = fuzzPut(out, pos, klen, 4);
  memcpy(out + pos, key, klen);
  pos += klen;
  if (op == 1) {
    pos = fuzzPut(out, pos, vlen, 4);
    memcpy(out + pos, val, vlen);
    pos += vlen;
  } else if (op == 3) {
    pos = fuzzPut(out, pos, (uint64_t)delta, 8);
  }
  return pos;
}

static void storeSeeds(void) {
  uint8_t b[1024];
  /* What an init does: add to the counter, set the token, set and get addresses; in 7-byte
   * chunks (seed byte 0x35). */
  size_t n = fuzzPut(b, 0, 0x35, 1);
  n = storeReq(b, n, 3, "mccl/test/inits", NULL, 0, 1);
  n = storeReq(b, n, 3, "mccl/test/inits", NULL, 0, 1);
  n = storeReq(b, n, 1, "mccl/test/g0/token", "0123456789abcdef", 16, 0);
  n = storeReq(b, n, 1, "mccl/test/g0/addr/0", "127.0.0.1:40001", 15, 0);
  n = storeReq(b, n, 4, "mccl/test/g0/addr/0", NULL, 0, 0);
  n = storeReq(b, n, 2, "mccl/test/g0/addr/0", NULL, 0, 0);
  n = storeReq(b, n, 2, "mccl/test/g0/token", NULL, 0, 0);
  emit("store", "init", b, n);
  /* An empty value, an overwrite, an ADD over a non-counter, then a GET that parks for good. */
  n = fuzzPut(b, 0, 0, 1);
  n = storeReq(b, n, 1, "k", "", 0, 0);
  n = storeReq(b, n, 1, "k", "value", 5, 0);
  n = storeReq(b, n, 3, "k", NULL, 0, -7);
  n = storeReq(b, n, 2, "k", NULL, 0, 0);
  n = storeReq(b, n, 2, "missing", NULL, 0, 0);
  n = storeReq(b, n, 1, "after", "x", 1, 0);
  emit("store", "overwrite-park", b, n);
  /* A malformed request after a good one (op 9). */
  n = fuzzPut(b, 0, 0x11, 1);
  n = storeReq(b, n, 1, "a", "b", 1, 0);
  n = fuzzPut(b, n, 9, 1);
  n = fuzzPut(b, n, 1, 4);
  b[n++] = 'z';
  emit("store", "bad-op", b, n);
  /* Regression: a key holding a NUL byte was accepted and stored as the C string before it ("a"
   * here), aliasing another key; it now ends the connection. */
  n = fuzzPut(b, 0, 0, 1);
  n = storeReq(b, n, 1, "a", "1", 1, 0);
  n = fuzzPut(b, n, 1, 1);
  n = fuzzPut(b, n, 3, 4);
  memcpy(b + n, "a\0b", 3);
  n += 3;
  n = fuzzPut(b, n, 1, 4);
  b[n++] = '2';
  n = storeReq(b, n, 2, "a", NULL, 0, 0);
  emit("store", "regress-nul-key", b, n);
  /* Regression: ADDs whose sum overflows int64 (undefined behaviour in the server until it
   * summed in unsigned arithmetic; the result wraps around). */
  n = fuzzPut(b, 0, 0, 1);
  n = storeReq(b, n, 3, "c", NULL, 0, INT64_MAX);
  n = storeReq(b, n, 3, "c", NULL, 0, 1);
  n = storeReq(b, n, 3, "c", NULL, 0, INT64_MIN);
  n = storeReq(b, n, 3, "c", NULL, 0, -1);
  emit("store", "regress-add-overflow", b, n);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  g_dir = argv[1];
  if (mkdir(g_dir, 0755) != 0 && errno != EEXIST) {
    perror(g_dir);
    return 1;
  }
  wireSeeds();
  rxSeeds();
  storeSeeds();
  return 0;
}
