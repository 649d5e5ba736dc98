/*
 * wire.h: the bytes MCCL puts on a TCP connection (layer "transport").
 *
 * Every integer is fixed-width little-endian on the wire, whatever the host. Two message types:
 *
 * Hello (48 bytes), sent once in each direction when a connection opens: the connecting rank sends
 * kind HELLO, the accepting rank answers kind ACK. Either side closes the socket on any field it
 * does not expect (magic, version, token, generation, world size, rank).
 *
 *   0 magic u32 "MCCL"   4 version u16   6 kind u16   8 token[16]   24 generation u64
 *   32 comm_hash u64     40 rank u32     44 nranks u16 + target u16 (target: the rank dialled)
 *
 * Frame header (48 bytes), before every payload. The receiver compares it with what it posted, so a
 * rank that issued another collective, count, dtype, op, root or call site is detected, never
 * misread.
 *
 *   0 magic u32   4 type u8   5 coll u8   6 dtype u8   7 op u8   8 seq u64   16 count u64
 *   24 offset u64 (byte offset of the payload in its buffer)   32 length u32 (payload bytes)
 *   36 step u32   40 root u32   44 site u32 (DATA frames: the caller's call site,
 *   mcclOpOptions_t.call_site, 0 when none was given, which matches any; every other type: 0)
 *
 * A frame of type ABORT carries a UTF-8 reason as payload: its sender failed and is closing; its
 * seq is the number of collectives its sender completed (tcp.h, mcclTransportSettle).
 * A frame of type P2P belongs to a send/recv message, a frame of type CREDIT returns flow-control
 * credit (see the frame types below).
 *
 * Everything that judges bytes from a peer lives in wire.c as pure functions (no sockets, no
 * state beyond their arguments): mcclHelloCheck for the handshake, mcclFrameHeaderCheck for a
 * frame header as it arrives, mcclFrameMatch for a collective frame against the posted receive.
 * tcp.c calls them, and tests/fuzz/ feeds them arbitrary bytes, so the fuzzer runs exactly the
 * checks the library runs.
 */
#ifndef MCCL_WIRE_H_
#define MCCL_WIRE_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MCCL_WIRE_MAGIC 0x4c43434du /* "MCCL" read as a little-endian u32 */
#define MCCL_PROTOCOL_VERSION 3 /* 2: CREDIT frames; 3: the site word */
#define MCCL_TOKEN_BYTES 16
#define MCCL_HELLO_BYTES 48
#define MCCL_FRAME_BYTES 48
#define MCCL_MAX_ABORT_REASON 512

/* READY: after the handshake, sent on every connection once the sender's whole mesh is open, so
 * that no rank finishes init while another gives up (tcp_connect.c meshReady); rank: the sender, target:
 * the receiver, every other field as in its hello. */
/* NOTICE: with runtime connection (tcp.h), a failing rank opens a connection to each peer it has
 * none with, of any rank, only to send its ABORT frame: the hello's kind says so, it is followed
 * by that frame at once and answered by nothing; the receiver takes the connection as its link to
 * the sender, where the ABORT then reads as on any link. */
/* ASK: with runtime connection, a lower rank that needs a link to a higher rank which has not dialled
 * it (the higher rank needs nothing from it, say, because it issued another collective) opens a
 * connection to that rank only to ask it to dial: the hello is all it sends, nothing answers it,
 * and the receiver closes it and dials the sender as it would for a transfer of its own. */
enum {
  MCCL_HELLO_KIND_HELLO = 1,
  MCCL_HELLO_KIND_ACK = 2,
  MCCL_HELLO_KIND_READY = 3,
  MCCL_HELLO_KIND_NOTICE = 4,
  MCCL_HELLO_KIND_ASK = 5
};
/* DATA: a collective's frame, matched in order against the receives the algorithm posted.
 * P2P: a point-to-point message's frame (root = tag, count = the message's elements, offset and
 * length locate the payload in it), matched by (sender, tag) outside the collective order.
 * ABORT: the sender failed; the payload is its reason.
 * CREDIT: flow control of collective frames (transport/park.h): seq is the number of collective
 * payload bytes from the receiver of this frame that its sender's posted receives have taken
 * since the connection opened (a running total, so a later CREDIT supersedes an earlier one),
 * sent every MCCL_CREDIT_CHUNK bytes taken;
 * no payload, and every other field 0. */
enum { MCCL_FRAME_DATA = 1, MCCL_FRAME_ABORT = 2, MCCL_FRAME_P2P = 3, MCCL_FRAME_CREDIT = 4 };

