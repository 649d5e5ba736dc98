/*
 * fuzz_wire.c: libFuzzer target for the handshake and frame-header checks (csrc/transport/wire.c),
 * the code every byte from a peer meets first. Input layout: tests/fuzz/fuzz_common.h.
 *
 * Besides "no crash, no undefined behaviour" (ASan + UBSan), it checks what the checks promise:
 *  - an accepted hello or header re-encodes to exactly the input bytes (no field ignored) and
 *    satisfies every expectation (target, token, world size, which ranks may dial);
 *  - an accepted P2P header has its payload inside its message (checked in 128-bit arithmetic);
 *  - a rejection always says why, NUL-terminated inside the caller's buffer, whatever its size;
 *  - mcclFrameMatch accepts exactly the frames whose compared fields are all equal (a call site
 *    of 0 matches any).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "mccl.h"

#define REQUIRE(cond)                                                   \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "fuzz_wire: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      abort(); /* the harness, not the library: libFuzzer reports it */ \
    }                                                                   \
  } while (0)

static int connectedOdd(const void* ctx, int rank) {
  (void)ctx;
  return rank % 2 == 1 && rank > 4; /* ranks 5 and 7 are "already connected" */
}

/* The reason buffer honours its capacity: NUL-terminated inside it, non-empty on rejection. */
static void checkWhy(const char* why, size_t cap, int rejected) {
  if (cap == 0) return;
  REQUIRE(memchr(why, '\0', cap) != NULL);
  if (rejected && cap > 1) REQUIRE(why[0] != '\0');
  if (!rejected) REQUIRE(why[0] == '\0');
}

static void fuzzHello(const uint8_t* in, int ack, int who, char* why, size_t cap) {
  mcclHelloExpect e;
  memset(&e, 0, sizeof(e));
  memcpy(e.token, kFuzzToken, MCCL_TOKEN_BYTES);
  e.generation = FUZZ_GENERATION;
  e.comm_hash = FUZZ_COMM_HASH;
  e.rank = who % FUZZ_NRANKS;
  e.nranks = FUZZ_NRANKS;
  e.kind = ack ? MCCL_HELLO_KIND_ACK : MCCL_HELLO_KIND_HELLO;
  e.peer = (who / 16) % FUZZ_NRANKS;
  e.connected = connectedOdd;
  mcclHello h;
  mcclWireStatus st = mcclHelloCheck(in, &e, &h, cap ? why : NULL, cap);
  REQUIRE((unsigned)st < MCCL_WIRE_NUM_STATUS);
  REQUIRE(strcmp(mcclWireStatusName(st), "unknown status") != 0);
  checkWhy(why, cap, st != MCCL_WIRE_OK);
  if (st != MCCL_WIRE_OK) return;
  uint8_t again[MCCL_HELLO_BYTES];
  mcclHelloEncode(again, &h);
  REQUIRE(memcmp(again, in, MCCL_HELLO_BYTES) == 0);
  REQUIRE(h.version == MCCL_PROTOCOL_VERSION && h.kind == e.kind);
  REQUIRE(memcmp(h.token, kFuzzToken, MCCL_TOKEN_BYTES) == 0);
  REQUIRE(h.generation == FUZZ_GENERATION && h.comm_hash == FUZZ_COMM_HASH);
  REQUIRE(h.nranks == FUZZ_NRANKS && h.target == e.rank);
  if (ack) {
    REQUIRE(h.rank == (uint32_t)e.peer);
  } else {
    REQUIRE(h.rank > (uint32_t)e.rank && h.rank < FUZZ_NRANKS && !connectedOdd(NULL, (int)h.rank));
  }
}

static mcclWireStatus fuzzHeader(const uint8_t* in, int p2p_ok, mcclFrame* f, char* why, size_t cap) {
  mcclWireStatus st = mcclFrameHeaderCheck(in, p2p_ok, f, cap ? why : NULL, cap);
  REQUIRE((unsigned)st < MCCL_WIRE_NUM_STATUS);
  checkWhy(why, cap, st != MCCL_WIRE_OK);
  char desc[64]; /* short on purpose: descriptions are truncated, never overflowed */
  mcclFrameDescribe(f, desc, (size_t)(in[47] % sizeof(desc)) + 1);
  if (st != MCCL_WIRE_OK) return st;
  uint8_t again[MCCL_FRAME_BYTES];
  mcclFrameEncode(again, f);
  REQUIRE(memcmp(again, in, MCCL_FRAME_BYTES) == 0);
  REQUIRE(f->type == MCCL_FRAME_DATA || f->type == MCCL_FRAME_ABORT || f->type == MCCL_FRAME_CREDIT ||
          (p2p_ok && f->type == MCCL_FRAME_P2P));
  REQUIRE(f->type == MCCL_FRAME_DATA || f->site == 0); /* only collective frames carry a call site */
  if (f->type == MCCL_FRAME_CREDIT)
    REQUIRE(f->length == 0 && f->coll == 0 && f->dtype == 0 && f->op == 0 && f->count == 0 && f->offset == 0 &&
            f->step == 0 && f->root == 0);
  if (f->type == MCCL_FRAME_P2P) {
    REQUIRE(f->dtype < mcclNumTypes);
    unsigned __int128 total = (unsigned __int128)f->count * mcclDataTypeSize((mcclDataType_t)f->dtype);
    REQUIRE(total <= SIZE_MAX);
    REQUIRE((unsigned __int128)f->offset + f->length <= total);
  }
  return st;
}

static int sameFields(const mcclFrame* a, const mcclFrame* b) {
  return a->coll == b->coll && a->dtype == b->dtype && a->op == b->op && a->seq == b->seq &&
         a->count == b->count && a->offset == b->offset && a->length == b->length &&
         a->step == b->step && a->root == b->root && (a->site == b->site || a->site == 0 || b->site == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3 + MCCL_HELLO_BYTES) return 0;
  int mode = data[0], who = data[2];
  size_t cap = data[1];
  char* why = cap ? malloc(cap) : NULL; /* exact size, so ASan sees any write past it */
  if (cap && why == NULL) return 0;
  const uint8_t* in = data + 3;
  size_t left = size - 3;
  switch (mode & 3) {
    case 0:
    case 1: fuzzHello(in, mode & 1, who, why, cap); break;
    case 2: {
      mcclFrame f;
      fuzzHeader(in, (mode & 4) != 0, &f, why, cap);
      break;
    }
    case 3: {
      if (left < 2 * MCCL_FRAME_BYTES) break;
      mcclFrame a, b;
      fuzzHeader(in, (mode & 4) != 0, &a, why, cap);
      fuzzHeader(in + MCCL_FRAME_BYTES, (mode & 4) != 0, &b, why, cap);
      mcclWireStatus st = mcclFrameMatch(&a, &b, cap ? why : NULL, cap);
      REQUIRE((st == MCCL_WIRE_OK) == sameFields(&a, &b));
      REQUIRE(st == MCCL_WIRE_OK || st == MCCL_WIRE_MISMATCH);
      checkWhy(why, cap, st != MCCL_WIRE_OK);
      REQUIRE(mcclFrameMatch(&a, &a, NULL, 0) == MCCL_WIRE_OK);
      break;
    }
  }
  free(why);
  return 0;
}
