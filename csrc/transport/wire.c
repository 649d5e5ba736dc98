/* wire.c: every check of bytes that came from a peer, as pure functions (see wire.h). Nothing here
 * touches a socket or a communicator: tcp.c calls these on the bytes it read, and the fuzzers in
 * tests/fuzz/ call them on arbitrary bytes. */
#include "transport/wire.h"

#include <stdarg.h>
#include <stdio.h>

#include "mccl.h"

const char* mcclWireStatusName(mcclWireStatus status) {
  static const char* names[] = {"ok",           "bad magic",     "bad version",  "bad kind",
                                "bad token",    "bad communicator", "bad world size", "bad target",
                                "bad rank",     "duplicate",     "bad type",     "bad reserved field",
                                "bad dtype",    "bad extent",    "mismatch"};
  _Static_assert(sizeof(names) / sizeof(names[0]) == MCCL_WIRE_NUM_STATUS, "one name per status");
  return (unsigned)status < MCCL_WIRE_NUM_STATUS ? names[status] : "unknown status";
}

const char* mcclCollName(int coll) {
  switch (coll) {
    case MCCL_COLL_ALLREDUCE: return "allreduce";
    case MCCL_COLL_BROADCAST: return "broadcast";
    case MCCL_COLL_ALLGATHER: return "allgather";
    case MCCL_COLL_BARRIER: return "barrier";
    case MCCL_COLL_REDUCE: return "reduce";
    case MCCL_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case MCCL_COLL_GATHER: return "gather";
    case MCCL_COLL_SCATTER: return "scatter";
    case MCCL_COLL_ALLTOALL: return "alltoall";
    case MCCL_COLL_SEND: return "send";
    case MCCL_COLL_RECV: return "recv";
    default: return "unknown-collective";
  }
}

const char* mcclDtypeName(int dtype) {
  /* Indexed by mcclDataType_t, whose numbers the wire carries. */
  static const char* names[] = {"int8",    "uint8",   "int32",    "int64", "float16",
                                "float32", "float64", "bfloat16", "bool",  "int16",
                                "uint16",  "uint32",  "uint64"};
  _Static_assert(sizeof(names) / sizeof(names[0]) == mcclNumTypes, "one name per mcclDataType_t");
  return dtype >= 0 && dtype < (int)(sizeof(names) / sizeof(names[0])) ? names[dtype] : "unknown-dtype";
}

const char* mcclOpName(int op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg", "band", "bor", "bxor", "premul_sum"};
  return op >= 0 && op < (int)(sizeof(names) / sizeof(names[0])) ? names[op] : "unknown-op";
}

void mcclFrameDescribe(const mcclFrame* f, char* out, size_t cap) {
  /* Only the fields the collective uses: an op for reductions, a root for rooted collectives. */
  const int reduces = f->coll == MCCL_COLL_ALLREDUCE || f->coll == MCCL_COLL_REDUCE ||
                      f->coll == MCCL_COLL_REDUCE_SCATTER;
  const int rooted = f->coll == MCCL_COLL_BROADCAST || f->coll == MCCL_COLL_REDUCE ||
                     f->coll == MCCL_COLL_GATHER || f->coll == MCCL_COLL_SCATTER;
  char op[48] = "", root[32] = "", step[48];
  if (reduces) snprintf(op, sizeof(op), ", op %s", mcclOpName(f->op));
  if (rooted) snprintf(root, sizeof(root), ", root %u", f->root);
  if (f->step >= MCCL_STEP_CONTROL)
    snprintf(step, sizeof(step), f->step == MCCL_STEP_CONTROL ? "announcement" : "agreement round %u",
             f->step - MCCL_STEP_CONTROL);
  else
    snprintf(step, sizeof(step), "step %u", f->step);
  char site[32] = "";
  if (f->site != 0) snprintf(site, sizeof(site), ", call site %08x", f->site);
  snprintf(out, cap, "%s #%llu (count %llu %s%s%s%s; %s, bytes %llu+%u)", mcclCollName(f->coll),
           (unsigned long long)f->seq, (unsigned long long)f->count, mcclDtypeName(f->dtype), op, root, site,
           step, (unsigned long long)f->offset, f->length);
}

