/*
 * ring.c: the pipelined ring (Patarasuk & Yuan, 2009) for all-reduce and all-gather, and the
 * pipelined chain for large broadcasts. "Rank r + 1" below means the next rank in ring order
 * (core/topology.h: each group's ranks together; rank order when there is one group).
 *
 * All-reduce on n ranks cuts the buffer into n chunks, one per rank, and runs 2(n-1) steps. At
 * step t rank r sends chunk (r - t) mod n to its right neighbour and receives chunk
 * (r - t - 1) mod n from its left one. During the first n-1 steps (reduce-scatter) each received
 * chunk is reduced into the local one, so after step n-2 rank r owns the full reduction of chunk
 * (r + 1) mod n; during the last n-1 steps (all-gather) received chunks are copied, forwarding
 * every reduced chunk around the ring. Each rank sends and receives 2(n-1)/n of the buffer.
 *
 * Pipelining: every chunk is split into segments of at most MCCL_SEGMENT_BYTES, each one frame.
 * Segment j of step t's send depends only on segment j of step t-1's receive, so the right link
 * carries step t while the left link brings step t+1 and the CPU reduces what just landed: send,
 * receive and reduce overlap with at most MCCL_PIPELINE_DEPTH frames in flight on each link.
 */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "algo/algo.h"
#include "algo/select.h"
#include "core/trace.h"
#include "core/debug.h"
#include "reduce/reduce.h"

typedef struct {
  size_t off, len; /* elements */
} mcclSeg;

/* Segment j of chunk c when every chunk has nseg segments (possibly empty ones at the end). */
static mcclSeg segmentOf(const mcclRingPlan* p, int c, size_t nseg, size_t j) {
  size_t clen = p->chunk_len[c];
  size_t per = (clen + nseg - 1) / nseg;
  mcclSeg s = {p->chunk_off[c], 0};
  size_t start = j * per;
  if (start < clen) {
    s.off += start;
    s.len = clen - start < per ? clen - start : per;
  }
  return s;
}

/* The schedule's geometry, computed once per run: every chunk has nseg segments of at most
 * per_max elements, and each link carries at most `depth` of them at a time. */
typedef struct {
  size_t esz, seg_elems, nseg, per_max, nunits;
  int depth;
} mcclRingGeometry;

static mcclResult_t ringLoop(mcclAlgoCtx* ctx, const mcclOp* op, const mcclRingPlan* p, const mcclRingGeometry* g);

mcclResult_t mcclRingRun(mcclAlgoCtx* ctx, const mcclOp* op, const mcclRingPlan* p) {
  mcclRingGeometry g = {.esz = mcclDataTypeSize(op->dtype)};
  size_t max_chunk = 0;
  int copy_only = 1;
  for (int c = 0; c < p->nchunks; c++)
    if (p->chunk_len[c] > max_chunk) max_chunk = p->chunk_len[c];
  if (max_chunk == 0) return mcclSuccess;
  for (int t = 0; t < p->nsteps; t++)
    if (p->recv_chunk[t] >= 0 && p->recv_mode[t] != MCCL_RECV_COPY) copy_only = 0;
  g.seg_elems = (p->segment_bytes ? p->segment_bytes : ctx->segment_bytes) / g.esz;
  if (g.seg_elems == 0) g.seg_elems = 1;
  g.nseg = (max_chunk + g.seg_elems - 1) / g.seg_elems;
  g.per_max = (max_chunk + g.nseg - 1) / g.nseg;
  g.depth = ctx->depth < 1 ? 1 : (ctx->depth > 64 ? 64 : ctx->depth);
  g.nunits = (size_t)p->nsteps * g.nseg;
  /* A schedule that only copies tells the transport so for its duration (mcclTransportCopySchedule:
   * without reductions to overlap, its engine may write its own frames of up to per_max elements). */
  if (!copy_only) return ringLoop(ctx, op, p, &g);
  mcclTransportCopySchedule(ctx->tp, 1, g.per_max * g.esz);
  mcclResult_t res = ringLoop(ctx, op, p, &g);
  mcclTransportCopySchedule(ctx->tp, res == mcclSuccess ? 0 : -1, g.per_max * g.esz);
  return res;
}

