/* util.c: what every algorithm shares: scratch, frame headers, and the point-to-point exchange. */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "algo/algo.h"
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

void mcclAlgoFrame(const mcclOp* op, mcclFrame* f, uint32_t step, size_t offset, size_t length) {
  memset(f, 0, sizeof(*f));
  f->type = MCCL_FRAME_DATA;
  f->coll = (uint8_t)op->coll;
  f->dtype = (uint8_t)op->dtype;
  f->op = (uint8_t)op->op;
  f->seq = op->seq;
  f->count = op->count;
  f->root = (uint32_t)op->root;
  f->step = step;
  f->offset = offset;
  f->length = (uint32_t)length;
}

mcclResult_t mcclAlgoExchange(mcclAlgoCtx* ctx, const mcclOp* op, const mcclPeerIo* ios, int nios) {
  size_t seg = ctx->segment_bytes;
  size_t nframes = 0;
  for (int i = 0; i < nios; i++) nframes += ios[i].bytes == 0 ? 1 : (ios[i].bytes + seg - 1) / seg;
  mcclXfer stack_xfers[16];
  mcclXfer* xs = nframes <= 16 ? stack_xfers : malloc(nframes * sizeof(mcclXfer));
  if (xs == NULL) {
    snprintf(ctx->tp->error, sizeof(ctx->tp->error), "out of memory for %zu frames", nframes);
    return mcclSystemError;
  }
  size_t k = 0;
  for (int i = 0; i < nios; i++) {
    const mcclPeerIo* io = &ios[i];
    size_t off = 0;
    do {
      size_t len = io->bytes - off < seg ? io->bytes - off : seg;
      mcclXfer* x = &xs[k++];
      memset(x, 0, sizeof(*x));
      mcclAlgoFrame(op, &x->frame, io->step, io->offset + off, len);
      if (op->coll == MCCL_COLL_ALLTOALL) x->frame.count = io->bytes / mcclDataTypeSize(op->dtype);
      x->buf = io->buf + off;
      x->bytes = len;
      if (io->is_send) mcclTransportPostSend(ctx->tp, io->peer, x);
      else mcclTransportPostRecv(ctx->tp, io->peer, x);
      off += len;
    } while (off < io->bytes);
  }
  mcclResult_t res = mcclSuccess;
  size_t first_pending = 0;
  for (;;) {
    while (first_pending < nframes && xs[first_pending].complete) first_pending++;
    if (first_pending == nframes) break;
    res = mcclTransportProgress(ctx->tp, op->deadline_ns, ctx->abort_flag);
    if (res != mcclSuccess) break;
  }
  if (xs != stack_xfers) free(xs);
  return res;
}

mcclResult_t mcclAlgoAllReduce(mcclAlgoCtx* ctx, const mcclOp* op) {
  size_t bytes = op->count * mcclDataTypeSize(op->dtype);
  int ring = op->algorithm == mcclAlgoRing ||
             (op->algorithm == mcclAlgoAuto && bytes >= ctx->ring_threshold &&
              op->count >= (size_t)ctx->nranks);
  return ring ? mcclRingAllReduce(ctx, op) : mcclDoublingAllReduce(ctx, op);
}
