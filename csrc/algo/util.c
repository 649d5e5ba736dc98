/* util.c: what every algorithm shares: scratch, frame headers, and the point-to-point exchange. */
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "algo/algo.h"
#include "algo/select.h"
#include "core/debug.h"

/* Grow geometrically so a run of growing messages reallocates only a few times. */
static char* grow(char** buf, size_t* have, size_t bytes) {
  if (bytes <= *have) return *buf;
  size_t want = *have * 2 > bytes ? *have * 2 : bytes;
  char* p = realloc(*buf, want);
  if (p == NULL) return NULL;
  *buf = p;
  *have = want;
  return p;
}

char* mcclAlgoScratch(mcclAlgoCtx* ctx, size_t bytes) { return grow(&ctx->scratch, &ctx->scratch_bytes, bytes); }
char* mcclAlgoWork(mcclAlgoCtx* ctx, size_t bytes) { return grow(&ctx->work, &ctx->work_bytes, bytes); }

mcclResult_t mcclAlgoOutOfMemory(mcclAlgoCtx* ctx, size_t bytes) {
  mcclTransportHalt(ctx->tp); /* the caller unwinds: what it posted must not be written any more */
  snprintf(ctx->tp->error, sizeof(ctx->tp->error), "out of memory for %zu bytes of intermediate results", bytes);
  return mcclSystemError;
}

void mcclAlgoFrame(const mcclOp* op, mcclFrame* f, uint32_t step, size_t offset, size_t length) {
  memset(f, 0, sizeof(*f));
  f->type = MCCL_FRAME_DATA;
  f->coll = (uint8_t)op->coll;
  f->dtype = (uint8_t)op->dtype;
  f->op = (uint8_t)op->op;
  f->seq = op->seq;
  f->count = op->count;
  f->root = (uint32_t)op->root;
  f->site = op->site;
  f->step = step;
  f->offset = offset;
  f->length = (uint32_t)length;
}

static size_t framesOf(const mcclAlgoCtx* ctx, const mcclPeerIo* io) {
  return io->bytes == 0 ? 1 : (io->bytes + ctx->segment_bytes - 1) / ctx->segment_bytes;
}

/* Frames carry op->count, except all-to-all frames: the pair's own element count. */
static void ioFrame(const mcclOp* op, const mcclPeerIo* io, mcclFrame* f, uint32_t step, size_t off, size_t len) {
  mcclAlgoFrame(op, f, step, io->offset + off, len);
  if (op->coll == MCCL_COLL_ALLTOALL) f->count = io->bytes / mcclDataTypeSize(op->dtype);
}

/* Post the frames of io that cover its bytes [from, to) (frames start at multiples of the
 * segment size; an empty io has one empty frame, posted with from == 0), with payloads at
 * `buf` + (byte - from); returns how many went into xs. */
static size_t postIoRange(mcclAlgoCtx* ctx, const mcclOp* op, const mcclPeerIo* io, size_t from, size_t to,
                          char* buf, mcclXfer* xs) {
  size_t seg = ctx->segment_bytes, off = from, k = 0;
  if (from >= to && !(io->bytes == 0 && from == 0)) return 0;
  do {
    size_t len = to - off < seg ? to - off : seg;
    mcclXfer* x = &xs[k++];
    memset(x, 0, sizeof(*x));
    ioFrame(op, io, &x->frame, io->step, off, len);
    x->buf = buf + (off - from);
    x->bytes = len;
    if (io->is_send) mcclTransportPostSend(ctx->tp, io->peer, x);
    else mcclTransportPostRecv(ctx->tp, io->peer, x);
    off += len;
  } while (off < to);
  return k;
}

static size_t postIo(mcclAlgoCtx* ctx, const mcclOp* op, const mcclPeerIo* io, mcclXfer* xs) {
  return postIoRange(ctx, op, io, 0, io->bytes, io->buf, xs);
}

/* Progress until xs[0..n) are all complete. */
static mcclResult_t waitAll(mcclAlgoCtx* ctx, const mcclOp* op, const mcclXfer* xs, size_t n) {
  for (size_t first = 0;;) {
    while (first < n && xs[first].complete) first++;
    if (first == n) return mcclSuccess;
    MCCLCHECK(mcclTransportProgress(ctx->tp, op->deadline_ns, ctx->abort_flag));
  }
}