/* Write `why` and return `status`. */
static mcclWireStatus reject(mcclWireStatus status, char* why, size_t cap, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

static mcclWireStatus reject(mcclWireStatus status, char* why, size_t cap, const char* fmt, ...) {
  if (why != NULL && cap > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
  }
  return status;
}

static int tokenEqual(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0; /* constant time: do not leak how much of a guessed token matched */
  for (int i = 0; i < MCCL_TOKEN_BYTES; i++) diff |= (uint8_t)(a[i] ^ b[i]);
  return diff == 0;
}

mcclWireStatus mcclHelloCheck(const uint8_t in[MCCL_HELLO_BYTES], const mcclHelloExpect* e,
                              mcclHello* out, char* why, size_t cap) {
  mcclHello h;
  memset(&h, 0, sizeof(h));
  if (why != NULL && cap > 0) why[0] = '\0';
  int magic_ok = mcclHelloDecode(in, &h) == 0;
  if (out != NULL) *out = h;
  if (!magic_ok)
    return reject(MCCL_WIRE_BAD_MAGIC, why, cap, "bad magic 0x%08x (not an MCCL peer)", mcclGet32(in));
  if (h.version != MCCL_PROTOCOL_VERSION)
    return reject(MCCL_WIRE_BAD_VERSION, why, cap, "protocol version %u, expected %u", h.version,
                  MCCL_PROTOCOL_VERSION);
  const int hello = e->kind == MCCL_HELLO_KIND_HELLO;
  const int notice = e->runtime && hello && h.kind == MCCL_HELLO_KIND_NOTICE;
  const int ask = e->runtime && hello && h.kind == MCCL_HELLO_KIND_ASK;
  if (h.kind != e->kind && !notice && !ask)
    return reject(MCCL_WIRE_BAD_KIND, why, cap, "handshake message kind %u, expected %d (%s)", h.kind,
                  e->kind, hello ? "hello" : "ack");
  if (!tokenEqual(h.token, e->token))
    return reject(MCCL_WIRE_BAD_TOKEN, why, cap, "wrong job token (another job, or a stranger)");
  if (h.generation != e->generation || h.comm_hash != e->comm_hash)
    return reject(MCCL_WIRE_BAD_COMM, why, cap,
                  "communicator %016llx generation %llu, expected %016llx generation %llu",
                  (unsigned long long)h.comm_hash, (unsigned long long)h.generation,
                  (unsigned long long)e->comm_hash, (unsigned long long)e->generation);
  if ((int)h.nranks != e->nranks)
    return reject(MCCL_WIRE_BAD_NRANKS, why, cap, "world size %u, expected %d", h.nranks, e->nranks);
  if ((int)h.target != e->rank)
    return reject(MCCL_WIRE_BAD_TARGET, why, cap, "meant for rank %u, but this is rank %d", h.target, e->rank);
  if (hello) {
    /* Compare as unsigned: a u32 rank above INT_MAX must not turn negative. */
    const uint32_t self = (uint32_t)e->rank, n = (uint32_t)e->nranks;
    if (notice ? h.rank == self || h.rank >= n : ask ? h.rank >= self : h.rank <= self || h.rank >= n)
      return reject(MCCL_WIRE_BAD_RANK, why, cap, "%s claims rank %u, which must not %s rank %d",
                    ask ? "an ask to connect" : notice ? "a notice" : "a hello", h.rank,
                    ask ? "ask" : "dial", e->rank);
    if (!ask && e->connected != NULL && e->connected(e->ctx, (int)h.rank))
      return reject(MCCL_WIRE_DUPLICATE, why, cap, "duplicate connection for rank %u", h.rank);
  } else if (h.rank != (uint32_t)e->peer) {
    return reject(MCCL_WIRE_BAD_RANK, why, cap, "answered as rank %u, expected rank %d", h.rank, e->peer);
  }
  return MCCL_WIRE_OK;
}

mcclWireStatus mcclFrameHeaderCheck(const uint8_t in[MCCL_FRAME_BYTES], int p2p_ok, mcclFrame* out,
                                    char* why, size_t cap) {
  mcclFrame f;
  memset(&f, 0, sizeof(f));
  if (why != NULL && cap > 0) why[0] = '\0';
  int magic_ok = mcclFrameDecode(in, &f) == 0;
  if (out != NULL) *out = f;
  if (!magic_ok) return reject(MCCL_WIRE_BAD_MAGIC, why, cap, "a frame with a bad magic number 0x%08x", mcclGet32(in));
  if (f.type != MCCL_FRAME_DATA && f.type != MCCL_FRAME_ABORT && f.type != MCCL_FRAME_CREDIT &&
      !(f.type == MCCL_FRAME_P2P && p2p_ok))
    return reject(MCCL_WIRE_BAD_TYPE, why, cap, "a frame of unexpected type %u", f.type);
  if (f.type != MCCL_FRAME_DATA && f.site != 0)
    return reject(MCCL_WIRE_BAD_RESERVED, why, cap, "a frame of type %u whose site word is 0x%08x, not 0", f.type,
                  f.site);
  if (f.type == MCCL_FRAME_CREDIT &&
      (f.length != 0 || f.coll || f.dtype || f.op || f.count || f.offset || f.step || f.root))
    return reject(MCCL_WIRE_BAD_RESERVED, why, cap,
                  "a credit frame with fields other than its total set (length %u, coll %u, count %llu)",
                  f.length, f.coll, (unsigned long long)f.count);
  if (f.type == MCCL_FRAME_P2P) {
    size_t esz = f.dtype < mcclNumTypes ? mcclDataTypeSize((mcclDataType_t)f.dtype) : 0;
    if (esz == 0) return reject(MCCL_WIRE_BAD_DTYPE, why, cap, "a send/recv frame of unknown dtype %u", f.dtype);
    if (f.count > (uint64_t)SIZE_MAX / esz)
      return reject(MCCL_WIRE_BAD_EXTENT, why, cap, "a send/recv frame of %llu %s elements, more than memory holds",
                    (unsigned long long)f.count, mcclDtypeName(f.dtype));
    uint64_t total = f.count * esz;
    if (f.offset > total || f.length > total - f.offset)
      return reject(MCCL_WIRE_BAD_EXTENT, why, cap,
                    "a send/recv frame with bytes %llu+%u outside its %llu-byte message",
                    (unsigned long long)f.offset, f.length, (unsigned long long)total);
  }
  return MCCL_WIRE_OK;
}

mcclWireStatus mcclFrameMatch(const mcclFrame* got, const mcclFrame* want, char* why, size_t cap) {
  if (why != NULL && cap > 0) why[0] = '\0';
  char fields[96] = "";
  size_t len = 0;
#define FIELD(name)                                                                              \
  if (got->name != want->name)                                                                   \
    len += (size_t)snprintf(fields + len, sizeof(fields) - len, "%s" #name, len ? ", " : "");    \
  if (len >= sizeof(fields)) len = sizeof(fields) - 1;
  FIELD(coll) FIELD(dtype) FIELD(op) FIELD(seq) FIELD(count) FIELD(root) FIELD(step) FIELD(offset) FIELD(length)
  if (got->site != 0 && want->site != 0) { FIELD(site) } /* 0: no call site given, matches any */
#undef FIELD
  if (len == 0) return MCCL_WIRE_OK;
  char a[220], b[220];
  mcclFrameDescribe(got, a, sizeof(a));
  mcclFrameDescribe(want, b, sizeof(b));
  /* Only the call site differs: the same collective, issued from two places of the program. */
  const char* hint = strcmp(fields, "site") == 0
                         ? ": one rank skipped a collective, or issued this one from another line "
                           "(MCCL_CHECK_CALL_SITES)"
                         : "";
  return reject(MCCL_WIRE_MISMATCH, why, cap, "sent %s, but the receiver expected %s (%s differ%s)", a, b, fields,
                hint);
}