static mcclResult_t ringLoop(mcclAlgoCtx* ctx, const mcclOp* op, const mcclRingPlan* p, const mcclRingGeometry* g) {
  const size_t esz = g->esz, seg_elems = g->seg_elems, nseg = g->nseg, per_max = g->per_max, nunits = g->nunits;
  const int depth = g->depth;

  char* staging = mcclAlgoScratch(ctx, (size_t)depth * per_max * esz);
  if (staging == NULL) {
    snprintf(ctx->tp->error, sizeof(ctx->tp->error), "out of memory for %d staging segments of %zu bytes",
             depth, per_max * esz);
    return mcclSystemError;
  }
  const char* in = op->sendbuf;
  char* out = p->out;

  /* Announcements go first on every link, so both ends of every link post in the same order. */
  mcclAnnouncement ann;
  MCCLCHECK(mcclAnnounceStart(ctx, op, &ann, p->announce));

  mcclXfer sx[64], rx[64];
  size_t runit[64];   /* the unit each posted receive slot holds */
  size_t sunit[64];   /* the unit each posted send slot holds */
  uint8_t staged[64]; /* it lands in staging: reductions, and copies until announced */
  int8_t relayed[64];  /* send slot -> the receive slot it relays (p->relay), or -1 */
  uint8_t rbusy[64];   /* receive slot a posted relay still sends from: not reposted until it is done */
  memset(rbusy, 0, sizeof(rbusy));
  size_t s_posted = 0, s_done = 0, r_posted = 0, r_done = 0;
  size_t su = 0, ru = 0; /* next unit to consider for posting a send / a receive */
  size_t copied = 0;     /* of the plan's copy: one segment per pass, while the links work */

  for (;;) {
    /* Every send unit before this one is complete. */
    size_t sent_upto = s_done < s_posted ? sunit[s_done % (size_t)depth] : su;
    /* Post receives: straight into recvbuf for copies, into a staging slot for reductions. */
    while (r_posted - r_done < (size_t)depth && ru < nunits) {
      int t = (int)(ru / nseg);
      int c = p->recv_chunk[t];
      mcclSeg s = c < 0 ? (mcclSeg){0, 0} : segmentOf(p, c, nseg, ru % nseg);
      if (s.len == 0) { ru++; continue; }
      if (p->reuse_lag > 0 && t >= p->reuse_lag && sent_upto <= (size_t)(t - p->reuse_lag) * nseg + ru % nseg)
        break;
      size_t slot = r_posted % (size_t)depth;
      if (rbusy[slot]) break;
      mcclXfer* x = &rx[slot];
      memset(x, 0, sizeof(*x));
      mcclAlgoFrame(op, &x->frame, p->step_base + (uint32_t)t, s.off * esz, s.len * esz);
      staged[slot] = p->recv_mode[t] != MCCL_RECV_COPY || !ann.done;
      x->buf = staged[slot] ? staging + slot * per_max * esz : out + s.off * esz;
      x->bytes = s.len * esz;
      mcclTransportPostRecv(ctx->tp, p->recv_peer, x);
      runit[slot] = ru;
      r_posted++;
      ru++;
    }
    /* Every receive unit before this one has landed and been reduced. */
    size_t processed_upto = r_done < r_posted ? runit[r_done % (size_t)depth] : ru;
    /* Post sends whose data is final on this rank. */
    while (s_posted - s_done < (size_t)depth && su < nunits) {
      int t = (int)(su / nseg);
      size_t j = su % nseg;
      int c = p->send_chunk[t];
      mcclSeg s = c < 0 ? (mcclSeg){0, 0} : segmentOf(p, c, nseg, j);
      if (s.len == 0) { su++; continue; }
      int dep_step = t - p->lag, from = -1;
      if (dep_step >= 0 && p->recv_chunk[dep_step] >= 0 && processed_upto <= (size_t)dep_step * nseg + j) {
        /* Not landed yet: a relaying plan forwards it from its posted receive (lag 0, so that is
         * this very unit), as its bytes arrive; otherwise wait. */
        if (!p->relay) break;
        for (size_t k = r_done; k < r_posted && from < 0; k++)
          if (runit[k % (size_t)depth] == su) from = (int)(k % (size_t)depth);
        if (from < 0) break;
      }
      size_t slot = s_posted % (size_t)depth;
      mcclXfer* x = &sx[slot];
      memset(x, 0, sizeof(*x));
      mcclAlgoFrame(op, &x->frame, p->step_base + (uint32_t)t, s.off * esz, s.len * esz);
      relayed[slot] = (int8_t)from;
      if (from >= 0) {
        rbusy[from] = 1;
        mcclTransportPostRelay(ctx->tp, p->send_peer, x, &rx[from]);
      } else {
        x->buf = p->send_from_input[t] ? (char*)in + (s.off - p->in_base) * esz : out + s.off * esz;
        x->bytes = s.len * esz;
        mcclTransportPostSend(ctx->tp, p->send_peer, x);
      }
      sunit[slot] = su;
      s_posted++;
      su++;
    }
    if (ann.done && copied < p->copy_bytes) {
      size_t piece = p->copy_bytes - copied < seg_elems * esz ? p->copy_bytes - copied : seg_elems * esz;
      int64_t t0 = ctx->tp->trace ? mcclNowNs() : 0;
      memcpy(p->copy_dst + copied, p->copy_src + copied, piece);
      if (ctx->tp->trace) {
        mcclTraceArgs a = {.coll = op->coll, .seq = op->seq, .offset = copied, .bytes = piece};
        mcclTraceSpan(ctx->tp->trace, 0, MCCL_TRACE_COPY, t0, mcclNowNs(), &a);
      }
      copied += piece;
    }
    if (su >= nunits && ru >= nunits && s_done == s_posted && r_done == r_posted && ann.done &&
        copied == p->copy_bytes)
      break;

    mcclResult_t res = mcclTransportProgress(ctx->tp, op->deadline_ns, ctx->abort_flag);
    if (res != mcclSuccess) {
      mcclAnnounceEnd(&ann);
      return res;
    }
    mcclAnnounceCheck(&ann);

    for (; s_done < s_posted && sx[s_done % (size_t)depth].complete; s_done++)
      if (relayed[s_done % (size_t)depth] >= 0) rbusy[relayed[s_done % (size_t)depth]] = 0;
    while (ann.done && r_done < r_posted && rx[r_done % (size_t)depth].complete) {
      size_t slot = r_done % (size_t)depth;
      int t = (int)(runit[slot] / nseg);
      int64_t t0 = ctx->tp->trace ? mcclNowNs() : 0;
      if (p->recv_mode[t] == MCCL_RECV_COPY) {
        if (staged[slot]) memcpy(out + rx[slot].frame.offset, rx[slot].buf, rx[slot].bytes);
      } else {
        /* recvbuf chunk = (this rank's input) op (what arrived); each chunk is reduced once per
         * rank, so the input is still the rank's own contribution. */
        mcclSeg s = segmentOf(p, p->recv_chunk[t], nseg, runit[slot] % nseg);
        int final = p->recv_mode[t] == MCCL_RECV_REDUCE_FINAL;
        char* dst = final && p->final_out ? p->final_out + (s.off - p->final_base) * esz : out + s.off * esz;
        mcclReduceKernel(dst, in + s.off * esz, rx[slot].buf, s.len, op->dtype, op->op,
                         final ? (uint32_t)ctx->nranks : 1);
      }
      if (ctx->tp->trace && (p->recv_mode[t] != MCCL_RECV_COPY || staged[slot])) {
        mcclTraceArgs a = {.coll = rx[slot].frame.coll, .step = rx[slot].frame.step, .seq = rx[slot].frame.seq,
                           .offset = rx[slot].frame.offset, .bytes = rx[slot].bytes};
        mcclTraceSpan(ctx->tp->trace, 0, p->recv_mode[t] == MCCL_RECV_COPY ? MCCL_TRACE_COPY : MCCL_TRACE_REDUCE,
                      t0, mcclNowNs(), &a);
      }
      r_done++;
    }
  }
  mcclAnnounceEnd(&ann);
  return mcclSuccess;
}