/* A receiver sends a CREDIT frame each time its receives have taken this many more collective
 * payload bytes from the connection (transport/park.h). A wire constant, not a setting: a sender
 * whose lead is below it may always go on, which is safe only if every receiver reports at least
 * this often. */
#define MCCL_CREDIT_CHUNK (256u * 1024u)

/* Collective kinds, as carried in frames. */
typedef enum {
  MCCL_COLL_ALLREDUCE = 1,
  MCCL_COLL_BROADCAST = 2,
  MCCL_COLL_ALLGATHER = 3,
  MCCL_COLL_BARRIER = 4,
  MCCL_COLL_REDUCE = 5,
  MCCL_COLL_REDUCE_SCATTER = 6,
  MCCL_COLL_GATHER = 7,
  MCCL_COLL_SCATTER = 8,
  MCCL_COLL_ALLTOALL = 9,
  MCCL_COLL_SEND = 10,     /* point-to-point: not in the collective order */
  MCCL_COLL_RECV = 11,
} mcclCollKind;

typedef struct {
  uint16_t version, kind;
  uint8_t token[MCCL_TOKEN_BYTES];
  uint64_t generation, comm_hash;
  uint32_t rank;
  uint16_t nranks, target;
} mcclHello;

typedef struct {
  uint8_t type, coll, dtype, op;
  uint64_t seq, count, offset;
  uint32_t length, step, root;
  uint32_t site; /* DATA frames: the call site (mcclOpOptions_t.call_site); 0 otherwise */
} mcclFrame;