static mcclXfer* xferArray(mcclAlgoCtx* ctx, size_t n, mcclXfer* stack, size_t stack_n) {
  mcclXfer* xs = n <= stack_n ? stack : (n > SIZE_MAX / sizeof(mcclXfer) ? NULL : malloc(n * sizeof(mcclXfer)));
  if (xs == NULL) (void)mcclAlgoOutOfMemory(ctx, n > SIZE_MAX / sizeof(mcclXfer) ? SIZE_MAX : n * sizeof(mcclXfer));
  return xs;
}

mcclResult_t mcclAlgoExchange(mcclAlgoCtx* ctx, const mcclOp* op, const mcclPeerIo* ios, int nios) {
  size_t nframes = 0;
  for (int i = 0; i < nios; i++) nframes += framesOf(ctx, &ios[i]);
  mcclXfer stack_xfers[16] = {{0}}; /* zeroed: gcc cannot see that only posted ones are read */
  mcclXfer* xs = xferArray(ctx, nframes, stack_xfers, 16);
  if (xs == NULL) return mcclSystemError;
  size_t k = 0;
  for (int i = 0; i < nios; i++) k += postIo(ctx, op, &ios[i], xs + k);
  mcclResult_t res = waitAll(ctx, op, xs, nframes);
  if (xs != stack_xfers) free(xs);
  return res;
}

/* Bytes of a receive that may land in scratch before the announcements are in (sends: none). */
static size_t earlyBytes(const mcclPeerIo* io, size_t most) {
  return io->is_send ? 0 : (io->bytes < most ? io->bytes : most);
}

/* One io of an announced exchange: where its frames sit in the xfer array. A receive may be
 * posted in two parts (its early bytes into scratch, the rest into its buffer). */
typedef struct {
  size_t x0, nx;     /* first part's frames: xs[x0 .. x0+nx) */
  size_t x1, nx1;    /* second part's frames */
  size_t early;      /* bytes of the first part that went to scratch (0: posted straight) */
  size_t scratch_at; /* where in scratch */
  int posted, rest_pending;
} mcclIoState;

static int partDone(const mcclXfer* xs, size_t x0, size_t nx) {
  for (size_t i = 0; i < nx; i++)
    if (!xs[x0 + i].complete) return 0;
  return 1;
}