/* Chunk c of n over `count` elements: the first count % n chunks get one element more. */
static void splitEven(size_t count, int n, size_t* off, size_t* len) {
  size_t base = count / (size_t)n, extra = count % (size_t)n, o = 0;
  for (int c = 0; c < n; c++) {
    off[c] = o;
    len[c] = base + ((size_t)c < extra ? 1 : 0);
    o += len[c];
  }
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

/* Rings visit the ranks in ring order (mcclRingRank, mcclRingPos: algo.h). Chunks keep their
 * ranks' numbers (chunk r is rank r's block), so results do not depend on the order, only the
 * links used do. */

mcclResult_t mcclRingAllReduce(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int n = ctx->nranks, r = ctx->rank;
  const size_t esz = mcclDataTypeSize(op->dtype);
  if (n == 1) {
    if (op->sendbuf != op->recvbuf) memcpy(op->recvbuf, op->sendbuf, op->count * esz);
    return mcclSuccess;
  }
  const int nsteps = 2 * (n - 1);
  int* send_chunk = malloc(sizeof(int) * (size_t)nsteps * 2);
  uint8_t* flags = malloc((size_t)nsteps * 2);
  size_t* geo = malloc(sizeof(size_t) * (size_t)n * 2);
  if (!send_chunk || !flags || !geo) {
    free(send_chunk); free(flags); free(geo);
    snprintf(ctx->tp->error, sizeof(ctx->tp->error), "out of memory planning a ring of %d ranks", n);
    return mcclSystemError;
  }
  int* recv_chunk = send_chunk + nsteps;
  uint8_t* recv_mode = flags;
  uint8_t* from_input = flags + nsteps;
  const int pos = mcclRingPos(ctx, r);
  for (int t = 0; t < nsteps; t++) {
    send_chunk[t] = mcclRingRank(ctx, pos - t);
    recv_chunk[t] = mcclRingRank(ctx, pos - t - 1);
    recv_mode[t] = t < n - 2 ? MCCL_RECV_REDUCE : (t == n - 2 ? MCCL_RECV_REDUCE_FINAL : MCCL_RECV_COPY);
    from_input[t] = t == 0;
  }
  splitEven(op->count, n, geo, geo + n);
  /* Step 0 reduces into the output, long before this rank has heard from the ranks behind its
   * left neighbour: announcements run alongside. */
  mcclRingPlan plan = {nsteps, n, 1, mcclRingRank(ctx, pos + 1), mcclRingRank(ctx, pos - 1), send_chunk, recv_chunk,
                       recv_mode, from_input, geo, geo + n, op->recvbuf, NULL, 0, 1, 0, n - 1, 0, NULL, NULL, 0, 0, 0};
  mcclResult_t res = mcclRingRun(ctx, op, &plan);
  free(send_chunk);
  free(flags);
  free(geo);
  return res;
}

/* Two-level all-reduce over G groups of g ranks (positions k g .. k g + g - 1 of the ring order
 * are group k; member j of group k sits at position k g + j), the standard hierarchical
 * decomposition:
 *   1. inside each group, a ring reduce-scatter of the buffer in g chunks: member j ends with
 *      chunk j summed over its group (steps 0 .. g-2);
 *   2. member j of every group (a ring of G ranks, one per group) all-reduces its chunk j, cut in
 *      G pieces: after it every member j holds chunk j summed over all n ranks (steps g-1 ..
 *      g-1 + 2(G-1) - 1; AVG divides here, by n);
 *   3. inside each group, a ring all-gather of the g chunks (the last g-1 steps).
 * Each rank sends 2(g-1)/g S + 2(G-1)/(G g) S = 2(n-1)/n S bytes, as in the flat ring, in
 * 2(g-1) + 2(G-1) steps instead of 2(n-1): the hop cost is paid fewer times, and only phase 2
 * crosses between groups (g rings of S/g bytes each). Every piece is reduced by one rank and
 * copied to the others, so every rank holds the same bytes. Phase 1 runs the announcement, so
 * the output is written only once every rank's header matched (as in the flat ring). */
mcclResult_t mcclTwoLevelAllReduce(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int g = ctx->group_size, G = ctx->ngroups, r = ctx->rank;
  const int pos = mcclRingPos(ctx, r), k = pos / g, j = pos % g;
  const int nsteps = 2 * (g - 1) > 2 * (G - 1) ? 2 * (g - 1) : 2 * (G - 1);
  int* chunks = malloc(sizeof(int) * (size_t)nsteps * 2);
  uint8_t* flags = malloc((size_t)nsteps * 2);
  size_t* geo = malloc(sizeof(size_t) * (size_t)(g + G) * 2);
  if (!chunks || !flags || !geo) {
    free(chunks); free(flags); free(geo);
    snprintf(ctx->tp->error, sizeof(ctx->tp->error), "out of memory planning a two-level ring of %d x %d ranks", G, g);
    return mcclSystemError;
  }
  size_t *off1 = geo, *len1 = geo + g, *off2 = geo + 2 * g, *len2 = geo + 2 * g + G;
  splitEven(op->count, g, off1, len1);
  splitEven(len1[j], G, off2, len2);
  for (int q = 0; q < G; q++) off2[q] += off1[j];
  const int left = mcclRingRank(ctx, k * g + mod(j - 1, g)), right = mcclRingRank(ctx, k * g + mod(j + 1, g));
  mcclResult_t res = mcclSuccess;
  /* 1: reduce-scatter inside the group, chunk numbers = member numbers; member j ends with j. */
  if (g > 1) {
    for (int t = 0; t < g - 1; t++) {
      chunks[t] = mod(j - t - 1, g);
      chunks[nsteps + t] = mod(j - t - 2, g);
      flags[t] = MCCL_RECV_REDUCE;
      flags[nsteps + t] = t == 0;
    }
    mcclRingPlan p1 = {g - 1, g, 1, right, left, chunks, chunks + nsteps, flags, flags + nsteps, off1, len1,
                       op->recvbuf, NULL, 0, 1, 0, 0, 0, NULL, NULL, 0, 0, 0};
    res = mcclRingRun(ctx, op, &p1);
  }
  /* 2: all-reduce of chunk j across the groups (from here on the input is this rank's output). */
  mcclOp mid = *op;
  mid.sendbuf = op->recvbuf;
  if (res == mcclSuccess && G > 1) {
    const int steps = 2 * (G - 1);
    for (int t = 0; t < steps; t++) {
      chunks[t] = mod(k - t, G);
      chunks[nsteps + t] = mod(k - t - 1, G);
      flags[t] = t < G - 2 ? MCCL_RECV_REDUCE : (t == G - 2 ? MCCL_RECV_REDUCE_FINAL : MCCL_RECV_COPY);
      flags[nsteps + t] = 0;
    }
    mcclRingPlan p2 = {steps, G, 1, mcclRingRank(ctx, mod(k + 1, G) * g + j), mcclRingRank(ctx, mod(k - 1, G) * g + j),
                       chunks, chunks + nsteps, flags, flags + nsteps, off2, len2, op->recvbuf, NULL, 0,
                       g > 1 ? 0 : 1, 0, G - 1, (uint32_t)(g - 1), NULL, NULL, 0, 0, 0};
    res = mcclRingRun(ctx, &mid, &p2);
  }
  /* 3: all-gather of the chunks inside the group. */
  if (res == mcclSuccess && g > 1) {
    for (int t = 0; t < g - 1; t++) {
      chunks[t] = mod(j - t, g);
      chunks[nsteps + t] = mod(j - t - 1, g);
      flags[t] = MCCL_RECV_COPY;
      flags[nsteps + t] = 0;
    }
    mcclRingPlan p3 = {g - 1, g, 1, right, left, chunks, chunks + nsteps, flags, flags + nsteps, off1, len1,
                       op->recvbuf, NULL, 0, 0, 0, 0, (uint32_t)(g - 1 + 2 * (G - 1)), NULL, NULL, 0, 0, 0};
    res = mcclRingRun(ctx, &mid, &p3);
  }
  free(chunks);
  free(flags);
  free(geo);
  return res;
}

/* Reduce-scatter: the first half of the all-reduce ring, shifted by one so that rank r ends with
 * chunk r: at step t (0..n-2) it sends chunk (r - t - 1) mod n and receives chunk (r - t - 2) mod n.
 * Partial sums live in `work` (the input's size); the final step writes chunk r to `final_out`
 * at element (chunk_off[r] - final_base). The input is never written. No agreement is needed:
 * segment j of the final step arrives through a chain of n-1 ranks, each of which checked the
 * frame before it forwarded segment j, so by then every rank's header has been checked. */
static mcclResult_t ringReduceScatterChunks(mcclAlgoCtx* ctx, const mcclOp* op, char* work,
                                            const size_t* off, const size_t* len, char* final_out,
                                            size_t final_base) {
  const int n = ctx->nranks, r = ctx->rank, nsteps = n - 1;
  int* chunks = malloc(sizeof(int) * (size_t)nsteps * 2);
  uint8_t* flags = malloc((size_t)nsteps * 2);
  if (!chunks || !flags) {
    free(chunks); free(flags);
    snprintf(ctx->tp->error, sizeof(ctx->tp->error), "out of memory planning a ring of %d ranks", n);
    return mcclSystemError;
  }
  const int pos = mcclRingPos(ctx, r);
  for (int t = 0; t < nsteps; t++) {
    chunks[t] = mcclRingRank(ctx, pos - t - 1);
    chunks[nsteps + t] = mcclRingRank(ctx, pos - t - 2);
    flags[t] = t == nsteps - 1 ? MCCL_RECV_REDUCE_FINAL : MCCL_RECV_REDUCE;
    flags[nsteps + t] = t == 0;
  }
  mcclRingPlan plan = {nsteps, n, 1, mcclRingRank(ctx, pos + 1), mcclRingRank(ctx, pos - 1), chunks, chunks + nsteps,
                       flags, flags + nsteps, off, len, work, final_out, final_base, 0, 0, 0, 0, NULL, NULL, 0, 0, 0};
  mcclResult_t res = mcclRingRun(ctx, op, &plan);
  free(chunks);
  free(flags);
  return res;
}

mcclResult_t mcclRingReduceScatter(mcclAlgoCtx* ctx, const mcclOp* op, char* work) {
  const int n = ctx->nranks;
  size_t* geo = malloc(sizeof(size_t) * (size_t)n * 2);
  if (geo == NULL) {
    snprintf(ctx->tp->error, sizeof(ctx->tp->error), "out of memory planning a ring of %d ranks", n);
    return mcclSystemError;
  }
  for (int c = 0; c < n; c++) {
    geo[c] = (size_t)c * op->count;
    geo[n + c] = op->count;
  }
  mcclResult_t res = ringReduceScatterChunks(ctx, op, work, geo, geo + n, op->recvbuf, geo[ctx->rank]);
  free(geo);
  return res;
}

/* Reduce of a large buffer to root: the ring reduce-scatter over n near-equal chunks into `work`,
 * then every rank sends its reduced chunk straight to root. Each rank sends ~(n-1)/n of the
 * buffer in the first phase and 1/n in the second; root receives (n-1)/n in the second. */
mcclResult_t mcclRingReduce(mcclAlgoCtx* ctx, const mcclOp* op, char* work) {
  const int n = ctx->nranks, r = ctx->rank;
  const size_t esz = mcclDataTypeSize(op->dtype);
  size_t* geo = malloc(sizeof(size_t) * (size_t)n * 2);
  mcclPeerIo* ios = malloc(sizeof(mcclPeerIo) * (size_t)n);
  if (geo == NULL || ios == NULL) {
    free(geo); free(ios);
    snprintf(ctx->tp->error, sizeof(ctx->tp->error), "out of memory planning a ring of %d ranks", n);
    return mcclSystemError;
  }
  splitEven(op->count, n, geo, geo + n);
  mcclResult_t res = ringReduceScatterChunks(ctx, op, work, geo, geo + n, work, 0);
  if (res == mcclSuccess) {
    int nio = 0;
    if (r == op->root) {
      memcpy((char*)op->recvbuf + geo[r] * esz, work + geo[r] * esz, geo[n + r] * esz);
      for (int p = 0; p < n; p++)
        if (p != r && geo[n + p] > 0)
          ios[nio++] = (mcclPeerIo){p, 0, (char*)op->recvbuf + geo[p] * esz, geo[n + p] * esz, geo[p] * esz, (uint32_t)n};
    } else if (geo[n + r] > 0) {
      ios[nio++] = (mcclPeerIo){op->root, 1, work + geo[r] * esz, geo[n + r] * esz, geo[r] * esz, (uint32_t)n};
    }
    res = nio ? mcclAlgoExchange(ctx, op, ios, nio) : mcclSuccess;
  }
  free(geo);
  free(ios);
  return res;
}

/* All-gather: the all-gather half of the ring above, over n equal blocks. Step 0 sends the own
 * block from the input; later steps forward what arrived, from recvbuf. Receives wait for the
 * announcements run alongside; so does the copy of the own block into place, a segment per pass
 * of the ring's loop while it waits on the links. */
mcclResult_t mcclAlgoAllGather(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int n = ctx->nranks, r = ctx->rank;
  const size_t esz = mcclDataTypeSize(op->dtype);
  char* own = (char*)op->recvbuf + (size_t)r * op->count * esz;
  if (n == 1 || op->count == 0) {
    if (op->sendbuf != own) memmove(own, op->sendbuf, op->count * esz);
    return mcclSuccess;
  }
  if (mcclAlgoSelect(ctx, op).kind == MCCL_PLAN_BRUCK) return mcclBruckAllGather(ctx, op);
  const int nsteps = n - 1;
  int* chunks = malloc(sizeof(int) * (size_t)nsteps * 2);
  uint8_t* flags = calloc((size_t)nsteps * 2, 1);
  size_t* geo = malloc(sizeof(size_t) * (size_t)n * 2);
  if (!chunks || !flags || !geo) {
    free(chunks); free(flags); free(geo);
    snprintf(ctx->tp->error, sizeof(ctx->tp->error), "out of memory planning a ring of %d ranks", n);
    return mcclSystemError;
  }
  const int pos = mcclRingPos(ctx, r);
  for (int t = 0; t < nsteps; t++) {
    chunks[t] = mcclRingRank(ctx, pos - t);
    chunks[nsteps + t] = mcclRingRank(ctx, pos - t - 1);
  }
  flags[nsteps] = 1; /* step 0 sends the own block from the input */
  for (int c = 0; c < n; c++) {
    geo[c] = (size_t)c * op->count;
    geo[n + c] = op->count;
  }
  /* Frames carry byte offsets into the whole output; the own block's copy (no step reads or
   * writes it there) runs inside the ring. */
  mcclRingPlan plan = {nsteps, n, 1, mcclRingRank(ctx, pos + 1), mcclRingRank(ctx, pos - 1), chunks, chunks + nsteps,
                       flags, flags + nsteps, geo, geo + n, op->recvbuf, NULL, 0, 1, geo[r], 0, 0,
                       op->sendbuf, own, op->sendbuf != own ? op->count * esz : 0, 0, 0};
  mcclResult_t res = mcclRingRun(ctx, op, &plan);
  free(chunks);
  free(flags);
  free(geo);
  return res;
}

/* Broadcast of a large buffer: a pipelined chain root -> root+1 -> ... -> root-1; the root only
 * sends, the last only receives. With relays (MCCL_CHAIN_RELAY, the default) each rank forwards
 * segment j's bytes as they land (cut-through, mcclTransportPostRelay): time ~ bytes/bandwidth +
 * (n-1) hops of one socket read, whatever the segment, so the segments are MCCL_SEGMENT_BYTES
 * (fewer frames, less CPU). Without, segment j leaves once it has landed whole (lag 0): time ~
 * bytes/bandwidth + (n-1) segment hops, so the segment shrinks with the size
 * (mcclChainSegmentBytes, select.h). */
mcclResult_t mcclRingBroadcast(mcclAlgoCtx* ctx, const mcclOp* op) {
  const int n = ctx->nranks, r = ctx->rank;
  const int me = mcclRingPos(ctx, r), pos = mod(me - mcclRingPos(ctx, op->root), n); /* hops from root */
  int send_chunk = pos < n - 1 ? 0 : -1;
  int recv_chunk = pos > 0 ? 0 : -1;
  uint8_t mode = MCCL_RECV_COPY, from_input = 0;
  size_t off = 0, len = op->count;
  mcclRingPlan plan = {1, 1, 0, mcclRingRank(ctx, me + 1), mcclRingRank(ctx, me - 1), &send_chunk, &recv_chunk,
                       &mode, &from_input, &off, &len, op->recvbuf, NULL, 0, 1, 0, 0, 0, NULL, NULL, 0,
                       ctx->relay ? 0 : mcclChainSegmentBytes(ctx, op->count * mcclDataTypeSize(op->dtype)),
                       ctx->relay};
  return mcclRingRun(ctx, op, &plan);
}