static inline void mcclPut16(uint8_t* p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void mcclPut32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void mcclPut64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t mcclGet16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t mcclGet32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static inline uint64_t mcclGet64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static inline void mcclHelloEncode(uint8_t out[MCCL_HELLO_BYTES], const mcclHello* h) {
  memset(out, 0, MCCL_HELLO_BYTES);
  mcclPut32(out + 0, MCCL_WIRE_MAGIC);
  mcclPut16(out + 4, h->version);
  mcclPut16(out + 6, h->kind);
  memcpy(out + 8, h->token, MCCL_TOKEN_BYTES);
  mcclPut64(out + 24, h->generation);
  mcclPut64(out + 32, h->comm_hash);
  mcclPut32(out + 40, h->rank);
  mcclPut16(out + 44, h->nranks);
  mcclPut16(out + 46, h->target);
}

/* Returns 0 when the magic matches, -1 otherwise (other fields are the caller's to check). */
static inline int mcclHelloDecode(const uint8_t in[MCCL_HELLO_BYTES], mcclHello* h) {
  if (mcclGet32(in) != MCCL_WIRE_MAGIC) return -1;
  h->version = mcclGet16(in + 4);
  h->kind = mcclGet16(in + 6);
  memcpy(h->token, in + 8, MCCL_TOKEN_BYTES);
  h->generation = mcclGet64(in + 24);
  h->comm_hash = mcclGet64(in + 32);
  h->rank = mcclGet32(in + 40);
  h->nranks = mcclGet16(in + 44);
  h->target = mcclGet16(in + 46);
  return 0;
}

static inline void mcclFrameEncode(uint8_t out[MCCL_FRAME_BYTES], const mcclFrame* f) {
  mcclPut32(out + 0, MCCL_WIRE_MAGIC);
  out[4] = f->type;
  out[5] = f->coll;
  out[6] = f->dtype;
  out[7] = f->op;
  mcclPut64(out + 8, f->seq);
  mcclPut64(out + 16, f->count);
  mcclPut64(out + 24, f->offset);
  mcclPut32(out + 32, f->length);
  mcclPut32(out + 36, f->step);
  mcclPut32(out + 40, f->root);
  mcclPut32(out + 44, f->site);
}

static inline int mcclFrameDecode(const uint8_t in[MCCL_FRAME_BYTES], mcclFrame* f) {
  if (mcclGet32(in) != MCCL_WIRE_MAGIC) return -1;
  f->type = in[4];
  f->coll = in[5];
  f->dtype = in[6];
  f->op = in[7];
  f->seq = mcclGet64(in + 8);
  f->count = mcclGet64(in + 16);
  f->offset = mcclGet64(in + 24);
  f->length = mcclGet32(in + 32);
  f->step = mcclGet32(in + 36);
  f->root = mcclGet32(in + 40);
  f->site = mcclGet32(in + 44);
  return 0;
}

/* ---- validation (wire.c) ------------------------------------------------------------------ */

/* What a check found. MCCL_WIRE_OK is 0; every other value rejects the bytes, and `why` says
 * which field held what (NUL-terminated, truncated to `cap`). */
typedef enum {
  MCCL_WIRE_OK = 0,
  MCCL_WIRE_BAD_MAGIC,     /* not an MCCL peer, or a stream out of step */
  MCCL_WIRE_BAD_VERSION,
  MCCL_WIRE_BAD_KIND,      /* hello where an ack was due, or the reverse */
  MCCL_WIRE_BAD_TOKEN,     /* another job, or a stranger */
  MCCL_WIRE_BAD_COMM,      /* another communicator or generation */
  MCCL_WIRE_BAD_NRANKS,
  MCCL_WIRE_BAD_TARGET,    /* dialled another rank */
  MCCL_WIRE_BAD_RANK,      /* a rank that may not connect this way, or not the one dialled */
  MCCL_WIRE_DUPLICATE,     /* a second connection for a rank */
  MCCL_WIRE_BAD_TYPE,      /* a frame type this connection does not carry */
  MCCL_WIRE_BAD_RESERVED,  /* a field this frame type does not use that is not zero */
  MCCL_WIRE_BAD_DTYPE,
  MCCL_WIRE_BAD_EXTENT,    /* a payload outside its message */
  MCCL_WIRE_MISMATCH,      /* a collective frame other than the one posted */
  MCCL_WIRE_NUM_STATUS
} mcclWireStatus;

/* A short static name of a status ("ok", "bad magic", ...). */
const char* mcclWireStatusName(mcclWireStatus status);

/* What a rank expects of a hello (kind HELLO, on a connection it accepted) or of the ack that
 * answers its own hello (kind ACK, on a connection it dialled to rank `peer`). */
typedef struct {
  uint8_t token[MCCL_TOKEN_BYTES];
  uint64_t generation, comm_hash;
  int rank, nranks;            /* this rank and the world size */
  int kind;                    /* MCCL_HELLO_KIND_HELLO or MCCL_HELLO_KIND_ACK */
  int peer;                    /* ACK: the rank dialled (ignored for HELLO) */
  int runtime;                 /* HELLO, with runtime connection: a NOTICE from any other rank and an
                                  ASK from a lower rank are accepted too */
  /* HELLO: nonzero when `rank` is connected already (a duplicate); NULL: never. */
  int (*connected)(const void* ctx, int rank);
  const void* ctx;
} mcclHelloExpect;

/* Decode the 48 bytes of a hello or ack and check every field against `e`. Only higher ranks
 * dial lower ones, so a HELLO must claim a rank in (e->rank, e->nranks) and target e->rank (where
 * e->runtime allows them: a NOTICE any rank in [0, e->nranks) but e->rank, an ASK a rank in
 * [0, e->rank), not checked for a duplicate since its sender may be linked by now); an
 * ACK must come from e->peer and target e->rank. Fills *out (when non-NULL) with what was
 * decoded, also on rejection as far as the magic allowed. */
mcclWireStatus mcclHelloCheck(const uint8_t in[MCCL_HELLO_BYTES], const mcclHelloExpect* e,
                              mcclHello* out, char* why, size_t cap);

/* Decode a frame header and check what holds for every frame before the receiver looks at it:
 * magic, a known type (P2P only when `p2p_ok`), the reserved word zero; for a P2P frame also a
 * valid dtype and a payload inside its message (offset + length <= count * dtype size, with no
 * overflow). A DATA frame's other fields are checked against the posted receive (mcclFrameMatch);
 * an ABORT frame's payload is its reason, of any length (the reader keeps the first
 * MCCL_MAX_ABORT_REASON bytes). */
mcclWireStatus mcclFrameHeaderCheck(const uint8_t in[MCCL_FRAME_BYTES], int p2p_ok, mcclFrame* out,
                                    char* why, size_t cap);

/* A DATA frame against the header the receiver posted: MCCL_WIRE_MISMATCH, with `why` holding
 * "sent <got>, but the receiver expected <want> (<fields> differ)", when any field differs. */
mcclWireStatus mcclFrameMatch(const mcclFrame* got, const mcclFrame* want, char* why, size_t cap);

/* Steps from here up mark control frames without data (announcements, confirmations and
 * agreement rounds, csrc/algo/algo.h); data frames use small step numbers. */
#define MCCL_STEP_CONTROL 0x40000000u

/* Human-readable names, for error messages (never NULL, also for values off the enums). */
const char* mcclCollName(int coll);
const char* mcclDtypeName(int dtype);
const char* mcclOpName(int op);
void mcclFrameDescribe(const mcclFrame* f, char* out, size_t cap);

#endif