mcclResult_t mcclAlgoExchangeAnnounced(mcclAlgoCtx* ctx, const mcclOp* op, const mcclPeerIo* ios, int nios,
                                       int window, int confirm) {
  /* Receives posted before this rank may write take at most MCCL_EARLY_SEGMENTS segments into
   * scratch (copied to the output at the end), so data flows from the start and the copy is
   * bounded; the rest is posted into the output once it may. Receives posted after that go
   * straight into the output. */
  enum { MCCL_EARLY_SEGMENTS = 2 };
  const size_t early_max = MCCL_EARLY_SEGMENTS * ctx->segment_bytes;
  const size_t nctl = (size_t)nios * (confirm ? 2 : 1); /* announcements [, confirmations] */
  size_t nframes = nctl, early_total = 0;
  uint32_t nwaves = 0;
  for (int i = 0; i < nios; i++) {
    nframes += framesOf(ctx, &ios[i]);
    early_total += earlyBytes(&ios[i], early_max);
    if (ios[i].step + 1 > nwaves) nwaves = ios[i].step + 1;
  }
  if (window <= 0 || (uint32_t)window > nwaves) window = (int)nwaves;
  char* early = early_total ? mcclAlgoScratch(ctx, early_total) : NULL;
  if (early_total && early == NULL) return mcclAlgoOutOfMemory(ctx, early_total);
  mcclXfer stack_xfers[16];
  mcclXfer* xs = xferArray(ctx, nframes, stack_xfers, 16);
  mcclIoState* st = calloc((size_t)nios, sizeof(*st));
  if (xs == NULL || st == NULL) {
    if (xs != stack_xfers) free(xs);
    free(st);
    return mcclAlgoOutOfMemory(ctx, nframes * sizeof(mcclXfer) + (size_t)nios * sizeof(*st));
  }
  memset(xs, 0, nctl * sizeof(mcclXfer));
  /* Every link carries its announcement first, then its confirmation, then its data, in io
   * order on both ends. A confirmation is sent once every announcement this rank expects has
   * matched; receives for all of them are posted now. */
  for (size_t c = 0; c < nctl; c++) {
    const int i = (int)(c % (size_t)nios), confirmation = c >= (size_t)nios;
    mcclXfer* x = &xs[c];
    ioFrame(op, &ios[i], &x->frame, MCCL_STEP_AGREE + (uint32_t)confirmation, 0, 0);
    x->frame.offset = 0;
    if (!ios[i].is_send) mcclTransportPostRecv(ctx->tp, ios[i].peer, x);
    else if (!confirmation) mcclTransportPostSend(ctx->tp, ios[i].peer, x);
  }
  size_t k = nctl, at = 0, done_upto = 0;
  int heard = 0, confirmed = !confirm, may_write = 0, nposted = 0;
  uint32_t wave = 0; /* next wave to post: waves w < wave are posted */
  mcclResult_t res = mcclSuccess;
  for (;;) {
    heard = heard || partDone(xs, 0, (size_t)nios);
    if (heard && !confirmed) {
      for (int i = 0; i < nios; i++)
        if (ios[i].is_send) mcclTransportPostSend(ctx->tp, ios[i].peer, &xs[nios + i]);
      confirmed = 1;
    }
    /* Without confirmations, matching announcements mean every rank this rank hears from issued
     * the same collective. With them, every peer has also checked all of its own incoming. */
    may_write = may_write || (heard && (!confirm || partDone(xs, (size_t)nios, (size_t)nios)));
    /* Wave w goes out once wave w - window has completed (both its sends and its receives). */
    while (confirmed && wave < nwaves) {
      int ready = 1;
      for (int i = 0; ready && wave >= (uint32_t)window && i < nios; i++)
        if (ios[i].step == wave - (uint32_t)window)
          ready = st[i].posted && !st[i].rest_pending && partDone(xs, st[i].x0, st[i].nx) &&
                  partDone(xs, st[i].x1, st[i].nx1);
      if (!ready) break;
      for (int i = 0; i < nios; i++) {
        if (ios[i].step != wave) continue;
        mcclIoState* s = &st[i];
        s->posted = 1;
        nposted++;
        s->x0 = k;
        if (ios[i].is_send || may_write) {
          s->nx = postIo(ctx, op, &ios[i], xs + k);
        } else {
          s->early = earlyBytes(&ios[i], early_max);
          s->scratch_at = at;
          s->nx = postIoRange(ctx, op, &ios[i], 0, s->early, early + at, xs + k);
          s->rest_pending = s->early < ios[i].bytes;
          at += s->early;
        }
        k += s->nx;
      }
      wave++;
    }
    if (may_write) {
      for (int i = 0; i < nios; i++) {
        mcclIoState* s = &st[i];
        if (!s->rest_pending) continue;
        s->x1 = k;
        s->nx1 = postIoRange(ctx, op, &ios[i], s->early, ios[i].bytes, ios[i].buf + s->early, xs + k);
        k += s->nx1;
        s->rest_pending = 0;
      }
    }
    while (done_upto < k && xs[done_upto].complete) done_upto++;
    if (nposted == nios && may_write && done_upto == k) break;
    res = mcclTransportProgress(ctx->tp, op->deadline_ns, ctx->abort_flag);
    if (res != mcclSuccess) break;
  }
  for (int i = 0; res == mcclSuccess && i < nios; i++)
    if (st[i].early) memcpy(ios[i].buf, early + st[i].scratch_at, st[i].early);
  if (xs != stack_xfers) free(xs);
  free(st);
  return res;
}

mcclResult_t mcclAgree(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int n = ctx->nranks, r = ctx->rank;
  for (int dist = 1, k = 0; dist < n; dist <<= 1, k++) {
    /* Round k+1 leaves only after round k's frame arrived: that is what makes the chain. */
    mcclXfer x[2];
    memset(x, 0, sizeof(x));
    mcclAlgoFrame(op, &x[0].frame, MCCL_STEP_AGREE + (uint32_t)k, 0, 0);
    mcclAlgoFrame(op, &x[1].frame, MCCL_STEP_AGREE + (uint32_t)k, 0, 0);
    mcclTransportPostSend(ctx->tp, (r + dist) % n, &x[0]);
    mcclTransportPostRecv(ctx->tp, (r - dist + n) % n, &x[1]);
    MCCLCHECK(waitAll(ctx, op, x, 2));
  }
  return mcclSuccess;
}

int mcclRingRank(const mcclAlgoCtx* ctx, int pos) {
  pos = ((pos % ctx->nranks) + ctx->nranks) % ctx->nranks;
  return ctx->ring_order ? ctx->ring_order[pos] : pos;
}

int mcclRingPos(const mcclAlgoCtx* ctx, int r) { return ctx->ring_order ? ctx->ring_order[ctx->nranks + r] : r; }

mcclResult_t mcclAnnounceStart(mcclAlgoCtx* ctx, const mcclOp* op, mcclAnnouncement* a, int enabled) {
  const int n = ctx->nranks, r = ctx->rank;
  memset(a, 0, sizeof(*a));
  a->done = 1;
  if (!enabled || n == 1) return mcclSuccess;
  int rounds = 0;
  if (!mcclAlgoAnnounceAll(ctx))
    while ((1 << rounds) < n) rounds++;
  const int nsend = rounds > 0 ? rounds : n - 1;
  a->x = calloc((size_t)nsend * 2, sizeof(mcclXfer));
  if (a->x == NULL) return mcclAlgoOutOfMemory(ctx, (size_t)nsend * 2 * sizeof(mcclXfer));
  a->n = 2 * nsend;
  a->rounds = rounds;
  a->done = 0;
  const int pos = mcclRingPos(ctx, r);
  for (int k = 0; k < nsend; k++) { /* to the ring's own link first */
    mcclXfer* s = &a->x[k];
    mcclXfer* rv = &a->x[nsend + k];
    const int dist = rounds > 0 ? 1 << k : k + 1;
    mcclAlgoFrame(op, &s->frame, MCCL_STEP_AGREE + (uint32_t)(rounds > 0 ? k : 0), 0, 0);
    mcclAlgoFrame(op, &rv->frame, MCCL_STEP_AGREE + (uint32_t)(rounds > 0 ? k : 0), 0, 0);
    /* Round k's send leaves once the frames of rounds 0..k-1 arrived (and so matched): then
     * it vouches for every rank those frames vouched for, the chain of mcclAgree. */
    if (rounds > 0 && k > 0) mcclTransportPostAfter(ctx->tp, mcclRingRank(ctx, pos + dist), s, &a->x[nsend], k);
    else mcclTransportPostSend(ctx->tp, mcclRingRank(ctx, pos + dist), s);
    mcclTransportPostRecv(ctx->tp, mcclRingRank(ctx, pos - dist), rv);
  }
  return mcclSuccess;
}

void mcclAnnounceCheck(mcclAnnouncement* a) {
  while (!a->done && a->x[a->first_pending].complete)
    if (++a->first_pending == a->n) a->done = 1;
}

mcclResult_t mcclAnnounceWait(mcclAlgoCtx* ctx, const mcclOp* op, mcclAnnouncement* a) {
  mcclAnnounceCheck(a);
  while (!a->done) {
    MCCLCHECK(mcclTransportProgress(ctx->tp, op->deadline_ns, ctx->abort_flag));
    mcclAnnounceCheck(a);
  }
  return mcclSuccess;
}

void mcclAnnounceEnd(mcclAnnouncement* a) {
  free(a->x);
  a->x = NULL;
}

mcclResult_t mcclAlgoAllReduce(mcclAlgoCtx* ctx, const mcclOp* op) {
  switch (mcclAlgoSelect(ctx, op).kind) {
    case MCCL_PLAN_RING: return mcclRingAllReduce(ctx, op);
    case MCCL_PLAN_TWO_LEVEL: return mcclTwoLevelAllReduce(ctx, op);
    case MCCL_PLAN_HALVING_DOUBLING: return mcclHalvingDoublingAllReduce(ctx, op);
    default: return mcclDoublingAllReduce(ctx, op);
  }
}
